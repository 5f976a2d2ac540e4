// Finite-difference gradient checks of convolution, pooling and batch norm, on fresh random f64
// inputs, and how these ops take part in the graph.
#include <algorithm>
#include <numeric>

#include "gradcheck_util.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;

Conv2dParams conv_params(int64_t stride, int64_t padding, int64_t dilation, int64_t groups) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = padding;
  p.dilation_h = p.dilation_w = dilation;
  p.groups = groups;
  return p;
}

// Random values at least 0.09 apart, so that a finite-difference step never changes which
// element is a window's maximum.
Tensor distinct_leaf(const Shape& shape) {
  std::vector<double> r = testing::random_uniform(shape, 0.0, 1.0).to_double_vector();
  std::vector<size_t> order(r.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r[a] < r[b]; });
  std::vector<double> values(r.size());
  for (size_t rank = 0; rank < order.size(); ++rank) {
    values[order[rank]] = 0.1 * static_cast<double>(rank) - 1.0 + 0.01 * r[order[rank]];
  }
  return from_vector(values, shape, DType::f64).requires_grad_();
}

TEST(GradcheckConv, Conv2dStridePaddingDilationGroups) {
  auto x = random_leaf({2, 4, 7, 6}), w = random_leaf({6, 2, 3, 2});
  const Conv2dParams p = conv_params(2, 1, 2, 2);
  EXPECT_GRADCHECK([p](const Inputs& v) { return conv2d(v[0], v[1], Tensor(), p); }, (Inputs{x, w}));
  auto b = random_leaf({6});
  EXPECT_GRADCHECK([p](const Inputs& v) { return conv2d(v[0], v[1], v[2], p); }, (Inputs{x, w, b}));
}

TEST(GradcheckConv, Conv2dEachParameter) {
  auto x = random_leaf({2, 4, 6, 5}), b = random_leaf({4});
  for (const Conv2dParams& p : {conv_params(1, 0, 1, 1), conv_params(2, 0, 1, 1), conv_params(1, 1, 1, 1),
                                conv_params(1, 0, 2, 1), conv_params(1, 1, 1, 2)}) {
    SCOPED_TRACE("stride " + std::to_string(p.stride_h) + " padding " + std::to_string(p.pad_h) + " dilation " +
                 std::to_string(p.dilation_h) + " groups " + std::to_string(p.groups));
    auto w = random_leaf({4, 4 / p.groups, 3, 2});
    EXPECT_GRADCHECK([p](const Inputs& v) { return conv2d(v[0], v[1], v[2], p); }, (Inputs{x, w, b}));
  }
  // Rectangular settings, differing per axis.
  Conv2dParams mixed;
  mixed.stride_h = 2;
  mixed.pad_w = 2;
  mixed.dilation_w = 2;
  auto w = random_leaf({3, 4, 2, 3});
  EXPECT_GRADCHECK([mixed](const Inputs& v) { return conv2d(v[0], v[1], Tensor(), mixed); }, (Inputs{x, w}));
}

TEST(GradcheckConv, Conv2dGradientsOnlyForInputsThatNeedThem) {
  Tensor x = testing::random_tensor({2, 3, 5, 5});  // data: no grad
  auto w = random_leaf({4, 3, 3, 3});
  Tensor b = testing::random_tensor({4});
  Tensor out = conv2d(x, w, b);
  ASSERT_TRUE(out.requires_grad());
  Tensor g = testing::random_tensor(out.shape());
  out.backward(g);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(testing::all_close(w.grad(), kernels::conv2d_backward_weight(g, x, w.shape(), {}), 1e-12, 0.0));
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(GradcheckConv, Conv2dBiasMustMatchTheFilters) {
  auto x = random_leaf({1, 3, 5, 5}), w = random_leaf({4, 3, 3, 3}), b = random_leaf({3});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { conv2d(x, w, b); }, {"conv2d", "bias", "(4,)", "[3]"}));
}

