// A linear layer's bias gradient in one pass over its output's gradient (core/cuda/bias_gradient.cu),
// on fresh random inputs in every floating dtype. Through GELU's backward: d pre has the bits of the
// GPU's unary_backward (the same formula, rounded once), and its column sums match an f64 sum of
// that d pre on the CPU. Without an activation: the gradient's column sums match an f64 sum. Widths
// with and without 16-byte vectors, views one element in (no 16-byte loads), one row, no rows, and
// the same bits run after run, batched or not. Also GELU's derivative itself in f32 across both tails.
#include <cmath>

#include "support/test_util.h"
#include "tandem/core/backend.h"
#include "tandem/core/column_sum_batch.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

Tensor on_cpu_f64(const Tensor& t) { return to(to(t, Device("cpu")), DType::f64); }

// A column sum's error relative to the sum of its terms' magnitudes (up to 1024 terms added in f32,
// or f64 for f64 data), and the relative rounding of the result to the dtype.
double sum_tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-5; }
double rounding(DType dtype) { return dtype == DType::bf16 ? 1.0 / 256 : dtype == DType::f16 ? 1.0 / 2048 : 0.0; }

// A (rows, n) contiguous matrix on the GPU, as a view `start` elements into its buffer.
Tensor random_matrix(int64_t rows, int64_t n, int64_t start, double low, double high, DType dtype) {
  Tensor all = to(to(testing::random_uniform({rows * n + start}, low, high), dtype), Device("cuda"));
  return views::reshape(views::narrow(all, 0, start, rows * n), {rows, n});
}

struct GeluBackwardResult {
  Tensor grad_pre;    // (rows, n)
  Tensor column_sum;  // (n,)
};

GeluBackwardResult run(const Tensor& grad, const Tensor& pre) {
  GeluBackwardResult r{empty(grad.shape(), grad.options()), empty({grad.shape()[1]}, grad.options())};
  cuda::gelu_backward_column_sums(grad, pre, r.grad_pre, r.column_sum);
  return r;
}

// Each column's sum within f32's rounding of its terms' magnitudes, plus the one rounding of the
// sum to the dtype. terms (rows, n) in f64.
void expect_column_sums_close(const Tensor& got, const Tensor& terms, DType dtype) {
  Tensor exact = sum(terms, {0});  // (n,) in f64
  Tensor allowed = add(mul(sum(abs(terms), {0}), sum_tolerance(dtype)), mul(abs(exact), rounding(dtype)));
  Tensor excess = sub(abs(sub(on_cpu_f64(got), exact)), allowed);  // (n,): <= 0 where close
  if (terms.shape()[1] > 0) EXPECT_LE(amax(excess).item<double>(), 0.0) << "column sums";
}

// Runs check(dtype, rows, n, start) for every floating dtype, every (rows, n) of `shapes` and the
// matrix at its buffer's start or one element in (no 16-byte loads), each case named in failures.
template <typename Check>
void for_each_case(const std::vector<std::pair<int64_t, int64_t>>& shapes, Check check) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    for (const auto& [rows, n] : shapes) {
      for (int64_t start : {0, 1}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " (" << rows << ", " << n << ")" << (start ? " unaligned" : ""));
        check(dtype, rows, n, start);
      }
    }
  }
}

TEST(GeluBackwardColumnSums, MatchesTheElementwiseKernelAndAnF64Sum) {
  TANDEM_REQUIRE_CUDA();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1024, 4096}, {1000, 3072}, {77, 44}, {50, 30},
                                                           {33, 7},      {1, 8},       {0, 16}};
  for_each_case(shapes, [](DType dtype, int64_t rows, int64_t n, int64_t start) {
    Tensor grad = random_matrix(rows, n, start, -1.0, 1.0, dtype);
    Tensor pre = random_matrix(rows, n, start, -4.0, 4.0, dtype);
    GeluBackwardResult got = run(grad, pre);
    Tensor expected = kernels::unary_backward(UnaryOp::gelu_tanh, grad, pre);  // (rows, n)
    EXPECT_TRUE(testing::all_close(on_cpu_f64(got.grad_pre), on_cpu_f64(expected), 0, 0)) << "d pre";
    expect_column_sums_close(got.column_sum, on_cpu_f64(got.grad_pre), dtype);
  });
}

// The bias gradient of a layer without an activation: 2304 columns as GPT-2's QKV projection has,
// 1024 as the MLP benchmark's last layer, odd widths, one row, no rows.
TEST(ColumnSums, MatchAnF64Sum) {
  TANDEM_REQUIRE_CUDA();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1024, 2304}, {8192, 1024}, {1000, 3072}, {77, 44},
                                                           {50, 30},     {33, 7},      {1, 8},       {0, 16}};
  for_each_case(shapes, [](DType dtype, int64_t rows, int64_t n, int64_t start) {
    Tensor grad = random_matrix(rows, n, start, -1.0, 1.0, dtype);
    Tensor got = empty({n}, grad.options());
    cuda::column_sums(grad, got);
    expect_column_sums_close(got, on_cpu_f64(grad), dtype);
    if (rows == 0 && n > 0) EXPECT_EQ(amax(abs(on_cpu_f64(got))).item<double>(), 0.0);
  });
}

