#pragma once
// What the NCHW (batch_norm.cu) and channels-last (batch_norm_nhwc.cu) batch-norm kernels share:
// the statistics type, 16-byte packets, the per-channel finishing formulas, and the fused
// output (residual add, ReLU) and ReLU-masked gradient.
//
// Where a product meets a sum, the formulas say how it is rounded (fma(), or rounded_product() for
// a product rounded on its own): left to the compiler, dy - grad_bias / M was one fused
// multiply-add in some code paths of the backward kernel and a product then a subtraction in
// another, so the fused op's input gradient differed from that of batch norm after relu's
// backward by one unit in the last place for some inputs.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"

namespace tandem::cuda::batch_norm_detail {

// Statistics and per-channel tensors: f32 (f64 for f64 inputs); it is also acc_t<T>.
template <typename T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr int kThreads = 256;

// The output element: the normalised value rounded to T, plus the residual (rounded as the add
// kernel rounds), then ReLU (as the relu kernel: x > 0 ? x : 0). has_residual false: residual unused.
template <typename T>
__device__ __forceinline__ T finish_output(acc_t<T> normalised, T residual, bool has_residual, bool relu) {
  T y = cast_to<T>(normalised);
  if (has_residual) y = cast_to<T>(to_acc(y) + to_acc(residual));
  if (relu && !(to_acc(y) > acc_t<T>(0))) y = cast_to<T>(acc_t<T>(0));
  return y;
}

// ReLU's backward taken from its output (y > 0 exactly where its input was); no mask without relu_out.
template <typename T>
__device__ __forceinline__ acc_t<T> masked_grad(T g, T y, bool has_mask) {
  return (!has_mask || to_acc(y) > acc_t<T>(0)) ? to_acc(g) : acc_t<T>(0);
}

// A channel's batch mean, 1 / sqrt(var + eps) and running statistics from its shifted sums
// sum(x - shift), sum((x - shift)^2) over m values; the running variance is the unbiased one (as
// PyTorch's).
template <typename S>
__device__ __forceinline__ void finish_stats(S sum, S sum_sq, S shift, int64_t m, double momentum, double eps,
                                             S* running_mean, S* running_var, S* save_mean, S* save_invstd) {
  const S mean_shifted = sum / static_cast<S>(m);
  const S var = max(sum_sq / static_cast<S>(m) - mean_shifted * mean_shifted, S(0));  // biased
  const S mean = shift + mean_shifted;
  *save_mean = mean;
  *save_invstd = S(1) / sqrt(var + static_cast<S>(eps));
  const S mom = static_cast<S>(momentum);
  *running_mean = (S(1) - mom) * *running_mean + mom * mean;
  *running_var = (S(1) - mom) * *running_var + mom * var * static_cast<S>(m) / static_cast<S>(m - 1);
}

// invstd[c] = 1 / sqrt(var[c] + eps), for inference from the running variance.
template <typename S>
__global__ void batch_norm_invstd(const S* __restrict__ var, S* __restrict__ invstd, int64_t channels, double eps) {
  dependent_kernel_begin();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < channels) invstd[c] = S(1) / sqrt(var[c] + static_cast<S>(eps));
}

// The per-channel constants of the input gradient,
// dx = scale * (dy - mean_dy - (x - mean) * k), from grad_bias = sum(dy), grad_weight = sum(dy * xhat).
template <typename S>
struct BackwardCoefficients {
  S scale, mean_dy, k, mean;
};
// a * b rounded on its own: the compiler may not fuse it into a later add.
__device__ __forceinline__ float rounded_product(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double rounded_product(double a, double b) { return __dmul_rn(a, b); }

template <typename S>
__device__ __forceinline__ BackwardCoefficients<S> backward_coefficients(S weight, S invstd, S mean, S grad_weight,
                                                                         S grad_bias, int64_t m) {
  const S inv_m = S(1) / static_cast<S>(m);
  return {weight * invstd, rounded_product(grad_bias, inv_m), grad_weight * invstd * inv_m, mean};
}

// One packet of the output: out = relu(x * scale + shift [+ residual]); scale_shift(k) gives the
// constants of element k's channel, residual may be null.
template <typename T, int V, typename ScaleShift>
__device__ __forceinline__ void apply_packet(const T* __restrict__ x, const T* __restrict__ residual, bool relu,
                                             T* __restrict__ out, int64_t packet, ScaleShift&& scale_shift) {
  const Packed<T, V> v = load_packed<T, V>(x, packet);
  Packed<T, V> res{};
  if (residual) res = load_packed<T, V>(residual, packet);
  Packed<T, V> o;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const auto [scale, shift] = scale_shift(k);
    o.v[k] =
        finish_output<T>(fma(static_cast<acc_t<T>>(to_acc(v.v[k])), scale, shift), res.v[k], residual != nullptr, relu);
  }
  store_packed<T, V>(out, packet, o);
}

// One packet of the input gradient, dy masked by ReLU's output y where y is not null, and of the
// residual's gradient (the masked dy) where grad_residual is not null; coefficients(k) gives the
// BackwardCoefficients of element k's channel.
template <typename T, int V, typename Coefficients>
__device__ __forceinline__ void backward_packet(const T* __restrict__ grad_out, const T* __restrict__ x,
                                                const T* __restrict__ y, T* __restrict__ grad_x,
                                                T* __restrict__ grad_residual, int64_t packet,
                                                Coefficients&& coefficients) {
  const Packed<T, V> g = load_packed<T, V>(grad_out, packet);
  const Packed<T, V> v = load_packed<T, V>(x, packet);
  Packed<T, V> out{};
  if (y) out = load_packed<T, V>(y, packet);
  Packed<T, V> o, gr;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    const BackwardCoefficients<acc_t<T>> b = coefficients(k);
    const acc_t<T> dy = masked_grad<T>(g.v[k], out.v[k], y != nullptr);
    const acc_t<T> xmu = static_cast<acc_t<T>>(to_acc(v.v[k])) - b.mean;
    o.v[k] = cast_to<T>(b.scale * fma(-xmu, b.k, dy - b.mean_dy));
    gr.v[k] = cast_to<T>(dy);
  }
  store_packed<T, V>(grad_x, packet, o);
  if (grad_residual) store_packed<T, V>(grad_residual, packet, gr);
}

template <typename T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? device_ptr<const T>(t) : nullptr;
}

// 16-byte loads need every row of `run` elements (a plane, or a pixel's channels) to be a
// multiple of V = 16 / sizeof(T) and every pointer (null ones aside) 16-byte aligned.
template <typename T>
bool vectorisable(int64_t run, std::initializer_list<const void*> pointers) {
  constexpr int V = 16 / sizeof(T);
  if (run % V != 0) return false;
  for (const void* q : pointers)
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  return true;
}

}  // namespace tandem::cuda::batch_norm_detail

namespace tandem::cuda {
// The channels-last passes (batch_norm_nhwc.cu), called by batch_norm.cu's entry points when x is
// not NCHW-contiguous; arguments as the backend's batch_norm functions, layouts already checked.
void batch_norm_nhwc_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                      const Tensor& running_mean, const Tensor& running_var, const Tensor& residual,
                                      bool relu, const Tensor& out, const Tensor& save_mean, const Tensor& save_invstd,
                                      double momentum, double eps);
void batch_norm_nhwc_forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                       const Tensor& running_mean, const Tensor& running_var, const Tensor& residual,
                                       bool relu, const Tensor& out, double eps);
void batch_norm_nhwc_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                              const Tensor& save_invstd, const Tensor& relu_out, const Tensor& grad_x,
                              const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_residual);
}  // namespace tandem::cuda
