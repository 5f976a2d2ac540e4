#pragma once
// The fused linear layer (device-neutral side, core/linear.cpp). Backend: core/cuda/linear.cpp
// (cuBLASLt epilogues); elsewhere it is composed from matmul and elementwise kernels.
#include "tandem/core/tensor.h"

namespace tandem {

// The activation a fused linear layer applies to x @ W^T + b (gelu_tanh: GELU's tanh form).
enum class Activation { none, gelu_tanh };

namespace kernels {

// ---- linear layer (core/linear.cpp): out = act(x @ weight^T + bias) ----
// x (..., K), weight (N, K), bias (N,) or undefined. On CUDA, cuBLASLt adds the bias and applies
// the activation in the matmul's epilogue; elsewhere matmul, add and gelu are composed. With a
// residual (..., N) (act none only), out = residual + x @ weight^T + bias: on CUDA added in the
// same epilogue (the layer's output never exists apart from the sum), elsewhere by an add.
struct LinearForward {
  Tensor out;  // (..., N)
  Tensor pre;  // (..., N): the pre-activation x @ W^T + b when act != none, else undefined
};
LinearForward linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                             const Tensor& residual = Tensor());
struct LinearGrads {
  Tensor x;       // like x, when asked for
  Tensor weight;  // (N, K), when asked for
  Tensor bias;    // (N,), when asked for
};
// pre is LinearForward::pre (needed when act != none); x is needed only for the weight's gradient.
LinearGrads linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& pre,
                            Activation act, bool need_x, bool need_weight, bool need_bias);

// The pieces linear_backward is made of, for a caller that runs them apart (autograd runs the
// weight's product on a second stream, beside the rest of backward: autograd/side_stream.h).
struct LinearActivationGrads {
  Tensor grad;  // (M, N): d pre, or grad_out as a contiguous matrix when act is none
  Tensor bias;  // (N,): the bias gradient when asked for on CUDA (summed in one pass over grad)
};
LinearActivationGrads linear_backward_activation(const Tensor& grad_out, const Tensor& pre, Activation act,
                                                 bool need_bias);
// dx shaped x_shape from grad (M, N), LinearActivationGrads::grad.
Tensor linear_backward_input(const Tensor& grad, const Tensor& weight, const Shape& x_shape);
// dW (N, K) when need_weight and db (N,) when need_bias, from grad (M, N) and x (..., K) (the bias
// gradient in the weight product's BGRADB epilogue on CUDA).
LinearGrads linear_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& weight, bool need_weight,
                                   bool need_bias);

// Whether a linear layer's backward best makes the weight gradient (N, K) before the input
// gradient: on CUDA where the weight gradient alone takes at least a quarter of the L2 cache, so
// that writing it after the input gradient would push that out of L2 before the node before reads
// it. On one H200 (bf16, replayed), with the input gradient first GELU's backward of the MLP's
// layers read it in 11.2-11.4 us after a 4096 x 4096 weight gradient and in 8.8 after a 1024-wide
// one; with every weight gradient first the MLP's step took 1% less, but GPT-2 B1 T1024's 0.13%
// more (its weight gradients are 1 to 3.4 MiB): hence the size rule, which on another H200 took
// the MLP's replayed step from 0.952-0.957 ms to 0.947-0.949 and GPT-2 B1 T1024's within 0.1%.
// Callers that run the weight gradient beside the rest of backward make the input gradient first,
// which the rest waits for.
bool weight_gradient_first(const Tensor& grad_out, const Tensor& weight);

// The input gradient of a linear layer whose input was gelu_tanh(pre), for gelu_mlp (GELU between layers):
// grad_out (..., N), weight (N, K), pre (..., K) -> .grad = d pre (..., K). One product with GELU's
// backward in its epilogue (cuBLASLt's DGELU, or on sm_90 tandem's CUTLASS kernel where timed
// faster) where input_gelu_in_epilogue says so; elsewhere matmul and gelu's backward. With
// need_bias, .bias (K,) is d pre's column sums (the bias gradient of pre's layer) where the
// product's epilogue summed them (tandem's sm_90 kernel), else undefined: the caller sums them.
LinearActivationGrads linear_backward_input_gelu(const Tensor& grad_out, const Tensor& weight, const Tensor& pre,
                                                 bool need_bias = false);
// Whether linear_backward_input_gelu runs GELU's backward in the matmul's epilogue: on CUDA, in
// bf16 and f16, from 4096 rows, or from 1024 rows where the product sums over at least 4096
// (grad_out's last dim). Elsewhere a caller that also wants the bias gradient of pre's layer
// does better with linear_backward(grad of gelu(pre), ..., Activation::gelu_tanh, ...), which on
// CUDA sums it in GELU's backward pass.
bool input_gelu_in_epilogue(const Tensor& grad_out, const Tensor& weight);

}  // namespace kernels
}  // namespace tandem
