// The linear layer's matmuls through cuBLASLt with epilogues. tandem's matrices are row-major and
// cuBLASLt's column-major, so every product is computed transposed:
// - forward, out (M, N) = act(x (M, K) @ W (N, K)^T + b): cuBLASLt computes out^T (N, M) =
//   op_T(W as stored, (K, N)) @ x as stored (K, M). The bias runs along D's rows (N), which is
//   what CUBLASLT_EPILOGUE_BIAS broadcasts; GELU_AUX_BIAS also stores x W^T + b into the aux
//   buffer, column-major (N, M) with leading dimension N: that is pre (M, N) row-major. With a
//   residual (M, N) the product adds it as C (beta 1), laid out as out is.
// - weight gradient, dW (N, K) = g (M, N)^T @ x (M, K): cuBLASLt computes dW^T (K, N) =
//   x as stored (K, M) @ op_T(g as stored, (N, M)). The GEMM's k is M, and the bias gradient
//   sum_m g[m, n] is a reduction of cuBLASLt's B over k into D's columns (N): BGRADB.
// - input gradient through GELU, d_pre (M, K) = gelu'(pre) * (g (M, N) @ W (N, K)): cuBLASLt
//   computes d_pre^T (K, M) = W as stored (K, N) @ g as stored (N, M), and the DGELU epilogue
//   reads pre (M, K) row-major as the aux (K, M) with leading dimension K (bf16 and f16 only:
//   see core/linear.cpp). DGELU_BGRAD, which
//   also sums d_pre into the bias gradient of the layer that made pre, made GPT-2's bf16 step 6%
//   slower on an H200: the linear ops sum that bias gradient in a pass of their own
//   (core/cuda/bias_gradient.cu), which beat BGRADB on the weight gradient's matmul as well.
// Algorithms come from the heuristic (or are timed: cuda::set_matmul_tuning) and are cached per
// problem; a problem without an algorithm is reported (false) so the caller composes plain kernels
// instead. On sm_90 the forward (bias and GELU epilogues), the input gradient through GELU and the
// weight gradient without BGRADB may run on tandem's CUTLASS kernels instead (gemm_sm90.h,
// cuda::gemm_kernels), which take the row-major operands as they are.
#include <algorithm>
#include <functional>
#include <tuple>

#include "tandem/core/backend.h"
#include "tandem/core/column_sum_batch.h"
#include "tandem/core/cuda/cublaslt_plan.h"
#include "tandem/core/cuda/runtime.h"
#include "tandem/core/views.h"

