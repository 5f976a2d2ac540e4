// Convolution, pooling and batch norm (with its fused residual add and ReLU) with their gradients.
#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {

using autograd::record;
using autograd::saved;

namespace {
// (C,) -> (1, C, 1, 1), to broadcast a per-channel tensor over (N, C, H, W).
Tensor per_channel(const Tensor& t) { return views::reshape(t, {1, t.shape()[0], 1, 1}); }

Tensor sum_per_channel(const Tensor& t) { return kernels::reduce(ReduceOp::sum, t, {0, 2, 3}, false); }

Tensor pool(const Tensor& x, const Pool2dParams& p, const char* name) {
  Tensor out = kernels::pool2d(x, p);
  return record(out, name, {x}, [sx = saved(x), so = saved(out), p](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::pool2d_backward(g, sx, so, p)};
  });
}

Pool2dParams square_pool(PoolMode mode, int64_t kernel, int64_t stride, int64_t padding, bool count_include_pad) {
  Pool2dParams p;
  p.mode = mode;
  p.kernel_h = p.kernel_w = kernel;
  p.stride_h = p.stride_w = stride < 0 ? kernel : stride;
  p.pad_h = p.pad_w = padding;
  p.count_include_pad = count_include_pad;
  return p;
}
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) {
  Tensor out = kernels::conv2d(x, weight, params);  // (N, K, P, Q)
  if (bias.defined()) {
    const int64_t k = weight.shape()[0];
    TANDEM_CHECK_AS(ValueError, bias.dim() == 1 && bias.shape()[0] == k, "conv2d: bias must be (", k, ",) for weight ",
                    shape_str(weight.shape()), ", got shape ", shape_str(bias.shape()));
    out = kernels::binary(BinaryOp::add, out, per_channel(bias));
  }
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  // Keep only what the wanted gradients read: x for the weight's, the weight for x's.
  return record(out, "conv2d", {x, weight, bias},
                [sx = need_w ? saved(x) : Tensor(), sw = need_x ? saved(weight) : Tensor(), x_shape = x.shape(),
                 w_shape = weight.shape(), need_x, need_w, need_b, params](const Tensor& g) -> std::vector<Tensor> {
                  Tensor gx, gw, gb;
                  if (need_x) gx = kernels::conv2d_backward_input(g, sw, x_shape, params);
                  if (need_w) gw = kernels::conv2d_backward_weight(g, sx, w_shape, params);
                  if (need_b) gb = sum_per_channel(g);
                  return {gx, gw, gb};
                });
}

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  return pool(x, square_pool(PoolMode::max, kernel, stride, padding, true), "max_pool2d");
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding, bool count_include_pad) {
  return pool(x, square_pool(PoolMode::average, kernel, stride, padding, count_include_pad), "avg_pool2d");
}

Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  TANDEM_CHECK_AS(ValueError, x.dim() == 4, "adaptive_avg_pool2d: expected an (N, C, H, W) tensor, got shape ",
                  shape_str(x.shape()));
  TANDEM_CHECK_AS(ValueError, out_h >= 1 && out_w >= 1, "adaptive_avg_pool2d: output size must be >= 1, got ", out_h,
                  "x", out_w);
  const int64_t h = x.shape()[2], w = x.shape()[3];
  TANDEM_CHECK_AS(NotImplementedError, h % out_h == 0 && w % out_w == 0, "adaptive_avg_pool2d: input ",
                  shape_str(x.shape()), " to output ", out_h, "x", out_w,
                  " is not supported: only output sizes that divide the input's height and width evenly are "
                  "(H % out_h == 0 and W % out_w == 0)");
  Pool2dParams p;
  p.mode = PoolMode::average;
  p.kernel_h = p.stride_h = h / out_h;
  p.kernel_w = p.stride_w = w / out_w;
  p.pad_h = p.pad_w = 0;
  return pool(x, p, "adaptive_avg_pool2d");
}

