#!/usr/bin/env bash
# Starts the N workers of a multi-worker job on this machine, each with its TF_CONFIG
# (docs/multi_worker.md), and restarts them after a preemption or a crash when asked to
# (docs/fault_tolerance.md). It is for one machine; on a cluster use its launcher (srun, mpirun,
# torchrun, Kubeflow's jobs: docs/multi_worker.md, "Launching on a cluster"):
#
#   tools/launch.sh N [--host HOST] [--max-restarts K] -- program [args...]
#
# N is 1 to 1024, K 0 to 1000000 (decimal digits only); anything else is a usage error (status 2).
# Worker i gets TF_CONFIG {"cluster": {"worker": [HOST:p0, ..., HOST:pN-1]}, "task": {"type":
# "worker", "index": i}} on free ports (worker 0 is the chief and serves the job's store on p0),
# MIRRORED_JOB_ID (one per launch and restart), MIRRORED_LAUNCH_RANK=i and
# MIRRORED_RESTART_COUNT (0, then 1, 2, ... after each restart). Every line a worker prints is
# prefixed with "[worker i] ". SIGINT, SIGTERM and SIGHUP to the launcher reach every worker as
# SIGTERM, the signal PreemptionCheckpointHandler saves on (so Ctrl-C loses no training); a second
# one kills them. When a worker fails, the others get MIRRORED_LAUNCH_GRACE_S seconds (default
# 30) to finish on their own before they are terminated.
#
# Restarts (--max-restarts K, default 0): when the first worker of a round to fail exited with
# status 75 (PreemptionCheckpointHandler::kRestartExitCode, "saved, restart me") or was killed by a
# signal, and the launcher itself was not told to stop, every worker is started again, up to K
# times, after MIRRORED_LAUNCH_RESTART_DELAY_S seconds (default 0); the launcher prints why. Any
# other failure (a bad argument, an error in the program) would only fail again, so it ends the
# job; how the others end after it (terminated by the launcher at the end of the grace period, or
# failing because a peer left) does not change that. A signal to the launcher between two rounds
# stops it too: no further round starts. Exits 0 when every worker of the last round exited 0,
# else with the first failing worker's status.
set -uo pipefail

usage() {
  echo "usage: tools/launch.sh N [--host HOST] [--max-restarts K] -- program [args...]" >&2
  exit 2
}

