#include "tandem/dist/bucket_plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>

#include "tandem/core/error.h"
#include "tandem/core/tensor.h"

namespace tandem::dist {

namespace {

using scaling::CollectiveKind;
using scaling::ProfilePlan;
using scaling::SimulationOptions;
using scaling::StepProfile;

// The dtype (by element size) holding most of the gradient bytes: the buckets worth planning.
int64_t main_element_bytes(const StepProfile& profile) {
  std::map<int64_t, int64_t> bytes;
  for (const auto& g : profile.gradients) bytes[g.element_bytes] += g.numel * g.element_bytes;
  int64_t best = 0, most = -1;
  for (const auto& [size, total] : bytes) {
    if (total > most) best = size, most = total;
  }
  return best;
}

// Boundaries over `sequence` (indices into profile.gradients, in the order backward produced them)
// minimising when the last collective can end, each bucket charged `penalty_ms` more.
ProfilePlan search_boundaries(const StepProfile& profile, const std::vector<int64_t>& sequence,
                              const SimulationOptions& options, double penalty_ms) {
  const size_t m = sequence.size();
  std::vector<double> prefix_bytes(m + 1, 0.0);  // (m + 1,) wire bytes of the first k gradients
  for (size_t k = 0; k < m; ++k) {
    const auto& g = profile.gradients[sequence[k]];
    int64_t wire = options.comm_element_bytes > 0 ? options.comm_element_bytes : g.element_bytes;
    prefix_bytes[k + 1] = prefix_bytes[k] + double(g.numel * wire);
  }
  CollectiveKind kind = scaling::bucket_collective(options.zero_stage);
  const double overhead_ms = options.parameters.bucket_overhead_us / 1e3 + penalty_ms;
  std::vector<double> finish(m + 1, std::numeric_limits<double>::infinity());  // (m + 1,) best end of a prefix
  std::vector<size_t> cut(m + 1, 0);                                           // (m + 1,) where its last bucket starts
  finish[0] = 0;
  for (size_t j = 1; j <= m; ++j) {
    double ready = options.overlap ? profile.gradients[sequence[j - 1]].ready_ms : profile.backward_ms;
    for (size_t i = 0; i < j; ++i) {
      double cost = overhead_ms + scaling::collective_ms(kind, prefix_bytes[j] - prefix_bytes[i], options.gpus,
                                                         options.topology, options.algorithm);
      double end = std::max(finish[i], ready) + cost;
      if (end < finish[j]) finish[j] = end, cut[j] = i;
    }
  }
  ProfilePlan plan;
  for (size_t j = m; j > 0; j = cut[j]) plan.emplace_back(sequence.begin() + cut[j], sequence.begin() + j);
  std::reverse(plan.begin(), plan.end());
  return plan;
}

// The searched buckets of the main dtype, with DDP's 25 MB buckets for the other dtypes, all in the
// order they complete.
ProfilePlan searched_plan(const StepProfile& profile, const SimulationOptions& options, double penalty_ms) {
  const int64_t main = main_element_bytes(profile);
  std::vector<int64_t> sequence;
  for (size_t i = 0; i < profile.gradients.size(); ++i) {
    if (profile.gradients[i].element_bytes == main) sequence.push_back(static_cast<int64_t>(i));
  }
  ProfilePlan plan = search_boundaries(profile, sequence, options, penalty_ms);
  for (const auto& bucket : scaling::plan_for_cap(profile, 25.0, 25.0)) {
    if (profile.gradients[bucket.front()].element_bytes != main) plan.push_back(bucket);
  }
  auto ready = [&](const std::vector<int64_t>& b) {
    double r = 0;
    for (int64_t i : b) r = std::max(r, profile.gradients[i].ready_ms);
    return r;
  };
  std::stable_sort(plan.begin(), plan.end(), [&](const auto& a, const auto& b) { return ready(a) < ready(b); });
  return plan;
}

std::string cap_label(double cap, double first) {
  std::ostringstream s;
  if (cap >= 1e5) {
    s << "one bucket";
  } else {
    s << "cap " << cap << " MB";
    if (first != cap) s << ", first " << first << " MB";
  }
  return s.str();
}

}  // namespace

std::vector<std::vector<int64_t>> to_parameter_plan(const StepProfile& profile, const ProfilePlan& plan) {
  std::vector<std::vector<int64_t>> out;
  for (const auto& bucket : plan) {
    std::vector<int64_t> params;
    for (int64_t i : bucket) params.push_back(profile.gradients.at(i).param_index);
    out.push_back(std::move(params));
  }
  return out;
}

BucketPlan plan_buckets(const StepProfile& profile, const SimulationOptions& options) {
  TANDEM_CHECK_AS(ValueError, !profile.gradients.empty(), "plan_buckets: the profile of '", profile.workload,
                  "' lists no gradients");
  struct Candidate {
    ProfilePlan plan;
    std::string label;
  };
  std::vector<Candidate> candidates;
  for (double penalty : {0.0, 0.02, 0.05, 0.1, 0.2, 0.5}) {
    std::ostringstream label;
    label << "search (per-bucket penalty " << penalty << " ms)";
    candidates.push_back({searched_plan(profile, options, penalty), label.str()});
  }
  for (double cap : {0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 1e6}) {
    for (double first : {1.0, cap}) {
      if (first == 1.0 && cap <= 1.0) continue;  // the same as first == cap
      candidates.push_back({scaling::plan_for_cap(profile, cap, first), cap_label(cap, first)});
    }
  }
  BucketPlan best;
  double best_ms = std::numeric_limits<double>::infinity();
  for (const Candidate& c : candidates) {
    scaling::StepPrediction p = scaling::simulate_step(profile, c.plan, options);
    if (p.step_ms < best_ms - 1e-9) {  // strictly better: ties keep the earlier candidate
      best_ms = p.step_ms;
      best.buckets = to_parameter_plan(profile, c.plan);
      best.prediction = p;
      best.chosen = c.label;
    }
  }
  return best;
}

void check_bucket_plan(const std::vector<std::vector<int64_t>>& plan, const std::vector<Tensor>& params) {
  std::vector<int> count(params.size(), 0);
  for (size_t b = 0; b < plan.size(); ++b) {
    TANDEM_CHECK_AS(ValueError, !plan[b].empty(), "bucket plan: bucket ", b, " is empty");
    for (int64_t i : plan[b]) {
      TANDEM_CHECK_AS(ValueError, i >= 0 && i < static_cast<int64_t>(params.size()), "bucket plan: bucket ", b,
                      " names parameter ", i, "; expected 0 to ", params.size() - 1);
      TANDEM_CHECK_AS(ValueError, params[i].dtype() == params[plan[b].front()].dtype(), "bucket plan: bucket ", b,
                      " mixes dtypes (parameter ", i, " is ", dtype_name(params[i].dtype()), ", parameter ",
                      plan[b].front(), " is ", dtype_name(params[plan[b].front()].dtype()),
                      "); expected one dtype per bucket");
      ++count[i];
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    TANDEM_CHECK_AS(ValueError, count[i] == 1, "bucket plan: parameter ", i, " appears ", count[i],
                    " times; expected every parameter exactly once");
  }
}

BucketPlan decide_bucket_plan(const StepProfile& profile, const SimulationOptions& options, ProcessGroup& group) {
  BucketPlan plan;
  std::vector<int64_t> flat;  // [buckets, size of each, parameter indices...]
  if (group.rank() == 0) {
    plan = plan_buckets(profile, options);
    flat.push_back(static_cast<int64_t>(plan.buckets.size()));
    for (const auto& b : plan.buckets) flat.push_back(static_cast<int64_t>(b.size()));
    for (const auto& b : plan.buckets) flat.insert(flat.end(), b.begin(), b.end());
  }
  Tensor length = from_vector(std::vector<int64_t>{static_cast<int64_t>(flat.size())});  // (1,)
  group.broadcast(length, 0)->synchronize();
  Tensor data = group.rank() == 0 ? from_vector(flat) : empty({length.item<int64_t>()}, DType::i64);  // (length,)
  group.broadcast(data, 0)->synchronize();
  if (group.rank() == 0) return plan;

  flat = data.to_vector<int64_t>();
  size_t count = static_cast<size_t>(flat.at(0)), next = 1 + count;
  std::map<int64_t, int64_t> position;  // parameter index -> index into this rank's profile
  for (size_t i = 0; i < profile.gradients.size(); ++i)
    position[profile.gradients[i].param_index] = static_cast<int64_t>(i);
  ProfilePlan mine;
  for (size_t b = 0; b < count; ++b) {
    std::vector<int64_t> params(flat.begin() + next, flat.begin() + next + flat.at(1 + b));
    next += params.size();
    std::vector<int64_t> local;
    for (int64_t p : params) {
      TANDEM_CHECK_AS(ValueError, position.count(p), "decide_bucket_plan: rank 0's plan names parameter ", p,
                      ", which rank ", group.rank(), "'s profile does not have; every rank must build the same model");
      local.push_back(position[p]);
    }
    plan.buckets.push_back(std::move(params));
    mine.push_back(std::move(local));
  }
  plan.prediction = scaling::simulate_step(profile, mine, options);
  plan.chosen = "rank 0's plan";
  return plan;
}

}  // namespace tandem::dist
