#!/usr/bin/env bash
# On one GPU: the step profiles the scaling model needs, each taken with the code that produced
# the runs it explains, then the model's calibration and validation (bench/scaling_model).
#   1. this checkout: train_step --profile for mlp, gpt2, resnet18 in bf16 and tf32; the bf16 ones
#      replace docs/scaling/profiles/<workload>_bf16.json (what --predict and --curves use);
#   2. the commit of the measured runs in docs/scaling/measured_runs.json (default f5a8258, which
#      has no --profile): built beside this checkout, its train_step --trace on one GPU, turned into
#      docs/scaling/profiles/<workload>_<precision>_<commit>.json by bench/trace_to_profile.py with
#      the gradient order and shape of step 1's profile;
#   3. scaling_model --calibrate, --validate and --curves, and the plot.
# Logs and raw files go to $OUT/scaling (default ./gpu-logs/scaling).
# Usage: scripts/gpu-scaling-profiles.sh [commit=f5a8258] [steps=30] [old_src=DIR] [head=SHA]
#   old_src: the old commit's sources already extracted (where the checkout has no .git:
#   `mkdir old-src && git archive f5a8258 | tar -x -C old-src` before copying the tree over);
#   head: this checkout's commit, where git cannot say it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-logs}/scaling
old=f5a8258
steps=30
old_src=""
head_commit=""
for a in "$@"; do
  case $a in
    commit=*) old=${a#commit=} ;;
    steps=*) steps=${a#steps=} ;;
    old_src=*) old_src=$(cd "${a#old_src=}" && pwd) ;;
    head=*) head_commit=${a#head=} ;;
    *) echo "gpu-scaling-profiles: unknown argument '$a' (expected commit=SHA, steps=N, old_src=DIR or head=SHA)" >&2
       exit 2 ;;
  esac
done
mkdir -p "$out"
profiles=$root/docs/scaling/profiles
nvcc_path=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)

build() {  # build <source dir> <build dir> <extra configure argument> <targets...>
  local src=$1 dir=$2 extra=$3
  shift 3
  cmake -S "$src" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 $extra \
    -DCMAKE_CUDA_COMPILER="$nvcc_path" > "$out/configure-$(basename "$src").log" 2>&1 ||
    { tail -30 "$out/configure-$(basename "$src").log"; exit 1; }
  local args=()
  for t in "$@"; do args+=(--target "$t"); done
  cmake --build "$dir" -j "$(( $(nproc) / 2 + 1 ))" "${args[@]}" > "$out/build-$(basename "$src").log" 2>&1 ||
    { grep -E "error|FAILED" "$out/build-$(basename "$src").log" | head -40; exit 1; }
}

# Both builds at once, before anything is timed (a busy host slows the short steps down).
start=$(date +%s)
[ -n "$head_commit" ] || head_commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null) ||
  { echo "gpu-scaling-profiles: no git here; give head=SHA" >&2; exit 2; }
if [ -z "$old_src" ]; then
  old_src=$out/src-$old
  [ -d "$old_src" ] || git -C "$root" worktree add --detach "$old_src" "$old" > /dev/null
fi
[ -e "$root/.deps" ] && [ ! -e "$old_src/.deps" ] && ln -s "$root/.deps" "$old_src/.deps"
(export TANDEM_SOURCE_COMMIT=$head_commit; build "$root" "$root/build-gpu" "" train_step scaling_model) &
head_build=$!
(unset TANDEM_SOURCE_COMMIT; build "$old_src" "$old_src/build-gpu" "" train_step) &
old_build=$!
wait $head_build || exit 1
wait $old_build || exit 1
echo "built $head_commit and $old: $(( $(date +%s) - start )) s"

for w in mlp gpt2 resnet18; do
  for p in bf16 tf32; do
    "$root/build-gpu/bench/train_step" --workload $w --precision $p --warmup 10 --steps "$steps" \
      --profile "$out/${w}_${p}_$head_commit.json" > "$out/profile_${w}_$p.log" 2>&1 ||
      { tail -5 "$out/profile_${w}_$p.log"; exit 1; }
    tail -1 "$out/profile_${w}_$p.log" | python3 -c "import json,sys; r=json.load(sys.stdin); print('$head_commit $w $p', round(r['step_ms_median'], 3), 'ms')"
  done
  cp "$out/${w}_bf16_$head_commit.json" "$profiles/${w}_bf16.json"
done

for w in mlp gpt2 resnet18; do
  for p in bf16 tf32; do
    "$old_src/build-gpu/bench/train_step" --workload $w --precision $p --warmup 10 --steps "$steps" \
      --json "$out/${w}_${p}_$old.json" --trace "$out/${w}_${p}_${old}_trace.json" > "$out/trace_${w}_$p.log" 2>&1 ||
      { tail -5 "$out/trace_${w}_$p.log"; exit 1; }
    step=$(python3 -c "import json; print(json.load(open('$out/${w}_${p}_$old.json'))['step_ms_median'])")
    python3 "$root/bench/trace_to_profile.py" "$out/${w}_${p}_${old}_trace.json" --shape "$out/${w}_${p}_$head_commit.json" \
      --commit "$old" --step-ms "$step" --out "$profiles/${w}_${p}_$old.json" \
      --source "train_step --trace at $old on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F); gradient shape from train_step --profile at $head_commit"
  done
done

scaling=$root/build-gpu/bench/scaling_model
"$scaling" --calibrate | tee "$out/calibrate.txt"
"$scaling" --validate | tee "$out/validate.txt"
"$scaling" --curves "$out/curves.json" > /dev/null
python3 "$root/bench/scaling_plot.py" "$out/curves.json" --out "$root/docs/scaling/predicted_curves.png" || true
echo "total: $(( $(date +%s) - start )) s; profiles in docs/scaling/profiles, logs in $out"
