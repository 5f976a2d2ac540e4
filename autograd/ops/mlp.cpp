// The transformer's two-layer GELU MLP as one differentiable op:
//   pre = x W_fc^T + b_fc, h = gelu_tanh(pre), y = h W_proj^T + b_proj.
// Backward, from g = dy: d pre = gelu'(pre) * (g W_proj), in one matmul with the DGELU epilogue in
// 16 bits from 4096 rows on CUDA (on sm_90, where tandem's kernel runs it, with fc's bias gradient
// summed in the same epilogue), else as the linear op does it (the matmul, then GELU's backward
// with fc's bias gradient in one pass on CUDA); then fc's input gradient from d pre. The bias
// gradients are column sums of g and d pre (on CUDA in one pass over each, where no epilogue or
// GELU's pass summed fc's: core/cuda/bias_gradient.cu); the two weight gradients (dW_proj = g^T h and dW_fc =
// d pre^T x) run beside the rest of backward (autograd/side_stream.h). Saved: x, pre and h, as the
// two linear ops would keep them.
#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/autograd/side_stream.h"
#include "tandem/core/kernels.h"

namespace tandem {

using autograd::record;
using autograd::saved;

Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
                const Tensor& proj_bias) {
  kernels::LinearForward fc = kernels::linear_forward(x, fc_weight, fc_bias, Activation::gelu_tanh);
  kernels::LinearForward proj = kernels::linear_forward(fc.out, proj_weight, proj_bias, Activation::none);
  const bool need_x = x.requires_grad(), need_fc_w = fc_weight.requires_grad();
  const bool need_fc_b = fc_bias.defined() && fc_bias.requires_grad();
  const bool need_proj_w = proj_weight.requires_grad();
  const bool need_proj_b = proj_bias.defined() && proj_bias.requires_grad();
  const bool need_pre = need_x || need_fc_w || need_fc_b;
  return record(
      proj.out, "gelu_mlp", {x, fc_weight, fc_bias, proj_weight, proj_bias},
      [sx = need_fc_w ? saved(x) : Tensor(), s_fc_w = saved(fc_weight), s_proj_w = saved(proj_weight),
       pre = saved(fc.pre), h = need_proj_w ? saved(fc.out) : Tensor(), x_shape = x.shape(), need_x, need_fc_w,
       need_fc_b, need_proj_w, need_proj_b, need_pre](const Tensor& g) -> std::vector<Tensor> {
        // g as a matrix (M, C'), and the projection's bias gradient where CUDA sums it here
        kernels::LinearActivationGrads proj_a =
            kernels::linear_backward_activation(g, Tensor(), Activation::none, need_proj_b);
        const Tensor& g2 = proj_a.grad;
        // d pre (M, H), and fc's bias gradient where GELU's backward pass sums it: GELU's backward in
        // the DGELU epilogue of the product that makes d h, or (elsewhere) after that product, in
        // one pass with fc's bias gradient.
        kernels::LinearActivationGrads fc_a;
        if (need_pre) {
          if (kernels::input_gelu_in_epilogue(g, s_proj_w)) {
            // fc's bias gradient from the product's epilogue where it can, else in a pass of its own
            kernels::LinearActivationGrads through = kernels::linear_backward_input_gelu(g, s_proj_w, pre, need_fc_b);
            fc_a = kernels::linear_backward_activation(through.grad, Tensor(), Activation::none,
                                                       need_fc_b && !through.bias.defined());
            if (through.bias.defined()) fc_a.bias = through.bias;
          } else {
            Tensor dh = kernels::linear_backward_input(g2, s_proj_w, pre.shape());  // (..., H)
            fc_a = kernels::linear_backward_activation(dh, pre, Activation::gelu_tanh, need_fc_b);
          }
        }
        // The projection's weight gradient (dW_proj = g^T h), and its bias gradient where not summed
        // above, beside.
        const bool proj_bias_left = need_proj_b && !proj_a.bias.defined();
        std::vector<Tensor> proj = {Tensor(), proj_a.bias};
        if (need_proj_w || proj_bias_left) {
          proj = autograd::run_beside({g2, h}, [&]() -> std::vector<Tensor> {
            kernels::LinearGrads w = kernels::linear_backward_weight(g2, h, s_proj_w, need_proj_w, proj_bias_left);
            return {w.weight, w.bias};  // (C', H), (C',)
          });
          if (!proj_bias_left) proj[1] = proj_a.bias;
        }
        if (!need_pre) return {Tensor(), Tensor(), Tensor(), proj[0], proj[1]};
        Tensor gx = need_x ? kernels::linear_backward_input(fc_a.grad, s_fc_w, x_shape) : Tensor();  // like x
        // fc's weight gradient, and its bias gradient where not summed above, beside.
        const bool fc_bias_left = need_fc_b && !fc_a.bias.defined();
        std::vector<Tensor> fc = {Tensor(), fc_a.bias};
        if (need_fc_w || fc_bias_left) {
          fc = autograd::run_beside({fc_a.grad, sx}, [&]() -> std::vector<Tensor> {
            kernels::LinearGrads w = kernels::linear_backward_weight(fc_a.grad, sx, s_fc_w, need_fc_w, fc_bias_left);
            return {w.weight, w.bias};  // (H, C), (H,)
          });
          if (!fc_bias_left) fc[1] = fc_a.bias;
        }
        return {gx, fc[0], fc[1], proj[0], proj[1]};
      });
}

}  // namespace tandem
