// CUDA batch norm over x (N, C, H, W) NCHW-contiguous (channels-last x goes to batch_norm_nhwc.cu),
// statistics per channel over its M = N * H * W values, in S (f32; f64 for f64); the residual add
// and ReLU after it, and ReLU's backward before its backward, fused into the elementwise passes.
// cuDNN's NCHW kernels gave each channel few blocks: ResNet-18's (256, 64, 32, 32) batch norm took
// 0.37 ms backward and 0.20 ms forward, over ten times its memory time. Here a channel's reduction
// is split across as many blocks as fill the GPU, each writing a partial sum; one thread per
// channel adds its partials in a fixed order (the results are the same bits on every run), and one
// elementwise pass writes the output or input gradient.
//
// Statistics use sums of d = x - K with K the channel's first value (the shifted-data algorithm):
// the blocks of a channel share K, so their partials simply add, and the variance
// sum(d^2) / M - (sum(d) / M)^2 does not cancel catastrophically when the mean is far from zero.
#include "tandem/core/cuda/batch_norm.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"

namespace tandem::cuda {

namespace {

using namespace batch_norm_detail;

// (a, b) summed over the block; the result is valid in thread 0.
template <typename S>
__device__ void block_sum2(S& a, S& b) {
  __shared__ S shared[2][kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    shared[0][warp] = a;
    shared[1][warp] = b;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      a += shared[0][w];
      b += shared[1][w];
    }
  }
}

// Where the values of one channel live: plane (n, c) is x + (n * C + c) * HW, HW / V vectors.
struct Planes {
  int64_t channels, plane;  // C, H * W
  int64_t images_per_split;
};

// partial[c][split] = (sum(x - K), sum((x - K)^2)) over the split's images, K = x[0, c, 0].
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batch_norm_partial_stats(const T* __restrict__ x, stat_t<acc_t<T>>* __restrict__ partial, int64_t images,
                             Planes p) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int64_t c = blockIdx.y, split = blockIdx.x;
  const int64_t n0 = split * p.images_per_split;
  const int64_t n1 = n0 + p.images_per_split < images ? n0 + p.images_per_split : images;
  const S shift = static_cast<S>(to_acc(x[c * p.plane]));
  const int64_t per_plane = p.plane / V, count = (n1 - n0) * per_plane;
  S sum = 0, sum_sq = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) {
    const int64_t n = n0 + i / per_plane;
    const Packed<T, V> v = load_packed<T, V>(x + (n * p.channels + c) * p.plane, i % per_plane);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const S d = static_cast<S>(to_acc(v.v[k])) - shift;
      sum += d;
      sum_sq += d * d;
    }
  }
  block_sum2(sum, sum_sq);
  if (threadIdx.x == 0) {
    partial[(c * gridDim.x + split) * 2] = sum;
    partial[(c * gridDim.x + split) * 2 + 1] = sum_sq;
  }
}

// One thread per channel: the batch mean and 1 / sqrt(var + eps), and the running statistics
// updated with the unbiased variance (as PyTorch does).
template <typename T>
__global__ void batch_norm_finalize_stats(const T* __restrict__ x, const stat_t<acc_t<T>>* __restrict__ partial,
                                          int splits, int64_t channels, int64_t plane, int64_t m, double momentum,
                                          double eps, stat_t<acc_t<T>>* running_mean, stat_t<acc_t<T>>* running_var,
                                          stat_t<acc_t<T>>* save_mean, stat_t<acc_t<T>>* save_invstd) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  S sum = 0, sum_sq = 0;
  for (int s = 0; s < splits; ++s) {
    sum += partial[(c * splits + s) * 2];
    sum_sq += partial[(c * splits + s) * 2 + 1];
  }
  finish_stats<S>(sum, sum_sq, static_cast<S>(to_acc(x[c * plane])), m, momentum, eps, running_mean + c,
                  running_var + c, save_mean + c, save_invstd + c);
}

// out = relu((x - mean[c]) * invstd[c] * weight[c] + bias[c] [+ residual]), V elements at a time
// (never across planes); residual may be null.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batch_norm_apply(const T* __restrict__ x, const T* __restrict__ residual, bool relu, T* __restrict__ out,
                     const stat_t<acc_t<T>>* __restrict__ mean, const stat_t<acc_t<T>>* __restrict__ invstd,
                     const stat_t<acc_t<T>>* __restrict__ weight, const stat_t<acc_t<T>>* __restrict__ bias,
                     int64_t vectors, Planes p) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int64_t per_plane = p.plane / V;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t c = (i / per_plane) % p.channels;
    const S scale = invstd[c] * weight[c], shift = fma(-mean[c], scale, bias[c]);
    apply_packet<T, V>(x, residual, relu, out, i, [&](int) { return std::pair<S, S>(scale, shift); });
  }
}

