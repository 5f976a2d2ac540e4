// Pooling and batch norm through cuDNN's (v7-style) descriptor API, on NCHW tensors (see
// cudnn_conv.cpp for convolutions).
#include "tandem/core/cuda/cudnn_common.h"

namespace tandem::cuda {

namespace {
using namespace cudnn;

class PoolDesc {
 public:
  explicit PoolDesc(const Pool2dParams& p) {
    TANDEM_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&desc_));
    cudnnPoolingMode_t mode = p.mode == PoolMode::max ? CUDNN_POOLING_MAX
                              : p.count_include_pad   ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                      : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    TANDEM_CUDNN_CHECK(cudnnSetPooling2dDescriptor(desc_, mode, CUDNN_PROPAGATE_NAN, static_cast<int>(p.kernel_h),
                                                   static_cast<int>(p.kernel_w), static_cast<int>(p.pad_h),
                                                   static_cast<int>(p.pad_w), static_cast<int>(p.stride_h),
                                                   static_cast<int>(p.stride_w)));
  }
  ~PoolDesc() { cudnnDestroyPoolingDescriptor(desc_); }
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
  cudnnPoolingDescriptor_t get() const { return desc_; }

 private:
  cudnnPoolingDescriptor_t desc_ = nullptr;
};

// Per-channel tensors as cuDNN wants them: (1, C, 1, 1).
TensorDesc channel_desc(const Tensor& per_channel) { return TensorDesc(per_channel.dtype(), {1, per_channel.shape()[0], 1, 1}); }
}  // namespace

void pool2d_forward(const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  NvtxRange range(p.mode == PoolMode::max ? "max_pool2d" : "avg_pool2d");
  int device = x.device().index;
  DeviceGuard guard(device);
  PoolDesc pd(p);
  TensorDesc xd(x), yd(out);
  TANDEM_CUDNN_CHECK(cudnnPoolingForward(handle(device), pd.get(), kScalars.one(x.dtype()), xd.get(), x.data_ptr(),
                                         kScalars.zero(x.dtype()), yd.get(), out.data_ptr()));
}

void pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Tensor& grad_x,
                     const Pool2dParams& p) {
  NvtxRange range("pool2d_backward");
  int device = x.device().index;
  DeviceGuard guard(device);
  PoolDesc pd(p);
  TensorDesc xd(x), yd(out);
  TANDEM_CUDNN_CHECK(cudnnPoolingBackward(handle(device), pd.get(), kScalars.one(x.dtype()), yd.get(), out.data_ptr(),
                                          yd.get(), grad_out.data_ptr(), xd.get(), x.data_ptr(),
                                          kScalars.zero(x.dtype()), xd.get(), grad_x.data_ptr()));
}

void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                 const Tensor& running_var, const Tensor& out, const Tensor& save_mean,
                                 const Tensor& save_invstd, double momentum, double eps) {
  NvtxRange range("batch_norm");
  int device = x.device().index;
  DeviceGuard guard(device);
  TensorDesc xd(x);
  TensorDesc cd = channel_desc(weight);
  // cuDNN updates the running variance with the unbiased batch variance, as PyTorch does.
  TANDEM_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(
      handle(device), CUDNN_BATCHNORM_SPATIAL, kScalars.one(x.dtype()), kScalars.zero(x.dtype()), xd.get(),
      x.data_ptr(), xd.get(), out.data_ptr(), cd.get(), weight.data_ptr(), bias.data_ptr(), momentum,
      running_mean.data_ptr(), running_var.data_ptr(), std::max(eps, CUDNN_BN_MIN_EPSILON), save_mean.data_ptr(),
      save_invstd.data_ptr()));
}

void batch_norm_forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                  const Tensor& running_var, const Tensor& out, double eps) {
  NvtxRange range("batch_norm");
  int device = x.device().index;
  DeviceGuard guard(device);
  TensorDesc xd(x);
  TensorDesc cd = channel_desc(weight);
  TANDEM_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(
      handle(device), CUDNN_BATCHNORM_SPATIAL, kScalars.one(x.dtype()), kScalars.zero(x.dtype()), xd.get(),
      x.data_ptr(), xd.get(), out.data_ptr(), cd.get(), weight.data_ptr(), bias.data_ptr(), running_mean.data_ptr(),
      running_var.data_ptr(), std::max(eps, CUDNN_BN_MIN_EPSILON)));
}

void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                         const Tensor& save_invstd, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias) {
  NvtxRange range("batch_norm_backward");
  int device = x.device().index;
  DeviceGuard guard(device);
  TensorDesc xd(x);
  TensorDesc cd = channel_desc(weight);
  const void* one = kScalars.one(x.dtype());
  const void* zero = kScalars.zero(x.dtype());
  // The saved mean and inverse std are given, so cuDNN does not use epsilon here.
  TANDEM_CUDNN_CHECK(cudnnBatchNormalizationBackward(handle(device), CUDNN_BATCHNORM_SPATIAL, one, zero, one, zero,
                                                     xd.get(), x.data_ptr(), xd.get(), grad_out.data_ptr(), xd.get(),
                                                     grad_x.data_ptr(), cd.get(), weight.data_ptr(),
                                                     grad_weight.data_ptr(), grad_bias.data_ptr(), CUDNN_BN_MIN_EPSILON,
                                                     save_mean.data_ptr(), save_invstd.data_ptr()));
}

}  // namespace tandem::cuda
