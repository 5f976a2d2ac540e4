#!/usr/bin/env bash
# On a GPU machine with build-gpu built (target train_step): the benchmark workloads in tandem and
# PyTorch in one call, on 1 GPU and data parallel on N, and the side-by-side table: step time
# (median ms), tandem / PyTorch, scaling efficiency (1-GPU step / N-GPU step at a fixed batch per
# GPU) and peak GPU memory. PyTorch runs eager, and with torch.compile on 1 GPU when compile=1.
# JSON and logs per run under $OUT; the table is printed last and saved as $OUT/bench_table.txt.
# channels_last=1 runs resnet18 channels-last (NHWC) in both, --channels-last to each program
# (the other workloads have no convolutions and run as they are).
# Usage: scripts/gpu-bench.sh [workloads=mlp,gpt2,resnet18] [precisions=tf32,bf16] [gpus=1,2] [compile=1]
#                             [channels_last=1]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-logs}
mkdir -p "$out"
bin=$root/build-gpu/bench/train_step
ref=$root/bench/reference/train_step.py
workloads=mlp,gpt2,resnet18
precisions=tf32,bf16
gpus=1,2
compile=0
channels_last=0
for a in "$@"; do
  case $a in
    workloads=*) workloads=${a#workloads=} ;;
    precisions=*) precisions=${a#precisions=} ;;
    gpus=*) gpus=${a#gpus=} ;;
    compile=*) compile=${a#compile=} ;;
    channels_last=*) channels_last=${a#channels_last=} ;;
    *) echo "gpu-bench: unknown argument '$a'" >&2; exit 2 ;;
  esac
done

for w in ${workloads//,/ }; do
  layout=()  # the memory-format flag, for the workload it applies to
  if [ "$channels_last" = 1 ] && [ "$w" = resnet18 ]; then layout=(--channels-last); fi
  for p in ${precisions//,/ }; do
    tag=${w}_$p
    for n in ${gpus//,/ }; do
      if [ "$n" = 1 ]; then
        timeout 240 "$bin" --workload "$w" --precision "$p" "${layout[@]}" --json "$out/tandem_${tag}_1.json" \
          > "$out/tandem_${tag}_1.log" 2>&1 || echo "tandem $tag 1 GPU FAILED"
        timeout 300 python3 "$ref" --workload "$w" --precision "$p" "${layout[@]}" --json "$out/torch_${tag}_1.json" \
          > "$out/torch_${tag}_1.log" 2>&1 || echo "pytorch $tag 1 GPU FAILED"
        if [ "$compile" = 1 ]; then
          timeout 400 python3 "$ref" --workload "$w" --precision "$p" "${layout[@]}" --compile --json "$out/compiled_${tag}_1.json" \
            > "$out/compiled_${tag}_1.log" 2>&1 || echo "pytorch compiled $tag 1 GPU FAILED"
        fi
      else
        timeout 240 mpirun -np "$n" --bind-to none "$bin" --workload "$w" --precision "$p" "${layout[@]}" \
          --json "$out/tandem_${tag}_$n.json" > "$out/tandem_${tag}_$n.log" 2>&1 || echo "tandem $tag $n GPUs FAILED"
        timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node "$n" "$ref" --workload "$w" \
          --precision "$p" "${layout[@]}" --json "$out/torch_${tag}_$n.json" > "$out/torch_${tag}_$n.log" 2>&1 ||
          echo "pytorch $tag $n GPUs FAILED"
      fi
    done
  done
done

python3 - "$out" "$workloads" "$precisions" "$gpus" <<'PY' | tee "$out/bench_table.txt"
import json, os, sys
out, workloads, precisions = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
gpus = [int(n) for n in sys.argv[4].split(",")]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def ms(j):
    return j["step_ms_median"] if j else float("nan")
def mb(j):
    return j["peak_memory_bytes"] / 2**20 if j and j.get("peak_memory_bytes") else float("nan")
print("workload prec  GPUs | tandem ms | pytorch ms | compiled ms | tandem/pytorch | scaling tandem | scaling pytorch"
      " | peak MiB tandem | pytorch | hidden comm")
for w in workloads:
    for p in precisions:
        t1, r1 = load(f"tandem_{w}_{p}_1.json"), load(f"torch_{w}_{p}_1.json")
        for n in gpus:
            t, r = load(f"tandem_{w}_{p}_{n}.json"), load(f"torch_{w}_{p}_{n}.json")
            c = load(f"compiled_{w}_{p}_{n}.json")
            hidden = ((t or {}).get("ddp") or {}).get("hidden_fraction")
            hidden_text = f"{hidden:.2f}" if hidden is not None else "-"
            print(f"{w:8s} {p:5s} {n:4d} | {ms(t):9.3f} | {ms(r):10.3f} | {ms(c):11.3f} | {ms(t) / ms(r):14.2f} | "
                  f"{ms(t1) / ms(t):14.1%} | {ms(r1) / ms(r):15.1%} | {mb(t):15.0f} | {mb(r):7.0f} | {hidden_text}")
PY
