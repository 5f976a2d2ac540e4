// CPU batch norm over the (N, H, W) values of each channel, one channel per parallel task, for
// NCHW-contiguous or channels-last tensors: both visit a channel's values in the same (n, h, w)
// order, so they give the same bits. Statistics accumulate in double (two passes: mean, then
// squared deviations); the per-channel tensors are f32 for f32 and 16-bit inputs, f64 for f64.
// The fused residual add and ReLU round as the separate add and relu ops do.
#include <cmath>
#include <type_traits>

#include "tandem/core/backend.h"
#include "tandem/core/cpu/parallel.h"
#include "tandem/core/dispatch.h"

namespace tandem::cpu {

namespace {
template <typename T>
using stats_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Where the values of one channel live: element (n, c, p) of an (N, C, H * W) view is at
// n * image + c * channel + p * position.
struct ChannelLayout {
  int64_t n, c, hw;
  int64_t image, channel, position;  // strides in elements
};

// The backend contract: x is NCHW-contiguous or channels-last, and every operand shares its layout.
ChannelLayout layout_of(const Tensor& x) {
  const int64_t n = x.shape()[0], c = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
  if (x.is_contiguous()) return {n, c, hw, c * hw, hw, 1};
  return {n, c, hw, hw * c, 1, c};
}

// Calls fn(v, i) for every value of channel ch, i being its offset in elements, in (n, h, w) order.
template <typename T, typename Fn>
void for_channel(const T* x, const ChannelLayout& l, int64_t ch, Fn&& fn) {
  for (int64_t b = 0; b < l.n; ++b) {
    const int64_t base = b * l.image + ch * l.channel;
    for (int64_t p = 0; p < l.hw; ++p) {
      const int64_t i = base + p * l.position;
      fn(static_cast<double>(static_cast<compute_t<T>>(x[i])), i);
    }
  }
}

// relu(round(normalised) + residual), each step rounded to T as batch_norm, add and relu would be.
template <typename T>
T finish_output(double normalised, const T* residual, int64_t i, bool relu) {
  using C = compute_t<T>;
  T y = T(static_cast<C>(normalised));
  if (residual) y = T(static_cast<C>(static_cast<C>(y) + static_cast<C>(residual[i])));
  if (relu) y = static_cast<C>(y) > C(0) ? y : T(C(0));
  return y;
}

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

template <typename T>
void forward_training_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                            const Tensor& save_mean, const Tensor& save_invstd, double momentum, double eps) {
  using S = stats_t<T>;
  const ChannelLayout l = layout_of(x);
  const double m = static_cast<double>(l.n * l.hw);
  const T* px = x.data<T>();                // (N, C, H, W), NCHW or NHWC memory
  const T* pr = data_or_null<T>(residual);  // like x, or null
  T* po = out.data<T>();                    // like x
  const S* pw = weight.data<S>();           // (C,)
  const S* pb = bias.data<S>();             // (C,)
  S* prm = running_mean.data<S>();          // (C,)
  S* prv = running_var.data<S>();           // (C,)
  S* psm = save_mean.data<S>();             // (C,)
  S* psi = save_invstd.data<S>();           // (C,)
  parallel_for(l.c, 3 * l.n * l.hw, [&](int64_t ch) {
    double sum = 0.0;
    for_channel(px, l, ch, [&](double v, int64_t) { sum += v; });
    const double mean = sum / m;
    double squares = 0.0;
    for_channel(px, l, ch, [&](double v, int64_t) { squares += (v - mean) * (v - mean); });
    const double var = squares / m;
    const double invstd = 1.0 / std::sqrt(var + eps);
    psm[ch] = static_cast<S>(mean);
    psi[ch] = static_cast<S>(invstd);
    // The running variance is the unbiased estimate (m > 1 is checked by the caller).
    prm[ch] = static_cast<S>((1.0 - momentum) * static_cast<double>(prm[ch]) + momentum * mean);
    prv[ch] = static_cast<S>((1.0 - momentum) * static_cast<double>(prv[ch]) + momentum * var * m / (m - 1.0));
    const double scale = static_cast<double>(pw[ch]) * invstd, shift = static_cast<double>(pb[ch]);
    for_channel(px, l, ch,
                [&](double v, int64_t i) { po[i] = finish_output<T>((v - mean) * scale + shift, pr, i, relu); });
  });
}

template <typename T>
void forward_inference_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                             const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                             double eps) {
  using S = stats_t<T>;
  const ChannelLayout l = layout_of(x);
  const T* px = x.data<T>();                // (N, C, H, W), NCHW or NHWC memory
  const T* pr = data_or_null<T>(residual);  // like x, or null
  T* po = out.data<T>();                    // like x
  const S* pw = weight.data<S>();           // (C,)
  const S* pb = bias.data<S>();             // (C,)
  const S* prm = running_mean.data<S>();    // (C,)
  const S* prv = running_var.data<S>();     // (C,)
  parallel_for(l.c, l.n * l.hw, [&](int64_t ch) {
    const double mean = static_cast<double>(prm[ch]);
    const double scale = static_cast<double>(pw[ch]) / std::sqrt(static_cast<double>(prv[ch]) + eps);
    const double shift = static_cast<double>(pb[ch]);
    for_channel(px, l, ch,
                [&](double v, int64_t i) { po[i] = finish_output<T>((v - mean) * scale + shift, pr, i, relu); });
  });
}

