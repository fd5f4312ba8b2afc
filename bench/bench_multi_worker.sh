#!/usr/bin/env bash
# Multi-worker benchmarks (docs/performance.md), in one run on this machine:
#   1. all-reduce of 4 MiB and 64 MiB of floats between 2 worker processes on loopback:
#      MultiWorkerMirroredStrategy over Gloo/TCP and over shared memory, against PyTorch's Gloo
#      backend (Debian python3-torch under /usr/bin/python3, installed here when absent);
#      ROUNDS interleaved rounds, the median of each reported, and the speed-ups.
#   2. CommunicationOptions::compression: the 64 MiB all-reduce with none, FP16 and BF16, over
#      Gloo/TCP and shared memory, and over Gloo/TCP on a loopback capped at --link-gbit Gbit/s each
#      way (a private network namespace, `unshare -rn`, with a token-bucket qdisc on its lo; skipped
#      where unprivileged namespaces are not allowed, or with --link-gbit 0); ROUNDS interleaved
#      rounds, the median of each, GB/s (tensor bytes / time) and the speed-ups over none.
#   3. how long survivors take to report a killed worker, and a stopped one (against the
#      collective timeout).
#
#   bench/bench_multi_worker.sh [--build-dir build/release] [--rounds 3] [--link-gbit 10] [--no-install]
#
# Needs the release build's bench_multi_worker and mirrored_mw_worker:
#   cmake --preset release && cmake --build --preset release --target bench_multi_worker mirrored_mw_worker
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build/release
rounds=3
link_gbit=10
install=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --link-gbit) link_gbit="$2"; shift 2 ;;
    --no-install) install=0; shift ;;
    *) echo "usage: bench/bench_multi_worker.sh [--build-dir DIR] [--rounds N] [--link-gbit G] [--no-install]" >&2; exit 2 ;;
  esac
done
worker="$build/bench_workers/bench_multi_worker"
mw="$build/tests/mirrored_mw_worker"
for exe in "$worker" "$mw"; do
  if [ ! -x "$exe" ]; then
    echo "bench_multi_worker: $exe is missing; build it first:" >&2
    echo "  cmake --preset release && cmake --build --preset release --target bench_multi_worker mirrored_mw_worker" >&2
    exit 1
  fi
done

python=/usr/bin/python3
if ! "$python" -c 'import torch.distributed' >/dev/null 2>&1; then
  if [ "$install" = 1 ] && command -v apt-get >/dev/null 2>&1; then
    echo "bench_multi_worker: installing python3-torch (Debian) for the PyTorch comparison"
    sudo=()
    [ "$(id -u)" -ne 0 ] && sudo=(sudo)
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends python3-torch >/dev/null
  fi
fi
have_torch=0
"$python" -c 'import torch.distributed as d; assert d.is_gloo_available()' >/dev/null 2>&1 && have_torch=1

sizes=4,64
iters=50,10
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# shellcheck source=tools/free_port.sh
source tools/free_port.sh # the script runs from the repository root

run_torch() {
  local port
  port=$(free_port 127.0.0.1)
  "$python" bench/torch_gloo_allreduce.py 1 2 "$port" "$sizes" "$iters" &
  local other=$!
  "$python" bench/torch_gloo_allreduce.py 0 2 "$port" "$sizes" "$iters"
  wait "$other"
}

echo "== all-reduce between 2 processes on loopback ($rounds rounds, interleaved)"
for ((round = 1; round <= rounds; round++)); do
  MIRRORED_SHARED_MEMORY=0 tools/launch.sh 2 -- "$worker" --label tcp --sizes "$sizes" --iters "$iters" |
    sed -n 's/^\[worker 0\] //p' >>"$out/results"
  MIRRORED_SHARED_MEMORY=1 tools/launch.sh 2 -- "$worker" --label shm --sizes "$sizes" --iters "$iters" |
    sed -n 's/^\[worker 0\] //p' >>"$out/results"
  [ "$have_torch" = 1 ] && run_torch >>"$out/results"
done
cat "$out/results"

