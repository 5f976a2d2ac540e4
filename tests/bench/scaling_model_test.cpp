// The scaling model (dist/scaling_model.h) and the bucket planner (dist/bucket_plan.h) on the
// profiles kept in docs/scaling/profiles: the link model's formulas, the simulation's limits, and
// the planner against DDP's fixed caps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "step_profile.h"
#include "tandem/core/error.h"
#include "tandem/dist/bucket_plan.h"
#include "tandem/dist/scaling_model.h"

namespace tandem {
namespace {

using namespace dist::scaling;

StepProfile kept_profile(const std::string& workload) {
  return bench::read_profile(std::string(TANDEM_SOURCE_DIR) + "/docs/scaling/profiles/" + workload + "_bf16.json");
}

ModelParameters kept_parameters() { return ModelParameters{}; }

TEST(LinkModel, AllReduceFollowsBusBandwidthDefinition) {
  Topology t = topology_from_name("nvlink8");
  // 256 MiB on 4 GPUs of one host: base + 2 passes x 3 NVLink hops + 2 (N-1)/N S / busbw.
  double bytes = 256.0 * 1024 * 1024;
  double expected_us = t.base_us + 2 * 3 * t.intra.hop_us + bytes * 1.5 / (t.intra.busbw_GBps * 1e3);
  EXPECT_NEAR(collective_ms(CollectiveKind::all_reduce, bytes, 4, t, Algorithm::ring), expected_us / 1e3, 1e-9);
  // Reduce-scatter and all-gather move half of an all-reduce's bytes.
  double rs = collective_ms(CollectiveKind::reduce_scatter, bytes, 4, t);
  double ar = collective_ms(CollectiveKind::all_reduce, bytes, 4, t, Algorithm::ring);
  EXPECT_NEAR(rs - (t.base_us + 3 * t.intra.hop_us) / 1e3, (ar - (t.base_us + 6 * t.intra.hop_us) / 1e3) / 2, 1e-9);
  EXPECT_EQ(collective_ms(CollectiveKind::all_reduce, bytes, 1, t), 0.0);
}

TEST(LinkModel, NetworkBoundsAcrossHostsAndTreeWinsForSmallMessagesAtScale) {
  Topology ib = topology_from_name("nvlink8-ib8x400");
  Topology eth = topology_from_name("nvlink8-eth100");
  EXPECT_NEAR(ib.inter.busbw_GBps, 8 * 400 / 8.0 * 0.92, 1e-9);  // 8 NDR NICs at 92% of line rate
  EXPECT_NEAR(eth.inter.busbw_GBps, 100 / 8.0 * 0.85, 1e-9);
  double bytes = 100e6;
  EXPECT_GT(collective_ms(CollectiveKind::all_reduce, bytes, 16, eth),
            5 * collective_ms(CollectiveKind::all_reduce, bytes, 8, eth));
  // 1 KB on 1024 GPUs: a ring's 2 x 1023 hops cost far more than a tree's depth.
  EXPECT_LT(collective_ms(CollectiveKind::all_reduce, 1024, 1024, ib, Algorithm::tree),
            collective_ms(CollectiveKind::all_reduce, 1024, 1024, ib, Algorithm::ring) / 5);
}

TEST(LinkModel, UnknownTopologiesAndMissingNetworksAreNamed) {
  try {
    topology_from_name("nvlink8-infiniband");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown topology 'nvlink8-infiniband'"), std::string::npos) << e.what();
  }
  try {
    collective_ms(CollectiveKind::all_reduce, 1e6, 16, topology_from_name("nvlink8"));
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("16 GPUs need a network"), std::string::npos) << e.what();
  }
}

TEST(Simulation, OneGpuIsTheProfileAndOverlapNeverLoses) {
  StepProfile p = kept_profile("gpt2");
  SimulationOptions o;
  o.topology = topology_from_name("nvlink8-ib8x400");
  o.parameters = kept_parameters();
  o.gpus = 1;
  EXPECT_DOUBLE_EQ(simulate_step(p, plan_for_cap(p, 25), o).efficiency(), 1.0);
  for (int n : {2, 8, 64}) {
    o.gpus = n;
    o.overlap = true;
    StepPrediction with = simulate_step(p, plan_for_cap(p, 25), o);
    o.overlap = false;
    StepPrediction without = simulate_step(p, plan_for_cap(p, 25), o);
    EXPECT_LE(with.exposed_ms, without.exposed_ms) << n << " GPUs";
    EXPECT_GT(with.efficiency(), 0.0);
    EXPECT_LT(with.efficiency(), 1.0);
  }
}

// The step is the profile's measured step plus what the replay adds: spans that overlap (sum to
// more than the step) change nothing, and with every collective free the step is the 1-GPU step
// plus the synchronisation share.
TEST(Simulation, TheStepStartsFromTheMeasuredStep) {
  StepProfile p = kept_profile("mlp");
  SimulationOptions o;
  o.topology = topology_from_name("nvlink2");
  o.gpus = 2;
  StepPrediction base = simulate_step(p, plan_for_cap(p, 25), o);
  StepProfile overlapping = p;
  overlapping.forward_ms += 0.5 * p.step_ms;  // the spans now sum to more than the step
  StepPrediction same = simulate_step(overlapping, plan_for_cap(p, 25), o);
  EXPECT_NEAR(same.step_ms, base.step_ms, 1e-9);
  o.parameters = ModelParameters{0.0, 0.0, 0.02, 0.0};
  o.topology.base_us = 0;
  o.topology.intra = {1e12, 0.0};  // an infinitely fast link
  EXPECT_NEAR(simulate_step(p, plan_for_cap(p, 25), o).step_ms, p.step_ms * 1.02, 1e-6);
}

// ZeRO as dist::ZeroRedundancyOptimizer runs it: stage 1 all-reduces the buckets, stage 2
// reduce-scatters them, and both gather the parameters (counted in the collectives' time).
TEST(Simulation, ZeroStagesUseTheirCollectives) {
  EXPECT_EQ(bucket_collective(0), CollectiveKind::all_reduce);
  EXPECT_EQ(bucket_collective(1), CollectiveKind::all_reduce);
  EXPECT_EQ(bucket_collective(2), CollectiveKind::reduce_scatter);
  StepProfile p = kept_profile("gpt2");
  SimulationOptions o;
  o.topology = topology_from_name("nvlink2");
  o.gpus = 2;
  o.overlap_optimizer = false;
  StepPrediction plain = simulate_step(p, plan_for_cap(p, 25), o);
  o.zero_stage = 1;
  StepPrediction one = simulate_step(p, plan_for_cap(p, 25), o);
  o.zero_stage = 2;
  StepPrediction two = simulate_step(p, plan_for_cap(p, 25), o);
  EXPECT_GT(one.comm_ms, plain.comm_ms);  // the same all-reduces, and the gathers
  EXPECT_LT(two.comm_ms, one.comm_ms);    // reduce-scatters move half the bytes
  EXPECT_EQ(one.bytes, plain.bytes);
}

TEST(Simulation, APlanMissingAGradientIsNamed) {
  StepProfile p = kept_profile("mlp");
  ProfilePlan plan = plan_for_cap(p, 25);
  plan.back().pop_back();
  SimulationOptions o;
  o.topology = topology_from_name("nvlink8");
  try {
    simulate_step(p, plan, o);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("is in no bucket of the plan"), std::string::npos) << e.what();
  }
}