namespace tandem::cuda {

namespace {
using namespace lt;

// One cuBLASLt problem D (rows, cols) = op(A) @ op(B), with its epilogue and the alignments the
// chosen algorithm relies on, and the epilogue of the same problem for gemm_sm90.h (-1: none).
using PlanKey =
    std::tuple<int, int, int, int64_t, int64_t, int64_t, bool, bool, int, int, int, int, int, int, int, int, int>;

// The algorithm per problem, or found false where cuBLASLt has none.
PlanCache<PlanKey>& plans() {
  static PlanCache<PlanKey> cache;
  return cache;
}

struct Problem {
  Device device;
  DType dtype;
  int64_t rows, cols, k;  // D (rows, cols) = op(A) (rows, k) @ op(B) (k, cols)
  bool transpose_a, transpose_b;
  const void* a;  // stored column-major (rows, k), or (k, rows) when transposed
  int64_t lda;
  const void* b;  // stored column-major (k, cols), or (cols, k) when transposed
  int64_t ldb;
  void* d;        // (rows, cols) column-major, ld = rows
  const void* c;  // (rows, cols) like d, added to the product (beta 1), or null (beta 0)
  cublasLtEpilogue_t epilogue;
  const void* bias;  // bias (forward) or bias gradient (backward), or null
  void* aux;         // GELU pre-activation (rows, cols), ld = rows, or null
};

// Runs the problem (on gemm_sm90.h's kernel where sm90_problem, the same problem for it, is given and
// chosen); false when neither has an algorithm for it. `sm90_variant` (or null) gets the variant of
// gemm_sm90.h's kernel that ran, or -1 where cuBLASLt's did. `sm90_saves`: as query_heuristic takes it.
bool run(const Problem& p, const sm90::Problem* sm90_problem = nullptr, int* sm90_variant = nullptr,
         const std::function<bool()>& sm90_saves = nullptr) {
  Types t = types_for(p.dtype);
  MatmulDesc desc(t, p.transpose_a, p.transpose_b);
  TANDEM_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, &p.epilogue, sizeof p.epilogue));
  if (p.bias) {
    TANDEM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof p.bias));
    cudaDataType_t bias_type = t.data;  // the output's type (Ctype), as for every non-FP8 kernel
    TANDEM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  }
  if (p.aux) {
    int64_t aux_ld = p.rows;  // divisible by 8, checked by the caller
    TANDEM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof p.aux));
    TANDEM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
  }
  // A (rows, k) after op: stored (k, rows) when transposed; B (k, cols): stored (cols, k) when transposed.
  Layout layout_a(t.data, p.transpose_a ? p.k : p.rows, p.transpose_a ? p.rows : p.k, p.lda, 1, 0);
  Layout layout_b(t.data, p.transpose_b ? p.cols : p.k, p.transpose_b ? p.k : p.cols, p.ldb, 1, 0);
  Layout layout_d(t.data, p.rows, p.cols, p.rows, 1, 0);

  const int align_a = alignment(p.a), align_b = alignment(p.b);
  const int align_d = p.c ? std::min(alignment(p.d), alignment(p.c)) : alignment(p.d);  // C's and D's
  const int align_bias = p.bias ? alignment(p.bias) : 0, align_aux = p.aux ? alignment(p.aux) : 0;
  const int device = p.device.index;
  PlanKey key{device,
              static_cast<int>(p.dtype),
              static_cast<int>(t.compute),
              p.rows,
              p.cols,
              p.k,
              p.transpose_a,
              p.transpose_b,
              static_cast<int>(p.epilogue),
              align_a,
              align_b,
              align_d,
              align_bias,
              align_aux,
              static_cast<int>(gemm_kernels()),
              sm90_problem ? static_cast<int>(sm90_problem->epilogue) : -1,
              p.c != nullptr};
  NvtxRange range("linear");
  DeviceGuard guard(device);
  // With a residual C = it and beta 1 (C is not D, so running again writes the same D); else C = D, unread.
  const float alpha = 1.0f, beta = p.c ? 1.0f : 0.0f;
  const void* c = p.c ? p.c : p.d;
  auto launch = [&](const cublasLtMatmulAlgo_t& algo, void* workspace, size_t workspace_bytes) {
    return cublasLtMatmul(handle(device), desc.get(), &alpha, p.a, layout_a.get(), p.b, layout_b.get(), &beta, c,
                          layout_d.get(), p.d, layout_d.get(), &algo, workspace, workspace_bytes,
                          current_stream(device));
  };
  // No algorithm (an epilogue this library version cannot fuse for the problem) is not an error:
  // the caller composes plain kernels, whose own calls report any real failure.
  const Heuristic h = plans().find(key, [&] {
    const double flops = 2.0 * static_cast<double>(p.rows) * static_cast<double>(p.cols) * static_cast<double>(p.k);
    return query_heuristic(device, desc, layout_a, layout_b, layout_d, {align_a, align_b, align_d}, flops, launch,
                           detail::concat("linear ", dtype_name(p.dtype), " D (", p.rows, ", ", p.cols, "), k ", p.k,
                                          ", epilogue ", static_cast<int>(p.epilogue), p.c ? " + C" : ""),
                           sm90_problem, sm90_saves);
  });
  if (!h.found && h.sm90_variant < 0) return false;
  bool ran_sm90 = false;
  cublasStatus_t status = run_choice(h, launch, p.device, sm90_problem, &ran_sm90);
  if (sm90_variant) *sm90_variant = ran_sm90 ? h.sm90_variant : -1;
  if (status == CUBLAS_STATUS_NOT_SUPPORTED) {  // refused before launching: remember, and compose instead
    plans().mark_unusable(key);
    return false;
  }
  TANDEM_CUBLAS_CHECK(status);
  return true;
}
}  // namespace

