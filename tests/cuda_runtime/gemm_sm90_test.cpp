// tandem's CUTLASS products for sm_90 (core/cuda/gemm_sm90.h): every kernel kind (the linear
// layer's forward with no epilogue, with a bias, with a bias and a residual added, and with a bias
// and GELU storing the pre-activation; the input gradient, plain, through GELU's backward, and that with the partial
// rows of its column sums; the weight gradient), in
// bf16 and f16, in every variant, against the CPU in f64 on fresh random inputs of 16-bit values,
// on shapes that leave partial tiles and rows longer than the matrix; and the problems that have no
// kernel. Skips without an sm_90 GPU or in a build without CUTLASS's headers.
#include <cuda_runtime.h>

#include <algorithm>

#include "support/test_util.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/copy.h"
#include "tandem/core/cuda/gemm_sm90.h"
#include "tandem/core/cuda/runtime.h"
#include "tandem/core/elementwise.h"

namespace tandem::cuda::sm90 {
namespace {

#define TANDEM_REQUIRE_SM90()                                                                       \
  do {                                                                                              \
    TANDEM_REQUIRE_CUDA();                                                                          \
    if (!cutlass_gemm_built()) GTEST_SKIP() << "tandem was built without CUTLASS's headers";        \
    if (!available(0)) GTEST_SKIP() << "device 0 is not an sm_90 GPU (the kernels are for sm_90a)"; \
  } while (0)

using testing::on_cpu_f64;
using testing::on_gpu_as;
using testing::random_exact_in;

double tolerance(DType dtype) { return dtype == DType::bf16 ? 2e-2 : 4e-3; }

// Runs p with every variant, each into a freshly cleared d, and checks d (and aux) against want.
void check_every_variant(Problem p, const Tensor& d, const Tensor& want, const Tensor& aux = Tensor(),
                         const Tensor& want_aux = Tensor()) {
  ASSERT_TRUE(supported(p));
  const double tol = tolerance(p.dtype);
  for (int v = 0; v < kVariants; ++v) {
    SCOPED_TRACE(variant_name(v));
    kernels::fill_(d, 0.0);
    if (aux.defined()) kernels::fill_(aux, 0.0);
    ASSERT_TRUE(run(p, v, 0, current_stream(0)));
    EXPECT_TRUE(testing::all_close(on_cpu_f64(d), want, tol, tol));
    if (aux.defined()) EXPECT_TRUE(testing::all_close(on_cpu_f64(aux), want_aux, tol, tol)) << "pre-activation";
  }
}

TEST(GemmSm90, ForwardEpiloguesMatchTheCpu) {
  TANDEM_REQUIRE_SM90();
  const int64_t m = 200, n = 264, k = 136;
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = random_exact_in({m, k}, -1.0, 1.0, dtype), w = random_exact_in({n, k}, -0.2, 0.2, dtype);
    Tensor b = random_exact_in({n}, -0.5, 0.5, dtype);
    Tensor gx = on_gpu_as(x, dtype), gw = on_gpu_as(w, dtype), gb = on_gpu_as(b, dtype);
    Tensor out = empty({m, n}, TensorOptions(dtype, Device("cuda")));  // (m, n)
    Tensor pre = empty({m, n}, TensorOptions(dtype, Device("cuda")));  // (m, n)
    Problem p;
    p.dtype = dtype;
    p.m = m, p.n = n, p.k = k;
    p.a = gx.data_ptr(), p.lda = k;
    p.b = gw.data_ptr(), p.ldb = k, p.b_transposed = true;
    p.d = out.data_ptr(), p.ldd = n;
    Tensor product = matmul(x, transpose(w, 0, 1));  // (m, n) f64
    {
      SCOPED_TRACE("no epilogue");
      check_every_variant(p, out, product);
    }
    p.bias = gb.data_ptr();
    Tensor with_bias = add(product, b);
    {
      SCOPED_TRACE("bias");
      p.epilogue = Epilogue::bias;
      check_every_variant(p, out, with_bias);
    }
    {
      SCOPED_TRACE("bias and the residual: one rounding of the f32 sum");
      Tensor residual = random_exact_in({m, n}, -4.0, 4.0, dtype);
      Tensor gr = on_gpu_as(residual, dtype);
      p.epilogue = Epilogue::bias_residual;
      p.c = gr.data_ptr();
      check_every_variant(p, out, add(with_bias, residual));
      EXPECT_TRUE(testing::all_close(on_cpu_f64(gr), residual, 0.0, 0.0)) << "the residual is read, not written";
      p.c = nullptr;
    }
    {
      SCOPED_TRACE("bias and GELU");
      p.epilogue = Epilogue::bias_gelu_aux;
      p.aux = pre.data_ptr();
      // GELU of the 16-bit pre-activation the kernel keeps, as the backward reads it.
      Tensor pre_16 = to(to(with_bias, dtype), DType::f64);
      check_every_variant(p, out, gelu(pre_16, GeluApproximate::tanh), pre, with_bias);
    }
  }
}

TEST(GemmSm90, GradientProductsMatchTheCpu) {
  TANDEM_REQUIRE_SM90();
  const int64_t m = 520, n = 392, k = 264, pad = 24;
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    {
      SCOPED_TRACE("input gradient, A's rows longer than the matrix");
      Tensor g_wide = random_exact_in({m, k + pad}, -1.0, 1.0, dtype), w = random_exact_in({k, n}, -0.2, 0.2, dtype);
      Tensor gg = on_gpu_as(g_wide, dtype), gw = on_gpu_as(w, dtype);
      Tensor out = empty({m, n}, TensorOptions(dtype, Device("cuda")));  // (m, n)
      Problem p;
      p.dtype = dtype;
      p.m = m, p.n = n, p.k = k;
      p.a = gg.data_ptr(), p.lda = k + pad;  // the first k columns of g_wide
      p.b = gw.data_ptr(), p.ldb = n;
      p.d = out.data_ptr(), p.ldd = n;
      check_every_variant(p, out, matmul(narrow(g_wide, 1, 0, k), w));
    }
    {
      SCOPED_TRACE("input gradient through GELU: gelu_tanh'(pre) * (g @ w), pre read in the epilogue");
      Tensor g = random_exact_in({m, k}, -1.0, 1.0, dtype), w = random_exact_in({k, n}, -0.2, 0.2, dtype);
      Tensor pre = random_exact_in({m, n}, -3.0, 3.0, dtype);
      Tensor gg = on_gpu_as(g, dtype), gw = on_gpu_as(w, dtype), gpre = on_gpu_as(pre, dtype);
      Tensor out = empty({m, n}, TensorOptions(dtype, Device("cuda")));  // (m, n)
      Problem p;
      p.dtype = dtype;
      p.m = m, p.n = n, p.k = k;
      p.a = gg.data_ptr(), p.lda = k;
      p.b = gw.data_ptr(), p.ldb = n;
      p.d = out.data_ptr(), p.ldd = n;
      p.epilogue = Epilogue::dgelu_aux;
      p.aux = gpre.data_ptr();
      check_every_variant(p, out, kernels::unary_backward(UnaryOp::gelu_tanh, matmul(g, w), pre));
    }
    {
      SCOPED_TRACE("input gradient through GELU with its column sums, one partial row per tile of rows");
      // A multiple of 256, as the bias partials need, 3 or 6 tiles wide beside m's 5 or 9: CUTLASS's
      // persistent scheduler pads its grid of tiles to whole clusters (2 along m) and swizzles (4
      // where both sides have 3 tiles or more) and runs the padding's tiles too, past m and past n,
      // which must write no partial row.
      const int64_t wide = 768;
      const int64_t guard = 8;  // rows after the buffer's max_bias_partial_rows(m), which no variant may write
      Tensor g = random_exact_in({m, k}, -1.0, 1.0, dtype), w = random_exact_in({k, wide}, -0.2, 0.2, dtype);
      Tensor pre = random_exact_in({m, wide}, -3.0, 3.0, dtype);
      Tensor gg = on_gpu_as(g, dtype), gw = on_gpu_as(w, dtype), gpre = on_gpu_as(pre, dtype);
      Tensor out = empty({m, wide}, TensorOptions(dtype, Device("cuda")));  // (m, wide)
      Tensor partial = empty({max_bias_partial_rows(m) + guard, wide},
                             TensorOptions(DType::f32, Device("cuda")));  // (rows, wide) f32
      Problem p;
      p.dtype = dtype;
      p.m = m, p.n = wide, p.k = k;
      p.a = gg.data_ptr(), p.lda = k;
      p.b = gw.data_ptr(), p.ldb = wide;
      p.d = out.data_ptr(), p.ldd = wide;
      p.epilogue = Epilogue::dgelu_aux_bias_partials;
      p.aux = gpre.data_ptr();
      p.bias_partials = static_cast<float*>(partial.data_ptr());
      ASSERT_TRUE(supported(p));
      Tensor want = kernels::unary_backward(UnaryOp::gelu_tanh, matmul(g, w), pre);  // (m, wide) f64
      for (int v = 0; v < kVariants; ++v) {
        SCOPED_TRACE(variant_name(v));
        kernels::fill_(out, 0.0);
        kernels::fill_(partial, 1e30);
        ASSERT_TRUE(run(p, v, 0, current_stream(0)));
        Tensor stored = on_cpu_f64(out);  // D as the kernel rounded it
        EXPECT_TRUE(testing::all_close(stored, want, tolerance(dtype), tolerance(dtype)));
        // Row i: the column sums of D's rows in tile i (the last tile partly past m), in f32.
        const int64_t tile = bias_partial_tile_rows(v), parts = bias_partial_rows(v, m);
        Tensor rows = on_cpu_f64(narrow(partial, 0, 0, parts));
        for (int64_t i = 0; i < parts; ++i) {
          const int64_t first = i * tile, count = std::min(tile, m - first);
          Tensor want_row = sum(narrow(stored, 0, first, count), {0});
          EXPECT_TRUE(testing::all_close(narrow(rows, 0, i, 1).reshape({wide}), want_row, 1e-5, 1e-4))
              << "partial row " << i;
        }
        // Every row after them as it was filled: no tile wrote past its own row.
        const int64_t rest = partial.shape()[0] - parts;
        EXPECT_TRUE(testing::all_close(on_cpu_f64(narrow(partial, 0, parts, rest)),
                                       full({rest, wide}, static_cast<double>(1e30f), DType::f64), 0.0, 0.0))
            << "rows " << parts << " to " << parts + rest - 1 << " were written";
      }
    }
    {
      SCOPED_TRACE("weight gradient");
      Tensor g = random_exact_in({k, m}, -1.0, 1.0, dtype),
             x = random_exact_in({k, n}, -1.0, 1.0, dtype);  // k is the batch
      Tensor gg = on_gpu_as(g, dtype), gx = on_gpu_as(x, dtype);
      Tensor out = empty({m, n}, TensorOptions(dtype, Device("cuda")));  // (m, n)
      Problem p;
      p.dtype = dtype;
      p.m = m, p.n = n, p.k = k;
      p.a = gg.data_ptr(), p.lda = m, p.a_transposed = true;
      p.b = gx.data_ptr(), p.ldb = n;
      p.d = out.data_ptr(), p.ldd = n;
      check_every_variant(p, out, matmul(transpose(g, 0, 1), x));
    }
  }
}

