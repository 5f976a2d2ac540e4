#!/usr/bin/env bash
# On a machine with a GPU: build with CUDA for Hopper, run the whole test suite, run the CUDA
# tests under compute-sanitizer, and run the GPU benchmarks. Logs go to $OUT (default ./gpu-logs).
# Usage: scripts/gpu-check.sh [tests|sanitizer|bench|all]...   (default: all)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$root/gpu-logs}
mkdir -p "$out"
build=$root/build-gpu
steps=("${@:-all}")
want() { for s in "${steps[@]}"; do [[ $s == "$1" || $s == all ]] && return 0; done; return 1; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" > "$out/configure.log" 2>&1 ||
  { tail -30 "$out/configure.log"; exit 1; }
start=$(date +%s)
cmake --build "$build" -j "$(nproc)" > "$out/build.log" 2>&1 || { grep -E "error|FAILED" "$out/build.log" | head -40; exit 1; }
echo "build: $(( $(date +%s) - start )) s"

status=0
if want tests; then
  (cd "$build" && ctest --output-on-failure -j 8 > "$out/ctest.log" 2>&1) || status=1
  grep -E "tests passed|tests failed|Total Test time" "$out/ctest.log"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess)" "$out/ctest.log" | head -30 || true
fi
if want sanitizer; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$build/tests/cuda_tests" --gtest_filter='CudaParity.*' \
    > "$out/memcheck.log" 2>&1 || status=1
  grep -E "ERROR SUMMARY|PASSED|FAILED" "$out/memcheck.log" | tail -5
fi
if want bench && [ -x "$build/bench/gpu_kernels" ]; then
  "$build/bench/gpu_kernels" | tee "$out/bench_kernels.txt" || status=1
fi
exit $status