// partial[c][split] = (sum(dy), sum(dy * (x - mean))) over the split's images, dy masked by
// ReLU's output y where y is not null.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batch_norm_partial_grads(const T* __restrict__ grad_out, const T* __restrict__ x, const T* __restrict__ y,
                             const stat_t<acc_t<T>>* __restrict__ mean, stat_t<acc_t<T>>* __restrict__ partial,
                             int64_t images, Planes p) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int64_t c = blockIdx.y, split = blockIdx.x;
  const int64_t n0 = split * p.images_per_split;
  const int64_t n1 = n0 + p.images_per_split < images ? n0 + p.images_per_split : images;
  const S mu = mean[c];
  const int64_t per_plane = p.plane / V, count = (n1 - n0) * per_plane;
  S sum_dy = 0, sum_dy_xmu = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) {
    const int64_t offset = ((n0 + i / per_plane) * p.channels + c) * p.plane;
    const Packed<T, V> g = load_packed<T, V>(grad_out + offset, i % per_plane);
    const Packed<T, V> v = load_packed<T, V>(x + offset, i % per_plane);
    Packed<T, V> out{};
    if (y) out = load_packed<T, V>(y + offset, i % per_plane);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const S dy = masked_grad<T>(g.v[k], out.v[k], y != nullptr);
      sum_dy += dy;
      sum_dy_xmu = fma(dy, static_cast<S>(to_acc(v.v[k])) - mu, sum_dy_xmu);
    }
  }
  block_sum2(sum_dy, sum_dy_xmu);
  if (threadIdx.x == 0) {
    partial[(c * gridDim.x + split) * 2] = sum_dy;
    partial[(c * gridDim.x + split) * 2 + 1] = sum_dy_xmu;
  }
}

// One thread per channel: grad_bias = sum(dy), grad_weight = sum(dy * xhat).
template <typename S>
__global__ void batch_norm_finalize_grads(const S* __restrict__ partial, int splits, int64_t channels,
                                          const S* __restrict__ invstd, S* __restrict__ grad_weight,
                                          S* __restrict__ grad_bias) {
  dependent_kernel_begin();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  S sum_dy = 0, sum_dy_xmu = 0;
  for (int s = 0; s < splits; ++s) {
    sum_dy += partial[(c * splits + s) * 2];
    sum_dy_xmu += partial[(c * splits + s) * 2 + 1];
  }
  grad_bias[c] = sum_dy;
  grad_weight[c] = sum_dy_xmu * invstd[c];
}

// dx = weight * invstd * (dy - sum(dy) / M - xhat * sum(dy * xhat) / M), dy masked by ReLU's
// output y where y is not null; grad_residual (if not null) = the masked dy.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    batch_norm_backward_apply(const T* __restrict__ grad_out, const T* __restrict__ x, const T* __restrict__ y,
                              T* __restrict__ grad_x, T* __restrict__ grad_residual,
                              const stat_t<acc_t<T>>* __restrict__ mean, const stat_t<acc_t<T>>* __restrict__ invstd,
                              const stat_t<acc_t<T>>* __restrict__ weight,
                              const stat_t<acc_t<T>>* __restrict__ grad_weight,
                              const stat_t<acc_t<T>>* __restrict__ grad_bias, int64_t m, int64_t vectors, Planes p) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int64_t per_plane = p.plane / V;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < vectors;
       i += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t c = (i / per_plane) % p.channels;
    const BackwardCoefficients<S> b =
        backward_coefficients<S>(weight[c], invstd[c], mean[c], grad_weight[c], grad_bias[c], m);
    backward_packet<T, V>(grad_out, x, y, grad_x, grad_residual, i,
                          [&](int) -> BackwardCoefficients<S> { return b; });
  }
}

// How a channel's reduction is split: enough blocks in all to fill the GPU a few times over,
// but no fewer than about 4096 values per block.
Planes plan(const Tensor& x, int device) {
  const int64_t n = x.shape()[0], c = x.shape()[1], plane = x.shape()[2] * x.shape()[3];
  const int64_t wanted = std::max<int64_t>(1, (4LL * multiprocessors(device) + c - 1) / c);
  const int64_t by_size = std::max<int64_t>(1, n * plane / 4096);
  const int64_t splits = std::min({n, wanted, by_size});
  return Planes{c, plane, (n + splits - 1) / splits};
}

