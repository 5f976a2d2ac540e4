// UpdateInBackward (optim/update_in_backward.h): updating each parameter during backward gives the
// same bits as backward() then step(), tied weights and parameters without a gradient included;
// step() raises while it is attached. The GPU cases (side stream, CUDA graphs) are in
// tests/train/graphed_step_test.cpp.
#include <cstring>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/layers/layers.h"
#include "tandem/optim/adamw.h"
#include "tandem/optim/sgd.h"
#include "tandem/optim/update_in_backward.h"

namespace tandem {
namespace {

// A small model with a weight used twice, as a tied embedding and output head are: two linear
// layers and the first one's weight again, so its gradient has two contributions that must both be
// in before it is updated.
struct TiedModel {
  Tensor w1, b1, w2, unused;  // (16, 16), (16,), (16, 16), (4,) never in the loss
  std::vector<Tensor> params() const { return {w1, b1, w2, unused}; }
  Tensor loss(const Tensor& x, const Tensor& target) const {
    Tensor h = relu(add(matmul(x, transpose(w1, 0, 1)), b1));  // (B, 16)
    Tensor z = matmul(tanh(matmul(h, transpose(w2, 0, 1))), w1);  // (B, 16): w1 again
    return mse_loss(z, target);
  }
};

TiedModel make_model(uint64_t seed) {
  Generator g(seed);
  TiedModel m;
  m.w1 = mul(randn({16, 16}, Device(), &g), 0.25);
  m.b1 = randn({16}, Device(), &g);
  m.w2 = mul(randn({16, 16}, Device(), &g), 0.25);
  m.unused = randn({4}, Device(), &g);
  for (Tensor* p : {&m.w1, &m.b1, &m.w2, &m.unused}) p->requires_grad_();
  return m;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(kernels::contiguous(a).data_ptr(), kernels::contiguous(b).data_ptr(), a.nbytes()) == 0;
}

// Trains `steps` steps on fresh random batches; with `in_backward` through an UpdateInBackward
// whose launches hold at least `min_elements` elements. set_to_none=false keeps zeroed gradients,
// so the parameter outside the loss has one and is updated (decayed) every step as step() does.
std::vector<Tensor> train(bool in_backward, int64_t min_elements, int steps, int64_t* updates = nullptr) {
  TiedModel m = make_model(11);
  optim::AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  optim::AdamW opt(m.params(), o);
  for (const Tensor& p : m.params()) p.set_grad(zeros_like(p));
  std::unique_ptr<optim::UpdateInBackward> update;
  if (in_backward) {
    optim::UpdateInBackwardOptions uo;
    uo.min_elements_per_update = min_elements;
    update = std::make_unique<optim::UpdateInBackward>(opt, uo);
  }
  Generator g(5);
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad(/*set_to_none=*/false);
    Tensor x = randn({8, 16}, Device(), &g), target = randn({8, 16}, Device(), &g);
    m.loss(x, target).backward();
    if (!in_backward) opt.step();
  }
  if (updates && update) *updates = update->updates_last_backward();
  std::vector<Tensor> out;
  for (const Tensor& p : m.params()) out.push_back(kernels::clone(p.detach()));
  return out;
}

TEST(UpdateInBackward, GivesTheBitsOfBackwardThenStep) {
  std::vector<Tensor> reference = train(false, 1, 6);
  for (int64_t min_elements : {int64_t{1}, int64_t{200}, int64_t{1} << 22}) {
    SCOPED_TRACE("min_elements_per_update " + std::to_string(min_elements));
    int64_t updates = 0;
    std::vector<Tensor> got = train(true, min_elements, 6, &updates);
    for (size_t i = 0; i < reference.size(); ++i) EXPECT_TRUE(same_bits(reference[i], got[i])) << "parameter " << i;
    // One launch per parameter whose gradient arrived (3), or fewer when they wait to fill a launch;
    // the unused parameter's zeroed gradient is updated once backward ends.
    if (min_elements == 1) EXPECT_EQ(updates, 4);
    if (min_elements == int64_t{1} << 22) EXPECT_EQ(updates, 1);
  }
  std::vector<Tensor> initial = make_model(11).params();
  EXPECT_FALSE(same_bits(initial[0], reference[0]));  // it trained
  EXPECT_FALSE(same_bits(initial[3], reference[3]));  // weight decay reached the unused parameter
}

TEST(UpdateInBackward, StepRaisesWhileAttachedAndWorksAfter) {
  TiedModel m = make_model(3);
  optim::SGD opt(m.params(), optim::SgdOptions{});
  {
    optim::UpdateInBackward update(opt);
    m.loss(randn({2, 16}), randn({2, 16})).backward();
    EXPECT_TRUE((testing::throws_with<ValueError>([&] { opt.step(); }, {"UpdateInBackward is attached", "a second time"})));
    EXPECT_TRUE((testing::throws_with<ValueError>([&] { optim::UpdateInBackward second(opt); }, {"already has an UpdateInBackward"})));
  }
  opt.zero_grad();
  m.loss(randn({2, 16}), randn({2, 16})).backward();  // the hooks stay and do nothing once it is gone
  Tensor before = kernels::clone(m.w1.detach());
  opt.step();
  EXPECT_FALSE(same_bits(before, m.w1.detach()));
}

TEST(UpdateInBackward, BadOptionsAreNamed) {
  TiedModel m = make_model(3);
  optim::SGD opt(m.params(), optim::SgdOptions{});
  optim::UpdateInBackwardOptions o;
  o.min_elements_per_update = 0;
  EXPECT_TRUE((testing::throws_with<ValueError>([&] { optim::UpdateInBackward u(opt, o); }, {"min_elements_per_update", ">= 1"})));
}

}  // namespace
}  // namespace tandem
