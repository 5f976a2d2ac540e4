// linear_add_layer_norm and gelu_mlp_add_layer_norm: a product whose output joins the residual
// stream, with the add in the product's epilogue on CUDA, and the layer norm after it. On the CPU
// in f64: finite-difference gradient checks with both outputs feeding the loss, the same values
// and gradients as the ops they fuse (add_layer_norm after linear or gelu_mlp without their last
// bias, the bias passed as the residual bias), and clear errors for bad input.
#include "gradcheck_util.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;

TEST(GradcheckLinearAddLayerNorm, BothOutputsCarryGradients) {
  auto x = random_leaf({2, 3, 4}), w = random_leaf({5, 4}), b = random_leaf({5});
  auto residual = random_leaf({2, 3, 5}), nw = random_leaf({5}), nb = random_leaf({5});
  Tensor a = testing::random_tensor({2, 3, 5}), c = testing::random_tensor({2, 3, 5});
  EXPECT_GRADCHECK(
      [a, c](const Inputs& v) {
        auto [s, n] = linear_add_layer_norm(v[0], v[1], v[2], v[3], {5}, v[4], v[5], 1e-5);
        return add(sum(mul(n, a)), sum(mul(s, c)));
      },
      (Inputs{x, w, b, residual, nw, nb}));
  // Only the norm reaches the loss (the bias's gradient from layer norm's backward), only the sum
  // (from the add's node), and no bias at all.
  EXPECT_GRADCHECK(
      [a](const Inputs& v) { return sum(mul(linear_add_layer_norm(v[0], v[1], v[2], v[3], {5}, v[4], v[5]).second, a)); },
      (Inputs{x, w, b, residual, nw, nb}));
  EXPECT_GRADCHECK(
      [c, nw = nw.detach(), nb = nb.detach()](const Inputs& v) {
        return sum(mul(linear_add_layer_norm(v[0], v[1], v[2], v[3], {5}, nw, nb).first, c));
      },
      (Inputs{x, w, b, residual}));
  EXPECT_GRADCHECK(
      [a, c](const Inputs& v) {
        auto [s, n] = linear_add_layer_norm(v[0], v[1], Tensor(), v[2], {5}, Tensor(), Tensor());
        return add(sum(mul(n, a)), sum(mul(s, c)));
      },
      (Inputs{x, w, residual}));
}

TEST(GradcheckLinearAddLayerNorm, AfterTheGeluMlp) {
  auto x = random_leaf({3, 4}), fc_w = random_leaf({6, 4}), fc_b = random_leaf({6});
  auto proj_w = random_leaf({4, 6}), proj_b = random_leaf({4});
  auto residual = random_leaf({3, 4}), nw = random_leaf({4}), nb = random_leaf({4});
  Tensor a = testing::random_tensor({3, 4}), c = testing::random_tensor({3, 4});
  EXPECT_GRADCHECK(
      [a, c](const Inputs& v) {
        auto [s, n] = gelu_mlp_add_layer_norm(v[0], v[1], v[2], v[3], v[4], v[5], {4}, v[6], v[7]);
        return add(sum(mul(n, a)), sum(mul(s, c)));
      },
      (Inputs{x, fc_w, fc_b, proj_w, proj_b, residual, nw, nb}));
}

// The values and every gradient of the ops it fuses, and of a second backward through the kept graph.
TEST(LinearAddLayerNorm, EqualsTheOpsItFuses) {
  Tensor x = testing::random_tensor({2, 3, 4}), w = testing::random_tensor({5, 4}), b = testing::random_tensor({5});
  Tensor residual = testing::random_tensor({2, 3, 5}), nw = testing::random_tensor({5}), nb = testing::random_tensor({5});
  Tensor a = testing::random_tensor({2, 3, 5}), c = testing::random_tensor({2, 3, 5});
  auto run = [&](bool fused) {
    std::vector<Tensor> v;
    for (const Tensor& t : {x, w, b, residual, nw, nb}) v.push_back(t.detach().requires_grad_());
    auto [s, n] = fused ? linear_add_layer_norm(v[0], v[1], v[2], v[3], {5}, v[4], v[5])
                        : add_layer_norm(v[3], linear(v[0], v[1]), {5}, v[4], v[5], 1e-5, v[2]);
    Tensor loss = add(sum(mul(n, a)), sum(mul(s, c)));
    loss.backward(Tensor(), /*retain_graph=*/true);
    std::vector<Tensor> first;
    for (const Tensor& t : v) first.push_back(t.grad().clone());
    for (const Tensor& t : v) t.set_grad(Tensor());
    loss.backward();
    for (size_t i = 0; i < v.size(); ++i) {
      EXPECT_TRUE(testing::all_close(v[i].grad(), first[i], 0.0, 0.0)) << "second backward, input " << i;
    }
    v.push_back(s.detach());
    v.push_back(n.detach());
    return std::make_pair(v, first);
  };
  auto [fused, fused_grads] = run(true);
  auto [plain, plain_grads] = run(false);
  EXPECT_TRUE(testing::all_close(fused[6], plain[6], 1e-12, 1e-12)) << "sum";
  EXPECT_TRUE(testing::all_close(fused[7], plain[7], 1e-12, 1e-12)) << "normalised";
  const char* names[] = {"x", "weight", "bias", "residual", "norm weight", "norm bias"};
  for (size_t i = 0; i < fused_grads.size(); ++i) {
    EXPECT_TRUE(testing::all_close(fused_grads[i], plain_grads[i], 1e-12, 1e-12)) << "gradient of " << names[i];
  }
}

TEST(LinearAddLayerNorm, EqualsTheOpsItFusesAfterTheGeluMlp) {
  Tensor x = testing::random_tensor({3, 4}), fc_w = testing::random_tensor({6, 4}), fc_b = testing::random_tensor({6});
  Tensor proj_w = testing::random_tensor({4, 6}), proj_b = testing::random_tensor({4});
  Tensor residual = testing::random_tensor({3, 4}), nw = testing::random_tensor({4}), nb = testing::random_tensor({4});
  auto [s, n] = gelu_mlp_add_layer_norm(x, fc_w, fc_b, proj_w, proj_b, residual, {4}, nw, nb);
  auto [s2, n2] = add_layer_norm(residual, gelu_mlp(x, fc_w, fc_b, proj_w, Tensor()), {4}, nw, nb, 1e-5, proj_b);
  EXPECT_TRUE(testing::all_close(s, s2, 1e-12, 1e-12)) << "sum";
  EXPECT_TRUE(testing::all_close(n, n2, 1e-12, 1e-12)) << "normalised";
}

TEST(LinearAddLayerNorm, BadInputNamesWhatWasExpected) {
  Tensor x = testing::random_tensor({3, 4}), w = testing::random_tensor({5, 4}), b = testing::random_tensor({5});
  Tensor nw = testing::random_tensor({5}), nb = testing::random_tensor({5});
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] { linear_add_layer_norm(x, w, b, testing::random_tensor({3, 4}), {5}, nw, nb); },
      {"residual", "[3, 4]", "[3, 5]"}));
  EXPECT_TRUE(testing::throws_with<TypeError>(
      [&] { linear_add_layer_norm(x, w, b, to(testing::random_tensor({3, 5}), DType::f32), {5}, nw, nb); },
      {"residual", "f32"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] { linear_add_layer_norm(x, w, b, testing::random_tensor({3, 5}), {4}, Tensor(), Tensor()); },
      {"normalized_shape"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] { kernels::linear_forward(x, w, b, Activation::gelu_tanh, testing::random_tensor({3, 5})); },
      {"residual", "activation"}));
}

}  // namespace
}  // namespace tandem
