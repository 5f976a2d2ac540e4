// The device-neutral side of layer norm: argument checks, output allocation, routing to the
// backend of x's device. Rows are x viewed as (numel / D, D), D being x's last dim.
#include <cstdint>

#include "tandem/core/backend.h"
#include "tandem/core/elementwise.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/layer_norm.h"
#include "tandem/core/views.h"

namespace tandem::kernels {

namespace {
DType stats_dtype(DType x) { return x == DType::f64 ? DType::f64 : DType::f32; }

// A (D,) parameter of x's dtype and device, contiguous (or undefined).
Tensor check_parameter(const char* op, const char* name, const Tensor& p, const Tensor& x, int64_t d) {
  if (!p.defined()) return p;
  TANDEM_CHECK_AS(ValueError, p.numel() == d, op, ": ", name, " must have ", d,
                  " elements (the input's last dim), got shape ", shape_str(p.shape()), " for input ",
                  shape_str(x.shape()));
  TANDEM_CHECK_AS(TypeError, p.dtype() == x.dtype(), op, ": ", name, " must have the input's dtype ", x.dtype(),
                  ", got ", p.dtype());
  TANDEM_CHECK_AS(DeviceError, p.device() == x.device(), op, ": ", name, " is on ", p.device(), " but the input is on ",
                  x.device());
  return contiguous(views::reshape(p, {d}));
}

// x as a contiguous (rows, D) matrix.
Tensor as_rows(const Tensor& x) {
  const int64_t d = x.shape().back();
  return contiguous(views::reshape(x, {d == 0 ? 0 : x.numel() / d, d}));
}
}  // namespace

LayerNormForward layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  TANDEM_CHECK_AS(ValueError, x.dim() >= 1, "layer_norm: input must have at least 1 dim, got a 0-dim tensor");
  TANDEM_CHECK_AS(TypeError, is_floating(x.dtype()),
                  "layer_norm: expected a floating-point input (f32, f64, f16, bf16), got ", x.dtype());
  TANDEM_CHECK_AS(ValueError, eps >= 0.0, "layer_norm: eps must be >= 0, got ", eps);
  const int64_t d = x.shape().back();
  Tensor w = check_parameter("layer_norm", "weight", weight, x, d);
  Tensor b = check_parameter("layer_norm", "bias", bias, x, d);
  Tensor rows = as_rows(x);  // (rows, D)
  const int64_t n = rows.shape()[0];
  TensorOptions stats(stats_dtype(x.dtype()), x.device());
  LayerNormForward result{empty(rows.shape(), x.options()), empty({n}, stats), empty({n}, stats)};
  if (rows.numel() > 0) {
    TANDEM_ROUTE(x.device(), layer_norm_forward, rows, w, b, result.out, result.mean, result.rstd, eps);
  } else if (n > 0) {
    fill_(result.mean, 0.0);  // D == 0: nothing to normalise
    fill_(result.rstd, 0.0);
  }
  result.out = views::reshape(result.out, x.shape());
  return result;
}

AddLayerNormForward add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                           const Tensor& bias, double eps, const Tensor& residual_bias) {
  TANDEM_CHECK_AS(ValueError, x.shape() == residual.shape(), "add_layer_norm: x ", shape_str(x.shape()),
                  " and residual ", shape_str(residual.shape()), " must have one shape");
  TANDEM_CHECK_AS(TypeError, x.dtype() == residual.dtype(), "add_layer_norm: x is ", x.dtype(), " but residual is ",
                  residual.dtype());
  TANDEM_CHECK_AS(DeviceError, x.device() == residual.device(), "add_layer_norm: x is on ", x.device(),
                  " but residual is on ", residual.device());
  TANDEM_CHECK_AS(ValueError, x.dim() >= 1, "add_layer_norm: input must have at least 1 dim, got a 0-dim tensor");
  const int64_t d = x.shape().back();
  Tensor rb = check_parameter("add_layer_norm", "residual_bias", residual_bias, x, d);  // (D,) or undefined
  if (!x.device().is_cuda() || x.numel() == 0) {
    Tensor branch = rb.defined() ? binary(BinaryOp::add, residual, rb) : residual;
    Tensor sum = binary(BinaryOp::add, x, branch);
    return {sum, layer_norm_forward(sum, weight, bias, eps)};
  }
  TANDEM_CHECK_AS(TypeError, is_floating(x.dtype()),
                  "add_layer_norm: expected a floating-point input (f32, f64, f16, bf16), got ", x.dtype());
  TANDEM_CHECK_AS(ValueError, eps >= 0.0, "add_layer_norm: eps must be >= 0, got ", eps);
  Tensor w = check_parameter("add_layer_norm", "weight", weight, x, d);
  Tensor b = check_parameter("add_layer_norm", "bias", bias, x, d);
  Tensor rows = as_rows(x), residual_rows = as_rows(residual);  // (rows, D) each
  const int64_t n = rows.shape()[0];
  TensorOptions stats(stats_dtype(x.dtype()), x.device());
  Tensor sum = empty(rows.shape(), x.options());  // (rows, D)
  LayerNormForward norm{empty(rows.shape(), x.options()), empty({n}, stats), empty({n}, stats)};
  cuda::add_layer_norm_forward(rows, residual_rows, rb, w, b, sum, norm.out, norm.mean, norm.rstd, eps);
  norm.out = views::reshape(norm.out, x.shape());
  return {views::reshape(sum, x.shape()), norm};
}

LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, bool with_bias, const Tensor& pending, bool with_x_column_sum) {
  TANDEM_CHECK_AS(ValueError, grad_out.shape() == x.shape(), "layer_norm_backward: grad_out ",
                  shape_str(grad_out.shape()), " must have the input's shape ", shape_str(x.shape()));
  TANDEM_CHECK_AS(TypeError, grad_out.dtype() == x.dtype(), "layer_norm_backward: grad_out has dtype ",
                  grad_out.dtype(), " but the input has ", x.dtype());
  TANDEM_CHECK_AS(DeviceError, grad_out.device() == x.device(), "layer_norm_backward: grad_out is on ",
                  grad_out.device(), " but the input is on ", x.device());
  const int64_t d = x.shape().back();
  Tensor w = check_parameter("layer_norm_backward", "weight", weight, x, d);
  Tensor rows = as_rows(x), g = as_rows(grad_out);  // (rows, D)
  const int64_t n = rows.shape()[0];
  const DType stat = stats_dtype(x.dtype());
  TANDEM_CHECK_AS(ValueError, mean.numel() == n && rstd.numel() == n, "layer_norm_backward: mean and rstd must have ",
                  n, " elements (one per row), got ", mean.numel(), " and ", rstd.numel());
  TANDEM_CHECK_AS(TypeError, mean.dtype() == stat && rstd.dtype() == stat,
                  "layer_norm_backward: mean and rstd must be ", stat, ", got ", mean.dtype(), " and ", rstd.dtype());
  TANDEM_CHECK_AS(ValueError, !pending.defined() || pending.shape() == x.shape(), "layer_norm_backward: pending ",
                  shape_str(pending.shape()), " must have the input's shape ", shape_str(x.shape()));
  TANDEM_CHECK_AS(TypeError, !pending.defined() || (pending.dtype() == x.dtype() && pending.device() == x.device()),
                  "layer_norm_backward: pending is ", pending.dtype(), " on ", pending.device(), " but the input is ",
                  x.dtype(), " on ", x.device());
  Tensor pending_rows = pending.defined() ? as_rows(pending) : Tensor();  // (rows, D)
  LayerNormGrads grads;
  grads.x = empty(rows.shape(), x.options());
  if (w.defined()) grads.weight = empty({d}, x.options());
  if (with_bias) grads.bias = empty({d}, x.options());
  if (with_x_column_sum) grads.x_column_sum = empty({d}, x.options());
  if (rows.numel() > 0) {
    TANDEM_ROUTE(x.device(), layer_norm_backward, g, rows, w, contiguous(views::reshape(mean, {n})),
                 contiguous(views::reshape(rstd, {n})), pending_rows, grads.x, grads.weight, grads.bias,
                 grads.x_column_sum);
  } else {
    for (Tensor* t : {&grads.weight, &grads.bias, &grads.x_column_sum}) {
      if (t->defined()) fill_(*t, 0.0);
    }
  }
  grads.x = views::reshape(grads.x, x.shape());
  return grads;
}


}  // namespace tandem::kernels
