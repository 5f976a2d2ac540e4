// Weight gradients beside backward (autograd/side_stream.h): on a GPU, every gradient has the same
// bits with the weight products on the side stream as on the compute stream alone, for a small
// transformer (linear layers with and without GELU, the GELU MLP, a tied output head and its
// embedding), a weight reached through an op (which must wait for it), gradients accumulated over
// two passes, hooks that read the gradient, and a backward that fails partway. Allocations are
// poisoned (NaN), so a read that ran before its side work shows. GPU only: each test skips without one.
#include "support/test_util.h"
#include "tandem/autograd/node.h"
#include "tandem/autograd/side_stream.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

const Device kGpu("cuda");

// Poisoned allocations and the mode as asked, restored after.
class BesideMode {
 public:
  explicit BesideMode(bool on) : was_(autograd::weight_gradients_beside()) {
    autograd::set_weight_gradients_beside(on);
  }
  ~BesideMode() { autograd::set_weight_gradients_beside(was_); }

 private:
  bool was_;
  testing::PoisonedAllocations poisoned_;  // for the mode's scope
};

::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) { return testing::bits_match(a, b); }

Tensor gpu_leaf(const Shape& shape, double scale, DType dtype) {
  return to(testing::random_uniform(shape, -scale, scale, TensorOptions(DType::f32, kGpu)), dtype).requires_grad_();
}

// A transformer-like stack over a tied embedding: what GPT-2's backward runs beside itself.
struct SmallModel {
  static constexpr int64_t B = 2, T = 64, C = 64, H = 256, V = 96;
  Tensor wte, ln_w, ln_b, attn_w, attn_b, out_w, ln2_w, ln2_b, fc_w, fc_b, proj_w, proj_b;
  Tensor ids, targets;

  explicit SmallModel(DType dtype) {
    wte = gpu_leaf({V, C}, 0.5, dtype);
    ln_w = gpu_leaf({C}, 1.0, dtype);
    ln_b = gpu_leaf({C}, 0.2, dtype);
    attn_w = gpu_leaf({H, C}, 0.2, dtype);
    attn_b = gpu_leaf({H}, 0.2, dtype);
    out_w = gpu_leaf({C, H}, 0.1, dtype);
    ln2_w = gpu_leaf({C}, 1.0, dtype);
    ln2_b = gpu_leaf({C}, 0.2, dtype);
    fc_w = gpu_leaf({H, C}, 0.2, dtype);
    fc_b = gpu_leaf({H}, 0.2, dtype);
    proj_w = gpu_leaf({C, H}, 0.1, dtype);
    proj_b = gpu_leaf({C}, 0.2, dtype);
    Generator g(testing::next_seed());
    ids = randint(0, V, {B, T}, TensorOptions(DType::i64, kGpu), &g);
    targets = randint(0, V, {B * T}, TensorOptions(DType::i64, kGpu), &g);
  }
  std::vector<Tensor> params() const {
    return {wte, ln_w, ln_b, attn_w, attn_b, out_w, ln2_w, ln2_b, fc_w, fc_b, proj_w, proj_b};
  }
  Tensor loss() const {
    Tensor x = embedding(ids, wte);                                                            // (B, T, C)
    Tensor h = linear(layer_norm(x, {C}, ln_w, ln_b), attn_w, attn_b, Activation::gelu_tanh);  // (B, T, H)
    Tensor x2 = add(x, linear(h, out_w, Tensor()));                                            // (B, T, C)
    Tensor x3 = add(x2, gelu_mlp(layer_norm(x2, {C}, ln2_w, ln2_b), fc_w, fc_b, proj_w, proj_b));
    Tensor logits = matmul(reshape(x3, {B * T, C}), t(wte));  // (B T, V), tied
    return cross_entropy(to(logits, DType::f32), targets);
  }
  std::vector<Tensor> grads() const {
    std::vector<Tensor> out;
    for (const Tensor& p : params()) out.push_back(kernels::clone(p.grad()));
    return out;
  }
  void zero_grad() const {
    for (const Tensor& p : params()) p.set_grad(Tensor());
  }
};

TEST(WeightGradientsBeside, SmallTransformerHasTheSameBitsBesideAndOnOneStream) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    SmallModel model(dtype);
    std::vector<Tensor> alone, beside;
    {
      BesideMode mode(false);
      model.loss().backward();
      alone = model.grads();
    }
    model.zero_grad();
    {
      BesideMode mode(true);
      model.loss().backward();
      beside = model.grads();
    }
    for (size_t i = 0; i < alone.size(); ++i) EXPECT_TRUE(same_bits(beside[i], alone[i])) << "parameter " << i;
  }
}