TEST(ColumnSums, AreReproducible) {
  TANDEM_REQUIRE_CUDA();
  Tensor grad = random_matrix(1024, 2304, 0, -1.0, 1.0, DType::bf16);
  Tensor first = empty({2304}, grad.options());
  cuda::column_sums(grad, first);
  for (int again = 0; again < 3; ++again) {
    Tensor got = empty({2304}, grad.options());
    cuda::column_sums(grad, got);
    EXPECT_TRUE(testing::all_close(on_cpu_f64(got), on_cpu_f64(first), 0, 0));
  }
}

// Sums of several widths finished in one batched launch (core/column_sum_batch.h), where rows of
// 16-byte vectors and rows without them share a table, give the bits of their own launches.
TEST(ColumnSums, BatchedWithOtherWidthsGiveTheBitsOfTheirOwnLaunches) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<Tensor> grads, alone, batched;
    for (int64_t n : {2304, 30, 7, 44, 3072}) {
      grads.push_back(random_matrix(333, n, n % 2, -1.0, 1.0, dtype));
      alone.push_back(empty({n}, grads.back().options()));
      cuda::column_sums(grads.back(), alone.back());
    }
    ColumnSumBatch batch;
    {
      ColumnSumBatchScope scope(&batch);
      for (const Tensor& g : grads) {
        batched.push_back(empty({g.shape()[1]}, g.options()));
        cuda::column_sums(g, batched.back());
      }
    }
    EXPECT_FALSE(batch.empty());
    batch.flush();
    for (size_t i = 0; i < grads.size(); ++i) {
      EXPECT_TRUE(testing::all_close(on_cpu_f64(batched[i]), on_cpu_f64(alone[i]), 0, 0))
          << "width " << grads[i].shape()[1];
    }
  }
}

TEST(GeluBackwardColumnSums, IsReproducible) {
  TANDEM_REQUIRE_CUDA();
  Tensor grad = random_matrix(1024, 3072, 0, -1.0, 1.0, DType::bf16);
  Tensor pre = random_matrix(1024, 3072, 0, -4.0, 4.0, DType::bf16);
  GeluBackwardResult first = run(grad, pre);
  for (int again = 0; again < 3; ++again) {
    GeluBackwardResult r = run(grad, pre);
    EXPECT_TRUE(testing::all_close(on_cpu_f64(r.grad_pre), on_cpu_f64(first.grad_pre), 0, 0));
    EXPECT_TRUE(testing::all_close(on_cpu_f64(r.column_sum), on_cpu_f64(first.column_sum), 0, 0));
  }
}

// The GPU's GELU derivative (through sigmoid(2u), with the fast exponential and reciprocal in f32)
// against the tanh form in f64, over both tails and through 0: within a few f32 ulps of the
// derivative's scale (it is at most ~1.13), finite everywhere, 0 far left and 1 far right.
TEST(GeluTanhGradient, MatchesTheTanhFormAcrossBothTails) {
  TANDEM_REQUIRE_CUDA();
  constexpr double kSqrt2OverPi = 0.7978845608028654, kGeluCubic = 0.044715;
  Tensor x = testing::random_uniform({1 << 16}, -30.0, 30.0);  // f64 (N,)
  x = cat({x, testing::random_uniform({1 << 16}, -4.0, 4.0)}, 0);
  std::vector<double> xs = x.to_vector<double>(), expected(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = static_cast<float>(xs[i]);  // the f32 input the GPU sees
    const double t = std::tanh(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
    expected[i] = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * kSqrt2OverPi * (1 + 3 * kGeluCubic * v * v);
  }
  Tensor got = kernels::unary_backward(UnaryOp::gelu_tanh, ones(x.shape(), TensorOptions(DType::f32, Device("cuda"))),
                                       to(to(x, DType::f32), Device("cuda")));
  std::vector<double> g = got.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(std::isfinite(g[i])) << "x = " << xs[i];
    worst = std::max(worst, std::abs(g[i] - expected[i]));
  }
  EXPECT_LE(worst, 1e-6) << "largest absolute error (8 f32 ulps at 1)";
  Tensor far = to(from_vector(std::vector<float>{-1e4f, -100.0f, 100.0f, 1e4f}, {4}), Device("cuda"));
  std::vector<double> tails =
      kernels::unary_backward(UnaryOp::gelu_tanh, ones({4}, far.options()), far).to_vector<double>();
  EXPECT_EQ(tails, (std::vector<double>{0.0, 0.0, 1.0, 1.0}));
}

}  // namespace
}  // namespace tandem
