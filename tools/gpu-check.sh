#!/usr/bin/env bash
# The GPU check. On a machine with an NVIDIA GPU, the CUDA toolkit, CMake, Ninja and python3
# (nothing is downloaded): ask the CUDA runtime for the GPU, configure and build the `cuda` preset
# (sm_90), run the tests labelled `gpu`, the GPU benchmarks against their targets, the training
# example on GPU:0 and compute-sanitizer memcheck on the gpu test executables, then print a table
# and exit 0 only when every required check passed on a GPU. The whole run stops itself after
# GPU_CHECK_SECONDS (default 480), so it fits one 8-minute device call and leaves a session's
# 15 minutes of device time room for a second call; it prints each stage's budget first (the time
# plan, TIME_PLAN below) and each stage's time against its budget as it ends.
#
#   tools/gpu-bundle.sh                  # development machine: pack Eigen, GoogleTest, Benchmark, zlib, CLI11
#   tools/gpu-check.sh [--copy-to DIR]   # GPU machine: DIR gets summary.md and gpu-check-logs.tar.gz
#   tools/gpu-check.sh --self-test       # anywhere, in a second: the decisions against recorded runs
#   tools/gpu-check.sh --decide DIR      # the decisions again over the records of a run (gpu-check/)
#
# Environment: JOBS (build jobs, default nproc), GPU_CHECK_SECONDS (480), GPU_CHECK_CMAKE_ARGS
# (extra configure arguments, e.g. -DCMAKE_IGNORE_PREFIX_PATH=/usr to rehearse a bare machine),
# GPU_CHECK_BUILD_TARGETS (default: everything), GPU_CHECK_SANITIZER_MIN_S / _MAX_S (per test
# executable: 90 / 180), GPU_CHECK_SANITIZER_FILTER (gtest filter under memcheck, '-*Training*').
#
# How it is built: the *doing* (functions do_*) only runs commands and writes what happened into
# build/cuda/gpu-check/ (STAGE.rc, STAGE.log, STAGE.seconds, STAGE.budget, or STAGE.notrun with the
# reason it did not run). The *deciding* (functions decide_*) reads only those files and records
# one row (stage, status, detail) per check; `verdict` turns the rows into the exit status. So the
# decisions can be checked without a GPU: --self-test feeds them the recorded runs in
# tools/gpu-check-fixtures/ and checks the exit status and the table of each.
#
# Rules of the verdict: a required check passes or the run fails. "not run" (out of time, no
# GPU, an earlier stage failed, no record at all) is a failure, never a pass; so is a run without
# a GPU: the check exists to run on one. Test executables are found only through the ctest label
# `gpu` (never by name), and MIRRORED_SIMULATED_GPUS is unset for every run: a simulated GPU is
# not a GPU.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || exit 2
BUILD="$ROOT/build/cuda"
BUNDLE="$ROOT/.gpu-bundle"
FIXTURES="$ROOT/tools/gpu-check-fixtures"
L="$BUILD/gpu-check" # the records of this run; the decisions read nothing else

TOTAL_S=${GPU_CHECK_SECONDS:-480}
MARGIN_S=20 # kept for the table, the copy and the tarball
SAN_MIN_S=${GPU_CHECK_SANITIZER_MIN_S:-90}
SAN_MAX_S=${GPU_CHECK_SANITIZER_MAX_S:-180}

# The time plan, one stage a line: "stem min max expected" in seconds. A stage starts only with at
# least `min` seconds left and is stopped after `max` (or what is left, if less); `expected` is
# what it should take on the 16-core GPU machine, printed beside the time it took. The build's line
# comes from a measurement (docs/gpu.md, "The time plan"): building the `cuda` preset (sm_90, every
# target) from scratch took 570 CPU seconds on a 2-core development machine, and its longest chain
# (the test PCH, the largest test unity file, 34 CPU seconds alone, and its link) about 45 s; on 16
# cores of that speed that is about 45-60 s, so 60 s expected and 180 s (3x, for cores of another
# speed) its limit. The other lines are estimates: none has run on a GPU yet. memcheck's line is per
# gpu test executable (GPU_CHECK_SANITIZER_MIN_S / _MAX_S). The probe is limited on its own: 120 s
# to compile, 60 s to run.
TIME_PLAN="deps 30 90 25
configure 20 60 10
build 60 180 60
ctest 30 240 45
bench 40 150 30
train 20 90 10
memcheck $SAN_MIN_S $SAN_MAX_S 70"
# Training adds no kernels and is slow under memcheck; NCCL's own kernels are not ours to check and
# its proxy threads make memcheck runs time out (the gpu executable sets MIRRORED_NCCL_SINGLE_RANK,
# so its sharded-step and asynchronous tests run NCCL too).
SAN_FILTER=${GPU_CHECK_SANITIZER_FILTER:--*Training*:*Nccl*:*ShardedStep*:*Async*}

# The benchmark targets (see bench/bench_gpu.cpp and docs/gpu.md): "benchmark counter minimum
# description". A counter below its minimum fails the check; a missing one too.
BENCH_TARGETS="BM_AllReduceSameGpu ratio 0.8 all-reduce 256 MiB/replica, 2 logical GPUs of GPU 0
BM_PrefetchToDevice ratio 0.9 input prefetch host->GPU, 64 MiB steps"

# Table labels, one per stage.
T_ENV="environment"
T_TOOLS="tools (cmake, ninja, nvcc, python3)"
T_GPU="GPU (CUDA runtime)"
T_DEPS="dependencies"
T_NCCL="NCCL"
T_BUILD="build (cuda preset, sm_90)"
T_TESTS="gpu tests (ctest -L gpu)"
T_BENCH="GPU benchmarks (bench_gpu)"
T_TRAIN="train_digits --devices GPU:0 --epochs 5"
T_SAN="compute-sanitizer memcheck"

