#pragma once
// Argument checks and layout helpers shared by the device-neutral kernels (core/*.cpp), and the
// macro that routes a call to the backend of a device. Internal: not part of the public API.
#include <cstdint>

#include "tandem/core/backend.h"
#include "tandem/core/copy.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/tensor.h"

// Calls the backend of `device` (the same function name exists in cpu:: and cuda::).
// CPU work inside a CUDA graph capture would run once, at capture, and never on replay: an error.
#define TANDEM_ROUTE(device, fn, ...)                                                                \
  ((device).is_cpu() ? (::tandem::cuda::check_not_capturing("an op on CPU tensors (" #fn ")"), cpu::fn(__VA_ARGS__)) \
                     : cuda::fn(__VA_ARGS__))

namespace tandem::kernels {

inline void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  TANDEM_CHECK_AS(DeviceError, a.device() == b.device(), op, ": tensors are on different devices, ", a.device(),
                  " and ", b.device(), " (move one with .to(device))");
}

inline void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  TANDEM_CHECK_AS(TypeError, a.dtype() == b.dtype(), op, ": dtypes differ, ", a.dtype(), " (shape ",
                  shape_str(a.shape()), ") and ", b.dtype(), " (shape ", shape_str(b.shape()),
                  "); convert one with .to(dtype)");
}

inline void check_floating(const char* op, const Tensor& x) {
  TANDEM_CHECK_AS(TypeError, is_floating(x.dtype()), op, ": expected a floating-point tensor (f32, f64, f16, bf16), got ",
                  x.dtype());
}

// index (i64 or i32, on `device`) as a contiguous i64 tensor.
inline Tensor index_as_i64(const char* op, const Tensor& index, Device device) {
  TANDEM_CHECK_AS(TypeError, index.dtype() == DType::i64 || index.dtype() == DType::i32, op,
                  ": index must be i64 or i32, got ", index.dtype());
  TANDEM_CHECK_AS(DeviceError, index.device() == device, op, ": index is on ", index.device(),
                  " but the tensor is on ", device);
  return contiguous(to_dtype(index, DType::i64));
}

// (outer, middle, inner) around dim d of `shape`: outer the product of the dims before d, inner
// of those after it.
inline Shape three_dims(const Shape& shape, int64_t d, int64_t middle) {
  int64_t outer = 1;
  int64_t inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) inner *= shape[i];
  return {outer, middle, inner};
}

// A contiguous x viewed as (outer, x.shape[d], inner).
inline Tensor as_three_dims(const Tensor& contiguous_x, int64_t d) {
  Shape s = three_dims(contiguous_x.shape(), d, contiguous_x.dim() == 0 ? 1 : contiguous_x.shape()[d]);
  return contiguous_x.as_strided(s, contiguous_strides(s), contiguous_x.offset());
}

}  // namespace tandem::kernels
