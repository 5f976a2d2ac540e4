// CUDA batch norm over channels-last x: (N, C, H, W) sizes with strides (H*W*C, 1, W*C, C), i.e.
// an (M, C) row-major matrix of M = N * H * W pixels, the channel innermost. The statistics are
// those of batch_norm.cu (shifted sums, K = the channel's value in the first pixel), with the
// same fused residual add and ReLU.
//
// A block is (TX, TY) threads: TX along C, each owning V adjacent channels (one 16-byte packet),
// TY pixels at a time, so a warp reads whole rows with coalesced 16-byte loads. The reductions
// run in three fixed-order steps: each thread sums its pixels, a block adds its TY threads in a
// tree and writes per-channel f32 partials (splits, C, 2), and a second kernel adds a channel's
// partials, again in a fixed tree; the results are the same bits on every run. The elementwise
// passes keep each thread's channel constants in registers and stride over pixels.
#include "tandem/core/cuda/batch_norm.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"

namespace tandem::cuda {

namespace {

using namespace batch_norm_detail;

// How a row of C channels is covered: TX threads of V channels (TX a power of two up to 32, no
// wider than the row needs), TY = kThreads / TX rows per step, and enough tiles along C.
struct Tiling {
  unsigned tx, ty;
  int64_t channel_tiles;
};

Tiling tiling(int64_t channels, int v) {
  const int64_t packets = (channels + v - 1) / v;
  unsigned tx = 1;
  while (tx < 32 && tx < packets) tx *= 2;
  return Tiling{tx, kThreads / tx, (packets + tx - 1) / tx};
}

// First channel of this thread's packet.
__device__ __forceinline__ int64_t first_channel(int v) {
  return (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * v;
}

// Adds a[k], b[k] over the block's TY rows of threads (a power of two) in a fixed tree; the sums
// are valid in the threads of row threadIdx.y == 0.
template <typename S, int V>
__device__ void column_sum2(S (&a)[V], S (&b)[V]) {
  __shared__ S shared[2][kThreads * V];
  const unsigned self = (threadIdx.y * blockDim.x + threadIdx.x) * V;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    shared[0][self + k] = a[k];
    shared[1][self + k] = b[k];
  }
  __syncthreads();
  for (unsigned half = blockDim.y / 2; half > 0; half >>= 1) {
    if (threadIdx.y < half) {
      const unsigned other = self + half * blockDim.x * V;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        shared[0][self + k] += shared[0][other + k];
        shared[1][self + k] += shared[1][other + k];
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    a[k] = shared[0][self + k];
    b[k] = shared[1][self + k];
  }
}

// partial[split][c] = per channel, over the split's rows [split * rows_per_split, ...):
//   statistics (kGrads false): (sum(x - K), sum((x - K)^2)), K = x[row 0][c];
//   gradients (kGrads true): (sum(dy), sum(dy * (x - mean))), dy masked by ReLU's output y if not null.
template <typename T, int V, bool kGrads>
__global__ void __launch_bounds__(kThreads)
    nhwc_partial_sums(const T* __restrict__ x, const T* __restrict__ grad_out, const T* __restrict__ y,
                      const stat_t<acc_t<T>>* __restrict__ mean, stat_t<acc_t<T>>* __restrict__ partial, int64_t rows,
                      int64_t channels, int64_t rows_per_split) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int64_t c0 = first_channel(V);
  const bool active = c0 < channels;  // C % V == 0 when V > 1: a packet is all in or all out
  S a[V], b[V], ref[V];
#pragma unroll
  for (int k = 0; k < V; ++k) a[k] = b[k] = ref[k] = S(0);
  if (active) {
    if constexpr (kGrads) {
#pragma unroll
      for (int k = 0; k < V; ++k) ref[k] = mean[c0 + k];
    } else {
      const Packed<T, V> first = load_packed<T, V>(x, c0 / V);
#pragma unroll
      for (int k = 0; k < V; ++k) ref[k] = static_cast<S>(to_acc(first.v[k]));
    }
    const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_split;
    const int64_t r1 = r0 + rows_per_split < rows ? r0 + rows_per_split : rows;
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const int64_t packet = (r * channels + c0) / V;
      const Packed<T, V> v = load_packed<T, V>(x, packet);
      if constexpr (kGrads) {
        const Packed<T, V> g = load_packed<T, V>(grad_out, packet);
        Packed<T, V> out{};
        if (y) out = load_packed<T, V>(y, packet);
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const S dy = masked_grad<T>(g.v[k], out.v[k], y != nullptr);
          a[k] += dy;
          b[k] = fma(dy, static_cast<S>(to_acc(v.v[k])) - ref[k], b[k]);
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const S d = static_cast<S>(to_acc(v.v[k])) - ref[k];
          a[k] += d;
          b[k] += d * d;
        }
      }
    }
  }
  column_sum2<S, V>(a, b);
  if (threadIdx.y == 0 && active) {
#pragma unroll
    for (int k = 0; k < V; ++k) {
      S* slot = partial + (static_cast<int64_t>(blockIdx.x) * channels + c0 + k) * 2;
      slot[0] = a[k];
      slot[1] = b[k];
    }
  }
}