# whole_number NAME VALUE LO HI: VALUE (decimal digits only) as a number from LO to HI, else a
# usage error naming NAME and VALUE. Bash's own arithmetic would wrap a long number around (and
# read a leading 0 as octal), so the digits are checked before any arithmetic.
whole_number() {
  local name="$1" value="$2" lo="$3" hi="$4"
  if [[ "$value" =~ ^[0-9]{1,9}$ ]] && ((10#$value >= lo && 10#$value <= hi)); then
    echo $((10#$value))
  else
    echo "launch: $name must be a whole number from $lo to $hi, not '$value'" >&2
    return 1
  fi
}

[ $# -ge 1 ] || usage
n=$(whole_number "N (the number of workers)" "$1" 1 1024) || usage
shift
host=127.0.0.1
max_restarts=0
restart_code=75
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --host)
      [ $# -ge 2 ] || usage
      host="$2"
      shift 2
      ;;
    --max-restarts)
      [ $# -ge 2 ] || usage
      max_restarts=$(whole_number --max-restarts "$2" 0 1000000) || usage
      shift 2
      ;;
    *) usage ;;
  esac
done
[ $# -ge 2 ] && [ "$1" = "--" ] || usage
shift

if ((BASH_VERSINFO[0] < 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] < 1))); then
  echo "launch: needs bash 5.1 or newer (wait -n -p)" >&2
  exit 2
fi

# free_port HOST: a port nobody listens on (the chief binds it; the others only name their worker).
# shellcheck source=tools/free_port.sh
source "$(dirname "${BASH_SOURCE[0]}")/free_port.sh"
declare -A taken=()

# seconds NAME: the environment variable NAME (seconds, digits with an optional fraction, as sleep
# takes them) or its default, else a usage error naming it.
seconds() {
  local name="$1" default="$2" value
  value="${!name:-$default}"
  if [[ "$value" =~ ^[0-9]{1,7}(\.[0-9]{1,9})?$ ]]; then
    echo "$value"
  else
    echo "launch: $name must be a number of seconds (digits, an optional fraction), not '$value'" >&2
    return 1
  fi
}
grace=$(seconds MIRRORED_LAUNCH_GRACE_S 30) || usage
restart_delay=$(seconds MIRRORED_LAUNCH_RESTART_DELAY_S 0) || usage

# Each worker is a job of its own (a process group): signals reach the program and its children.
set -m
# The signals the launcher was told to stop with forward() to the workers of the round that runs:
# `stop` is set by the first one (no round starts after it, and none restarts), `signals` counts
# them per round (the second of a round kills), `delivered` is how many of the round's workers
# got one (the workers started after it get theirs when the round has started them all).
stop=""
signals=0
delivered=0
pids=()
forward() {
  local sig=TERM p
  stop=TERM
  signals=$((signals + 1))
  [ "$signals" -gt 1 ] && sig=KILL
  for p in "${pids[@]}"; do kill -s "$sig" -- "-$p" 2>/dev/null; done
  delivered=${#pids[@]}
}
# SIGINT (Ctrl-C) and SIGHUP (a closed terminal) too reach the workers as SIGTERM: it is the signal
# PreemptionCheckpointHandler saves on, and a worker killed by SIGINT would lose its steps.
trap forward INT TERM HUP

# One round: starts the n workers (new ports, a new job id) and waits for all of them. Sets
# `status` (the first failing worker's status, 0 if none) and `restartable` (that first failure
# asked for a restart or was a death by a signal). Returns 1 when no port was found, 3 when the
# launcher was told to stop before the round started.
run_round() {
  local restart_count="$1" i p port config
  signals=0
  delivered=0
  pids=()
  [ -n "$stop" ] && return 3
  taken=()
  local addresses=""
  for ((i = 0; i < n; i++)); do
    port=$(free_port "$host" "${!taken[@]}") || return 1
    taken[$port]=1
    addresses+="${addresses:+, }\"$host:$port\""
  done
  local job_id="launch-$$-$RANDOM$RANDOM-$restart_count"
  for ((i = 0; i < n; i++)); do
    config="{\"cluster\": {\"worker\": [$addresses]}, \"task\": {\"type\": \"worker\", \"index\": $i}}"
    (
      # Wait for the program even when the group is signalled; the program itself gets the
      # default dispositions back when it is exec'd.
      trap ':' INT TERM HUP
      (
        export TF_CONFIG="$config" MIRRORED_JOB_ID="$job_id" MIRRORED_LAUNCH_RANK="$i"
        export MIRRORED_RESTART_COUNT="$restart_count"
        exec "${program[@]}"
      ) 2>&1 | {
        trap '' INT TERM HUP # the prefixer outlives the program: it must not cut its output
        while IFS= read -r line || [ -n "$line" ]; do
          printf '[worker %d] %s\n' "$i" "$line"
        done
      }
      exit "${PIPESTATUS[0]}"
    ) &
    pids+=("$!")
  done
  # A signal that came while the workers were being started reached only those started before it.
  if [ -n "$stop" ] && [ "$delivered" -lt "${#pids[@]}" ]; then
    [ "$signals" -eq 0 ] && signals=1 # it came before this round's first worker: it is its first
    for p in "${pids[@]:$delivered}"; do kill -s "$stop" -- "-$p" 2>/dev/null; done
    delivered=${#pids[@]}
  fi

  status=0
  restartable=0
  reason=""
  local -A running=()
  for ((i = 0; i < n; i++)); do running[${pids[$i]}]=$i; done
  local remaining=$n watchdog="" finished code rank
  while [ "$remaining" -gt 0 ]; do
    finished=""
    # The shell's own notice of a worker killed by a signal ("line N: PID Killed ( export ...") is
    # not news: the launcher says how each worker ended below. The workers' output does not pass
    # through this stderr.
    wait -n -p finished "${!running[@]}" 2>/dev/null
    code=$?
    [ -z "${finished:-}" ] && continue # interrupted by a forwarded signal
    rank=${running[$finished]}
    unset "running[$finished]"
    remaining=$((remaining - 1))
    [ "$code" -eq 0 ] && continue
    if [ "$code" -eq "$restart_code" ]; then
      echo "launch: worker $rank exited with status $code (saved; restart requested)" >&2
    else
      echo "launch: worker $rank exited with status $code" >&2
    fi
    [ "$status" -ne 0 ] && continue
    # The first failure decides. The others end because of it (a lost peer, or terminated by the
    # watchdog below): how they end says nothing about whether a restart could help.
    status=$code
    if [ "$code" -eq "$restart_code" ]; then
      restartable=1
      reason="worker $rank exited with status $code (restart requested)"
    elif [ "$code" -gt 128 ]; then
      restartable=1
      reason="worker $rank was killed by signal $((code - 128))"
    fi
    if [ "$remaining" -gt 0 ] && [ -z "$watchdog" ]; then
      # Terminate the rest of this round after the grace period, kill them 10 s later.
      (
        sleep "$grace"
        for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
        sleep 10
        for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
      ) >/dev/null 2>&1 &
      watchdog=$!
      disown "$watchdog" # killing it when the round ends is not news
    fi
  done
  [ -n "$watchdog" ] && kill -- "-$watchdog" 2>/dev/null
  pids=() # reaped: their ids may be another process's by now
  return 0
}

program=("$@")
for ((round = 0; ; round++)); do
  run_round "$round"
  case $? in
    0) ;;
    3)
      # Told to stop between two rounds: the previous round's status stands.
      echo "launch: not restarting: the launcher was told to stop" >&2
      exit "$status"
      ;;
    *) exit 1 ;;
  esac
  [ "$status" -eq 0 ] && exit 0
  if [ -n "$stop" ]; then
    exit "$status" # the launcher was told to stop: no restart
  fi
  if [ "$restartable" -eq 0 ]; then
    [ "$max_restarts" -gt 0 ] && echo "launch: not restarting: the failure was not a preemption or a crash" >&2
    exit "$status"
  fi
  if [ "$round" -ge "$max_restarts" ]; then
    [ "$max_restarts" -gt 0 ] && echo "launch: giving up after $max_restarts restart(s): $reason" >&2
    exit "$status"
  fi
  echo "launch: restart $((round + 1)) of $max_restarts: $reason" >&2
  if [ "$restart_delay" != 0 ]; then
    # In the background, so that a signal to the launcher ends the wait at once (bash runs a trap
    # only after the foreground command it waits for).
    sleep "$restart_delay" &
    wait "$!" 2>/dev/null || kill "$!" 2>/dev/null
  fi
done
