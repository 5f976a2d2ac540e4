// GELU's (tanh form) backward together with the bias gradient of the linear layer it followed:
// d_pre = dh * gelu'(pre), element by element as the elementwise kernel computes it (the same
// formula, so the same bits), and d_pre's column sums as rounded, in one pass over dh and pre.
// Block (32, kWarps) covers 32 * V columns (each lane one 16-byte vector of V columns where the
// width and pointers allow) over a chunk of rows, its warps striding the chunk; each thread keeps
// its V column sums in registers, the block adds its warps' sums in warp order into one partial row
// (chunks, N), and sum_partial_rows adds those in order. The linear layers' backward takes this in
// place of GELU's backward kernel plus cuBLASLt's separate bias-gradient (BGRADB) kernel.
#include <algorithm>
#include <type_traits>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/loops.cuh"
#include "tandem/core/cuda/partial_rows.cuh"
#include "tandem/core/elementwise_ops.h"

namespace tandem::cuda {

namespace {
constexpr int kWarps = 8;         // warps per block, each taking every 8th row of the chunk
constexpr int kRowsInFlight = 2;  // rows a warp loads before computing any (1024 x 4096 bf16 on an
                                  // H200, this kernel alone: 8.50 us, against 8.94 loading one)

template <typename T>
using sum_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
using GeluBackward = elementwise::UnaryBackward<UnaryOp::gelu_tanh, acc_t<T>>;

template <typename T, int V>
__global__ void __launch_bounds__(32 * kWarps)
    gelu_backward_column_sums_kernel(const T* __restrict__ dh, const T* __restrict__ pre, T* __restrict__ d_pre,
                                     sum_t<T>* __restrict__ partial, int64_t rows, int64_t n, int64_t rows_per_chunk) {
  dependent_kernel_begin();
  using S = sum_t<T>;
  const GeluBackward<T> gelu_backward{0, 0};
  __shared__ S sums[kWarps][32 * V];                                           // (warp, the block's columns)
  const int64_t vector = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;  // this lane's V columns
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = std::min(rows, begin + rows_per_chunk);
  S acc[V] = {};
  // The rows r, r + kWarps, ... of this warp, kRowsInFlight loaded before any is computed (the
  // column sums still add them in row order).
  auto rows_from = [&](int64_t r, auto rows_in_flight) {
    constexpr int R = decltype(rows_in_flight)::value;
    Packed<T, V> g[R], x[R];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      g[q] = reinterpret_cast<const Packed<T, V>*>(dh + (r + q * kWarps) * n)[vector];
      x[q] = reinterpret_cast<const Packed<T, V>*>(pre + (r + q * kWarps) * n)[vector];
    }
#pragma unroll
    for (int q = 0; q < R; ++q) {
      Packed<T, V> out;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        out.v[k] = cast_to<T>(gelu_backward(to_acc(g[q].v[k]), to_acc(x[q].v[k])));
        acc[k] += static_cast<S>(to_acc(out.v[k]));
      }
      reinterpret_cast<Packed<T, V>*>(d_pre + (r + q * kWarps) * n)[vector] = out;
    }
  };
  if (vector < n / V) {
    int64_t r = begin + threadIdx.y;
    for (; r + (kRowsInFlight - 1) * kWarps < end; r += kRowsInFlight * kWarps) {
      rows_from(r, std::integral_constant<int, kRowsInFlight>());
    }
    for (; r < end; r += kWarps) rows_from(r, std::integral_constant<int, 1>());
  }
#pragma unroll
  for (int k = 0; k < V; ++k) sums[threadIdx.y][threadIdx.x * V + k] = acc[k];
  __syncthreads();
  for (int c = threadIdx.y * 32 + threadIdx.x; c < 32 * V; c += 32 * kWarps) {
    const int64_t column = static_cast<int64_t>(blockIdx.x) * 32 * V + c;
    if (column >= n) continue;
    S total = 0;
    for (int w = 0; w < kWarps; ++w) total += sums[w][c];
    partial[static_cast<int64_t>(blockIdx.y) * n + column] = total;
  }
}

template <typename T>
void gelu_backward_column_sums_typed(const Tensor& grad, const Tensor& pre, const Tensor& grad_pre,
                                     const Tensor& column_sum) {
  using S = sum_t<T>;
  const int64_t rows = grad.shape()[0], n = grad.shape()[1];
  if (n == 0) return;
  NvtxRange range("gelu_backward_column_sums");
  const int device = grad.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(grad);
  const T* pg = device_ptr<const T>(grad);  // (rows, N)
  const T* px = device_ptr<const T>(pre);   // (rows, N)
  T* po = device_ptr<T>(grad_pre);          // (rows, N)
  constexpr int kV = 16 / sizeof(T);
  const bool vectorised = n % kV == 0 && aligned16(pg) && aligned16(px) && aligned16(po);
  const int v = vectorised ? kV : 1;
  // About four blocks per SM: blocks of 32 * v columns, times chunks of rows.
  const int64_t column_blocks = (n + 32 * v - 1) / (32 * v);
  const int64_t wanted_chunks = std::max<int64_t>(1, 4 * multiprocessors(device) / column_blocks);
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(wanted_chunks, (rows + kWarps - 1) / kWarps));
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  Tensor partial = empty({chunks, n}, TensorOptions(std::is_same_v<S, double> ? DType::f64 : DType::f32,
                                                    grad.device()));  // (chunks, N)
  S* pp = device_ptr<S>(partial);
  const dim3 grid(static_cast<unsigned>(column_blocks), static_cast<unsigned>(chunks));
  auto kernel = vectorised ? gelu_backward_column_sums_kernel<T, kV> : gelu_backward_column_sums_kernel<T, 1>;
  launch_dependent(kernel, grid, dim3(32, kWarps), 0, stream, pg, px, po, pp, rows, n, rows_per_chunk);
  check_launch("gelu_backward_column_sums");
  PartialRowSums<S, T> sums;
  sums.add(partial, column_sum);
  sums.launch(device, stream);
}
}  // namespace

void gelu_backward_column_sums(const Tensor& grad, const Tensor& pre, const Tensor& grad_pre,
                               const Tensor& column_sum) {
  dispatch_floating(grad.dtype(), "gelu_backward_column_sums", "cuda", [&](auto tag) {
    gelu_backward_column_sums_typed<device_t<decltype(tag)>>(grad, pre, grad_pre, column_sum);
  });
}

}  // namespace tandem::cuda
