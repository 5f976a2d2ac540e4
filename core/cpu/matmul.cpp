// CPU matrix products: the raw buffers go straight to Eigen's GEMM as mapped matrices, row- or
// column-major as their strides say, so no copy is made for transposed views. Half types are
// widened to f32 first (they accumulate in f32 everywhere).
#include <Eigen/Core>

#include "tandem/core/backend.h"
#include "tandem/core/dispatch.h"

namespace tandem::cpu {

namespace {
template <typename T, int Order>
using MatrixMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Order>, Eigen::Unaligned,
                             Eigen::OuterStride<>>;
template <typename T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, Eigen::Unaligned,
                          Eigen::OuterStride<>>;

// A (rows, cols) matrix at p whose strides are (rs, cs): row-major when cs == 1, column-major
// when rs == 1. Anything else was made contiguous by the caller.
template <typename T, typename Fn>
void with_matrix(const T* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, Fn&& fn) {
  if (cs == 1) {
    fn(MatrixMap<T, Eigen::RowMajor>(p, rows, cols, Eigen::OuterStride<>(rows <= 1 ? cols : rs)));
  } else {
    fn(MatrixMap<T, Eigen::ColMajor>(p, rows, cols, Eigen::OuterStride<>(cols <= 1 ? rows : cs)));
  }
}

bool gemm_layout(const Tensor& t) {
  const Strides& s = t.strides();
  int64_t rows = t.shape()[1], cols = t.shape()[2];
  return (s[2] == 1 && (s[1] >= cols || rows <= 1)) || (s[1] == 1 && (s[2] >= rows || cols <= 1));
}

// Makes each (rows, cols) matrix of a (B, rows, cols) tensor row- or column-major.
Tensor gemm_ready(const Tensor& t) {
  if (gemm_layout(t)) return t;
  return kernels::contiguous(t);
}

template <typename T>
void gemm_batched(const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  Tensor a = gemm_ready(a_in), b = gemm_ready(b_in);
  const int64_t batch = out.shape()[0], m = out.shape()[1], n = out.shape()[2], k = a.shape()[2];
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* pc = out.data<T>();
  for (int64_t i = 0; i < batch; ++i) {
    OutMap<T> c(pc + i * m * n, m, n, Eigen::OuterStride<>(n));
    if (k == 0) {
      c.setZero();
      continue;
    }
    with_matrix(pa + i * a.strides()[0], m, k, a.strides()[1], a.strides()[2], [&](const auto& ma) {
      with_matrix(pb + i * b.strides()[0], k, n, b.strides()[1], b.strides()[2],
                  [&](const auto& mb) { c.noalias() = ma * mb; });
    });
  }
}
}  // namespace

void matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (a.dtype()) {
    case DType::f32: gemm_batched<float>(a, b, out); return;
    case DType::f64: gemm_batched<double>(a, b, out); return;
    case DType::f16:
    case DType::bf16: {
      Tensor c = empty(out.shape(), TensorOptions(DType::f32));
      gemm_batched<float>(kernels::to_dtype(a, DType::f32), kernels::to_dtype(b, DType::f32), c);
      kernels::copy_(out, c);
      return;
    }
    default: TANDEM_THROW(TypeError, "matmul: dtype ", a.dtype(), " is not supported on cpu (supported: f32, f64, f16, bf16)");
  }
}

}  // namespace tandem::cpu
