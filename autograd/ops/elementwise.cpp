// Elementwise ops and their gradients. Broadcast inputs get their gradient summed back to their
// own shape (kernels::sum_to).
#include <cmath>

#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/kernels.h"

namespace tandem {

using autograd::record;
using autograd::saved;

namespace {
// There is no type promotion: a fractional scalar with an integer tensor would be truncated
// silently, so it is an error.
void check_scalar(const Tensor& x, double value) {
  TANDEM_CHECK_AS(TypeError, is_floating(x.dtype()) || value == std::floor(value), "scalar ", value,
                  " with a ", x.dtype(), " tensor would be truncated; convert the tensor with to(x, DType::f32) first");
}

// A 0-dim tensor of x's dtype.
Tensor scalar_like(const Tensor& x, double value) {
  check_scalar(x, value);
  return scalar_tensor(value, x.options());
}
Tensor zeros_scalar(const Tensor& x) { return scalar_like(x, 0.0); }

// An op of the unary table (core/elementwise_ops.h) whose gradient is the table's backward
// formula, computed in one kernel from the saved input.
Tensor table_unary(UnaryOp op, const Tensor& x, double alpha = 0.0, double beta = 0.0) {
  Tensor out = kernels::unary(op, x, alpha, beta);
  return record(out, unary_op_name(op), {x}, [op, sx = saved(x), alpha, beta](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::unary_backward(op, g, sx, alpha, beta)};
  });
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(BinaryOp::add, a, b);
  return record(out, "add", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::sum_to(g, sa), kernels::sum_to(g, sb)};
  });
}

Tensor sub(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(BinaryOp::sub, a, b);
  return record(out, "sub", {a, b}, [sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::sum_to(g, sa), kernels::sum_to(neg(g), sb)};
  });
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(BinaryOp::mul, a, b);
  bool need_a = a.requires_grad(), need_b = b.requires_grad();
  // Save each operand only if the other one needs its gradient.
  return record(out, "mul", {a, b},
                [sa = need_b ? saved(a) : Tensor(), sb = need_a ? saved(b) : Tensor(), shape_a = a.shape(),
                 shape_b = b.shape()](const Tensor& g) -> std::vector<Tensor> {
                  return {sb.defined() ? kernels::sum_to(mul(g, sb), shape_a) : Tensor(),
                          sa.defined() ? kernels::sum_to(mul(g, sa), shape_b) : Tensor()};
                });
}

Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(BinaryOp::div, a, b);
  return record(out, "div", {a, b}, [sa = saved(a), sb = saved(b)](const Tensor& g) -> std::vector<Tensor> {
    Tensor ga = div(g, sb);
    Tensor gb = neg(mul(ga, div(sa, sb)));  // -g * a / b^2
    return {kernels::sum_to(ga, sa.shape()), kernels::sum_to(gb, sb.shape())};
  });
}

Tensor add(const Tensor& a, double b) { return add(a, scalar_like(a, b)); }
Tensor sub(const Tensor& a, double b) { return sub(a, scalar_like(a, b)); }
Tensor mul(const Tensor& a, double b) {
  check_scalar(a, b);
  Tensor out = kernels::unary(UnaryOp::scale, a, b);
  return record(out, "mul", {a}, [b](const Tensor& g) -> std::vector<Tensor> { return {mul(g, b)}; });
}
Tensor div(const Tensor& a, double b) { return mul(a, 1.0 / b); }

namespace {
// Gradient routing of maximum/minimum: all of g to the winner, half to each on a tie.
std::vector<Tensor> pick_backward(const Tensor& g, const Tensor& a, const Tensor& b, BinaryOp wins) {
  Tensor a_wins = kernels::binary(wins, a, b);
  Tensor tie = kernels::binary(BinaryOp::eq, a, b);
  Tensor half = mul(g, 0.5);
  Tensor zero = zeros_scalar(g);
  Tensor ga = kernels::where(a_wins, g, kernels::where(tie, half, zero));
  Tensor gb = kernels::where(a_wins, zero, kernels::where(tie, half, g));
  return {kernels::sum_to(ga, a.shape()), kernels::sum_to(gb, b.shape())};
}
}  // namespace

Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(BinaryOp::maximum, a, b);
  return record(out, "maximum", {a, b}, [sa = saved(a), sb = saved(b)](const Tensor& g) {
    return pick_backward(g, sa, sb, BinaryOp::gt);
  });
}

