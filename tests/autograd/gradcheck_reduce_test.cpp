// Finite-difference gradient checks of the reductions, softmax, cross-entropy and the squared-error
// loss, on fresh random f64 inputs, contiguous and not.
#include <cmath>
#include <functional>
#include <string>

#include "gradcheck_util.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;
using testing::random_transposed_leaf;

struct DimsCase {
  std::vector<int64_t> dims;
  bool keepdim;
};

std::string describe(const DimsCase& c) {
  std::string s = "dims {";
  for (size_t i = 0; i < c.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(c.dims[i]);
  return s + "}, keepdim " + (c.keepdim ? "true" : "false");
}

// For (2, 3, 4) inputs: one dim, adjacent dims, non-adjacent dims, all (explicit and empty), negative.
const std::vector<DimsCase> kDimsCases = {
    {{1}, false}, {{1}, true},        {{0, 1}, false}, {{1, 2}, true}, {{0, 2}, false},   {{0, 2}, true},  {{}, false},
    {{}, true},   {{0, 1, 2}, false}, {{-1}, false},   {{-1}, true},   {{-3, -1}, false}, {{2, -3}, true},
};

// A (2, 3, 4) leaf laid out as (3, 4, 2) in memory: every dim is strided.
Tensor permuted_leaf() {
  Tensor base = testing::random_tensor({3, 4, 2});
  Tensor x = views::permute(base, {2, 0, 1});
  x.requires_grad_();
  return x;
}

// Values that are pairwise at least 0.2 apart, in random order: amax/max have no ties to straddle.
Tensor distinct_values(const Shape& shape) {
  int64_t n = shape_numel(shape);
  Generator gen(testing::next_seed());
  Tensor ranks = to(randperm(n, &gen), DType::f64);
  Tensor jitter = testing::random_uniform({n}, 0.0, 0.1);
  return reshape(add(mul(ranks, 0.3), jitter), shape).detach();
}

Tensor distinct_leaf(const Shape& shape) { return distinct_values(shape).requires_grad_(); }

// The same distinct values as a (2, 3, 4) leaf whose last two dims are swapped in memory.
Tensor distinct_transposed_leaf() {
  Tensor base = distinct_values({2, 4, 3});
  Tensor x = views::transpose(base, -1, -2);
  x.requires_grad_();
  return x;
}

Tensor int_targets(const std::vector<int64_t>& values) { return from_vector(values); }

// Random class indices in [0, classes), with exactly the `ignored` rows set to ignore_index: when
// ignore_index is a class the other rows skip it, so a mean never runs over zero rows.
Tensor random_targets(int64_t n, int64_t classes, const std::vector<int64_t>& ignored = {},
                      int64_t ignore_index = -100) {
  bool class_ignored = ignore_index >= 0 && ignore_index < classes;
  Generator gen(testing::next_seed());
  std::vector<int64_t> values;
  for (double d : randint(0, class_ignored ? classes - 1 : classes, {n}, DType::i64, &gen).to_double_vector()) {
    auto v = static_cast<int64_t>(d);
    values.push_back(class_ignored && v >= ignore_index ? v + 1 : v);
  }
  for (int64_t row : ignored) values[row] = ignore_index;
  return int_targets(values);
}

TEST(GradcheckReduce, Sum) {
  for (const Tensor& x : {random_leaf({2, 3, 4}), random_transposed_leaf({2, 3, 4}), permuted_leaf()}) {
    for (const DimsCase& c : kDimsCases) {
      SCOPED_TRACE(describe(c) + (x.is_contiguous() ? "" : ", non-contiguous"));
      EXPECT_GRADCHECK([c](const Inputs& v) { return sum(v[0], c.dims, c.keepdim); }, (Inputs{x}));
    }
  }
}

TEST(GradcheckReduce, Mean) {
  for (const Tensor& x : {random_leaf({2, 3, 4}), random_transposed_leaf({2, 3, 4}), permuted_leaf()}) {
    for (const DimsCase& c : kDimsCases) {
      SCOPED_TRACE(describe(c) + (x.is_contiguous() ? "" : ", non-contiguous"));
      EXPECT_GRADCHECK([c](const Inputs& v) { return mean(v[0], c.dims, c.keepdim); }, (Inputs{x}));
    }
  }
}

TEST(GradcheckReduce, SumOfOneDimAndZeroDimTensors) {
  auto v = random_leaf({5});
  EXPECT_GRADCHECK([](const Inputs& x) { return sum(x[0]); }, (Inputs{v}));
  EXPECT_GRADCHECK([](const Inputs& x) { return mean(x[0], {0}, true); }, (Inputs{v}));
  auto s = random_leaf({});
  EXPECT_GRADCHECK([](const Inputs& x) { return sum(x[0]); }, (Inputs{s}));
  EXPECT_GRADCHECK([](const Inputs& x) { return mean(x[0], {-1}); }, (Inputs{s}));
}

TEST(GradcheckReduce, AmaxAmin) {
  for (const Tensor& x : {distinct_leaf({2, 3, 4}), distinct_transposed_leaf()}) {
    for (const DimsCase& c : kDimsCases) {
      SCOPED_TRACE(describe(c) + (x.is_contiguous() ? "" : ", non-contiguous"));
      EXPECT_GRADCHECK([c](const Inputs& v) { return amax(v[0], c.dims, c.keepdim); }, (Inputs{x}));
      EXPECT_GRADCHECK([c](const Inputs& v) { return amin(v[0], c.dims, c.keepdim); }, (Inputs{x}));
    }
  }
}

TEST(GradcheckReduce, AmaxSharesTheGradientAmongTies) {
  // Not a finite-difference case (a tie is a kink): the documented even split, checked directly.
  Tensor x = from_vector(std::vector<double>{1.0, 3.0, 3.0, -2.0, -2.0, -2.0}, {2, 3}, DType::f64).requires_grad_();
  amax(x, {1}).backward(from_vector(std::vector<double>{2.0, 3.0}, {}, DType::f64));
  EXPECT_TRUE(testing::all_close(x.grad(), {0.0, 1.0, 1.0, 1.0, 1.0, 1.0}));
  x.set_grad(Tensor());
  amin(x).backward();
  EXPECT_TRUE(testing::all_close(x.grad(), {0.0, 0.0, 0.0, 1.0 / 3, 1.0 / 3, 1.0 / 3}));
}

TEST(GradcheckReduce, MaxMinAlongADim) {
  for (const Tensor& x : {distinct_leaf({2, 3, 4}), distinct_transposed_leaf()}) {
    for (int64_t dim : {0, 1, 2, -1, -2}) {
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE("dim " + std::to_string(dim) + ", keepdim " + std::to_string(keepdim) +
                     (x.is_contiguous() ? "" : ", non-contiguous"));
        EXPECT_GRADCHECK([dim, keepdim](const Inputs& v) { return max(v[0], dim, keepdim).values; }, (Inputs{x}));
        EXPECT_GRADCHECK([dim, keepdim](const Inputs& v) { return min(v[0], dim, keepdim).values; }, (Inputs{x}));
      }
    }
  }
}

