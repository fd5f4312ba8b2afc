#!/usr/bin/env bash
# Packs what tools/gpu-check.sh needs to build the CUDA configuration on a GPU machine that has
# the CUDA toolkit, CMake and Ninja but nothing else and cannot download anything: everything
# the `cuda` preset's configure finds with find_package besides the toolkit and Threads, i.e.
# Eigen's headers, GoogleTest's sources (built there, so its C++ library matches that machine's
# compiler), Google Benchmark, a static zlib and CLI11's headers (the examples' flags). Everything comes from this machine's Debian
# packages (scripts/install-deps.sh installs them) and lands in .gpu-bundle/ (ignored by git,
# about 15 MB). gpu-check.sh uses it when present.
#
# .gpu-bundle/ is ignored by git, so it travels only when named: the device tool copies the
# working tree plus the paths in `carry`, 64 MiB in all (docs/gpu.md):
#   run(command="tools/gpu-check.sh --copy-to $OUT", carry=[".gpu-bundle"], timeout_s=590)
# This script fails when the bundle reaches 60 MiB, and says how much of the 64 MiB the tree
# and the bundle take together.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUNDLE=.gpu-bundle
ARCH_LIB=/usr/lib/x86_64-linux-gnu

need() {
  for f in "$@"; do
    [ -e "$f" ] || { echo "gpu-bundle: $f is missing; run scripts/install-deps.sh first" >&2; exit 1; }
  done
}
need /usr/include/eigen3/Eigen/Core /usr/share/eigen3/cmake/Eigen3Config.cmake \
  /usr/src/googletest/CMakeLists.txt \
  /usr/include/benchmark/benchmark.h "$ARCH_LIB/cmake/benchmark/benchmarkConfig.cmake" \
  /usr/include/zlib.h /usr/include/zconf.h "$ARCH_LIB/libz.a" \
  /usr/include/CLI/CLI.hpp /usr/share/cmake/CLI11/CLI11Config.cmake

rm -rf "$BUNDLE"
P="$BUNDLE/prefix"
mkdir -p "$P/include" "$P/share/eigen3" "$P/lib/x86_64-linux-gnu/cmake"

# Eigen: header-only; its package config finds the headers relative to itself.
cp -r /usr/include/eigen3 "$P/include/"
cp -r /usr/share/eigen3/cmake "$P/share/eigen3/"

# GoogleTest: sources, built on the GPU machine.
cp -rL /usr/src/googletest "$BUNDLE/googletest"

# Google Benchmark: Debian's shared library and package config, laid out as in /usr.
cp -r /usr/include/benchmark "$P/include/"
cp -P "$ARCH_LIB"/libbenchmark.so* "$ARCH_LIB/libbenchmark_main.a" "$P/lib/x86_64-linux-gnu/"
cp -r "$ARCH_LIB/cmake/benchmark" "$P/lib/x86_64-linux-gnu/cmake/"

# zlib: static, so nothing has to be found at run time.
cp /usr/include/zlib.h /usr/include/zconf.h "$P/include/"
cp "$ARCH_LIB/libz.a" "$P/lib/"

# CLI11: header-only; its package config finds the headers relative to itself.
mkdir -p "$P/share/cmake"
cp -r /usr/include/CLI "$P/include/"
cp -r /usr/share/cmake/CLI11 "$P/share/cmake/"

{
  # shellcheck source=/dev/null
  echo "packed on $(date -u +%Y-%m-%dT%H:%MZ) from $(. /etc/os-release && echo "$PRETTY_NAME")"
  for pkg in libeigen3-dev googletest libbenchmark-dev zlib1g-dev libcli11-dev; do
    dpkg-query -W -f='${Package} ${Version}\n' "$pkg" 2>/dev/null || echo "$pkg ?"
  done
  # The one prebuilt shared library: the GPU machine's C library and libstdc++ must be at least
  # this new (gpu-check.sh checks that it loads there before building).
  if command -v objdump >/dev/null 2>&1; then
    echo "libbenchmark.so needs: $(objdump -T "$ARCH_LIB"/libbenchmark.so.*.* 2>/dev/null |
      grep -oE '(GLIBC|GLIBCXX)_[0-9.]+' | sort -uV | awk -F_ '{ v[$1] = $0 } END { print v["GLIBC"], v["GLIBCXX"] }')"
  fi
} >"$BUNDLE/MANIFEST"
cat "$BUNDLE/MANIFEST"

# Size: the bundle must stay under 60 MiB so that the tree and it fit the 64 MiB the device tool
# carries.
MiB=$((1024 * 1024))
bundle_bytes=$(du -sb "$BUNDLE" | cut -f1)
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | du -cb --files0-from=- 2>/dev/null | tail -n1 | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
echo "gpu-bundle: $BUNDLE is $(mib "$bundle_bytes") (limit: under 60 MiB); with the working tree ($(mib "$tree_bytes")) $(mib $((bundle_bytes + tree_bytes))) of the 64 MiB the device tool carries"
if [ "$bundle_bytes" -ge $((60 * MiB)) ]; then
  echo "gpu-bundle: FAILED: the bundle is $(mib "$bundle_bytes"), at or over the 60 MiB limit" >&2
  exit 1
fi
if [ $((bundle_bytes + tree_bytes)) -gt $((64 * MiB)) ]; then
  echo "gpu-bundle: FAILED: the tree and the bundle together exceed the 64 MiB the device tool carries" >&2
  exit 1
fi