Tensor minimum(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(BinaryOp::minimum, a, b);
  return record(out, "minimum", {a, b}, [sa = saved(a), sb = saved(b)](const Tensor& g) {
    return pick_backward(g, sa, sb, BinaryOp::lt);
  });
}

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = kernels::binary(BinaryOp::pow, a, b);
  return record(out, "pow", {a, b}, [sa = saved(a), sb = saved(b), so = saved(out)](const Tensor& g) -> std::vector<Tensor> {
    Tensor ga = mul(g, mul(sb, pow(sa, sub(sb, 1.0))));  // g * b * a^(b-1)
    Tensor gb = mul(g, mul(so, log(sa)));                 // g * a^b * ln a
    return {kernels::sum_to(ga, sa.shape()), kernels::sum_to(gb, sb.shape())};
  });
}

Tensor pow(const Tensor& x, double exponent) {
  Tensor out = kernels::unary(UnaryOp::pow_scalar, x, exponent);
  return record(out, "pow", {x}, [sx = saved(x), exponent](const Tensor& g) -> std::vector<Tensor> {
    if (exponent == 0.0) return {zeros_like(g)};
    return {mul(g, mul(pow(sx, exponent - 1.0), exponent))};
  });
}

Tensor neg(const Tensor& x) {
  Tensor out = kernels::unary(UnaryOp::neg, x);
  return record(out, "neg", {x}, [](const Tensor& g) -> std::vector<Tensor> { return {neg(g)}; });
}

Tensor abs(const Tensor& x) {
  Tensor out = kernels::unary(UnaryOp::abs, x);
  return record(out, "abs", {x}, [sx = saved(x)](const Tensor& g) -> std::vector<Tensor> {
    return {mul(g, kernels::unary(UnaryOp::sign, sx))};
  });
}

Tensor exp(const Tensor& x) {
  Tensor out = kernels::unary(UnaryOp::exp, x);
  return record(out, "exp", {x}, [so = saved(out)](const Tensor& g) -> std::vector<Tensor> { return {mul(g, so)}; });
}

Tensor log(const Tensor& x) {
  Tensor out = kernels::unary(UnaryOp::log, x);
  return record(out, "log", {x}, [sx = saved(x)](const Tensor& g) -> std::vector<Tensor> { return {div(g, sx)}; });
}

Tensor sqrt(const Tensor& x) {
  Tensor out = kernels::unary(UnaryOp::sqrt, x);
  return record(out, "sqrt", {x}, [so = saved(out)](const Tensor& g) -> std::vector<Tensor> {
    return {div(mul(g, 0.5), so)};
  });
}

Tensor rsqrt(const Tensor& x) {
  Tensor out = kernels::unary(UnaryOp::rsqrt, x);
  return record(out, "rsqrt", {x}, [so = saved(out)](const Tensor& g) -> std::vector<Tensor> {
    return {mul(g, mul(pow(so, 3.0), -0.5))};  // d x^-1/2 = -1/2 x^-3/2
  });
}

Tensor tanh(const Tensor& x) {
  Tensor out = kernels::unary(UnaryOp::tanh, x);
  return record(out, "tanh", {x}, [so = saved(out)](const Tensor& g) -> std::vector<Tensor> {
    return {mul(g, sub(scalar_like(so, 1.0), mul(so, so)))};
  });
}

Tensor sigmoid(const Tensor& x) {
  Tensor out = kernels::unary(UnaryOp::sigmoid, x);
  return record(out, "sigmoid", {x}, [so = saved(out)](const Tensor& g) -> std::vector<Tensor> {
    return {mul(g, mul(so, sub(scalar_like(so, 1.0), so)))};
  });
}

Tensor relu(const Tensor& x) {
  Tensor out = kernels::unary(UnaryOp::relu, x);
  // The backward keeps the output, not the input (out > 0 exactly where x > 0): the next layer
  // keeps the output anyway, so x can be freed (a ReLU after batch norm frees the norm's output).
  return record(out, "relu", {x}, [sy = saved(out)](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::unary_backward(UnaryOp::relu, g, sy)};
  });
}

Tensor gelu(const Tensor& x, GeluApproximate approximate) {
  bool tanh_form = approximate == GeluApproximate::tanh;
  Tensor out = kernels::unary(tanh_form ? UnaryOp::gelu_tanh : UnaryOp::gelu_erf, x);
  return record(out, "gelu", {x}, [sx = saved(x), tanh_form](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::unary_backward(tanh_form ? UnaryOp::gelu_tanh : UnaryOp::gelu_erf, g, sx)};
  });
}

