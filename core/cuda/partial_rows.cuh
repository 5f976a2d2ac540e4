#pragma once
// Column sums finished in a fixed order. Kernels that sum columns per block write one partial row
// per block, (parts, D) in S (f32, or f64 for f64 data); sum_partial_rows then adds each column's
// partial rows into a (D,) output in T. Up to three such sums go in one launch. No atomics, so a
// sum has the same bits on every run.
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"

namespace tandem::cuda {

// Up to three (partial rows, output) pairs, filled in order by add().
template <typename S, typename T>
struct PartialRowSums {
  const S* partial[3] = {};  // (parts, D) each
  T* out[3] = {};            // (D,) each
  int count = 0;

  void add(const S* p, T* o) {  // a null output is skipped
    if (o == nullptr) return;
    partial[count] = p;
    out[count] = o;
    ++count;
  }
};

// Block (32, kPartialRowThreads): 32 columns, each thread adding every 16th partial row in row
// order (unrolled, so that several loads are in flight: the sums are bound by load latency), then
// the threads' results in thread order. blockIdx.y picks the pair.
constexpr int kPartialRowThreads = 16;
template <typename S, typename T>
__global__ void sum_partial_rows(PartialRowSums<S, T> sums, int64_t parts, int64_t d) {
  dependent_kernel_begin();
  __shared__ S shared[kPartialRowThreads][32];
  // Selected, not indexed by blockIdx.y: an indexed parameter array is copied to local memory.
  const unsigned y = blockIdx.y;
  const S* partial = y == 0 ? sums.partial[0] : y == 1 ? sums.partial[1] : sums.partial[2];  // (parts, D)
  T* out = y == 0 ? sums.out[0] : y == 1 ? sums.out[1] : sums.out[2];                        // (D,)
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  S sum = 0;
  if (c < d) {
#pragma unroll 8
    for (int64_t p = threadIdx.y; p < parts; p += kPartialRowThreads) sum += partial[p * d + c];
  }
  shared[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= d) return;
  for (int i = 1; i < kPartialRowThreads; ++i) sum += shared[i][threadIdx.x];
  out[c] = cast_to<T>(sum);
}

// Every pair of `sums`, each of `parts` partial rows of d columns, on `stream`; nothing when empty.
template <typename S, typename T>
void launch_sum_partial_rows(const PartialRowSums<S, T>& sums, int64_t parts, int64_t d, cudaStream_t stream,
                             const char* what) {
  if (sums.count == 0 || d == 0) return;
  const dim3 grid(static_cast<unsigned>((d + 31) / 32), static_cast<unsigned>(sums.count));
  launch_dependent(sum_partial_rows<S, T>, grid, dim3(32, kPartialRowThreads), 0, stream, sums, parts, d);
  check_launch(what);
}

}  // namespace tandem::cuda
