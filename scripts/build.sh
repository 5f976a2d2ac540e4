#!/usr/bin/env bash
# Configures and builds tandem with Ninja, using every core. The CUDA backend is compiled when
# nvcc is found, on PATH or where NVIDIA installs it (/usr/local/cuda/bin, or $CUDA_HOME/bin).
#
# Usage: scripts/build.sh [extra cmake configure arguments...]
#   TANDEM_BUILD_DIR   build folder (default: build/ in the repository root)
#   TANDEM_JOBS        parallel build jobs (default: the number of cores)
# Examples:
#   scripts/build.sh
#   TANDEM_BUILD_DIR=build-cpu scripts/build.sh -DTANDEM_WITH_CUDA=OFF
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${TANDEM_BUILD_DIR:-$repo/build}"
case "$build_dir" in /*) ;; *) build_dir="$PWD/$build_dir" ;; esac
jobs="${TANDEM_JOBS:-$(nproc)}"

for tool in cmake ninja; do
  command -v "$tool" >/dev/null || { echo "build: '$tool' not found; run scripts/install-deps.sh first" >&2; exit 1; }
done

configure_args=(-S "$repo" -B "$build_dir")
# A build folder keeps the generator it was made with; name Ninja only for a new one.
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  configure_args+=(-G Ninja)
fi

# Find nvcc where NVIDIA installs it when it is not on PATH (CMake only looks on PATH).
# An explicit -DCMAKE_CUDA_COMPILER=... or -DTANDEM_WITH_CUDA=OFF among the arguments wins.
if [[ " $* " != *" -DCMAKE_CUDA_COMPILER="* && " $* " != *" -DTANDEM_WITH_CUDA=OFF "* ]] &&
   ! command -v nvcc >/dev/null; then
  for candidate in ${CUDA_HOME:+"$CUDA_HOME/bin/nvcc"} ${CUDA_PATH:+"$CUDA_PATH/bin/nvcc"} /usr/local/cuda/bin/nvcc; do
    if [ -x "$candidate" ]; then
      echo "build: using nvcc at $candidate"
      configure_args+=("-DCMAKE_CUDA_COMPILER=$candidate")
      break
    fi
  done
fi

echo "build: configuring $build_dir"
cmake "${configure_args[@]}" "$@"
echo "build: building with $jobs jobs"
cmake --build "$build_dir" --parallel "$jobs"
