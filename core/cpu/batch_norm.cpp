// CPU batch norm over the (N, H, W) values of each channel, one channel per parallel task.
// Statistics accumulate in double (two passes: mean, then squared deviations); the per-channel
// tensors are f32 for f32 and 16-bit inputs, f64 for f64.
#include <cmath>
#include <type_traits>

#include "tandem/core/backend.h"
#include "tandem/core/cpu/parallel.h"
#include "tandem/core/dispatch.h"

namespace tandem::cpu {

namespace {
template <typename T>
using stats_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Calls fn(v, i) for every value of channel ch of x (N, C, HW), i being its flat index.
template <typename T, typename Fn>
void for_channel(const T* x, int64_t n, int64_t c, int64_t hw, int64_t ch, Fn&& fn) {
  for (int64_t b = 0; b < n; ++b) {
    const int64_t base = (b * c + ch) * hw;
    for (int64_t i = 0; i < hw; ++i) fn(static_cast<double>(static_cast<compute_t<T>>(x[base + i])), base + i);
  }
}

template <typename T>
void forward_training_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, const Tensor& out, const Tensor& save_mean,
                            const Tensor& save_invstd, double momentum, double eps) {
  using S = stats_t<T>;
  const int64_t n = x.shape()[0], c = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
  const double m = static_cast<double>(n * hw);
  const T* px = x.data<T>();        // (N, C, H * W)
  T* po = out.data<T>();            // (N, C, H * W)
  const S* pw = weight.data<S>();   // (C,)
  const S* pb = bias.data<S>();     // (C,)
  S* prm = running_mean.data<S>();  // (C,)
  S* prv = running_var.data<S>();   // (C,)
  S* psm = save_mean.data<S>();     // (C,)
  S* psi = save_invstd.data<S>();   // (C,)
  parallel_for(c, 3 * n * hw, [&](int64_t ch) {
    double sum = 0.0;
    for_channel(px, n, c, hw, ch, [&](double v, int64_t) { sum += v; });
    const double mean = sum / m;
    double squares = 0.0;
    for_channel(px, n, c, hw, ch, [&](double v, int64_t) { squares += (v - mean) * (v - mean); });
    const double var = squares / m;
    const double invstd = 1.0 / std::sqrt(var + eps);
    psm[ch] = static_cast<S>(mean);
    psi[ch] = static_cast<S>(invstd);
    // The running variance is the unbiased estimate (m > 1 is checked by the caller).
    prm[ch] = static_cast<S>((1.0 - momentum) * static_cast<double>(prm[ch]) + momentum * mean);
    prv[ch] = static_cast<S>((1.0 - momentum) * static_cast<double>(prv[ch]) + momentum * var * m / (m - 1.0));
    const double scale = static_cast<double>(pw[ch]) * invstd, shift = static_cast<double>(pb[ch]);
    for_channel(px, n, c, hw, ch,
                [&](double v, int64_t i) { po[i] = T(static_cast<compute_t<T>>((v - mean) * scale + shift)); });
  });
}

template <typename T>
void forward_inference_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                             const Tensor& running_var, const Tensor& out, double eps) {
  using S = stats_t<T>;
  const int64_t n = x.shape()[0], c = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
  const T* px = x.data<T>();              // (N, C, H * W)
  T* po = out.data<T>();                  // (N, C, H * W)
  const S* pw = weight.data<S>();         // (C,)
  const S* pb = bias.data<S>();           // (C,)
  const S* prm = running_mean.data<S>();  // (C,)
  const S* prv = running_var.data<S>();   // (C,)
  parallel_for(c, n * hw, [&](int64_t ch) {
    const double mean = static_cast<double>(prm[ch]);
    const double scale = static_cast<double>(pw[ch]) / std::sqrt(static_cast<double>(prv[ch]) + eps);
    const double shift = static_cast<double>(pb[ch]);
    for_channel(px, n, c, hw, ch,
                [&](double v, int64_t i) { po[i] = T(static_cast<compute_t<T>>((v - mean) * scale + shift)); });
  });
}

template <typename T>
void backward_typed(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                    const Tensor& save_invstd, const Tensor& grad_x, const Tensor& grad_weight,
                    const Tensor& grad_bias) {
  using S = stats_t<T>;
  const int64_t n = x.shape()[0], c = x.shape()[1], hw = x.shape()[2] * x.shape()[3];
  const double m = static_cast<double>(n * hw);
  const T* pg = grad_out.data<T>();      // (N, C, H * W)
  const T* px = x.data<T>();             // (N, C, H * W)
  T* pgx = grad_x.data<T>();             // (N, C, H * W)
  const S* pw = weight.data<S>();        // (C,)
  const S* psm = save_mean.data<S>();    // (C,)
  const S* psi = save_invstd.data<S>();  // (C,)
  S* pgw = grad_weight.data<S>();        // (C,)
  S* pgb = grad_bias.data<S>();          // (C,)
  auto grad_at = [pg](int64_t i) { return static_cast<double>(static_cast<compute_t<T>>(pg[i])); };
  parallel_for(c, 2 * n * hw, [&](int64_t ch) {
    const double mean = static_cast<double>(psm[ch]), invstd = static_cast<double>(psi[ch]);
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for_channel(px, n, c, hw, ch, [&](double v, int64_t i) {
      const double g = grad_at(i);
      sum_g += g;
      sum_g_xhat += g * (v - mean) * invstd;
    });
    pgw[ch] = static_cast<S>(sum_g_xhat);
    pgb[ch] = static_cast<S>(sum_g);
    // grad_x = weight * invstd / M * (M * g - sum(g) - xhat * sum(g * xhat))
    const double k = static_cast<double>(pw[ch]) * invstd / m;
    for_channel(px, n, c, hw, ch, [&](double v, int64_t i) {
      const double xhat = (v - mean) * invstd;
      pgx[i] = T(static_cast<compute_t<T>>(k * (m * grad_at(i) - sum_g - xhat * sum_g_xhat)));
    });
  });
}
}  // namespace

void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& out, const Tensor& save_mean,
                                 const Tensor& save_invstd, double momentum, double eps) {
  dispatch_floating(x.dtype(), "batch_norm", "cpu", [&](auto tag) {
    forward_training_typed<decltype(tag)>(x, weight, bias, running_mean, running_var, out, save_mean, save_invstd,
                                          momentum, eps);
  });
}

void batch_norm_forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                  const Tensor& running_var, const Tensor& out, double eps) {
  dispatch_floating(x.dtype(), "batch_norm", "cpu", [&](auto tag) {
    forward_inference_typed<decltype(tag)>(x, weight, bias, running_mean, running_var, out, eps);
  });
}

void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                         const Tensor& save_invstd, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias) {
  dispatch_floating(x.dtype(), "batch_norm_backward", "cpu", [&](auto tag) {
    backward_typed<decltype(tag)>(grad_out, x, weight, save_mean, save_invstd, grad_x, grad_weight, grad_bias);
  });
}

}  // namespace tandem::cpu
