#pragma once
// Elementwise ops (device-neutral side): unary and its gradient, binary with broadcasting, where,
// in-place add and scale. The ops themselves are the rows of core/elementwise_ops.h. Backends: core/cpu/elementwise.cpp, core/cuda/elementwise.cu.
#include <cstdint>

#include "tandem/core/elementwise_ops.h"
#include "tandem/core/tensor.h"

namespace tandem {

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);
bool is_comparison(BinaryOp op);
// Ops defined only for floating-point dtypes (the rows of domain floating in the tables).
bool is_floating_only(UnaryOp op);
bool is_floating_only(BinaryOp op);

namespace kernels {

// The op's forward formula (core/elementwise_ops.h) on every element; alpha and beta are its scalar
// parameters. pow_scalar with alpha 2 runs as square.
Tensor unary(UnaryOp op, const Tensor& x, double alpha = 0.0, double beta = 0.0);
// The op's gradient with respect to its input: grad * f'(x) elementwise, from its backward
// formula. grad and x share shape, dtype (floating) and device.
Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, double alpha = 0.0, double beta = 0.0);
// Broadcasts a and b (NumPy rules); both must share dtype and device.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// cond (bool) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// In-place updates used by optimizers and gradient accumulation (no autograd).
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);  // dst += alpha * src
void mul_(const Tensor& dst, double value);                            // dst *= value

// g * x for a 0-dim floating g (f32 for half x, x's dtype otherwise) on x's device, without reading
// g on the host: into x itself when in_place (then nothing is written where g is 1), else into a
// new tensor. x must be contiguous. How a backward scales a gradient it computed ahead for an
// upstream gradient of 1 (the fused cross-entropy's).
Tensor scale_unless_one(const Tensor& x, const Tensor& g, bool in_place);

}  // namespace kernels
}  // namespace tandem
