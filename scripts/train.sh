#!/usr/bin/env bash
# The main job, in one command on a fresh Debian/Ubuntu machine: installs what is missing,
# builds, and trains on Fashion-MNIST with data-parallel ranks under mpirun: one rank per GPU
# when the machine has GPUs, else two ranks on the CPU through MPI.
#
# Usage: scripts/train.sh [fashion_mnist flags...]     (default: --model mlp --epochs 10)
#   e.g. scripts/train.sh --model cnn --epochs 15 --metrics cnn.json
#   TANDEM_RANKS      number of ranks (default: the number of GPUs nvidia-smi lists, or 2 without GPUs)
#   TANDEM_SKIP_DEPS  1: do not run scripts/install-deps.sh (a machine whose packages come another
#                     way, e.g. a cluster node without apt: CMake must find them by itself)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export TANDEM_BUILD_DIR="${TANDEM_BUILD_DIR:-$repo/build}"
# The GPUs this machine has (CUDA_VISIBLE_DEVICES narrows what the ranks see, not this count).
gpu_count() {
  command -v nvidia-smi >/dev/null || { echo 0; return; }
  nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
}
if [ -n "${TANDEM_RANKS:-}" ]; then
  ranks="$TANDEM_RANKS"
  case "$ranks" in ''|*[!0-9]*|0) echo "train: TANDEM_RANKS='$ranks': expected a whole number of at least 1" >&2; exit 2 ;; esac
else
  gpus="$(gpu_count)"
  if [ "$gpus" -gt 0 ]; then ranks="$gpus"; else ranks=2; fi
  echo "train: $ranks rank(s): $([ "$gpus" -gt 0 ] && echo "one per GPU" || echo "no GPU found, two on the CPU") (TANDEM_RANKS overrides)"
fi
if [ "${TANDEM_TRAIN_DRY_RUN:-0}" = 1 ]; then  # for tests: say the rank count and stop
  echo "ranks=$ranks"
  exit 0
fi

[ "${TANDEM_SKIP_DEPS:-0}" = 1 ] || "$repo/scripts/install-deps.sh"
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
