// The cross-entropy whose forward also writes the gradient (a differentiated scalar loss), on the
// GPU: losses and gradients match the CPU in f64, and the gradient has the same bits as the
// separate backward kernel given the same log-sum-exp. Rows of GPT-2's 50257 classes start
// anywhere within a 16-byte vector; rows too long for shared memory are read twice instead.
#include <cmath>

#include "support/test_util.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

constexpr int64_t kIgnored = -100;

struct Problem {
  int64_t rows, classes;
  DType dtype;
};

Tensor on_gpu(const Tensor& t) { return to(t, Device("cuda")); }
Tensor on_cpu_f64(const Tensor& t) { return to(to(t, Device("cpu")), DType::f64); }

// Targets in [0, classes), about one row in eight ignored; returns how many rows count.
Tensor random_targets(int64_t rows, int64_t classes, int64_t* counted) {
  Generator gen(testing::next_seed());
  std::vector<double> drawn = randint(0, classes, {rows}, DType::i64, &gen).to_double_vector();
  std::vector<double> picks = testing::random_uniform({rows}, 0.0, 1.0).to_double_vector();
  std::vector<int64_t> values(rows);
  *counted = 0;
  for (int64_t i = 0; i < rows; ++i) {
    values[i] = picks[i] < 0.125 ? kIgnored : static_cast<int64_t>(drawn[i]);
    *counted += values[i] != kIgnored;
  }
  return from_vector(values);
}

double tolerance(DType dtype) { return dtype == DType::bf16 ? 1e-2 : dtype == DType::f32 ? 2e-5 : 1e-12; }

TEST(CrossEntropyWithGrad, MatchesTheCpuAndTheSeparateBackward) {
  TANDEM_REQUIRE_CUDA();
  const std::vector<Problem> problems = {
      {64, 50257, DType::bf16},  // GPT-2's head: each row kept in shared memory, starting mid-vector
      {40, 50257, DType::f32},   // 201 KB rows, still kept
      {3, 120001, DType::bf16},  // rows too long to keep: read again from global memory
      {3, 70001, DType::f32},
      {5, 1001, DType::f64},
      {9, 5, DType::bf16},       // rows shorter than a vector
      {16, 37, DType::f32}};
  for (const Problem& p : problems) {
    for (Reduction reduction : {Reduction::mean, Reduction::sum}) {
      SCOPED_TRACE(std::to_string(p.rows) + "x" + std::to_string(p.classes) + " " + dtype_name(p.dtype) +
                   (reduction == Reduction::mean ? " mean" : " sum"));
      const DType stat = p.dtype == DType::f64 ? DType::f64 : DType::f32;
      CrossEntropyOptions options;
      options.reduction = reduction;
      options.label_smoothing = reduction == Reduction::mean ? 0.1 : 0.0;
      int64_t counted = 0;
      Tensor target = random_targets(p.rows, p.classes, &counted);
      Tensor logits = to(testing::random_uniform({p.rows, p.classes}, -4.0, 4.0), p.dtype);

      Tensor cpu = to(logits, DType::f64).detach().requires_grad_();
      Tensor cpu_loss = cross_entropy(cpu, target, options);
      cpu_loss.backward();

      Tensor gpu = on_gpu(logits).detach().requires_grad_();
      Tensor gpu_target = on_gpu(target);
      Tensor loss = cross_entropy(gpu, gpu_target, options);
      loss.backward();
      Tensor grad = gpu.grad();
      const double tol = tolerance(p.dtype);
      EXPECT_TRUE(testing::all_close(on_cpu_f64(loss), cpu_loss, tol, tol)) << "loss";
      EXPECT_TRUE(testing::all_close(on_cpu_f64(grad), cpu.grad(), tol, tol * 1e-3)) << "gradient";

      // The separate kernels, given the forward-only kernel's lse and row weights 1 / count,
      // write the same bits.
      kernels::CrossEntropyForward forward =
          kernels::cross_entropy_forward(gpu.detach(), gpu_target, kIgnored, options.label_smoothing);
      const double weight = reduction == Reduction::mean
                                ? (stat == DType::f32 ? static_cast<double>(1.0f / static_cast<float>(counted))
                                                      : 1.0 / static_cast<double>(counted))
                                : 1.0;
      Tensor row_grad = full({p.rows}, weight, TensorOptions(stat, Device("cuda")));
      Tensor separate = kernels::cross_entropy_backward(gpu.detach(), gpu_target, forward.lse, row_grad, kIgnored,
                                                        options.label_smoothing);
      EXPECT_TRUE(testing::all_close(on_cpu_f64(grad), on_cpu_f64(separate), 0, 0)) << "separate backward";
      // Without a gradient to prepare, the forward-only kernel gives the loss the same bits.
      {
        NoGradGuard no_grad;
        EXPECT_TRUE(testing::all_close(on_cpu_f64(cross_entropy(gpu, gpu_target, options)), on_cpu_f64(loss), 0, 0))
            << "loss without grad";
      }

      // An upstream gradient of 2.5: the saved gradient scaled once (in place), the same bits
      // as scaling it in the statistics dtype; with retain_graph, twice the same result.
      Tensor expected = to(mul(to(grad, stat), 2.5), p.dtype);
      gpu.set_grad(Tensor());
      Tensor scaled_loss = mul(cross_entropy(gpu, gpu_target, options), 2.5);
      scaled_loss.backward(Tensor(), /*retain_graph=*/true);
      EXPECT_TRUE(testing::all_close(on_cpu_f64(gpu.grad()), on_cpu_f64(expected), 0, 0)) << "scaled, retained";
      gpu.set_grad(Tensor());
      scaled_loss.backward();
      EXPECT_TRUE(testing::all_close(on_cpu_f64(gpu.grad()), on_cpu_f64(expected), 0, 0)) << "scaled, again";
    }
  }
}

// Half precision keeps the separate backward: f16 cannot hold (softmax - y) / N before a loss
// scale multiplies it. With a scale of 2^16 over 4096 rows, every gradient of at least 1e-3 (in
// the scaled units) keeps f16's relative precision instead of flushing towards zero.
TEST(CrossEntropyWithGrad, HalfKeepsTheScaledSeparateBackward) {
  TANDEM_REQUIRE_CUDA();
  const int64_t rows = 4096, classes = 1000;
  int64_t counted = 0;
  Tensor target = random_targets(rows, classes, &counted);
  Tensor logits = to(testing::random_uniform({rows, classes}, -4.0, 4.0), DType::f16);
  Tensor cpu = to(logits, DType::f64).detach().requires_grad_();
  mul(cross_entropy(cpu, target), 65536.0).backward();
  Tensor gpu = on_gpu(logits).detach().requires_grad_();
  mul(cross_entropy(gpu, on_gpu(target)), 65536.0).backward();
  std::vector<double> got = on_cpu_f64(gpu.grad()).to_double_vector(), want = cpu.grad().to_double_vector();
  double worst = 0.0;  // largest relative error over gradients of at least 1e-3
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(want[i]) >= 1e-3) worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  }
  EXPECT_LE(worst, 1e-3);
}

}  // namespace
}  // namespace tandem
