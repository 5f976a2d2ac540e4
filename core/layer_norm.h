#pragma once
// Layer norm (device-neutral side, core/layer_norm.cpp). Backends: core/cpu/layer_norm.cpp,
// core/cuda/layer_norm.cu.
#include "tandem/core/tensor.h"

namespace tandem::kernels {

// ---- layer norm (core/layer_norm.cpp) ----
// Normalises each row over x's last dim D (biased variance), then scales by weight and shifts by
// bias, both (D,) in x's dtype or undefined. mean and rstd are (rows,) with rows = numel / D, in
// f32 (f64 for f64 x); rstd = 1 / sqrt(var + eps).
struct LayerNormForward {
  Tensor out;   // like x
  Tensor mean;  // (rows,)
  Tensor rstd;  // (rows,)
};
LayerNormForward layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
// The residual stream's add and the layer norm after it: sum = x + residual, then
// layer_norm(sum). x and residual of one shape, dtype and device. On CUDA one kernel reads x and
// residual once and writes sum and the normalised rows; elsewhere add, then layer_norm_forward.
struct AddLayerNormForward {
  Tensor sum;              // like x
  LayerNormForward norm;   // of sum
};
AddLayerNormForward add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                           const Tensor& bias, double eps);
struct LayerNormGrads {
  Tensor x;       // like x
  Tensor weight;  // (D,), undefined when weight is
  Tensor bias;    // (D,), undefined unless with_bias
};
// pending: undefined, or a gradient like x that grads.x comes back with added in (the gradient
// x's other uses gave; the backward kernel adds it before rounding, saving an add kernel).
LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, bool with_bias, const Tensor& pending = Tensor());

}  // namespace tandem::kernels
