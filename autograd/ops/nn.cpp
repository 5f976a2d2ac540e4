// Layer functions: layer norm (one fused kernel each way), the squared-error loss (its gradient
// from the forward's pass where it can) and those built from other differentiable ops (their
// gradients follow from those).
#include "tandem/autograd/grad_mode.h"
#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/autograd/ops/residual_sum.h"
#include "tandem/core/kernels.h"
#include "tandem/core/random.h"
#include "tandem/core/views.h"

namespace tandem {

using autograd::record;
using autograd::record_loss;
using autograd::saved;

namespace {
// x's rows of D = prod(normalized_shape) values, (..., D), after checking that the shapes fit.
Tensor layer_norm_rows(const char* op, const Tensor& x, const Shape& normalized_shape, const Tensor& weight,
                       const Tensor& bias) {
  int64_t k = static_cast<int64_t>(normalized_shape.size());
  TANDEM_CHECK_AS(ValueError, k >= 1 && k <= x.dim(), op, ": normalized_shape ", shape_str(normalized_shape),
                  " does not fit input ", shape_str(x.shape()));
  Shape tail(x.shape().end() - k, x.shape().end());
  TANDEM_CHECK_AS(ValueError, tail == normalized_shape, op, ": input ", shape_str(x.shape()),
                  " does not end in normalized_shape ", shape_str(normalized_shape));
  for (const Tensor* p : {&weight, &bias}) {
    TANDEM_CHECK_AS(ValueError, !p->defined() || p->shape() == normalized_shape, op, ": ",
                    p == &weight ? "weight" : "bias", " must have shape normalized_shape ", shape_str(normalized_shape),
                    ", got ", shape_str(p->shape()));
  }
  Shape rows_shape(x.shape().begin(), x.shape().end() - k);
  rows_shape.push_back(shape_numel(normalized_shape));
  return views::reshape(x, rows_shape);  // (..., D)
}

// How add_layer_norm's residual bias gets its gradient, the sum's gradient summed over rows: layer
// norm's node sums the gradient it computes for the sum, in its kernel, when that gradient is all
// the sum receives (autograd::first_input_gradient_is_final: the sum's other uses ran first and
// their gradient was folded in), and says so here; otherwise the add's node, which runs after it
// with the sum's whole gradient, sums it.
struct ResidualBiasHandOff {
  bool summed_by_norm = false;
};

// Records layer norm's node for `out` = layer_norm(x) from the forward's statistics. The node folds
// x's pending gradient into its kernel: where x has another use (the residual stream), the two
// gradients meet there rather than in an add. With hand_off, residual_bias is its fourth input.
Tensor record_layer_norm(const Tensor& out, const Tensor& x, const Tensor& x_rows, const Tensor& weight,
                         const Tensor& bias, const kernels::LayerNormForward& f, const Shape& normalized_shape,
                         const Tensor& residual_bias = Tensor(),
                         std::shared_ptr<ResidualBiasHandOff> hand_off = nullptr) {
  const bool with_bias = bias.defined() && bias.requires_grad();
  std::vector<Tensor> inputs{x, weight, bias};
  if (hand_off) inputs.push_back(residual_bias);
  return record(out, "layer_norm", inputs,
                [sx = saved(x_rows), sw = weight.defined() ? saved(weight) : Tensor(), mean = f.mean, rstd = f.rstd,
                 with_bias, x_shape = x.shape(), normalized_shape,
                 hand_off](const Tensor& g, const Tensor& pending) -> std::vector<Tensor> {
                  Tensor pending_rows = pending.defined() ? views::reshape(pending, sx.shape()) : Tensor();
                  const bool sum_for_bias = hand_off && autograd::first_input_gradient_is_final();
                  kernels::LayerNormGrads grads = kernels::layer_norm_backward(
                      views::reshape(g, sx.shape()), sx, sw, mean, rstd, with_bias, pending_rows, sum_for_bias);
                  Tensor gx = views::reshape(grads.x, x_shape);
                  Tensor gw = grads.weight.defined() ? views::reshape(grads.weight, normalized_shape) : Tensor();
                  Tensor gb = grads.bias.defined() ? views::reshape(grads.bias, normalized_shape) : Tensor();
                  if (!hand_off) return {gx, gw, gb};
                  hand_off->summed_by_norm = sum_for_bias;
                  Tensor g_residual_bias =
                      sum_for_bias ? views::reshape(grads.x_column_sum, normalized_shape) : Tensor();
                  return {gx, gw, gb, g_residual_bias};
                });
}
}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  // One fused kernel over rows of D = prod(normalized_shape) values.
  Tensor x_rows = layer_norm_rows("layer_norm", x, normalized_shape, weight, bias);  // (..., D)
  kernels::LayerNormForward f = kernels::layer_norm_forward(x_rows, weight, bias, eps);
  return record_layer_norm(views::reshape(f.out, x.shape()), x, x_rows, weight, bias, f, normalized_shape);
}

