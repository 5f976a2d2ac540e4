// The fused CUDA linear op (cuBLASLt's BIAS / GELU_AUX_BIAS epilogues forward; backward, the bias
// gradient summed in one pass over the output's gradient, through GELU's backward where it had one)
// against the CPU's composed matmul + add + gelu, forward and every gradient, on fresh random
// inputs in f32 (with and without TF32), bf16 and f16; GPT-2's MLP shapes, a width that is no
// multiple of 8 (GELU composed), no bias, and a weight large enough that its gradient comes first.
#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

struct LinearCase {
  DType dtype;
  int64_t batch, tokens, in, out;
  bool with_bias;
  Activation act;
};

Tensor rounded(const Shape& shape, double low, double high, DType dtype) {
  return to(to(testing::random_uniform(shape, low, high, DType::f32), dtype), DType::f64);
}

Tensor on_gpu(const Tensor& t, DType dtype) { return to(to(t, dtype), Device("cuda")).requires_grad_(); }
Tensor on_cpu(const Tensor& t) { return to(to(t, Device("cpu")), DType::f64); }

void check_case(const LinearCase& c, double tol) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " x (" << c.batch << ", " << c.tokens << ", " << c.in
                                    << ") -> " << c.out << (c.with_bias ? " bias" : "")
                                    << (c.act == Activation::gelu_tanh ? " gelu_tanh" : ""));
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.in));
  Tensor x = rounded({c.batch, c.tokens, c.in}, -1.0, 1.0, c.dtype);
  Tensor w = rounded({c.out, c.in}, -2.0 * scale, 2.0 * scale, c.dtype);
  Tensor b = c.with_bias ? rounded({c.out}, -0.5, 0.5, c.dtype) : Tensor();
  Tensor direction = rounded({c.batch, c.tokens, c.out}, -1.0, 1.0, c.dtype);

  Tensor xr = x.detach().requires_grad_(), wr = w.detach().requires_grad_();
  Tensor br = b.defined() ? b.detach().requires_grad_() : Tensor();
  Tensor ref = linear(xr, wr, br, c.act);
  sum(mul(ref, direction)).backward();

  Tensor xg = on_gpu(x, c.dtype), wg = on_gpu(w, c.dtype);
  Tensor bg = b.defined() ? on_gpu(b, c.dtype) : Tensor();
  Tensor got = linear(xg, wg, bg, c.act);
  ASSERT_TRUE(got.device().is_cuda());
  ASSERT_EQ(got.shape(), ref.shape());
  sum(mul(to(got, DType::f32), to(to(direction, DType::f32), Device("cuda")))).backward();

  EXPECT_TRUE(testing::all_close(on_cpu(got), ref, tol, tol)) << "output";
  EXPECT_TRUE(testing::all_close(on_cpu(xg.grad()), xr.grad(), 2 * tol, 2 * tol)) << "gradient of x";
  EXPECT_TRUE(testing::all_close(on_cpu(wg.grad()), wr.grad(), 2 * tol, 2 * tol)) << "gradient of weight";
  if (b.defined())
    EXPECT_TRUE(testing::all_close(on_cpu(bg.grad()), br.grad(), 2 * tol, 2 * tol)) << "gradient of bias";
}

std::vector<LinearCase> cases(DType dtype) {
  return {
      {dtype, 2, 64, 768, 3072, true, Activation::gelu_tanh},  // GPT-2's c_fc
      {dtype, 2, 64, 3072, 768, true, Activation::none},       // GPT-2's c_proj
      {dtype, 2, 64, 768, 2304, true, Activation::none},       // GPT-2's c_attn
      {dtype, 3, 17, 40, 24, false, Activation::gelu_tanh},    // no bias: GELU_AUX
      {dtype, 1, 33, 48, 20, true, Activation::none},          // small and odd
      {dtype, 1, 33, 48, 21, true, Activation::gelu_tanh},     // width not a multiple of 8: composed
      {dtype, 1, 9, 64, 40, false, Activation::none},
  };
}

TEST(LinearParity, F32) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (const LinearCase& c : cases(DType::f32)) check_case(c, 1e-4);
  cuda::set_matmul_precision(cuda::MatmulPrecision::high);  // TF32: about 10 mantissa bits
  for (const LinearCase& c : cases(DType::f32)) check_case(c, 1e-2);
  cuda::set_matmul_precision(cuda::MatmulPrecision::highest);
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

TEST(LinearParity, BF16) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (const LinearCase& c : cases(DType::bf16)) check_case(c, 2e-2);
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

TEST(LinearParity, F16) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (const LinearCase& c : cases(DType::f16)) check_case(c, 4e-3);
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

TEST(LinearParity, ALargeWeightGradientMadeFirstMatches) {
  TANDEM_REQUIRE_CUDA();
  // 4096 x 2048 in bf16, 16 MiB: the backward makes the weight gradient before the input gradient
  // on a GPU whose L2 holds at most 64 MiB.
  const LinearCase c{DType::bf16, 1, 24, 2048, 4096, true, Activation::gelu_tanh};
  Tensor grad = empty({24, 4096}, TensorOptions(DType::bf16, Device("cuda")));  // (M, N) for the rule
  Tensor weight = empty({4096, 2048}, TensorOptions(DType::bf16, Device("cuda")));
  if (!kernels::weight_gradient_first(grad, weight)) {
    GTEST_SKIP() << "this GPU's L2 (" << cuda::l2_cache_bytes() << " bytes) keeps a 16 MiB weight gradient second";
  }
  EXPECT_FALSE(kernels::weight_gradient_first(to(grad, Device("cpu")), to(weight, Device("cpu"))))
      << "the CPU keeps the input gradient first";
  cuda::set_poison_allocations(true);
  check_case(c, 2e-2);
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

TEST(LinearParity, PreActivationIsStoredForTheBackward) {
  TANDEM_REQUIRE_CUDA();
  Tensor x = to(testing::random_tensor({16, 64}, DType::f32), Device("cuda"));
  Tensor w = to(mul(testing::random_tensor({32, 64}, DType::f32), 0.125), Device("cuda"));
  Tensor b = to(testing::random_tensor({32}, DType::f32), Device("cuda"));
  kernels::LinearForward f = kernels::linear_forward(x, w, b, Activation::gelu_tanh);
  ASSERT_TRUE(f.pre.defined());
  Tensor expected = add(matmul(to(x, Device("cpu")), t(to(w, Device("cpu")))), to(b, Device("cpu")));
  EXPECT_TRUE(testing::all_close(to(f.pre, Device("cpu")), expected, 1e-4, 1e-4));
}

}  // namespace
}  // namespace tandem
