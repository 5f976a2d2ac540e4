#pragma once
// Elementwise ops (device-neutral side): unary, binary with broadcasting, where, in-place add
// and scale. Backends: core/cpu/elementwise.cpp, core/cuda/elementwise.cu.
#include <cstdint>

#include "tandem/core/tensor.h"

namespace tandem {

enum class UnaryOp {
  neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu_tanh, gelu_erf, sign,
  pow_scalar,  // x ^ alpha
  clamp,       // min(max(x, alpha), beta)
  scale,       // x * alpha
  logical_not,
};

enum class BinaryOp {
  add, sub, mul, div, pow, maximum, minimum,
  eq, ne, lt, le, gt, ge,      // produce bool
  relu_backward,               // a * (b > 0): a is the incoming gradient, b the input
  gelu_tanh_backward,          // a * gelu_tanh'(b)
  gelu_erf_backward,           // a * gelu_erf'(b)
};

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);
bool is_comparison(BinaryOp op);
// Ops defined only for floating-point dtypes (exp, div, the activation gradients, ...).
bool is_floating_only(UnaryOp op);
bool is_floating_only(BinaryOp op);

namespace kernels {

Tensor unary(UnaryOp op, const Tensor& x, double alpha = 0.0, double beta = 0.0);
// Broadcasts a and b (NumPy rules); both must share dtype and device.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// cond (bool) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// In-place updates used by optimizers and gradient accumulation (no autograd).
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);  // dst += alpha * src
void mul_(const Tensor& dst, double value);                            // dst *= value

}  // namespace kernels
}  // namespace tandem
