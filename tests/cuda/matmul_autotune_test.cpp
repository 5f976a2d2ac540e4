// cuBLASLt's algorithm choice. Timed (cuda::set_matmul_tuning; the candidates include those that
// need no workspace): products whose algorithm was chosen by timing still match the CPU in f64, on
// fresh random inputs, and a problem keeps its choice (the same bits on a second call). The shapes
// are this file's own, so that no earlier test of the process has already fixed their algorithm.
// Each product holds only the workspace its algorithm needs, not a fixed 32 MiB.
#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/determinism.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

using testing::on_cpu_f64;
using testing::on_gpu_as;
using testing::random_exact_in;

// Times every product for one test.
struct AutotuneOn {
  AutotuneOn() { cuda::set_matmul_tuning(cuda::MatmulTuning::all); }
  ~AutotuneOn() { cuda::set_matmul_tuning(before); }
  cuda::MatmulTuning before = cuda::matmul_tuning();
};

TEST(MatmulAutotune, TimedChoicesMatchTheCpuAndStay) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_FALSE(are_deterministic_algorithms_enabled());
  AutotuneOn on;
  for (DType dtype : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const double tol = dtype == DType::bf16 ? 3e-2 : 2e-4;
    // The fused linear products: GELU_AUX_BIAS forward, the weight gradients' and, in 16 bits at
    // 4200 rows, DGELU.
    Tensor x = random_exact_in({2, 2100, 96}, -1.0, 1.0, dtype);
    Tensor fc_w = random_exact_in({352, 96}, -0.2, 0.2, dtype), fc_b = random_exact_in({352}, -0.5, 0.5, dtype);
    Tensor proj_w = random_exact_in({96, 352}, -0.1, 0.1, dtype), proj_b = random_exact_in({96}, -0.5, 0.5, dtype);
    Tensor direction = random_exact_in({2, 2100, 96}, -1.0, 1.0, dtype);
    std::vector<Tensor> cpu{x, fc_w, fc_b, proj_w, proj_b};
    for (Tensor& t : cpu) t = t.detach().requires_grad_();
    sum(mul(linear(linear(cpu[0], cpu[1], cpu[2], Activation::gelu_tanh), cpu[3], cpu[4]), direction)).backward();
    std::vector<Tensor> first;  // output and gradients of the first GPU run
    for (int run = 0; run < 2; ++run) {
      std::vector<Tensor> gpu;
      for (const Tensor& t : cpu) gpu.push_back(on_gpu_as(t.detach(), dtype).requires_grad_());
      Tensor got = gelu_mlp(gpu[0], gpu[1], gpu[2], gpu[3], gpu[4]);
      sum(mul(to(got, DType::f32), to(on_gpu_as(direction, dtype), DType::f32))).backward();
      std::vector<Tensor> results{on_cpu_f64(got)};
      for (const Tensor& t : gpu) results.push_back(on_cpu_f64(t.grad()));
      if (run == 0) {
        EXPECT_TRUE(testing::all_close(
            results[0], on_cpu_f64(linear(linear(x, fc_w, fc_b, Activation::gelu_tanh), proj_w, proj_b)), tol, tol))
            << "output";
        for (size_t i = 0; i < cpu.size(); ++i) {
          EXPECT_TRUE(testing::all_close(results[i + 1], cpu[i].grad(), 2 * tol, 2 * tol)) << "gradient " << i;
        }
        first = results;
      } else {
        for (size_t i = 0; i < results.size(); ++i) {
          EXPECT_TRUE(testing::all_close(results[i], first[i], 0, 0)) << "second call, result " << i;
        }
      }
    }
    // A plain batched product.
    Tensor a = random_exact_in({3, 200, 136}, -1.0, 1.0, dtype), b = random_exact_in({3, 136, 264}, -1.0, 1.0, dtype);
    Tensor want = matmul(a, b);
    Tensor got = on_cpu_f64(matmul(on_gpu_as(a, dtype), on_gpu_as(b, dtype)));
    EXPECT_TRUE(testing::all_close(got, want, tol, tol)) << "matmul";
    EXPECT_TRUE(testing::all_close(on_cpu_f64(matmul(on_gpu_as(a, dtype), on_gpu_as(b, dtype))), got, 0, 0))
        << "matmul again";
  }
}

TEST(MatmulWorkspace, AProductHoldsOnlyTheWorkspaceItsAlgorithmNeeds) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::bf16, DType::f32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor a = on_gpu_as(random_exact_in({2, 192, 136}, -1.0, 1.0, dtype), dtype);  // (2, 192, 136)
    Tensor b = on_gpu_as(random_exact_in({2, 136, 200}, -1.0, 1.0, dtype), dtype);  // (2, 136, 200)
    Tensor x = on_gpu_as(random_exact_in({160, 96}, -1.0, 1.0, dtype), dtype);      // (160, 96)
    Tensor w = on_gpu_as(random_exact_in({120, 96}, -0.2, 0.2, dtype), dtype);      // (120, 96)
    Tensor bias = on_gpu_as(random_exact_in({120}, -0.5, 0.5, dtype), dtype);       // (120,)
    matmul(a, b);  // the first calls ask cuBLASLt; the second only run
    linear(x, w, bias, Activation::gelu_tanh);
    cuda::synchronize();
    const size_t base = cuda::memory_allocated();
    cuda::reset_peak_memory_stats();
    Tensor product = matmul(a, b);
    Tensor layer = linear(x, w, bias, Activation::gelu_tanh);
    cuda::synchronize();
    const size_t outputs = cuda::memory_allocated() - base;  // the results (and GELU's pre-activation)
    // A few bytes for the algorithms that keep a counter there, and none for most; a split-K
    // algorithm's partial sums of these small products would stay well under 1 MiB.
    EXPECT_LT(cuda::max_memory_allocated() - base, outputs + (1u << 20));
  }
}

}  // namespace
}  // namespace tandem
