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
// The residual stream's add and the layer norm after it: sum = x + (residual + residual_bias),
// then layer_norm(sum). x and residual of one shape, dtype and device; residual_bias (D,) or
// undefined: the bias of the linear layer that made residual, left out of its matmul so that its
// gradient comes out of the layer norm's backward (see layer_norm_backward). Each add is rounded
// to the dtype, as the add kernels would. On CUDA one kernel reads x, residual and the bias once
// and writes sum and the normalised rows; elsewhere adds, then layer_norm_forward.
struct AddLayerNormForward {
  Tensor sum;              // like x
  LayerNormForward norm;   // of sum
};
AddLayerNormForward add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                           const Tensor& bias, double eps, const Tensor& residual_bias = Tensor());
struct LayerNormGrads {
  Tensor x;             // like x
  Tensor weight;        // (D,), undefined when weight is
  Tensor bias;          // (D,), undefined unless with_bias
  Tensor x_column_sum;  // (D,), undefined unless with_x_column_sum
};
// pending: undefined, or a gradient like x that grads.x comes back with added in (the gradient
// x's other uses gave; the backward kernel adds it before rounding, saving an add kernel).
// with_x_column_sum: also grads.x summed over its rows (after rounding), in the same pass: the
// gradient of a bias added into x (add_layer_norm's residual_bias), without a kernel of its own.
LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, bool with_bias, const Tensor& pending = Tensor(),
                                   bool with_x_column_sum = false);

}  // namespace tandem::kernels