constexpr unsigned kFinishX = 32, kFinishY = 8;

// Channel c's partials (splits, C, 2) added in a fixed tree over the block's kFinishY rows of
// threads; valid in row threadIdx.y == 0.
template <typename S>
__device__ void add_partials(const S* __restrict__ partial, int64_t splits, int64_t channels, int64_t c, S& a, S& b) {
  __shared__ S shared[2][kFinishY][kFinishX];
  a = S(0);
  b = S(0);
  if (c < channels) {
    for (int64_t s = threadIdx.y; s < splits; s += kFinishY) {
      a += partial[(s * channels + c) * 2];
      b += partial[(s * channels + c) * 2 + 1];
    }
  }
  shared[0][threadIdx.y][threadIdx.x] = a;
  shared[1][threadIdx.y][threadIdx.x] = b;
  __syncthreads();
  for (unsigned half = kFinishY / 2; half > 0; half >>= 1) {
    if (threadIdx.y < half) {
      shared[0][threadIdx.y][threadIdx.x] += shared[0][threadIdx.y + half][threadIdx.x];
      shared[1][threadIdx.y][threadIdx.x] += shared[1][threadIdx.y + half][threadIdx.x];
    }
    __syncthreads();
  }
  a = shared[0][0][threadIdx.x];
  b = shared[1][0][threadIdx.x];
}

template <typename T>
__global__ void __launch_bounds__(kFinishX* kFinishY)
    nhwc_finalize_stats(const T* __restrict__ x, const stat_t<acc_t<T>>* __restrict__ partial, int64_t splits,
                        int64_t channels, int64_t m, double momentum, double eps, stat_t<acc_t<T>>* running_mean,
                        stat_t<acc_t<T>>* running_var, stat_t<acc_t<T>>* save_mean, stat_t<acc_t<T>>* save_invstd) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFinishX + threadIdx.x;
  S sum, sum_sq;
  add_partials<S>(partial, splits, channels, c, sum, sum_sq);
  if (threadIdx.y != 0 || c >= channels) return;
  finish_stats<S>(sum, sum_sq, static_cast<S>(to_acc(x[c])), m, momentum, eps, running_mean + c, running_var + c,
                  save_mean + c, save_invstd + c);
}

// grad_bias = sum(dy), grad_weight = sum(dy * xhat).
template <typename S>
__global__ void __launch_bounds__(kFinishX* kFinishY)
    nhwc_finalize_grads(const S* __restrict__ partial, int64_t splits, int64_t channels, const S* __restrict__ invstd,
                        S* __restrict__ grad_weight, S* __restrict__ grad_bias) {
  dependent_kernel_begin();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kFinishX + threadIdx.x;
  S sum_dy, sum_dy_xmu;
  add_partials<S>(partial, splits, channels, c, sum_dy, sum_dy_xmu);
  if (threadIdx.y != 0 || c >= channels) return;
  grad_bias[c] = sum_dy;
  grad_weight[c] = sum_dy_xmu * invstd[c];
}