TEST(GradcheckConv, MaxPool2d) {
  auto x = distinct_leaf({2, 2, 6, 6});
  EXPECT_GRADCHECK([](const Inputs& v) { return max_pool2d(v[0], 2); }, (Inputs{x}));
  auto y = distinct_leaf({2, 2, 7, 5});
  EXPECT_GRADCHECK([](const Inputs& v) { return max_pool2d(v[0], 3, 2, 1); }, (Inputs{y}));
  EXPECT_EQ(max_pool2d(y, 3, 2, 1).shape(), (Shape{2, 2, 4, 3}));
}

TEST(GradcheckConv, AvgPool2d) {
  auto x = random_leaf({2, 2, 7, 6});
  for (bool include : {true, false}) {
    SCOPED_TRACE(include ? "count_include_pad" : "count only the input");
    EXPECT_GRADCHECK([include](const Inputs& v) { return avg_pool2d(v[0], 3, 2, 1, include); }, (Inputs{x}));
  }
  EXPECT_GRADCHECK([](const Inputs& v) { return avg_pool2d(v[0], 2); }, (Inputs{x}));
  // The two modes differ exactly where windows reach into the padding.
  Tensor with = avg_pool2d(x, 3, 2, 1, true), without = avg_pool2d(x, 3, 2, 1, false);
  EXPECT_FALSE(testing::all_close(with, without, 1e-6, 0.0));
}

TEST(GradcheckConv, AdaptiveAvgPool2d) {
  auto x = random_leaf({2, 3, 4, 5});
  EXPECT_GRADCHECK([](const Inputs& v) { return adaptive_avg_pool2d(v[0], 1, 1); }, (Inputs{x}));
  EXPECT_TRUE(testing::all_close(adaptive_avg_pool2d(x, 1, 1), mean(x, {2, 3}, true), 1e-12, 0.0));
  auto y = random_leaf({2, 2, 4, 6});
  EXPECT_GRADCHECK([](const Inputs& v) { return adaptive_avg_pool2d(v[0], 2, 3); }, (Inputs{y}));
}

TEST(GradcheckConv, AdaptiveAvgPool2dUnevenSizesAreNotImplemented) {
  Tensor x = testing::random_tensor({1, 2, 5, 6});
  EXPECT_TRUE(testing::throws_with<NotImplementedError>([&] { adaptive_avg_pool2d(x, 2, 3); },
                                                        {"adaptive_avg_pool2d", "[1, 2, 5, 6]", "2x3", "divide"}));
}

struct BatchNormState {
  Tensor running_mean, running_var;  // (C,)
};

BatchNormState fresh_running_stats(int64_t c) {
  return {testing::random_tensor({c}), testing::random_uniform({c}, 0.5, 2.0)};
}

TEST(GradcheckConv, BatchNormTraining) {
  auto x = random_leaf({3, 2, 3, 2}), w = random_leaf({2}), b = random_leaf({2});
  BatchNormState s = fresh_running_stats(2);
  EXPECT_GRADCHECK(
      [s](const Inputs& v) { return batch_norm(v[0], v[1], v[2], s.running_mean, s.running_var, true, 0.1, 1e-5); },
      (Inputs{x, w, b}));
}

TEST(GradcheckConv, BatchNormEval) {
  auto x = random_leaf({2, 3, 2, 2}), w = random_leaf({3}), b = random_leaf({3});
  BatchNormState s = fresh_running_stats(3);
  EXPECT_GRADCHECK(
      [s](const Inputs& v) { return batch_norm(v[0], v[1], v[2], s.running_mean, s.running_var, false, 0.1, 1e-5); },
      (Inputs{x, w, b}));
}

// relu(batch_norm(x) + residual) as one node: every combination of residual and ReLU, in training
// and evaluation, the residual's gradient included.
TEST(GradcheckConv, BatchNormActFusedResidualAndRelu) {
  for (bool training : {true, false}) {
    for (bool with_residual : {false, true}) {
      for (bool relu : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "training=" << training << " residual=" << with_residual << " relu=" << relu);
        auto x = random_leaf({3, 2, 3, 2}), w = random_leaf({2}), b = random_leaf({2}), r = random_leaf({3, 2, 3, 2});
        BatchNormState s = fresh_running_stats(2);
        Inputs inputs{x, w, b};
        if (with_residual) inputs.push_back(r);
        EXPECT_GRADCHECK(
            [s, training, relu](const Inputs& v) {
              Tensor residual = v.size() > 3 ? v[3] : Tensor();
              return batch_norm_act(v[0], v[1], v[2], s.running_mean, s.running_var, training, 0.1, 1e-5, residual,
                                    relu);
            },
            inputs);
      }
    }
  }
}

