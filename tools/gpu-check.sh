#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, the CUDA toolkit and NCCL (nothing is
# downloaded), configure and build the CUDA configuration (CMAKE_CUDA_ARCHITECTURES=90, the `cuda`
# preset), run the `gpu` tests, compute-sanitizer on them when it is installed, the GPU benchmarks
# and the training example on GPU:0, then print a short table. Meant to finish in under 8 minutes
# on a 16-core machine with one H200.
#
#   tools/gpu-check.sh            # everything
#   JOBS=8 tools/gpu-check.sh     # fewer build jobs
#
# Logs and raw outputs go to build/cuda/gpu-check/. Exit status: 0 when the build, every gpu test
# and the sanitizer (when run) passed; 1 otherwise. Paste the table into docs/gpu-results.md.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$(pwd)
BUILD="$ROOT/build/cuda"
OUT="$BUILD/gpu-check"
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
START=$(date +%s)
export PATH="$PATH:/usr/local/cuda/bin"

declare -a ROWS=()
FAILED=0
row() { ROWS+=("$1|$2"); }
elapsed() { echo $(( $(date +%s) - START ))s; }
say() { echo; echo "==== $* ($(elapsed))"; }

mkdir -p "$OUT" 2>/dev/null || { mkdir -p "$BUILD" && mkdir -p "$OUT"; }

say "machine"
GPU_COUNT=0
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpus.txt"
  GPU_COUNT=$(grep -c . "$OUT/gpus.txt")
  GPU_NAME="$GPU_COUNT x $(head -1 "$OUT/gpus.txt" | cut -d, -f2 | sed 's/^ *//')"
else
  echo "nvidia-smi not found"
fi
[ "$GPU_COUNT" -gt 0 ] || GPU_NAME="none visible (every gpu test will skip)"
nvcc --version 2>/dev/null | tail -1
row "GPU" "${GPU_NAME:-none}"
for tool in cmake ninja nvcc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "gpu-check: '$tool' is not installed; this machine cannot build the CUDA configuration" >&2
    exit 1
  fi
done

# --------------------------------------------------------------------------------------------
say "configure + build (cuda preset, sm_90, -j$JOBS)"
t0=$(date +%s)
built=0
if cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/configure.log" 2>&1; then
  targets=(mirrored mirrored_gpu_tests mirrored_gpu_logical_tests train_digits)
  # bench_gpu exists when Google Benchmark was found.
  if ninja -C "$BUILD" -t targets all 2>/dev/null | cut -d: -f1 | grep -qx bench_gpu; then targets+=(bench_gpu); fi
  cmake --build --preset cuda -j"$JOBS" --target "${targets[@]}" >"$OUT/build.log" 2>&1 && built=1
fi
if [ "$built" = 1 ]; then
  row "build (cuda preset, sm_90)" "ok in $(( $(date +%s) - t0 ))s"
else
  tail -40 "$OUT/configure.log" "$OUT/build.log" 2>/dev/null
  row "build (cuda preset, sm_90)" "FAILED (see $OUT/build.log)"
  FAILED=1
fi
grep -m1 'CUDA backend enabled' "$OUT/configure.log" || true

