#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, the CUDA toolkit, CMake and Ninja (nothing is
# downloaded), configure and build the CUDA configuration (CMAKE_CUDA_ARCHITECTURES=90, the `cuda`
# preset), run the `gpu` tests, the GPU benchmarks, the training example on GPU:0 and
# compute-sanitizer on the gpu tests, then print a short table. Every stage has a time limit and
# the whole script stops itself after GPU_CHECK_SECONDS (default 540), so it fits one 10-minute
# session on a 16-core machine with one H200.
#
#   tools/gpu-bundle.sh                  # here: pack Eigen, GoogleTest, Benchmark, zlib into .gpu-bundle/
#   tools/gpu-check.sh [--copy-to DIR]   # there: everything; DIR receives the table and the logs
#   JOBS=8 tools/gpu-check.sh            # fewer build jobs
#
# Dependencies: .gpu-bundle/ when present (a bare machine needs it), else the system's packages.
# NCCL: the toolkit's, else the nvidia-nccl Python wheel's when python3 has one.
# Logs go to build/cuda/gpu-check/. Exit status: 0 when the build, every gpu test and the
# sanitizer (when it could run) passed on a machine with a GPU; 1 otherwise. Paste the table into
# docs/gpu-results.md.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
ROOT=$(pwd)
BUILD="$ROOT/build/cuda"
LOGDIR="$BUILD/gpu-check"
BUNDLE="$ROOT/.gpu-bundle"
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
START=$(date +%s)
DEADLINE=$(( START + ${GPU_CHECK_SECONDS:-540} ))
COPY_TO=""
while [ $# -gt 0 ]; do
  case "$1" in
    --copy-to) COPY_TO=${2:?--copy-to needs a folder}; shift 2 ;;
    *) echo "gpu-check: unknown argument '$1' (usage: tools/gpu-check.sh [--copy-to DIR])" >&2; exit 2 ;;
  esac
done
export PATH="$PATH:/usr/local/cuda/bin"

declare -a ROWS=()
FAILED=0
row() { ROWS+=("$1|$2"); }
elapsed() { echo $(( $(date +%s) - START ))s; }
say() { echo; echo "==== $* ($(elapsed))"; }
# Seconds a stage may take: its own limit, or what is left before the deadline (minus a margin
# for the summary) when that is less.
# Never below 1 (`timeout 0` would mean no limit at all); callers check enough_time first.
budget() {
  local left=$(( DEADLINE - $(date +%s) - 15 ))
  [ "$left" -lt "$1" ] || left=$1
  [ "$left" -ge 1 ] || left=1
  echo "$left"
}
enough_time() { [ $(( DEADLINE - $(date +%s) - 15 )) -ge "${1:-20}" ]; }

mkdir -p "$LOGDIR" || exit 1

say "machine"
GPU_COUNT=0
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | tee "$LOGDIR/gpus.txt"
  GPU_COUNT=$(grep -c . "$LOGDIR/gpus.txt")
  GPU_NAME="$GPU_COUNT x $(head -1 "$LOGDIR/gpus.txt" | cut -d, -f2 | sed 's/^ *//')"
else
  echo "nvidia-smi not found" | tee "$LOGDIR/gpus.txt"
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
say "dependencies"
CMAKE_ARGS=(-DCMAKE_CUDA_ARCHITECTURES=90)
deps_ok=1
if [ -d "$BUNDLE" ]; then
  cat "$BUNDLE/MANIFEST" 2>/dev/null
  DEPS="$BUILD/deps"
  P="$BUNDLE/prefix"
  # GoogleTest is built here so that its C++ library matches this machine's compiler.
  if [ ! -f "$DEPS/prefix/lib/cmake/GTest/GTestConfig.cmake" ]; then
    { cmake -S "$BUNDLE/googletest" -B "$DEPS/googletest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$DEPS/prefix" -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_POLICY_VERSION_MINIMUM=3.5 &&
      timeout "$(budget 120)" cmake --build "$DEPS/googletest" -j"$JOBS" &&
      cmake --install "$DEPS/googletest"; } >"$LOGDIR/deps.log" 2>&1 || deps_ok=0
  fi
  CMAKE_ARGS+=(-DEigen3_DIR="$P/share/eigen3/cmake" -DGTest_DIR="$DEPS/prefix/lib/cmake/GTest"
    -Dbenchmark_DIR="$P/lib/x86_64-linux-gnu/cmake/benchmark"
    -DZLIB_INCLUDE_DIR="$P/include" -DZLIB_LIBRARY="$P/lib/libz.a")
  if [ "$deps_ok" = 1 ]; then row "dependencies" "from .gpu-bundle (GoogleTest built here)"; else
    tail -20 "$LOGDIR/deps.log"; row "dependencies" "FAILED to build GoogleTest (see $LOGDIR/deps.log)"; FAILED=1; fi
else
  echo "no .gpu-bundle/: using the system's Eigen, GoogleTest, Benchmark and zlib (tools/gpu-bundle.sh packs them)"
  row "dependencies" "system packages (no .gpu-bundle)"