// A channels-last input (an (N, H, W, C) leaf seen as (N, C, H, W)) and residual.
TEST(GradcheckConv, BatchNormActChannelsLast) {
  auto x = random_leaf({3, 2, 3, 4}), w = random_leaf({4}), b = random_leaf({4}), r = random_leaf({3, 2, 3, 4});
  BatchNormState s = fresh_running_stats(4);
  EXPECT_GRADCHECK(
      [s](const Inputs& v) {
        Tensor x_cl = permute(v[0], {0, 3, 1, 2}), r_cl = permute(v[3], {0, 3, 1, 2});  // (N, C, H, W), NHWC memory
        return batch_norm_act(x_cl, v[1], v[2], s.running_mean, s.running_var, true, 0.1, 1e-5, r_cl, true);
      },
      (Inputs{x, w, b, r}));
  EXPECT_GRADCHECK(
      [s](const Inputs& v) {
        return batch_norm(permute(v[0], {0, 3, 1, 2}), v[1], v[2], s.running_mean, s.running_var, true, 0.1, 1e-5);
      },
      (Inputs{x, w, b}));
}

// The fused op's values and gradients are those of batch_norm, add and relu one after the other.
TEST(GradcheckConv, BatchNormActEqualsSeparateOps) {
  auto x = random_leaf({4, 3, 2, 3}), w = random_leaf({3}), b = random_leaf({3}), r = random_leaf({4, 3, 2, 3});
  Tensor direction = testing::random_tensor({4, 3, 2, 3});
  BatchNormState s1 = fresh_running_stats(3);
  BatchNormState s2{clone(s1.running_mean), clone(s1.running_var)};
  Inputs fused_in{x, w, b, r}, plain_in;
  for (const Tensor& t : fused_in) plain_in.push_back(t.detach().requires_grad_());
  Tensor fused = batch_norm_act(x, w, b, s1.running_mean, s1.running_var, true, 0.1, 1e-5, r, true);
  sum(mul(fused, direction)).backward();
  Tensor plain =
      relu(add(batch_norm(plain_in[0], plain_in[1], plain_in[2], s2.running_mean, s2.running_var, true, 0.1, 1e-5),
               plain_in[3]));
  sum(mul(plain, direction)).backward();
  EXPECT_TRUE(testing::all_close(fused, plain, 0.0, 0.0));
  for (size_t i = 0; i < fused_in.size(); ++i) {
    EXPECT_TRUE(testing::all_close(fused_in[i].grad(), plain_in[i].grad(), 1e-12, 1e-12)) << "gradient " << i;
  }
}

TEST(GradcheckConv, BatchNormRunningStatisticsAreBuffers) {
  auto x = random_leaf({4, 2, 2, 2}), w = random_leaf({2}), b = random_leaf({2});
  BatchNormState s = fresh_running_stats(2);
  std::vector<double> before = s.running_mean.to_double_vector();
  Tensor out = batch_norm(x, w, b, s.running_mean, s.running_var, true);
  EXPECT_TRUE(out.requires_grad());
  EXPECT_FALSE(s.running_mean.requires_grad());
  EXPECT_FALSE(s.running_var.requires_grad());
  EXPECT_FALSE(testing::all_close(s.running_mean, before, 1e-9, 0.0));  // updated in place
  sum(mul(out, testing::random_tensor(out.shape()))).backward();
  EXPECT_TRUE(x.grad().defined() && w.grad().defined() && b.grad().defined());
  EXPECT_FALSE(s.running_mean.grad().defined());
}

}  // namespace
}  // namespace tandem
