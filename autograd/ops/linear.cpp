// The linear layer as one differentiable op: out = act(x @ weight^T + bias). The forward keeps the
// pre-activation when there is an activation; the backward takes the activation's gradient, then
// dx = d @ W, and dW = d^T @ x with the bias gradient (the column sums of d) from the same call
// on CUDA (cuBLASLt's BGRADB epilogue).
#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/kernels.h"

namespace tandem {

using autograd::record;
using autograd::saved;

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation activation) {
  kernels::LinearForward f = kernels::linear_forward(x, weight, bias, activation);
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  // x is kept only when the weight's gradient (which reads it) is wanted.
  return record(f.out, "linear", {x, weight, bias},
                [sx = need_w ? saved(x) : Tensor(), sw = saved(weight), pre = f.pre.defined() ? saved(f.pre) : Tensor(),
                 activation, need_x, need_w, need_b](const Tensor& g) -> std::vector<Tensor> {
                  kernels::LinearGrads grads =
                      kernels::linear_backward(g, sx, sw, pre, activation, need_x, need_w, need_b);
                  return {grads.x, grads.weight, grads.bias};
                });
}

}  // namespace tandem