template <typename T>
void backward_typed(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                    const Tensor& save_invstd, const Tensor& relu_out, const Tensor& grad_x, const Tensor& grad_weight,
                    const Tensor& grad_bias, const Tensor& grad_residual) {
  using S = stats_t<T>;
  using C = compute_t<T>;
  const ChannelLayout l = layout_of(x);
  const double m = static_cast<double>(l.n * l.hw);
  const T* pg = grad_out.data<T>();                                      // (N, C, H, W), NCHW or NHWC memory
  const T* px = x.data<T>();                                             // like grad_out
  const T* py = data_or_null<T>(relu_out);                               // like grad_out, or null
  T* pgx = grad_x.data<T>();                                             // like grad_out
  T* pgr = grad_residual.defined() ? grad_residual.data<T>() : nullptr;  // like grad_out, or null
  const S* pw = weight.data<S>();                                        // (C,)
  const S* psm = save_mean.data<S>();                                    // (C,)
  const S* psi = save_invstd.data<S>();                                  // (C,)
  S* pgw = grad_weight.data<S>();                                        // (C,)
  S* pgb = grad_bias.data<S>();                                          // (C,)
  // ReLU's backward from its output: y > 0 exactly where its input was.
  auto grad_at = [pg, py](int64_t i) {
    if (py && !(static_cast<C>(py[i]) > C(0))) return 0.0;
    return static_cast<double>(static_cast<C>(pg[i]));
  };
  parallel_for(l.c, 2 * l.n * l.hw, [&](int64_t ch) {
    const double mean = static_cast<double>(psm[ch]), invstd = static_cast<double>(psi[ch]);
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for_channel(px, l, ch, [&](double v, int64_t i) {
      const double g = grad_at(i);
      sum_g += g;
      sum_g_xhat += g * (v - mean) * invstd;
    });
    pgw[ch] = static_cast<S>(sum_g_xhat);
    pgb[ch] = static_cast<S>(sum_g);
    // grad_x = weight * invstd / M * (M * g - sum(g) - xhat * sum(g * xhat))
    const double k = static_cast<double>(pw[ch]) * invstd / m;
    for_channel(px, l, ch, [&](double v, int64_t i) {
      const double xhat = (v - mean) * invstd;
      const double g = grad_at(i);
      pgx[i] = T(static_cast<C>(k * (m * g - sum_g - xhat * sum_g_xhat)));
      if (pgr) pgr[i] = T(static_cast<C>(g));
    });
  });
}
}  // namespace

void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                                 const Tensor& save_mean, const Tensor& save_invstd, double momentum, double eps) {
  dispatch_floating(x.dtype(), "batch_norm", "cpu", [&](auto tag) {
    forward_training_typed<decltype(tag)>(x, weight, bias, running_mean, running_var, residual, relu, out, save_mean,
                                          save_invstd, momentum, eps);
  });
}

void batch_norm_forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                  const Tensor& running_var, const Tensor& residual, bool relu, const Tensor& out,
                                  double eps) {
  dispatch_floating(x.dtype(), "batch_norm", "cpu", [&](auto tag) {
    forward_inference_typed<decltype(tag)>(x, weight, bias, running_mean, running_var, residual, relu, out, eps);
  });
}

void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                         const Tensor& save_invstd, const Tensor& relu_out, const Tensor& grad_x,
                         const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_residual) {
  dispatch_floating(x.dtype(), "batch_norm_backward", "cpu", [&](auto tag) {
    backward_typed<decltype(tag)>(grad_out, x, weight, save_mean, save_invstd, relu_out, grad_x, grad_weight, grad_bias,
                                  grad_residual);
  });
}

}  // namespace tandem::cpu
