// Module registration, names, modes, moves, state dicts, and the layers' behaviour and
// initialisation.
#include <cmath>

#include "support/test_util.h"

namespace tandem {
namespace {

using testing::all_close;

struct Block : nn::Module {
  Block() {
    fc = register_module("fc", std::make_shared<nn::Linear>(4, 3));
    norm = register_module("norm", std::make_shared<nn::BatchNorm2d>(3));
    scale = register_parameter("scale", ones({3}));
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::BatchNorm2d> norm;
  Tensor scale;
};

struct Net : nn::Module {
  Net() {
    embed = register_module("embed", std::make_shared<nn::Embedding>(10, 4));
    blocks = register_module("blocks", std::make_shared<nn::Sequential>());
    blocks->push_back(std::make_shared<Block>());
    blocks->push_back(std::make_shared<Block>());
  }
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::Sequential> blocks;
};

TEST(Module, NamesAreDottedAndInRegistrationOrder) {
  Net net;
  std::vector<std::string> names;
  for (auto& [name, t] : net.named_parameters()) names.push_back(name);
  std::vector<std::string> expected = {"embed.weight",         "blocks.0.scale",       "blocks.0.fc.weight",
                                       "blocks.0.fc.bias",     "blocks.0.norm.weight", "blocks.0.norm.bias",
                                       "blocks.1.scale",       "blocks.1.fc.weight",   "blocks.1.fc.bias",
                                       "blocks.1.norm.weight", "blocks.1.norm.bias"};
  EXPECT_EQ(names, expected);
  std::vector<std::string> buffers;
  for (auto& [name, t] : net.named_buffers()) buffers.push_back(name);
  EXPECT_EQ(buffers.size(), 6u);
  EXPECT_EQ(buffers[0], "blocks.0.norm.running_mean");
  EXPECT_EQ(net.num_parameters(), 10 * 4 + 2 * (3 + 12 + 3 + 3 + 3));
  for (const Tensor& p : net.parameters()) EXPECT_TRUE(p.requires_grad());
  for (const Tensor& b : net.buffers()) EXPECT_FALSE(b.requires_grad());
}

TEST(Module, DuplicateOrDottedNamesAreErrors) {
  struct Bad : nn::Module {
    void add(const std::string& name) { register_parameter(name, ones({1})); }
  } bad;
  bad.add("w");
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { bad.add("w"); }, {"already registered"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { bad.add("a.b"); }, {"invalid name"}));
}

TEST(Module, TrainAndEvalReachEverySubmodule) {
  Net net;
  net.eval();
  EXPECT_FALSE(net.blocks->is_training());
  EXPECT_FALSE(std::dynamic_pointer_cast<Block>((*net.blocks)[1])->norm->is_training());
  net.train();
  EXPECT_TRUE(std::dynamic_pointer_cast<Block>((*net.blocks)[1])->norm->is_training());
}

TEST(Module, ToDtypeMovesParametersInPlaceButKeepsNormStatisticsF32) {
  Net net;
  Tensor handle = net.embed->weight;  // a copy of the handle, like an optimizer keeps
  net.to(DType::bf16);
  EXPECT_EQ(handle.dtype(), DType::bf16);
  EXPECT_TRUE(handle.requires_grad());
  auto block = std::dynamic_pointer_cast<Block>((*net.blocks)[0]);
  EXPECT_EQ(block->fc->weight.dtype(), DType::bf16);
  EXPECT_EQ(block->norm->weight.dtype(), DType::f32);
  EXPECT_EQ(block->norm->running_var.dtype(), DType::f32);
  EXPECT_EQ(block->norm->num_batches_tracked.dtype(), DType::i64);
  net.to(DType::f64);
  EXPECT_EQ(block->norm->weight.dtype(), DType::f64);
}

TEST(Module, StateDictRoundTripAndErrors) {
  manual_seed(testing::next_seed());
  Net a, b;
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : a.state_dict()) state[name] = t;
  b.load_state_dict(state);
  for (auto& [name, t] : b.state_dict()) EXPECT_TRUE(all_close(t, state[name], 0, 0)) << name;

  auto missing = state;
  missing.erase("blocks.1.fc.bias");
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { b.load_state_dict(missing); }, {"blocks.1.fc.bias", "missing"}));
  b.load_state_dict(missing, /*strict=*/false);
  auto extra = state;
  extra["head.weight"] = ones({2});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { b.load_state_dict(extra); }, {"head.weight"}));
  auto wrong = state;
  wrong["embed.weight"] = ones({10, 5});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { b.load_state_dict(wrong); }, {"embed.weight", "[10, 5]", "[10, 4]"}));
}

