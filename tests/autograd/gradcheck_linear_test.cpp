// The fused linear op: finite-difference gradient checks on fresh random f64 inputs (with and
// without bias, with GELU, batched inputs), its forward against matmul + add + gelu, and nn::Linear
// built on it.
#include "gradcheck_util.h"
#include "tandem/autograd/node.h"
#include "tandem/core/kernels.h"
#include "tandem/layers/layers.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;

TEST(GradcheckLinear, WithAndWithoutBias) {
  auto x = random_leaf({5, 4}), w = random_leaf({3, 4}), b = random_leaf({3});
  EXPECT_GRADCHECK([](const Inputs& v) { return linear(v[0], v[1], v[2]); }, (Inputs{x, w, b}));
  EXPECT_GRADCHECK([](const Inputs& v) { return linear(v[0], v[1]); }, (Inputs{x, w}));
}

TEST(GradcheckLinear, GeluTanh) {
  auto x = random_leaf({2, 3, 4}), w = random_leaf({8, 4}), b = random_leaf({8});
  EXPECT_GRADCHECK([](const Inputs& v) { return linear(v[0], v[1], v[2], Activation::gelu_tanh); }, (Inputs{x, w, b}));
  EXPECT_GRADCHECK([](const Inputs& v) { return linear(v[0], v[1], Tensor(), Activation::gelu_tanh); }, (Inputs{x, w}));
}

TEST(GradcheckLinear, TransposedInputAndOnlySomeGradients) {
  auto xt = testing::random_transposed_leaf({6, 5}), w = random_leaf({3, 5}), b = random_leaf({3});
  EXPECT_GRADCHECK([](const Inputs& v) { return linear(v[0], v[1], v[2], Activation::gelu_tanh); }, (Inputs{xt, w, b}));
  // Only the weight and bias require grad (x is data): the op keeps x for the weight's gradient.
  Tensor data = testing::random_tensor({6, 5});
  EXPECT_GRADCHECK([data](const Inputs& v) { return linear(data, v[0], v[1]); }, (Inputs{w, b}));
  // Only x requires grad.
  Tensor wd = testing::random_tensor({3, 5});
  EXPECT_GRADCHECK([wd](const Inputs& v) { return linear(v[0], wd, Tensor(), Activation::gelu_tanh); }, (Inputs{xt}));
}

TEST(GradcheckGeluMlp, EveryInputWithAndWithoutBiases) {
  auto x = random_leaf({2, 3, 4}), fc_w = random_leaf({8, 4}), fc_b = random_leaf({8});
  auto proj_w = random_leaf({4, 8}), proj_b = random_leaf({4});
  EXPECT_GRADCHECK([](const Inputs& v) { return gelu_mlp(v[0], v[1], v[2], v[3], v[4]); },
                   (Inputs{x, fc_w, fc_b, proj_w, proj_b}));
  EXPECT_GRADCHECK([](const Inputs& v) { return gelu_mlp(v[0], v[1], Tensor(), v[2], Tensor()); },
                   (Inputs{x, fc_w, proj_w}));
  // x is data: only the weights and biases require grad.
  Tensor data = testing::random_tensor({5, 4});
  EXPECT_GRADCHECK([data](const Inputs& v) { return gelu_mlp(data, v[0], v[1], v[2], v[3]); },
                   (Inputs{fc_w, fc_b, proj_w, proj_b}));
}

TEST(GeluMlp, EqualsTheTwoLinearOps) {
  Tensor x = testing::random_tensor({2, 5, 6}), fc_w = testing::random_tensor({12, 6}),
         fc_b = testing::random_tensor({12});
  Tensor proj_w = testing::random_tensor({6, 12}), proj_b = testing::random_tensor({6});
  EXPECT_TRUE(testing::all_close(gelu_mlp(x, fc_w, fc_b, proj_w, proj_b),
                                 linear(linear(x, fc_w, fc_b, Activation::gelu_tanh), proj_w, proj_b), 1e-12, 1e-12));
}

TEST(GradcheckGeluMlp, ChainsOfOneToFourLayers) {
  // Three layers (4 -> 6 -> 5 -> 3), a bias on some: every input, then the parameters alone.
  auto x = random_leaf({2, 3, 4}), w0 = random_leaf({6, 4}), b0 = random_leaf({6}), w1 = random_leaf({5, 6});
  auto w2 = random_leaf({3, 5}), b2 = random_leaf({3});
  EXPECT_GRADCHECK(
      [](const Inputs& v) {
        return gelu_mlp(v[0], {v[1], v[3], v[4]}, {v[2], Tensor(), v[5]});
      },
      (Inputs{x, w0, b0, w1, w2, b2}));
  Tensor data = testing::random_tensor({5, 4});
  EXPECT_GRADCHECK(
      [data](const Inputs& v) {
        return gelu_mlp(data, {v[0], v[2], v[3]}, {v[1], Tensor(), v[4]});
      },
      (Inputs{w0, b0, w1, w2, b2}));
  // Only the last layer's parameters: nothing before them wants a gradient.
  Tensor dw0 = testing::random_tensor({6, 4}), dw1 = testing::random_tensor({5, 6});
  EXPECT_GRADCHECK(
      [data, dw0, dw1](const Inputs& v) {
        return gelu_mlp(data, {dw0, dw1, v[0]}, {Tensor(), Tensor(), v[1]});
      },
      (Inputs{w2, b2}));
  // Only x (and a middle layer's bias).
  Tensor dw2 = testing::random_tensor({3, 5});
  EXPECT_GRADCHECK(
      [dw0, dw1, dw2](const Inputs& v) {
        return gelu_mlp(v[0], {dw0, dw1, dw2}, {Tensor(), v[1], Tensor()});
      },
      (Inputs{x, random_leaf({5})}));
  // One layer (a linear op) and four.
  EXPECT_GRADCHECK([](const Inputs& v) { return gelu_mlp(v[0], {v[1]}, {v[2]}); }, (Inputs{x, w0, b0}));
  auto w3 = random_leaf({2, 3}), b3 = random_leaf({2});
  EXPECT_GRADCHECK(
      [](const Inputs& v) {
        return gelu_mlp(v[0], {v[1], v[3], v[4], v[6]}, {v[2], Tensor(), v[5], v[7]});
      },
      (Inputs{x, w0, b0, w1, w2, b2, w3, b3}));
}

