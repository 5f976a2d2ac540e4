// The transformer's two-layer GELU MLP as one differentiable op:
//   pre = x W_fc^T + b_fc, h = gelu_tanh(pre), y = h W_proj^T + b_proj.
// Backward, from g = dy: the projection's weight and bias gradients (dW_proj = g^T h, BGRADB on
// CUDA); then d pre = gelu'(pre) * (g W_proj), in one matmul with the DGELU epilogue in 16 bits
// from 4096 rows on CUDA, else as the linear op does it (the matmul, then GELU's backward with fc's
// bias gradient in one pass on CUDA); and fc's input, weight and bias gradients from d pre. Saved:
// x, pre and h, as the two linear ops would keep them.
#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
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
       pre = saved(fc.pre), h = need_proj_w ? saved(fc.out) : Tensor(), need_x, need_fc_w, need_fc_b, need_proj_w,
       need_proj_b, need_pre](const Tensor& g) -> std::vector<Tensor> {
        // GELU's backward in the DGELU epilogue of the product that makes d h, or (elsewhere) after
        // that product, in one pass with fc's bias gradient.
        const bool dgelu = need_pre && kernels::input_gelu_in_epilogue(g, s_proj_w);
        // (..., C') -> dW_proj (C', H), db_proj (C',), and d h (..., H) without DGELU
        kernels::LinearGrads proj_grads = kernels::linear_backward(
            g, h, s_proj_w, Tensor(), Activation::none, /*need_x=*/need_pre && !dgelu, need_proj_w, need_proj_b);
        if (!need_pre) return {Tensor(), Tensor(), Tensor(), proj_grads.weight, proj_grads.bias};
        // fc's bias gradient: after DGELU from its weight gradient's matmul (BGRADB) on CUDA.
        kernels::LinearGrads fc_grads =
            dgelu ? kernels::linear_backward(kernels::linear_backward_input_gelu(g, s_proj_w, pre), sx, s_fc_w,
                                             Tensor(), Activation::none, need_x, need_fc_w, need_fc_b)
                  : kernels::linear_backward(proj_grads.x, sx, s_fc_w, pre, Activation::gelu_tanh, need_x, need_fc_w,
                                             need_fc_b);
        return {fc_grads.x, fc_grads.weight, fc_grads.bias, proj_grads.weight, proj_grads.bias};
      });
}

}  // namespace tandem