TEST(GradcheckReduce, MaxValuesMatchTheirIndices) {
  Tensor x = distinct_transposed_leaf();
  ValuesIndices r = max(x, 1);
  ASSERT_EQ(r.values.shape(), (Shape{2, 4}));
  ASSERT_EQ(r.indices.dtype(), DType::i64);
  EXPECT_TRUE(testing::all_close(r.values, amax(x, {1})));
  EXPECT_TRUE(testing::all_close(r.values, squeeze(gather(x, 1, unsqueeze(r.indices, 1)), 1)));
  ValuesIndices m = min(x, -1, true);
  ASSERT_EQ(m.values.shape(), (Shape{2, 3, 1}));
  EXPECT_TRUE(testing::all_close(m.values, amin(x, {-1}, true)));
  EXPECT_TRUE(testing::all_close(m.values, gather(x, -1, m.indices)));
}

TEST(GradcheckReduce, Var) {
  const std::vector<DimsCase> cases = {{{1}, false}, {{2}, true}, {{0, 2}, false}, {{}, false}, {{-1, -2}, true}};
  for (const Tensor& x : {random_leaf({2, 3, 4}), random_transposed_leaf({2, 3, 4})}) {
    for (int64_t correction : {0, 1}) {
      for (const DimsCase& c : cases) {
        SCOPED_TRACE(describe(c) + ", correction " + std::to_string(correction) +
                     (x.is_contiguous() ? "" : ", non-contiguous"));
        EXPECT_GRADCHECK([c, correction](const Inputs& v) { return var(v[0], c.dims, correction, c.keepdim); },
                         (Inputs{x}));
      }
    }
  }
}

