#pragma once
// Column sums finished in a fixed order. Kernels that sum columns per block write one partial row
// per block, (parts, D) in S (f32, or f64 for f64 data); sum_partial_rows then adds each column's
// partial rows into a (D,) output in T. No atomics, so a sum has the same bits on every run. One
// launch takes any number of sums: inside a backward pass they wait in the pass's ColumnSumBatch
// (core/column_sum_batch.h) and go together.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "tandem/core/column_sum_batch.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"

namespace tandem::cuda {

// The sums of one launch, a kernel parameter: up to N of them. One backward kernel's (up to 3) go
// in a small table, a batch's in a large one (about 3.7 KB, under the 4 KB every device takes;
// GPT-2 124M's backward makes about a hundred). The large table costs launch time: one
// backward kernel's sums launched with it took 2.0 us a call in a replayed GPT-2 B1 T1024 step on
// an H200, where the launches before tables took 1.7.
constexpr int kSmallPartialSumTable = 3;
constexpr int kLargePartialSumTable = 128;

template <typename S, typename T, int N>
struct PartialSumTable {
  const S* partial[N];  // (parts[i], d[i]) each
  T* out[N];            // (d[i],) each
  int parts[N];         // 32 bits, to fit the table (launch_partial_sums checks)
  int d[N];
  // Sum i's blocks are first_block[i] .. first_block[i + 1] - 1, each taking partial_row_columns(
  // vectorised[i]) columns.
  unsigned first_block[N + 1];
  bool vectorised[N];  // a thread loads 16 bytes of a row (D a multiple of them, rows aligned)
  int count;
};
static_assert(sizeof(PartialSumTable<double, double, kLargePartialSumTable>) <= 4096,
              "a table fits in the 4 KB of kernel parameters every device takes");

// Block (32, kPartialRowThreads): 32 vectors of V columns of one sum, each thread adding every
// 16th partial row in row order (unrolled, so that several loads are in flight: the sums are bound
// by load latency), then the threads' results in thread order: the same order for every V, so the
// same bits. 16-byte loads (V = 4 in f32, 2 in f64) took the one launch that finishes GPT-2 B1
// T1024's backward sums from 23.4 us to 16.6 on an H200 (a replayed step's timeline; V = 1 before).
constexpr int kPartialRowThreads = 16;
template <typename S>
constexpr int kPartialRowVector = 16 / static_cast<int>(sizeof(S));
template <typename S>
constexpr int64_t partial_row_columns(bool vectorised) {
  return 32 * (vectorised ? kPartialRowVector<S> : 1);
}

// This block's 32 * V columns from `first`, of (parts, d) partial rows into out (d,). `shared`:
// (kPartialRowThreads, 32 * kPartialRowVector<S>) in S.
template <int V, typename S, typename T>
__device__ __forceinline__ void sum_partial_columns(const S* __restrict__ partial, T* __restrict__ out, int64_t parts,
                                                    int64_t d, int64_t first, S* shared) {
  const int64_t c = first + static_cast<int64_t>(threadIdx.x) * V;  // this thread's V columns (all exist if c < d)
  Packed<S, V> sum = {};
  if (c < d) {
#pragma unroll 8
    for (int64_t p = threadIdx.y; p < parts; p += kPartialRowThreads) {
      const Packed<S, V> row = *reinterpret_cast<const Packed<S, V>*>(partial + p * d + c);
#pragma unroll
      for (int k = 0; k < V; ++k) sum.v[k] += row.v[k];
    }
  }
  auto* mine = reinterpret_cast<Packed<S, V>*>(shared + threadIdx.y * 32 * kPartialRowVector<S>);  // this row's
  mine[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= d) return;
  for (int i = 1; i < kPartialRowThreads; ++i) {
    const Packed<S, V> other =
        reinterpret_cast<const Packed<S, V>*>(shared + i * 32 * kPartialRowVector<S>)[threadIdx.x];
#pragma unroll
    for (int k = 0; k < V; ++k) sum.v[k] += other.v[k];
  }
#pragma unroll
  for (int k = 0; k < V; ++k) out[c + k] = cast_to<T>(sum.v[k]);
}

// __grid_constant__: the table is indexed by a computed sum, which would otherwise copy it to
// local memory.
template <typename S, typename T, int N>
__global__ void sum_partial_rows(const __grid_constant__ PartialSumTable<S, T, N> table) {
  dependent_kernel_begin();
  __shared__ Packed<S, kPartialRowVector<S>> shared[kPartialRowThreads][32];
  // The sum this block works on: the last whose first block is at most blockIdx.x.
  int lo = 0, hi = table.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.first_block[mid] <= blockIdx.x)
      lo = mid;
    else
      hi = mid - 1;
  }
  const bool vectorised = table.vectorised[lo];
  const int64_t first = static_cast<int64_t>(blockIdx.x - table.first_block[lo]) * partial_row_columns<S>(vectorised);
  S* sums = reinterpret_cast<S*>(&shared[0][0]);
  if (vectorised) {
    sum_partial_columns<kPartialRowVector<S>>(table.partial[lo], table.out[lo], table.parts[lo], table.d[lo], first,
                                              sums);
  } else {
    sum_partial_columns<1>(table.partial[lo], table.out[lo], table.parts[lo], table.d[lo], first, sums);
  }
}

