// A linear layer's bias gradient, the column sums of its output's gradient, in one pass over that
// gradient: through GELU's (tanh form) backward where the layer had GELU, d_pre = dh * gelu'(pre)
// element by element as the elementwise kernel computes it (the same formula, so the same bits)
// and d_pre's column sums as rounded; else the column sums of the gradient as it is.
// Block (32, kWarps) covers 32 * V columns (each lane one 16-byte vector of V columns where the
// width and pointers allow) over a chunk of rows, its warps striding the chunk; each thread keeps
// its V column sums in registers, the block adds its warps' sums in warp order into one partial row
// (chunks, N), and sum_partial_rows adds those in order (inside a backward pass, in one launch with
// the others: core/column_sum_batch.h). The linear layers' backward takes this in place of
// cuBLASLt's bias-gradient epilogue (BGRADB), whose own kernel took longer than this one plus its
// share of the batched launch.
#include <algorithm>
#include <type_traits>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/loops.cuh"
#include "tandem/core/cuda/partial_rows.cuh"
#include "tandem/core/elementwise_ops.h"

namespace tandem::cuda {

namespace {
constexpr int kWarps = 8;  // warps per block, each taking every 8th row of the chunk
// Rows a warp loads before computing any: through GELU 2 (1024 x 4096 bf16 on an H200, that kernel
// alone: 8.50 us, against 8.94 loading one); plain sums, which load one vector a row, 8. A warp's
// last rows go in batches of half as many, and so on down to one, so that they too share round
// trips to memory.
template <bool Gelu>
constexpr int kRowsInFlight = Gelu ? 2 : 8;

template <typename T>
using sum_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
using GeluBackward = elementwise::UnaryBackward<UnaryOp::gelu_tanh, acc_t<T>>;

// Gelu: d_pre = gelu'(pre) * dh, stored, and summed; else dh summed (pre and d_pre unused).
template <typename T, int V, bool Gelu>
__global__ void __launch_bounds__(32 * kWarps)
    column_sums_kernel(const T* __restrict__ dh, const T* __restrict__ pre, T* __restrict__ d_pre,
                       sum_t<T>* __restrict__ partial, int64_t rows, int64_t n, int64_t rows_per_chunk) {
  dependent_kernel_begin();
  using S = sum_t<T>;
  const GeluBackward<T> gelu_backward{0, 0};
  __shared__ S sums[kWarps][32 * V];                                           // (warp, the block's columns)
  const int64_t vector = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;  // this lane's V columns
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = std::min(rows, begin + rows_per_chunk);
  S acc[V] = {};
  // The rows r, r + kWarps, ... of this warp, R loaded before any is computed (the column sums
  // still add them in row order).
  auto rows_from = [&](int64_t r, auto rows_in_flight) {
    constexpr int R = decltype(rows_in_flight)::value;
    Packed<T, V> g[R];
    [[maybe_unused]] Packed<T, V> x[Gelu ? R : 1];  // pre, through GELU only
#pragma unroll
    for (int q = 0; q < R; ++q) {
      g[q] = reinterpret_cast<const Packed<T, V>*>(dh + (r + q * kWarps) * n)[vector];
      if constexpr (Gelu) x[q] = reinterpret_cast<const Packed<T, V>*>(pre + (r + q * kWarps) * n)[vector];
    }
#pragma unroll
    for (int q = 0; q < R; ++q) {
      acc_t<T> v[V];  // 16-bit elements widened a 32-bit word at a time
      unpack(g[q], v);
      if constexpr (Gelu) {
        acc_t<T> pre_v[V];
        unpack(x[q], pre_v);
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = gelu_backward(v[k], pre_v[k]);
        const Packed<T, V> out = pack_rounded<T, V>(v);
        reinterpret_cast<Packed<T, V>*>(d_pre + (r + q * kWarps) * n)[vector] = out;
        unpack(out, v);  // what is summed is d_pre as stored
      }
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += static_cast<S>(v[k]);
    }
  };
  // This warp's rows from r on, R at a time while R remain; returns the first row left.
  auto in_batches = [&](int64_t r, auto rows_in_flight) {
    constexpr int R = decltype(rows_in_flight)::value;
    if constexpr (R <= kRowsInFlight<Gelu>) {
      for (; r + (R - 1) * kWarps < end; r += R * kWarps) rows_from(r, rows_in_flight);
    }
    return r;
  };
  if (vector < n / V) {
    int64_t r = begin + threadIdx.y;
    r = in_batches(r, std::integral_constant<int, 8>());
    r = in_batches(r, std::integral_constant<int, 4>());
    r = in_batches(r, std::integral_constant<int, 2>());
    in_batches(r, std::integral_constant<int, 1>());
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

// grad (rows, N) -> column_sum (N,); with pre, grad_pre = gelu'(pre) * grad is what is summed.
template <typename T>
void column_sums_typed(const Tensor& grad, const Tensor* pre, const Tensor* grad_pre, const Tensor& column_sum) {
  using S = sum_t<T>;
  const int64_t rows = grad.shape()[0], n = grad.shape()[1];
  if (n == 0) return;
  NvtxRange range(pre ? "gelu_backward_column_sums" : "column_sums");
  const int device = grad.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(grad);
  const T* pg = device_ptr<const T>(grad);                  // (rows, N)
  const T* px = pre ? device_ptr<const T>(*pre) : nullptr;  // (rows, N)
  T* po = grad_pre ? device_ptr<T>(*grad_pre) : nullptr;    // (rows, N)
  constexpr int kV = 16 / sizeof(T);
  const bool vectorised = n % kV == 0 && aligned16(pg) && (!px || aligned16(px)) && (!po || aligned16(po));
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
  auto kernel = pre ? (vectorised ? column_sums_kernel<T, kV, true> : column_sums_kernel<T, 1, true>)
                    : (vectorised ? column_sums_kernel<T, kV, false> : column_sums_kernel<T, 1, false>);
  launch_dependent(kernel, grid, dim3(32, kWarps), 0, stream, pg, px, po, pp, rows, n, rows_per_chunk);
  check_launch(pre ? "gelu_backward_column_sums" : "column_sums");
  PartialRowSums<S, T> sums;
  sums.add(partial, column_sum);
  sums.launch(device, stream);
}
}  // namespace

void gelu_backward_column_sums(const Tensor& grad, const Tensor& pre, const Tensor& grad_pre,
                               const Tensor& column_sum) {
  dispatch_floating(grad.dtype(), "gelu_backward_column_sums", "cuda",
                    [&](auto tag) { column_sums_typed<device_t<decltype(tag)>>(grad, &pre, &grad_pre, column_sum); });
}

void column_sums(const Tensor& grad, const Tensor& column_sum) {
  dispatch_floating(grad.dtype(), "column_sums", "cuda",
                    [&](auto tag) { column_sums_typed<device_t<decltype(tag)>>(grad, nullptr, nullptr, column_sum); });
}

void add_partial_rows(const Tensor& partial, const Tensor& column_sum) {
  TANDEM_CHECK(partial.dtype() == DType::f32 && partial.dim() == 2 && partial.is_contiguous() &&
                   column_sum.is_contiguous() && partial.shape()[1] == column_sum.numel(),
               "add_partial_rows: partial rows (parts, N) f32 and a contiguous (N,) output, got ",
               shape_str(partial.shape()), " ", dtype_name(partial.dtype()), " and ", shape_str(column_sum.shape()));
  dispatch_floating(column_sum.dtype(), "add_partial_rows", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    NvtxRange range("add_partial_rows");
    const int device = column_sum.device().index;
    DeviceGuard guard(device);
    PartialRowSums<float, T> sums;
    sums.add(partial, column_sum);
    sums.launch(device, stream_of(column_sum));
  });
}

}  // namespace tandem::cuda
