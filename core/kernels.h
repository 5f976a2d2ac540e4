#pragma once
// Device-neutral kernels: the non-differentiable compute layer under autograd. Each function
// checks its arguments, allocates the output, and hands contiguous or strided views to the
// backend of the inputs' device (core/cpu/ or core/cuda/, see core/backend.h).
#include <cstdint>
#include <vector>

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

enum class ReduceOp { sum, mean, max, min, argmax, argmin };

enum class RandomKind { uniform, normal, bernoulli };

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);
const char* reduce_op_name(ReduceOp op);
bool is_comparison(BinaryOp op);

namespace kernels {

Tensor unary(UnaryOp op, const Tensor& x, double alpha = 0.0, double beta = 0.0);
// Broadcasts a and b (NumPy rules); both must share dtype and device.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// cond (bool) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Reduces `dims` (empty: all); argmax/argmin take exactly one dim (or none: over the flattened
// tensor) and return i64.
Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
// Sums a broadcast gradient back down to `shape` (the inverse of expanding shape to grad's).
Tensor sum_to(const Tensor& grad, const Shape& shape);

Tensor softmax(const Tensor& x, int64_t dim, bool log);
// Gradient of softmax (log=false) or log_softmax (log=true) from its output y.
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log);

// Cross-entropy of logits (N, C) against class indices (N,) (i64 or i32). Returns per-row losses
// (N,) (0 where the target is ignore_index) and per-row log-sum-exp (N,) (f32 for half logits).
struct CrossEntropyForward {
  Tensor losses;  // (N,)
  Tensor lse;     // (N,)
};
CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                          double label_smoothing);
// d(sum_i w_i * loss_i)/d logits, with per-row weights `row_grad` (N,).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const Tensor& row_grad, int64_t ignore_index, double label_smoothing);

// Matrix product with NumPy matmul semantics: 1-D operands are promoted, batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out (shaped like x's input) gets zeros plus src rows added at index along dim.
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);

// Copies src into dst elementwise (same shape; casts dtype; any strides; any devices).
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);
Tensor contiguous(const Tensor& x);  // x itself if already contiguous
Tensor clone(const Tensor& x);       // always a fresh contiguous copy
Tensor to_dtype(const Tensor& x, DType dtype);    // x itself if already that dtype
Tensor to_device(const Tensor& x, Device device);  // x itself if already there

// Fills `out` (contiguous) from the counter-based generator: element i draws from counter
// offset + i under key seed, so every device produces the same numbers.
void random_(const Tensor& out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2);

// In-place updates used by optimizers and gradient accumulation (no autograd).
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);  // dst += alpha * src
void mul_(const Tensor& dst, double value);                            // dst *= value

}  // namespace kernels
}  // namespace tandem
