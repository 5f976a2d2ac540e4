// Layer norm as one fused op: finite-difference gradient checks on fresh random f64 inputs (with
// and without weight and bias, over one and two normalised dims), and its forward against the
// formula composed from elementwise ops and reductions.
#include "gradcheck_util.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;

// (x - mean) / sqrt(var + eps) * weight + bias over the last normalized_shape.size() dims.
Tensor composed_layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                           double eps) {
  std::vector<int64_t> dims;
  for (int64_t d = x.dim() - static_cast<int64_t>(normalized_shape.size()); d < x.dim(); ++d) dims.push_back(d);
  Tensor centered = sub(x, mean(x, dims, true));
  Tensor y = mul(centered, rsqrt(add(mean(mul(centered, centered), dims, true), eps)));
  if (weight.defined()) y = mul(y, weight);
  if (bias.defined()) y = add(y, bias);
  return y;
}

// A leaf away from zero, so no test can pass on zeros.
Tensor nonzero_leaf(const Shape& shape) {
  Tensor u = testing::random_uniform(shape, 0.5, 1.5);
  Tensor sign = testing::random_uniform(shape, -1.0, 1.0);
  return mul(u, where(lt(sign, 0.0), full_like(u, -1.0), full_like(u, 1.0))).detach().requires_grad_();
}

TEST(GradcheckLayerNorm, WeightAndBias) {
  auto x = random_leaf({3, 4, 7}), w = nonzero_leaf({7}), b = random_leaf({7});
  EXPECT_GRADCHECK([](const Inputs& v) { return layer_norm(v[0], {7}, v[1], v[2], 1e-5); }, (Inputs{x, w, b}));
}

TEST(GradcheckLayerNorm, WithoutWeightOrBias) {
  auto x = random_leaf({5, 6}), w = nonzero_leaf({6}), b = random_leaf({6});
  EXPECT_GRADCHECK([](const Inputs& v) { return layer_norm(v[0], {6}, Tensor(), Tensor(), 1e-5); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return layer_norm(v[0], {6}, v[1], Tensor(), 1e-5); }, (Inputs{x, w}));
  EXPECT_GRADCHECK([](const Inputs& v) { return layer_norm(v[0], {6}, Tensor(), v[1], 1e-5); }, (Inputs{x, b}));
}

TEST(GradcheckLayerNorm, TwoNormalisedDimsAndANonContiguousInput) {
  auto x = random_leaf({2, 3, 4, 5}), w = nonzero_leaf({4, 5}), b = random_leaf({4, 5});
  EXPECT_GRADCHECK([](const Inputs& v) { return layer_norm(v[0], {4, 5}, v[1], v[2], 1e-5); }, (Inputs{x, w, b}));
  auto xt = testing::random_transposed_leaf({4, 6});
  EXPECT_GRADCHECK([](const Inputs& v) { return layer_norm(v[0], {6}, v[1], v[2], 1e-5); },
                   (Inputs{xt, nonzero_leaf({6}), random_leaf({6})}));
}

// x used again after the layer norm (as the residual stream is): the engine hands the later use's
// gradient to layer norm's backward, which adds it in its own kernel.
TEST(GradcheckLayerNorm, FoldsTheGradientOfASecondUse) {
  auto x = random_leaf({3, 4, 7}), w = nonzero_leaf({7}), b = random_leaf({7});
  EXPECT_GRADCHECK(
      [](const Inputs& v) {
        Tensor normed = layer_norm(v[0], {7}, v[1], v[2], 1e-5);
        return add(normed, mul(v[0], v[0]));
      },
      (Inputs{x, w, b}));
  EXPECT_GRADCHECK(
      [](const Inputs& v) {
        auto [sum, normed] = add_layer_norm(v[0], v[1], {7}, v[2], Tensor(), 1e-5);
        return add(mul(normed, 2.0), mul(sum, sum));
      },
      (Inputs{x, random_leaf({3, 4, 7}), w}));
}

TEST(LayerNorm, ForwardMatchesTheComposedFormula) {
  for (DType dtype : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = testing::random_uniform({6, 3, 10}, -3.0, 3.0, dtype);
    Tensor w = testing::random_uniform({3, 10}, 0.5, 1.5, dtype),
           b = testing::random_uniform({3, 10}, -1.0, 1.0, dtype);
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
    EXPECT_TRUE(
        testing::all_close(layer_norm(x, {3, 10}, w, b, 1e-5), composed_layer_norm(x, {3, 10}, w, b, 1e-5), tol, tol));
    EXPECT_TRUE(testing::all_close(layer_norm(x, {10}, Tensor(), Tensor(), 1e-3),
                                   composed_layer_norm(x, {10}, Tensor(), Tensor(), 1e-3), tol, tol));
  }
}

