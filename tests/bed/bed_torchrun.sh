#!/usr/bin/env bash
# torchrun across the cluster bed's hosts: one agent per host (--nnodes 2, c10d rendezvous at host
# 0), train_digits --strategy multi_worker finding its cluster from torchrun's variables. The
# chief's weights equal those of tools/launch.sh with the same workers over TCP, bit for bit; then
# a worker killed after step 20 under --max_restarts 1 makes the agents restart the group, which
# resumes from its CheckpointManager and ends with the same weights.
#   bed_torchrun.sh BIN
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bed="$here/tools/cluster_bed.sh"
bin=$1
torchrun=$(command -v torchrun || true)
if [ -z "$torchrun" ]; then
  echo "bed_torchrun: torchrun is not installed (Debian's python3-torch; scripts/install-deps.sh)"
  exit 77
fi
source "$here/tests/bed/bed_up.sh"
bed_up 2

training=("$bin/train_digits" --strategy multi_worker --devices CPU:0 --epochs 2 --seed 3 --optimizer adam)

# The reference: tools/launch.sh, 2 workers on this machine, over TCP as between the bed's hosts.
MIRRORED_SHARED_MEMORY=0 bash "$here/tools/launch.sh" 2 -- "${training[@]}" --save "$work/ref.safetensors" \
  > "$work/ref.out" 2>&1 || { echo "bed_torchrun: the run under launch.sh failed"; cat "$work/ref.out"; exit 1; }

# Runs the job under torchrun on both hosts as attempt $1 with the extra flags after it; 90 s at most.
under_torchrun() {
  local attempt=$1 h
  shift
  for h in 0 1; do
    # -r/-t name redirects for a local rank that does not exist: torchrun 1.13 under Python 3.11
    # fails at start-up on its default ones.
    "$bed" run "$h" env MIRRORED_LOG_LEVEL=INFO timeout 90 "$torchrun" --nnodes 2 --nproc_per_node 1 \
      --rdzv_backend c10d --rdzv_endpoint "$("$bed" addr 0):29400" --rdzv_id "bed-$attempt" \
      --max_restarts 1 --monitor_interval 0.2 -r 9:1 -t 9:1 --no_python "${training[@]}" "$@" \
      > "$work/$attempt.out.$h" 2>&1 &
  done
  local status=0
  wait -n || status=$?
  wait -n || status=$?
  return $status
}

if ! under_torchrun plain --save "$work/plain.safetensors"; then
  echo "bed_torchrun: the job under torchrun failed"; cat "$work"/plain.out.*; exit 1
fi
grep -h -m1 "cluster comes from torchrun's variables" "$work"/plain.out.* | cut -c1-160 | head -1
cmp "$work/ref.safetensors" "$work/plain.safetensors" ||
  { echo "bed_torchrun: the weights under torchrun differ from launch.sh's"; exit 1; }
echo "torchrun on 2 hosts: the weights of launch.sh, bit for bit"

mkdir "$work/ckpt"
if ! MIRRORED_TEST_RAISE_AT_STEP=20:KILL:1 under_torchrun restarted --checkpoint-dir "$work/ckpt" --save-every-steps 5 \
  --save "$work/restarted.safetensors"; then
  echo "bed_torchrun: the restarted job failed"; cat "$work"/restarted.out.*; exit 1
fi
grep -q "resumed from the checkpoint of step" "$work"/restarted.out.0 ||
  { echo "bed_torchrun: the job was not restarted and resumed"; cat "$work"/restarted.out.*; exit 1; }
grep -h -m1 "resumed from the checkpoint of step" "$work"/restarted.out.0
cmp "$work/ref.safetensors" "$work/restarted.safetensors" ||
  { echo "bed_torchrun: the restarted job's weights differ from launch.sh's"; exit 1; }
echo "killed and restarted by torchrun's agents: the same weights, bit for bit"
