#!/usr/bin/env bash
# A host lost in the middle of training with a CheckpointManager save every step (the partition
# lands in a save or between two), on the cluster bed: the survivors fail fast, the job is
# restarted on the same hosts, resumes from the newest complete checkpoint and ends with the
# weights of an uninterrupted run, bit for bit.
#   bed_resume.sh BIN [--hosts H] [--victim K] [--epochs E] [--fault-after S]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bed="$here/tools/cluster_bed.sh"
bin=$1
shift
hosts=3 victim=2 epochs=3 fault_after=3
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) hosts=$2 ;;
    --victim) victim=$2 ;;
    --epochs) epochs=$2 ;;
    --fault-after) fault_after=$2 ;;
    *) echo "bed_resume: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done

source "$here/tests/bed/bed_up.sh"
bed_up "$hosts"

cluster=$(for ((h = 0; h < hosts; h++)); do printf '"%s:2222",' "$("$bed" addr "$h")"; done)
cluster=${cluster%,}

# Starts the job (one worker per host) as attempt $1, with the checkpoints in $2; the chief saves
# the final weights to $work/$1.safetensors.
start() {
  local attempt=$1 dir=$2 h
  for ((h = 0; h < hosts; h++)); do
    "$bed" run "$h" env TF_CONFIG="{\"cluster\": {\"worker\": [$cluster]}, \"task\": {\"type\": \"worker\", \"index\": $h}}" \
      MIRRORED_PEER_TIMEOUT_S=3 bash -c '"$@" > '"$work/$attempt.out.$h"' 2>&1; echo $? > '"$work/$attempt.exit.$h" \
      _ "$bin/train_digits" --strategy multi_worker --devices CPU:0 --optimizer adam --epochs "$epochs" --seed 3 \
      --checkpoint-dir "$dir" --save-every-steps 1 --save "$work/$attempt.safetensors" &
    disown
  done
}
# Waits until every worker of attempt $1 has ended (60 s at most each).
wait_all() {
  local h i
  for ((h = 0; h < hosts; h++)); do
    for ((i = 0; i < 600; i++)); do [ -e "$work/$1.exit.$h" ] && break; sleep 0.1; done
    [ -e "$work/$1.exit.$h" ] || { echo "bed_resume: worker $h of $1 still runs"; cat "$work/$1.out.$h"; exit 1; }
  done
}
codes() { local h; for ((h = 0; h < hosts; h++)); do printf '%s ' "$(cat "$work/$1.exit.$h")"; done; }

mkdir "$work/ref.ckpt" "$work/ckpt"
start ref "$work/ref.ckpt"
wait_all ref
[ "$(codes ref)" = "$(printf '0 %.0s' $(seq "$hosts"))" ] || { echo "bed_resume: the uninterrupted run failed: $(codes ref)"; cat "$work"/ref.out.*; exit 1; }

start first "$work/ckpt"
sleep "$fault_after"
"$bed" partition "$victim" both
wait_all first
echo "first attempt, exit codes: $(codes first)"
for ((h = 0; h < hosts; h++)); do
  if [ "$(cat "$work/first.exit.$h")" = 0 ]; then
    echo "bed_resume: worker $h finished although host $victim was partitioned (too late a fault?)"; cat "$work/first.out.$h"; exit 1
  fi
done
grep -h -m1 "UNAVAILABLE" "$work"/first.out.* | cut -c1-200
"$bed" heal "$victim"

start second "$work/ckpt"
wait_all second
[ "$(codes second)" = "$(printf '0 %.0s' $(seq "$hosts"))" ] || { echo "bed_resume: the restarted job failed: $(codes second)"; cat "$work"/second.out.*; exit 1; }
grep -h "resumed from" "$work"/second.out.* || { echo "bed_resume: the restarted job did not resume"; cat "$work/second.out.0"; exit 1; }
if cmp "$work/ref.safetensors" "$work/second.safetensors"; then
  echo "the resumed job's weights equal the uninterrupted run's, bit for bit"
else
  echo "bed_resume: the resumed job's weights differ from the uninterrupted run's"; exit 1
fi
