// CPU reductions, softmax, the fused cross-entropy and the squared error with its gradient. Float
// types accumulate in double here: the CPU backend is the reference the CUDA backend is checked
// against.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "tandem/core/backend.h"
#include "tandem/core/content_hash.h"
#include "tandem/core/dispatch.h"
#include "tandem/core/scalar_math.h"

namespace tandem::cpu {

namespace {
template <typename T>
using acc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;

template <typename T>
void reduce_typed(ReduceOp op, const Tensor& x, const Tensor& out) {
  using A = acc_t<T>;
  const int64_t outer = x.shape()[0], n = x.shape()[1], inner = x.shape()[2];
  const T* src = x.data<T>();
  bool arg = op == ReduceOp::argmax || op == ReduceOp::argmin;
  std::vector<A> acc(static_cast<size_t>(inner));
  std::vector<int64_t> best(static_cast<size_t>(inner));
  for (int64_t o = 0; o < outer; ++o) {
    const T* block = src + o * n * inner;  // (n, inner)
    for (int64_t i = 0; i < inner; ++i) {
      acc[i] = (op == ReduceOp::sum || op == ReduceOp::mean) ? A(0) : static_cast<A>(static_cast<compute_t<T>>(block[i]));
      best[i] = 0;
    }
    for (int64_t r = (op == ReduceOp::sum || op == ReduceOp::mean) ? 0 : 1; r < n; ++r) {
      const T* row = block + r * inner;
      for (int64_t i = 0; i < inner; ++i) {
        A v = static_cast<A>(static_cast<compute_t<T>>(row[i]));
        switch (op) {
          case ReduceOp::sum:
          case ReduceOp::mean: acc[i] += v; break;
          case ReduceOp::max: acc[i] = math::nan_max(acc[i], v); break;
          case ReduceOp::min: acc[i] = math::nan_min(acc[i], v); break;
          case ReduceOp::argmax:
            // The first maximum wins; a NaN counts as the maximum.
            if (!(acc[i] != acc[i]) && (v > acc[i] || v != v)) {
              acc[i] = v;
              best[i] = r;
            }
            break;
          case ReduceOp::argmin:
            if (!(acc[i] != acc[i]) && (v < acc[i] || v != v)) {
              acc[i] = v;
              best[i] = r;
            }
            break;
        }
      }
    }
    if (arg) {
      int64_t* dst = out.data<int64_t>() + o * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] = best[i];
    } else {
      T* dst = out.data<T>() + o * inner;
      for (int64_t i = 0; i < inner; ++i) {
        A v = acc[i];
        if (op == ReduceOp::mean) v = n == 0 ? std::numeric_limits<A>::quiet_NaN() : v / static_cast<A>(n);
        dst[i] = T(static_cast<compute_t<T>>(v));
      }
    }
  }
}
}  // namespace

void reduce(ReduceOp op, const Tensor& x, const Tensor& out) {
  dispatch_numeric(x.dtype(), reduce_op_name(op), "cpu", [&](auto tag) { reduce_typed<decltype(tag)>(op, x, out); });
}

void content_hash(const Tensor& x, const Tensor& out) {
  const auto* bytes = static_cast<const unsigned char*>(x.data_ptr());
  const size_t n = x.nbytes();
  uint64_t sum = 0;
  for (size_t i = 0; i * 8 < n; ++i) {
    uint64_t word = 0;  // little-endian, as the GPU assembles the last, partial word
    std::memcpy(&word, bytes + i * 8, std::min<size_t>(8, n - i * 8));
    sum += hashing::mix(word, i);
  }
  *static_cast<int64_t*>(out.data_ptr()) = static_cast<int64_t>(sum);
}

void softmax(const Tensor& x, const Tensor& out, bool log) {
  dispatch_floating(x.dtype(), log ? "log_softmax" : "softmax", "cpu", [&](auto tag) {
    using T = decltype(tag);
    const int64_t outer = x.shape()[0], n = x.shape()[1], inner = x.shape()[2];
    const T* src = x.data<T>();
    T* dst = out.data<T>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        const T* in = src + o * n * inner + i;
        T* y = dst + o * n * inner + i;
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t r = 0; r < n; ++r) m = std::max(m, static_cast<double>(in[r * inner]));
        double sum = 0.0;
        for (int64_t r = 0; r < n; ++r) sum += std::exp(static_cast<double>(in[r * inner]) - m);
        double lse = m + std::log(sum);
        for (int64_t r = 0; r < n; ++r) {
          double v = static_cast<double>(in[r * inner]) - lse;
          y[r * inner] = T(static_cast<compute_t<T>>(log ? v : std::exp(v)));
        }
      }
    }
  });
}

void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& out, bool log) {
  dispatch_floating(y.dtype(), "softmax_backward", "cpu", [&](auto tag) {
    using T = decltype(tag);
    const int64_t outer = y.shape()[0], n = y.shape()[1], inner = y.shape()[2];
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; ++i) {
        int64_t base = o * n * inner + i;
        const T* g = grad.data<T>() + base;
        const T* yy = y.data<T>() + base;
        T* dx = out.data<T>() + base;
        // softmax: dx = y * (g - sum(g * y));  log_softmax: dx = g - exp(y) * sum(g)
        double dot = 0.0;
        for (int64_t r = 0; r < n; ++r) {
          double gv = static_cast<double>(g[r * inner]);
          dot += log ? gv : gv * static_cast<double>(yy[r * inner]);
        }
        for (int64_t r = 0; r < n; ++r) {
          double gv = static_cast<double>(g[r * inner]), yv = static_cast<double>(yy[r * inner]);
          double v = log ? gv - std::exp(yv) * dot : yv * (gv - dot);
          dx[r * inner] = T(static_cast<compute_t<T>>(v));
        }
      }
    }
  });
}

