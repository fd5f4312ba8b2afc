#!/usr/bin/env bash
# The compile time of a user's translation unit: each example source given, compiled alone with the
# release preset's flags (-O3 -DNDEBUG, C++20, one job) against the headers of this checkout, RUNS
# times; prints the median CPU seconds (user + system, which another job on the machine disturbs
# less than the wall clock) and the wall seconds of each source. Needs a configured release build
# (`cmake --preset release`) for the generated headers.
#   bench/compile_time.sh [RUNS] [SOURCE...]   (default: 5 runs of examples/quickstart.cpp and
#                                               examples/train_digits.cpp)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
runs=${1:-5}
shift || true
sources=("$@")
[ ${#sources[@]} -gt 0 ] || sources=(examples/quickstart.cpp examples/train_digits.cpp)
[ -d build/release/include ] || { echo "compile_time: run 'cmake --preset release' first" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for src in "${sources[@]}"; do
  cpu=() wall=()
  for _ in $(seq "$runs"); do
    line=$( { /usr/bin/time -f '%U %S %e' c++ -DMIRRORED_DIGITS_CSV=\"data/digits.csv.gz\" -Iinclude \
      -Ibuild/release/include -Iexamples -isystem /usr/include/eigen3 -O3 -DNDEBUG -std=c++20 \
      -c "$src" -o "$out/tu.o"; } 2>&1 | tail -n 1)
    read -r u s e <<<"$line"
    cpu+=("$(echo "$u + $s" | bc)")
    wall+=("$e")
  done
  median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  printf '%-28s cpu %6.2f s  wall %6.2f s  (median of %d)\n' "$src" "$(median "${cpu[@]}")" "$(median "${wall[@]}")" "$runs"
done
