#pragma once
// 2-D convolution, pooling and batch norm over (N, C, H, W) tensors (device-neutral side).
// Backends: core/cpu/{conv,pool,batch_norm}.cpp, core/cuda/cudnn_conv.cpp, core/cuda/cudnn.cpp,
// core/cuda/batch_norm{,_nhwc}.cu. Outputs and gradients keep the inputs' memory format: a
// convolution with a channels-last input or weight runs channels-last (cuDNN's NHWC kernels on
// CUDA; the NCHW kernels and a copy on the CPU), pooling and batch norm follow their input.
#include <cstdint>

#include "tandem/core/tensor.h"

namespace tandem {

// 2-D convolution over NCHW tensors, as in torch.nn.functional.conv2d.
struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

enum class PoolMode { max, average };
// 2-D pooling over NCHW tensors, as in torch.nn.functional.max_pool2d / avg_pool2d.
struct Pool2dParams {
  PoolMode mode = PoolMode::max;
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // average pooling: divide by the full window, padding included
};

namespace kernels {

// ---- convolution, pooling (NCHW), batch norm (NCHW or channels-last) ----
// x (N, C, H, W), weight (K, C / groups, R, S) -> (N, K, P, Q). No bias: add it by broadcasting.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dParams& params);
Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dParams& params);
Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dParams& params);
Tensor pool2d(const Tensor& x, const Pool2dParams& params);
Tensor pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Pool2dParams& params);

// Batch norm over (N, H, W) per channel of x (N, C, H, W). weight, bias, running stats: (C,) in
// f32 (f64 for f64 inputs). In training the batch statistics normalise and update the running
// ones (running = (1 - momentum) * running + momentum * batch, with the unbiased variance).
// x may be channels-last (strides (H*W*C, 1, W*C, C): NHWC memory); the output then is too, and
// any other layout is made NCHW-contiguous first. Results are the same in both layouts.
//
// With a residual (x's shape) and/or relu, out = relu(batch_norm(x) + residual), the values of
// batch_norm, add and relu run one after the other (the normalised value is rounded to x's dtype
// before the add, as the separate ops round it); on CUDA one pass writes it.
struct BatchNormForward {
  Tensor out;         // like x
  Tensor save_mean;   // (C,) batch mean (training) or empty
  Tensor save_invstd; // (C,) 1 / sqrt(batch var + eps) (training) or empty
};
BatchNormForward batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, bool training, double momentum, double eps,
                            const Tensor& residual = Tensor(), bool relu = false);
struct BatchNormBackward {
  Tensor grad_input, grad_weight, grad_bias;
  Tensor grad_residual;  // the gradient reaching the residual add, when asked for
};
// The training backward. With relu_out (the forward's output after its ReLU) defined, grad_out is
// first masked where relu_out <= 0 (ReLU's backward); with residual_grad, grad_residual is that
// masked gradient (the residual add passes it through unchanged).
BatchNormBackward batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                      const Tensor& save_mean, const Tensor& save_invstd,
                                      const Tensor& relu_out = Tensor(), bool residual_grad = false);

}  // namespace kernels
}  // namespace tandem
