#!/usr/bin/env bash
# Installs the Debian packages needed to build and test mirrored.
# Idempotent: only missing packages are installed, and `apt-get update` only
# runs when something is missing. Uses sudo only when not running as root.
set -euo pipefail

packages=(
  cmake
  g++
  make
  ninja-build
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  libeigen3-dev
  zlib1g-dev
)

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=()
for pkg in "${packages[@]}"; do
  if ! is_installed "$pkg"; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all build dependencies are already installed"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: missing packages (${missing[*]}) and apt-get is not available" >&2
  exit 1
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
    exit 1
  fi
fi

echo "install-deps: installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update
"${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
echo "install-deps: done"