int64_t splits_of(const Tensor& x, const Planes& p) { return (x.shape()[0] + p.images_per_split - 1) / p.images_per_split; }

unsigned apply_blocks(int64_t vectors, int device) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((vectors + kThreads - 1) / kThreads, 8LL * multiprocessors(device))));
}

template <typename T, int V>
void apply(const Tensor& x, const Tensor& residual, bool relu, const Tensor& out, const Tensor& mean,
           const Tensor& invstd, const Tensor& weight, const Tensor& bias, const Planes& p, cudaStream_t stream) {
  using S = stat_t<acc_t<T>>;
  const int64_t vectors = x.numel() / V;
  launch_dependent(batch_norm_apply<T, V>, apply_blocks(vectors, x.device().index), kThreads, 0, stream,
                   device_ptr<const T>(x), ptr_or_null<T>(residual), relu, device_ptr<T>(out),
                   device_ptr<const S>(mean), device_ptr<const S>(invstd), device_ptr<const S>(weight),
                   device_ptr<const S>(bias), vectors, p);
}

template <typename T>
void forward_training_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                            const Tensor& save_mean, const Tensor& save_invstd, double momentum, double eps) {
  using S = stat_t<acc_t<T>>;
  constexpr int V = 16 / sizeof(T);
  const int device = x.device().index;
  cudaStream_t stream = stream_of(x);
  const Planes p = plan(x, device);
  const int64_t splits = splits_of(x, p), channels = p.channels, m = x.numel() / channels;
  Tensor partial = empty({channels, splits, 2}, TensorOptions(save_mean.dtype(), x.device()));  // (C, splits, 2)
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(channels));
  const bool vec = vectorisable<T>(p.plane, {x.data_ptr(), out.data_ptr(), ptr_or_null<T>(residual)});
  if (vec) {
    launch_dependent(batch_norm_partial_stats<T, V>, grid, kThreads, 0, stream, device_ptr<const T>(x),
                     device_ptr<S>(partial), x.shape()[0], p);
  } else {
    launch_dependent(batch_norm_partial_stats<T, 1>, grid, kThreads, 0, stream, device_ptr<const T>(x),
                     device_ptr<S>(partial), x.shape()[0], p);
  }
  launch_dependent(batch_norm_finalize_stats<T>, static_cast<unsigned>((channels + 127) / 128), 128, 0, stream,
                   device_ptr<const T>(x), device_ptr<const S>(partial), static_cast<int>(splits), channels, p.plane, m,
                   momentum, eps, device_ptr<S>(running_mean), device_ptr<S>(running_var), device_ptr<S>(save_mean),
                   device_ptr<S>(save_invstd));
  if (vec) apply<T, V>(x, residual, relu, out, save_mean, save_invstd, weight, bias, p, stream);
  else apply<T, 1>(x, residual, relu, out, save_mean, save_invstd, weight, bias, p, stream);
}

template <typename T>
void forward_inference_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                             const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                             double eps) {
  using S = stat_t<acc_t<T>>;
  constexpr int V = 16 / sizeof(T);
  cudaStream_t stream = stream_of(x);
  const Planes p{x.shape()[1], x.shape()[2] * x.shape()[3], 1};
  Tensor invstd = empty({p.channels}, running_var.options());  // (C,)
  launch_dependent(batch_norm_invstd<S>, static_cast<unsigned>((p.channels + 127) / 128), 128, 0, stream,
                   device_ptr<const S>(running_var), device_ptr<S>(invstd), p.channels, eps);
  if (vectorisable<T>(p.plane, {x.data_ptr(), out.data_ptr(), ptr_or_null<T>(residual)})) {
    apply<T, V>(x, residual, relu, out, running_mean, invstd, weight, bias, p, stream);
  } else {
    apply<T, 1>(x, residual, relu, out, running_mean, invstd, weight, bias, p, stream);
  }
}