TEST(LayerNorm, HalfTypesMatchTheF64Result) {
  Tensor x = testing::random_uniform({9, 100}, -2.0, 2.0);
  Tensor w = testing::random_uniform({100}, 0.5, 1.5), b = testing::random_uniform({100}, -1.0, 1.0);
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Inputs rounded to the half type first, so both sides see the same numbers.
    Tensor xh = to(x, dtype), wh = to(w, dtype), bh = to(b, dtype);
    Tensor expected = layer_norm(to(xh, DType::f64), {100}, to(wh, DType::f64), to(bh, DType::f64), 1e-5);
    const double tol = dtype == DType::bf16 ? 1.6e-2 : 2e-3;
    EXPECT_TRUE(testing::all_close(to(layer_norm(xh, {100}, wh, bh, 1e-5), DType::f64), expected, tol, tol));
  }
}

TEST(LayerNorm, KernelReturnsTheRowStatistics) {
  Tensor x = testing::random_uniform({4, 2, 33}, -2.0, 2.0, DType::f32);
  kernels::LayerNormForward f = kernels::layer_norm_forward(x, Tensor(), Tensor(), 1e-5);
  ASSERT_EQ(f.mean.shape(), (Shape{8}));
  EXPECT_EQ(f.mean.dtype(), DType::f32);
  Tensor rows = reshape(to(x, DType::f64), {8, 33});
  EXPECT_TRUE(testing::all_close(to(f.mean, DType::f64), mean(rows, {1}), 1e-6, 1e-6));
  Tensor var = mean(mul(sub(rows, mean(rows, {1}, true)), sub(rows, mean(rows, {1}, true))), {1});
  EXPECT_TRUE(testing::all_close(to(f.rstd, DType::f64), rsqrt(add(var, 1e-5)), 1e-5, 1e-6));
}

TEST(LayerNorm, BadShapesSayWhatWasExpected) {
  Tensor x = testing::random_tensor({3, 4});
  EXPECT_TRUE(
      testing::throws_with<ValueError>([&] { layer_norm(x, {5}, Tensor(), Tensor()); }, {"normalized_shape", "[5]"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { layer_norm(x, {4}, testing::random_tensor({3}), Tensor()); },
                                               {"weight", "[4]", "[3]"}));
  EXPECT_TRUE(testing::throws_with<TypeError>(
      [&] { kernels::layer_norm_forward(x, to(testing::random_tensor({4}), DType::f32), Tensor(), 1e-5); },
      {"weight", "f64", "f32"}));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// add_layer_norm returns the sum and its layer norm; both feed the loss, as in a transformer
// block, so the sum's gradient is its own plus what comes back through the norm.
TEST(GradcheckAddLayerNorm, BothOutputsCarryGradients) {
  using testing::Inputs;
  auto x = nonzero_leaf({3, 2, 5}), residual = nonzero_leaf({3, 2, 5});
  auto w = nonzero_leaf({5}), b = nonzero_leaf({5});
  Tensor a = testing::random_tensor({3, 2, 5}), c = testing::random_tensor({3, 2, 5});
  EXPECT_GRADCHECK(
      [a, c](const Inputs& v) {
        auto [s, n] = add_layer_norm(v[0], v[1], {5}, v[2], v[3], 1e-5);
        return add(sum(mul(n, a)), sum(mul(s, c)));
      },
      (Inputs{x, residual, w, b}));
  // Without weight and bias, over two normalised dims.
  EXPECT_GRADCHECK(
      [a, c](const Inputs& v) {
        auto [s, n] = add_layer_norm(v[0], v[1], {2, 5}, Tensor(), Tensor(), 1e-5);
        return add(sum(mul(n, a)), sum(mul(s, c)));
      },
      (Inputs{x, residual}));
}

// With the residual bias of the linear layer before it (added into the sum): the bias's gradient,
// the sum's gradient summed over rows, comes from layer norm's backward when the norm reaches the
// loss, and from the add's node when only the sum does.
TEST(GradcheckAddLayerNorm, ResidualBias) {
  using testing::Inputs;
  auto x = nonzero_leaf({3, 2, 5}), residual = nonzero_leaf({3, 2, 5});
  auto w = nonzero_leaf({5}), b = nonzero_leaf({5}), rb = nonzero_leaf({5});
  Tensor a = testing::random_tensor({3, 2, 5}), c = testing::random_tensor({3, 2, 5});
  EXPECT_GRADCHECK(
      [a, c](const Inputs& v) {
        auto [s, n] = add_layer_norm(v[0], v[1], {5}, v[2], v[3], 1e-5, v[4]);
        return add(sum(mul(n, a)), sum(mul(s, c)));
      },
      (Inputs{x, residual, w, b, rb}));
  EXPECT_GRADCHECK(
      [a](const Inputs& v) { return sum(mul(add_layer_norm(v[0], v[1], {5}, v[2], v[3], 1e-5, v[4]).second, a)); },
      (Inputs{x, residual, w, b, rb}));
  EXPECT_GRADCHECK(
      [c, w = w.detach(), b = b.detach()](const Inputs& v) {
        return sum(mul(add_layer_norm(v[0], v[1], {5}, w, b, 1e-5, v[2]).first, c));
      },
      (Inputs{x, residual, rb}));
  // Two normalised dims, no weight or bias.
  auto rb2 = nonzero_leaf({2, 5});
  EXPECT_GRADCHECK(
      [a, c](const Inputs& v) {
        auto [s, n] = add_layer_norm(v[0], v[1], {2, 5}, Tensor(), Tensor(), 1e-5, v[2]);
        return add(sum(mul(n, a)), sum(mul(s, c)));
      },
      (Inputs{x, residual, rb2}));
  // A second backward through the retained graph gives the same gradient again.
  for (const Tensor& t : {x, residual, w, b, rb}) t.set_grad(Tensor());
  auto [s, n] = add_layer_norm(x, residual, {5}, w, b, 1e-5, rb);
  Tensor loss = add(sum(mul(n, a)), sum(mul(s, c)));
  loss.backward(Tensor(), /*retain_graph=*/true);
  Tensor first = rb.grad().clone();
  rb.set_grad(Tensor());
  loss.backward();
  EXPECT_TRUE(testing::all_close(rb.grad(), first, 0.0, 0.0));
}

TEST(AddLayerNorm, ResidualBiasEqualsTheAddsThenLayerNorm) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = to(testing::random_tensor({4, 7}), dtype), residual = to(testing::random_tensor({4, 7}), dtype);
    Tensor w = to(testing::random_tensor({7}), dtype), b = to(testing::random_tensor({7}), dtype);
    Tensor rb = to(testing::random_tensor({7}), dtype);
    auto [s, n] = add_layer_norm(x, residual, {7}, w, b, 1e-5, rb);
    Tensor expected_sum = add(x, add(residual, rb));
    EXPECT_TRUE(testing::all_close(s, expected_sum, 0.0, 0.0));
    EXPECT_TRUE(testing::all_close(n, layer_norm(expected_sum, {7}, w, b, 1e-5), 0.0, 0.0));
  }
  Tensor x = testing::random_tensor({4, 7});
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] { add_layer_norm(x, x, {7}, Tensor(), Tensor(), 1e-5, testing::random_tensor({6})); },
      {"add_layer_norm", "residual_bias", "[7]", "[6]"}));
}