namespace {
void check_target(int64_t t, int64_t row, int64_t classes) {
  TANDEM_CHECK_AS(IndexError, t >= 0 && t < classes, "cross_entropy: target ", t, " of row ", row,
                  " is out of range for ", classes, " classes (expected 0 to ", classes - 1, ", or ignore_index)");
}
}  // namespace

void cross_entropy_forward(const Tensor& logits, const Tensor& target, const Tensor& losses, const Tensor& lse,
                           int64_t ignore_index, double smoothing) {
  dispatch_floating(logits.dtype(), "cross_entropy", "cpu", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;  // the dtype of losses and lse (f32 for half logits)
    const int64_t n = logits.shape()[0], c = logits.shape()[1];
    for (int64_t row = 0; row < n; ++row) {
      const T* x = logits.data<T>() + row * c;
      double m = -std::numeric_limits<double>::infinity(), total = 0.0;
      for (int64_t j = 0; j < c; ++j) {
        m = std::max(m, static_cast<double>(x[j]));
        total += static_cast<double>(x[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(x[j]) - m);
      double row_lse = m + std::log(sum);
      lse.data<S>()[row] = static_cast<S>(row_lse);
      int64_t t = target.data<int64_t>()[row];
      if (t == ignore_index) {
        losses.data<S>()[row] = S(0);
        continue;
      }
      check_target(t, row, c);
      // -log p_t with the target spread as (1 - eps) on t and eps / C on every class.
      double loss = row_lse - (1.0 - smoothing) * static_cast<double>(x[t]) - smoothing / c * total;
      losses.data<S>()[row] = static_cast<S>(loss);
    }
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& row_grad,
                            const Tensor& out, int64_t ignore_index, double smoothing) {
  dispatch_floating(logits.dtype(), "cross_entropy_backward", "cpu", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;
    const int64_t n = logits.shape()[0], c = logits.shape()[1];
    for (int64_t row = 0; row < n; ++row) {
      const T* x = logits.data<T>() + row * c;
      T* dx = out.data<T>() + row * c;
      int64_t t = target.data<int64_t>()[row];
      if (t == ignore_index) {
        for (int64_t j = 0; j < c; ++j) dx[j] = T(0);
        continue;
      }
      check_target(t, row, c);
      double g = static_cast<double>(row_grad.data<S>()[row]);
      double row_lse = static_cast<double>(lse.data<S>()[row]);
      for (int64_t j = 0; j < c; ++j) {
        double p = std::exp(static_cast<double>(x[j]) - row_lse);
        double y = smoothing / c + (j == t ? 1.0 - smoothing : 0.0);
        dx[j] = T(static_cast<S>(g * (p - y)));
      }
    }
  });
}

void squared_error_with_grad(const Tensor& input, const Tensor& target, bool mean, const Tensor& loss,
                             const Tensor& grad) {
  dispatch_floating(input.dtype(), "mse_loss", "cpu", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;  // the differences and gradients, as the CUDA kernel computes them
    const int64_t n = input.numel();
    const C unit = mean ? static_cast<C>(1.0 / static_cast<double>(n)) : C(1);
    const T* x = input.data<T>();   // (n,)
    const T* y = target.data<T>();  // (n,)
    T* g = grad.data<T>();          // (n,)
    double squares = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const C d = static_cast<C>(x[i]) - static_cast<C>(y[i]);
      const C half = unit * d;  // the mean's share of the gradient, added twice: d(d^2) = 2 d
      g[i] = T(half + half);
      squares += static_cast<double>(d) * static_cast<double>(d);
    }
    loss.data<C>()[0] = static_cast<C>(mean ? squares / static_cast<double>(n) : squares);  // in the compute type
  });
}

void cross_entropy_with_grad(const Tensor& logits, const Tensor& target, const Tensor& count, const Tensor& losses,
                             const Tensor& grad, int64_t ignore_index, double smoothing) {
  // On the CPU nothing is saved by fusing: the forward, then the backward with every row's
  // weight 1 / count (for the same values as cross_entropy_backward with row_grad = g / count, g = 1).
  const int64_t n = logits.shape()[0];
  Tensor lse = empty({n}, losses.options());
  cross_entropy_forward(logits, target, losses, lse, ignore_index, smoothing);
  Tensor row_grad = empty({n}, losses.options());  // (N,)
  dispatch_floating(losses.dtype(), "cross_entropy_with_grad", "cpu", [&](auto tag) {
    using S = decltype(tag);
    const double divisor = count.defined() ? static_cast<double>(count.data<S>()[0]) : 1.0;
    const S unit = static_cast<S>(1.0 / divisor);  // the correctly rounded quotient, as S's own division gives
    for (int64_t row = 0; row < n; ++row) row_grad.data<S>()[row] = unit;
  });
  cross_entropy_backward(logits, target, lse, row_grad, grad, ignore_index, smoothing);
}

}  // namespace tandem::cpu