// The planner's promise: for each workload at 2, 8 and 64 GPUs on 8-GPU hosts with NDR
// InfiniBand, what communication adds to the step under the auto plan (exposed waits, compute
// slowed beside collectives, per-bucket costs) is no more than under the best of DDP's fixed caps.
TEST(BucketPlanner, NoWorseThanTheBestFixedCap) {
  for (const char* workload : {"gpt2", "resnet18", "mlp"}) {
    StepProfile p = kept_profile(workload);
    for (int n : {2, 8, 64}) {
      SimulationOptions o;
      o.gpus = n;
      o.topology = topology_from_name("nvlink8-ib8x400");
      o.parameters = kept_parameters();
      dist::BucketPlan plan = dist::plan_buckets(p, o);
      double best_fixed = 1e300, best_fixed_exposed = 1e300;
      for (double cap : {1.0, 5.0, 25.0, 100.0}) {
        StepPrediction fixed = simulate_step(p, plan_for_cap(p, cap, 1.0), o);
        best_fixed = std::min(best_fixed, fixed.communication_cost_ms());
        best_fixed_exposed = std::min(best_fixed_exposed, fixed.exposed_ms);
      }
      EXPECT_LE(plan.prediction.communication_cost_ms(), best_fixed + 1e-9)
          << workload << " on " << n << " GPUs: auto plan (" << plan.chosen << ")";
      std::printf(
          "%-9s %3d GPUs: auto %.3f ms added (%s, %zu buckets, exposed %.3f), best fixed cap %.3f ms "
          "(smallest exposed %.3f)\n",
          workload, n, plan.prediction.communication_cost_ms(), plan.chosen.c_str(), plan.buckets.size(),
          plan.prediction.exposed_ms, best_fixed, best_fixed_exposed);
    }
  }
}

TEST(BucketPlanner, DeterministicAndEveryParameterOnce) {
  StepProfile p = kept_profile("resnet18");
  SimulationOptions o;
  o.gpus = 64;
  o.topology = topology_from_name("nvlink8-eth100");
  dist::BucketPlan a = dist::plan_buckets(p, o), b = dist::plan_buckets(p, o);
  EXPECT_EQ(a.buckets, b.buckets);
  std::vector<int> seen(p.gradients.size(), 0);
  for (const auto& bucket : a.buckets) {
    for (int64_t i : bucket) ++seen.at(i);
  }
  for (int count : seen) EXPECT_EQ(count, 1);
}

}  // namespace
}  // namespace tandem