# =============================================================================================
# The record: one row per check, "label<TAB>status<TAB>detail"; status is pass, fail, notrun or
# info (info rows are shown but are not checks).
# =============================================================================================
ROWS=()
record() {
  local detail=${3//$'\n'/ }
  ROWS+=("$1"$'\t'"$2"$'\t'"${detail//$'\t'/ }")
}

# Readers of the records, with bash builtins only: the self-test calls them hundreds of times.
have() { [ -e "$L/$1" ]; }
get() { # the whole record, "" when absent
  local v=""
  [ -e "$L/$1" ] && IFS= read -r -d '' v <"$L/$1"
  printf '%s' "${v%$'\n'}"
}
first_line() {
  local v=""
  [ -e "$L/$1" ] && IFS= read -r v <"$L/$1"
  printf '%s' "$v"
}

# Records "not run" and succeeds when stage STEM did not run: it says why in STEM.notrun, or it
# left no exit status at all (it never started). Not running is never a pass.
not_run() {
  local stem=$1 label=$2
  if have "$stem.notrun"; then
    record "$label" notrun "$(first_line "$stem.notrun")"
  elif ! have "$stem.rc"; then
    record "$label" notrun "no record of this stage: it never ran"
  else
    return 1
  fi
}

# Words for an exit status: time-outs (timeout(1): 124, or 137 after its --kill-after) and signals
# are told apart from plain failures.
exit_words() {
  local rc=$1 budget=${2:-?}
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "timed out after its ${budget}s limit (exit $rc)"
  elif [ "$rc" -gt 128 ] 2>/dev/null && [ "$rc" -lt 160 ]; then
    echo "crashed: signal $((rc - 128)) (SIG$(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
  else
    echo "exit $rc"
  fi
}

# =============================================================================================
# Python helpers (standard library only): the JSON of ctest and of Google Benchmark.
# =============================================================================================
# The interpreter itself, found once: a version-manager shim (pyenv) costs a quarter second a call.
PY=$(python3 -S -c 'import sys; print(sys.executable)' 2>/dev/null) || PY=python3
pyhelp() {
  "$PY" -S - "$@" <<'PY'
import json, sys

mode = sys.argv[1]

def ctest_tests(path):
    with open(path) as f:
        return json.load(f).get("tests", [])

if mode == "executables":
    # The distinct programs the `gpu` tests run (command[0]), in ctest's order; a test run through
    # cmake -P or a shell is not a GPU program to put under memcheck.
    seen = []
    for t in ctest_tests(sys.argv[2]):
        cmd = t.get("command") or []
        if not cmd:
            continue
        base = cmd[0].rsplit("/", 1)[-1]
        if base in ("cmake", "ctest", "sh", "bash", "python", "python3"):
            continue
        if cmd[0] not in seen:
            seen.append(cmd[0])
    print("\n".join(seen))

elif mode == "simulated":
    # gpu-labelled tests that set MIRRORED_SIMULATED_GPUS themselves: their passes are not GPU passes.
    names = []
    for t in ctest_tests(sys.argv[2]):
        for p in t.get("properties", []):
            if p.get("name") not in ("ENVIRONMENT", "ENVIRONMENT_MODIFICATION"):
                continue
            values = p.get("value")
            for v in values if isinstance(values, list) else [values]:
                if not str(v).startswith("MIRRORED_SIMULATED_GPUS="):
                    continue
                op = str(v).split("=", 1)[1].split(":", 1)[0]
                if p["name"] == "ENVIRONMENT_MODIFICATION" and op in ("unset", "reset"):
                    continue
                if t.get("name") not in names:
                    names.append(t.get("name"))
    print(len(names), " ".join(str(n) for n in names[:3]))

elif mode == "bench":
    # Rows "status<TAB>label<TAB>detail": the run, then one per target, then the reported numbers.
    path, targets, label = sys.argv[2], sys.argv[3], sys.argv[4]
    try:
        with open(path) as f:
            data = json.load(f)
    except Exception as e:  # missing, truncated by a crash, not JSON
        print(f"fail\t{label}\tno usable JSON ({type(e).__name__}: {e})")
        for line in targets.splitlines():
            print(f"notrun\tbenchmark: {line.split(' ', 3)[3]}\tnot measured: no benchmark JSON")
        sys.exit(0)
    bench = {}
    for b in data.get("benchmarks", []):
        if b.get("run_type", "iteration") == "iteration":
            bench.setdefault(b["name"].split("/")[0], b)
    errors = [f"{n}: {b.get('error_message', '?')}" for n, b in bench.items() if b.get("error_occurred")]
    if not bench:
        print(f"fail\t{label}\tthe JSON holds no benchmark results")
    elif errors:
        print(f"fail\t{label}\tbenchmark errors: {'; '.join(errors)}")
    else:
        print(f"pass\t{label}\texit 0; {len(bench)} benchmarks: {', '.join(bench)}")

    def num(name, key, fmt):
        b = bench.get(name, {})
        return format(b[key], fmt) if isinstance(b.get(key), (int, float)) else "n/a"

    extra = {
        "BM_AllReduceSameGpu": lambda: "ratio to a D2D copy of each replica's buffer; {} ms vs {} ms; {} GB/s".format(
            num("BM_AllReduceSameGpu", "allreduce_ms", ".3f"), num("BM_AllReduceSameGpu", "anchor_ms", ".3f"),
            num("BM_AllReduceSameGpu", "allreduce_GBps", ".0f")),
        "BM_PrefetchToDevice": lambda: "ratio to pinned cudaMemcpyAsync; {} GB/s vs {} GB/s".format(
            num("BM_PrefetchToDevice", "prefetch_GBps", ".1f"), num("BM_PrefetchToDevice", "anchor_GBps", ".1f")),
    }
    for line in targets.splitlines():
        name, counter, minimum, desc = line.split(" ", 3)
        row = f"benchmark: {desc}"
        b = bench.get(name)
        if b is None:
            print(f"fail\t{row}\t{name} is not in the JSON")
        elif b.get("error_occurred"):
            print(f"fail\t{row}\t{name} reported an error: {b.get('error_message', '?')}")
        elif not isinstance(b.get(counter), (int, float)):
            print(f"fail\t{row}\t{name} has no counter '{counter}'")
        else:
            v = float(b[counter])
            ok = v >= float(minimum)  # NaN compares false: a failure
            more = extra[name]() if name in extra else ""
            print(f"{'pass' if ok else 'fail'}\t{row}\t{counter} {v:.2f} {'>=' if ok else 'BELOW'} target {minimum}"
                  + (f" ({more})" if more else ""))
    if "BM_HostToDevice" in bench:
        print("info\tbenchmark: Tensor::to(GPU:0), 64 MiB\tpageable source {}, pinned source {} (ratios to pinned "
              "cudaMemcpyAsync; reported, no target)".format(num("BM_HostToDevice", "ratio", ".2f"),
                                                            num("BM_HostToDevice", "ratio_pinned", ".2f")))
    if "BM_EmptyRun" in bench:
        print("info\tbenchmark: empty run, 2 logical GPUs\t{} us per run (reported, no target)".format(
            num("BM_EmptyRun", "run_us", ".1f")))
    if "BM_AdamStep" in bench:
        print("info\tbenchmark: Adam step, 25 MB in 100 tensors, 2 logical GPUs\tunsharded {} ms, sharded {} ms, "
              "one all-reduce {} ms; update share {} / {} sharded; state per replica sharded/unsharded {} "
              "(reported, no target on one chip)".format(
                  num("BM_AdamStep", "adam_ms", ".2f"), num("BM_AdamStep", "adam_sharded_ms", ".2f"),
                  num("BM_AdamStep", "anchor_ms", ".2f"), num("BM_AdamStep", "update_share", ".2f"),
                  num("BM_AdamStep", "update_share_sharded", ".2f"), num("BM_AdamStep", "state_ratio", ".2f")))
else:
    sys.exit(f"pyhelp: unknown mode {mode}")
PY
}

# =============================================================================================
# The decisions: each reads the records in $L and adds its rows. Nothing here runs anything.
# =============================================================================================
decide_env() {
  if have env.txt; then record "$T_ENV" info "$(first_line env.txt)"; else record "$T_ENV" info "no record"; fi
}

decide_tools() {
  not_run tools "$T_TOOLS" && return
  if [ "$(get tools.rc)" = 0 ]; then
    record "$T_TOOLS" pass "$(first_line tools.txt)"
  else
    record "$T_TOOLS" fail "missing: $(first_line tools.missing) (found: $(first_line tools.txt))"
  fi
}

# The CUDA runtime's answer, from the probe's output ("devices: N", "device i: ...").
gpu_count() {
  local line
  [ -e "$L/gpu.log" ] || return 0
  while IFS= read -r line; do
    if [[ $line =~ ^devices:\ ([0-9]+)$ ]]; then echo "${BASH_REMATCH[1]}"; return 0; fi
  done <"$L/gpu.log"
}
gpu_found() { [ "$(get gpu.rc)" = 0 ] && [ "$(gpu_count)" -gt 0 ] 2>/dev/null; }

decide_gpu() {
  not_run gpu "$T_GPU" && return
  local n smi why devices
  n=$(gpu_count)
  smi=$(grep -c '^[0-9]' "$L/gpu-smi.txt" 2>/dev/null)
  if gpu_found; then
    devices=$(sed -n 's/^device [0-9]*: //p' "$L/gpu.log" | paste -sd ';' -)
    record "$T_GPU" pass "$n GPU(s): $devices; $(grep -m1 '^cuda runtime' "$L/gpu.log")"
  else
    why=$(grep -m1 '^cudaGetDeviceCount' "$L/gpu.log" || tail -n1 "$L/gpu.log")
    local detail="no GPU found: ${why:-the probe exited $(get gpu.rc)}"
    if [ "${smi:-0}" -gt 0 ]; then
      detail+="; nvidia-smi lists $smi GPU(s) that the CUDA runtime cannot use (a driver older than the toolkit?)"
    fi
    record "$T_GPU" fail "$detail; nothing GPU-specific was verified"
  fi
}

decide_deps() {
  not_run deps "$T_DEPS" && return
  if [ "$(get deps.rc)" = 0 ]; then
    record "$T_DEPS" pass "$(first_line deps.txt)"
  else
    record "$T_DEPS" fail "$(first_line deps.txt) ($(exit_words "$(get deps.rc)" "$(get deps.budget)"); see deps.log)"
  fi
}

# nccl.txt: source=toolkit|system|NCCL_ROOT|wheel|none, lib=, include=, lib_real=, looked=; after
# the configure step also used= (the library CMake reported) and used_real=.
nccl_field() {
  local line
  [ -e "$L/nccl.txt" ] || return 0
  while IFS= read -r line; do
    if [ "${line%%=*}" = "$1" ]; then echo "${line#*=}"; return 0; fi
  done <"$L/nccl.txt"
}

decide_nccl() {
  if have nccl.notrun; then record "$T_NCCL" notrun "$(first_line nccl.notrun)"; return; fi
  if ! have nccl.txt; then record "$T_NCCL" notrun "no record of this stage: it never ran"; return; fi
  local source lib used
  source=$(nccl_field source)
  lib=$(nccl_field lib)
  used=$(nccl_field used)
  if [ "$source" = none ] || [ -z "$source" ]; then
    record "$T_NCCL" fail "NOT FOUND (looked in: $(nccl_field looked)): the NCCL tests cannot run"
    return
  fi
  local label
  case "$source" in
    toolkit) label="the CUDA toolkit's" ;;
    system) label="the system's" ;;
    NCCL_ROOT) label="NCCL_ROOT's" ;;
    wheel) label="PYTHON WHEEL nvidia-nccl (not the toolkit's)" ;;
    *) label="$source" ;;
  esac
  if grep -q 'NCCL was not found' "$L/configure.log" 2>/dev/null; then
    record "$T_NCCL" fail "$label $lib was found, but CMake did not find NCCL (see configure.log)"
  elif [ -n "$used" ] && [ "$(nccl_field used_real)" != "$(nccl_field lib_real)" ]; then
    record "$T_NCCL" fail "CMake links $used, not the chosen $label $lib"
  elif [ -n "$used" ]; then
    record "$T_NCCL" pass "$label: $lib (CMake links $used)"
  else
    record "$T_NCCL" pass "$label: $lib (CMake did not report its choice: configure did not run or failed)"
  fi
}