TEST(Module, ZeroGradDropsOrZeroesInPlace) {
  nn::Linear fc(3, 2);
  sum(fc(testing::random_tensor({4, 3}, DType::f32))).backward();
  Tensor g = fc.weight.grad();
  fc.zero_grad(false);
  EXPECT_TRUE(fc.weight.grad().is_same(g));
  EXPECT_TRUE(all_close(g, std::vector<double>(6, 0.0)));
  fc.zero_grad();
  EXPECT_FALSE(fc.weight.grad().defined());
}

TEST(Layers, LinearIsXWtPlusBAndInitialisedWithinTheFanInBound) {
  nn::Linear fc(50, 20, true, DType::f64);
  double bound = 1.0 / std::sqrt(50.0);
  for (double v : fc.weight.to_double_vector()) EXPECT_LE(std::abs(v), bound);
  for (double v : fc.bias.to_double_vector()) EXPECT_LE(std::abs(v), bound);
  // Uniform on [-b, b] has standard deviation b / sqrt(3).
  EXPECT_NEAR(std::sqrt(var(fc.weight).item()), bound / std::sqrt(3.0), 0.1 * bound);
  Tensor x = testing::random_tensor({7, 50});
  EXPECT_TRUE(all_close(fc(x), add(matmul(x, transpose(fc.weight, 0, 1)), fc.bias), 1e-12, 1e-12));
}

// What add_layer_norm's residual bias takes from a linear layer: its product alone.
TEST(Layers, LinearWithoutBiasLeavesTheBiasToTheCaller) {
  nn::Linear fc(6, 4, true, DType::f64);
  Tensor x = testing::random_tensor({3, 6});
  EXPECT_TRUE(all_close(add(fc.forward_without_bias(x), fc.bias), fc(x), 1e-12, 1e-12));
  nn::Linear gelu(6, 4, Activation::gelu_tanh, true, DType::f64);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { gelu.forward_without_bias(x); },
                                               {"forward_without_bias", "activation"}));
}

TEST(Layers, Conv2dMatchesTheFunctionalOpAndItsFanIn) {
  nn::Conv2d conv(4, 6, 3, {2, 1, 1, 2, true}, DType::f64);
  EXPECT_EQ(conv.weight.shape(), (Shape{6, 2, 3, 3}));
  double bound = 1.0 / std::sqrt(2.0 * 9.0);
  for (double v : conv.weight.to_double_vector()) EXPECT_LE(std::abs(v), bound);
  Tensor x = testing::random_tensor({2, 4, 9, 9});
  EXPECT_TRUE(all_close(conv(x), conv2d(x, conv.weight, conv.bias, conv.params), 1e-12, 1e-12));
  EXPECT_EQ(conv(x).shape(), (Shape{2, 6, 5, 5}));
}

TEST(Layers, BatchNormUpdatesRunningStatisticsInTrainingOnly) {
  nn::BatchNorm2d bn(3, 1e-5, 0.1, DType::f64);
  Tensor x = add(mul(testing::random_tensor({8, 3, 4, 4}), 2.0), 0.5);
  Tensor y = bn(x);
  // Each channel of the output has mean 0 and (biased) variance 1.
  EXPECT_TRUE(all_close(mean(y, {0, 2, 3}), std::vector<double>(3, 0.0), 0, 1e-9));
  EXPECT_TRUE(all_close(var(y, {0, 2, 3}, 0), std::vector<double>(3, 1.0), 0, 1e-4));
  Tensor expected_mean = mul(mean(x, {0, 2, 3}), 0.1);
  Tensor expected_var = add(mul(var(x, {0, 2, 3}, 1), 0.1), 0.9);  // unbiased batch variance
  EXPECT_TRUE(all_close(bn.running_mean, expected_mean, 1e-10, 1e-12));
  EXPECT_TRUE(all_close(bn.running_var, expected_var, 1e-10, 1e-12));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
  bn.eval();
  Tensor z = bn(x);
  Tensor manual = div(sub(x, reshape(bn.running_mean, {1, 3, 1, 1})), sqrt(add(reshape(bn.running_var, {1, 3, 1, 1}), 1e-5)));
  EXPECT_TRUE(all_close(z, manual, 1e-10, 1e-10));
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 1);
}

