#include "tandem/dist/scaling_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <regex>

#include "tandem/core/error.h"

namespace tandem::dist::scaling {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

// Published or measured figures behind the named topologies (README, "Scaling past this machine"):
// - NVLink on H200/H100 hosts: the project's bench/allreduce on 2 and 4 H200s (2026-11-22) reached
//   329-336 GB/s of bus bandwidth at 256 MiB-1 GiB; 330 is used.
// - A hop's latency: about 1 us on NVLink, 4 us over InfiniBand and 10 us over Ethernet (RoCE), the
//   order of the figures NCCL's own tuning model assumes.
// - A collective's base cost, 44 us: bench/allreduce on 2 H200s (2026-11-24, NCCL 2.28, tandem's
//   group) fits 46 us + bytes at 315 GB/s over 2-128 MiB (least squares on relative error), less
//   the two NVLink ring steps of 1 us (raw ncclAllReduce: 38 us; tandem's group adds about 8 us
//   from 2 MiB up, 54 us at 1 MiB).
// - NICs reach about 92% (InfiniBand) or 85% (Ethernet) of their line rate in nccl-tests.
constexpr double kBaseUs = 44.0;

LinkLevel nvlink_h200() { return {330.0, 1.0}; }

LinkLevel network(int nics, double gbps, bool infiniband) {
  double line_GBps = nics * gbps / 8.0;
  return {line_GBps * (infiniband ? 0.92 : 0.85), infiniband ? 4.0 : 10.0};
}

}  // namespace

int64_t StepProfile::gradient_bytes() const {
  int64_t total = 0;
  for (const GradientReady& g : gradients) total += g.numel * g.element_bytes;
  return total;
}

double StepProfile::other_ms() const { return std::max(0.0, step_ms - forward_ms - backward_ms - optimizer_ms); }

Topology topology_from_name(const std::string& name) {
  Topology t;
  t.name = name;
  t.base_us = kBaseUs;
  t.intra = nvlink_h200();
  if (name == "h200x4") {
    t.gpus_per_host = 4;
    t.inter = network(4, 400, true);  // not measured: the project's hosts were used one at a time
    return t;
  }
  std::smatch m;
  static const std::regex pattern(R"(nvlink(\d+)(?:-(ib|eth)(?:(\d+)x)?(\d+))?)");
  TANDEM_CHECK_AS(ValueError, std::regex_match(name, m, pattern), "unknown topology '", name,
                  "': expected h200x4, nvlink<G>, nvlink<G>-ib<K>x<Gbps> or nvlink<G>-eth[<K>x]<Gbps> "
                  "(e.g. nvlink8-ib8x400, nvlink8-eth100)");
  t.gpus_per_host = std::stoi(m[1].str());
  TANDEM_CHECK_AS(ValueError, t.gpus_per_host >= 1 && t.gpus_per_host <= 72, "topology '", name,
                  "': GPUs per host must be 1 to 72, got ", t.gpus_per_host);
  if (m[2].matched) {
    int nics = m[3].matched ? std::stoi(m[3].str()) : 1;
    double gbps = std::stod(m[4].str());
    TANDEM_CHECK_AS(ValueError, nics >= 1 && gbps > 0, "topology '", name,
                    "': expected at least one NIC of a positive rate");
    t.inter = network(nics, gbps, m[2].str() == "ib");
  } else {
    t.inter = {0.0, 0.0};  // one host only
  }
  return t;
}

double collective_ms(CollectiveKind kind, double bytes, int gpus, const Topology& topo, Algorithm algorithm) {
  TANDEM_CHECK_AS(ValueError, gpus >= 1, "collective_ms: expected at least 1 GPU, got ", gpus);
  if (gpus == 1) return 0.0;
  const int per_host = std::min(gpus, topo.gpus_per_host);
  const int hosts = (gpus + topo.gpus_per_host - 1) / topo.gpus_per_host;
  TANDEM_CHECK_AS(ValueError, hosts == 1 || topo.inter.busbw_GBps > 0, "topology '", topo.name, "' is one host of ",
                  topo.gpus_per_host, " GPUs; ", gpus, " GPUs need a network (e.g. nvlink8-ib8x400)");
  // The slowest link bounds the bus bandwidth: across hosts, the host's NICs carry what its GPUs'
  // rings send out of it.
  double busbw = hosts == 1 ? topo.intra.busbw_GBps : std::min(topo.intra.busbw_GBps, topo.inter.busbw_GBps);
  double factor = kind == CollectiveKind::all_reduce ? 2.0 * (gpus - 1) / gpus : double(gpus - 1) / gpus;
  double passes = kind == CollectiveKind::all_reduce ? 2.0 : 1.0;  // reduce then broadcast
  double bandwidth_us = bytes * factor / (busbw * 1e3);            // GB/s = 1e3 bytes/us
  // A ring visits every rank: N - 1 steps per pass, hosts of them over the network.
  double inter_hops = hosts > 1 ? hosts : 0;
  double ring_us = topo.base_us +
                   passes * ((gpus - 1 - inter_hops) * topo.intra.hop_us + inter_hops * topo.inter.hop_us) +
                   bandwidth_us;
  // A tree: a chain inside each host, a binary tree across hosts (only all-reduce has one in NCCL).
  double tree_us = topo.base_us +
                   passes * ((per_host - 1) * topo.intra.hop_us + std::ceil(std::log2(hosts)) * topo.inter.hop_us) +
                   bandwidth_us / topo.tree_bw_factor;
  bool tree_allowed = kind == CollectiveKind::all_reduce;
  double us = ring_us;
  if (algorithm == Algorithm::tree && tree_allowed) us = tree_us;
  if (algorithm == Algorithm::automatic && tree_allowed) us = std::min(ring_us, tree_us);
  return us / 1e3;
}

