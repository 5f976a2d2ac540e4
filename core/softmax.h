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
// d(sum_i w_i * loss_i)/d logits, with per-row weights `row_grad` (N,).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const Tensor& row_grad, int64_t ignore_index, double label_smoothing);

}  // namespace tandem::kernels
