#!/usr/bin/env bash
# scripts/train.sh's rank count: one per GPU that nvidia-smi lists, two on the CPU without GPUs,
# TANDEM_RANKS above both (and checked). A stand-in nvidia-smi on PATH plays the machine.
set -euo pipefail
script="$1"
fake="$(mktemp -d)"
trap 'rm -rf "$fake"' EXIT
fails=0

ranks_with() {  # ranks_with <gpu lines> [env...]: the rank count train.sh would start
  local gpus="$1"; shift
  printf '#!/bin/sh\n[ "$1" = -L ] || exit 1\nprintf "%b"\n' "$gpus" > "$fake/nvidia-smi"
  chmod +x "$fake/nvidia-smi"
  env "$@" PATH="$fake:$PATH" TANDEM_TRAIN_DRY_RUN=1 bash "$script" | sed -n 's/^ranks=//p'
}
expect() {
  if [ "$2" = "$3" ]; then echo "ok: $1: $2 ranks"; else echo "FAIL: $1: $2 ranks, expected $3"; fails=1; fi
}

expect "one GPU" "$(ranks_with 'GPU 0: NVIDIA H100 (UUID: GPU-1)\n')" 1
expect "four GPUs" "$(ranks_with 'GPU 0: a\nGPU 1: b\nGPU 2: c\nGPU 3: d\n')" 4
expect "no GPU" "$(ranks_with '')" 2
expect "TANDEM_RANKS=3 on one GPU" "$(ranks_with 'GPU 0: a\n' TANDEM_RANKS=3)" 3
if out="$(ranks_with '' TANDEM_RANKS=abc 2>&1)"; then
  echo "FAIL: TANDEM_RANKS=abc was accepted"; fails=1
else
  echo "ok: TANDEM_RANKS=abc refused"
fi
exit "$fails"