TEST(GradcheckReduce, SoftmaxAndLogSoftmaxAlongEveryDim) {
  for (const Tensor& x : {random_leaf({2, 3, 4}), random_transposed_leaf({2, 3, 4}), permuted_leaf()}) {
    for (int64_t dim : {0, 1, 2, -1, -3}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + (x.is_contiguous() ? "" : ", non-contiguous"));
      EXPECT_GRADCHECK([dim](const Inputs& v) { return softmax(v[0], dim); }, (Inputs{x}));
      EXPECT_GRADCHECK([dim](const Inputs& v) { return log_softmax(v[0], dim); }, (Inputs{x}));
    }
  }
}

TEST(GradcheckReduce, SoftmaxOfLargeLogits) {
  // Shifted by +50: the max subtraction keeps exp from overflowing and the gradient exact.
  Tensor x = add(testing::random_tensor({3, 4}), 50.0).detach().requires_grad_();
  EXPECT_GRADCHECK([](const Inputs& v) { return softmax(v[0], 1); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return log_softmax(v[0], 0); }, (Inputs{x}));
}

TEST(GradcheckReduce, CrossEntropyReductions) {
  for (const Tensor& logits : {random_leaf({5, 4}), random_transposed_leaf({5, 4})}) {
    Tensor target = random_targets(5, 4);
    for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
      SCOPED_TRACE("reduction " + std::to_string(static_cast<int>(reduction)) +
                   (logits.is_contiguous() ? "" : ", non-contiguous"));
      CrossEntropyOptions options;
      options.reduction = reduction;
      EXPECT_GRADCHECK([target, options](const Inputs& v) { return cross_entropy(v[0], target, options); },
                       (Inputs{logits}));
    }
  }
}

TEST(GradcheckReduce, CrossEntropyIgnoresRows) {
  for (const Tensor& logits : {random_leaf({6, 3}), random_transposed_leaf({6, 3})}) {
    for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
      SCOPED_TRACE("reduction " + std::to_string(static_cast<int>(reduction)) +
                   (logits.is_contiguous() ? "" : ", non-contiguous"));
      CrossEntropyOptions options;
      options.reduction = reduction;
      Tensor target = random_targets(6, 3, {1, 4});
      EXPECT_GRADCHECK([target, options](const Inputs& v) { return cross_entropy(v[0], target, options); },
                       (Inputs{logits}));
      // A custom ignore_index that is also a valid class.
      options.ignore_index = 2;
      Tensor custom = random_targets(6, 3, {0, 5}, 2);
      EXPECT_GRADCHECK([custom, options](const Inputs& v) { return cross_entropy(v[0], custom, options); },
                       (Inputs{logits}));
    }
  }
}

TEST(GradcheckReduce, CrossEntropyIgnoredRowsAddNothing) {
  Tensor logits = random_leaf({4, 3});
  Tensor target = int_targets({0, -100, 2, -100});
  Tensor loss = cross_entropy(logits, target);
  // The mean runs over the two rows that count.
  Tensor kept = index_select(logits, 0, int_targets({0, 2}));
  EXPECT_TRUE(testing::all_close(loss, cross_entropy(kept, int_targets({0, 2}))));
  loss.backward();
  std::vector<double> g = logits.grad().to_double_vector();
  for (int64_t j = 0; j < 3; ++j) {
    EXPECT_EQ(g[3 + j], 0.0);
    EXPECT_EQ(g[9 + j], 0.0);
  }
}

TEST(GradcheckReduce, CrossEntropyLabelSmoothing) {
  for (const Tensor& logits : {random_leaf({5, 4}), random_transposed_leaf({5, 4})}) {
    for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
      for (double smoothing : {0.1, 0.35, 1.0}) {
        SCOPED_TRACE("reduction " + std::to_string(static_cast<int>(reduction)) + ", smoothing " +
                     std::to_string(smoothing) + (logits.is_contiguous() ? "" : ", non-contiguous"));
        CrossEntropyOptions options;
        options.reduction = reduction;
        options.label_smoothing = smoothing;
        Tensor target = random_targets(5, 4, {3});
        EXPECT_GRADCHECK([target, options](const Inputs& v) { return cross_entropy(v[0], target, options); },
                         (Inputs{logits}));
      }
    }
  }
}