fi
if ! ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h >/dev/null 2>&1; then
  NCCL_DIR=$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  if [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/include/nccl.h" ]; then
    echo "NCCL from the Python wheel: $NCCL_DIR"
    CMAKE_ARGS+=(-DMIRRORED_NCCL_ROOT="$NCCL_DIR")
  fi
fi
# Extra configure arguments, e.g. to rehearse a bare machine: -DCMAKE_IGNORE_PREFIX_PATH=/usr
read -r -a EXTRA <<<"${GPU_CHECK_CMAKE_ARGS:-}"
CMAKE_ARGS+=("${EXTRA[@]}")

# --------------------------------------------------------------------------------------------
say "configure + build (cuda preset, sm_90, -j$JOBS)"
t0=$(date +%s)
built=0
if [ "$FAILED" = 0 ] && enough_time 60 && cmake --preset cuda "${CMAKE_ARGS[@]}" >"$LOGDIR/configure.log" 2>&1; then
  targets=(mirrored mirrored_gpu_tests mirrored_gpu_logical_tests train_digits)
  # bench_gpu exists when Google Benchmark was found.
  if ninja -C "$BUILD" -t targets all 2>/dev/null | cut -d: -f1 | grep -qx bench_gpu; then targets+=(bench_gpu); fi
  timeout "$(budget 330)" cmake --build --preset cuda -j"$JOBS" --target "${targets[@]}" >"$LOGDIR/build.log" 2>&1 &&
    built=1
fi
if [ "$built" = 1 ]; then
  row "build (cuda preset, sm_90)" "ok in $(( $(date +%s) - t0 ))s"
else
  tail -40 "$LOGDIR/configure.log" "$LOGDIR/build.log" 2>/dev/null
  row "build (cuda preset, sm_90)" "FAILED after $(( $(date +%s) - t0 ))s (see build.log / configure.log)"
  FAILED=1
fi
grep -m1 'CUDA backend enabled' "$LOGDIR/configure.log" || grep -m1 'NCCL was not found' "$LOGDIR/configure.log"

# --------------------------------------------------------------------------------------------
run_gpu_tests() {
  say "gpu tests (ctest -L gpu)"
  if ! enough_time 30; then
    row "gpu tests" "not run: out of time"
    FAILED=1
    return
  fi
  (cd "$BUILD" && timeout "$(budget 240)" ctest -L gpu -j8 --output-on-failure --timeout 180) >"$LOGDIR/ctest.log" 2>&1
  local status=$?
  tail -25 "$LOGDIR/ctest.log"
  local summary skipped
  summary=$(grep -E 'tests passed|tests failed' "$LOGDIR/ctest.log" | tail -1)
  skipped=$(grep -c -- '\*\*\*Skipped' "$LOGDIR/ctest.log" || true)
  # ctest shows no output of skipped tests: ask one test directly whether it saw the GPU.
  timeout 60 "$BUILD/mirrored_gpu_tests" --gtest_filter='Gpu.TensorOpsMatchTheHostBackend' >"$LOGDIR/probe.log" 2>&1
  if [ "$GPU_COUNT" -gt 0 ] && grep -q 'no GPU visible to this process' "$LOGDIR/probe.log"; then
    # nvidia-smi sees a GPU but the CUDA runtime does not (e.g. a driver too old for the toolkit).
    row "gpu tests" "FAILED: the tests skipped although nvidia-smi lists a GPU (${summary:-?}; see ctest.log)"
    FAILED=1
  elif [ "$status" = 0 ]; then
    row "gpu tests" "${summary:-?} (${skipped} skipped)"
  else
    row "gpu tests" "FAILED: ${summary:-ctest exit $status} (${skipped} skipped; see ctest.log)"
    FAILED=1
  fi
}

run_benchmarks() {
  say "GPU benchmarks"
  if [ ! -x "$BUILD/bench/bench_gpu" ]; then
    row "GPU benchmarks" "not built (Google Benchmark missing?)"
    return
  fi
  timeout "$(budget 120)" "$BUILD/bench/bench_gpu" --benchmark_out="$LOGDIR/bench_gpu.json" \
    --benchmark_out_format=json 2>&1 | tee "$LOGDIR/bench_gpu.txt"
  if ! command -v python3 >/dev/null 2>&1 || [ ! -s "$LOGDIR/bench_gpu.json" ]; then
    row "GPU benchmarks" "$(tail -1 "$LOGDIR/bench_gpu.txt") (no JSON or no python3 for the table)"
    return
  fi
  while IFS='|' read -r k v; do row "$k" "$v"; done < <(python3 - "$LOGDIR/bench_gpu.json" <<'PY'
import json, sys
bench = {b["name"].split("/")[0]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
def get(name, key, fmt):
    b = bench.get(name)
    return fmt.format(b[key]) if b and key in b else "n/a"
print("all-reduce 256 MiB/replica, 2 logical GPUs on GPU 0|ratio to D2D copy {} (target >= 0.8); {} ms vs {} ms; {} GB/s".format(
    get("BM_AllReduceSameGpu", "ratio", "{:.2f}"), get("BM_AllReduceSameGpu", "allreduce_ms", "{:.3f}"),
    get("BM_AllReduceSameGpu", "anchor_ms", "{:.3f}"), get("BM_AllReduceSameGpu", "allreduce_GBps", "{:.0f}")))
print("host->device prefetch, 64 MiB steps|ratio to pinned cudaMemcpyAsync {} (target >= 0.9); {} GB/s vs {} GB/s".format(
    get("BM_PrefetchToDevice", "ratio", "{:.2f}"), get("BM_PrefetchToDevice", "prefetch_GBps", "{:.1f}"),
    get("BM_PrefetchToDevice", "anchor_GBps", "{:.1f}")))
print("Tensor::to(GPU:0), 64 MiB|pageable source {}; pinned source {} (ratios to pinned cudaMemcpyAsync)".format(
    get("BM_HostToDevice", "ratio", "{:.2f}"), get("BM_HostToDevice", "ratio_pinned", "{:.2f}")))
print("empty run, 2 logical GPUs|{} us".format(get("BM_EmptyRun", "run_us", "{:.1f}")))
PY
)
}

run_training() {
  say "train_digits --devices GPU:0"
  if timeout "$(budget 90)" "$BUILD/train_digits" --devices GPU:0 --epochs 5 >"$LOGDIR/train_gpu.txt" 2>&1; then
    tail -2 "$LOGDIR/train_gpu.txt"
    row "train_digits --devices GPU:0 --epochs 5" "$(grep -i -m1 'accuracy' "$LOGDIR/train_gpu.txt" || tail -1 "$LOGDIR/train_gpu.txt")"
  else
    tail -5 "$LOGDIR/train_gpu.txt"
    row "train_digits --devices GPU:0 --epochs 5" "FAILED (see train_gpu.txt)"
    FAILED=1
  fi
}

run_sanitizer() {
  say "compute-sanitizer"
  local san
  san=$(command -v compute-sanitizer || true)
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -z "$san" ] && [ -x "$c" ] && san=$c
  done
  if [ -z "$san" ]; then
    row "compute-sanitizer" "not installed (not run)"
    return
  fi
  if ! enough_time 60; then
    row "compute-sanitizer" "not run: out of time"
    return
  fi
  local status=0 half
  half=$(( $(budget 300) / 2 ))
  # The training test is slow under memcheck and adds no kernels of its own.
  timeout "$half" "$san" --tool memcheck --error-exitcode 99 --leak-check no --report-api-errors no \
    "$BUILD/mirrored_gpu_tests" --gtest_filter='-*Training*' >"$LOGDIR/memcheck.log" 2>&1 || status=$?
  echo "---- mirrored_gpu_logical_tests (2 logical GPUs)" >>"$LOGDIR/memcheck.log"
  timeout "$(budget "$half")" "$san" --tool memcheck --error-exitcode 99 --leak-check no --report-api-errors no \
    "$BUILD/mirrored_gpu_logical_tests" --gtest_filter='*/2logical:-*Training*' >>"$LOGDIR/memcheck.log" 2>&1 ||
    { rc=$?; [ "$status" = 0 ] && status=$rc; }
  grep -E '^========= ERROR SUMMARY|PASSED|FAILED|Device not supported' "$LOGDIR/memcheck.log" | tail -6
  local errors
  errors=$(grep -h -E '^========= ERROR SUMMARY' "$LOGDIR/memcheck.log" | tr '\n' ' ')
  if grep -q 'Device not supported' "$LOGDIR/memcheck.log"; then
    row "compute-sanitizer memcheck" "could not run: the sanitizer does not support this machine's GPU setup"
  elif [ "$status" = 0 ]; then
    row "compute-sanitizer memcheck" "clean (${errors:-no summary})"
  elif [ "$status" = 124 ]; then
    row "compute-sanitizer memcheck" "timed out (${errors:-no summary}; see memcheck.log)"
    FAILED=1
  else
    row "compute-sanitizer memcheck" "FAILED, exit $status: ${errors} (see memcheck.log)"
    FAILED=1
  fi
}

if [ "$FAILED" = 0 ]; then
  run_gpu_tests
  if [ "$GPU_COUNT" -gt 0 ]; then
    if enough_time 30; then run_benchmarks; else row "GPU benchmarks" "not run: out of time"; fi
    if enough_time 20; then run_training; else row "train_digits --devices GPU:0 --epochs 5" "not run: out of time"; fi
    run_sanitizer
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
} | tee "$LOGDIR/summary.md"
if [ -n "$COPY_TO" ]; then
  mkdir -p "$COPY_TO"
  tail -200 "$LOGDIR/build.log" >"$LOGDIR/build-tail.log" 2>/dev/null
  for f in summary.md gpus.txt ctest.log bench_gpu.json bench_gpu.txt train_gpu.txt memcheck.log build-tail.log; do
    [ -f "$LOGDIR/$f" ] && cp "$LOGDIR/$f" "$COPY_TO/"
  done
fi
exit "$FAILED"