median() { sort -g | awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]}'; }
ms_of() {  # label size
  grep -E "^$1 $2 MiB" "$out/results" | sed -E 's/.*: ([0-9.]+) ms.*/\1/' | median
}
echo
printf '%-8s %-22s %-22s %-22s %-10s %-10s\n' "size" "Gloo/TCP (ms)" "shared memory (ms)" "torch gloo (ms)" "TCP x" "shm x"
for mib in ${sizes//,/ }; do
  tcp=$(ms_of "mirrored tcp" "$mib")
  shm=$(ms_of "mirrored shm" "$mib")
  torch=$(ms_of "torch-gloo" "$mib")
  if [ -n "$torch" ]; then
    rt=$(awk -v a="$torch" -v b="$tcp" 'BEGIN {printf "%.2f", a / b}')
    rs=$(awk -v a="$torch" -v b="$shm" 'BEGIN {printf "%.2f", a / b}')
  else
    torch="(no torch)" rt="-" rs="-"
  fi
  printf '%-8s %-22s %-22s %-22s %-10s %-10s\n' "$mib MiB" "$tcp" "$shm" "$torch" "$rt" "$rs"
done
echo "(x: PyTorch's time / ours; targets: TCP >= 1.0, shared memory >= 2.0)"

echo
echo "== compression: 64 MiB all-reduce of floats, none / FP16 / BF16 ($rounds rounds, interleaved)"
# Loopback is as fast as memory, and lo's one queue carries both directions: twice the rate per
# direction.
capped() {
  unshare -rn bash -c "ip link set lo up && tc qdisc add dev lo root tbf rate $((2 * link_gbit))gbit burst 4mb \
    latency 200ms && MIRRORED_SHARED_MEMORY=0 tools/launch.sh 2 -- $worker $*"
}
have_cap=0
if [ "$link_gbit" != 0 ] && unshare -rn bash -c "ip link set lo up && tc qdisc add dev lo root tbf rate 1gbit \
  burst 1mb latency 100ms" >/dev/null 2>&1; then
  have_cap=1
fi
compress=(--sizes 64 --iters 10 --compressions none,fp16,bf16)
for ((round = 1; round <= rounds; round++)); do
  MIRRORED_SHARED_MEMORY=0 tools/launch.sh 2 -- "$worker" --label ctcp "${compress[@]}" |
    sed -n 's/^\[worker 0\] //p' >>"$out/results"
  MIRRORED_SHARED_MEMORY=1 tools/launch.sh 2 -- "$worker" --label cshm "${compress[@]}" |
    sed -n 's/^\[worker 0\] //p' >>"$out/results"
  [ "$have_cap" = 1 ] && capped --label ccap "${compress[@]}" | sed -n 's/^\[worker 0\] //p' >>"$out/results"
done
grep -E '^mirrored c(tcp|shm|cap)' "$out/results"
echo
gbs() { awk -v t="$1" 'BEGIN {printf "%.2f", 67.108864 / t}'; }  # 64 MiB / t ms, in GB/s
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
printf '%-30s %-18s %-18s %-18s %-8s %-8s\n' "transport" "none ms (GB/s)" "FP16 ms (GB/s)" "BF16 ms (GB/s)" "FP16 x" "BF16 x"
rows=("ctcp:Gloo/TCP" "cshm:shared memory")
[ "$have_cap" = 1 ] && rows+=("ccap:Gloo/TCP, ${link_gbit} Gbit/s link")
for row in "${rows[@]}"; do
  label=${row%%:*}
  none=$(ms_of "mirrored $label" 64)
  fp16=$(ms_of "mirrored $label-fp16" 64)
  bf16=$(ms_of "mirrored $label-bf16" 64)
  printf '%-30s %-18s %-18s %-18s %-8s %-8s\n' "${row#*:}" "$none ($(gbs "$none"))" "$fp16 ($(gbs "$fp16"))" \
    "$bf16 ($(gbs "$bf16"))" "$(ratio "$none" "$fp16")" "$(ratio "$none" "$bf16")"
done
[ "$have_cap" = 1 ] || echo "(no capped link: unprivileged network namespaces are not available here)"
echo "(x: none's time / the compressed one's; target: FP16 >= 1.5 over Gloo/TCP; load: $(cat /proc/loadavg))"

echo
echo "== failure detection (3 workers, the victim fails at its 4th collective)"
for transport in 0 1; do
  name=$([ "$transport" = 0 ] && echo "Gloo/TCP" || echo "shared memory")
  MIRRORED_SHARED_MEMORY=$transport tools/launch.sh 3 -- "$mw" kill --victim 2 --step 3 --timeout 60 \
    >"$out/kill" 2>&1 || true
  grep -o 'UnavailableError after [0-9.]* s' "$out/kill" | sed "s|^|  killed worker, $name: |" || true
  timeout_s=2
  MIRRORED_SHARED_MEMORY=$transport MIRRORED_LAUNCH_GRACE_S=1 tools/launch.sh 3 -- "$mw" stop --victim 2 --step 3 \
    --timeout "$timeout_s" >"$out/stop" 2>&1 &
  launcher=$!
  for ((i = 0; i < 300; i++)); do
    [ "$(grep -c 'DeadlineExceededError after' "$out/stop")" -ge 2 ] && break
    sleep 0.1
  done
  kill -TERM "$launcher" 2>/dev/null || true
  sleep 0.5
  kill -TERM "$launcher" 2>/dev/null || true  # a second signal kills the stopped worker
  wait "$launcher" 2>/dev/null || true
  grep -o 'DeadlineExceededError after [0-9.]* s' "$out/stop" |
    sed "s|^|  stopped worker (timeout ${timeout_s} s), $name: |" || true
done
