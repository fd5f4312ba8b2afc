#!/usr/bin/env bash
# An elastic job under torchrun on the cluster bed: three hosts, one agent each (`torchrun --nnodes
# 2:3`, c10d rendezvous served by host 0's agent), mirrored_bed_elastic_ids (tests/bed/
# elastic_ids.cpp) as the workers. Mid-epoch, once worker 0 has recorded step FAULT_STEP, host 2
# is partitioned away. Checked:
#   - the survivors fail fast: each exits with status 75 within the peer timeout + 2 s;
#   - the agents re-form without host 2 within the bound below, and the job resumes on 2 workers
#     (WORLD_SIZE 2, TORCHELASTIC_RESTART_COUNT 1) from the newest checkpoint, and finishes;
#   - every example id of every epoch is consumed exactly once, each step's global batch holds G
#     ids before and after (kept, re-cut by the split rule over 2 replicas), the global batches are
#     an uninterrupted run's, and the final loss is within the noise of uninterrupted runs
#     (tests/bed/elastic_ids_check.py says what "consumed" and "the noise" are).
# Why torchrun's agents re-form as they do (torch 1.13, torch/distributed/elastic/rendezvous/
# dynamic_rendezvous.py): a round of the rendezvous that completed stays until every participant
# has left it. The survivors' agents leave it when their workers fail; the partitioned agent cannot
# and is dropped when its keep-alive expires, 3 x 5 s after its last heartbeat (hard-coded in 1.13:
# keep_alive_interval 5 s, keep_alive_max_attempt 3; no rdzv_conf key sets them). The survivors
# then form the next round, which completes last_call_timeout after its second node joined
# (--nnodes 2:3: min 2). So the rendezvous store must be served on a surviving host (host 0 here:
# the agent whose host name matches --rdzv_endpoint serves it; an agent on a partitioned
# endpoint leaves the survivors' store calls to fail with "Socket Timeout" until the job's end), and
# re-forming takes 10..15 s + last_call_timeout. A first round completes at once when all 3 nodes
# have joined, else last_call_timeout after the second joined: agents 1 and 2 are started first
# and wait for host 0's store, so that all three join within about a second and the first attempt
# has 3 workers (checked).
#   bed_elastic.sh BIN [--fault-step S]
set -euo pipefail
calc() { awk "BEGIN { print $* }"; }
holds() { awk "BEGIN { exit !($*) }"; }
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bed="$here/tools/cluster_bed.sh"
bin=$1
shift
# Step 7 of epoch 2 (steps 26..50); with a save every 5 steps the job resumes at step 30, or at 35,
# 40 or 45 when the partition comes up to 1.8 s late on a loaded machine: mid-epoch all the same.
fault_step=32
while [ $# -gt 0 ]; do
  case "$1" in
    --fault-step) fault_step=$2 ;;
    *) echo "bed_elastic: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
torchrun=$(command -v torchrun || true)
if [ -z "$torchrun" ]; then
  echo "bed_elastic: torchrun is not installed (Debian's python3-torch; scripts/install-deps.sh)"
  exit 77
fi
program="$bin/tests/mirrored_bed_elastic_ids"
[ -x "$program" ] || { echo "bed_elastic: $program is not built"; exit 1; }
started=$(date +%s.%N)
source "$here/tests/bed/bed_up.sh"
bed_up 3

peer_timeout=3 last_call=4
# 600 ids, global batch 24: 25 steps per epoch, 100 in all; a checkpoint every 5 steps.
job=(--examples 600 --global-batch 24 --epochs 4 --save-every-steps 5)

# The uninterrupted runs, on this machine over TCP as between the bed's hosts: 3 workers (the
# global batches and, bit for bit, the losses of the first attempt), 2 and 1 (the noise of the
# final loss), and 1 with the update of step 50 dropped (a lost batch: must be told from the noise).
reference() {
  local name=$1 workers=$2
  shift 2
  mkdir "$work/$name" "$work/$name.ckpt"
  local cmd=("$program" "${job[@]}" --checkpoint-dir "$work/$name.ckpt" --record "$work/$name"
    --result "$work/$name.result" "$@")
  [ "$workers" = 1 ] || cmd=(bash "$here/tools/launch.sh" "$workers" -- "${cmd[@]}")
  MIRRORED_SHARED_MEMORY=0 timeout -k 5 60 "${cmd[@]}" > "$work/$name.out" 2>&1 ||
    { echo "bed_elastic: the uninterrupted run $name failed"; cat "$work/$name.out"; exit 1; }
}
reference ref3 3
reference ref2 2
reference ref1 1
reference dropped 1 --drop-step 50

