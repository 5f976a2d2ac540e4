// Pooling through cuDNN's (v7-style) descriptor API, on NCHW or channels-last tensors (the
// descriptors carry the strides, so NHWC pools without a transpose; see cudnn_conv.cpp for
// convolutions; batch norm has kernels of its own in batch_norm.cu). Deterministic mode takes
// cuDNN's deterministic max pooling, whose backward adds overlapping windows in a fixed order.
#include "tandem/core/cuda/cudnn_common.h"
#include "tandem/core/determinism.h"

namespace tandem::cuda {

namespace {
using namespace cudnn;

class PoolDesc {
 public:
  explicit PoolDesc(const Pool2dParams& p) {
    TANDEM_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&desc_));
    const cudnnPoolingMode_t max_mode =
        are_deterministic_algorithms_enabled() ? CUDNN_POOLING_MAX_DETERMINISTIC : CUDNN_POOLING_MAX;
    cudnnPoolingMode_t mode = p.mode == PoolMode::max ? max_mode
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

}  // namespace tandem::cuda
