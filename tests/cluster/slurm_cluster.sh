#!/usr/bin/env bash
# Test helper (tests/cluster/test_real_launchers.cpp): a one-node Slurm cluster of its own, on this
# machine, in a directory: munged (as the munge user, with a key of its own), slurmctld and slurmd
# (as root), on free ports, with every file in the directory.
#
#   slurm_cluster.sh start DIR   starts it; prints the path of its slurm.conf (for SLURM_CONF) and
#                                exits 0 once the node takes jobs; else prints why on stderr, stops
#                                what it started and exits 1 (77 when this machine cannot run one:
#                                not root, or a program missing)
#   slurm_cluster.sh stop DIR    stops the daemons started in DIR (by their pid files), killing
#                                those that have not ended 5 s later
set -uo pipefail

cmd="${1:-}"
dir="${2:-}"
[ -n "$cmd" ] && [ -n "$dir" ] || {
  echo "usage: slurm_cluster.sh start|stop DIR" >&2
  exit 2
}

# alive PID: the process runs (a daemon that ended but was adopted by a subreaper, such as the
# test process, stays a zombie until that reaps it: it counts as ended).
alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) && [ -n "$state" ] && [ "$state" != Z ]
}

# Stops the daemons together (each takes a second or two to finish), killing those still there after 5 s.
stop() {
  local pids=() pidfile pid
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -s "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do
      alive "$pid" || break
      sleep 0.1
    done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null
  done
  return 0
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || {
  echo "usage: slurm_cluster.sh start|stop DIR" >&2
  exit 2
}

unavailable() {
  echo "slurm_cluster: $*" >&2
  exit 77
}
[ "$(id -u)" -eq 0 ] || unavailable "needs root (slurmd runs the job steps as their users)"
for program in munged slurmctld slurmd srun sinfo runuser; do
  command -v "$program" >/dev/null 2>&1 || unavailable "$program is not installed (scripts/install-deps.sh installs slurm-wlm and munge)"
done
id munge >/dev/null 2>&1 || unavailable "there is no munge user (Debian's munge package makes it)"

fail() {
  echo "slurm_cluster: $*" >&2
  local log
  for log in "$dir/munge/munged.log" "$dir/slurmctld.log" "$dir/slurmd.log"; do
    [ -s "$log" ] && { echo "--- $log" >&2; tail -n 15 "$log" >&2; }
  done
  stop
  exit 1
}

# shellcheck source=tools/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/free_port.sh"
ctld_port=$(free_port 127.0.0.1) || fail "no free port"
slurmd_port=$(free_port 127.0.0.1 "$ctld_port") || fail "no free port"

# munged checks that its directories are not writable by others, and that everyone may reach
# its socket; it reads its key as munge.
chmod 0755 "$dir"
mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
chown munge: "$dir/munge"
chmod 0711 "$dir/munge"
head -c 1024 /dev/urandom >"$dir/munge/munge.key"
chown munge: "$dir/munge/munge.key"
chmod 0400 "$dir/munge/munge.key"
runuser -u munge -- munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" ||
  fail "munged did not start"


controller=$(hostname -s)
# The node is called localhost, so that the node list the job steps get (SLURM_STEP_NODELIST) is a
# name that resolves on any machine. config_overrides: the node's CPUs as stated here, whatever
# this machine has (a 2-core machine runs steps of up to 8 tasks).
cat >"$dir/slurm.conf" <<EOF
ClusterName=mirroredtest
SlurmctldHost=$controller(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
PlugStackConfig=$dir/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/linear
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
: >"$dir/plugstack.conf"
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$dir/slurm.conf" -i || fail "slurmctld did not start"
slurmd -f "$dir/slurm.conf" -N localhost || fail "slurmd did not start"
for _ in $(seq 200); do
  if [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]; then
    echo "$dir/slurm.conf"
    exit 0
  fi
  sleep 0.1
done
fail "the node did not become idle within 20 s (sinfo: $(sinfo -h -o '%T %E' 2>&1))"