decide_build() {
  if have build.notrun; then record "$T_BUILD" notrun "$(first_line build.notrun)"; return; fi
  if have configure.rc && [ "$(get configure.rc)" != 0 ]; then
    local err
    err=$(grep -m1 'CMake Error' "$L/configure.log" 2>/dev/null)
    record "$T_BUILD" fail "configure failed ($(exit_words "$(get configure.rc)" "$(get configure.budget)"))${err:+: $err} (see configure.log)"
    return
  fi
  not_run build "$T_BUILD" && return
  local rc secs
  rc=$(get build.rc)
  secs="configure $(get configure.seconds)s + build $(get build.seconds)s"
  if [ "$rc" != 0 ]; then
    local err
    err=$(grep -m1 -E 'error|FAILED:' "$L/build.log" 2>/dev/null | cut -c1-200)
    record "$T_BUILD" fail "$(exit_words "$rc" "$(get build.budget)") after $secs${err:+: $err} (see build.log)"
  elif grep -q 'building without the CUDA backend' "$L/configure.log" 2>/dev/null; then
    record "$T_BUILD" fail "built, but configured without the CUDA backend (see configure.log)"
  else
    record "$T_BUILD" pass "ok: $secs"
  fi
}

# One pass over ctest's output: "total passed skipped failed none_found first-failed-names", from
# its result lines ("1/5 Test #2: name .....   Passed    0.01 sec"; failed counts every other
# result: Failed, Timeout, Exception, Not Run) and its "The following tests FAILED:" list.
ctest_summary() {
  awk '/^ *[0-9]+\/[0-9]+ +Test +#[0-9]+: / {
         t++
         if ($0 ~ / Passed +[0-9.]+ sec/) p++; else if ($0 ~ /\*\*\*Skipped/) s++; else f++
       }
       /No tests were found/ { none = 1 }
       /^The following tests FAILED:/ { in_failed = 1; next }
       in_failed && /^[^[:space:]]/ { in_failed = 0 }
       in_failed && n < 3 { sub(/^[[:space:]]*[0-9]+ - /, ""); names = names (n++ ? ", " : "") $0 }
       END { printf "%d %d %d %d %d %s\n", t, p, s, f, none, names }' "$1"
}

