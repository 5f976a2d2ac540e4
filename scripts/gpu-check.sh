#!/usr/bin/env bash
# On a machine with a GPU: build with CUDA for Hopper, run the test suites, the CUDA tests under
# compute-sanitizer, and the GPU benchmarks beside PyTorch. Logs go to $OUT (default ./gpu-logs).
# Usage: scripts/gpu-check.sh [tests] [suites] [sanitizer] [bench] [targets=a,b,...]
#   tests: the whole ctest suite; suites: only the GPU-relevant executables (cuda, optim, the
#   distributed tests and the rank-kill check under mpirun -np 2, the safetensors interop check),
#   for a build of just their targets. Default: tests, sanitizer and bench.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-logs}
mkdir -p "$out"
build=$root/build-gpu
steps=()
targets=()
for a in "$@"; do
  case $a in
    targets=*) IFS=, read -r -a targets <<< "${a#targets=}" ;;
    *) steps+=("$a") ;;
  esac
done
[ ${#steps[@]} -eq 0 ] && steps=(all)
want() { for s in "${steps[@]}"; do [[ $s == "$1" || ($s == all && $1 != suites) ]] && return 0; done; return 1; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" > "$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
start=$(date +%s)
target_args=()
for t in "${targets[@]}"; do target_args+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${target_args[@]}" > "$out/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

status=0
if want tests; then
  (cd "$build" && ctest --output-on-failure -j "${CTEST_JOBS:-4}" --timeout 600 > "$out/ctest.log" 2>&1) || status=1
  grep -E "tests passed|tests failed|Total Test time" "$out/ctest.log"
  grep -E "\((Failed|Timeout|SEGFAULT|Subprocess|Not Run)" "$out/ctest.log" | head -30
fi
if want suites; then
  t=$build/tests
  for suite in cuda_tests optim_tests; do
    timeout 600 "$t/$suite" --gtest_color=no > "$out/$suite.log" 2>&1 || status=1
    echo "$suite: $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/$suite.log" | head -2 | tr '\n' ' ')"
  done
  TANDEM_DIST_TIMEOUT=120 timeout 600 mpirun -np 2 --bind-to none "$t/dist_tests" --gtest_color=no \
    > "$out/dist_tests_np2.log" 2>&1 ||
    status=1
  echo "dist_tests np2: $(grep -cE '^\[  PASSED  \]' "$out/dist_tests_np2.log") ranks passed; $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/dist_tests_np2.log" | head -2 | tr '\n' ' ')"
  TANDEM_FAULT_ON_GPU=1 bash "$root/tests/dist/kill_rank_test.sh" mpirun -np "$t/dist_fault_worker" --bind-to none \
    > "$out/kill_rank.log" 2>&1 ||
    status=1
  grep -E "kill_rank_test \(" "$out/kill_rank.log"
  python3 "$root/tests/interop/safetensors_interop.py" "$t/safetensors_interop" "$out/interop" > "$out/interop.log" 2>&1 ||
    status=1
  tail -1 "$out/interop.log"
fi
if want sanitizer; then
  timeout 900 compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/cuda_tests" \
    --gtest_filter='CudaParity.*' > "$out/memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | tail -5
fi
if want bench && [ -x "$build/bench/gpu_kernels" ]; then
  python3 "$root/bench/compare_kernels.py" "$build" --json "$out/kernels.json" | tee "$out/kernels.txt" || status=1
fi
exit $status