CollectiveKind bucket_collective(int zero_stage) {
  return zero_stage == 2 ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce;
}

ProfilePlan plan_for_cap(const StepProfile& profile, double cap_mb, double first_mb) {
  TANDEM_CHECK_AS(ValueError, cap_mb > 0 && first_mb > 0, "plan_for_cap: caps must be positive, got ", cap_mb, " and ",
                  first_mb, " MB");
  // DDP fills buckets in reverse registration order, one open bucket per dtype.
  std::vector<int64_t> order(profile.gradients.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return profile.gradients[a].param_index > profile.gradients[b].param_index;
  });
  struct Open {
    std::vector<int64_t> members;
    double bytes = 0;
    int64_t completes_at = 0;
  };
  std::vector<Open> closed;
  std::map<int64_t, Open> open;  // element bytes stands for the dtype
  for (size_t position = 0; position < order.size(); ++position) {
    const GradientReady& g = profile.gradients[order[position]];
    double cap = (closed.empty() ? first_mb : cap_mb) * kMiB;
    double bytes = double(g.numel * g.element_bytes);
    Open& current = open[g.element_bytes];
    if (!current.members.empty() && current.bytes + bytes > cap) {
      closed.push_back(std::move(current));
      current = Open{};
    }
    current.members.push_back(order[position]);
    current.bytes += bytes;
    current.completes_at = static_cast<int64_t>(position);
  }
  for (auto& [bytes, b] : open) {
    if (!b.members.empty()) closed.push_back(std::move(b));
  }
  std::stable_sort(closed.begin(), closed.end(),
                   [](const Open& a, const Open& b) { return a.completes_at < b.completes_at; });
  ProfilePlan plan;
  for (Open& b : closed) plan.push_back(std::move(b.members));
  return plan;
}

