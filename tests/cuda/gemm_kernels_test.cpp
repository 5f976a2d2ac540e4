// cuda::set_gemm_kernels (TANDEM_GEMM). With `cutlass`, the bf16/f16 products of linear layers run
// on tandem's sm_90 kernels where those have one (the forward with its bias and GELU epilogues, the
// input and weight gradients), the variant timed (MatmulTuning::all) or not (none); with
// `cublaslt` on cuBLASLt. Either way a two-layer GELU MLP's output and gradients match the CPU in
// f64 on fresh random inputs, and a second run gives the same bits (a problem keeps its choice); so
// does gelu_mlp at 4096 rows and more, whose input gradient through GELU is one product (on tandem's
// kernel, with fc's bias gradient summed in its epilogue where the hidden width allows).
// On a GPU other than sm_90, or in a build without CUTLASS, both settings run cuBLASLt. The shapes
// are this file's own, so that no earlier test of the process has already fixed their choices.
#include <functional>

#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/determinism.h"

namespace tandem {
namespace {

using testing::on_cpu_f64;
using testing::on_gpu_as;
using testing::random_exact_in;

// Sets the kernels and the tuning for one scope.
struct Setting {
  Setting(cuda::GemmKernels kernels, cuda::MatmulTuning tuning) {
    cuda::set_gemm_kernels(kernels);
    cuda::set_matmul_tuning(tuning);
  }
  ~Setting() {
    cuda::set_gemm_kernels(kernels_before);
    cuda::set_matmul_tuning(tuning_before);
  }
  cuda::GemmKernels kernels_before = cuda::gemm_kernels();
  cuda::MatmulTuning tuning_before = cuda::matmul_tuning();
};

// The two layers as linear ops, or as gelu_mlp (fused: from 4096 rows its input gradient through
// GELU is one product with GELU's backward in the epilogue).
Tensor mlp(const std::vector<Tensor>& p, bool fused) {
  if (fused) return gelu_mlp(p[0], p[1], p[2], p[3], p[4]);
  return linear(linear(p[0], p[1], p[2], Activation::gelu_tanh), p[3], p[4]);
}

void check_mlp(int64_t rows, int64_t width, int64_t hidden, DType dtype, bool fused = false) {
  const double tol = dtype == DType::bf16 ? 3e-2 : 5e-3;
  Tensor x = random_exact_in({rows, width}, -1.0, 1.0, dtype);
  Tensor fc_w = random_exact_in({hidden, width}, -0.2, 0.2, dtype), fc_b = random_exact_in({hidden}, -0.5, 0.5, dtype);
  Tensor proj_w = random_exact_in({width, hidden}, -0.1, 0.1, dtype),
         proj_b = random_exact_in({width}, -0.5, 0.5, dtype);
  Tensor direction = random_exact_in({rows, width}, -1.0, 1.0, dtype);
  std::vector<Tensor> cpu{x, fc_w, fc_b, proj_w, proj_b};
  for (Tensor& t : cpu) t = t.detach().requires_grad_();
  Tensor want = linear(linear(cpu[0], cpu[1], cpu[2], Activation::gelu_tanh), cpu[3], cpu[4]);
  sum(mul(want, direction)).backward();
  std::vector<Tensor> first;  // output and gradients of the first GPU run
  for (int run = 0; run < 2; ++run) {
    std::vector<Tensor> gpu;
    for (const Tensor& t : cpu) gpu.push_back(on_gpu_as(t.detach(), dtype).requires_grad_());
    Tensor got = mlp(gpu, fused);
    sum(mul(to(got, DType::f32), to(on_gpu_as(direction, dtype), DType::f32))).backward();
    std::vector<Tensor> results{on_cpu_f64(got)};
    for (const Tensor& t : gpu) results.push_back(on_cpu_f64(t.grad()));
    if (run == 0) {
      EXPECT_TRUE(testing::all_close(results[0], want, tol, tol)) << "output";
      for (size_t i = 0; i < cpu.size(); ++i) {
        EXPECT_TRUE(testing::all_close(results[i + 1], cpu[i].grad(), 2 * tol, 2 * tol)) << "gradient " << i;
      }
      first = results;
    } else {
      for (size_t i = 0; i < results.size(); ++i) {
        EXPECT_TRUE(testing::all_close(results[i], first[i], 0.0, 0.0)) << "result " << i << " changed";
      }
    }
  }
}

// Runs check(dtype) in bf16 and f16 under each setting: tandem's kernels or cuBLASLt, timed or not.
void for_each_setting(const std::function<void(DType)>& check) {
  for (cuda::GemmKernels kernels : {cuda::GemmKernels::cutlass, cuda::GemmKernels::cublaslt}) {
    for (cuda::MatmulTuning tuning : {cuda::MatmulTuning::all, cuda::MatmulTuning::none}) {
      Setting setting(kernels, tuning);
      for (DType dtype : {DType::bf16, DType::f16}) {
        SCOPED_TRACE(::testing::Message()
                     << (kernels == cuda::GemmKernels::cutlass ? "cutlass" : "cublaslt") << ", "
                     << (tuning == cuda::MatmulTuning::all ? "timed" : "untimed") << ", " << dtype_name(dtype));
        check(dtype);
      }
    }
  }
}

TEST(GemmKernels, EachSettingMatchesTheCpuAndKeepsItsChoice) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_FALSE(are_deterministic_algorithms_enabled());
  int64_t rows = 136;  // a new row count per case: fresh problems
  for_each_setting([&](DType dtype) {
    rows += 8;
    check_mlp(rows, 88, 264, dtype);
  });
}

// gelu_mlp from 4096 rows: the input gradient through GELU runs as one product with GELU's
// backward in its epilogue, on tandem's kernel (`cutlass`) or cuBLASLt's DGELU.
TEST(GemmKernels, GeluMlpAtManyRowsMatchesTheCpuInEachSetting) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_FALSE(are_deterministic_algorithms_enabled());
  int64_t width = 40;  // a new width per case: fresh problems
  for_each_setting([&](DType dtype) {
    width += 8;
    check_mlp(4104, width, 136, dtype, /*fused=*/true);
  });
}

// gelu_mlp from 4096 rows with a hidden width that is a multiple of 256: with tandem's kernels the
// product that makes d pre also sums fc's bias gradient in its epilogue (the same check of every
// gradient against the CPU, and the same bits on a second run).
TEST(GemmKernels, GeluMlpBiasGradientFromTheEpilogueMatchesTheCpuInEachSetting) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_FALSE(are_deterministic_algorithms_enabled());
  int64_t width = 40;  // a new width per case: fresh problems
  for_each_setting([&](DType dtype) {
    width += 8;
    check_mlp(4104, width, 512, dtype, /*fused=*/true);
  });
}

}  // namespace
}  // namespace tandem
