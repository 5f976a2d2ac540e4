// The backward engine: accumulation, hooks, grad mode, retain_graph, and its error messages.
#include "support/test_util.h"
#include "tandem/autograd/node.h"

namespace tandem {
namespace {

using testing::all_close;

TEST(Engine, AccumulatesIntoLeavesAcrossBackwardCalls) {
  Tensor w = testing::random_leaf({3});
  Tensor x = testing::random_tensor({3});
  sum(mul(w, x)).backward();
  EXPECT_TRUE(all_close(w.grad(), x));
  sum(mul(w, x)).backward();
  EXPECT_TRUE(all_close(w.grad(), mul(x, 2.0)));
}

TEST(Engine, SumsGradientsOfATensorUsedTwice) {
  Tensor w = testing::random_leaf({4});
  Tensor y = mul(w, w);  // dy/dw = 2w
  sum(add(y, w)).backward();
  EXPECT_TRUE(all_close(w.grad(), add(mul(w, 2.0), 1.0)));
}

// A node that can fold: records what the engine handed it (and, with `finals`, whether its
// gradient for x is x's last), returns pending + 3 g for its input.
Tensor triple_folding(const Tensor& x, std::vector<Tensor>* seen, std::vector<bool>* finals = nullptr) {
  return autograd::record(mul(x.detach(), 3.0), "triple", {x},
                          [seen, finals](const Tensor& g, const Tensor& pending) -> std::vector<Tensor> {
                            seen->push_back(pending);
                            if (finals) finals->push_back(autograd::first_input_gradient_is_final());
                            Tensor grad = mul(g, 3.0);
                            return {pending.defined() ? add(grad, pending) : grad};
                          });
}

TEST(Engine, HandsTheGradientGatheredSoFarToANodeThatFoldsIt) {
  Tensor w = testing::random_leaf({4});
  Tensor x = exp(w);  // x's node waits for both uses below
  std::vector<Tensor> seen;
  Tensor folded = triple_folding(x, &seen);
  Tensor other = mul(x, 2.0);  // created later, so its backward runs first
  sum(add(folded, other)).backward();
  ASSERT_EQ(seen.size(), 1u);
  ASSERT_TRUE(seen[0].defined());
  EXPECT_TRUE(all_close(seen[0], full_like(x, 2.0)));
  EXPECT_TRUE(all_close(w.grad(), mul(exp(w.detach()), 5.0)));
}

TEST(Engine, ANodeThatRunsFirstHasNothingToFold) {
  Tensor w = testing::random_leaf({4});
  Tensor x = exp(w);
  Tensor other = mul(x, 2.0);  // created first, so its backward runs after the folding node's
  std::vector<Tensor> seen;
  Tensor folded = triple_folding(x, &seen);
  sum(add(folded, other)).backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_FALSE(seen[0].defined());
  EXPECT_TRUE(all_close(w.grad(), mul(exp(w.detach()), 5.0)));
}

// What add_layer_norm's residual bias relies on: a node learns whether the gradient it returns for
// its first input (with what it folded) is all that input gets.
TEST(Engine, SaysWhetherANodeGivesItsFirstInputItsLastGradient) {
  EXPECT_FALSE(autograd::first_input_gradient_is_final());  // outside a backward
  std::vector<Tensor> seen;
  std::vector<bool> finals;
  Tensor w = testing::random_leaf({4});
  {  // the only use
    Tensor x = exp(w);
    sum(triple_folding(x, &seen, &finals)).backward();
  }
  {  // the other use ran first and was folded in
    Tensor x = exp(w);
    Tensor folded = triple_folding(x, &seen, &finals);
    Tensor other = mul(x, 2.0);
    sum(add(folded, other)).backward();
  }
  {  // the other use runs after: not the last gradient
    Tensor x = exp(w);
    Tensor other = mul(x, 2.0);
    Tensor folded = triple_folding(x, &seen, &finals);
    sum(add(folded, other)).backward();
  }
  EXPECT_EQ(finals, (std::vector<bool>{true, true, false}));
  EXPECT_FALSE(autograd::first_input_gradient_is_final());
}

TEST(Engine, ExplicitGradientForNonScalarOutput) {
  Tensor w = testing::random_leaf({2, 3});
  Tensor g = testing::random_tensor({2, 3});
  exp(w).backward(g);
  EXPECT_TRUE(all_close(w.grad(), mul(g, exp(w.detach()))));
}

TEST(Engine, NoGradGuardRecordsNothing) {
  Tensor w = testing::random_leaf({3});
  Tensor y;
  {
    NoGradGuard guard;
    y = mul(w, 2.0);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
  EXPECT_TRUE(mul(w, 2.0).requires_grad());
}

TEST(Engine, DetachCutsHistoryButSharesStorage) {
  Tensor w = testing::random_leaf({3});
  Tensor y = exp(w);
  Tensor d = y.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.storage().is_same(y.storage()));
}

TEST(Engine, SecondBackwardThroughFreedGraphIsAClearError) {
  Tensor w = testing::random_leaf({3});
  Tensor loss = sum(exp(w));
  loss.backward();
  EXPECT_TRUE(testing::throws_with<Error>([&] { loss.backward(); }, {"second time", "retain_graph"}));
}

TEST(Engine, RetainGraphAllowsASecondBackward) {
  Tensor w = testing::random_leaf({3});
  Tensor loss = sum(exp(w));
  loss.backward(Tensor(), /*retain_graph=*/true);
  loss.backward();
  EXPECT_TRUE(all_close(w.grad(), mul(exp(w.detach()), 2.0)));
}

// A loss recorded with record_loss is handed no gradient for backward()'s implied 1 when the graph
// is released (nothing launched to make the 1), and a real 1 otherwise: with retain_graph, or
// when the caller passes a gradient.
TEST(Engine, ALossThatIgnoresTheImpliedOneIsHandedNone) {
  Tensor x = testing::random_leaf({3});
  std::vector<Tensor> handed;
  auto loss_of = [&] {
    return autograd::record_loss(sum(x.detach()), "loss", {x}, [&handed, x](const Tensor& g) -> std::vector<Tensor> {
      handed.push_back(g);
      const bool implied = autograd::backward_releases_saved() && autograd::gradient_is_implicit_one();
      return {implied ? ones_like(x) : mul(ones_like(x), g)};
    });
  };
  loss_of().backward();
  Tensor loss = loss_of();
  loss.backward(Tensor(), /*retain_graph=*/true);
  loss.backward(full({}, 2.0, loss.options()));
  ASSERT_EQ(handed.size(), 3u);
  EXPECT_FALSE(handed[0].defined()) << "implied 1, graph released";
  ASSERT_TRUE(handed[1].defined()) << "implied 1, graph retained";
  EXPECT_EQ(handed[1].item<double>(), 1.0);
  ASSERT_TRUE(handed[2].defined()) << "an explicit gradient";
  EXPECT_EQ(handed[2].item<double>(), 2.0);
  EXPECT_TRUE(all_close(x.grad(), full({3}, 4.0)));
}

TEST(Engine, BackwardOnTensorWithoutGradIsAClearError) {
  Tensor x = testing::random_tensor({3});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { sum(x).backward(); }, {"does not require grad"}));
}