# The elastic job: agents 1 and 2 first (they wait for host 0's rendezvous store), then host 0's.
mkdir "$work/rec" "$work/ckpt"
agent() {
  "$bed" run "$1" env LOGLEVEL=INFO MIRRORED_PEER_TIMEOUT_S=$peer_timeout timeout -k 5 150 "$torchrun" \
    --nnodes 2:3 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint "$("$bed" addr 0):29400" \
    --rdzv_id "bed-elastic-$$" --rdzv_conf "join_timeout=60,last_call_timeout=$last_call" --max_restarts 2 \
    --monitor_interval 0.2 -r 9:1 -t 9:1 --no_python \
    "$program" "${job[@]}" --checkpoint-dir "$work/ckpt" --record "$work/rec" --result "$work/result" --step-ms 100 \
    > "$work/agent.$1" 2>&1 &
  echo $! > "$work/agent.$1.pid"
}
# Waits up to $2 s until file $1 has a line matching $3; else prints $4 and the agents' logs and fails.
await() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    grep -qE "$3" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "bed_elastic: $4"; tail -n 30 "$work"/agent.*; exit 1
}
agent 1
agent 2
disown  # host 2's agent is killed with the bed at the end: no job report
await "$work/agent.1" 90 "Starting elastic_operator" "host 1's agent did not start"
await "$work/agent.2" 90 "Starting elastic_operator" "host 2's agent did not start"
agent 0

await "$work/rec/0.0" 60 "^step $fault_step " "worker 0 did not reach step $fault_step"
t_fault=$(date +%s.%N)
"$bed" partition 2 both
formed=$(grep -h "^start 0 " "$work"/rec/0.* | grep -oE "of [0-9]+" | sort -u | tr '\n' ' ')
echo "first attempt: $(cat "$work"/rec/0.* | grep -c "^start 0 ") workers started ($formed); host 2 partitioned after step $fault_step"
[ "$formed" = "of 3 " ] ||
  { echo "bed_elastic: the first round did not have 3 nodes (an agent joined late)"; cat "$work"/agent.*; exit 1; }

# The survivors fail fast: their "end 0 ... status 75" lines, within the peer timeout + 2 s.
bound=$(calc "$peer_timeout + 2")
failed_at=0
for w in 0 1; do
  await "$work/rec/0.$w" 30 "^end 0 " "worker $w of the first attempt did not end within 30 s of the partition"
  read -r _ _ _ _ _ status _ at error < <(grep "^end 0 " "$work/rec/0.$w")
  took=$(calc "$at - $t_fault")
  printf 'survivor %d: status %s %.2f s after the partition: %s\n' "$w" "$status" "$took" "${error:0:160}"
  [ "$status" = 75 ] || { echo "bed_elastic: survivor $w ended with status $status, not 75"; exit 1; }
  holds "$took <= $bound" || { echo "bed_elastic: survivor $w took $took s > $bound s"; exit 1; }
  holds "$at > $failed_at" && failed_at=$at
done

end_line=$(grep "^end 0 " "$work/rec/0.2" 2>/dev/null || true)
[ -z "$end_line" ] || printf 'partitioned worker 2: status %s %.2f s after the partition\n' \
  "$(awk '{ print $6 }' <<<"$end_line")" "$(calc "$(awk '{ print $8 }' <<<"$end_line") - $t_fault")"

# The survivors' agents re-form without host 2 and the job finishes (their torchruns exit 0).
for h in 0 1; do
  rc=0
  wait "$(cat "$work/agent.$h.pid")" || rc=$?
  [ "$rc" = 0 ] || { echo "bed_elastic: host $h's torchrun exited with $rc"; cat "$work/agent.$h"; exit 1; }
  # What the agent says of the restart: the failed group, then the new round's size.
  said=$(grep -oE "Worker group FAILED.*|restart_count=[0-9]+|group_world_size=[0-9]+" "$work/agent.$h" | tr '\n' ' ')
  echo "host $h's agent: $said"
  grep -q "restart_count=1 group_world_size=2" <<<"$said" ||
    { echo "bed_elastic: host $h's agent did not re-form with 2 nodes"; cat "$work/agent.$h"; exit 1; }
done
relaunched=$(cat "$work"/rec/1.* | awk '/^start 1 / { print $10 }' | sort -n | head -1)
[ -n "$relaunched" ] || { echo "bed_elastic: no second attempt"; cat "$work"/agent.0; exit 1; }
# The partitioned agent is dropped from the rendezvous 15 s after its last heartbeat (10..15 s
# after the partition), then the next round completes last_call_timeout after both survivors
# joined (they poll the store every second); 8 s for polling and starting the workers.
reform=$(calc "$relaunched - $t_fault")
reform_bound=$(calc "15 + $last_call + 8")
printf 'second attempt: %s workers, launched %.1f s after the partition (%.1f s after the survivors failed; bound %s s)\n' \
  "$(cat "$work"/rec/1.* | grep -c "^start 1 .* of 2 ")" "$reform" "$(calc "$relaunched - $failed_at")" "$reform_bound"
holds "$reform <= $reform_bound" || { echo "bed_elastic: re-forming took $reform s > $reform_bound s"; exit 1; }

python3 "$here/tests/bed/elastic_ids_check.py" --records "$work/rec" --reference "$work/ref3" --worlds 3,2 \
  --examples 600 --global-batch 24 --epochs 4 --result "$work/result" \
  --reference-results "$work/ref3.result,$work/ref2.result,$work/ref1.result" --dropped-result "$work/dropped.result" ||
  { echo "bed_elastic: the records fail the checks"; exit 1; }
printf 'the whole test: %.1f s\n' "$(calc "$(date +%s.%N) - $started")"
