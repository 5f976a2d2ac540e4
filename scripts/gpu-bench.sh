#!/usr/bin/env bash
# On a GPU machine with build-gpu built (target train_step): the benchmark workloads in tandem and
# PyTorch (eager) in one call, on 1 GPU and data parallel on 2, and the side-by-side table: step
# time (median ms), tandem / PyTorch, scaling efficiency (1-GPU step / 2-GPU step at a fixed batch
# per GPU) and peak GPU memory. JSON per run under $OUT.
# Usage: scripts/gpu-bench.sh [workloads=mlp] [precisions=tf32,bf16]
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-logs}
mkdir -p "$out"
bin=$root/build-gpu/bench/train_step
ref=$root/bench/reference/train_step.py
workloads=mlp
precisions=tf32,bf16
for a in "$@"; do
  case $a in
    workloads=*) workloads=${a#workloads=} ;;
    precisions=*) precisions=${a#precisions=} ;;
  esac
done

for w in ${workloads//,/ }; do
  for p in ${precisions//,/ }; do
    tag=${w}_$p
    timeout 180 "$bin" --workload "$w" --precision "$p" --json "$out/tandem_${tag}_1.json" > "$out/tandem_${tag}_1.log" 2>&1 ||
      echo "tandem $tag 1 GPU FAILED"
    timeout 180 mpirun -np 2 --bind-to none "$bin" --workload "$w" --precision "$p" --json "$out/tandem_${tag}_2.json" \
      > "$out/tandem_${tag}_2.log" 2>&1 || echo "tandem $tag 2 GPUs FAILED"
    timeout 240 python3 "$ref" --workload "$w" --precision "$p" --json "$out/torch_${tag}_1.json" \
      > "$out/torch_${tag}_1.log" 2>&1 || echo "pytorch $tag 1 GPU FAILED"
    timeout 240 python3 -m torch.distributed.run --standalone --nproc_per_node 2 "$ref" --workload "$w" --precision "$p" \
      --json "$out/torch_${tag}_2.json" > "$out/torch_${tag}_2.log" 2>&1 || echo "pytorch $tag 2 GPUs FAILED"
  done
done

python3 - "$out" "$workloads" "$precisions" <<'PY'
import json, os, sys
out, workloads, precisions = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
def ms(j):
    return j["step_ms_median"] if j else float("nan")
def mb(j):
    return (j or {}).get("peak_memory_bytes", 0) / 1e6 if j and j.get("peak_memory_bytes") else float("nan")
print("workload prec  GPUs | tandem ms | pytorch ms | tandem/pytorch | scaling tandem | scaling pytorch | peak MB tandem | pytorch | hidden")
for w in workloads:
    for p in precisions:
        t1, t2 = load(f"tandem_{w}_{p}_1.json"), load(f"tandem_{w}_{p}_2.json")
        r1, r2 = load(f"torch_{w}_{p}_1.json"), load(f"torch_{w}_{p}_2.json")
        for n, t, r in ((1, t1, r1), (2, t2, r2)):
            st = ms(t1) / ms(t) if n == 2 else 1.0
            sr = ms(r1) / ms(r) if n == 2 else 1.0
            hidden = ((t or {}).get("ddp") or {}).get("hidden_fraction")
            hidden_text = f"{hidden:.2f}" if hidden is not None else "-"
            print(f"{w:8s} {p:5s} {n:4d} | {ms(t):9.3f} | {ms(r):10.3f} | {ms(t) / ms(r):14.2f} | {st:14.1%} | "
                  f"{sr:15.1%} | {mb(t):14.0f} | {mb(r):7.0f} | {hidden_text}")
PY
