// Matrix products through cuBLASLt. tandem's matrices are row-major; cuBLASLt's are
// column-major, and a row-major (r, c) matrix is the column-major (c, r) matrix of its transpose.
// So C = A @ B is computed as C^T = B^T @ A^T with the operands swapped, each passed as stored
// (transposed views become a transpose op, not a copy). f16/bf16 accumulate in f32; f32 uses
// TF32 tensor cores only under MatmulPrecision::high. Algorithms come from cuBLASLt's heuristic
// (or are timed: set_matmul_tuning) and are cached per shape, layout and alignment. A single
// (unbatched) 16-bit product may run on tandem's CUTLASS kernels instead on sm_90 (gemm_sm90.h,
// cuda::gemm_kernels).
#include <tuple>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/cublaslt_plan.h"
#include "tandem/core/cuda/runtime.h"

namespace tandem::cuda {

namespace {
using namespace lt;
MatmulPrecision precision = MatmulPrecision::highest;

// One operand as cuBLASLt sees it: the stored column-major matrix, whether to transpose it, its
// leading dimension and batch stride.
struct Operand {
  int64_t rows, cols, ld, batch_stride;
  bool transpose;
};

// A row-major-indexed (r, c) matrix with strides (rs, cs) is column-major (c, r) when cs == 1,
// or column-major (r, c), to be transposed, when rs == 1.
Operand describe(int64_t r, int64_t c, int64_t rs, int64_t cs, int64_t bs) {
  if (cs == 1 && (rs >= c || r <= 1)) return {c, r, std::max<int64_t>(std::max<int64_t>(rs, c), 1), bs, false};
  return {r, c, std::max<int64_t>(std::max<int64_t>(cs, r), 1), bs, true};
}

bool gemm_layout(const Tensor& t) {
  const Strides& s = t.strides();
  int64_t r = t.shape()[1], c = t.shape()[2];
  return (s[2] == 1 && (s[1] >= c || r <= 1)) || (s[1] == 1 && (s[2] >= r || c <= 1));
}

using PlanKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, bool, bool, int, int, int, int>;
}  // namespace

void set_matmul_precision(MatmulPrecision p) { precision = p; }
MatmulPrecision matmul_precision() { return precision; }

void matmul(const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  Tensor a = gemm_layout(a_in) ? a_in : kernels::contiguous(a_in);
  Tensor b = gemm_layout(b_in) ? b_in : kernels::contiguous(b_in);
  const int64_t batch = out.shape()[0], m = out.shape()[1], n = out.shape()[2], k = a.shape()[2];
  if (out.numel() == 0) return;
  if (k == 0) {
    fill(out, 0.0);
    return;
  }
  NvtxRange range("matmul");
  int device = out.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = current_stream(device);
  Types t = types_for(a.dtype());

  // Swapped: the first cuBLASLt operand is our B, the second our A; the result is C^T (n, m).
  Operand lb = describe(k, n, b.strides()[1], b.strides()[2], b.strides()[0]);
  Operand la = describe(m, k, a.strides()[1], a.strides()[2], a.strides()[0]);
  MatmulDesc desc(t, lb.transpose, la.transpose);
  Layout layout_b(t.data, lb.rows, lb.cols, lb.ld, batch, lb.batch_stride);
  Layout layout_a(t.data, la.rows, la.cols, la.ld, batch, la.batch_stride);
  Layout layout_c(t.data, n, m, n, batch, m * n);

  int align_a = alignment(a.data_ptr()), align_b = alignment(b.data_ptr()), align_c = alignment(out.data_ptr());
  PlanKey key{device, static_cast<int>(a.dtype()), static_cast<int>(t.compute), batch, m, n, k, la.ld, lb.ld,
              la.batch_stride, lb.batch_stride, 0, la.transpose, lb.transpose, align_a, align_b, align_c,
              static_cast<int>(gemm_kernels())};
  static PlanCache<PlanKey> plans;
  float alpha_f = 1.0f, beta_f = 0.0f;
  double alpha_d = 1.0, beta_d = 0.0;
  const void* alpha = t.scale == CUDA_R_64F ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = t.scale == CUDA_R_64F ? static_cast<const void*>(&beta_d) : &beta_f;
  auto launch = [&](const cublasLtMatmulAlgo_t& algo, void* workspace, size_t workspace_bytes) {
    return cublasLtMatmul(handle(device), desc.get(), alpha, b.data_ptr(), layout_b.get(), a.data_ptr(), layout_a.get(),
                          beta, out.data_ptr(), layout_c.get(), out.data_ptr(), layout_c.get(), &algo, workspace,
                          workspace_bytes, stream);
  };
  // The same product for gemm_sm90.h, where unbatched: out (m, n) = A (m, k) @ B (k, n), each
  // operand row-major as stored or stored transposed (describe's transpose).
  sm90::Problem s;
  s.dtype = a.dtype();
  s.m = m, s.n = n, s.k = k;
  s.a = a.data_ptr(), s.lda = la.ld, s.a_transposed = la.transpose;
  s.b = b.data_ptr(), s.ldb = lb.ld, s.b_transposed = lb.transpose;
  s.d = out.data_ptr(), s.ldd = n;
  const sm90::Problem* sm90_problem = batch == 1 ? &s : nullptr;
  // cuBLASLt's A is our B.
  const Heuristic h = plans.find(key, [&] {
    const double flops =
        2.0 * static_cast<double>(batch) * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
    return query_heuristic(
        device, desc, layout_b, layout_a, layout_c, {align_b, align_a, align_c}, flops, launch,
        detail::concat("matmul ", dtype_name(a.dtype()), " ", batch, " x (", m, ", ", k, ") @ (", k, ", ", n, ")"),
        sm90_problem);
  });
  TANDEM_CUBLAS_CHECK(h.status);
  TANDEM_CHECK_AS(BackendError, h.found || h.sm90_variant >= 0, "matmul: cuBLASLt has no algorithm for ", batch,
                  " x (", m, ", ", k, ") @ (", k, ", ", n, ") in ", a.dtype());
  TANDEM_CUBLAS_CHECK(run_choice(h, launch, out.device(), sm90_problem));
}

}  // namespace tandem::cuda