decide_tests() {
  not_run ctest "$T_TESTS" && return
  local rc total passed skipped failed none failed_names counts sim
  rc=$(get ctest.rc)
  read -r total passed skipped failed none failed_names < <(ctest_summary "$L/ctest.log" 2>/dev/null)
  total=${total:-0} passed=${passed:-0} skipped=${skipped:-0} failed=${failed:-0}
  counts="$passed passed, $skipped skipped, $failed failed of $total"
  sim=0
  if grep -qs MIRRORED_SIMULATED_GPUS "$L/gpu-tests.json"; then # (python only when it is named at all)
    sim=$(pyhelp simulated "$L/gpu-tests.json" 2>/dev/null || echo "0")
  fi
  if [ "${none:-0}" = 1 ]; then
    record "$T_TESTS" fail "no tests labelled gpu were found (ctest --no-tests=error, exit $rc)"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    record "$T_TESTS" fail "$(exit_words "$rc" "$(get ctest.budget)"); so far $counts"
  elif [ "$failed" -gt 0 ] || [ "$rc" != 0 ]; then
    record "$T_TESTS" fail "$counts (ctest exit $rc)${failed_names:+: $failed_names} (see ctest.log)"
  elif [ "$total" -eq 0 ]; then
    record "$T_TESTS" fail "ctest ran no gpu test (exit $rc; see ctest.log)"
  elif [ "$passed" -eq 0 ]; then
    record "$T_TESTS" fail "all $total gpu tests skipped: none ran on the GPU"
  elif [ "${sim%% *}" != 0 ]; then
    record "$T_TESTS" fail "$counts, but ${sim%% *} gpu test(s) set MIRRORED_SIMULATED_GPUS (${sim#* }): a simulated pass is not a GPU pass"
  else
    [ "$skipped" -eq 0 ] || counts+=" (skips: tests that need more GPUs than this machine has)"
    record "$T_TESTS" pass "$counts"
  fi
}

decide_bench() {
  if not_run bench "$T_BENCH"; then
    local line
    while IFS= read -r line; do
      record "benchmark: ${line#* * * }" notrun "not measured: bench_gpu did not run"
    done <<<"$BENCH_TARGETS"
    return
  fi
  local rc
  rc=$(get bench.rc)
  if [ "$rc" != 0 ]; then
    local last
    last=$(grep -v -e '^[[:space:]]*$' -e '^\*\*\*WARNING' "$L/bench.log" 2>/dev/null | tail -n1 | cut -c1-160)
    record "$T_BENCH" fail "$(exit_words "$rc" "$(get bench.budget)")${last:+; last output: $last}"
    local line
    while IFS= read -r line; do
      record "benchmark: ${line#* * * }" notrun "not measured: bench_gpu $(exit_words "$rc" "$(get bench.budget)")"
    done <<<"$BENCH_TARGETS"
    return
  fi
  local out status label detail
  if ! out=$(pyhelp bench "$L/bench_gpu.json" "$BENCH_TARGETS" "$T_BENCH" 2>&1); then
    record "$T_BENCH" fail "could not read the benchmark JSON: $out"
    return
  fi
  # A run that printed why it skipped (no GPU visible) wrote no JSON: say so next to the JSON error.
  if ! have bench_gpu.json && grep -q 'skipped' "$L/bench.log"; then
    out=${out/no usable JSON/no JSON: $(grep -m1 'skipped' "$L/bench.log") -}
  fi
  while IFS=$'\t' read -r status label detail; do
    [ -n "$status" ] && record "$label" "$status" "$detail"
  done <<<"$out"
}

decide_train() {
  not_run train "$T_TRAIN" && return
  local rc
  rc=$(get train.rc)
  if [ "$rc" = 0 ]; then
    record "$T_TRAIN" pass "$(grep -m1 -i 'accuracy' "$L/train.log" || tail -n1 "$L/train.log")"
  else
    record "$T_TRAIN" fail "$(exit_words "$rc" "$(get train.budget)"): $(tail -n1 "$L/train.log" | cut -c1-160)"
  fi
}

# sanitizer.list: "i<TAB>executable" for every gpu test executable (from ctest); one memcheck-i
# stage each.
decide_sanitizer() {
  if have sanitizer.notrun; then record "$T_SAN" notrun "$(first_line sanitizer.notrun)"; return; fi
  if ! have sanitizer.list; then record "$T_SAN" notrun "no record of this stage: it never ran"; return; fi
  if ! grep -q . "$L/sanitizer.list"; then
    record "$T_SAN" fail "ctest lists no gpu test executable to run under memcheck"
    return
  fi
  local i exe label rc budget secs summary
  while IFS=$'\t' read -r i exe; do
    label="memcheck ${exe##*/}"
    not_run "memcheck-$i" "$label" && continue
    rc=$(get "memcheck-$i.rc")
    budget=$(get "memcheck-$i.budget")
    secs=$(get "memcheck-$i.seconds")
    summary=$(grep -h '^========= ERROR SUMMARY' "$L/memcheck-$i.log" | tail -n1 | sed 's/^========= //')
    if grep -q 'Device not supported' "$L/memcheck-$i.log"; then
      record "$label" notrun "the sanitizer does not support this GPU setup ('Device not supported', e.g. under gVisor)"
    elif [ "$rc" = 0 ]; then
      record "$label" pass "clean in ${secs}s: ${summary:-no error summary}"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      record "$label" fail "timed out after ${secs}s of its ${budget}s budget: a time-out, not a finding (no memcheck error was reported before it)"
    elif [ "$rc" = 99 ]; then
      record "$label" fail "memcheck found errors: ${summary:-?} (see memcheck-$i.log)"
    else
      local failed
      failed=$(grep -m1 -E '^\[  FAILED  \]' "$L/memcheck-$i.log")
      record "$label" fail "$(exit_words "$rc" "$budget") under memcheck${failed:+: $failed}${summary:+; $summary}"
    fi
  done <"$L/sanitizer.list"
}

# One info row: each stage's time against its budget, in the order they ran (from STAGE.seconds
# and STAGE.budget), and their sum.
decide_times() {
  local stem parts=() sum=0 secs i _
  for stem in deps configure build ctest bench train; do
    have "$stem.seconds" || continue
    secs=$(get "$stem.seconds")
    parts+=("$stem ${secs}s of $(get "$stem.budget")s")
    sum=$((sum + secs))
  done
  if have sanitizer.list; then
    while IFS=$'\t' read -r i _; do
      have "memcheck-$i.seconds" || continue
      secs=$(get "memcheck-$i.seconds")
      parts+=("memcheck-$i ${secs}s of $(get "memcheck-$i.budget")s")
      sum=$((sum + secs))
    done <"$L/sanitizer.list"
  fi
  if [ "${#parts[@]}" -eq 0 ]; then
    record "stage times" info "no stage ran"
  else
    local list
    list=$(printf '%s, ' "${parts[@]}")
    record "stage times" info "${list%, }; ${sum}s in all"
  fi
}

