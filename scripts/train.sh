#!/usr/bin/env bash
# The main job, in one command on a fresh Debian/Ubuntu machine: installs what is missing,
# builds, and trains on Fashion-MNIST with two data-parallel ranks under mpirun (on two GPUs
# when the machine has them, else on the CPU through MPI).
#
# Usage: scripts/train.sh [fashion_mnist flags...]     (default: --model mlp --epochs 10)
#   e.g. scripts/train.sh --model cnn --epochs 15 --metrics cnn.json
#   TANDEM_RANKS   number of ranks (default 2)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TANDEM_BUILD_DIR="${TANDEM_BUILD_DIR:-$repo/build}"
ranks="${TANDEM_RANKS:-2}"

"$repo/scripts/install-deps.sh"
"$repo/scripts/build.sh"
cmake --build "$TANDEM_BUILD_DIR" --target fashion_mnist

args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--model mlp --epochs 10)

mpi_flags=(--oversubscribe --bind-to none)
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# On the CPU each rank gets its share of the cores for its OpenMP threads.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / ranks > 0 ? $(nproc) / ranks : 1 ))}"
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
exec mpirun -np "$ranks" "${mpi_flags[@]}" "$TANDEM_BUILD_DIR/examples/fashion_mnist" "${args[@]}"
