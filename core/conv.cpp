// The device-neutral side of 2-D convolution, pooling and batch norm over (N, C, H, W) tensors,
// row-major or channels-last.
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

// The layout a convolution runs in, as PyTorch chooses it for cuDNN: channels-last when the input
// or the weight is, row-major otherwise. All three tensors of each direction take it.
MemoryFormat conv_format(const Tensor& a, const Tensor& b) {
  const bool channels_last = a.suggest_memory_format() == MemoryFormat::channels_last ||
                             b.suggest_memory_format() == MemoryFormat::channels_last;
  return channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous;
}

// Allocates an output of `shape` laid out in `format` and has `compute` fill it. cuDNN reads
// channels-last strides as they are; the CPU kernels take NCHW, so on the CPU a channels-last
// output is computed into a row-major buffer and copied into place (the same arithmetic, so the
// same bits as the NCHW path). `compute(out, format)` gets the buffer and the format its inputs
// must be given in.
template <typename Compute>
Tensor in_layout(const Shape& shape, TensorOptions options, MemoryFormat format, Compute&& compute) {
  Tensor out = empty(shape, options, format);
  if (out.numel() == 0) return out;
  if (!options.device.is_cpu() || format == MemoryFormat::contiguous) {
    compute(out, format);
    return out;
  }
  Tensor row_major = empty(shape, options);  // what the CPU kernel writes
  compute(row_major, MemoryFormat::contiguous);
  copy_(out, row_major);
  return out;
}
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
  return in_layout({n, k, out_h, out_w}, x.options(), conv_format(x, weight), [&](const Tensor& out, MemoryFormat f) {
    TANDEM_ROUTE(x.device(), conv2d_forward, contiguous(x, f), contiguous(weight, f), out, p);
  });
}

Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dParams& p) {
  const MemoryFormat format = conv_format(grad_out, weight);
  return in_layout(input_shape, grad_out.options(), format, [&](const Tensor& grad_x, MemoryFormat f) {
    TANDEM_ROUTE(grad_out.device(), conv2d_backward_input, contiguous(grad_out, f), contiguous(weight, f), grad_x, p);
  });
}

Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dParams& p) {
  const MemoryFormat format = conv_format(grad_out, x);
  return in_layout(weight_shape, grad_out.options(), format, [&](const Tensor& grad_w, MemoryFormat f) {
    TANDEM_ROUTE(grad_out.device(), conv2d_backward_weight, contiguous(grad_out, f), contiguous(x, f), grad_w, p);
  });
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
  const Shape out_shape{x.shape()[0], x.shape()[1], out_h, out_w};
  return in_layout(out_shape, x.options(), x.suggest_memory_format(), [&](const Tensor& out, MemoryFormat f) {
    TANDEM_ROUTE(x.device(), pool2d_forward, contiguous(x, f), out, p);
  });
}

Tensor pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  return in_layout(x.shape(), x.options(), x.suggest_memory_format(), [&](const Tensor& grad_x, MemoryFormat f) {
    TANDEM_ROUTE(x.device(), pool2d_backward, contiguous(grad_out, f), contiguous(x, f), contiguous(out, f), grad_x, p);
  });
}


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
  const MemoryFormat format = x.suggest_memory_format();  // batch norm keeps x's layout
  BatchNormForward result;
  result.out = empty(x.shape(), x.options(), format);  // like x
  Tensor xc = contiguous(x, format);
  Tensor rc = residual.defined() ? contiguous(residual, format) : Tensor();
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
  const MemoryFormat format = x.suggest_memory_format();  // batch norm keeps x's layout
  BatchNormBackward result{empty(x.shape(), x.options(), format),
                           empty(weight.shape(), weight.options()), empty(weight.shape(), weight.options()), Tensor()};
  // Without a ReLU the residual's gradient is grad_out itself; with one, the masked gradient the
  // backend writes.
  const bool write_residual_grad = residual_grad && relu_out.defined();
  if (write_residual_grad) result.grad_residual = empty(x.shape(), x.options(), format);
  TANDEM_ROUTE(x.device(), batch_norm_backward, contiguous(grad_out, format), contiguous(x, format), weight,
               save_mean, save_invstd, relu_out.defined() ? contiguous(relu_out, format) : Tensor(),
               result.grad_input, result.grad_weight, result.grad_bias, result.grad_residual);
  if (residual_grad && !write_residual_grad) result.grad_residual = grad_out;
  return result;
}

}  // namespace tandem::kernels
