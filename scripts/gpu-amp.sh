#!/usr/bin/env bash
# On a GPU machine, after scripts/gpu-check.sh has built build-gpu (targets fashion_mnist and
# train_step at least): the mixed-precision evidence.
#   1. Fashion-MNIST CNN, 15 epochs on one GPU, in f32, bf16 and fp16: final test accuracy.
#   2. The MLP benchmark step (bench/train_step, 1024 -> 4096 x4 -> 1024, batch 1024, AdamW) in
#      f32, tf32, bf16 and fp16, beside PyTorch eager (bench/reference/train_step.py) in one run.
# Logs and JSON go to $OUT; a table is printed last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-logs}
mkdir -p "$out"
build=$root/build-gpu
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(fashion mlp)
want() { for s in "${steps[@]}"; do [[ $s == "$1" ]] && return 0; done; return 1; }

if want fashion; then
  for precision in f32 bf16 fp16; do
    start=$(date +%s)
    timeout 300 "$build/examples/fashion_mnist" --model cnn --epochs 15 --log-every 0 --precision $precision \
      --metrics "$out/cnn_$precision.json" > "$out/cnn_$precision.log" 2>&1 || echo "cnn $precision FAILED"
    echo "cnn $precision $(( $(date +%s) - start )) s: $(grep '^epoch 15:' "$out/cnn_$precision.log")"
  done
fi

if want mlp; then
  for precision in f32 tf32 bf16 fp16; do
    timeout 120 "$build/bench/train_step" --workload mlp --precision $precision \
      --json "$out/mlp_tandem_$precision.json" > "$out/mlp_tandem_$precision.log" 2>&1 ||
      { echo "tandem mlp $precision FAILED"; tail -5 "$out/mlp_tandem_$precision.log"; }
    timeout 180 python3 "$root/bench/reference/train_step.py" --workload mlp --precision $precision \
      --json "$out/mlp_torch_$precision.json" > "$out/mlp_torch_$precision.log" 2>&1 ||
      { echo "pytorch mlp $precision FAILED"; tail -5 "$out/mlp_torch_$precision.log"; }
  done
  python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
print("MLP step (median ms)  precision | tandem | pytorch | tandem/pytorch | peak MB tandem | pytorch")
base = load("mlp_tandem_f32.json")
for p in ["f32", "tf32", "bf16", "fp16"]:
    t, r = load(f"mlp_tandem_{p}.json"), load(f"mlp_torch_{p}.json")
    tm = t["step_ms_median"] if t else float("nan")
    rm = r["step_ms_median"] if r else float("nan")
    tp = (t or {}).get("peak_memory_bytes") or 0
    rp = (r or {}).get("peak_memory_bytes") or 0
    print(f"  {p:5s} | {tm:7.3f} | {rm:7.3f} | {tm / rm:5.2f} | {tp / 1e6:8.0f} | {rp / 1e6:8.0f}")
if base and load("mlp_tandem_bf16.json"):
    print(f"tandem f32 / bf16 step time: {base['step_ms_median'] / load('mlp_tandem_bf16.json')['step_ms_median']:.2f}x")
PY
fi
