#pragma once
// What the cuBLASLt users of the CUDA backend share (matmul.cpp, linear.cpp): the status check,
// one handle per device, the workspace size, dtype -> cuBLASLt types (f32 takes TF32 only under
// MatmulPrecision::high), pointer alignment, and owning wrappers of the descriptors.
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <mutex>

#include "tandem/core/cuda/runtime.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/tensor.h"

#define TANDEM_CUBLAS_CHECK(call)                                                                           \
  do {                                                                                                      \
    cublasStatus_t tandem_status_ = (call);                                                                 \
    if (tandem_status_ != CUBLAS_STATUS_SUCCESS) {                                                          \
      throw ::tandem::BackendError(::tandem::detail::concat("cuBLAS error ", cublasGetStatusName(tandem_status_), \
                                                            ": ", cublasGetStatusString(tandem_status_)),        \
                                   #call, __FILE__, __LINE__);                                              \
    }                                                                                                       \
  } while (0)

namespace tandem::cuda::lt {

constexpr size_t kWorkspaceBytes = 32u << 20;

inline cublasLtHandle_t handle(int device) {
  static std::mutex mutex;
  static std::map<int, cublasLtHandle_t> handles;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = handles.find(device);
  if (it != handles.end()) return it->second;
  DeviceGuard guard(device);
  cublasLtHandle_t h = nullptr;
  TANDEM_CUBLAS_CHECK(cublasLtCreate(&h));
  handles[device] = h;
  return h;
}

// The largest power of two (up to 256) that divides the address.
inline int alignment(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  int bytes = 256;
  while (bytes > 1 && a % bytes != 0) bytes /= 2;
  return bytes;
}

struct Types {
  cudaDataType_t data;
  cublasComputeType_t compute;
  cudaDataType_t scale;
};

inline Types types_for(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return {CUDA_R_32F, matmul_precision() == MatmulPrecision::high ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
              CUDA_R_32F};
    case DType::f64: return {CUDA_R_64F, CUBLAS_COMPUTE_64F, CUDA_R_64F};
    case DType::f16: return {CUDA_R_16F, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    case DType::bf16: return {CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_32F};
    default:
      TANDEM_THROW(TypeError, "matmul: dtype ", dtype_name(dtype), " is not supported on cuda (supported: f32, f64, f16, bf16)");
  }
}

class Layout {
 public:
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t batch_stride) {
    TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_, type, rows, cols, ld));
    if (batch > 1) {
      int32_t count = static_cast<int32_t>(batch);
      TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout_, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      TANDEM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout_, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                           &batch_stride, sizeof batch_stride));
    }
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(layout_); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

class MatmulDesc {
 public:
  MatmulDesc(const Types& t, bool transpose_a, bool transpose_b) {
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, t.compute, t.scale));
    cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc_); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  cublasLtMatmulDesc_t get() const { return desc_; }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
};

}  // namespace tandem::cuda::lt
