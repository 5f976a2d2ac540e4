// The device-neutral side of 2-D convolution, pooling (NCHW) and batch norm (NCHW or channels-last).
#include "tandem/core/conv.h"

#include "tandem/core/backend.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/copy.h"
#include "tandem/core/views.h"

namespace tandem::kernels {

namespace {
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;  // floor: C++ division would round a negative span up to 0
}

void check_nchw(const char* op, const Tensor& x) {
  check_floating(op, x);
  TANDEM_CHECK_AS(ValueError, x.dim() == 4, op, ": expected an (N, C, H, W) tensor, got shape ", shape_str(x.shape()));
}

// Statistics and affine parameters of batch norm are f32 for 16-bit inputs.
DType stats_dtype(DType dtype) { return is_half(dtype) ? DType::f32 : dtype; }
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dParams& p) {
  check_nchw("conv2d", x);
  check_same_device("conv2d", x, weight);
  check_same_dtype("conv2d", x, weight);
  TANDEM_CHECK_AS(ValueError, weight.dim() == 4, "conv2d: weight must be (K, C / groups, R, S), got shape ",
                  shape_str(weight.shape()));
  TANDEM_CHECK_AS(ValueError, p.groups >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 &&
                  p.dilation_w >= 1 && p.pad_h >= 0 && p.pad_w >= 0,
                  "conv2d: stride, dilation and groups must be >= 1 and padding >= 0");
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t k = weight.shape()[0], r = weight.shape()[2], s = weight.shape()[3];
  TANDEM_CHECK_AS(ValueError, c % p.groups == 0 && k % p.groups == 0 && weight.shape()[1] * p.groups == c,
                  "conv2d: input ", shape_str(x.shape()), " has ", c, " channels but weight ", shape_str(weight.shape()),
                  " with groups=", p.groups, " expects ", weight.shape()[1] * p.groups);
  const int64_t out_h = conv_output_size(h, r, p.stride_h, p.pad_h, p.dilation_h);
  const int64_t out_w = conv_output_size(w, s, p.stride_w, p.pad_w, p.dilation_w);
  TANDEM_CHECK_AS(ValueError, out_h > 0 && out_w > 0, "conv2d: input ", shape_str(x.shape()), " is smaller than the ",
                  r, "x", s, " kernel (with padding ", p.pad_h, "x", p.pad_w, " and dilation ", p.dilation_h, "x",
                  p.dilation_w, ")");
  Tensor out = empty({n, k, out_h, out_w}, x.options());
  if (out.numel() == 0) return out;
  TANDEM_ROUTE(x.device(), conv2d_forward, contiguous(x), contiguous(weight), out, p);
  return out;
}

Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dParams& p) {
  Tensor grad_x = empty(input_shape, grad_out.options());
  TANDEM_ROUTE(grad_out.device(), conv2d_backward_input, contiguous(grad_out), contiguous(weight), grad_x, p);
  return grad_x;
}

Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dParams& p) {
  Tensor grad_w = empty(weight_shape, grad_out.options());
  TANDEM_ROUTE(grad_out.device(), conv2d_backward_weight, contiguous(grad_out), contiguous(x), grad_w, p);
  return grad_w;
}

Tensor pool2d(const Tensor& x, const Pool2dParams& p) {
  const char* name = p.mode == PoolMode::max ? "max_pool2d" : "avg_pool2d";
  check_nchw(name, x);
  TANDEM_CHECK_AS(ValueError, p.kernel_h >= 1 && p.kernel_w >= 1 && p.stride_h >= 1 && p.stride_w >= 1, name,
                  ": kernel and stride must be >= 1");
  TANDEM_CHECK_AS(ValueError, p.pad_h >= 0 && 2 * p.pad_h <= p.kernel_h && p.pad_w >= 0 && 2 * p.pad_w <= p.kernel_w,
                  name, ": padding must be at most half the kernel, got padding ", p.pad_h, "x", p.pad_w,
                  " for kernel ", p.kernel_h, "x", p.kernel_w);
  const int64_t out_h = conv_output_size(x.shape()[2], p.kernel_h, p.stride_h, p.pad_h, 1);
  const int64_t out_w = conv_output_size(x.shape()[3], p.kernel_w, p.stride_w, p.pad_w, 1);
  TANDEM_CHECK_AS(ValueError, out_h > 0 && out_w > 0, name, ": input ", shape_str(x.shape()), " is smaller than the ",
                  p.kernel_h, "x", p.kernel_w, " window");
  Tensor out = empty({x.shape()[0], x.shape()[1], out_h, out_w}, x.options());
  if (out.numel() == 0) return out;
  TANDEM_ROUTE(x.device(), pool2d_forward, contiguous(x), out, p);
  return out;
}

Tensor pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  Tensor grad_x = empty(x.shape(), x.options());
  TANDEM_ROUTE(x.device(), pool2d_backward, contiguous(grad_out), contiguous(x), contiguous(out), grad_x, p);
  return grad_x;
}