TEST(WeightGradientsBeside, GradientsAccumulateOverTwoPassesAsOnOneStream) {
  TANDEM_REQUIRE_CUDA();
  SmallModel model(DType::bf16);
  std::vector<Tensor> alone, beside;
  {
    BesideMode mode(false);
    model.loss().backward();
    model.loss().backward();
    alone = model.grads();
  }
  model.zero_grad();
  {
    BesideMode mode(true);
    model.loss().backward();
    model.loss().backward();  // .grad defined: the accumulation itself runs beside
    beside = model.grads();
  }
  for (size_t i = 0; i < alone.size(); ++i) EXPECT_TRUE(same_bits(beside[i], alone[i])) << "parameter " << i;
}

// The weight a linear layer uses is made by an op from a leaf: the op's backward reads the weight's
// gradient on the compute stream, so the engine waits for the side stream first.
TEST(WeightGradientsBeside, AWeightMadeByAnOpWaitsForItsGradient) {
  TANDEM_REQUIRE_CUDA();
  Tensor w = gpu_leaf({512, 1024}, 0.05, DType::bf16);
  Tensor x = to(testing::random_uniform({2048, 1024}, -1.0, 1.0, TensorOptions(DType::f32, kGpu)), DType::bf16);
  auto run = [&](bool on) {
    BesideMode mode(on);
    w.set_grad(Tensor());
    sum(to(linear(x, mul(w, 1.5), Tensor()), DType::f32)).backward();
    return kernels::clone(w.grad());
  };
  Tensor alone = run(false), beside = run(true);
  EXPECT_TRUE(same_bits(beside, alone));
}

// A post-accumulate hook (what DDP registers) runs once the gradient is complete on the compute
// stream: a copy made there equals the final gradient.
TEST(WeightGradientsBeside, HooksSeeTheFinishedGradient) {
  TANDEM_REQUIRE_CUDA();
  BesideMode mode(true);
  Tensor w = gpu_leaf({1024, 1024}, 0.05, DType::bf16);
  Tensor b = gpu_leaf({1024}, 0.05, DType::bf16);
  Tensor x = to(testing::random_uniform({4096, 1024}, -1.0, 1.0, TensorOptions(DType::f32, kGpu)), DType::bf16);
  Tensor seen_w, seen_b;
  w.register_post_accumulate_grad_hook([&](const Tensor& p) { seen_w = kernels::clone(p.grad()); });
  b.register_post_accumulate_grad_hook([&](const Tensor& p) { seen_b = kernels::clone(p.grad()); });
  sum(to(linear(x, w, b), DType::f32)).backward();
  EXPECT_TRUE(same_bits(seen_w, w.grad()));
  EXPECT_TRUE(same_bits(seen_b, b.grad()));
}

// A node that throws after side work was launched: the error reaches the caller, the device is left
// in order, and the next backward gives the usual gradient.
TEST(WeightGradientsBeside, ABackwardThatFailsPartwayLeavesTheNextOneCorrect) {
  TANDEM_REQUIRE_CUDA();
  BesideMode mode(true);
  Tensor x0 =
      to(testing::random_uniform({256, 512}, -1.0, 1.0, TensorOptions(DType::f32, kGpu)), DType::bf16).requires_grad_();
  Tensor w = gpu_leaf({512, 512}, 0.05, DType::bf16);
  Tensor failing = autograd::record(kernels::clone(x0), "fails", {x0}, [](const Tensor&) -> std::vector<Tensor> {
    TANDEM_THROW(ValueError, "this node fails on purpose");
  });
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { sum(to(linear(failing, w, Tensor()), DType::f32)).backward(); },
                                               {"fails on purpose"}));
  cuda::synchronize();
  w.set_grad(Tensor());
  Tensor x = x0.detach();
  sum(to(linear(x, w, Tensor()), DType::f32)).backward();
  Tensor beside = kernels::clone(w.grad());
  autograd::set_weight_gradients_beside(false);
  w.set_grad(Tensor());
  sum(to(linear(x, w, Tensor()), DType::f32)).backward();
  EXPECT_TRUE(same_bits(beside, w.grad()));
}

}  // namespace
}  // namespace tandem
