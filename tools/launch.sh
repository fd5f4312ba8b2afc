#!/usr/bin/env bash
# Starts the N workers of a multi-worker job on this machine, each with its TF_CONFIG
# (docs/multi_worker.md):
#
#   tools/launch.sh N [--host HOST] -- program [args...]
#
# Worker i gets TF_CONFIG {"cluster": {"worker": [HOST:p0, ..., HOST:pN-1]}, "task": {"type":
# "worker", "index": i}} on free ports (worker 0 is the chief and serves the job's store on p0),
# MIRRORED_JOB_ID (one per launch) and MIRRORED_LAUNCH_RANK=i. Every line a worker prints is
# prefixed with "[worker i] ". SIGINT, SIGTERM and SIGHUP are forwarded to every worker (a second
# one kills them). When a worker fails, the others get MIRRORED_LAUNCH_GRACE_S seconds (default
# 30) to finish on their own before they are terminated. Exits 0 when every worker exited 0,
# else with the first failing worker's status.
set -uo pipefail

usage() {
  echo "usage: tools/launch.sh N [--host HOST] -- program [args...]" >&2
  exit 2
}

[ $# -ge 1 ] || usage
n="$1"
shift
[[ "$n" =~ ^[1-9][0-9]*$ ]] || usage
host=127.0.0.1
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --host)
      [ $# -ge 2 ] || usage
      host="$2"
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

# A port nobody listens on (the chief binds it; the others only name their worker).
declare -A taken=()
free_port() {
  local p tries
  for ((tries = 0; tries < 200; tries++)); do
    p=$((20000 + RANDOM % 40000))
    [ -n "${taken[$p]:-}" ] && continue
    if ! (exec 3<>"/dev/tcp/$host/$p") 2>/dev/null; then
      taken[$p]=1
      echo "$p"
      return 0
    fi
  done
  echo "launch: found no free port on $host" >&2
  return 1
}

addresses=""
for ((i = 0; i < n; i++)); do
  port=$(free_port) || exit 1
  taken[$port]=1
  addresses+="${addresses:+, }\"$host:$port\""
done
job_id="launch-$$-$RANDOM$RANDOM"

# Each worker is a job of its own (a process group): signals reach the program and its children.
set -m
pids=()
for ((i = 0; i < n; i++)); do
  config="{\"cluster\": {\"worker\": [$addresses]}, \"task\": {\"type\": \"worker\", \"index\": $i}}"
  (
    # Wait for the program even when the group is signalled; the program itself gets the
    # default dispositions back when it is exec'd.
    trap ':' INT TERM HUP
    (
      export TF_CONFIG="$config" MIRRORED_JOB_ID="$job_id" MIRRORED_LAUNCH_RANK="$i"
      exec "$@"
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

signals=0
forward() {
  local sig="$1" p
  signals=$((signals + 1))
  [ "$signals" -gt 1 ] && sig=KILL
  for p in "${pids[@]}"; do kill -s "$sig" -- "-$p" 2>/dev/null; done
}
trap 'forward INT' INT
trap 'forward TERM' TERM
trap 'forward HUP' HUP

status=0
declare -A running=()
for ((i = 0; i < n; i++)); do running[${pids[$i]}]=$i; done
remaining=$n
watchdog=""
while [ "$remaining" -gt 0 ]; do
  finished=""
  wait -n -p finished "${!running[@]}"
  code=$?
  [ -z "${finished:-}" ] && continue # interrupted by a forwarded signal
  rank=${running[$finished]}
  unset "running[$finished]"
  remaining=$((remaining - 1))
  if [ "$code" -ne 0 ]; then
    echo "launch: worker $rank exited with status $code" >&2
    if [ "$status" -eq 0 ]; then
      status=$code
      if [ "$remaining" -gt 0 ] && [ -z "$watchdog" ]; then
        grace="${MIRRORED_LAUNCH_GRACE_S:-30}"
        # Terminate the rest after the grace period, kill them 10 s later.
        (
          sleep "$grace"
          kill -TERM $$ 2>/dev/null
          sleep 10
          kill -TERM $$ 2>/dev/null
        ) >/dev/null 2>&1 &
        watchdog=$!
      fi
    fi
  fi
done
[ -n "$watchdog" ] && kill -- "-$watchdog" 2>/dev/null
exit "$status"