// Launches `sums` in tables of up to N.
template <typename S, typename T, int N>
void launch_partial_sums(const std::vector<ColumnSumBatch::Sum>& sums, int device, void* stream) {
  DeviceGuard guard(device);
  for (size_t first = 0; first < sums.size(); first += N) {
    PartialSumTable<S, T, N> table{};
    table.count = static_cast<int>(std::min<size_t>(N, sums.size() - first));
    unsigned blocks = 0;
    for (int i = 0; i < table.count; ++i) {
      const ColumnSumBatch::Sum& s = sums[first + i];
      table.partial[i] = static_cast<const S*>(s.partial);
      table.out[i] = static_cast<T*>(s.out);
      TANDEM_CHECK(s.parts <= INT_MAX && s.d <= INT_MAX, "sum_partial_rows: ", s.parts, " partial rows of ", s.d,
                   " columns: at most ", INT_MAX, " of each");
      table.parts[i] = static_cast<int>(s.parts);
      table.d[i] = static_cast<int>(s.d);
      table.vectorised[i] = s.d % kPartialRowVector<S> == 0 && reinterpret_cast<uintptr_t>(s.partial) % 16 == 0;
      table.first_block[i] = blocks;
      const int64_t columns = partial_row_columns<S>(table.vectorised[i]);
      blocks += static_cast<unsigned>((s.d + columns - 1) / columns);
    }
    table.first_block[table.count] = blocks;
    launch_dependent(sum_partial_rows<S, T, N>, dim3(blocks), dim3(32, kPartialRowThreads), 0,
                     static_cast<cudaStream_t>(stream), table);
    check_launch("sum_partial_rows");
  }
}

// The column sums of one backward kernel: each (partial rows, output) pair added launches now,
// or waits in the current ColumnSumBatch.
template <typename S, typename T>
class PartialRowSums {
 public:
  // partial: (parts, D) in S; out: (D,) in T, or undefined (then skipped).
  void add(const Tensor& partial, const Tensor& out) {
    if (!out.defined() || out.numel() == 0) return;
    ColumnSumBatch::Sum s;
    s.partial = partial.data_ptr();
    s.out = out.data_ptr();
    s.parts = partial.shape()[0];
    s.d = out.numel();
    s.out_bytes = static_cast<size_t>(out.numel()) * sizeof(T);
    sums_.push_back(s);
    partials_.push_back(partial);
  }

  // Launches the sums on `stream` of `device`, or hands them to the current batch.
  void launch(int device, cudaStream_t stream) const {
    if (sums_.empty()) return;
    if (ColumnSumBatch* batch = current_column_sum_batch()) {
      for (size_t i = 0; i < sums_.size(); ++i)
        batch->add(launch_partial_sums<S, T, kLargePartialSumTable>, device, stream, sums_[i], partials_[i]);
      return;
    }
    launch_partial_sums<S, T, kSmallPartialSumTable>(sums_, device, stream);
  }

 private:
  std::vector<ColumnSumBatch::Sum> sums_;
  std::vector<Tensor> partials_;
};

}  // namespace tandem::cuda