decide_all() {
  decide_env
  decide_tools
  decide_gpu
  decide_deps
  decide_nccl
  decide_build
  decide_tests
  decide_bench
  decide_train
  decide_sanitizer
  decide_times
}

# The one place the outcome is decided: 0 only when every check passed (info rows aside).
verdict() {
  local r label status bad=() checks=0
  for r in "${ROWS[@]}"; do
    IFS=$'\t' read -r label status _ <<<"$r"
    [ "$status" = info ] && continue
    checks=$((checks + 1))
    [ "$status" = pass ] || bad+=("$label")
  done
  if [ "$checks" -eq 0 ]; then
    record "verdict" fail "FAIL: nothing was checked"
    return 1
  elif [ "${#bad[@]}" -gt 0 ]; then
    local list
    list=$(printf '%s; ' "${bad[@]}")
    record "verdict" fail "FAIL: ${#bad[@]} of $checks checks failed or did not run: ${list%; }"
    return 1
  fi
  record "verdict" pass "PASS: all $checks checks passed on a GPU"
  return 0
}

render_table() {
  local r label status detail
  echo "| check | status | detail |"
  echo "|---|---|---|"
  for r in "${ROWS[@]}"; do
    IFS=$'\t' read -r label status detail <<<"$r"
    case "$status" in
      pass) status=pass ;;
      fail) status="**FAIL**" ;;
      notrun) status="**NOT RUN**" ;;
    esac
    echo "| ${label//|/\\|} | $status | ${detail//|/\\|} |"
  done
}

# =============================================================================================
# The doing: run the stages, each writing its records into $L.
# =============================================================================================
START=$(date +%s)
DEADLINE=$((START + TOTAL_S))
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
CMAKE_ARGS=(-DCMAKE_CUDA_ARCHITECTURES=90)

say() { echo; echo "==== $* ($(($(date +%s) - START))s)"; }
seconds_left() { echo $((DEADLINE - $(date +%s) - MARGIN_S)); }
note_notrun() { echo "$2" >"$L/$1.notrun"; }

# plan STEM FIELD: the plan's min, max or expected seconds for STEM (memcheck-i: memcheck's).
plan() {
  local stem=${1%%-[0-9]*} line name min max expected
  while IFS= read -r line; do
    read -r name min max expected <<<"$line"
    [ "$name" = "$stem" ] || continue
    case "$2" in min) echo "$min" ;; max) echo "$max" ;; expected) echo "$expected" ;; esac
    return 0
  done <<<"$TIME_PLAN"
  return 1
}

# Prints the time plan: each stage's budget and what it is expected to take, and what that leaves
# for memcheck (whose stages are as many as the gpu test executables, known only after the build).
print_plan() {
  local line name min max expected sum=15 usable=$((TOTAL_S - MARGIN_S))
  say "time plan: GPU_CHECK_SECONDS=$TOTAL_S, ${MARGIN_S}s of them kept for the report"
  printf '  %-10s %9s %7s %7s\n' stage expected min max
  printf '  %-10s %9s %7s %7s\n' probe 15 - 120+60
  while IFS= read -r line; do
    read -r name min max expected <<<"$line"
    [ "$name" = memcheck ] && continue
    printf '  %-10s %9s %7s %7s\n' "$name" "$expected" "$min" "$max"
    sum=$((sum + expected))
  done <<<"$TIME_PLAN"
  printf '  %-10s %9s %7s %7s  (each gpu test executable)\n' memcheck "$(plan memcheck expected)" \
    "$(plan memcheck min)" "$(plan memcheck max)"
  echo "  expected before memcheck: ${sum}s of ${usable}s (the build $(plan build expected)s of them), leaving" \
    "$((usable - sum))s: memcheck for $(((usable - sum) / $(plan memcheck expected))) executable(s) at the expected" \
    "time, $(((usable - sum) / $(plan memcheck min))) at its minimum; a second call on the warm machine rebuilds" \
    "nothing and gives the rest their time"
}

# Prints the seconds stage STEM may take (at most the plan's max), or records it as not run for
# time and fails when fewer than the plan's min are left: a stage is never started with a limit
# too short for it.
budget_for() {
  local stem=$1 min max left
  min=$(plan "$stem" min) && max=$(plan "$stem" max) || { echo "gpu-check: no time plan for $stem" >&2; return 1; }
  left=$(seconds_left)
  if [ "$left" -lt "$min" ]; then
    note_notrun "$stem" "out of time: ${left}s left of GPU_CHECK_SECONDS=$TOTAL_S, this stage needs at least ${min}s"
    return 1
  fi
  if [ "$left" -lt "$max" ]; then echo "$left"; else echo "$max"; fi
}

# run_stage STEM BUDGET CMD...: CMD's output goes to STEM.log; its exit status (never dropped by
# a pipe), duration and limit go to STEM.rc, STEM.seconds and STEM.budget.
run_stage() {
  local stem=$1 budget=$2 t0 rc
  shift 2
  t0=$(date +%s)
  echo "$budget" >"$L/$stem.budget"
  timeout -k 10 "$budget" "$@" >"$L/$stem.log" 2>&1
  rc=$?
  echo "$rc" >"$L/$stem.rc"
  echo $(($(date +%s) - t0)) >"$L/$stem.seconds"
  echo "  $stem: exit $rc after $(get "$stem.seconds")s of its ${budget}s budget (expected $(plan "$stem" expected)s;" \
    "$(seconds_left)s left; log: $L/$stem.log)"
  return "$rc"
}

# Marks every stage in STEMS that has no record yet as not run, with REASON.
skip_rest() {
  local reason=$1 stem
  shift
  for stem in "$@"; do
    have "$stem.rc" || have "$stem.notrun" || note_notrun "$stem" "$reason"
  done
}

do_env() {
  if [ -n "${MIRRORED_SIMULATED_GPUS+set}" ]; then
    echo "MIRRORED_SIMULATED_GPUS was '$MIRRORED_SIMULATED_GPUS' in the caller's environment: unset for every run of this check (a simulated GPU is not a GPU)" >"$L/env.txt"
    unset MIRRORED_SIMULATED_GPUS
  else
    echo "MIRRORED_SIMULATED_GPUS unset (no simulated GPUs)" >"$L/env.txt"
  fi
  cat "$L/env.txt"
}

