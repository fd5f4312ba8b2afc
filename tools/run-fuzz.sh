#!/usr/bin/env bash
# Builds the fuzz preset (clang, libFuzzer, ASan + UBSan) and runs every fuzz target for a bounded
# time, one after the other. Usage: tools/run-fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
# (default 60 s; all targets listed in build/fuzz/fuzz_targets.txt). Each target starts from its
# checked-in seeds (tests/fuzz/corpus/<target>/, read-only) plus what earlier runs found
# (build/fuzz/corpus/<target>/); a crashing input is written to build/fuzz/findings/<target>/.
# Prints one line per target with its executions; exits non-zero when any target found something.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-60}"
shift || true
build=build/fuzz

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j"${JOBS:-2}"

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets <"${build}/fuzz_targets.txt"
fi
[ "${#targets[@]}" -gt 0 ] || { echo "run-fuzz: no fuzz targets" >&2; exit 1; }

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=()
summary=()
for t in "${targets[@]}"; do
  exe="${build}/tests/fuzz/fuzz_${t}"
  work="${build}/corpus/${t}"
  findings="${build}/findings/${t}"
  log="${build}/logs/${t}.log"
  mkdir -p "${work}" "${findings}" "$(dirname "${log}")"
  echo "==> fuzz_${t}: ${seconds} s"
  status=0
  "${exe}" -max_total_time="${seconds}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="${findings}/" "${work}" "tests/fuzz/corpus/${t}" >"${log}" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "${log}" | tail -1)
  if [ "${status}" -ne 0 ]; then
    failed+=("${t}")
    summary+=("fuzz_${t}: FINDING after ${execs:-?} executions (exit ${status}); see ${log} and ${findings}/")
    tail -40 "${log}"
  else
    summary+=("fuzz_${t}: ${execs:-?} executions in ${seconds} s, no finding")
  fi
done

echo
echo "==== fuzz summary ===="
printf '  %s\n' "${summary[@]}"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "run-fuzz: findings in: ${failed[*]}" >&2
  exit 1
fi
