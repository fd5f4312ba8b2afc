#!/usr/bin/env bash
# The compile time of a user's translation unit: each example source given, compiled alone with the
# release preset's flags (-O3 -DNDEBUG, C++20, one job) against the headers of this checkout, RUNS
# times; prints the median CPU seconds (user + system, which another job on the machine disturbs
# less than the wall clock) and the wall seconds of each source. Needs a configured release build
# (`cmake --preset release`) for the generated headers.
#   bench/compile_time.sh [--baseline DIR | --baseline-headers DIR] [RUNS] [SOURCE...]
#       (default: 5 runs of examples/quickstart.cpp and examples/train_digits.cpp)
# With a baseline, another checkout with its own release configuration (e.g. `git worktree add DIR
# <commit>`), the runs alternate between this checkout and the baseline, and each line gives both
# medians and the median of the per-pair ratios (this / baseline), which a machine whose speed drifts
# disturbs least. --baseline DIR compiles DIR's own copy of each source against DIR's headers (the
# whole translation unit before and after); --baseline-headers DIR compiles this checkout's source
# (and examples/ headers) against DIR's library headers (the library's part of the change alone).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
base="" mode=""
case "${1:-}" in
  --baseline | --baseline-headers)
    mode=$1 base=$(cd "${2:?compile_time: $1 needs a directory}" && pwd)
    shift 2
    [ -d "$base/build/release/include" ] || { echo "compile_time: run 'cmake --preset release' in $base first" >&2; exit 2; }
    ;;
esac
runs=${1:-5}
shift || true
sources=("$@")
[ ${#sources[@]} -gt 0 ] || sources=(examples/quickstart.cpp examples/train_digits.cpp)
[ -d build/release/include ] || { echo "compile_time: run 'cmake --preset release' first" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
here=$(pwd)
# compile TREE SOURCE_TREE SRC: one compilation of SOURCE_TREE/SRC with TREE's library headers;
# prints "cpu wall".
compile() {
  local line
  line=$( { /usr/bin/time -f '%U %S %e' c++ -DMIRRORED_DIGITS_CSV=\"data/digits.csv.gz\" -I"$1/include" \
    -I"$1/build/release/include" -I"$2/examples" -isystem /usr/include/eigen3 -O3 -DNDEBUG -std=c++20 \
    -c "$2/$3" -o "$out/tu.o"; } 2>&1 | tail -n 1)
  read -r u s e <<<"$line"
  echo "$(echo "$u + $s" | bc) $e"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for src in "${sources[@]}"; do
  cpu=() wall=() base_cpu=() ratio=()
  for _ in $(seq "$runs"); do
    read -r c w <<<"$(compile "$here" "$here" "$src")"
    cpu+=("$c") wall+=("$w")
    if [ -n "$base" ]; then
      if [ "$mode" = --baseline ]; then
        read -r bc _ <<<"$(compile "$base" "$base" "$src")"
      else
        read -r bc _ <<<"$(compile "$base" "$here" "$src")"
      fi
      base_cpu+=("$bc")
      ratio+=("$(echo "scale=4; $c / $bc" | bc)")
    fi
  done
  if [ -n "$base" ]; then
    printf '%-28s cpu %6.2f s  baseline %6.2f s  ratio %5.3f  (medians of %d pairs)\n' "$src" "$(median "${cpu[@]}")" \
      "$(median "${base_cpu[@]}")" "$(median "${ratio[@]}")" "$runs"
  else
    printf '%-28s cpu %6.2f s  wall %6.2f s  (median of %d)\n' "$src" "$(median "${cpu[@]}")" "$(median "${wall[@]}")" "$runs"
  fi
done
