// The fused GELU MLP op (gelu_mlp: cuBLASLt's GELU_AUX_BIAS forward; backward, DGELU in 16 bits
// and the bias gradients as column sums) against the CPU's composed path in f64, forward and every
// gradient, on fresh random inputs in f32, bf16 and f16: GPT-2's MLP shape, a hidden width that is
// no multiple of 8 (GELU's backward composed), no biases, and only some inputs requiring grad.
#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

struct MlpCase {
  DType dtype;
  int64_t tokens, width, hidden;
  bool with_bias;
  bool input_needs_grad;
};

Tensor rounded(const Shape& shape, double low, double high, DType dtype) {
  return to(to(testing::random_uniform(shape, low, high, DType::f32), dtype), DType::f64);
}

Tensor on_gpu(const Tensor& t, DType dtype, bool grad) {
  Tensor g = to(to(t, dtype), Device("cuda"));
  return grad ? g.requires_grad_() : g;
}
Tensor on_cpu(const Tensor& t) { return to(to(t, Device("cpu")), DType::f64); }

void check_case(const MlpCase& c, double tol) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " (" << c.tokens << ", " << c.width << ") hidden "
                                    << c.hidden << (c.with_bias ? " bias" : "")
                                    << (c.input_needs_grad ? "" : ", x without grad"));
  const double fc_scale = 1.0 / std::sqrt(static_cast<double>(c.width));
  const double proj_scale = 1.0 / std::sqrt(static_cast<double>(c.hidden));
  Tensor x = rounded({2, c.tokens, c.width}, -1.0, 1.0, c.dtype);
  Tensor fc_w = rounded({c.hidden, c.width}, -2.0 * fc_scale, 2.0 * fc_scale, c.dtype);
  Tensor fc_b = c.with_bias ? rounded({c.hidden}, -0.5, 0.5, c.dtype) : Tensor();
  Tensor proj_w = rounded({c.width, c.hidden}, -2.0 * proj_scale, 2.0 * proj_scale, c.dtype);
  Tensor proj_b = c.with_bias ? rounded({c.width}, -0.5, 0.5, c.dtype) : Tensor();
  Tensor direction = rounded({2, c.tokens, c.width}, -1.0, 1.0, c.dtype);

  std::vector<Tensor> cpu{x, fc_w, fc_b, proj_w, proj_b}, gpu;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const bool grad = i > 0 || c.input_needs_grad;
    if (!cpu[i].defined()) {
      gpu.emplace_back();
      continue;
    }
    gpu.push_back(on_gpu(cpu[i], c.dtype, grad));
    cpu[i] = grad ? cpu[i].detach().requires_grad_() : cpu[i];
  }
  // The reference: the two linear ops, composed on the CPU in f64.
  Tensor ref = linear(linear(cpu[0], cpu[1], cpu[2], Activation::gelu_tanh), cpu[3], cpu[4]);
  sum(mul(ref, direction)).backward();
  Tensor got = gelu_mlp(gpu[0], gpu[1], gpu[2], gpu[3], gpu[4]);
  ASSERT_TRUE(got.device().is_cuda());
  ASSERT_EQ(got.shape(), ref.shape());
  sum(mul(to(got, DType::f32), to(to(direction, DType::f32), Device("cuda")))).backward();

  EXPECT_TRUE(testing::all_close(on_cpu(got), ref, tol, tol)) << "output";
  const char* names[] = {"x", "fc weight", "fc bias", "proj weight", "proj bias"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (!cpu[i].defined()) continue;
    if (i == 0 && !c.input_needs_grad) {
      EXPECT_FALSE(gpu[0].grad().defined());
      continue;
    }
    ASSERT_TRUE(gpu[i].grad().defined()) << names[i];
    EXPECT_TRUE(testing::all_close(on_cpu(gpu[i].grad()), cpu[i].grad(), 2 * tol, 2 * tol))
        << "gradient of " << names[i];
  }
}

std::vector<MlpCase> cases(DType dtype) {
  return {
      {dtype, 64, 768, 3072, true, true},  // GPT-2's MLP, few rows: GELU's backward composed
      {dtype, 2048, 64, 256, true, true},  // 4096 rows: enough for the DGELU epilogue in 16 bits
      {dtype, 17, 40, 64, false, true},    // no biases
      {dtype, 9, 48, 44, true, true},      // hidden width not a multiple of 8: composed
      {dtype, 33, 64, 128, true, false},   // x is data (the first layer of a model)
  };
}

TEST(GeluMlpParity, F32) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (const MlpCase& c : cases(DType::f32)) check_case(c, 2e-4);
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

TEST(GeluMlpParity, BF16) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (const MlpCase& c : cases(DType::bf16)) check_case(c, 3e-2);
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

TEST(GeluMlpParity, F16) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (const MlpCase& c : cases(DType::f16)) check_case(c, 6e-3);
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

// The input gradient through GELU alone, on the GPU in bf16 against the CPU in f64 from the same
// bf16 values: few rows (matmul, then GELU's backward) and many (the DGELU epilogue).
TEST(GeluMlpParity, InputGradientThroughGeluMatchesTheCpu) {
  TANDEM_REQUIRE_CUDA();
  for (int64_t tokens : {24, 2048}) {
    SCOPED_TRACE(::testing::Message() << 2 * tokens << " rows");
    Tensor g = rounded({2, tokens, 40}, -1.0, 1.0, DType::bf16);
    Tensor w = rounded({40, 96}, -0.25, 0.25, DType::bf16);
    Tensor pre = rounded({2, tokens, 96}, -2.0, 2.0, DType::bf16);
    Tensor cpu = kernels::linear_backward_input_gelu(g, w, pre).grad;
    Tensor gpu = kernels::linear_backward_input_gelu(to(to(g, DType::bf16), Device("cuda")),
                                                     to(to(w, DType::bf16), Device("cuda")),
                                                     to(to(pre, DType::bf16), Device("cuda")))
                     .grad;
    ASSERT_EQ(gpu.shape(), pre.shape());
    EXPECT_TRUE(testing::all_close(on_cpu(gpu), cpu, 2e-2, 2e-2));
  }
}

}  // namespace
}  // namespace tandem