Tensor clamp(const Tensor& x, double min, double max) {
  TANDEM_CHECK_AS(ValueError, min <= max, "clamp: min ", min, " must not exceed max ", max);
  // The gradient passes where x lies inside [min, max], boundaries included.
  return table_unary(UnaryOp::clamp, x, min, max);
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  TANDEM_CHECK_AS(ValueError, min || max, "clamp: at least one of min and max must be given");
  if (min && max) return clamp(x, *min, *max);
  return min ? clamp_min(x, *min) : clamp_max(x, *max);
}

Tensor clamp_min(const Tensor& x, double min) { return table_unary(UnaryOp::clamp_min, x, min); }
Tensor clamp_max(const Tensor& x, double max) { return table_unary(UnaryOp::clamp_max, x, max); }

Tensor sin(const Tensor& x) { return table_unary(UnaryOp::sin, x); }
Tensor cos(const Tensor& x) { return table_unary(UnaryOp::cos, x); }
Tensor silu(const Tensor& x) { return table_unary(UnaryOp::silu, x); }

Tensor softplus(const Tensor& x, double beta, double threshold) {
  TANDEM_CHECK_AS(ValueError, beta != 0.0, "softplus: beta must be non-zero, got ", beta);
  return table_unary(UnaryOp::softplus, x, beta, threshold);
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return add(neg(b), a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(double a, const Tensor& b) { return div(scalar_like(b, a), b); }
Tensor operator-(const Tensor& x) { return neg(x); }

Tensor eq(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return kernels::binary(BinaryOp::ge, a, b); }
Tensor eq(const Tensor& a, double b) { return eq(a, scalar_like(a, b)); }
Tensor lt(const Tensor& a, double b) { return lt(a, scalar_like(a, b)); }
Tensor gt(const Tensor& a, double b) { return gt(a, scalar_like(a, b)); }
Tensor logical_not(const Tensor& x) { return kernels::unary(UnaryOp::logical_not, x); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Tensor out = kernels::where(cond, a, b);
  return record(out, "where", {a, b}, [c = saved(cond), sa = a.shape(), sb = b.shape()](const Tensor& g) -> std::vector<Tensor> {
    Tensor zero = zeros_scalar(g);
    return {kernels::sum_to(kernels::where(c, g, zero), sa), kernels::sum_to(kernels::where(c, zero, g), sb)};
  });
}

Tensor where(const Tensor& cond, const Tensor& a, double b) { return where(cond, a, scalar_like(a, b)); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  Tensor out = where(mask, scalar_like(x, value), x);
  TANDEM_CHECK_AS(ValueError, out.shape() == x.shape(), "masked_fill: mask shape ", shape_str(mask.shape()),
                  " must broadcast to the tensor's ", shape_str(x.shape()), " without growing it");
  return out;
}

namespace {
// (n, m) bool: true at (i, j) where j - i <= diagonal (lower) or >= diagonal (upper), for the last
// two dims (n, m) of x, on x's device.
Tensor triangle_mask(const Tensor& x, int64_t diagonal, bool lower) {
  const char* op = lower ? "tril" : "triu";
  TANDEM_CHECK_AS(ValueError, x.dim() >= 2, op, ": expected a tensor of at least 2 dims, got shape ",
                  shape_str(x.shape()));
  const int64_t n = x.size(-2), m = x.size(-1);
  TensorOptions index(DType::i64, x.device());
  Tensor rows = arange(0.0, static_cast<double>(n), 1.0, index).as_strided({n, 1}, {1, 0}, 0);  // (n, 1)
  Tensor cols = arange(0.0, static_cast<double>(m), 1.0, index).as_strided({1, m}, {0, 1}, 0);  // (1, m)
  Tensor offset = kernels::binary(BinaryOp::sub, cols, rows);                                    // (n, m)
  return kernels::binary(lower ? BinaryOp::le : BinaryOp::ge, offset,
                         scalar_tensor(static_cast<double>(diagonal), index));
}
}  // namespace

Tensor tril(const Tensor& x, int64_t diagonal) { return where(triangle_mask(x, diagonal, true), x, 0.0); }
Tensor triu(const Tensor& x, int64_t diagonal) { return where(triangle_mask(x, diagonal, false), x, 0.0); }

}  // namespace tandem