TEST(GradcheckReduce, CrossEntropyLabelSmoothingValue) {
  // -sum_j y_j log p_j with y = (1 - eps) one_hot + eps / C, written out with log_softmax.
  Tensor logits = random_leaf({3, 4});
  Tensor target = int_targets({1, 3, 0});
  CrossEntropyOptions options;
  options.label_smoothing = 0.2;
  options.reduction = Reduction::none;
  Tensor lp = log_softmax(logits, 1);
  Tensor nll = neg(squeeze(gather(lp, 1, unsqueeze(target, 1)), 1));
  Tensor uniform_term = neg(mean(lp, {1}));
  Tensor expected = add(mul(nll, 0.8), mul(uniform_term, 0.2));
  EXPECT_TRUE(testing::all_close(cross_entropy(logits, target, options), expected, 1e-12, 1e-12));
}

TEST(GradcheckReduce, CrossEntropyWithI32Targets) {
  Tensor logits = random_leaf({4, 5});
  Tensor target = to(random_targets(4, 5, {2}), DType::i32);
  EXPECT_GRADCHECK([target](const Inputs& v) { return cross_entropy(v[0], target); }, (Inputs{logits}));
}

// For a loss whose forward wrote its gradient for an upstream gradient of 1 (`unit`, of `leaf`):
// the loss times 2.5 gives 2.5 * unit, and a retained graph gives the same again (the saved
// gradient was not scaled in place). Returns that scaled loss; leaves leaf's gradient unset.
Tensor expect_scaled_gradient_survives_retain_graph(const std::function<Tensor()>& loss_of, Tensor leaf,
                                                     const Tensor& unit) {
  leaf.set_grad(Tensor());
  Tensor loss = mul(loss_of(), 2.5);
  loss.backward(Tensor(), /*retain_graph=*/true);
  Tensor first = leaf.grad();
  EXPECT_TRUE(testing::all_close(first, mul(unit, 2.5), 1e-15, 0));
  leaf.set_grad(Tensor());
  loss.backward();  // the same graph again
  EXPECT_TRUE(testing::all_close(leaf.grad(), first, 0, 0));
  leaf.set_grad(Tensor());
  return loss;
}

// A scalar loss gets its gradient from the forward's pass (for an upstream gradient of 1): the
// backward scales it by the upstream gradient, in place only when the graph is released.
TEST(GradcheckReduce, CrossEntropyGradientScalesAndSurvivesRetainGraph) {
  for (Reduction reduction : {Reduction::mean, Reduction::sum}) {
    SCOPED_TRACE(reduction == Reduction::mean ? "mean" : "sum");
    CrossEntropyOptions options;
    options.reduction = reduction;
    options.label_smoothing = 0.1;
    Tensor logits = random_leaf({6, 5});
    Tensor target = random_targets(6, 5, {2});
    cross_entropy(logits, target, options).backward();
    Tensor loss = expect_scaled_gradient_survives_retain_graph(
        [&] { return cross_entropy(logits, target, options); }, logits, logits.grad());
    {
      NoGradGuard no_grad;  // no gradient to prepare: the forward alone, the same loss
      EXPECT_TRUE(testing::all_close(cross_entropy(logits, target, options), loss / 2.5, 1e-15, 0));
    }
  }
}

// backward()'s implied 1 reaches the loss's own node, which hands its gradient on unscaled when the
// graph is released; with retain_graph, and for an explicit gradient of ones, the same bits.
TEST(GradcheckReduce, LossGradientsOfAnImpliedOneMatchAnExplicitOne) {
  Tensor logits = random_leaf({6, 5}), target = random_targets(6, 5, {2});
  Tensor input = random_leaf({4, 3}), wanted = testing::random_tensor({4, 3});
  const std::vector<std::pair<Tensor, std::function<Tensor()>>> losses = {
      {logits, [&] { return cross_entropy(logits, target); }}, {input, [&] { return mse_loss(input, wanted); }}};
  for (const auto& [leaf, loss_of] : losses) {
    Tensor(leaf).set_grad(Tensor());
    loss_of().backward();
    Tensor implied = leaf.grad();
    Tensor(leaf).set_grad(Tensor());
    Tensor loss = loss_of();
    loss.backward(Tensor(), /*retain_graph=*/true);
    EXPECT_TRUE(testing::all_close(leaf.grad(), implied, 0, 0)) << "implied 1, graph retained";
    Tensor(leaf).set_grad(Tensor());
    loss.backward(ones_like(loss));
    EXPECT_TRUE(testing::all_close(leaf.grad(), implied, 0, 0)) << "explicit 1, after the retained backward";
    Tensor(leaf).set_grad(Tensor());
  }
}

