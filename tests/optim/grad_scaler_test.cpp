// GradScaler and master weights: the scale trajectory against PyTorch's documented rule, skipped
// steps, the call-order errors, state round trips, and f32 master weights for 16-bit parameters.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"
#include "tandem/layers/layers.h"
#include "tandem/optim/adamw.h"
#include "tandem/optim/sgd.h"
#include "tandem/tandem.h"

namespace tandem {
namespace {

using amp::GradScaler;
using amp::GradScalerOptions;

// PyTorch's dynamic loss scaling (torch.amp.GradScaler.update, _amp_update_scale_), in f64.
struct ScaleReference {
  double scale;
  int64_t tracker = 0;
  double growth, backoff;
  int64_t interval;

  void update(bool found_inf) {
    if (found_inf) {
      scale *= backoff;
      tracker = 0;
    } else if (++tracker == interval) {
      scale *= growth;
      tracker = 0;
    }
  }
};

// loss = sum(p * w) for a fixed random w: the gradient of p is w, exactly; an inf in w makes it
// overflow.
Tensor weighted_loss(const Tensor& p, const Tensor& w) { return sum(p * w); }

TEST(GradScaler, ScaleTrajectoryAndSkippedStepsFollowPyTorchsRule) {
  for (int device_kind = 0; device_kind < 2; ++device_kind) {
    if (device_kind == 1 && !testing::cuda_available()) continue;
    const Device device = device_kind == 0 ? Device() : Device("cuda:0");
    SCOPED_TRACE(device.str());
    GradScalerOptions options;
    options.init_scale = 1024.0;
    options.growth_interval = 3;
    GradScaler scaler(device, options);
    ScaleReference ref{options.init_scale, 0, options.growth_factor, options.backoff_factor, options.growth_interval};

    Tensor p = kernels::to_device(kernels::to_dtype(testing::random_tensor({6}), DType::f32), device);
    p.requires_grad_();
    optim::AdamW adamw({p}, optim::AdamWOptions{0.1});
    Tensor w_clean = kernels::to_device(kernels::to_dtype(testing::random_tensor({6}), DType::f32), device);
    Tensor w_inf = kernels::clone(w_clean);
    kernels::fill_(views::narrow(w_inf, 0, 2, 1), std::numeric_limits<double>::infinity());

    // Clean (.) and overflowing (x) steps: growth after 3 clean steps, backoff at each overflow,
    // the tracker restarting at both.
    const std::string script = "...x.x...x....x";
    int64_t clean_steps = 0;
    for (size_t s = 0; s < script.size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      const bool overflow = script[s] == 'x';
      Tensor before = kernels::clone(p);
      adamw.zero_grad();
      scaler.scale(weighted_loss(p, overflow ? w_inf : w_clean)).backward();
      scaler.step(adamw);
      EXPECT_EQ(scaler.found_inf(), overflow);
      scaler.update();
      ref.update(overflow);
      EXPECT_EQ(scaler.get_scale(), ref.scale);
      EXPECT_EQ(scaler.get_growth_tracker(), ref.tracker);
      const bool unchanged = static_cast<bool>(testing::all_close(kernels::to_device(p, Device()),
                                                kernels::to_device(before, Device()), 0.0, 0.0));
      EXPECT_EQ(unchanged, overflow);
      if (!overflow) ++clean_steps;
      EXPECT_EQ(adamw.state_dict().metadata.at("state.0.step"), static_cast<double>(clean_steps));
    }
  }
}

// A clean scaled step equals the unscaled step: the gradients are unscaled exactly (the scale is
// a power of 2) as the kernel reads them.
TEST(GradScaler, ScaledStepEqualsUnscaledStep) {
  Tensor a = kernels::to_dtype(testing::random_tensor({5, 3}), DType::f32);
  Tensor b = kernels::clone(a);
  a.requires_grad_();
  b.requires_grad_();
  Tensor w = kernels::to_dtype(testing::random_tensor({5, 3}), DType::f32);
  optim::SGD sa({a}, optim::SgdOptions{0.1, 0.9});
  optim::SGD sb({b}, optim::SgdOptions{0.1, 0.9});
  GradScaler scaler{Device()};
  for (int s = 0; s < 3; ++s) {
    sa.zero_grad();
    sb.zero_grad();
    scaler.scale(weighted_loss(a, w)).backward();
    scaler.step(sa);
    scaler.update();
    weighted_loss(b, w).backward();
    sb.step();
    EXPECT_TRUE(testing::all_close(a, b, 0.0, 0.0)) << s;
  }
}

// f16 parameters: at the default initial scale 2^16 the scaled gradients overflow f16 itself, so
// the scaler backs off until they fit, as in PyTorch, and then trains.
TEST(GradScaler, F16GradientsOverflowingTheScaleBackOffUntilTheyFit) {
  Tensor p = kernels::to_dtype(testing::random_tensor({8}), DType::f16);
  p.requires_grad_();
  Tensor w = full({8}, 3.0, DType::f16);  // scaled gradient 3 * 2^16 > 65504
  optim::SGD sgd({p}, optim::SgdOptions{0.01});
  GradScaler scaler{Device()};
  std::vector<double> scales;
  std::vector<bool> skipped;
  for (int s = 0; s < 4; ++s) {
    sgd.zero_grad();
    scaler.scale(weighted_loss(p, w)).backward();
    scaler.step(sgd);
    skipped.push_back(scaler.found_inf());
    scaler.update();
    scales.push_back(scaler.get_scale());
  }
  EXPECT_EQ(skipped, (std::vector<bool>{true, true, false, false}));  // 3 * 2^15 overflows too; 3 * 2^14 fits
  EXPECT_EQ(scales, (std::vector<double>{32768.0, 16384.0, 16384.0, 16384.0}));
}

TEST(GradScaler, UnscaleBeforeClippingThenStep) {
  Tensor p = kernels::to_dtype(testing::random_tensor({4}), DType::f32);
  p.requires_grad_();
  Tensor w = full({4}, 10.0, DType::f32);
  optim::SGD sgd({p}, optim::SgdOptions{1.0});
  GradScaler scaler{Device()};
  Tensor before = kernels::clone(p);
  scaler.scale(weighted_loss(p, w)).backward();
  scaler.unscale_(sgd);
  EXPECT_TRUE(testing::all_close(p.grad(), w, 0.0, 0.0));  // true gradients
  Tensor norm = optim::clip_grad_norm_({p}, 1.0);
  EXPECT_NEAR(norm.item_double(), 20.0, 1e-4);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { scaler.unscale_(sgd); }, {"unscale_() was already called"}));
  scaler.step(sgd);  // does not unscale again
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { scaler.step(sgd); }, {"step() was already called"}));
  scaler.update();
  // p -= 1.0 * w * (1 / 20): clipped to norm 1.
  std::vector<double> expected = before.to_double_vector();
  for (double& v : expected) v -= 10.0 / (20.0 + 1e-6);
  EXPECT_TRUE(testing::all_close(p, expected, 1e-5, 1e-5));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { scaler.update(); }, {"no gradients were checked"}));
}