TEST(LayerNorm, BackwardSumsTheInputGradientPerColumn) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor x = to(testing::random_uniform({9, 12}, -2.0, 2.0), dtype);
    Tensor g = to(testing::random_uniform({9, 12}, -1.0, 1.0), dtype);
    Tensor pending = to(testing::random_uniform({9, 12}, -1.0, 1.0), dtype);
    Tensor w = to(testing::random_uniform({12}, 0.5, 1.5), dtype);
    kernels::LayerNormForward f = kernels::layer_norm_forward(x, w, Tensor(), 1e-5);
    kernels::LayerNormGrads plain = kernels::layer_norm_backward(g, x, w, f.mean, f.rstd, true, pending);
    kernels::LayerNormGrads summed = kernels::layer_norm_backward(g, x, w, f.mean, f.rstd, true, pending, true);
    EXPECT_FALSE(plain.x_column_sum.defined());
    EXPECT_TRUE(testing::all_close(summed.x, plain.x, 0.0, 0.0));
    EXPECT_TRUE(testing::all_close(summed.weight, plain.weight, 0.0, 0.0));
    const double tol = dtype == DType::bf16 ? 1e-2 : dtype == DType::f32 ? 1e-6 : 1e-12;
    EXPECT_TRUE(testing::all_close(to(summed.x_column_sum, DType::f64), sum(to(summed.x, DType::f64), {0}), tol, tol));
  }
}

TEST(AddLayerNorm, EqualsAddThenLayerNorm) {
  Tensor x = testing::random_tensor({4, 7}), residual = testing::random_tensor({4, 7});
  Tensor w = testing::random_tensor({7}), b = testing::random_tensor({7});
  auto [s, n] = add_layer_norm(x, residual, {7}, w, b, 1e-5);
  Tensor expected_sum = add(x, residual);
  EXPECT_TRUE(testing::all_close(s, expected_sum, 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(n, layer_norm(expected_sum, {7}, w, b, 1e-5), 0.0, 0.0));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { add_layer_norm(x, testing::random_tensor({4, 6}), {7}, w, b); },
                                               {"add_layer_norm", "residual", "[4, 6]"}));
}

}  // namespace
}  // namespace tandem