// out = relu((x - mean) * invstd * weight + bias [+ residual]) per channel; residual may be null.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    nhwc_apply(const T* __restrict__ x, const T* __restrict__ residual, bool relu, T* __restrict__ out,
               const stat_t<acc_t<T>>* __restrict__ mean, const stat_t<acc_t<T>>* __restrict__ invstd,
               const stat_t<acc_t<T>>* __restrict__ weight, const stat_t<acc_t<T>>* __restrict__ bias, int64_t rows,
               int64_t channels) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int64_t c0 = first_channel(V);
  if (c0 >= channels) return;
  S scale[V], shift[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    scale[k] = invstd[c0 + k] * weight[c0 + k];  // as batch_norm.cu's apply computes them
    shift[k] = fma(-mean[c0 + k], scale[k], bias[c0 + k]);
  }
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    apply_packet<T, V>(x, residual, relu, out, (r * channels + c0) / V,
                       [&](int k) { return std::pair<S, S>(scale[k], shift[k]); });
  }
}

// dx = weight * invstd * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M), dy masked by ReLU's
// output y if not null; grad_residual (if not null) = the masked dy.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    nhwc_backward_apply(const T* __restrict__ grad_out, const T* __restrict__ x, const T* __restrict__ y,
                        T* __restrict__ grad_x, T* __restrict__ grad_residual,
                        const stat_t<acc_t<T>>* __restrict__ mean, const stat_t<acc_t<T>>* __restrict__ invstd,
                        const stat_t<acc_t<T>>* __restrict__ weight, const stat_t<acc_t<T>>* __restrict__ grad_weight,
                        const stat_t<acc_t<T>>* __restrict__ grad_bias, int64_t rows, int64_t channels) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int64_t c0 = first_channel(V);
  if (c0 >= channels) return;
  const int64_t m = rows;
  BackwardCoefficients<S> coef[V];
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const int64_t c = c0 + k;
    coef[k] = backward_coefficients<S>(weight[c], invstd[c], mean[c], grad_weight[c], grad_bias[c], m);
  }
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.y) {
    backward_packet<T, V>(grad_out, x, y, grad_x, grad_residual, (r * channels + c0) / V,
                          [&](int k) -> BackwardCoefficients<S> { return coef[k]; });
  }
}

// The reduction's row splits: about 8 blocks per multiprocessor in all, each thread summing at
// least 8 rows.
struct Splits {
  int64_t count, rows_per_split;
};
Splits split_rows(int64_t rows, const Tiling& t, int device) {
  const int64_t wanted = std::max<int64_t>(1, (8LL * multiprocessors(device) + t.channel_tiles - 1) / t.channel_tiles);
  const int64_t most = std::max<int64_t>(1, rows / (8LL * t.ty));
  const int64_t per = (rows + std::min(wanted, most) - 1) / std::min(wanted, most);
  return Splits{(rows + per - 1) / per, per};
}

// The elementwise passes' grid: (row blocks, channel tiles), about 8 blocks per multiprocessor.
dim3 apply_grid(int64_t rows, const Tiling& t, int device) {
  const int64_t wanted = std::max<int64_t>(1, (8LL * multiprocessors(device) + t.channel_tiles - 1) / t.channel_tiles);
  const int64_t row_blocks = std::max<int64_t>(1, std::min<int64_t>(wanted, (rows + t.ty - 1) / t.ty));
  return dim3(static_cast<unsigned>(row_blocks), static_cast<unsigned>(t.channel_tiles));
}

unsigned finish_blocks(int64_t channels) { return static_cast<unsigned>((channels + kFinishX - 1) / kFinishX); }