TEST(Layers, LayerNormNormalisesTheLastDims) {
  nn::LayerNorm ln({5}, 1e-5, DType::f64);
  kernels::copy_(ln.weight, testing::random_tensor({5}));
  kernels::copy_(ln.bias, testing::random_tensor({5}));
  Tensor x = testing::random_tensor({3, 5});
  Tensor mu = mean(x, {1}, true);
  Tensor sigma2 = var(x, {1}, 0, true);
  Tensor manual = add(mul(div(sub(x, mu), sqrt(add(sigma2, 1e-5))), ln.weight), ln.bias);
  EXPECT_TRUE(all_close(ln(x), manual, 1e-10, 1e-10));
}

TEST(Layers, EmbeddingLooksUpRows) {
  nn::Embedding emb(7, 3, DType::f64);
  Tensor idx = from_vector(std::vector<int64_t>{6, 0, 2, 2}, {2, 2});
  Tensor y = emb(idx);
  EXPECT_EQ(y.shape(), (Shape{2, 2, 3}));
  EXPECT_TRUE(all_close(reshape(y, {4, 3}), index_select(emb.weight, 0, reshape(idx, {4}))));
}

TEST(Layers, DropoutIsReproducibleScaledAndOffInEval) {
  nn::Dropout drop(0.25);
  Tensor x = add(testing::random_uniform({100000}, 0.5, 1.5), 0.0);
  uint64_t seed = testing::next_seed();
  manual_seed(seed);
  Tensor a = drop(x);
  manual_seed(seed);
  Tensor b = drop(x);
  EXPECT_TRUE(all_close(a, b, 0, 0));
  std::vector<double> av = a.to_double_vector(), xv = x.to_double_vector();
  int64_t zeros_seen = 0;
  for (size_t i = 0; i < av.size(); ++i) {
    if (av[i] == 0.0) ++zeros_seen;
    else EXPECT_NEAR(av[i], xv[i] / 0.75, 1e-12);
  }
  EXPECT_NEAR(static_cast<double>(zeros_seen) / av.size(), 0.25, 0.01);
  drop.eval();
  EXPECT_TRUE(drop(x).is_same(x));
}

TEST(Layers, SequentialChainsAndPoolsAndFlatten) {
  auto net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(1, 2, 3, nn::Conv2dOptions{1, 1}), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::MaxPool2d>(2), std::make_shared<nn::AvgPool2d>(2), std::make_shared<nn::Flatten>(),
      std::make_shared<nn::Linear>(8, 3), std::make_shared<nn::Tanh>()});
  Tensor y = (*net)(testing::random_tensor({5, 1, 8, 8}, DType::f32));
  EXPECT_EQ(y.shape(), (Shape{5, 3}));
  EXPECT_EQ(net->named_parameters()[0].first, "0.weight");
  EXPECT_EQ(net->named_parameters()[2].first, "5.weight");
}

TEST(Losses, CrossEntropyWithLabelSmoothingMatchesTheFormula) {
  Tensor logits = testing::random_tensor({6, 4});
  Tensor target = from_vector(std::vector<int64_t>{0, 3, 1, 2, 2, 0});
  nn::CrossEntropyLoss loss({Reduction::mean, -100, 0.2});
  Tensor logp = log_softmax(logits, 1);
  // (1 - eps) * nll + eps * mean over classes of -log p.
  Tensor nll = neg(mean(gather(logp, 1, reshape(target, {6, 1}))));
  Tensor uniform = neg(mean(logp));
  EXPECT_NEAR(loss(logits, target).item(), 0.8 * nll.item() + 0.2 * uniform.item(), 1e-12);
  nn::MSELoss mse;
  Tensor a = testing::random_tensor({3, 4}), b = testing::random_tensor({3, 4});
  EXPECT_NEAR(mse(a, b).item(), mean(pow(sub(a, b), 2.0)).item(), 1e-12);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(Layers, LayerNormTakesTheSizeOfTheLastDim) {
  nn::LayerNorm by_size(6), by_shape(Shape{6});
  EXPECT_EQ(by_size.normalized_shape, (Shape{6}));
  Tensor x = testing::random_tensor({3, 6}, DType::f32);
  EXPECT_TRUE(testing::all_close(by_size.forward(x), by_shape.forward(x), 1e-6, 1e-6));
}

TEST(Layers, SiLUAndSoftplusAreTheirFunctions) {
  Tensor x = testing::random_uniform({4, 5}, -4.0, 4.0);
  nn::SiLU silu_layer;
  nn::Softplus softplus_layer(2.0, 3.0);
  EXPECT_TRUE(testing::all_close(silu_layer.forward(x), silu(x), 0, 0));
  EXPECT_TRUE(testing::all_close(softplus_layer.forward(x), softplus(x, 2.0, 3.0), 0, 0));
}

}  // namespace
}  // namespace tandem