# --------------------------------------------------------------------------------------------
if [ "$FAILED" = 0 ]; then
  say "gpu tests (ctest -L gpu)"
  (cd "$BUILD" && timeout 300 ctest -L gpu -j4 --output-on-failure --timeout 240) >"$OUT/ctest.log" 2>&1
  status=$?
  tail -25 "$OUT/ctest.log"
  summary=$(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)
  skipped=$(grep -c -- '\*\*\*Skipped' "$OUT/ctest.log" || true)
  if [ "$status" = 0 ]; then
    row "gpu tests" "${summary:-?} (${skipped} skipped)"
  else
    row "gpu tests" "FAILED: ${summary:-ctest exit $status} (${skipped} skipped; see $OUT/ctest.log)"
    FAILED=1
  fi

  # ------------------------------------------------------------------------------------------
  say "compute-sanitizer"
  SAN=$(command -v compute-sanitizer || true)
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -z "$SAN" ] && [ -x "$c" ] && SAN=$c
  done
  if [ -z "$SAN" ]; then
    echo "compute-sanitizer is not installed"
    row "compute-sanitizer" "not installed (not run)"
  else
    san_status=0
    # The training test is slow under memcheck and adds no kernels of its own.
    timeout 200 "$SAN" --tool memcheck --error-exitcode 99 --leak-check no --report-api-errors no \
      "$BUILD/mirrored_gpu_tests" --gtest_filter='-*Training*' >"$OUT/memcheck.log" 2>&1 || san_status=$?
    timeout 100 "$SAN" --tool memcheck --error-exitcode 99 --leak-check no --report-api-errors no \
      "$BUILD/mirrored_gpu_logical_tests" --gtest_filter='*/2logical' >"$OUT/memcheck_logical.log" 2>&1 ||
      { [ "$san_status" = 0 ] && san_status=$?; }
    tail -3 "$OUT/memcheck.log" "$OUT/memcheck_logical.log"
    errors=$(grep -h -E '^========= ERROR SUMMARY' "$OUT"/memcheck*.log | tr '\n' ' ')
    if [ "$san_status" = 0 ]; then
      row "compute-sanitizer memcheck" "clean (${errors:-no summary})"
    else
      row "compute-sanitizer memcheck" "FAILED, exit $san_status: ${errors} (see $OUT/memcheck*.log)"
      FAILED=1
    fi
  fi

  # ------------------------------------------------------------------------------------------
  say "GPU benchmarks"
  if [ -x "$BUILD/bench/bench_gpu" ]; then
    timeout 150 "$BUILD/bench/bench_gpu" --benchmark_out="$OUT/bench_gpu.json" --benchmark_out_format=json \
      2>&1 | tee "$OUT/bench_gpu.txt"
    if command -v python3 >/dev/null 2>&1 && [ -s "$OUT/bench_gpu.json" ]; then
      while IFS='|' read -r k v; do row "$k" "$v"; done < <(python3 - "$OUT/bench_gpu.json" <<'PY'
import json, sys
bench = {b["name"].split("/")[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
def get(name, key, fmt):
    b = bench.get(name)
    return fmt.format(b[key]) if b and key in b else "n/a"
print("all-reduce 256 MiB/replica, 2 logical GPUs on GPU 0|ratio to D2D copy {} (target >= 0.8); {} ms vs {} ms; {} GB/s".format(
    get("BM_AllReduceSameGpu", "ratio", "{:.2f}"), get("BM_AllReduceSameGpu", "allreduce_ms", "{:.3f}"),
    get("BM_AllReduceSameGpu", "anchor_ms", "{:.3f}"), get("BM_AllReduceSameGpu", "allreduce_GBps", "{:.0f}")))
print("host->device 64 MiB|pinned source {} (target >= 0.9); pageable Tensor::to {}; anchor {} GB/s".format(
    get("BM_HostToDevice", "ratio_pinned", "{:.2f}"), get("BM_HostToDevice", "ratio", "{:.2f}"),
    get("BM_HostToDevice", "anchor_GBps", "{:.1f}")))
print("empty run, 2 logical GPUs|{} us".format(get("BM_EmptyRun", "run_us", "{:.1f}")))
PY
)
    elif [ -s "$OUT/bench_gpu.json" ]; then
      row "GPU benchmarks" "see $OUT/bench_gpu.txt (no python3 for the table)"
    else
      row "GPU benchmarks" "$(head -1 "$OUT/bench_gpu.txt")"
    fi
  else
    row "GPU benchmarks" "not built (Google Benchmark missing?)"
  fi

  # ------------------------------------------------------------------------------------------
  say "train_digits --devices GPU:0"
  if [ "$GPU_COUNT" = 0 ]; then
    row "train_digits --devices GPU:0 --epochs 5" "skipped (no GPU)"
  elif timeout 120 "$BUILD/train_digits" --devices GPU:0 --epochs 5 >"$OUT/train_gpu.txt" 2>&1; then
    tail -2 "$OUT/train_gpu.txt"
    row "train_digits --devices GPU:0 --epochs 5" "$(grep -i -m1 'accuracy' "$OUT/train_gpu.txt" || tail -1 "$OUT/train_gpu.txt")"
  else
    tail -5 "$OUT/train_gpu.txt"
    row "train_digits --devices GPU:0 --epochs 5" "FAILED (see $OUT/train_gpu.txt)"
    FAILED=1
  fi
fi

# --------------------------------------------------------------------------------------------
if [ "$GPU_COUNT" = 0 ]; then
  row "verdict" "NO GPU: nothing GPU-specific was verified"
  FAILED=1
fi
say "summary"
{
  echo "| check | result |"
  echo "|---|---|"
  for r in "${ROWS[@]}"; do echo "| ${r%%|*} | ${r#*|} |"; done
  echo "| total time | $(elapsed) |"
} | tee "$OUT/summary.md"
exit "$FAILED"