// The first reduction pass over every row: (splits, C, 2) partials of the statistics (grad_out
// undefined) or of the gradients' sums.
template <typename T, int V>
Tensor partial_sums(const Tensor& x, const Tensor& grad_out, const Tensor& relu_out, const Tensor& mean,
                    DType stat_dtype) {
  using S = stat_t<acc_t<T>>;
  const int64_t channels = x.shape()[1], rows = x.numel() / channels;
  const Tiling t = tiling(channels, V);
  const Splits s = split_rows(rows, t, x.device().index);
  Tensor partial = empty({s.count, channels, 2}, TensorOptions(stat_dtype, x.device()));  // (splits, C, 2)
  const dim3 grid(static_cast<unsigned>(s.count), static_cast<unsigned>(t.channel_tiles)), block(t.tx, t.ty);
  if (grad_out.defined()) {
    launch_dependent(nhwc_partial_sums<T, V, true>, grid, block, 0, stream_of(x), device_ptr<const T>(x),
                     device_ptr<const T>(grad_out), ptr_or_null<T>(relu_out), device_ptr<const S>(mean),
                     device_ptr<S>(partial), rows, channels, s.rows_per_split);
  } else {
    launch_dependent(nhwc_partial_sums<T, V, false>, grid, block, 0, stream_of(x), device_ptr<const T>(x), nullptr,
                     nullptr, nullptr, device_ptr<S>(partial), rows, channels, s.rows_per_split);
  }
  return partial;
}

template <typename T, int V>
void forward_training_launch(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                             const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                             const Tensor& save_mean, const Tensor& save_invstd, double momentum, double eps) {
  using S = stat_t<acc_t<T>>;
  const int device = x.device().index;
  cudaStream_t stream = stream_of(x);
  const int64_t channels = x.shape()[1], rows = x.numel() / channels;
  Tensor partial = partial_sums<T, V>(x, Tensor(), Tensor(), Tensor(), save_mean.dtype());  // (splits, C, 2)
  launch_dependent(nhwc_finalize_stats<T>, finish_blocks(channels), dim3(kFinishX, kFinishY), 0, stream,
                   device_ptr<const T>(x), device_ptr<const S>(partial), partial.shape()[0], channels, rows, momentum,
                   eps, device_ptr<S>(running_mean), device_ptr<S>(running_var), device_ptr<S>(save_mean),
                   device_ptr<S>(save_invstd));
  const Tiling t = tiling(channels, V);
  launch_dependent(nhwc_apply<T, V>, apply_grid(rows, t, device), dim3(t.tx, t.ty), 0, stream, device_ptr<const T>(x),
                   ptr_or_null<T>(residual), relu, device_ptr<T>(out), device_ptr<const S>(save_mean),
                   device_ptr<const S>(save_invstd), device_ptr<const S>(weight), device_ptr<const S>(bias), rows,
                   channels);
}

template <typename T, int V>
void forward_inference_launch(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                              const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                              double eps) {
  using S = stat_t<acc_t<T>>;
  cudaStream_t stream = stream_of(x);
  const int64_t channels = x.shape()[1], rows = x.numel() / channels;
  const Tiling t = tiling(channels, V);
  Tensor invstd = empty({channels}, running_var.options());  // (C,)
  launch_dependent(batch_norm_invstd<S>, static_cast<unsigned>((channels + 127) / 128), 128, 0, stream,
                   device_ptr<const S>(running_var), device_ptr<S>(invstd), channels, eps);
  launch_dependent(nhwc_apply<T, V>, apply_grid(rows, t, x.device().index), dim3(t.tx, t.ty), 0, stream,
                   device_ptr<const T>(x), ptr_or_null<T>(residual), relu, device_ptr<T>(out),
                   device_ptr<const S>(running_mean), device_ptr<const S>(invstd), device_ptr<const S>(weight),
                   device_ptr<const S>(bias), rows, channels);
}

