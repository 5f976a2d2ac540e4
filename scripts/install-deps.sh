#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages tandem builds against, skipping those already present.
# Usage: scripts/install-deps.sh            (needs root or sudo for apt-get)
set -euo pipefail

packages=(
  cmake ninja-build g++ pkg-config
  libeigen3-dev        # CPU kernels: GEMM and vectorised loops
  libopenmpi-dev openmpi-bin  # process launch (mpirun) and the CPU process group
  libgtest-dev         # unit tests
  zlib1g-dev           # reading .gz datasets
  nlohmann-json3-dev   # safetensors headers, metrics files
  libcli11-dev         # command-line flags of examples and benchmarks
  dataset-fashion-mnist  # the example training's data
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
