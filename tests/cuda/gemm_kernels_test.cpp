// cuda::set_gemm_kernels (TANDEM_GEMM). With `cutlass`, the bf16/f16 products of linear layers run
// on tandem's sm_90 kernels where those have one (the forward with its bias and GELU epilogues, the
// input and weight gradients), the variant timed (MatmulTuning::all) or not (none); with
// `cublaslt` on cuBLASLt. Either way a two-layer GELU MLP's output and gradients match the CPU in
// f64 on fresh random inputs, and a second run gives the same bits (a problem keeps its choice); so
// does gelu_mlp at 4096 rows and more, whose input gradient through GELU is one product (on tandem's
// kernel, with fc's bias gradient summed in its epilogue where the hidden width allows).
// Likewise linear_add_layer_norm and gelu_mlp_add_layer_norm, whose last product adds the
// residual stream in its epilogue.
// On a GPU other than sm_90, or in a build without CUTLASS, both settings run cuBLASLt. The shapes
// are this file's own, so that no earlier test of the process has already fixed their choices.
#include <functional>

#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/determinism.h"
#include "tandem/core/kernels.h"

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

// Linear layers of widths[0] -> widths[1] -> ... with GELU between them, as linear ops in a row, or
// as gelu_mlp (fused: its input gradients through GELU run as one product with GELU's backward in
// the epilogue where kernels::input_gelu_in_epilogue says so). p: x, then each layer's weight and bias.
Tensor layers(const std::vector<Tensor>& p, bool fused) {
  const size_t count = (p.size() - 1) / 2;
  if (fused) {
    std::vector<Tensor> weights, biases;
    for (size_t i = 0; i < count; ++i) {
      weights.push_back(p[1 + 2 * i]);
      biases.push_back(p[2 + 2 * i]);
    }
    return count == 2 ? gelu_mlp(p[0], p[1], p[2], p[3], p[4]) : gelu_mlp(p[0], weights, biases);
  }
  Tensor h = p[0];
  for (size_t i = 0; i < count; ++i) {
    h = linear(h, p[1 + 2 * i], p[2 + 2 * i], i + 1 < count ? Activation::gelu_tanh : Activation::none);
  }
  return h;
}

// One GPU run's results (the outputs, then the gradients): the first run's against want (the
// outputs within tol, the gradients within grad_tol), each later run's against the first's, bit for
// bit (a problem keeps its choice).
void check_run(int run, const std::vector<Tensor>& results, const std::vector<Tensor>& want, size_t outputs,
               double tol, double grad_tol, std::vector<Tensor>& first) {
  ASSERT_EQ(results.size(), want.size());
  if (run > 0) {
    for (size_t i = 0; i < results.size(); ++i) {
      EXPECT_TRUE(testing::all_close(results[i], first[i], 0.0, 0.0)) << "result " << i << " changed";
    }
    return;
  }
  for (size_t i = 0; i < results.size(); ++i) {
    const double t = i < outputs ? tol : grad_tol;
    EXPECT_TRUE(testing::all_close(results[i], want[i], t, t))
        << (i < outputs ? "output " : "gradient ") << (i < outputs ? i : i - outputs);
  }
  first = results;
}

void check_layers(int64_t rows, const std::vector<int64_t>& widths, DType dtype, bool fused) {
  const double tol = dtype == DType::bf16 ? 3e-2 : 5e-3;
  std::vector<Tensor> cpu{random_exact_in({rows, widths[0]}, -1.0, 1.0, dtype)};  // x, then (W_i, b_i)
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const double scale = i == 0 ? 0.2 : 0.1;
    cpu.push_back(random_exact_in({widths[i + 1], widths[i]}, -scale, scale, dtype));
    cpu.push_back(random_exact_in({widths[i + 1]}, -0.5, 0.5, dtype));
  }
  Tensor direction = random_exact_in({rows, widths.back()}, -1.0, 1.0, dtype);
  for (Tensor& t : cpu) t = t.detach().requires_grad_();
  Tensor want = layers(cpu, /*fused=*/false);
  sum(mul(want, direction)).backward();
  std::vector<Tensor> expected{want};
  for (const Tensor& t : cpu) expected.push_back(t.grad());
  std::vector<Tensor> first;  // output and gradients of the first GPU run
  for (int run = 0; run < 2; ++run) {
    std::vector<Tensor> gpu;
    for (const Tensor& t : cpu) gpu.push_back(on_gpu_as(t.detach(), dtype).requires_grad_());
    Tensor got = layers(gpu, fused);
    sum(mul(to(got, DType::f32), to(on_gpu_as(direction, dtype), DType::f32))).backward();
    std::vector<Tensor> results{on_cpu_f64(got)};
    for (const Tensor& t : gpu) results.push_back(on_cpu_f64(t.grad()));
    check_run(run, results, expected, 1, tol, 2 * tol, first);
  }
}

