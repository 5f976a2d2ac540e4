#pragma once
// The tables of elementwise ops. One row per op: from these rows follow the UnaryOp and BinaryOp
// enums, their names, the float-only predicate, the scalar formulas the CPU and CUDA backends
// compute (host and device code alike), and for unary ops the gradient kernel. Adding a unary op
// with a gradient is one row here plus its autograd wrapper (autograd/ops/elementwise.cpp) and its
// tests; see "Adding an op" in docs/architecture.md.
#include <type_traits>

#include "tandem/core/scalar_math.h"

namespace tandem {

// X(op, name, domain, forward, backward)
//   op       the enumerator; name: how errors and profiles call it
//   domain   floating (f32, f64, f16, bf16) or numeric (the integers too)
//   forward  the value at x, in the compute type C (f32 for 16-bit floats); alpha and beta are
//            the op's scalar parameters (kernels::unary's alpha and beta)
//   backward the gradient with respect to x given the incoming gradient g: g * f'(x), written
//            so that a zero derivative gives 0 even for an infinite g (as PyTorch does)
#define TANDEM_UNARY_OPS(X)                                                                             \
  X(neg, "neg", numeric, C(-x), C(-g))                                                                  \
  X(abs, "abs", numeric, x < C(0) ? C(-x) : x, x < C(0) ? C(-g) : (x > C(0) ? g : C(0)))                 \
  X(sign, "sign", numeric, C((C(0) < x) - (x < C(0))), C(0))                                            \
  X(relu, "relu", numeric, x > C(0) ? x : C(0), x > C(0) ? g : C(0))                                    \
  X(scale, "scale", numeric, C(x * alpha), C(g * alpha)) /* x * alpha */                                \
  X(clamp, "clamp", numeric, x < alpha ? alpha : (x > beta ? beta : x),                                 \
    (x >= alpha && x <= beta) ? g : C(0)) /* into [alpha, beta] */                                      \
  X(clamp_min, "clamp_min", numeric, x < alpha ? alpha : x, x >= alpha ? g : C(0))                      \
  X(clamp_max, "clamp_max", numeric, x > alpha ? alpha : x, x <= alpha ? g : C(0))                      \
  X(square, "square", numeric, C(x * x), C(g * C(2) * x))                                               \
  X(exp, "exp", floating, std::exp(x), g * std::exp(x))                                                 \
  X(log, "log", floating, std::log(x), g / x)                                                           \
  X(sqrt, "sqrt", floating, std::sqrt(x), g * C(0.5) / std::sqrt(x))                                    \
  X(rsqrt, "rsqrt", floating, C(1) / std::sqrt(x), g * C(-0.5) / (x * std::sqrt(x)))                    \
  X(pow_scalar, "pow", floating, std::pow(x, alpha), g * alpha * std::pow(x, alpha - C(1))) /* x^alpha */ \
  X(sin, "sin", floating, std::sin(x), g * std::cos(x))                                                 \
  X(cos, "cos", floating, std::cos(x), -g * std::sin(x))                                                \
  X(tanh, "tanh", floating, std::tanh(x), g * (C(1) - std::tanh(x) * std::tanh(x)))                     \
  X(sigmoid, "sigmoid", floating, math::sigmoid(x), g * math::sigmoid(x) * (C(1) - math::sigmoid(x)))    \
  X(silu, "silu", floating, x * math::sigmoid(x), g * math::silu_grad(x))                               \
  X(softplus, "softplus", floating, math::softplus(x, alpha, beta), g * math::softplus_grad(x, alpha, beta)) \
  X(gelu_tanh, "gelu(tanh)", floating, math::gelu_tanh(x), g * math::gelu_tanh_grad(x))                 \
  X(gelu_erf, "gelu(erf)", floating, math::gelu_erf(x), g * math::gelu_erf_grad(x))

// X(op, name, domain, formula): domain floating, numeric or comparison (bool out, every dtype).
#define TANDEM_BINARY_OPS(X)                                      \
  X(add, "add", numeric, C(x + y))                                \
  X(sub, "sub", numeric, C(x - y))                                \
  X(mul, "mul", numeric, C(x * y))                                \
  X(maximum, "maximum", numeric, math::nan_max(x, y))             \
  X(minimum, "minimum", numeric, math::nan_min(x, y))             \
  X(div, "div", floating, x / y)                                  \
  X(pow, "pow", floating, std::pow(x, y))                         \
  X(eq, "eq", comparison, x == y)                                 \
  X(ne, "ne", comparison, x != y)                                 \
  X(lt, "lt", comparison, x < y)                                  \
  X(le, "le", comparison, x <= y)                                 \
  X(gt, "gt", comparison, x > y)                                  \
  X(ge, "ge", comparison, x >= y)

#define TANDEM_ENUMERATOR(op, ...) op,
// logical_not (bool out, every dtype) is outside the table: it is not arithmetic.
enum class UnaryOp { TANDEM_UNARY_OPS(TANDEM_ENUMERATOR) logical_not };
enum class BinaryOp { TANDEM_BINARY_OPS(TANDEM_ENUMERATOR) };
#undef TANDEM_ENUMERATOR

namespace elementwise {

enum class Domain { floating, numeric, comparison };

// Whether an op of `domain` is computed in the compute type C (float-only ops are not
// instantiated for integers).
template <Domain domain, typename C>
constexpr bool computes_in = domain != Domain::floating || std::is_floating_point_v<C>;

template <UnaryOp op>
struct UnaryFormula;
template <BinaryOp op>
struct BinaryFormula;

#define TANDEM_UNARY_FORMULA(op, name, domain, forward_expr, backward_expr)          \
  template <>                                                                        \
  struct UnaryFormula<UnaryOp::op> {                                                 \
    static constexpr Domain kDomain = Domain::domain;                                \
    template <typename C>                                                            \
    TANDEM_HOST_DEVICE static C forward(C x, C alpha, C beta) {                      \
      (void)alpha;                                                                   \
      (void)beta;                                                                    \
      return forward_expr;                                                           \
    }                                                                                \
    template <typename C>                                                            \
    TANDEM_HOST_DEVICE static C backward(C g, C x, C alpha, C beta) {                \
      (void)alpha;                                                                   \
      (void)beta;                                                                    \
      return backward_expr;                                                          \
    }                                                                                \
  };
TANDEM_UNARY_OPS(TANDEM_UNARY_FORMULA)
#undef TANDEM_UNARY_FORMULA

#define TANDEM_BINARY_FORMULA(op, name, domain, formula)                             \
  template <>                                                                        \
  struct BinaryFormula<BinaryOp::op> {                                               \
    static constexpr Domain kDomain = Domain::domain;                                \
    template <typename C>                                                            \
    TANDEM_HOST_DEVICE static auto apply(C x, C y) { return formula; }               \
  };
TANDEM_BINARY_OPS(TANDEM_BINARY_FORMULA)
#undef TANDEM_BINARY_FORMULA

// The element functions the backends map over tensors, on the compute type C.
template <UnaryOp op, typename C>
struct UnaryForward {
  C alpha, beta;
  TANDEM_HOST_DEVICE C operator()(C x) const { return UnaryFormula<op>::forward(x, alpha, beta); }
};
template <UnaryOp op, typename C>
struct UnaryBackward {
  C alpha, beta;
  TANDEM_HOST_DEVICE C operator()(C g, C x) const { return UnaryFormula<op>::backward(g, x, alpha, beta); }
};
template <BinaryOp op, typename C>
struct BinaryApply {
  TANDEM_HOST_DEVICE auto operator()(C x, C y) const { return BinaryFormula<op>::apply(x, y); }
};

// Calls run(UnaryForward<op, C>{alpha, beta}) for the op; false (nothing run) when the op is not
// computed in C or is logical_not. Both backends route through this one switch.
template <typename C, typename Run>
bool visit_unary(UnaryOp op, C alpha, C beta, Run&& run) {
  switch (op) {
#define TANDEM_UNARY_CASE(o, ...)                                        \
  case UnaryOp::o:                                                       \
    if constexpr (computes_in<UnaryFormula<UnaryOp::o>::kDomain, C>) {   \
      run(UnaryForward<UnaryOp::o, C>{alpha, beta});                     \
      return true;                                                       \
    }                                                                    \
    return false;
    TANDEM_UNARY_OPS(TANDEM_UNARY_CASE)
#undef TANDEM_UNARY_CASE
    case UnaryOp::logical_not: return false;
  }
  return false;
}

// The same for the gradient kernels (floating C only): run(UnaryBackward<op, C>{alpha, beta}).
template <typename C, typename Run>
bool visit_unary_backward(UnaryOp op, C alpha, C beta, Run&& run) {
  switch (op) {
#define TANDEM_UNARY_CASE(o, ...)                       \
  case UnaryOp::o:                                      \
    run(UnaryBackward<UnaryOp::o, C>{alpha, beta});     \
    return true;
    TANDEM_UNARY_OPS(TANDEM_UNARY_CASE)
#undef TANDEM_UNARY_CASE
    case UnaryOp::logical_not: return false;
  }
  return false;
}

// Calls run(BinaryApply<op, C>{}) (its result is bool for comparisons, else C); false when the op
// is not computed in C.
template <typename C, typename Run>
bool visit_binary(BinaryOp op, Run&& run) {
  switch (op) {
#define TANDEM_BINARY_CASE(o, ...)                                       \
  case BinaryOp::o:                                                      \
    if constexpr (computes_in<BinaryFormula<BinaryOp::o>::kDomain, C>) { \
      run(BinaryApply<BinaryOp::o, C>{});                                \
      return true;                                                       \
    }                                                                    \
    return false;
    TANDEM_BINARY_OPS(TANDEM_BINARY_CASE)
#undef TANDEM_BINARY_CASE
  }
  return false;
}

}  // namespace elementwise
}  // namespace tandem
