#!/usr/bin/env bash
# Installs every Debian package dgc needs (build, tests, benchmarks, data), then configures and
# builds into build/. Idempotent: when everything is installed and built it only checks.
#
#   scripts/setup.sh            install what is missing, then build
#   scripts/setup.sh --no-build install only
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-dev clang-format
  libgtest-dev libgmock-dev libbenchmark-dev
  libtorch-dev libopenblas0-openmp python3-torch python3-dev pybind11-dev
  python3-venv python3-pip python3-setuptools python3-wheel
  libgloo-dev libopenmpi-dev openmpi-bin libsimgrid-dev
  zlib1g-dev libssl-dev libcli11-dev nlohmann-json3-dev
  dataset-fashion-mnist bible-kjv espeak-ng
  iproute2 iputils-ping procps gnuplot-nox
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${#missing[@]} missing package(s): ${missing[*]}"
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then
      sudo=(sudo)
    else
      echo "setup: these packages are missing and installing them needs root: ${missing[*]}" >&2
      echo "setup: run this script as root, or install them with apt-get first." >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

[ "${1:-}" = "--no-build" ] && exit 0

jobs=$(nproc)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