// The squared error: its gradient from the forward's pass (a differentiated scalar loss of an
// input whose target needs none), and from the composed ops otherwise (no reduction, or a target
// that needs a gradient too).
TEST(GradcheckReduce, MseLossReductions) {
  for (const Tensor& input : {random_leaf({5, 4}), random_transposed_leaf({5, 4})}) {
    Tensor target = testing::random_tensor({5, 4});
    for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
      SCOPED_TRACE("reduction " + std::to_string(static_cast<int>(reduction)) +
                   (input.is_contiguous() ? "" : ", non-contiguous"));
      EXPECT_GRADCHECK([target, reduction](const Inputs& v) { return mse_loss(v[0], target, reduction); },
                       (Inputs{input}));
      EXPECT_GRADCHECK([reduction](const Inputs& v) { return mse_loss(v[0], v[1], reduction); },
                       (Inputs{input, random_leaf({5, 4})}));
    }
  }
}

// The fused gradient is the composed ops' in f64, bit for bit, scales by the upstream gradient,
// and survives retain_graph; the loss is the composed one's to rounding.
TEST(GradcheckReduce, MseLossGradientMatchesTheComposedOps) {
  for (Reduction reduction : {Reduction::mean, Reduction::sum}) {
    SCOPED_TRACE(reduction == Reduction::mean ? "mean" : "sum");
    Tensor input = random_leaf({7, 3});
    Tensor target = testing::random_tensor({7, 3});
    Tensor loss = mse_loss(input, target, reduction);
    loss.backward();
    Tensor unit = input.grad();  // for an upstream gradient of 1
    input.set_grad(Tensor());
    Tensor diff = sub(input, target);
    Tensor composed = reduction == Reduction::mean ? mean(mul(diff, diff)) : sum(mul(diff, diff));
    composed.backward();
    EXPECT_TRUE(testing::all_close(unit, input.grad(), 0, 0)) << "gradient";
    EXPECT_TRUE(testing::all_close(loss, composed, 1e-15, 0)) << "loss";
    expect_scaled_gradient_survives_retain_graph([&] { return mse_loss(input, target, reduction); }, input, unit);
  }
}

// 16-bit operands are taken in f32, as torch.autocast takes them: the loss is f32 and the gradient
// (fused for bf16, composed for f16) has the bits of the ops on operands converted to f32 first.
TEST(GradcheckReduce, MseLossOfSixteenBitOperandsIsTakenInF32) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (Reduction reduction : {Reduction::mean, Reduction::sum, Reduction::none}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " reduction " + std::to_string(static_cast<int>(reduction)));
      Tensor input = to(testing::random_uniform({33, 17}, -2.0, 2.0), dtype).requires_grad_();
      Tensor target = to(testing::random_uniform({33, 17}, -2.0, 2.0), dtype);
      Tensor loss = mse_loss(input, target, reduction);
      EXPECT_EQ(loss.dtype(), DType::f32);
      sum(loss).backward();
      Tensor grad = input.grad();
      ASSERT_TRUE(grad.defined());
      EXPECT_EQ(grad.dtype(), dtype);
      input.set_grad(Tensor());
      Tensor converted = mse_loss(to(input, DType::f32), to(target, DType::f32), reduction);
      sum(converted).backward();
      EXPECT_TRUE(testing::all_close(to(grad, DType::f64), to(input.grad(), DType::f64), 0, 0)) << "gradient";
      EXPECT_TRUE(testing::all_close(to(loss, DType::f64), to(converted, DType::f64), 1e-6, 1e-6)) << "loss";
    }
  }
}

TEST(GradcheckReduce, MseLossOfAnEmptyInput) {
  Tensor input = zeros({0, 3}, TensorOptions(DType::f64)).requires_grad_();
  Tensor target = zeros({0, 3}, TensorOptions(DType::f64));
  EXPECT_TRUE(std::isnan(mse_loss(input, target).item<double>()));
  Tensor total = mse_loss(input, target, Reduction::sum);
  EXPECT_EQ(total.item<double>(), 0.0);
  total.backward();
  EXPECT_EQ(input.grad().shape(), (Shape{0, 3}));
}

TEST(GradcheckReduce, MseLossRejectsAMismatchedTarget) {
  Tensor input = random_leaf({4, 3});
  EXPECT_THROW(mse_loss(input, testing::random_tensor({3, 4})), ValueError);
}

}  // namespace
}  // namespace tandem