// kernels::linear_backward_input_gelu with the bias gradient, tandem's kernels forced: the product's
// epilogue sums d pre's columns (4104 rows: past the 4096 from which GELU's backward runs in the
// epilogue, with a last tile of 8 rows), as the CPU sums the same 16-bit values.
TEST(GemmSm90, InputGradientThroughGeluSumsTheBiasGradient) {
  TANDEM_REQUIRE_SM90();
  struct Restore {
    GemmKernels kernels = gemm_kernels();
    ~Restore() { set_gemm_kernels(kernels); }
  } restore;
  set_gemm_kernels(GemmKernels::cutlass);
  const int64_t rows = 4104, n = 40, k = 256;
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor g = random_exact_in({rows, n}, -1.0, 1.0, dtype), w = random_exact_in({n, k}, -0.2, 0.2, dtype);
    Tensor pre = random_exact_in({rows, k}, -3.0, 3.0, dtype);
    kernels::LinearActivationGrads got =
        kernels::linear_backward_input_gelu(on_gpu_as(g, dtype), on_gpu_as(w, dtype), on_gpu_as(pre, dtype), true);
    ASSERT_TRUE(got.bias.defined()) << "the product's epilogue did not sum the bias gradient";
    Tensor d_pre = on_cpu_f64(got.grad);  // (rows, k) as stored
    EXPECT_TRUE(testing::all_close(d_pre, kernels::unary_backward(UnaryOp::gelu_tanh, matmul(g, w), pre),
                                   tolerance(dtype), tolerance(dtype)));
    EXPECT_TRUE(testing::all_close(on_cpu_f64(got.bias), sum(d_pre, {0}), tolerance(dtype), tolerance(dtype)))
        << "bias gradient";
  }
}

