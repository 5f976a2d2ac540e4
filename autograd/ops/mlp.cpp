// Linear layers with GELU (tanh) between them as one differentiable op, for x (..., C_0):
//   h_0 = x, pre_i = h_i W_i^T + b_i, h_{i+1} = gelu_tanh(pre_i) for i < L - 1, y = pre_{L-1}.
// The transformer's MLP is the two-layer case. Backward, from g_{L-1} = dy, layer by layer from the
// last: layer i's input gradient through the GELU before it, d pre_{i-1} = gelu'(pre_{i-1}) *
// (g_i W_i), in one matmul with the DGELU epilogue where kernels::input_gelu_in_epilogue says so
// (on sm_90, where tandem's kernel runs it, with layer i-1's bias gradient summed in the same
// epilogue), else as the linear op does it (the matmul, then GELU's backward with the bias
// gradient in one pass on CUDA); layer 0's input gradient is a plain matmul. That fusion is why
// this is one op: as separate linear ops, GELU's backward belongs to the layer before the product
// that makes its input. The last layer's bias gradient is a column sum of dy (one pass on CUDA:
// core/cuda/bias_gradient.cu). The weight gradients (dW_i = g_i^T h_i) run first where they are
// large (kernels::weight_gradient_first), else after the input gradient, beside the rest of
// backward where that mode is on (autograd/side_stream.h). Saved: x, the pre-activations and the
// hidden activations, as the linear ops would keep them. gelu_mlp_add_layer_norm (nn.cpp) runs the
// same node with a residual added in the last product's epilogue (detail::gelu_mlp_into_residual).
#include <cstdint>
#include <vector>

#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/autograd/ops/residual_sum.h"
#include "tandem/autograd/side_stream.h"
#include "tandem/core/error.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {

using autograd::record;
using autograd::saved;

