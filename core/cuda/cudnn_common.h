#pragma once
// What the cuDNN translation units share (cudnn.cpp: pooling; cudnn_conv.cpp:
// convolution): the checked-call macro, one handle per device, dtype mapping and the RAII
// descriptors of the (v7-style) descriptor API, which take row-major and channels-last tensors.
#include <cudnn.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/runtime.h"

#define TANDEM_CUDNN_CHECK(call)                                                                           \
  do {                                                                                                     \
    cudnnStatus_t tandem_status_ = (call);                                                                 \
    if (tandem_status_ != CUDNN_STATUS_SUCCESS) {                                                          \
      throw ::tandem::BackendError(::tandem::detail::concat("cuDNN error: ", cudnnGetErrorString(tandem_status_)), \
                                   #call, __FILE__, __LINE__);                                             \
    }                                                                                                      \
  } while (0)

namespace tandem::cuda::cudnn {

inline cudnnHandle_t handle(int device) {
  static std::mutex mutex;
  static std::map<int, cudnnHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it == handles.end()) {
    DeviceGuard guard(device);
    cudnnHandle_t h = nullptr;
    TANDEM_CUDNN_CHECK(cudnnCreate(&h));
    it = handles.emplace(device, h).first;
  }
  TANDEM_CUDNN_CHECK(cudnnSetStream(it->second, current_stream(device)));
  return it->second;
}

inline cudnnDataType_t data_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: TANDEM_THROW(TypeError, "cuDNN: dtype ", dtype_name(dtype), " is not supported (f32, f64, f16, bf16)");
  }
}

inline cudnnDataType_t compute_type(DType dtype) { return dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT; }

inline cudnnMathType_t math_type(DType dtype) {
  if (is_half(dtype)) return CUDNN_TENSOR_OP_MATH;
  if (dtype == DType::f32 && matmul_precision() == MatmulPrecision::high) return CUDNN_DEFAULT_MATH;
  return CUDNN_FMA_MATH;
}

// Scaling factors are double for double data and float otherwise.
struct Scalars {
  float f_one = 1.0f, f_zero = 0.0f;
  double d_one = 1.0, d_zero = 0.0;
  const void* one(DType dtype) const { return dtype == DType::f64 ? static_cast<const void*>(&d_one) : &f_one; }
  const void* zero(DType dtype) const { return dtype == DType::f64 ? static_cast<const void*>(&d_zero) : &f_zero; }
};
inline const Scalars kScalars;

// A 4-D tensor's descriptor with its own strides, so NCHW and channels-last (NHWC strides) both
// describe themselves; shorter shapes (per-channel (C,) tensors) are row-major (1, C, 1, 1).
class TensorDesc {
 public:
  TensorDesc(const Tensor& t)  // NOLINT
      : TensorDesc(t.dtype(), t.shape(), t.dim() == 4 ? t.strides() : Strides()) {}
  TensorDesc(DType dtype, const Shape& s, Strides strides = {}) {
    TANDEM_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_));
    Shape four = s;
    while (four.size() < 4) four.push_back(1);
    if (strides.size() != 4) strides = contiguous_strides(four);
    auto i = [](int64_t v) { return static_cast<int>(v); };
    TANDEM_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(desc_, data_type(dtype), i(four[0]), i(four[1]), i(four[2]),
                                                    i(four[3]), i(strides[0]), i(strides[1]), i(strides[2]),
                                                    i(strides[3])));
  }
  ~TensorDesc() { cudnnDestroyTensorDescriptor(desc_); }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDesc {
 public:
  // A weight with channels-last strides is an NHWC filter (sizes still given as K, C, R, S); the
  // exact strides decide, so a 1x1 weight given channels-last strides is NHWC too.
  explicit FilterDesc(const Tensor& w) {
    TANDEM_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_));
    const bool nhwc = w.dim() == 4 && w.strides() == memory_format_strides(w.shape(), MemoryFormat::channels_last) &&
                      w.strides() != contiguous_strides(w.shape());
    const cudnnTensorFormat_t format = nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    TANDEM_CUDNN_CHECK(cudnnSetFilter4dDescriptor(desc_, data_type(w.dtype()), format,
                                                  static_cast<int>(w.shape()[0]), static_cast<int>(w.shape()[1]),
                                                  static_cast<int>(w.shape()[2]), static_cast<int>(w.shape()[3])));
  }
  ~FilterDesc() { cudnnDestroyFilterDescriptor(desc_); }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvDesc {
 public:
  ConvDesc(const Conv2dParams& p, DType dtype, cudnnMathType_t math) {
    TANDEM_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_));
    TANDEM_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        desc_, static_cast<int>(p.pad_h), static_cast<int>(p.pad_w), static_cast<int>(p.stride_h),
        static_cast<int>(p.stride_w), static_cast<int>(p.dilation_h), static_cast<int>(p.dilation_w),
        CUDNN_CROSS_CORRELATION, compute_type(dtype)));
    TANDEM_CUDNN_CHECK(cudnnSetConvolutionGroupCount(desc_, static_cast<int>(p.groups)));
    set_math(math);
  }
  ~ConvDesc() { cudnnDestroyConvolutionDescriptor(desc_); }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }
  void set_math(cudnnMathType_t math) { TANDEM_CUDNN_CHECK(cudnnSetConvolutionMathType(desc_, math)); }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

}  // namespace tandem::cuda::cudnn