TEST(GemmSm90, ProblemsWithoutAKernel) {
  TANDEM_REQUIRE_SM90();
  Tensor buffer = empty({4096}, TensorOptions(DType::bf16, Device("cuda")));  // (4096,) aligned
  Problem p;
  p.m = 16, p.n = 16, p.k = 16;
  p.a = p.b = buffer.data_ptr();
  p.d = buffer.data_ptr();
  p.lda = p.ldb = p.ldd = 16;
  p.b_transposed = true;
  EXPECT_TRUE(supported(p));
  Problem q = p;
  q.dtype = DType::f32;
  EXPECT_FALSE(supported(q)) << "f32";
  q = p;
  q.k = 12, q.lda = q.ldb = 12;
  EXPECT_FALSE(supported(q)) << "rows of 12 elements: not whole 16-byte units";
  q = p;
  q.a = static_cast<const char*>(p.a) + 2;
  EXPECT_FALSE(supported(q)) << "A 2 bytes off 16-byte alignment";
  q = p;
  q.a_transposed = true;
  EXPECT_FALSE(supported(q)) << "both operands transposed";
  q = p;
  q.b_transposed = false;
  q.epilogue = Epilogue::bias;
  q.bias = buffer.data_ptr();
  EXPECT_FALSE(supported(q)) << "a bias epilogue on the input gradient";
  q.epilogue = Epilogue::dgelu_aux;
  q.aux = buffer.data_ptr();
  EXPECT_TRUE(supported(q)) << "GELU's backward on the input gradient";
  q.aux = nullptr;
  EXPECT_FALSE(supported(q)) << "GELU's backward without the pre-activation";
  q = p;
  q.epilogue = Epilogue::dgelu_aux;
  q.aux = buffer.data_ptr();
  EXPECT_FALSE(supported(q)) << "GELU's backward on the forward";
  q.b_transposed = false;
  q.epilogue = Epilogue::dgelu_aux_bias_partials;
  q.bias_partials = static_cast<float*>(buffer.data_ptr());
  EXPECT_FALSE(supported(q)) << "bias partials of 16 columns: not a multiple of 256";
  q.n = q.ldb = q.ldd = 256;
  EXPECT_TRUE(supported(q)) << "bias partials of 256 columns";
  q.bias_partials = nullptr;
  EXPECT_FALSE(supported(q)) << "bias partials with nowhere to write them";
  q = p;
  q.epilogue = Epilogue::bias;
  EXPECT_FALSE(supported(q)) << "a bias epilogue without a bias";
  q.epilogue = Epilogue::bias_residual;
  q.bias = buffer.data_ptr();
  EXPECT_FALSE(supported(q)) << "the residual epilogue without a residual";
  q.c = buffer.data_ptr();
  EXPECT_TRUE(supported(q)) << "the residual epilogue on the forward";
  q.c = static_cast<const char*>(buffer.data_ptr()) + 2;
  EXPECT_FALSE(supported(q)) << "a residual 2 bytes off 16-byte alignment";
  q.c = buffer.data_ptr();
  q.b_transposed = false;
  EXPECT_FALSE(supported(q)) << "the residual epilogue on the input gradient";
  q = p;
  q.lda = 8;
  EXPECT_FALSE(supported(q)) << "a leading dimension shorter than the rows";
  EXPECT_FALSE(run(q, 0, 0, current_stream(0)));
}

}  // namespace
}  // namespace tandem::cuda::sm90