do_tools() {
  say "tools"
  local t missing=() found=()
  for t in cmake ninja nvcc python3; do
    if command -v "$t" >/dev/null 2>&1; then
      case "$t" in
        cmake) found+=("$(cmake --version | head -n1)") ;;
        ninja) found+=("ninja $(ninja --version)") ;;
        nvcc) found+=("nvcc $(nvcc --version | grep -o 'release [0-9.]*' | head -n1)") ;;
        python3) found+=("$(python3 --version 2>&1)") ;;
      esac
    else
      missing+=("$t")
    fi
  done
  (IFS=,; echo "${found[*]}") | sed 's/,/, /g' >"$L/tools.txt"
  echo "${missing[*]}" >"$L/tools.missing"
  if [ "${#missing[@]}" -eq 0 ]; then echo 0 >"$L/tools.rc"; else echo 1 >"$L/tools.rc"; fi
  cat "$L/tools.txt"
  [ "${#missing[@]}" -eq 0 ] || echo "missing: ${missing[*]}"
}

# Asks the CUDA runtime (cudaGetDeviceCount), not nvidia-smi, which many containers lack and which
# can list a GPU the runtime cannot use. nvidia-smi's list is kept as extra information.
do_gpu() {
  say "GPU (CUDA runtime)"
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader >"$L/gpu-smi.txt" 2>&1
  else
    echo "nvidia-smi: not installed" >"$L/gpu-smi.txt"
  fi
  if ! command -v nvcc >/dev/null 2>&1; then
    note_notrun gpu "nvcc is not installed: the CUDA runtime could not be asked"
    return
  fi
  local dir="$BUILD/gpu-check-probe"
  mkdir -p "$dir"
  cat >"$dir/probe.cpp" <<'CPP'
// Which GPUs can this process use? Asked of the CUDA runtime.
#include <cstdio>
#include <cuda_runtime.h>
int main() {
  int runtime = 0, driver = 0, n = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&driver);
  std::printf("cuda runtime %d, driver %d\n", runtime, driver);
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    std::printf("cudaGetDeviceCount: error %d (%s: %s)\n", static_cast<int>(e), cudaGetErrorName(e), cudaGetErrorString(e));
    std::printf("devices: 0\n");
    return 1;
  }
  std::printf("devices: %d\n", n);
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) { std::printf("device %d: properties unavailable\n", i); return 1; }
    std::printf("device %d: %s, cc %d.%d, %.0f GiB\n", i, p.name, p.major, p.minor,
                static_cast<double>(p.totalGlobalMem) / (1 << 30));
  }
  return n > 0 ? 0 : 1;
}
CPP
  if ! timeout 120 nvcc -o "$dir/probe" "$dir/probe.cpp" >"$L/gpu.log" 2>&1; then
    echo "gpu-check: the CUDA runtime probe did not compile with nvcc" >>"$L/gpu.log"
    echo 2 >"$L/gpu.rc"
  else
    timeout -k 5 60 "$dir/probe" >>"$L/gpu.log" 2>&1
    echo $? >"$L/gpu.rc"
  fi
  cat "$L/gpu.log"
}

do_deps() {
  say "dependencies"
  if [ ! -d "$BUNDLE" ]; then
    echo "system packages (no .gpu-bundle/: Eigen, GoogleTest, Google Benchmark, zlib and CLI11 must be installed here)" >"$L/deps.txt"
    echo 0 >"$L/deps.rc"
    cat "$L/deps.txt"
    return
  fi
  local P="$BUNDLE/prefix" DEPS="$BUILD/deps" f missing=()
  local lib="$P/lib/x86_64-linux-gnu/libbenchmark.so"
  for f in "$BUNDLE/MANIFEST" "$P/include/eigen3/Eigen/Core" "$P/share/eigen3/cmake/Eigen3Config.cmake" \
    "$BUNDLE/googletest/CMakeLists.txt" "$P/include/benchmark/benchmark.h" \
    "$P/lib/x86_64-linux-gnu/cmake/benchmark/benchmarkConfig.cmake" "$lib" "$P/include/zlib.h" "$P/lib/libz.a" \
    "$P/include/CLI/CLI.hpp" "$P/share/cmake/CLI11/CLI11Config.cmake"; do
    [ -e "$f" ] || missing+=("${f#"$ROOT"/}")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo ".gpu-bundle is incomplete, missing ${missing[*]} (run tools/gpu-bundle.sh again)" >"$L/deps.txt"
    echo 1 >"$L/deps.rc"
    return
  fi
  # Benchmark comes prebuilt from the packing machine: make sure this machine's C library and
  # libstdc++ can load it before a build fails on it at link time.
  if command -v ldd >/dev/null 2>&1 && ldd "$lib" 2>&1 | grep -q 'not found'; then
    echo "the bundle's libbenchmark.so cannot be loaded here: $(ldd "$lib" 2>&1 | grep -m1 'not found' | sed 's/^[[:space:]]*//')" >"$L/deps.txt"
    echo 1 >"$L/deps.rc"
    return
  fi
  # GoogleTest is built here so that its C++ library matches this machine's compiler.
  if [ -f "$DEPS/prefix/lib/cmake/GTest/GTestConfig.cmake" ]; then
    echo 0 >"$L/deps.rc"
  else
    local b
    b=$(budget_for deps) || return
    # shellcheck disable=SC2016 # expanded by the inner bash, from its arguments
    run_stage deps "$b" bash -c '
      cmake -S "$1/googletest" -B "$2/googletest" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_INSTALL_PREFIX="$2/prefix" -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_POLICY_VERSION_MINIMUM=3.5 &&
      cmake --build "$2/googletest" -j"$3" && cmake --install "$2/googletest"' _ "$BUNDLE" "$DEPS" "$JOBS"
  fi
  if [ "$(get deps.rc)" = 0 ]; then
    echo "from .gpu-bundle ($(head -n1 "$BUNDLE/MANIFEST"); GoogleTest built here)" >"$L/deps.txt"
  else
    echo "building GoogleTest from .gpu-bundle failed" >"$L/deps.txt"
  fi
  CMAKE_ARGS+=(-DEigen3_DIR="$P/share/eigen3/cmake" -DGTest_DIR="$DEPS/prefix/lib/cmake/GTest"
    -Dbenchmark_DIR="$P/lib/x86_64-linux-gnu/cmake/benchmark"
    -DZLIB_INCLUDE_DIR="$P/include" -DZLIB_LIBRARY="$P/lib/libz.a" -DCLI11_DIR="$P/share/cmake/CLI11")
  cat "$L/deps.txt"
}

