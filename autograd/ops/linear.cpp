// The linear layer as one differentiable op: out = act(x @ weight^T + bias). The forward keeps the
// pre-activation when there is an activation; the backward takes the activation's gradient d with
// the bias gradient (d's column sums, in the same pass on CUDA: core/cuda/bias_gradient.cu), then
// dx = d @ W and dW = d^T @ x (dW first where it is large: kernels::weight_gradient_first; beside
// the rest of backward with autograd/side_stream.h).
#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/autograd/ops/residual_sum.h"
#include "tandem/autograd/side_stream.h"
#include "tandem/core/kernels.h"

namespace tandem {

using autograd::record;
using autograd::saved;

namespace {
// The linear op's node for f, the forward of act(x @ weight^T + bias).
Tensor record_linear(const kernels::LinearForward& f, const Tensor& x, const Tensor& weight, const Tensor& bias,
                     Activation activation) {
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  // x is kept only when the weight's gradient (which reads it) is wanted.
  return record(f.out, "linear", {x, weight, bias},
                [sx = need_w ? saved(x) : Tensor(), sw = saved(weight), pre = f.pre.defined() ? saved(f.pre) : Tensor(),
                 x_shape = x.shape(), activation, need_x, need_w, need_b](const Tensor& g) -> std::vector<Tensor> {
                  // d pre (M, N), and the bias gradient where the activation's pass sums it
                  kernels::LinearActivationGrads a = kernels::linear_backward_activation(g, pre, activation, need_b);
                  const bool bias_left = need_b && !a.bias.defined();
                  const bool weights = need_w || bias_left;
                  auto input_gradient = [&] {
                    return need_x ? kernels::linear_backward_input(a.grad, sw, x_shape) : Tensor();  // like x
                  };
                  auto weight_gradients = [&] {
                    return autograd::run_beside({a.grad, sx}, [&]() -> std::vector<Tensor> {
                      kernels::LinearGrads grads = kernels::linear_backward_weight(a.grad, sx, sw, need_w, bias_left);
                      return {grads.weight, grads.bias};  // (N, K), (N,)
                    });
                  };
                  // dW first where writing it would push dx out of L2 before the node before reads it
                  // (kernels::weight_gradient_first); dx first elsewhere, and where dW goes beside.
                  std::vector<Tensor> w = {Tensor(), Tensor()};
                  Tensor gx;
                  if (weights && need_x && !autograd::weight_gradients_beside() &&
                      kernels::weight_gradient_first(a.grad, sw)) {
                    w = weight_gradients();
                    gx = input_gradient();
                  } else {
                    gx = input_gradient();
                    if (weights) w = weight_gradients();
                  }
                  return {gx, w[0], bias_left ? w[1] : a.bias};
                });
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation activation) {
  return record_linear(kernels::linear_forward(x, weight, bias, activation), x, weight, bias, activation);
}

Tensor detail::linear_into_residual(const Tensor& x, const Tensor& weight, const Tensor& residual,
                                    const Tensor& residual_bias) {
  // The product's node without a bias: residual_bias's gradient comes from the add's node.
  return record_linear(kernels::linear_forward(x, weight, residual_bias, Activation::none, residual), x, weight,
                       Tensor(), Activation::none);
}

}  // namespace tandem
