#pragma once
// Choosing DDP's buckets from a step profile and a link model (dist/scaling_model.h): bucket
// boundaries, not only a cap, that minimise the predicted cost of communication on the step.
//
//   scaling::StepProfile profile = ...;           // bench/train_step --profile, or measured in place
//   scaling::SimulationOptions sim;  sim.gpus = world.size;  sim.topology = ...;
//   BucketPlan plan = decide_bucket_plan(profile, sim, *world().cpu_group);  // the same on every rank
//   DdpOptions options;  options.bucket_plan = plan.buckets;
//
// The search: a dynamic program over the gradients of the main dtype in backward order (for
// each prefix, the earliest time its collectives can have finished; that time only grows with
// the earlier ones', so the best prefix extends to the best whole), run with a few per-bucket
// penalties, beside DDP's plans for a range of fixed caps; every candidate is replayed by
// simulate_step and the cheapest kept. Gradients of other dtypes (f32 batch-norm parameters in a
// bf16 model) keep DDP's one open bucket per dtype with a 25 MB cap.
#include <string>
#include <vector>

#include "tandem/dist/process_group.h"
#include "tandem/dist/scaling_model.h"

namespace tandem::dist {

struct BucketPlan {
  // Parameter indices (registration order) per bucket, in launch order: DdpOptions::bucket_plan.
  std::vector<std::vector<int64_t>> buckets;
  scaling::StepPrediction prediction;  // of this plan
  std::string chosen;                  // which candidate won: "search" or "cap 25 MB", ...
};

// The cheapest plan for `options` (deterministic: the same inputs give the same plan).
BucketPlan plan_buckets(const scaling::StepProfile& profile, const scaling::SimulationOptions& options);

// Indices into profile.gradients -> parameter indices, and back.
std::vector<std::vector<int64_t>> to_parameter_plan(const scaling::StepProfile& profile,
                                                    const scaling::ProfilePlan& plan);

// Throws a ValueError unless `plan` holds every parameter exactly once and one dtype per bucket.
void check_bucket_plan(const std::vector<std::vector<int64_t>>& plan, const std::vector<Tensor>& params);

// Collective over `group`: rank 0 plans from its profile and broadcasts the plan, so every rank
// holds the same one even though each measured its own profile.
BucketPlan decide_bucket_plan(const scaling::StepProfile& profile, const scaling::SimulationOptions& options,
                              ProcessGroup& group);

}  // namespace tandem::dist
