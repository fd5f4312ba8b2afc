#!/usr/bin/env bash
# The formatting check CI runs: every tracked C++ source (.cpp, .hpp, .h, .cu) must be as
# clang-format-14 writes it with the tree's .clang-format (Google style, 120 columns). Prints each
# file that is not, with the first lines of its difference, and exits 1; exits 0 when all are.
#   tools/check_format.sh          check
#   tools/check_format.sh --fix    rewrite the files in place (then review and commit them)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
format=$(command -v clang-format-14 || command -v clang-format || true)
[ -n "$format" ] || { echo "check_format: clang-format-14 is not installed (scripts/install-deps.sh installs it)" >&2; exit 2; }
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' | grep -v '^tests/fuzz/corpus/')
if [ "${1:-}" = "--fix" ]; then
  "$format" -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! diff_out=$("$format" "$f" | diff -u "$f" - 2>&1); then
    echo "check_format: $f is not formatted (run tools/check_format.sh --fix):"
    printf '%s\n' "$diff_out" | sed -n '3,12p'
    bad=$((bad + 1))
  fi
done
if [ "$bad" -gt 0 ]; then
  echo "check_format: $bad of ${#files[@]} files differ from clang-format's output"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