TEST(GeluMlp, ChainEqualsTheLinearOpsInARowAndNamesWhatIsWrong) {
  Tensor x = testing::random_tensor({2, 5, 6}), w0 = testing::random_tensor({12, 6}), b0 = testing::random_tensor({12});
  Tensor w1 = testing::random_tensor({9, 12}), b1 = testing::random_tensor({9});
  Tensor w2 = testing::random_tensor({4, 9}), b2 = testing::random_tensor({4});
  Tensor layers = linear(linear(linear(x, w0, b0, Activation::gelu_tanh), w1, b1, Activation::gelu_tanh), w2, b2);
  EXPECT_TRUE(testing::all_close(gelu_mlp(x, {w0, w1, w2}, {b0, b1, b2}), layers, 1e-12, 1e-12));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { gelu_mlp(x, std::vector<Tensor>{}, std::vector<Tensor>{}); },
                                               {"at least one layer"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { gelu_mlp(x, {w0, w1}, {b0}); }, {"2 weights but 1 biases"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { gelu_mlp(x, {w0, w2}, {b0, b2}); }, {"in_features"}));
}

TEST(Linear, ForwardMatchesMatmulAddGelu) {
  Tensor x = testing::random_tensor({2, 7, 6}), w = testing::random_tensor({5, 6}), b = testing::random_tensor({5});
  Tensor pre = add(matmul(x, t(w)), b);
  EXPECT_TRUE(testing::all_close(linear(x, w, b), pre, 1e-12, 1e-12));
  EXPECT_TRUE(
      testing::all_close(linear(x, w, b, Activation::gelu_tanh), gelu(pre, GeluApproximate::tanh), 1e-12, 1e-12));
  kernels::LinearForward f = kernels::linear_forward(x, w, b, Activation::gelu_tanh);
  EXPECT_TRUE(testing::all_close(f.pre, pre, 1e-12, 1e-12));
  EXPECT_FALSE(kernels::linear_forward(x, w, b, Activation::none).pre.defined());
}

TEST(Linear, ModuleUsesTheFusedOpAndKeepsItsParameterNames) {
  nn::Linear plain(6, 4, true, DType::f64);
  nn::Linear fc(6, 8, Activation::gelu_tanh, true, DType::f64);
  EXPECT_EQ(fc.activation, Activation::gelu_tanh);
  std::vector<std::string> names;
  for (const auto& entry : fc.named_parameters()) names.push_back(entry.first);
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias"}));
  Tensor x = testing::random_tensor({3, 6});
  EXPECT_TRUE(testing::all_close(plain.forward(x), add(matmul(x, t(plain.weight)), plain.bias), 1e-12, 1e-12));
  EXPECT_TRUE(testing::all_close(fc.forward(x), gelu(add(matmul(x, t(fc.weight)), fc.bias), GeluApproximate::tanh),
                                 1e-12, 1e-12));
}

TEST(Linear, BadShapesSayWhatWasExpected) {
  Tensor x = testing::random_tensor({3, 4});
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        linear(x, testing::random_tensor({5, 3}));
      },
      {"in_features", "3", "[3, 4]"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        linear(x, testing::random_tensor({5, 4}), testing::random_tensor({4}));
      },
      {"bias", "(5,)", "[4]"}));
  EXPECT_TRUE(testing::throws_with<TypeError>(
      [&] {
        linear(x, to(testing::random_tensor({5, 4}), DType::f32));
      },
      {"weight", "f32", "f64"}));
}

TEST(GeluMlp, ModuleIsOneOpWithSequentialNamesAndTheLayersGradients) {
  nn::GeluMlp mlp({6, 8, 5, 3}, true, DType::f64);
  std::vector<std::string> names;
  for (const auto& entry : mlp.named_parameters()) names.push_back(entry.first);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}));
  ASSERT_EQ(mlp.layers.size(), 3u);
  EXPECT_EQ(mlp.layers[1]->activation, Activation::gelu_tanh);
  EXPECT_EQ(mlp.layers[2]->activation, Activation::none);
  // The same output and gradients as the Linear modules called in a row.
  Tensor x = testing::random_tensor({4, 6});
  Tensor y = mlp.forward(x);
  EXPECT_EQ(autograd::gradient_edge(y)->name(), "gelu_mlp_chain");  // one node
  Tensor direction = testing::random_tensor({4, 3});
  sum(mul(y, direction)).backward();
  std::vector<Tensor> fused;
  for (const auto& entry : mlp.named_parameters()) fused.push_back(entry.second.grad());
  mlp.zero_grad();
  Tensor h = x;
  for (const auto& layer : mlp.layers) h = layer->forward(h);
  EXPECT_TRUE(testing::all_close(y, h, 1e-12, 1e-12));
  sum(mul(h, direction)).backward();
  size_t i = 0;
  for (const auto& entry : mlp.named_parameters()) {
    EXPECT_TRUE(testing::all_close(entry.second.grad(), fused[i++], 1e-12, 1e-12)) << entry.first;
  }
  EXPECT_TRUE(testing::throws_with<ValueError>([] { nn::GeluMlp({6}); }, {"at least two widths"}));
}

}  // namespace
}  // namespace tandem