// The two-layer MLP (width -> hidden -> width), as linear ops or as gelu_mlp.
void check_mlp(int64_t rows, int64_t width, int64_t hidden, DType dtype, bool fused = false) {
  check_layers(rows, {width, hidden, width}, dtype, fused);
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

// A chain of three layers at 1032 rows whose middle layer is 4096 wide: its input gradient through
// GELU sums over 4096, which makes it one product from 1024 rows (as the MLP benchmark's layers),
// with the first layer's bias gradient summed in the epilogue on tandem's kernels (256 wide).
TEST(GemmKernels, GeluMlpChainOverALongSumMatchesTheCpuInEachSetting) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_FALSE(are_deterministic_algorithms_enabled());
  Tensor g = empty({1032, 4096}, TensorOptions(DType::bf16, Device("cuda")));
  EXPECT_TRUE(kernels::input_gelu_in_epilogue(g, empty({4096, 256}, g.options())));
  EXPECT_FALSE(kernels::input_gelu_in_epilogue(narrow(g, 1, 0, 768), empty({768, 256}, g.options())))
      << "a sum over 768 at 1032 rows stays a plain product and GELU's pass";
  int64_t width = 40;  // a new width per case: fresh problems
  for_each_setting([&](DType dtype) {
    width += 8;
    check_layers(1032, {width, 256, 4096, width}, dtype, /*fused=*/true);
  });
}

// linear_add_layer_norm (hidden 0) or gelu_mlp_add_layer_norm (width -> hidden -> width) into a
// residual (rows, width) and the layer norm after it: both outputs and every gradient against the
// CPU in f64 (the sum rounded once), and the same bits on a second run.
void check_residual_norm(int64_t rows, int64_t width, int64_t hidden, DType dtype) {
  const double tol = dtype == DType::bf16 ? 3e-2 : dtype == DType::f16 ? 5e-3 : 2e-3;
  std::vector<Tensor> cpu{random_exact_in({rows, width}, -1.0, 1.0, dtype)};  // x, weights and biases, then
  for (int64_t out : hidden > 0 ? std::vector<int64_t>{hidden, width} : std::vector<int64_t>{width}) {
    const int64_t in = cpu.size() == 1 ? width : hidden;
    cpu.push_back(random_exact_in({out, in}, -0.1, 0.1, dtype));
    cpu.push_back(random_exact_in({out}, -0.5, 0.5, dtype));
  }
  cpu.push_back(random_exact_in({rows, width}, -2.0, 2.0, dtype));  // the residual
  cpu.push_back(random_exact_in({width}, 0.5, 1.5, dtype));         // the norm's weight
  cpu.push_back(random_exact_in({width}, -0.5, 0.5, dtype));        // and bias
  Tensor dir_sum = random_exact_in({rows, width}, -1.0, 1.0, dtype);
  Tensor dir_norm = random_exact_in({rows, width}, -1.0, 1.0, dtype);
  auto run = [&](const std::vector<Tensor>& p) {
    const size_t n = p.size();
    return hidden > 0 ? gelu_mlp_add_layer_norm(p[0], p[1], p[2], p[3], p[4], p[5], {width}, p[6], p[7])
                      : linear_add_layer_norm(p[0], p[1], p[2], p[n - 3], {width}, p[n - 2], p[n - 1]);
  };
  for (Tensor& t : cpu) t = t.detach().requires_grad_();
  auto [want_sum, want_norm] = run(cpu);
  // The GPU rounds the sum once, and normalises the rounded sum.
  Tensor rounded_sum = to(to(want_sum.detach(), dtype), DType::f64);
  add(sum(mul(want_sum, dir_sum)), sum(mul(want_norm, dir_norm))).backward();
  // The sum as the GPU rounds it, its layer norm, and every gradient.
  std::vector<Tensor> expected{rounded_sum,
                               layer_norm(rounded_sum, {width}, cpu[cpu.size() - 2].detach(), cpu.back().detach())};
  for (const Tensor& t : cpu) expected.push_back(t.grad());
  std::vector<Tensor> first;  // outputs and gradients of the first GPU run
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::vector<Tensor> gpu;
    for (const Tensor& t : cpu) gpu.push_back(on_gpu_as(t.detach(), dtype).requires_grad_());
    auto [s, n] = run(gpu);
    add(sum(mul(to(s, DType::f32), to(on_gpu_as(dir_sum, dtype), DType::f32))),
        sum(mul(to(n, DType::f32), to(on_gpu_as(dir_norm, dtype), DType::f32))))
        .backward();
    std::vector<Tensor> results{on_cpu_f64(s), on_cpu_f64(n)};
    for (const Tensor& t : gpu) results.push_back(on_cpu_f64(t.grad()));
    check_run(attempt, results, expected, 2, tol, 4 * tol, first);
  }
}

// The residual add in the product's epilogue (cuBLASLt's C with beta 1, or tandem's sm_90
// bias_residual epilogue), after a linear layer and after the GELU MLP, in each setting; and in f32.
TEST(GemmKernels, ResidualAddInTheEpilogueMatchesTheCpuInEachSetting) {
  TANDEM_REQUIRE_CUDA();
  ASSERT_FALSE(are_deterministic_algorithms_enabled());
  int64_t rows = 512;  // a new row count per case: fresh problems
  for_each_setting([&](DType dtype) {
    rows += 8;
    check_residual_norm(rows, 256, 0, dtype);
    check_residual_norm(rows, 128, 512, dtype);
  });
  SCOPED_TRACE("f32");
  check_residual_norm(72, 96, 0, DType::f32);
  check_residual_norm(72, 96, 160, DType::f32);
}

}  // namespace
}  // namespace tandem
