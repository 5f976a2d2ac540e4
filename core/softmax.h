#pragma once
// Softmax, log-softmax and the fused cross-entropy (device-neutral side). Backends:
// core/cpu/reduce.cpp, core/cuda/softmax.cu.
#include <cstdint>

#include "tandem/core/tensor.h"

namespace tandem::kernels {

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
// The forward above (without lse) and, from the same pass over the logits, the gradient of the
// loss for an upstream gradient of 1: grad (N, C) = (softmax(x) - y) / count, y the (smoothed)
// one-hot target, ignored rows 0. count (0-dim, losses' dtype, on the device) is the mean's
// divisor; undefined for a sum. The same values as cross_entropy_backward with row_grad = 1 / count.
struct CrossEntropyWithGrad {
  Tensor losses;  // (N,)
  Tensor grad;    // (N, C), logits' dtype
};
CrossEntropyWithGrad cross_entropy_with_grad(const Tensor& logits, const Tensor& target, const Tensor& count,
                                             int64_t ignore_index, double label_smoothing);
// d(sum_i w_i * loss_i)/d logits, with per-row weights `row_grad` (N,).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const Tensor& row_grad, int64_t ignore_index, double label_smoothing);

}  // namespace tandem::kernels