namespace {

// What the backward of one chain needs (the tensors saved: detached).
struct ChainSaved {
  std::vector<Tensor> weights;  // W_i (N_i, K_i)
  std::vector<Tensor> inputs;   // h_i (..., K_i), where W_i's gradient is wanted (h_0 = x)
  std::vector<Tensor> pre;      // pre_i (..., N_i) for i < L - 1, where an earlier input wants a gradient
  std::vector<bool> need_weight, need_bias;
  std::vector<bool> need_before;  // per layer: whether x or a parameter before it wants a gradient
  Shape x_shape;
};

// The gradients of x and of every (W_i, b_i), from g (..., N_{L-1}). With `release` (the engine
// releases what nodes saved: autograd::backward_releases_saved), each layer's saved input and the
// pre-activation its input gradient read are dropped once the layer is done, as separate linear
// ops would drop theirs, so that backward's peak memory does not hold every layer's at once.
std::vector<Tensor> chain_backward(ChainSaved& s, const Tensor& g, bool release) {
  const int layers = static_cast<int>(s.weights.size());
  const Shape leading(s.x_shape.begin(), s.x_shape.end() - 1);
  auto output_shape = [&](int i) {  // layer i's output (..., N_i)
    Shape out = leading;
    out.push_back(s.weights[i].shape()[0]);
    return out;
  };
  std::vector<Tensor> grads(1 + 2 * layers);  // x, then W_i and b_i
  // The output gradient of layer i as a contiguous (M, N_i) matrix, with b_i's gradient where a pass
  // or an epilogue already summed it: dy's column sums for the last layer.
  kernels::LinearActivationGrads out =
      kernels::linear_backward_activation(g, Tensor(), Activation::none, s.need_bias[layers - 1]);
  for (int i = layers - 1; i >= 0; --i) {
    const Tensor& gi = out.grad;  // (M, N_i)
    const bool bias_left = s.need_bias[i] && !out.bias.defined();
    const bool weights = s.need_weight[i] || bias_left;
    kernels::LinearActivationGrads before;  // layer i-1's output gradient d pre_{i-1}, or dx for i == 0
    auto input_gradient = [&] {
      if (!s.need_before[i]) return;
      if (i == 0) {
        before.grad = kernels::linear_backward_input(gi, s.weights[0], s.x_shape);  // like x
        return;
      }
      const Tensor& pre = s.pre[i - 1];  // (..., K_i)
      const bool need_b = s.need_bias[i - 1];
      const Tensor g_shaped = views::reshape(gi, output_shape(i));  // (..., N_i)
      if (kernels::input_gelu_in_epilogue(g_shaped, s.weights[i])) {
        // b_{i-1}'s gradient from the product's epilogue where it can, else in a pass of its own
        kernels::LinearActivationGrads through =
            kernels::linear_backward_input_gelu(g_shaped, s.weights[i], pre, need_b);
        before = kernels::linear_backward_activation(through.grad, Tensor(), Activation::none,
                                                     need_b && !through.bias.defined());
        if (through.bias.defined()) before.bias = through.bias;
      } else {
        Tensor dh = kernels::linear_backward_input(gi, s.weights[i], pre.shape());  // (..., K_i)
        before = kernels::linear_backward_activation(dh, pre, Activation::gelu_tanh, need_b);
      }
    };
    auto weight_gradients = [&] {
      return autograd::run_beside({gi, s.inputs[i]}, [&]() -> std::vector<Tensor> {
        kernels::LinearGrads w =
            kernels::linear_backward_weight(gi, s.inputs[i], s.weights[i], s.need_weight[i], bias_left);
        return {w.weight, w.bias};  // (N_i, K_i), (N_i,)
      });
    };
    // dW_i first where writing it would push the input gradient out of L2 before the next product
    // reads it (kernels::weight_gradient_first); the input gradient first elsewhere, and beside.
    std::vector<Tensor> w = {Tensor(), Tensor()};
    if (weights && s.need_before[i] && !autograd::weight_gradients_beside() &&
        kernels::weight_gradient_first(gi, s.weights[i])) {
      w = weight_gradients();
      input_gradient();
    } else {
      input_gradient();
      if (weights) w = weight_gradients();
    }
    grads[1 + 2 * i] = w[0];
    grads[2 + 2 * i] = bias_left ? w[1] : out.bias;
    if (release) {  // (the weight gradient's item holds what it reads until it is joined)
      s.inputs[i] = Tensor();
      if (i > 0) s.pre[i - 1] = Tensor();
    }
    if (i == 0) grads[0] = before.grad;
    out = before;
  }
  return grads;
}

// gelu_mlp's node; with a residual (..., N_{L-1}), the last layer's output holds residual + its
// product + residual_bias (detail::gelu_mlp_into_residual), the last bias being undefined.
Tensor record_gelu_mlp(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases,
                       const Tensor& residual, const Tensor& residual_bias) {
  const size_t layers = weights.size();
  TANDEM_CHECK_AS(ValueError, layers >= 1, "gelu_mlp: needs at least one layer's weight, got none");
  TANDEM_CHECK_AS(ValueError, biases.size() == layers, "gelu_mlp: got ", layers, " weights but ", biases.size(),
                  " biases (one per layer; an undefined Tensor for a layer without one)");
  ChainSaved s;
  s.x_shape = x.shape();
  std::vector<Tensor> inputs = {x};        // the op's inputs: x, then W_i and b_i
  bool wanted_before = x.requires_grad();  // whether anything before the current layer wants a gradient
  Tensor h = x;                            // (..., K_i): layer i's input
  for (size_t i = 0; i < layers; ++i) {
    const bool last = i + 1 == layers;
    const Activation act = last ? Activation::none : Activation::gelu_tanh;
    kernels::LinearForward f = last && residual.defined()
                                   ? kernels::linear_forward(h, weights[i], residual_bias, act, residual)
                                   : kernels::linear_forward(h, weights[i], biases[i], act);
    const bool need_w = weights[i].requires_grad();
    const bool need_b = biases[i].defined() && biases[i].requires_grad();
    s.weights.push_back(saved(weights[i]));
    s.inputs.push_back(need_w ? saved(h) : Tensor());
    s.need_weight.push_back(need_w);
    s.need_bias.push_back(need_b);
    s.need_before.push_back(wanted_before);
    wanted_before = wanted_before || need_w || need_b;
    if (f.pre.defined()) s.pre.push_back(saved(f.pre));  // kept whole; dropped below where unused
    inputs.push_back(weights[i]);
    inputs.push_back(biases[i]);
    h = f.out;
  }
  // pre_i is read only by layer i+1's input gradient, which runs when something before it wants one.
  for (size_t i = 0; i + 1 < layers; ++i) {
    if (!s.need_before[i + 1]) s.pre[i] = Tensor();
  }
  return record(h, layers == 2 ? "gelu_mlp" : "gelu_mlp_chain", inputs,
                [s = std::move(s)](const Tensor& g) mutable -> std::vector<Tensor> {
                  return chain_backward(s, g, autograd::backward_releases_saved());
                });
}

}  // namespace

Tensor gelu_mlp(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases) {
  return record_gelu_mlp(x, weights, biases, Tensor(), Tensor());
}

Tensor detail::gelu_mlp_into_residual(const Tensor& x, const std::vector<Tensor>& weights,
                                      const std::vector<Tensor>& biases, const Tensor& residual,
                                      const Tensor& residual_bias) {
  TANDEM_CHECK_AS(ValueError, !biases.empty() && !biases.back().defined(),
                  "gelu_mlp: with a residual the last layer's bias is the residual's bias, not a bias of its own");
  return record_gelu_mlp(x, weights, biases, residual, residual_bias);
}

Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
                const Tensor& proj_bias) {
  return gelu_mlp(x, {fc_weight, proj_weight}, {fc_bias, proj_bias});
}

}  // namespace tandem