StepPrediction simulate_step(const StepProfile& profile, const ProfilePlan& plan, const SimulationOptions& options) {
  TANDEM_CHECK_AS(ValueError, profile.step_ms > 0 && profile.backward_ms > 0, "simulate_step: the profile of '",
                  profile.workload, "' has no step or backward time (step ", profile.step_ms, " ms, backward ",
                  profile.backward_ms, " ms)");
  StepPrediction out;
  out.compute_ms = profile.step_ms;
  out.step_ms = profile.step_ms;
  if (options.gpus <= 1) return out;
  const ModelParameters& par = options.parameters;
  const int n = options.gpus;

  struct SimBucket {
    double ready_ms = 0;     // on the 1-GPU backward's clock
    double cost_ms = 0;      // on the communication stream
    double param_share = 0;  // of the optimizer's work (by elements)
  };
  std::vector<SimBucket> buckets;
  std::vector<bool> seen(profile.gradients.size(), false);
  int64_t total_numel = 0;
  for (const GradientReady& g : profile.gradients) total_numel += g.numel;
  for (const std::vector<int64_t>& members : plan) {
    TANDEM_CHECK_AS(ValueError, !members.empty(), "simulate_step: the plan has an empty bucket");
    SimBucket b;
    double wire_bytes = 0;
    for (int64_t i : members) {
      TANDEM_CHECK_AS(ValueError, i >= 0 && i < static_cast<int64_t>(profile.gradients.size()) && !seen[i],
                      "simulate_step: gradient ", i, " is outside the profile's ", profile.gradients.size(),
                      " gradients or in two buckets");
      seen[i] = true;
      const GradientReady& g = profile.gradients[i];
      b.ready_ms = std::max(b.ready_ms, g.ready_ms);
      wire_bytes +=
          double(g.numel) * double(options.comm_element_bytes > 0 ? options.comm_element_bytes : g.element_bytes);
      b.param_share += double(g.numel) / double(std::max<int64_t>(total_numel, 1));
    }
    CollectiveKind kind = bucket_collective(options.zero_stage);
    b.cost_ms = par.bucket_overhead_us / 1e3 + collective_ms(kind, wire_bytes, n, options.topology, options.algorithm);
    out.bytes += static_cast<int64_t>(wire_bytes);
    buckets.push_back(b);
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    TANDEM_CHECK_AS(ValueError, seen[i], "simulate_step: gradient ", i, " (", profile.gradients[i].name,
                    ") is in no bucket of the plan");
  }
  out.buckets = static_cast<int64_t>(buckets.size());

  // Backward stretches by the collectives running beside it, which in turn start later: a few
  // rounds of fixed-point iteration settle it.
  const double backward = profile.backward_ms;
  double stretched = backward;
  std::vector<double> end(buckets.size()), duration(buckets.size());
  for (int round = 0; round < 6; ++round) {
    double scale = stretched / backward, t = 0, launched = 0, beside = 0;
    for (size_t k = 0; k < buckets.size(); ++k) {
      launched = std::max(launched, options.overlap ? buckets[k].ready_ms * scale : stretched);  // in bucket order
      double start = std::max(t, launched);
      double cost = buckets[k].cost_ms, beside_room = stretched - start;
      if (beside_room > 0 && par.comm_slowdown > 0) {
        double slowed = cost * (1 + par.comm_slowdown);
        cost = slowed <= beside_room ? slowed : beside_room + (cost - beside_room / (1 + par.comm_slowdown));
      }
      t = start + cost;
      duration[k] = cost;
      end[k] = t;
      beside += std::max(0.0, std::min(t, stretched) - std::min(start, stretched));
    }
    stretched = backward + par.compute_slowdown * beside;
  }
  out.slowdown_ms = stretched - backward;
  for (double d : duration) out.comm_ms += d;

  // After backward: with overlap_optimizer the bucket that ends last is left in flight while the
  // other parameters update.
  double optimizer = profile.optimizer_ms;
  double comm_end = buckets.empty() ? 0 : end.back();
  double after_backward = 0;
  if (options.zero_stage > 0) {
    // As dist::ZeroRedundancyOptimizer does it: once every bucket is reduced, each rank updates its
    // shard bucket by bucket, and each bucket's parameters are all-gathered as soon as its shard is
    // updated, beside the update of the next ones; the next forward waits for the last gather.
    double wait = std::max(0.0, comm_end - stretched);
    double update_end = 0, gather_end = 0, gather = 0;
    std::vector<std::pair<double, double>> gathers;  // (start, end) on the communication stream
    for (size_t k = 0; k < plan.size(); ++k) {
      double bytes = 0;
      for (int64_t i : plan[k]) bytes += double(profile.gradients[i].numel * profile.gradients[i].element_bytes);
      update_end += optimizer * buckets[k].param_share / n;
      double cost =
          par.bucket_overhead_us / 1e3 + collective_ms(CollectiveKind::all_gather, bytes, n, options.topology);
      double start = std::max(gather_end, update_end);
      gather_end = start + cost;
      gather += cost;
      gathers.emplace_back(start, gather_end);
    }
    // The update slows down beside the gathers launched before it ends.
    double beside = 0;
    for (const auto& [start, stop] : gathers) beside += std::max(0.0, std::min(stop, update_end) - start);
    double slowed = par.compute_slowdown * beside;
    double gather_wait = std::max(0.0, gather_end - (update_end + slowed));
    out.slowdown_ms += slowed;
    out.exposed_ms = wait + gather_wait;
    out.comm_ms += gather;
    after_backward = wait + update_end + slowed + gather_wait;
  } else if (options.overlap_optimizer && buckets.size() > 1) {
    double before_last = end[end.size() - 2];
    double wait = std::max(0.0, before_last - stretched);
    double share = buckets.back().param_share;
    double others_done = stretched + wait + optimizer * (1 - share);
    double wait_last = std::max(0.0, comm_end - others_done);
    // The update of the others runs beside the last bucket's collective and slows down too.
    double beside = std::max(0.0, std::min(comm_end, others_done) - std::max(stretched + wait, end[end.size() - 2]));
    double slowed = par.compute_slowdown * beside;
    out.slowdown_ms += slowed;
    out.exposed_ms = wait + wait_last;
    after_backward = wait + optimizer * (1 - share) + slowed + wait_last + optimizer * share;
  } else {
    out.exposed_ms = std::max(0.0, comm_end - stretched);
    after_backward = out.exposed_ms + optimizer;
  }
  // Per-bucket costs sit on the communication stream (in cost_ms). The step is the measured 1-GPU
  // step plus what the replay adds to it: the profile's spans give the shape, not the total (spans
  // measured with markers can overlap and sum to more than the step itself).
  out.overhead_ms = par.sync_share * profile.step_ms;
  out.step_ms = profile.step_ms + (stretched - backward) + (after_backward - optimizer) + out.overhead_ms;
  return out;
}

}  // namespace tandem::dist::scaling
