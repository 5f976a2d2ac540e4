#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu-check.sh has built build-gpu: Fashion-MNIST trainings on
# one GPU and, data-parallel, on two (MLP 10 epochs, CNN 15 epochs). Logs and metrics go to $OUT.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-logs}
bin=$root/build-gpu/examples/fashion_mnist
for model in mlp cnn; do
  epochs=$([ $model = mlp ] && echo 10 || echo 15)
  for np in 1 2; do
    start=$(date +%s)
    mpirun -np $np --bind-to none "$bin" --model $model --epochs $epochs --log-every 0 \
      --metrics "$out/${model}_gpu_np$np.json" > "$out/${model}_gpu_np$np.log" 2>&1 || echo "$model np$np FAILED"
    end=$(date +%s)
    last=$(grep "^epoch $epochs:" "$out/${model}_gpu_np$np.log")
    echo "$model np$np $((end - start)) s: $last"
  done
done