TEST(GradScaler, StateRoundTripsAndBadOptionsAreRejected) {
  GradScalerOptions options;
  options.init_scale = 256.0;
  options.growth_interval = 7;
  GradScaler a(Device(), options);
  Tensor p = kernels::to_dtype(testing::random_tensor({3}), DType::f32);
  p.requires_grad_();
  optim::SGD sgd({p}, optim::SgdOptions{0.1});
  for (int s = 0; s < 2; ++s) {
    sgd.zero_grad();
    a.scale(sum(p * p)).backward();
    a.step(sgd);
    a.update();
  }
  GradScaler b{Device()};
  b.load_state_dict(a.state_dict());
  EXPECT_EQ(b.get_scale(), 256.0);
  EXPECT_EQ(b.get_growth_tracker(), 2);
  EXPECT_EQ(b.options().growth_interval, 7);
  EXPECT_TRUE(testing::throws_with<ValueError>([] {
    GradScalerOptions bad;
    bad.backoff_factor = 1.5;
    GradScaler s(Device(), bad);
  }, {"backoff_factor", "1.5"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { b.load_state_dict({{"scale", 2.0}}); }, {"growth_tracker"}));
}

TEST(GradScaler, DisabledPassesThrough) {
  GradScalerOptions options;
  options.enabled = false;
  GradScaler scaler(Device(), options);
  Tensor p = kernels::to_dtype(testing::random_tensor({3}), DType::f32);
  p.requires_grad_();
  optim::SGD sgd({p}, optim::SgdOptions{0.1});
  Tensor loss = sum(p * p);
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  Tensor expected = kernels::clone(p);
  kernels::add_(expected, p.grad(), -0.1);
  scaler.step(sgd);
  scaler.update();
  EXPECT_TRUE(testing::all_close(p, expected, 1e-6, 1e-6));
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

// Updates smaller than half a bf16 ulp: without master weights the parameter never moves; with
// them the f32 master accumulates the updates and the parameter follows it, rounded.
TEST(MasterWeights, SmallUpdatesAccumulateInTheMaster) {
  for (bool master : {true, false}) {
    SCOPED_TRACE(master ? "master weights" : "no master weights");
    Tensor p = full({16}, 1.0, DType::bf16);  // bf16 ulp at 1.0 is 2^-7
    p.requires_grad_();
    optim::SgdOptions options{1e-3};
    options.master_weights = master;
    optim::SGD sgd({p}, options);
    for (int s = 0; s < 100; ++s) {
      sgd.zero_grad();
      sum(p).backward();  // gradient 1: each step moves p by -1e-3
      sgd.step();
    }
    const double value = p.to_double_vector()[0];
    if (master) {
      EXPECT_NEAR(value, 0.9, 2e-3);  // 1 - 100 * 1e-3, rounded to bf16
      optim::StateDict state = sgd.state_dict();
      ASSERT_EQ(state.tensors.count("state.0.master"), 1u);
      EXPECT_EQ(state.tensors.at("state.0.master").dtype(), DType::f32);
      EXPECT_NEAR(state.tensors.at("state.0.master").to_double_vector()[0], 0.9, 1e-5);
      // The master comes back with the state; an optimizer without master weights rejects it.
      optim::SGD other({p}, options);
      other.load_state_dict(state);
      optim::SgdOptions plain{1e-3};
      plain.master_weights = false;
      optim::SGD without({p}, plain);
      EXPECT_TRUE(testing::throws_with<ValueError>([&] { without.load_state_dict(state); }, {"master"}));
    } else {
      EXPECT_EQ(value, 1.0);
      EXPECT_EQ(sgd.state_dict().tensors.count("state.0.master"), 0u);
    }
  }
}

// AdamW on bf16 parameters with master weights follows AdamW on f32 copies of them: the master
// is the f32 run's parameter, and the bf16 parameter is it rounded.
TEST(MasterWeights, AdamWOnBf16FollowsF32) {
  Tensor p32 = kernels::to_dtype(kernels::to_dtype(testing::random_tensor({50}), DType::bf16), DType::f32);
  Tensor p16 = kernels::to_dtype(p32, DType::bf16);
  p32.requires_grad_();
  p16.requires_grad_();
  optim::AdamW a32({p32}, optim::AdamWOptions{1e-2});
  optim::AdamW a16({p16}, optim::AdamWOptions{1e-2});
  for (int s = 0; s < 5; ++s) {
    Tensor g = kernels::to_dtype(kernels::to_dtype(testing::random_tensor({50}), DType::bf16), DType::f32);
    p32.set_grad(g);
    p16.set_grad(kernels::to_dtype(g, DType::bf16));
    a32.step();
    a16.step();
  }
  Tensor master = a16.state_dict().tensors.at("state.0.master");
  EXPECT_TRUE(testing::all_close(master, p32, 1e-6, 1e-6));
  EXPECT_TRUE(testing::all_close(p16, kernels::to_dtype(p32, DType::bf16), 0.0, 0.0));
}

}  // namespace
}  // namespace tandem