namespace {
// Batch norm's backward in evaluation, an affine map per channel: gx = g * weight * invstd,
// gw = sum(g * xhat), gb = sum(g), from statistics copied at the forward (mean, invstd (C,)).
std::vector<Tensor> batch_norm_eval_backward(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                             const Tensor& invstd, bool need_w) {
  // Per-channel tensors are f32 for 16-bit inputs: compute in their dtype.
  Tensor gs = kernels::to_dtype(g, invstd.dtype());               // (N, C, H, W)
  Tensor scale = kernels::binary(BinaryOp::mul, weight, invstd);  // (C,)
  Tensor gx = kernels::to_dtype(kernels::binary(BinaryOp::mul, gs, per_channel(scale)), g.dtype());
  Tensor gw;
  if (need_w) {
    Tensor xs = kernels::to_dtype(x, invstd.dtype());  // (N, C, H, W)
    Tensor xhat =
        kernels::binary(BinaryOp::mul, kernels::binary(BinaryOp::sub, xs, per_channel(mean)), per_channel(invstd));
    gw = sum_per_channel(kernels::binary(BinaryOp::mul, gs, xhat));
  }
  return {gx, gw, sum_per_channel(gs)};
}

// batch_norm and batch_norm_act: one node with inputs (x, weight, bias[, residual]).
Tensor record_batch_norm(const char* name, const Tensor& x, const Tensor& weight, const Tensor& bias,
                         const Tensor& running_mean, const Tensor& running_var, bool training, double momentum,
                         double eps, const Tensor& residual, bool relu) {
  // The running statistics are buffers: updated in place, never part of the graph.
  kernels::BatchNormForward f =
      kernels::batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps, residual, relu);
  std::vector<Tensor> inputs{x, weight, bias};
  if (residual.defined()) inputs.push_back(residual);
  const bool has_residual = residual.defined();
  // ReLU's backward reads the output (y > 0 where its input was); saving it costs nothing extra
  // where the next layer keeps it too.
  Tensor relu_out = relu ? saved(f.out) : Tensor();
  if (training) {
    return record(f.out, name, inputs,
                  [sx = saved(x), sw = saved(weight), mean = f.save_mean, invstd = f.save_invstd, relu_out,
                   has_residual](const Tensor& g) -> std::vector<Tensor> {
                    kernels::BatchNormBackward b =
                        kernels::batch_norm_backward(g, sx, sw, mean, invstd, relu_out, has_residual);
                    std::vector<Tensor> grads{b.grad_input, b.grad_weight, b.grad_bias};
                    if (has_residual) grads.push_back(b.grad_residual);
                    return grads;
                  });
  }
  // The statistics are copied now so that a later training step cannot change this backward.
  Tensor mean = kernels::clone(running_mean);  // (C,)
  Tensor invstd = kernels::unary(
      UnaryOp::rsqrt, kernels::binary(BinaryOp::add, running_var, scalar_tensor(eps, running_var.options())));  // (C,)
  const bool need_w = weight.requires_grad();
  return record(f.out, name, inputs,
                [sx = need_w ? saved(x) : Tensor(), sw = saved(weight), mean, invstd, need_w, relu_out,
                 has_residual](const Tensor& g) -> std::vector<Tensor> {
                  Tensor masked = relu_out.defined() ? kernels::unary_backward(UnaryOp::relu, g, relu_out) : g;
                  std::vector<Tensor> grads = batch_norm_eval_backward(masked, sx, sw, mean, invstd, need_w);
                  if (has_residual) grads.push_back(masked);
                  return grads;
                });
}
}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps) {
  return record_batch_norm("batch_norm", x, weight, bias, running_mean, running_var, training, momentum, eps, Tensor(),
                           false);
}

Tensor batch_norm_act(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                      const Tensor& running_var, bool training, double momentum, double eps, const Tensor& residual,
                      bool relu) {
  return record_batch_norm("batch_norm_act", x, weight, bias, running_mean, running_var, training, momentum, eps,
                           residual, relu);
}

}  // namespace tandem
