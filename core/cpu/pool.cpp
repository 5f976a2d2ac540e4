// CPU 2-D pooling, one (H, W) plane per parallel task. Windows are clipped to the input, so
// padded positions never win a max; average pooling divides by the padded window or by the
// positions inside the input (count_include_pad). Sums accumulate in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tandem/core/backend.h"
#include "tandem/core/cpu/parallel.h"
#include "tandem/core/dispatch.h"

namespace tandem::cpu {

namespace {
// The part of output (op, oq)'s window that lies inside the (h, w) input, and its average divisor.
struct Window {
  int64_t h0, h1, w0, w1;  // rows [h0, h1), columns [w0, w1)
  double divisor;
};

Window window(const Pool2dParams& p, int64_t op, int64_t oq, int64_t h, int64_t w) {
  int64_t h0 = op * p.stride_h - p.pad_h, w0 = oq * p.stride_w - p.pad_w;
  int64_t h1 = std::min(h0 + p.kernel_h, h + p.pad_h), w1 = std::min(w0 + p.kernel_w, w + p.pad_w);
  const int64_t padded = (h1 - h0) * (w1 - w0);
  h0 = std::max<int64_t>(h0, 0);
  w0 = std::max<int64_t>(w0, 0);
  h1 = std::min(h1, h);
  w1 = std::min(w1, w);
  const int64_t inside = (h1 - h0) * (w1 - w0);
  return {h0, h1, w0, w1, static_cast<double>(p.count_include_pad ? padded : inside)};
}

template <typename T>
void forward_typed(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  using C = compute_t<T>;
  const int64_t planes = x.shape()[0] * x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t ph = out.shape()[2], pw = out.shape()[3];
  const T* px = x.data<T>();  // (N * C, H, W)
  T* po = out.data<T>();      // (N * C, P, Q)
  parallel_for(planes, ph * pw * p.kernel_h * p.kernel_w, [&](int64_t plane) {
    const T* src = px + plane * h * w;  // (H, W)
    T* dst = po + plane * ph * pw;      // (P, Q)
    for (int64_t op = 0; op < ph; ++op) {
      for (int64_t oq = 0; oq < pw; ++oq) {
        const Window win = window(p, op, oq, h, w);
        if (p.mode == PoolMode::max) {
          if (win.h0 >= win.h1 || win.w0 >= win.w1) {  // only with an empty input
            dst[op * pw + oq] = T(-std::numeric_limits<C>::infinity());
            continue;
          }
          C best = static_cast<C>(src[win.h0 * w + win.w0]);
          for (int64_t i = win.h0; i < win.h1; ++i) {
            for (int64_t j = win.w0; j < win.w1; ++j) {
              const C v = static_cast<C>(src[i * w + j]);
              if (v > best || (std::isnan(v) && !std::isnan(best))) best = v;  // the first NaN or maximum wins
            }
          }
          dst[op * pw + oq] = T(best);
        } else {
          double sum = 0.0;
          for (int64_t i = win.h0; i < win.h1; ++i) {
            for (int64_t j = win.w0; j < win.w1; ++j) sum += static_cast<double>(static_cast<C>(src[i * w + j]));
          }
          dst[op * pw + oq] = T(static_cast<C>(sum / win.divisor));
        }
      }
    }
  });
}

template <typename T>
void backward_typed(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Tensor& grad_x,
                    const Pool2dParams& p) {
  using C = compute_t<T>;
  const int64_t planes = x.shape()[0] * x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t ph = grad_out.shape()[2], pw = grad_out.shape()[3];
  const T* pg = grad_out.data<T>();                                 // (N * C, P, Q)
  const T* px = x.data<T>();                                        // (N * C, H, W)
  const T* po = p.mode == PoolMode::max ? out.data<T>() : nullptr;  // (N * C, P, Q)
  T* pgx = grad_x.data<T>();                                        // (N * C, H, W)
  parallel_for(planes, h * w + ph * pw * p.kernel_h * p.kernel_w, [&](int64_t plane) {
    std::vector<double> acc(static_cast<size_t>(h * w), 0.0);  // (H, W): overlapping windows add up here
    const T* src = px + plane * h * w;
    const T* g = pg + plane * ph * pw;
    for (int64_t op = 0; op < ph; ++op) {
      for (int64_t oq = 0; oq < pw; ++oq) {
        const Window win = window(p, op, oq, h, w);
        const double gv = static_cast<double>(static_cast<C>(g[op * pw + oq]));
        if (p.mode == PoolMode::max) {
          // The argmax is the first position holding the output value (NaN matches NaN).
          const C best = static_cast<C>(po[plane * ph * pw + op * pw + oq]);
          bool found = false;
          for (int64_t i = win.h0; i < win.h1 && !found; ++i) {
            for (int64_t j = win.w0; j < win.w1 && !found; ++j) {
              const C v = static_cast<C>(src[i * w + j]);
              if (v == best || (std::isnan(v) && std::isnan(best))) {
                acc[i * w + j] += gv;
                found = true;
              }
            }
          }
        } else {
          const double share = gv / win.divisor;
          for (int64_t i = win.h0; i < win.h1; ++i) {
            for (int64_t j = win.w0; j < win.w1; ++j) acc[i * w + j] += share;
          }
        }
      }
    }
    T* dst = pgx + plane * h * w;
    for (int64_t i = 0; i < h * w; ++i) dst[i] = T(static_cast<C>(acc[i]));
  });
}
}  // namespace

void pool2d_forward(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  dispatch_floating(x.dtype(), p.mode == PoolMode::max ? "max_pool2d" : "avg_pool2d", "cpu",
                    [&](auto tag) { forward_typed<decltype(tag)>(x, out, p); });
}

void pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Tensor& grad_x,
                     const Pool2dParams& p) {
  dispatch_floating(x.dtype(), p.mode == PoolMode::max ? "max_pool2d_backward" : "avg_pool2d_backward", "cpu",
                    [&](auto tag) { backward_typed<decltype(tag)>(grad_out, x, out, grad_x, p); });
}

}  // namespace tandem::cpu
