#!/usr/bin/env bash
# Packs what tools/gpu-check.sh needs to build the CUDA configuration on a GPU machine that has
# the CUDA toolkit, CMake and Ninja but nothing else and cannot download anything: Eigen's
# headers, GoogleTest's sources (built there, so its C++ library matches that machine's
# compiler), Google Benchmark and a static zlib. Everything comes from this machine's Debian
# packages (scripts/install-deps.sh installs them) and lands in .gpu-bundle/ (ignored by git,
# about 10 MB). Send that folder along with the working tree; gpu-check.sh uses it when present.
#
#   tools/gpu-bundle.sh && <copy the tree and .gpu-bundle to the GPU machine> && tools/gpu-check.sh
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
  /usr/include/zlib.h /usr/include/zconf.h "$ARCH_LIB/libz.a"

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

{
  echo "packed on $(date -u +%Y-%m-%dT%H:%MZ) from $(. /etc/os-release && echo "$PRETTY_NAME")"
  for pkg in libeigen3-dev googletest libbenchmark-dev zlib1g-dev; do
    dpkg-query -W -f='${Package} ${Version}\n' "$pkg" 2>/dev/null || echo "$pkg ?"
  done
} >"$BUNDLE/MANIFEST"
echo "gpu-bundle: $(du -sh "$BUNDLE" | cut -f1) in $BUNDLE"
cat "$BUNDLE/MANIFEST"