namespace {
// Batch norm keeps a channels-last input's layout: strides exactly (H*W*C, 1, W*C, C).
bool is_channels_last(const Tensor& x) {
  const Shape& s = x.shape();
  const Strides& st = x.strides();
  return x.dim() == 4 && st[1] == 1 && st[3] == s[1] && st[2] == s[3] * s[1] && st[0] == s[2] * s[3] * s[1];
}

// (N, C, H, W) with channels-last strides: an (N, H, W, C) tensor seen through a permutation.
Tensor empty_channels_last(const Shape& shape, TensorOptions options) {
  return views::permute(empty({shape[0], shape[2], shape[3], shape[1]}, options), {0, 3, 1, 2});
}

// t in the layout batch norm runs in: channels-last (copied if need be) or NCHW-contiguous.
Tensor in_layout(const Tensor& t, bool channels_last) {
  if (!channels_last) return contiguous(t);
  if (is_channels_last(t)) return t;
  Tensor out = empty_channels_last(t.shape(), t.options());  // (N, C, H, W), NHWC memory
  copy_(out, t);
  return out;
}

Tensor empty_in_layout(const Shape& shape, TensorOptions options, bool channels_last) {
  return channels_last ? empty_channels_last(shape, options) : empty(shape, options);
}
}  // namespace

BatchNormForward batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, bool training, double momentum, double eps,
                            const Tensor& residual, bool relu) {
  check_nchw("batch_norm", x);
  const int64_t c = x.shape()[1];
  DType stat = stats_dtype(x.dtype());
  for (const Tensor* t : {&weight, &bias, &running_mean, &running_var}) {
    TANDEM_CHECK_AS(ValueError, t->dim() == 1 && t->shape()[0] == c, "batch_norm: weight, bias and running statistics must be (",
                    c, ",) for input ", shape_str(x.shape()), ", got shape ", shape_str(t->shape()));
    TANDEM_CHECK_AS(TypeError, t->dtype() == stat, "batch_norm: weight, bias and running statistics must be ", stat,
                    " for ", x.dtype(), " input, got ", t->dtype());
    check_same_device("batch_norm", x, *t);
    TANDEM_CHECK_AS(ValueError, t->is_contiguous(), "batch_norm: per-channel tensors must be contiguous");
  }
  if (residual.defined()) {
    TANDEM_CHECK_AS(ValueError, residual.shape() == x.shape(), "batch_norm: residual ", shape_str(residual.shape()),
                    " must have the input's shape ", shape_str(x.shape()));
    TANDEM_CHECK_AS(TypeError, residual.dtype() == x.dtype(), "batch_norm: residual must be ", x.dtype(),
                    " like the input, got ", residual.dtype());
    check_same_device("batch_norm", x, residual);
  }
  if (training) {
    TANDEM_CHECK_AS(ValueError, c > 0 && x.numel() / c > 1,
                    "batch_norm: training needs more than one value per channel, got input ", shape_str(x.shape()));
  }
  const bool channels_last = is_channels_last(x);
  BatchNormForward result;
  result.out = empty_in_layout(x.shape(), x.options(), channels_last);  // like x
  Tensor xc = in_layout(x, channels_last);
  Tensor rc = residual.defined() ? in_layout(residual, channels_last) : Tensor();
  if (x.numel() == 0) return result;  // evaluation of an empty batch: nothing to write
  if (training) {
    result.save_mean = empty({c}, TensorOptions(stat, x.device()));
    result.save_invstd = empty({c}, TensorOptions(stat, x.device()));
    TANDEM_ROUTE(x.device(), batch_norm_forward_training, xc, weight, bias, running_mean, running_var, rc, relu,
                 result.out, result.save_mean, result.save_invstd, momentum, eps);
  } else {
    TANDEM_ROUTE(x.device(), batch_norm_forward_inference, xc, weight, bias, running_mean, running_var, rc, relu,
                 result.out, eps);
  }
  return result;
}

BatchNormBackward batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                      const Tensor& save_mean, const Tensor& save_invstd, const Tensor& relu_out,
                                      bool residual_grad) {
  const bool channels_last = is_channels_last(x);
  BatchNormBackward result{empty_in_layout(x.shape(), x.options(), channels_last),
                           empty(weight.shape(), weight.options()), empty(weight.shape(), weight.options()), Tensor()};
  // Without a ReLU the residual's gradient is grad_out itself; with one, the masked gradient the
  // backend writes.
  const bool write_residual_grad = residual_grad && relu_out.defined();
  if (write_residual_grad) result.grad_residual = empty_in_layout(x.shape(), x.options(), channels_last);
  TANDEM_ROUTE(x.device(), batch_norm_backward, in_layout(grad_out, channels_last), in_layout(x, channels_last), weight,
               save_mean, save_invstd, relu_out.defined() ? in_layout(relu_out, channels_last) : Tensor(),
               result.grad_input, result.grad_weight, result.grad_bias, result.grad_residual);
  if (residual_grad && !write_residual_grad) result.grad_residual = grad_out;
  return result;
}

}  // namespace tandem::kernels
