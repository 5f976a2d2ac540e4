#pragma once
// Inside autograd/ops: a product whose output goes straight into add_layer_norm, with that add in
// the product's epilogue (linear_add_layer_norm and gelu_mlp_add_layer_norm in ops.h). The
// *_into_residual functions return the product's node's output holding residual + product +
// residual_bias, the sum's value, recorded as the product alone: its node differentiates the
// product, and the add's node that add_layer_norm_of_sum records on those values gives residual
// and residual_bias their gradients, as add_layer_norm does. The product's own output never
// exists apart from the sum.
#include <utility>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::detail {

// x (..., K) @ weight (N, K)^T, with residual (..., N) and residual_bias (N,) (or undefined) added.
Tensor linear_into_residual(const Tensor& x, const Tensor& weight, const Tensor& residual,
                            const Tensor& residual_bias);

// gelu_mlp(x, weights, biases) with the last layer's bias undefined, residual (..., N_last) and
// residual_bias (N_last,) (or undefined) added.
Tensor gelu_mlp_into_residual(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases,
                              const Tensor& residual, const Tensor& residual_bias);

// add_layer_norm(product's differentiable value, residual, ..., residual_bias) where `product`
// already holds the sum (an *_into_residual result): its add's node and a plain layer norm of it.
std::pair<Tensor, Tensor> add_layer_norm_of_sum(const Tensor& product, const Tensor& residual,
                                                const Shape& normalized_shape, const Tensor& weight,
                                                const Tensor& bias, double eps, const Tensor& residual_bias);

}  // namespace tandem::detail