TEST(Engine, NonScalarBackwardNeedsAGradient) {
  Tensor w = testing::random_leaf({2, 2});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { exp(w).backward(); }, {"scalar", "[2, 2]"}));
}

TEST(Engine, PostAccumulateHooksRunInReverseOrderOfUse) {
  // Two layers: the gradient of the later one is complete first, as DDP relies on.
  Tensor w1 = testing::random_leaf({4, 4}), w2 = testing::random_leaf({4, 4});
  std::vector<std::string> order;
  w1.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("w1"); });
  w2.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    EXPECT_TRUE(leaf.grad().defined());
    order.push_back("w2");
  });
  Tensor x = testing::random_tensor({2, 4});
  sum(matmul(tanh(matmul(x, w1)), w2)).backward();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(order[0], "w2");
  EXPECT_EQ(order[1], "w1");
}

TEST(Engine, GradOfSharedBufferIsNotAliased) {
  // add passes its gradient through unchanged to both inputs: each leaf must get its own buffer.
  Tensor a = testing::random_leaf({3}), b = testing::random_leaf({3});
  sum(add(a, b)).backward();
  EXPECT_FALSE(a.grad().storage().is_same(b.grad().storage()));
  sum(mul(a, 2.0)).backward();
  EXPECT_TRUE(all_close(a.grad(), std::vector<double>{3, 3, 3}));
  EXPECT_TRUE(all_close(b.grad(), std::vector<double>{1, 1, 1}));
}

TEST(Engine, RequiresGradOnlyOnFloatingLeaves) {
  Tensor i = arange(4);
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { i.requires_grad_(); }, {"floating-point", "i64"}));
  Tensor w = testing::random_leaf({2});
  Tensor y = exp(w);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { y.requires_grad_(false); }, {"leaf", "exp"}));
}

TEST(Engine, TrainsALinearRegressionWithHandWrittenSgd) {
  // y = x @ w_true + b_true, fitted from random data by plain gradient descent.
  Tensor x = testing::random_tensor({64, 3});
  Tensor w_true = from_vector(std::vector<double>{1.5, -2.0, 0.5}, {3, 1}, DType::f64);
  Tensor y = add(matmul(x, w_true), 0.25);
  Tensor w = zeros({3, 1}, DType::f64).requires_grad_();
  Tensor b = zeros({1}, DType::f64).requires_grad_();
  for (int step = 0; step < 300; ++step) {
    Tensor loss = mean(pow(sub(add(matmul(x, w), b), y), 2.0));
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    loss.backward();
    NoGradGuard no_grad;
    kernels::add_(w, w.grad(), -0.1);
    kernels::add_(b, b.grad(), -0.1);
  }
  EXPECT_TRUE(all_close(w, w_true, 1e-3, 1e-3));
  EXPECT_NEAR(b.item(), 0.25, 1e-3);
}

}  // namespace
}  // namespace tandem
