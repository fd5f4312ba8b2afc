#!/usr/bin/env bash
# Starts the N workers of a multi-worker job on this machine, each with its TF_CONFIG
# (docs/multi_worker.md), and restarts them after a preemption or a crash when asked to
# (docs/fault_tolerance.md):
#
#   tools/launch.sh N [--host HOST] [--max-restarts K] -- program [args...]
#
# Worker i gets TF_CONFIG {"cluster": {"worker": [HOST:p0, ..., HOST:pN-1]}, "task": {"type":
# "worker", "index": i}} on free ports (worker 0 is the chief and serves the job's store on p0),
# MIRRORED_JOB_ID (one per launch and restart), MIRRORED_LAUNCH_RANK=i and
# MIRRORED_RESTART_COUNT (0, then 1, 2, ... after each restart). Every line a worker prints is
# prefixed with "[worker i] ". SIGINT, SIGTERM and SIGHUP are forwarded to every worker (a second
# one kills them). When a worker fails, the others get MIRRORED_LAUNCH_GRACE_S seconds (default
# 30) to finish on their own before they are terminated.
#
# Restarts (--max-restarts K, default 0): when a round ends with a worker that exited with status
# 75 (PreemptionCheckpointHandler::kRestartExitCode, "saved, restart me") or was killed by a
# signal, and the launcher itself was not told to stop, every worker is started again, up to K
# times; the launcher prints why. Any other failure (a bad argument, an error in the program)
# would only fail again, so it ends the job. Exits 0 when every worker of the last round exited
# 0, else with the first failing worker's status.
set -uo pipefail

usage() {
  echo "usage: tools/launch.sh N [--host HOST] [--max-restarts K] -- program [args...]" >&2
  exit 2
}

[ $# -ge 1 ] || usage
n="$1"
shift
[[ "$n" =~ ^[1-9][0-9]*$ ]] || usage
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
      [ $# -ge 2 ] && [[ "$2" =~ ^[0-9]+$ ]] || usage
      max_restarts="$2"
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

# Each worker is a job of its own (a process group): signals reach the program and its children.
set -m
signals=0
pids=()
forward() {
  local sig="$1" p
  signals=$((signals + 1))
  [ "$signals" -gt 1 ] && sig=KILL
  for p in "${pids[@]}"; do kill -s "$sig" -- "-$p" 2>/dev/null; done
}
trap 'forward INT' INT
trap 'forward TERM' TERM
trap 'forward HUP' HUP

# One round: starts the n workers (new ports, a new job id) and waits for all of them. Sets
# `status` (the first failing worker's status, 0 if none) and `restartable` (a worker asked for a
# restart or died of a signal).
run_round() {
  local restart_count="$1" i port config
  taken=()
  local addresses=""
  for ((i = 0; i < n; i++)); do
    port=$(free_port "$host" "${!taken[@]}") || return 1
    taken[$port]=1
    addresses+="${addresses:+, }\"$host:$port\""
  done
  local job_id="launch-$$-$RANDOM$RANDOM-$restart_count"
  pids=()
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

  status=0
  restartable=0
  reason=""
  local -A running=()
  for ((i = 0; i < n; i++)); do running[${pids[$i]}]=$i; done
  local remaining=$n watchdog="" finished code rank grace
  while [ "$remaining" -gt 0 ]; do
    finished=""
    wait -n -p finished "${!running[@]}"
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
    if [ "$restartable" -eq 0 ] && { [ "$code" -eq "$restart_code" ] || [ "$code" -gt 128 ]; }; then
      restartable=1
      if [ "$code" -eq "$restart_code" ]; then
        reason="worker $rank exited with status $code (restart requested)"
      else
        reason="worker $rank was killed by signal $((code - 128))"
      fi
    fi
    if [ "$status" -eq 0 ]; then
      status=$code
      if [ "$remaining" -gt 0 ] && [ -z "$watchdog" ]; then
        grace="${MIRRORED_LAUNCH_GRACE_S:-30}"
        # Terminate the rest of this round after the grace period, kill them 10 s later (their
        # own statuses then do not count as a reason to restart: they were told to stop).
        (
          sleep "$grace"
          for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
          sleep 10
          for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null; done
        ) >/dev/null 2>&1 &
        watchdog=$!
        disown "$watchdog" # killing it when the round ends is not news
      fi
    fi
  done
  [ -n "$watchdog" ] && kill -- "-$watchdog" 2>/dev/null
  return 0
}

program=("$@")
for ((round = 0; ; round++)); do
  run_round "$round" || exit 1
  [ "$status" -eq 0 ] && exit 0
  if [ "$signals" -gt 0 ]; then
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
done
