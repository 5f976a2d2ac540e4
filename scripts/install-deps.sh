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
else
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=sudo
  fi
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# cuDNN's header-only C++ frontend (fused attention graphs), for CUDA builds: NVIDIA publishes it
# on PyPI; only its include/ folder is kept, in .deps/cudnn-frontend/ where CMake looks first.
# Without it the build still works and attention on CUDA runs unfused.
frontend_version=1.32.0
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
frontend_dir="$repo/.deps/cudnn-frontend"
if [ -f "$frontend_dir/include/cudnn_frontend.h" ]; then
  echo "install-deps: cuDNN frontend headers present"
elif ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDA_HOME:-}" ]; then
  echo "install-deps: no CUDA toolkit, so no cuDNN frontend headers needed"
else
  download="$(mktemp -d)"
  if python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
       --platform manylinux_2_28_x86_64 --dest "$download" "nvidia-cudnn-frontend==$frontend_version"; then
    mkdir -p "$frontend_dir"
    python3 - "$download"/*.whl "$frontend_dir" <<'PY'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("include/")])
PY
    echo "install-deps: cuDNN frontend $frontend_version headers in .deps/cudnn-frontend/include"
  else
    echo "install-deps: could not download nvidia-cudnn-frontend from PyPI: attention on CUDA will run unfused" >&2
  fi
  rm -rf "$download"
fi

# CUTLASS's header-only C++ templates, for tandem's sm_90 matrix products with programmatic
# dependent launch (core/cuda/gemm_sm90.h), for CUDA builds: NVIDIA publishes them on PyPI inside
# nvidia-cutlass; only their include/ folder is kept, in .deps/cutlass/ where CMake looks first.
# Without them the build still works and every product runs on cuBLASLt.
cutlass_version=4.2.0.0
cutlass_dir="$repo/.deps/cutlass"
if [ -f "$cutlass_dir/include/cutlass/cutlass.h" ]; then
  echo "install-deps: CUTLASS headers present"
elif ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ] && [ -z "${CUDA_HOME:-}" ]; then
  echo "install-deps: no CUDA toolkit, so no CUTLASS headers needed"
else
  download="$(mktemp -d)"
  if python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$download" \
       "nvidia-cutlass==$cutlass_version"; then
    mkdir -p "$cutlass_dir"
    python3 - "$download"/*.whl "$cutlass_dir" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = os.path.join(dest, "include", name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as out:
                out.write(src.read())
PY
    echo "install-deps: CUTLASS $cutlass_version headers in .deps/cutlass/include"
  else
    echo "install-deps: could not download nvidia-cutlass from PyPI: 16-bit products will run on cuBLASLt only" >&2
  fi
  rm -rf "$download"
fi
