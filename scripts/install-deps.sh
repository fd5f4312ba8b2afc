#!/usr/bin/env bash
# Installs the Debian packages needed to build and test mirrored (libgloo-dev: the collectives
# between worker processes of MultiWorkerMirroredStrategy).
# Idempotent: only missing packages are installed, and `apt-get update` only
# runs when something is missing. Uses sudo only when not running as root.
#
# Then, best effort (never failing the script): Python's `safetensors` and
# `numpy` packages from PyPI, which the checkpoint tests use to check that our
# files load in Python (those tests skip when the packages are unavailable),
# Debian's python3-matplotlib, which bench/plot.py draws the charts of
# docs/performance.md with, and the launchers that tests/cluster/test_real_launchers.cpp
# starts train_digits with (they skip those that are missing): Open MPI's mpirun
# (openmpi-bin), Slurm with its authentication daemon (slurm-wlm, munge; the test runs a
# one-node cluster of its own, as root) and torchrun (python3-torch, about 570 MB installed).
#
# `--interop` also installs Debian's libtorch-dev (large: about 1 GB installed), which only
# examples/interop needs (`make interop`); the Python and matplotlib steps are then skipped.
#
# `--ddp` also installs Debian's python3-torch (PyTorch for /usr/bin/python3, with Gloo; about
# 570 MB installed on a machine without it), which only bench/e2e_digits.py's PyTorch DDP side
# needs (`make bench-report`); everything else is installed as without it.
set -euo pipefail

interop=0
ddp=0
for arg in "$@"; do
  case "$arg" in
    --interop) interop=1 ;;
    --ddp) ddp=1 ;;
    *) echo "install-deps: unknown argument '$arg' (usage: install-deps.sh [--interop] [--ddp])" >&2; exit 2 ;;
  esac
done

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
  libcli11-dev
  libgloo-dev
  libdlpack-dev  # <mirrored/dlpack.hpp>: DLPack interop (header only)
  dataset-fashion-mnist  # examples/fashion_mnist and its tests: the IDX files in /usr/share/datasets/fashion-mnist
  python3  # the layer check (tools/check_layers.py, the tests `layers` and `layers.self_test`)
  # The fuzz preset (make fuzz): clang with libFuzzer and the sanitizer runtimes.
  clang-14
  clang-format-14  # the formatting check (tools/check_format.sh, CI's first stage)
  libclang-rt-14-dev
  llvm  # llvm-symbolizer, for symbolized sanitizer reports
  # The cluster bed (tools/cluster_bed.sh, the tests labelled bed): namespaces, links, drops.
  iproute2
  nftables
)

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

install_debian_packages() {
  local missing=()
  local pkg
  for pkg in "${packages[@]}"; do
    if ! is_installed "$pkg"; then
      missing+=("$pkg")
    fi
  done

  if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: all build dependencies are already installed"
    return 0
  fi

  if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: missing packages (${missing[*]}) and apt-get is not available" >&2
    exit 1
  fi

  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "install-deps: need root or sudo to install: ${missing[*]}" >&2
      exit 1
    fi
  fi

  echo "install-deps: installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update
  "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
  echo "install-deps: done"
}

# Best effort: python3 + safetensors + numpy for the checkpoint interop tests.
install_python_safetensors() {
  if ! command -v python3 >/dev/null 2>&1; then
    echo "install-deps: no python3; the Python safetensors checks will be skipped"
    return 0
  fi
  if python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1; then
    echo "install-deps: python3 has safetensors and numpy"
    return 0
  fi
  echo "install-deps: installing safetensors and numpy for python3 (best effort)"
  local limit=()
  if command -v timeout >/dev/null 2>&1; then limit=(timeout 300); fi
  if "${limit[@]}" python3 -m pip install --quiet --disable-pip-version-check \
       --timeout 30 --retries 2 safetensors numpy </dev/null \
     && python3 -c 'import safetensors.numpy, numpy' >/dev/null 2>&1; then
    echo "install-deps: python3 safetensors installed"
  else
    echo "install-deps: could not install safetensors for python3; the Python safetensors checks will be skipped"
  fi
  return 0
}

# install_best_effort CONSEQUENCE PKG...: installs those of the Debian packages PKG... that are
# missing, never failing; CONSEQUENCE says what happens without them ("bench/plot.py will not run").
install_best_effort() {
  local consequence="$1" pkg
  shift
  local missing=()
  for pkg in "$@"; do
    is_installed "$pkg" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "install-deps: $* already installed"
    return 0
  fi
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo=(sudo); else
      echo "install-deps: need root or sudo to install ${missing[*]}; $consequence"
      return 0
    fi
  fi
  echo "install-deps: installing ${missing[*]} (best effort)"
  # (apt's lists may be stale when every build dependency was already there: update and retry once.)
  if DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}" \
       </dev/null >/dev/null 2>&1 ||
     { "${sudo[@]}" apt-get update >/dev/null 2>&1 &&
       DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}" \
         </dev/null >/dev/null 2>&1; }; then
    echo "install-deps: ${missing[*]} installed"
  else
    echo "install-deps: could not install ${missing[*]}; $consequence"
  fi
  return 0
}

# Best effort: Debian's matplotlib for bench/plot.py (which runs under /usr/bin/python3 when the
# python3 on PATH lacks matplotlib).
install_matplotlib() {
  local py
  for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import matplotlib' >/dev/null 2>&1; then
      echo "install-deps: $py has matplotlib"
      return 0
    fi
  done
  if is_installed python3-matplotlib; then
    echo "install-deps: python3-matplotlib is installed, but no python3 here imports it; bench/plot.py will not run"
    return 0
  fi
  install_best_effort "bench/plot.py will not run" python3-matplotlib
}

if [ "$ddp" -eq 1 ]; then
  packages+=(python3-torch)
fi
if [ "$interop" -eq 1 ]; then
  packages+=(libtorch-dev)
  install_debian_packages
  exit 0
fi

install_debian_packages
install_python_safetensors || true
install_matplotlib || true
install_best_effort "the tests of train_digits under mpirun, srun and torchrun skip (label launcher)" \
  openmpi-bin slurm-wlm munge python3-torch || true