namespace {
// add_layer_norm's two nodes for sum_rows (..., D), x + residual (+ residual_bias) as computed,
// and norm, layer norm's forward of it: the add (its gradient goes to both terms unchanged), and
// the layer norm of the sum, whose gradient reaches the add's node together with the sum's other
// uses.
std::pair<Tensor, Tensor> record_add_layer_norm(const Tensor& sum_rows, const kernels::LayerNormForward& norm,
                                                const Tensor& x, const Tensor& residual,
                                                const Shape& normalized_shape, const Tensor& weight,
                                                const Tensor& bias, const Tensor& residual_bias) {
  if (!residual_bias.defined() || !residual_bias.requires_grad()) {
    Tensor sum = record(views::reshape(sum_rows, x.shape()), "add", {x, residual},  // a constant bias: no edge
                        [](const Tensor& g) -> std::vector<Tensor> { return {g, g}; });
    Tensor normed = record_layer_norm(views::reshape(norm.out, x.shape()), sum, sum_rows, weight, bias, norm,
                                      normalized_shape);
    return {sum, normed};
  }
  auto hand_off = std::make_shared<ResidualBiasHandOff>();
  Tensor sum = record(views::reshape(sum_rows, x.shape()), "add", {x, residual, residual_bias},
                      [hand_off, bias_shape = residual_bias.shape()](const Tensor& g) -> std::vector<Tensor> {
                        Tensor g_bias = hand_off->summed_by_norm ? Tensor() : kernels::sum_to(g, bias_shape);
                        hand_off->summed_by_norm = false;  // for the next backward through the graph
                        return {g, g, g_bias};
                      });
  Tensor normed = record_layer_norm(views::reshape(norm.out, x.shape()), sum, sum_rows, weight, bias, norm,
                                    normalized_shape, residual_bias, hand_off);
  return {sum, normed};
}

// x's rows after add_layer_norm's (or its fused callers') checks of residual and residual_bias.
Tensor add_layer_norm_rows(const char* op, const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                           const Tensor& weight, const Tensor& bias, const Tensor& residual_bias) {
  Tensor x_rows = layer_norm_rows(op, x, normalized_shape, weight, bias);  // (..., D)
  TANDEM_CHECK_AS(ValueError, residual.shape() == x.shape(), op, ": residual ", shape_str(residual.shape()),
                  " must have the input's shape ", shape_str(x.shape()));
  TANDEM_CHECK_AS(ValueError, !residual_bias.defined() || residual_bias.shape() == normalized_shape, op,
                  ": residual_bias must have shape normalized_shape ", shape_str(normalized_shape), ", got ",
                  shape_str(residual_bias.shape()));
  return x_rows;
}
}  // namespace

std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                         const Tensor& weight, const Tensor& bias, double eps,
                                         const Tensor& residual_bias) {
  Tensor x_rows = add_layer_norm_rows("add_layer_norm", x, residual, normalized_shape, weight, bias, residual_bias);
  kernels::AddLayerNormForward f = kernels::add_layer_norm_forward(
      x_rows, views::reshape(residual, x_rows.shape()), weight, bias, eps, residual_bias);
  return record_add_layer_norm(f.sum, f.norm, x, residual, normalized_shape, weight, bias, residual_bias);
}

std::pair<Tensor, Tensor> detail::add_layer_norm_of_sum(const Tensor& product, const Tensor& residual,
                                                        const Shape& normalized_shape, const Tensor& weight,
                                                        const Tensor& bias, double eps, const Tensor& residual_bias) {
  // The sum's values as a tensor of their own: `product` keeps the product's node.
  Tensor sum_rows = add_layer_norm_rows("add_layer_norm", product.detach(), residual, normalized_shape, weight, bias,
                                        residual_bias);  // (..., D)
  kernels::LayerNormForward norm = kernels::layer_norm_forward(sum_rows, weight, bias, eps);
  return record_add_layer_norm(sum_rows, norm, product, residual, normalized_shape, weight, bias, residual_bias);
}

