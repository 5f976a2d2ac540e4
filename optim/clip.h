#pragma once
// Gradient clipping by global norm, like torch.nn.utils.clip_grad_norm_.
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::optim {

// Scales the gradients of `params` in place by min(1, max_norm / (norm + 1e-6)), where norm is
// the L2 norm of all of them together, and returns that norm (before clipping) as a 0-dim tensor
// on the first gradient's device: f32, or f64 when a gradient is f64. Parameters without a
// gradient are skipped (no gradient at all: a 0 on the cpu). Everything stays on the device: the
// host never waits for the norm.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

// The squares are summed in f64 whatever the gradients' dtype, so the norm (rounded to f32 for
// 16-bit and f32 gradients) hardly depends on the order of the sum: split across ranks (ZeRO), it
// comes out the same.
//
// The two halves of clip_grad_norm_, for gradients split across ranks (ZeRO), whose partial sums
// are all-reduced in between. grad_squared_norm: the sum of squares of the gradients of `params`
// as a 0-dim f64 tensor on `device` (a 0 when none has a gradient). clip_grads_to_norm_: scales
// those gradients by min(1, max_norm / (norm + 1e-6)), computed in norm's dtype.
Tensor grad_squared_norm(const std::vector<Tensor>& params, Device device);
void clip_grads_to_norm_(const std::vector<Tensor>& params, const Tensor& norm, double max_norm);

}  // namespace tandem::optim