# Chooses NCCL, checking the header AND the library of each place: NCCL_ROOT when set, the
# toolkit's, the system's, and only then the nvidia-nccl Python wheel (said loudly in the table).
do_nccl() {
  say "NCCL"
  local looked=() root inc dir lib
  nccl_pick() { # source root include-file lib-dir...
    local source=$1 r=$2 header=$3 d l
    shift 3
    for d in "$@"; do
      for l in "$d/libnccl.so" "$d/libnccl.so.2"; do
        looked+=("$l")
        if [ -e "$header" ] && [ -e "$l" ]; then
          printf 'source=%s\nroot=%s\nlib=%s\ninclude=%s\nlib_real=%s\n' \
            "$source" "$r" "$l" "$header" "$(readlink -f "$l")" >"$L/nccl.txt"
          return 0
        fi
      done
    done
    return 1
  }
  local cuda_root
  cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  if [ -n "${NCCL_ROOT:-}" ] && nccl_pick NCCL_ROOT "$NCCL_ROOT" "$NCCL_ROOT/include/nccl.h" "$NCCL_ROOT/lib" "$NCCL_ROOT/lib64"; then :
  elif nccl_pick toolkit /usr/local/cuda /usr/local/cuda/include/nccl.h /usr/local/cuda/lib64 \
    /usr/local/cuda/targets/x86_64-linux/lib; then :
  elif [ "$cuda_root" != /usr/local/cuda ] && nccl_pick toolkit "$cuda_root" "$cuda_root/include/nccl.h" \
    "$cuda_root/lib64" "$cuda_root/targets/x86_64-linux/lib"; then :
  elif nccl_pick system /usr /usr/include/nccl.h /usr/lib/x86_64-linux-gnu; then :
  else
    local wheel_found=0
    while IFS= read -r root; do
      [ -n "$root" ] || continue
      while IFS= read -r inc; do
        dir=$(dirname "$(dirname "$inc")")
        if nccl_pick wheel "$dir" "$inc" "$dir/lib"; then wheel_found=1; break 2; fi
      done < <(find "$root" -maxdepth 4 -name nccl.h -path '*nccl*/include/*' 2>/dev/null)
    done < <(python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
    if [ "$wheel_found" = 0 ]; then
      printf 'source=none\nlooked=%s\n' "${looked[*]} and python3's nvidia.nccl wheel" >"$L/nccl.txt"
    fi
  fi
  case "$(nccl_field source)" in
    wheel | NCCL_ROOT) CMAKE_ARGS+=(-DMIRRORED_NCCL_ROOT="$(nccl_field root)") ;;
  esac
  cat "$L/nccl.txt"
}

do_build() {
  say "configure + build (cuda preset, sm_90, -j$JOBS)"
  local b extra targets=()
  read -r -a extra <<<"${GPU_CHECK_CMAKE_ARGS:-}"
  # Everything is built unless GPU_CHECK_BUILD_TARGETS says otherwise: the test executables are
  # known only through their ctest label, so they cannot be named here.
  read -r -a targets <<<"${GPU_CHECK_BUILD_TARGETS:-}"
  b=$(budget_for configure) || { note_notrun build "$(first_line configure.notrun)"; return; }
  (cd "$ROOT" && run_stage configure "$b" cmake --preset cuda "${CMAKE_ARGS[@]}" "${extra[@]}") || {
    echo 1 >"$L/build.rc"
    return
  }
  # What CMake chose for NCCL, to compare with what was found above.
  local used
  used=$(sed -n 's/.*CUDA backend enabled.*NCCL: //p' "$L/configure.log" | head -n1)
  if [ -n "$used" ] && have nccl.txt; then
    printf 'used=%s\nused_real=%s\n' "$used" "$(readlink -f "$used")" >>"$L/nccl.txt"
  fi
  b=$(budget_for build) || return
  (cd "$ROOT" && run_stage build "$b" cmake --build --preset cuda -j"$JOBS" ${targets[@]:+--target "${targets[@]}"})
}

do_tests() {
  say "gpu tests (ctest -L gpu)"
  # The gpu tests as ctest knows them (names, commands, properties): for the sanitizer's list of
  # executables and the simulated-GPU guard.
  # -L takes a regular expression: a bare `gpu` also matches the label `gpu_sim` of the simulated
  # GPU's own suite, whose tests pass without a GPU (they would make a run on which every real gpu
  # test skipped look like a pass) and whose executable memcheck would take a stage's time for.
  ctest --test-dir "$BUILD" -L '^gpu$' --show-only=json-v1 >"$L/gpu-tests.json" 2>"$L/gpu-tests.err"
  local b
  b=$(budget_for ctest) || return
  # -j4, not more: the tests share one GPU, and those that check deadlines and aborts need it
  # not to be swamped by the others.
  run_stage ctest "$b" ctest --test-dir "$BUILD" -L '^gpu$' --no-tests=error -j4 --output-on-failure --timeout 180
  tail -n 8 "$L/ctest.log"
}

do_bench() {
  say "GPU benchmarks"
  local exe="$BUILD/bench/bench_gpu" b
  rm -f "$L/bench_gpu.json"
  if [ ! -x "$exe" ]; then
    note_notrun bench "bench_gpu was not built (was Google Benchmark found? see configure.log)"
    return
  fi
  b=$(budget_for bench) || return
  run_stage bench "$b" "$exe" --benchmark_out="$L/bench_gpu.json" --benchmark_out_format=json
}

do_train() {
  say "train_digits --devices GPU:0"
  local exe="$BUILD/train_digits" b
  if [ ! -x "$exe" ]; then
    note_notrun train "train_digits was not built ($exe is missing)"
    return
  fi
  b=$(budget_for train) || return
  run_stage train "$b" "$exe" --devices GPU:0 --epochs 5
}

do_sanitizer() {
  say "compute-sanitizer memcheck"
  local san c
  san=$(command -v compute-sanitizer || true)
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [ -z "$san" ] && [ -x "$c" ] && san=$c
  done
  if [ -z "$san" ]; then
    note_notrun sanitizer "compute-sanitizer is not installed (PATH, /usr/local/cuda/bin, /usr/local/cuda/compute-sanitizer)"
    return
  fi
  local exes
  if ! exes=$(pyhelp executables "$L/gpu-tests.json" 2>&1); then
    note_notrun sanitizer "could not list the gpu test executables from ctest: $exes"
    return
  fi
  awk 'NF { printf "%d\t%s\n", ++i, $0 }' <<<"$exes" >"$L/sanitizer.list"
  local n i exe left b
  n=$(grep -c . "$L/sanitizer.list")
  # Each executable gets at least SAN_MIN_S (else it is "not run: out of time", a failure of the
  # check, not of the code) and at most SAN_MAX_S, sharing what is left with those after it.
  while IFS=$'\t' read -r i exe; do
    left=$(seconds_left)
    if [ "$left" -lt "$SAN_MIN_S" ]; then
      note_notrun "memcheck-$i" "out of time: ${left}s left, memcheck needs at least ${SAN_MIN_S}s per test executable"
      continue
    fi
    b=$((left / (n - i + 1)))
    [ "$b" -ge "$SAN_MIN_S" ] || b=$SAN_MIN_S
    [ "$b" -le "$SAN_MAX_S" ] || b=$SAN_MAX_S
    (cd "$BUILD" && run_stage "memcheck-$i" "$b" "$san" --tool memcheck --error-exitcode 99 --leak-check no \
      --report-api-errors no "$exe" --gtest_filter="$SAN_FILTER")
  done <"$L/sanitizer.list"
}