template <typename T, int V>
void backward_launch(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                     const Tensor& save_invstd, const Tensor& relu_out, const Tensor& grad_x,
                     const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_residual, const Planes& p,
                     cudaStream_t stream) {
  using S = stat_t<acc_t<T>>;
  const int64_t splits = splits_of(x, p), channels = p.channels, m = x.numel() / channels;
  Tensor partial = empty({channels, splits, 2}, TensorOptions(save_mean.dtype(), x.device()));  // (C, splits, 2)
  launch_dependent(batch_norm_partial_grads<T, V>, dim3(static_cast<unsigned>(splits), static_cast<unsigned>(channels)),
                   kThreads, 0, stream, device_ptr<const T>(grad_out), device_ptr<const T>(x), ptr_or_null<T>(relu_out),
                   device_ptr<const S>(save_mean), device_ptr<S>(partial), x.shape()[0], p);
  launch_dependent(batch_norm_finalize_grads<S>, static_cast<unsigned>((channels + 127) / 128), 128, 0, stream,
                   device_ptr<const S>(partial), static_cast<int>(splits), channels, device_ptr<const S>(save_invstd),
                   device_ptr<S>(grad_weight), device_ptr<S>(grad_bias));
  const int64_t vectors = x.numel() / V;
  launch_dependent(batch_norm_backward_apply<T, V>, apply_blocks(vectors, x.device().index), kThreads, 0, stream,
                   device_ptr<const T>(grad_out), device_ptr<const T>(x), ptr_or_null<T>(relu_out),
                   device_ptr<T>(grad_x), grad_residual.defined() ? device_ptr<T>(grad_residual) : nullptr,
                   device_ptr<const S>(save_mean), device_ptr<const S>(save_invstd), device_ptr<const S>(weight),
                   device_ptr<const S>(grad_weight), device_ptr<const S>(grad_bias), m, vectors, p);
}

template <typename T>
void backward_typed(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                    const Tensor& save_invstd, const Tensor& relu_out, const Tensor& grad_x,
                    const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_residual) {
  constexpr int V = 16 / sizeof(T);
  const Planes p = plan(x, x.device().index);
  const void* residual_ptr = grad_residual.defined() ? grad_residual.data_ptr() : nullptr;
  if (vectorisable<T>(p.plane, {grad_out.data_ptr(), x.data_ptr(), grad_x.data_ptr(), ptr_or_null<T>(relu_out),
                                residual_ptr})) {
    backward_launch<T, V>(grad_out, x, weight, save_mean, save_invstd, relu_out, grad_x, grad_weight, grad_bias,
                          grad_residual, p, stream_of(x));
  } else {
    backward_launch<T, 1>(grad_out, x, weight, save_mean, save_invstd, relu_out, grad_x, grad_weight, grad_bias,
                          grad_residual, p, stream_of(x));
  }
}

}  // namespace

// Entry points: NCHW-contiguous x runs the kernels above, channels-last x those of batch_norm_nhwc.cu.
void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                                 const Tensor& save_mean, const Tensor& save_invstd, double momentum, double eps) {
  if (!x.is_contiguous()) {
    batch_norm_nhwc_forward_training(x, weight, bias, running_mean, running_var, residual, relu, out, save_mean,
                                     save_invstd, momentum, eps);
    return;
  }
  NvtxRange range("batch_norm");
  DeviceGuard guard(x.device().index);
  dispatch_floating(x.dtype(), "batch_norm", "cuda", [&](auto tag) {
    forward_training_typed<device_t<decltype(tag)>>(x, weight, bias, running_mean, running_var, residual, relu, out,
                                                    save_mean, save_invstd, momentum, eps);
  });
  check_launch("batch_norm");
}

void batch_norm_forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                  const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                                  double eps) {
  if (!x.is_contiguous()) {
    batch_norm_nhwc_forward_inference(x, weight, bias, running_mean, running_var, residual, relu, out, eps);
    return;
  }
  NvtxRange range("batch_norm");
  DeviceGuard guard(x.device().index);
  dispatch_floating(x.dtype(), "batch_norm", "cuda", [&](auto tag) {
    forward_inference_typed<device_t<decltype(tag)>>(x, weight, bias, running_mean, running_var, residual, relu, out,
                                                     eps);
  });
  check_launch("batch_norm");
}

void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                         const Tensor& save_invstd, const Tensor& relu_out, const Tensor& grad_x,
                         const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_residual) {
  if (!x.is_contiguous()) {
    batch_norm_nhwc_backward(grad_out, x, weight, save_mean, save_invstd, relu_out, grad_x, grad_weight, grad_bias,
                             grad_residual);
    return;
  }
  NvtxRange range("batch_norm_backward");
  DeviceGuard guard(x.device().index);
  dispatch_floating(x.dtype(), "batch_norm_backward", "cuda", [&](auto tag) {
    backward_typed<device_t<decltype(tag)>>(grad_out, x, weight, save_mean, save_invstd, relu_out, grad_x,
                                            grad_weight, grad_bias, grad_residual);
  });
  check_launch("batch_norm_backward");
}

}  // namespace tandem::cuda
