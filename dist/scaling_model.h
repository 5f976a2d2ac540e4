#pragma once
// A model of one data-parallel training step on N GPUs, built from one GPU's step profile and a
// link model, used to predict scaling past the machines at hand and to choose DDP's buckets
// (dist/bucket_plan.h).
//
// The step on N GPUs is replayed bucket by bucket: the backward pass produces the gradients at the
// times the profile measured, a bucket's collective is launched when its last gradient is ready
// (in bucket order, as DDP launches them) and the collectives run one after another on one
// communication stream. The step then costs, beyond the 1-GPU step: the wait for gradients after
// backward (exposed communication), the compute slowed down while NCCL kernels share the GPU (and
// the collectives slowed by the compute beside them), a fixed cost per bucket and a share of the
// step for synchronisation. Collective times follow nccl-tests' bus
// bandwidth definitions: an all-reduce of S bytes on N ranks moves 2 (N-1)/N S bytes over the
// slowest link, a reduce-scatter or all-gather (N-1)/N S.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::dist::scaling {

// One parameter's gradient as the buckets see it.
struct GradientReady {
  int64_t param_index = 0;  // registration order (DdpOptions::bucket_plan uses these)
  std::string name;
  int64_t numel = 0;
  int64_t element_bytes = 0;  // of the gradient's own dtype (2 for bf16, 4 for f32)
  double ready_ms = 0;        // from the start of backward until its gradient was accumulated
};

// One step on one device, e.g. written by `train_step --profile`.
struct StepProfile {
  std::string workload, precision, device, commit, source;
  double step_ms = 0;  // the whole step (median of timed steps): the 1-GPU reference
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
  std::vector<GradientReady> gradients;  // in the order backward produced them
  int64_t gradient_bytes() const;
  // Whatever of the step is not forward, backward or optimizer (zero_grad, launch gaps).
  double other_ms() const;
};

// One level of links: the bus bandwidth a collective reaches over it, and the latency of a hop.
struct LinkLevel {
  double busbw_GBps = 0;  // nccl-tests' bus bandwidth at large sizes, GB/s (1e9 bytes)
  double hop_us = 0;      // latency added by each step of a ring (or level of a tree) over it
};

// GPUs per host on NVLink (or PCIe), hosts joined by a network.
struct Topology {
  std::string name;
  int gpus_per_host = 8;
  LinkLevel intra;              // inside a host
  LinkLevel inter;              // between hosts: bus bandwidth of the host's NICs together
  double base_us = 0;           // a collective's fixed cost (kernel launch, protocol setup)
  double tree_bw_factor = 0.9;  // NCCL's tree reaches about this share of the ring's bandwidth
};

// Names: "h200x4" (the project's measured hosts: 4 H200s on NVLink), "nvlink<G>" (one host of G),
// "nvlink<G>-ib<K>x<Gbps>" (G GPUs per host, K InfiniBand NICs of Gbps each per host),
// "nvlink<G>-eth<K>x<Gbps>" or "nvlink<G>-eth<Gbps>" (Ethernet). Throws ValueError otherwise.
Topology topology_from_name(const std::string& name);

enum class Algorithm { automatic, ring, tree };
enum class CollectiveKind { all_reduce, reduce_scatter, all_gather };

// One collective of `bytes` (the full buffer, as nccl-tests counts it) on `gpus` ranks.
double collective_ms(CollectiveKind kind, double bytes, int gpus, const Topology& topo,
                     Algorithm algorithm = Algorithm::automatic);

// A bucket's collective under ZeRO `zero_stage` as DDP runs it: stage 2 reduce-scatters, stages 0
// and 1 all-reduce (stage 1 shards only the optimizer state).
CollectiveKind bucket_collective(int zero_stage);

// The model's free parameters: the defaults are docs/scaling/model_parameters.json, fitted by
// bench/scaling_model --calibrate on two named runs of 2026-11-24 (2 H200s, the code of 7ddbcbb).
struct ModelParameters {
  double compute_slowdown = 0.55;  // compute time added per ms of communication running beside it
  double bucket_overhead_us = 10;  // per bucket, beyond the collective's own base: cast, events, hooks
  // The step on several GPUs is also longer by this share of the 1-GPU step, whatever the
  // buckets: every collective makes the ranks wait for the slowest one, and DDP adds its own work
  // (hooks, copies of gradients into buckets). Measured, not derived: see the README.
  double sync_share = 0.02;
  // A collective running beside backward's kernels is slowed too (fewer SMs, shared memory
  // bandwidth): the part of it that runs beside them takes (1 + comm_slowdown) times as long.
  double comm_slowdown = 0.4;
};

struct SimulationOptions {
  int gpus = 2;
  Topology topology;
  ModelParameters parameters;
  bool overlap = true;             // buckets launched during backward (false: all after it)
  bool overlap_optimizer = true;   // the last bucket travels while the other parameters update
  int64_t comm_element_bytes = 0;  // bytes per gradient element on the wire; 0: the gradient's own
  int zero_stage = 0;  // 1, 2: the optimizer on a shard, parameters all-gathered; 2: buckets reduce-scattered
  Algorithm algorithm = Algorithm::automatic;
};

// A bucket plan: indices into StepProfile::gradients, bucket by bucket in launch order.
using ProfilePlan = std::vector<std::vector<int64_t>>;

struct StepPrediction {
  double step_ms = 0;      // predicted N-GPU step
  double compute_ms = 0;   // the 1-GPU step it starts from
  double exposed_ms = 0;   // waits for communication after backward and inside the optimizer
  double slowdown_ms = 0;  // compute stretched by collectives running beside it
  double overhead_ms = 0;  // the synchronisation share of the step (ModelParameters::sync_share)
  double comm_ms = 0;      // the collectives' own time, summed
  int64_t buckets = 0;
  int64_t bytes = 0;  // on the wire per step
  double efficiency() const { return step_ms > 0 ? compute_ms / step_ms : 0; }
  // What communication adds to the step: what the planner minimises.
  double communication_cost_ms() const { return step_ms - compute_ms; }
};

StepPrediction simulate_step(const StepProfile& profile, const ProfilePlan& plan, const SimulationOptions& options);

// DDP's own plan for a cap, as DistributedDataParallel builds it: one open bucket per dtype, filled
// in backward order, the first capped at first_mb, launched in the order they complete.
ProfilePlan plan_for_cap(const StepProfile& profile, double cap_mb, double first_mb = 1.0);

}  // namespace tandem::dist::scaling