finish() {
  local copy_to=$1 code
  ROWS=()
  decide_all
  record "total time" info "$(($(date +%s) - START))s of GPU_CHECK_SECONDS=$TOTAL_S"
  verdict
  code=$?
  say "summary"
  render_table | tee "$L/summary.md"
  if [ -n "$copy_to" ]; then
    mkdir -p "$copy_to"
    cp "$L/summary.md" "$copy_to/"
    tail -n 200 "$L/build.log" >"$L/build-tail.log" 2>/dev/null
    # One archive: the device tool brings back at most 8 files.
    tar czf "$copy_to/gpu-check-logs.tar.gz" -C "$BUILD" --exclude=gpu-check/build.log gpu-check
  fi
  return "$code"
}

run_check() {
  local copy_to=$1
  rm -rf "$L" && mkdir -p "$L" || exit 2
  do_env
  print_plan
  do_tools
  do_gpu
  if ! gpu_found; then
    # No GPU: nothing is built; the check fails (its purpose is a run on a GPU).
    skip_rest "no GPU found by the CUDA runtime: the check needs a GPU" deps nccl build ctest bench train sanitizer
  else
    do_deps
    do_nccl
    if [ "$(get tools.rc)" != 0 ]; then
      skip_rest "tools missing: $(first_line tools.missing)" build
    elif [ "$(get deps.rc)" != 0 ]; then
      skip_rest "the dependencies failed" build
    else
      do_build
    fi
    if [ "$(get build.rc)" = 0 ]; then
      do_tests
      do_bench
      do_train
      do_sanitizer
    fi
    skip_rest "the build did not succeed" ctest bench train sanitizer
  fi
  finish "$copy_to"
}

# =============================================================================================
# --self-test: the decisions against recorded runs. Each case of tools/gpu-check-fixtures/cases/
# is base/ (a passing run) with the case's files laid over it and the files named in its
# `remove` deleted; its `expect` gives the exit status ("exit N") and rows the table must show
# ("label | STATUS | text in the detail"). Needs bash and python3; no GPU, CUDA or build.
# =============================================================================================
# Checks one case; prints "ok ..." or "FAIL ..." (with the table). Runs in its own process.
self_test_case() {
  local dir=$1 work=$2 name code table expect_code line label status text want problems=()
  name=$(basename "$dir")
  mkdir -p "$work" && cp -R "$FIXTURES/base/." "$work/" || return 2
  if [ -f "$dir/remove" ]; then
    # shellcheck disable=SC2086 # `remove` may hold globs
    while IFS= read -r line; do [ -n "$line" ] && rm -f "$work/"$line; done <"$dir/remove"
  fi
  cp -R "$dir." "$work/" && rm -f "$work/expect" "$work/remove"
  table=$(
    L=$work
    ROWS=()
    decide_all
    verdict
    code=$?
    render_table
    exit "$code"
  )
  code=$?
  expect_code=$(sed -n 's/^exit \([0-9]*\)$/\1/p' "$dir/expect")
  [ "$code" = "$expect_code" ] || problems+=("exit $code, expected $expect_code")
  while IFS= read -r line; do
    case "$line" in exit* | "#"* | "") continue ;; esac
    label=${line%% | *}
    status=${line#* | }
    text=${status#* | }
    status=${status%% | *}
    case "$status" in FAIL) want="**FAIL**" ;; "NOT RUN") want="**NOT RUN**" ;; *) want=$status ;; esac
    if ! grep -qF -- "| $label | $want | " <<<"$table"; then
      problems+=("no row '| $label | $want |'")
    elif ! grep -F -- "| $label | $want | " <<<"$table" | grep -qF -- "$text"; then
      problems+=("row '$label' lacks '$text'")
    fi
  done <"$dir/expect"
  if [ "${#problems[@]}" -eq 0 ]; then
    printf 'ok    %-26s exit %s  %s\n' "$name" "$code" "$(grep -m1 -v -e '^exit' -e '^#' "$dir/expect")"
  else
    printf 'FAIL  %-26s %s\n' "$name" "$(printf '%s; ' "${problems[@]}")"
    # shellcheck disable=SC2001
    sed 's/^/        /' <<<"$table"
  fi
}

self_test() {
  local tmp dir name failures=0 cases=0
  tmp=$(mktemp -d) || return 2
  # The cases are independent: check them concurrently, report them in order.
  for dir in "$FIXTURES"/cases/*/; do
    name=$(basename "$dir")
    self_test_case "$dir" "$tmp/$name" >"$tmp/$name.out" 2>&1 &
  done
  wait
  for dir in "$FIXTURES"/cases/*/; do
    name=$(basename "$dir")
    cases=$((cases + 1))
    cat "$tmp/$name.out"
    grep -q '^ok ' "$tmp/$name.out" || failures=$((failures + 1))
  done
  # The list of executables for memcheck, from a recorded `ctest --show-only=json-v1`.
  local got want_exes
  cases=$((cases + 1))
  got=$(pyhelp executables "$FIXTURES/base/gpu-tests.json" | paste -sd ' ' -)
  want_exes=$(cut -f2 "$FIXTURES/base/sanitizer.list" | paste -sd ' ' -)
  if [ -n "$got" ] && [ "$got" = "$want_exes" ]; then
    printf 'ok    %-26s %s\n' "ctest-json-executables" "$got"
  else
    failures=$((failures + 1))
    printf 'FAIL  %-26s got [%s], expected [%s]\n' "ctest-json-executables" "$got" "$want_exes"
  fi
  rm -rf "$tmp"
  if [ "$failures" -eq 0 ]; then
    echo "gpu-check self-test: all $cases cases passed"
    return 0
  fi
  echo "gpu-check self-test: $failures of $cases cases FAILED"
  return 1
}

main() {
  local copy_to="" code
  while [ $# -gt 0 ]; do
    case "$1" in
      --self-test) self_test; exit $? ;;
      --decide) # the decisions alone, over the records of an earlier run (e.g. from its log archive)
        L=$(cd "${2:?--decide needs the folder of the records of a run}" && pwd) || exit 2
        decide_all
        verdict
        code=$?
        render_table
        exit "$code" ;;
      --copy-to) copy_to=${2:?--copy-to needs a folder}; shift 2 ;;
      -h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; exit 0 ;;
      *) echo "gpu-check: unknown argument '$1' (usage: tools/gpu-check.sh [--copy-to DIR] | --self-test | --decide DIR)" >&2; exit 2 ;;
    esac
  done
  export PATH="$PATH:/usr/local/cuda/bin"
  run_check "$copy_to"
}

main "$@"