std::pair<Tensor, Tensor> linear_add_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                const Tensor& residual, const Shape& normalized_shape,
                                                const Tensor& norm_weight, const Tensor& norm_bias, double eps) {
  return detail::add_layer_norm_of_sum(detail::linear_into_residual(x, weight, residual, bias), residual,
                                       normalized_shape, norm_weight, norm_bias, eps, bias);
}

std::pair<Tensor, Tensor> gelu_mlp_add_layer_norm(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                                                  const Tensor& proj_weight, const Tensor& proj_bias,
                                                  const Tensor& residual, const Shape& normalized_shape,
                                                  const Tensor& norm_weight, const Tensor& norm_bias, double eps) {
  Tensor sum = detail::gelu_mlp_into_residual(x, {fc_weight, proj_weight}, {fc_bias, Tensor()}, residual, proj_bias);
  return detail::add_layer_norm_of_sum(sum, residual, normalized_shape, norm_weight, norm_bias, eps, proj_bias);
}

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  TANDEM_CHECK_AS(ValueError, weight.dim() == 2, "embedding: weight must be (V, D), got shape ", shape_str(weight.shape()));
  TANDEM_CHECK_AS(TypeError, indices.dtype() == DType::i64 || indices.dtype() == DType::i32,
                  "embedding: indices must be i64 or i32, got ", indices.dtype());
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.shape()[1]);
  return reshape(index_select(weight, 0, reshape(indices, {-1})), out_shape);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator) {
  TANDEM_CHECK_AS(ValueError, p >= 0.0 && p < 1.0, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0.0) return x;
  Tensor keep = bernoulli(x.shape(), 1.0 - p, x.options(), generator);
  return mul(x, mul(keep, 1.0 / (1.0 - p)));
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  TANDEM_CHECK_AS(ValueError, input.shape() == target.shape(), "mse_loss: input ", shape_str(input.shape()),
                  " and target ", shape_str(target.shape()), " must have the same shape");
  // A scalar loss that will be differentiated for its input gets the gradient from the forward's
  // own pass (for an upstream gradient of 1; backward scales it only if that is not 1): one
  // kernel instead of a subtraction, a square, a reduction and their backward kernels.
  const bool with_grad = reduction != Reduction::none && is_floating(input.dtype()) &&
                         input.dtype() == target.dtype() && input.device() == target.device() &&
                         GradMode::is_enabled() && input.requires_grad() && !target.requires_grad();
  // bf16 operands go in as they are: the kernel computes in f32, returns an f32 loss and rounds the
  // gradient once to bf16. Not f16, where 2 (input - target) / N can flush to zero before a loss
  // scale multiplies it: f16 takes the conversions below, whose backward converts the scaled f32
  // gradient.
  if (with_grad && input.dtype() != DType::f16) {
    kernels::SquaredErrorWithGrad f = kernels::squared_error_with_grad(input, target, reduction == Reduction::mean);
    const DType stat = input.dtype() == DType::f64 ? DType::f64 : DType::f32;
    return record_loss(f.loss, "mse_loss", {input}, [grad = f.grad, stat](const Tensor& g) -> std::vector<Tensor> {
      // Without retain_graph the buffer is handed on (scaled in place if g is not 1, and without a
      // kernel when g is backward()'s implied 1); with it, a second backward must find it unchanged.
      const bool releasing = autograd::backward_releases_saved();
      if (releasing && autograd::gradient_is_implicit_one()) return {grad};
      return {kernels::scale_unless_one(grad, kernels::to_dtype(g, stat), releasing)};
    });
  }
  // 16-bit operands are computed in f32 and give an f32 loss, as torch.autocast runs mse_loss (the
  // f16 gradient of a loss kept in f16 would be a loss scale itself: 65536 is past f16's largest).
  if (is_half(input.dtype()) || is_half(target.dtype())) {
    auto in_f32 = [](const Tensor& t) { return is_half(t.dtype()) ? to(t, DType::f32) : t; };
    return mse_loss(in_f32(input), in_f32(target), reduction);
  }
  Tensor diff = sub(input, target);
  Tensor squared = mul(diff, diff);
  switch (reduction) {
    case Reduction::mean: return mean(squared);
    case Reduction::sum: return sum(squared);
    case Reduction::none: return squared;
  }
  return squared;
}

}  // namespace tandem
