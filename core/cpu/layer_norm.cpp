// CPU layer norm over the last dim of contiguous (rows, D) tensors. Statistics accumulate in double
// (two passes: mean, then squared deviations), one row per parallel task; the weight and bias
// gradients are summed per column in row order, so every run gives the same bits.
#include <cmath>
#include <type_traits>
#include <vector>

#include "tandem/core/backend.h"
#include "tandem/core/cpu/parallel.h"
#include "tandem/core/dispatch.h"

namespace tandem::cpu {

namespace {
template <typename T>
using stats_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
double load(const T* p, int64_t i) {
  return static_cast<double>(static_cast<compute_t<T>>(p[i]));
}

template <typename T>
T store(double v) {
  return T(static_cast<compute_t<T>>(v));
}

template <typename T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& mean,
                   const Tensor& rstd, double eps) {
  using S = stats_t<T>;
  const int64_t rows = x.shape()[0], d = x.shape()[1];
  const T* px = x.data<T>();                                    // (rows, D)
  const T* pw = weight.defined() ? weight.data<T>() : nullptr;  // (D,)
  const T* pb = bias.defined() ? bias.data<T>() : nullptr;      // (D,)
  T* po = out.data<T>();                                        // (rows, D)
  S* pm = mean.data<S>();                                       // (rows,)
  S* pr = rstd.data<S>();                                       // (rows,)
  parallel_for(rows, 4 * d, [&](int64_t r) {
    const T* xr = px + r * d;
    T* orow = po + r * d;
    double sum = 0.0;
    for (int64_t i = 0; i < d; ++i) sum += load(xr, i);
    const double mu = sum / static_cast<double>(d);
    double squares = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      const double c = load(xr, i) - mu;
      squares += c * c;
    }
    const double rs = 1.0 / std::sqrt(squares / static_cast<double>(d) + eps);
    pm[r] = static_cast<S>(mu);
    pr[r] = static_cast<S>(rs);
    for (int64_t i = 0; i < d; ++i) {
      double y = (load(xr, i) - mu) * rs;
      if (pw) y *= load(pw, i);
      if (pb) y += load(pb, i);
      orow[i] = store<T>(y);
    }
  });
}

// With xhat = (x - mean) * rstd and g = dy * w: dx = rstd * (g - mean(g) - xhat * mean(g * xhat));
// dweight = sum over rows of dy * xhat; dbias = sum over rows of dy. pending, when defined, is
// added into dx before it is rounded; grad_x_column_sum, when defined, gets dx's rounded values
// summed over the rows.
template <typename T>
void backward_typed(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                    const Tensor& rstd, const Tensor& pending, const Tensor& grad_x, const Tensor& grad_weight,
                    const Tensor& grad_bias, const Tensor& grad_x_column_sum) {
  using S = stats_t<T>;
  const int64_t rows = x.shape()[0], d = x.shape()[1];
  const T* pg = grad_out.data<T>();                                  // (rows, D)
  const T* px = x.data<T>();                                         // (rows, D)
  const T* pw = weight.defined() ? weight.data<T>() : nullptr;       // (D,)
  const S* pm = mean.data<S>();                                      // (rows,)
  const S* pr = rstd.data<S>();                                      // (rows,)
  const T* pp = pending.defined() ? pending.data<T>() : nullptr;     // (rows, D)
  T* pdx = grad_x.data<T>();                                         // (rows, D)
  T* pdw = grad_weight.defined() ? grad_weight.data<T>() : nullptr;  // (D,)
  T* pdb = grad_bias.defined() ? grad_bias.data<T>() : nullptr;      // (D,)
  T* pds = grad_x_column_sum.defined() ? grad_x_column_sum.data<T>() : nullptr;  // (D,)
  parallel_for(rows, 6 * d, [&](int64_t r) {
    const T* gr = pg + r * d;
    const T* xr = px + r * d;
    T* dxr = pdx + r * d;
    const double mu = static_cast<double>(pm[r]), rs = static_cast<double>(pr[r]);
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      const double g = load(gr, i) * (pw ? load(pw, i) : 1.0);
      sum_g += g;
      sum_gx += g * (load(xr, i) - mu) * rs;
    }
    const double a = sum_g / static_cast<double>(d), b = sum_gx / static_cast<double>(d);
    for (int64_t i = 0; i < d; ++i) {
      const double g = load(gr, i) * (pw ? load(pw, i) : 1.0);
      const double xhat = (load(xr, i) - mu) * rs;
      dxr[i] = store<T>(rs * (g - a - xhat * b) + (pp ? load(pp, r * d + i) : 0.0));
    }
  });
  if (!pdw && !pdb && !pds) return;
  parallel_for(d, 3 * rows, [&](int64_t i) {
    double dw = 0.0, db = 0.0, ds = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      const double g = load(pg, r * d + i);
      dw += g * (load(px, r * d + i) - static_cast<double>(pm[r])) * static_cast<double>(pr[r]);
      db += g;
      if (pds) ds += load(pdx, r * d + i);
    }
    if (pdw) pdw[i] = store<T>(dw);
    if (pdb) pdb[i] = store<T>(db);
    if (pds) pds[i] = store<T>(ds);
  });
}
}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                        const Tensor& mean, const Tensor& rstd, double eps) {
  dispatch_floating(x.dtype(), "layer_norm", "cpu",
                    [&](auto tag) { forward_typed<decltype(tag)>(x, weight, bias, out, mean, rstd, eps); });
}

void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& pending, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias, const Tensor& grad_x_column_sum) {
  dispatch_floating(x.dtype(), "layer_norm_backward", "cpu", [&](auto tag) {
    backward_typed<decltype(tag)>(grad_out, x, weight, mean, rstd, pending, grad_x, grad_weight, grad_bias,
                                  grad_x_column_sum);
  });
}

}  // namespace tandem::cpu