bool linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& pre,
                    Activation act, const Tensor& residual) {
  const int64_t m = x.shape()[0], k = x.shape()[1], n = weight.shape()[0];
  Problem p{};
  p.device = out.device();
  p.dtype = x.dtype();
  p.rows = n;  // D = out^T (N, M)
  p.cols = m;
  p.k = k;
  p.transpose_a = true;  // W (N, K) row-major is (K, N) column-major: op_T gives (N, K)
  p.a = weight.data_ptr();
  p.lda = k;
  p.transpose_b = false;  // x (M, K) row-major is (K, M) column-major
  p.b = x.data_ptr();
  p.ldb = k;
  p.d = out.data_ptr();
  p.c = residual.defined() ? residual.data_ptr() : nullptr;  // (M, N) row-major: out^T's layout
  p.bias = bias.defined() ? bias.data_ptr() : nullptr;
  if (act == Activation::gelu_tanh) {
    p.aux = pre.data_ptr();
    p.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  } else {
    p.aux = nullptr;
    p.epilogue = bias.defined() ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
  // The same for gemm_sm90.h: out (M, N) = x (M, K) @ (W (N, K) as stored, transposed), which has
  // GELU's epilogue and the residual's only with a bias.
  sm90::Problem s;
  s.dtype = x.dtype();
  s.m = m, s.n = n, s.k = k;
  s.a = x.data_ptr(), s.lda = k, s.a_transposed = false;
  s.b = weight.data_ptr(), s.ldb = k, s.b_transposed = true;
  s.d = out.data_ptr(), s.ldd = n;
  s.bias = p.bias;
  s.c = p.c;
  s.aux = p.aux;
  s.epilogue = act == Activation::gelu_tanh ? sm90::Epilogue::bias_gelu_aux
               : residual.defined()         ? sm90::Epilogue::bias_residual
               : bias.defined()             ? sm90::Epilogue::bias
                                            : sm90::Epilogue::none;
  const bool sm90_has_it = (act != Activation::gelu_tanh && !residual.defined()) || bias.defined();
  return run(p, sm90_has_it ? &s : nullptr);
}

bool linear_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight, const Tensor& grad_bias) {
  const int64_t m = x.shape()[0], k = x.shape()[1], n = grad.shape()[1];
  Problem p{};
  p.device = grad_weight.device();
  p.dtype = x.dtype();
  p.rows = k;  // D = dW^T (K, N)
  p.cols = n;
  p.k = m;
  p.transpose_a = false;  // x (M, K) row-major is (K, M) column-major
  p.a = x.data_ptr();
  p.lda = k;
  p.transpose_b = true;  // g (M, N) row-major is (N, M) column-major: op_T gives (M, N)
  p.b = grad.data_ptr();
  p.ldb = n;
  p.d = grad_weight.data_ptr();
  p.c = nullptr;
  p.bias = grad_bias.defined() ? grad_bias.data_ptr() : nullptr;
  p.aux = nullptr;
  p.epilogue = grad_bias.defined() ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT;
  // The same for gemm_sm90.h (without the bias gradient, which it has no epilogue for):
  // dW (N, K) = (g (M, N) as stored, transposed) @ x (M, K).
  sm90::Problem s;
  s.dtype = x.dtype();
  s.m = n, s.n = k, s.k = m;
  s.a = grad.data_ptr(), s.lda = n, s.a_transposed = true;
  s.b = x.data_ptr(), s.ldb = k, s.b_transposed = false;
  s.d = grad_weight.data_ptr(), s.ldd = k;
  return run(p, grad_bias.defined() ? nullptr : &s);
}

bool linear_backward_input_gelu(const Tensor& grad, const Tensor& weight, const Tensor& pre, const Tensor& grad_pre,
                                const Tensor& grad_bias, bool* bias_summed) {
  if (bias_summed) *bias_summed = false;
  const int64_t m = grad.shape()[0], n = grad.shape()[1], k = weight.shape()[1];
  Problem p{};
  p.device = grad_pre.device();
  p.dtype = grad.dtype();
  p.rows = k;  // D = d_pre^T (K, M)
  p.cols = m;
  p.k = n;
  p.transpose_a = false;  // W (N, K) row-major is (K, N) column-major
  p.a = weight.data_ptr();
  p.lda = k;
  p.transpose_b = false;  // g (M, N) row-major is (N, M) column-major
  p.b = grad.data_ptr();
  p.ldb = n;
  p.d = grad_pre.data_ptr();
  p.c = nullptr;
  p.bias = nullptr;
  p.aux = pre.data_ptr();
  p.epilogue = CUBLASLT_EPILOGUE_DGELU;
  // The same for gemm_sm90.h: d_pre (M, K) = g (M, N) @ W (N, K), both as stored, times gelu'(pre)
  // with pre (M, K) read in the epilogue.
  sm90::Problem s;
  s.dtype = grad.dtype();
  s.m = m, s.n = k, s.k = n;
  s.a = grad.data_ptr(), s.lda = n;
  s.b = weight.data_ptr(), s.ldb = k;
  s.d = grad_pre.data_ptr(), s.ldd = k;
  s.epilogue = sm90::Epilogue::dgelu_aux;
  s.aux = pre.data_ptr();
  // With the bias gradient: its partial sums in the same kernel, where that kernel is chosen.
  Tensor partial;  // (max_bias_partial_rows(M), K) f32, one row per tile of rows
  if (grad_bias.defined() && sm90::available(p.device.index)) {
    partial = empty({sm90::max_bias_partial_rows(m), k}, TensorOptions(DType::f32, grad_pre.device()));
    s.epilogue = sm90::Epilogue::dgelu_aux_bias_partials;
    s.bias_partials = static_cast<float*>(partial.data_ptr());
    if (!sm90::supported(s)) {  // (K not a multiple of 256): the bias gradient is left to the caller
      partial = Tensor();
      s.epilogue = sm90::Epilogue::dgelu_aux;
      s.bias_partials = nullptr;
    }
  }
  // What the fused kernel saves when timed against cuBLASLt's DGELU: the bias gradient's own pass
  // over d pre (launched at once, not left in a backward pass's batch).
  auto separate_bias_pass = [&] {
    ColumnSumBatchScope launch_now(nullptr);
    column_sums(grad_pre, grad_bias);
    return true;
  };
  int variant = -1;
  if (!run(p, &s, &variant, partial.defined() ? std::function<bool()>(separate_bias_pass) : nullptr)) return false;
  if (partial.defined() && variant >= 0) {
    add_partial_rows(views::narrow(partial, 0, 0, sm90::bias_partial_rows(variant, m)), grad_bias);
    if (bias_summed) *bias_summed = true;
  }
  return true;
}

}  // namespace tandem::cuda
