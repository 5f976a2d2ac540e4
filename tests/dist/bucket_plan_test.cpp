// The bucket planner across ranks: each rank measures its own (slightly different) profile, the
// plan is decided on rank 0 and is then the same on every rank, and DDP trains with it. CTest runs
// this under mpirun -np 3 (bucket_plan_np3) as well as with the rest of dist_tests.
#include <cstring>

#include "dist/dist_test_util.h"
#include "support/test_util.h"
#include "tandem/core/views.h"
#include "tandem/dist/bucket_plan.h"
#include "tandem/dist/ddp.h"
#include "tandem/optim/sgd.h"

namespace tandem {
namespace {

std::shared_ptr<nn::Sequential> make_mlp(TensorOptions o) {
  return std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(16, 64, true, o), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(64, 64, true, o), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(64, 64, true, o), std::make_shared<nn::Tanh>(),
      std::make_shared<nn::Linear>(64, 4, true, o)});
}

// A profile of `module` as if measured on this rank: gradients in reverse registration order,
// ready times with rank-dependent jitter (real profiles never agree to the bit).
dist::scaling::StepProfile rank_profile(nn::Module& module, int rank) {
  dist::scaling::StepProfile p;
  p.workload = "test mlp";
  p.step_ms = 3.0 + 0.01 * rank;
  p.forward_ms = 0.8;
  p.backward_ms = 1.6 + 0.02 * rank;
  p.optimizer_ms = 0.3;
  auto params = module.named_parameters();
  for (int64_t i = static_cast<int64_t>(params.size()) - 1; i >= 0; --i) {
    double position = double(params.size() - i) / double(params.size());
    p.gradients.push_back(
        {i, params[i].first, params[i].second.numel(), 4, p.backward_ms * position * (1 + 0.03 * ((rank + i) % 3))});
  }
  return p;
}

uint64_t plan_hash(const std::vector<std::vector<int64_t>>& plan) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) {
    unsigned char bytes[sizeof v];
    std::memcpy(bytes, &v, sizeof v);
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  };
  for (const auto& b : plan) {
    mix(-1);
    for (int64_t i : b) mix(i);
  }
  return h;
}

TEST(BucketPlanAcrossRanks, DecidedOnceAndIdenticalOnEveryRank) {
  const dist::World& w = dist::world();
  manual_seed(77);
  auto model = make_mlp(TensorOptions(DType::f32, Device("cpu")));
  dist::scaling::SimulationOptions sim;
  sim.gpus = 64;  // plan for a large run, where the buckets matter; the ranks here only agree on it
  sim.topology = dist::scaling::topology_from_name("nvlink8-eth100");
  dist::BucketPlan plan = dist::decide_bucket_plan(rank_profile(*model, w.rank), sim, *w.cpu_group);
  ASSERT_FALSE(plan.buckets.empty());

  // Every rank's plan hashes the same.
  Tensor mine = from_vector(std::vector<int64_t>{static_cast<int64_t>(plan_hash(plan.buckets))});  // (1,)
  Tensor all = empty({w.size}, DType::i64);                                                        // (size,)
  w.cpu_group->all_gather(all, mine)->synchronize();
  for (int64_t h : all.to_vector<int64_t>()) EXPECT_EQ(h, mine.item<int64_t>()) << "rank " << w.rank;

  // DDP builds exactly these buckets, and a step leaves the same parameters on every rank.
  dist::DdpOptions options;
  options.bucket_plan = plan.buckets;
  dist::DistributedDataParallel ddp(model, options);
  EXPECT_EQ(ddp.bucket_plan(), plan.buckets);
  optim::SgdOptions sgd;
  sgd.lr = 0.1;
  optim::SGD opt(model->parameters(), sgd);
  Tensor x = dist::testing::rank_input(11, w.rank, {8, 16}, DType::f32);  // (8, 16) this rank's batch
  opt.zero_grad();
  Tensor y = ddp(x);  // (8, 4)
  sum(mul(y, y)).backward();
  ddp.step(opt);
  for (const Tensor& p : model->parameters()) {
    Tensor gathered = empty({w.size * p.numel()}, DType::f32);  // (size * numel,)
    w.cpu_group->all_gather(gathered, kernels::contiguous(views::reshape(p.detach(), {p.numel()})))->synchronize();
    std::vector<double> v = gathered.to_double_vector();
    for (int r = 1; r < w.size; ++r) {
      for (int64_t k = 0; k < p.numel(); ++k) ASSERT_EQ(v[r * p.numel() + k], v[k]) << "rank " << r << " element " << k;
    }
  }
}

// The simulator's plan for a cap is the plan DDP builds for it.
TEST(BucketPlanAcrossRanks, PlanForCapIsDdpsPlan) {
  manual_seed(79);
  auto model = make_mlp(TensorOptions(DType::f32, Device("cpu")));
  dist::scaling::StepProfile profile = rank_profile(*model, 0);
  for (double cap : {0.005, 0.02, 25.0}) {
    dist::DdpOptions options;
    options.bucket_cap_mb = cap;
    options.first_bucket_mb = 0.001;
    dist::DistributedDataParallel ddp(model, options);
    EXPECT_EQ(ddp.bucket_plan(), dist::to_parameter_plan(profile, dist::scaling::plan_for_cap(profile, cap, 0.001)))
        << "cap " << cap << " MB";
  }
}

TEST(BucketPlanAcrossRanks, ABadPlanIsRejectedWithItsReason) {
  manual_seed(78);
  auto model = make_mlp(TensorOptions(DType::f32, Device("cpu")));
  dist::DdpOptions options;
  options.bucket_plan = {{7, 6, 5}, {4, 3, 2, 1}};  // parameter 0 is missing
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { dist::DistributedDataParallel ddp(model, options); },
                                               {"bucket plan", "parameter 0 appears 0 times"}));
}

}  // namespace
}  // namespace tandem