template <typename T, int V>
void backward_launch(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                     const Tensor& save_invstd, const Tensor& relu_out, const Tensor& grad_x, const Tensor& grad_weight,
                     const Tensor& grad_bias, const Tensor& grad_residual) {
  using S = stat_t<acc_t<T>>;
  const int device = x.device().index;
  cudaStream_t stream = stream_of(x);
  const int64_t channels = x.shape()[1], rows = x.numel() / channels;
  Tensor partial = partial_sums<T, V>(x, grad_out, relu_out, save_mean, save_mean.dtype());  // (splits, C, 2)
  launch_dependent(nhwc_finalize_grads<S>, finish_blocks(channels), dim3(kFinishX, kFinishY), 0, stream,
                   device_ptr<const S>(partial), partial.shape()[0], channels, device_ptr<const S>(save_invstd),
                   device_ptr<S>(grad_weight), device_ptr<S>(grad_bias));
  const Tiling t = tiling(channels, V);
  launch_dependent(nhwc_backward_apply<T, V>, apply_grid(rows, t, device), dim3(t.tx, t.ty), 0, stream,
                   device_ptr<const T>(grad_out), device_ptr<const T>(x), ptr_or_null<T>(relu_out),
                   device_ptr<T>(grad_x), grad_residual.defined() ? device_ptr<T>(grad_residual) : nullptr,
                   device_ptr<const S>(save_mean), device_ptr<const S>(save_invstd), device_ptr<const S>(weight),
                   device_ptr<const S>(grad_weight), device_ptr<const S>(grad_bias), rows, channels);
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// Calls launch(std::integral_constant<int, V>) with V = 16 / sizeof(T) where the channels and
// every pointer allow 16-byte packets, else V = 1.
template <typename T, typename Launch>
void with_packet(int64_t channels, std::initializer_list<const void*> pointers, Launch&& launch) {
  if (vectorisable<T>(channels, pointers))
    launch(std::integral_constant<int, 16 / sizeof(T)>());
  else
    launch(std::integral_constant<int, 1>());
}

}  // namespace

void batch_norm_nhwc_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                      const Tensor& running_mean, const Tensor& running_var, const Tensor& residual,
                                      bool relu, const Tensor& out, const Tensor& save_mean, const Tensor& save_invstd,
                                      double momentum, double eps) {
  NvtxRange range("batch_norm_nhwc");
  DeviceGuard guard(x.device().index);
  dispatch_floating(x.dtype(), "batch_norm", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    with_packet<T>(x.shape()[1], {x.data_ptr(), out.data_ptr(), data_or_null(residual)}, [&](auto v) {
      forward_training_launch<T, decltype(v)::value>(x, weight, bias, running_mean, running_var, residual, relu, out,
                                                     save_mean, save_invstd, momentum, eps);
    });
  });
  check_launch("batch_norm_nhwc");
}

void batch_norm_nhwc_forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                       const Tensor& running_mean, const Tensor& running_var, const Tensor& residual,
                                       bool relu, const Tensor& out, double eps) {
  NvtxRange range("batch_norm_nhwc");
  DeviceGuard guard(x.device().index);
  dispatch_floating(x.dtype(), "batch_norm", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    with_packet<T>(x.shape()[1], {x.data_ptr(), out.data_ptr(), data_or_null(residual)}, [&](auto v) {
      forward_inference_launch<T, decltype(v)::value>(x, weight, bias, running_mean, running_var, residual, relu, out,
                                                      eps);
    });
  });
  check_launch("batch_norm_nhwc");
}

void batch_norm_nhwc_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                              const Tensor& save_invstd, const Tensor& relu_out, const Tensor& grad_x,
                              const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_residual) {
  NvtxRange range("batch_norm_nhwc_backward");
  DeviceGuard guard(x.device().index);
  dispatch_floating(x.dtype(), "batch_norm_backward", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    with_packet<T>(
        x.shape()[1],
        {grad_out.data_ptr(), x.data_ptr(), grad_x.data_ptr(), data_or_null(relu_out), data_or_null(grad_residual)},
        [&](auto v) {
          backward_launch<T, decltype(v)::value>(grad_out, x, weight, save_mean, save_invstd, relu_out, grad_x,
                                                 grad_weight, grad_bias, grad_residual);
        });
  });
  check_launch("batch_norm_nhwc_backward");
}

}  // namespace tandem::cuda
