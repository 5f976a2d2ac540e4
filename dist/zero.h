#pragma once
// ZeRO stages 1 and 2 (as DeepSpeed's ZeRO and PyTorch's ZeroRedundancyOptimizer): the optimizer
// state that data parallelism replicates is split across ranks.
//
//   dist::DdpOptions ddp_options;
//   ddp_options.zero_stage = 2;                      // or 1
//   dist::DistributedDataParallel ddp(model, ddp_options);
//   dist::ZeroRedundancyOptimizer opt(ddp, std::make_unique<optim::AdamW>(model->parameters(), adamw));
//   ... ddp(x), loss.backward(), opt.step() (or scaler.step(opt)), opt.zero_grad() as with any optimizer.
//
// The shard rule. DDP's gradient buckets of one dtype, one after another in backward order, are
// that dtype's flat parameter space, padded at its end to a multiple of the world size N; rank r
// owns the contiguous r-th 1/N of it (shard_range), as DeepSpeed's partitions. The parameters
// become views of one flat tensor per dtype (flat_parameters). The wrapped optimizer is given, in
// place of each parameter, the piece of it that falls into this rank's shard, so its state
// (moments, f32 master weights, momentum, step counts) exists only for them and its fused kernels
// update only them; hyper-parameters, groups and schedules stay the optimizer's own. A bucket
// holds a block of one rank's shard or of a few neighbouring ones: its collectives move blocks of
// different sizes (ProcessGroup::reduce_scatter_v, all_gather_v).
//
// Stage 1: gradients are all-reduced as in DDP; each rank updates its shard. Stage 2: each bucket
// is reduce-scattered as it completes during backward (each block reduced onto its owner), so a
// rank only ever holds its shard of the averaged gradients (a full bucket lives from its first
// gradient to its collective).
// In a world of one (no comm_dtype) the collectives move nothing: the pieces' gradients are views
// of the parameters' own, taken at the end of each backward, and the update is one fused call.
//
// Overlap: step() updates this rank's shard bucket by bucket and launches each bucket's parameter
// all-gather (in bucket order, on every rank) as soon as its block is updated, so the gathers
// travel while the following blocks are updated, and the last ones while the host readies the
// next batch. The compute stream (CPU: the host) waits for them at the next ddp.forward(), or at
// wait_for_parameters(); stats() and the timeline say how much of the gather time was hidden.
//
// GradScaler: scaler.step(opt) checks this rank's shard of the gradients; step() takes the max of
// the found-inf flag over every rank (on the device) before updating, so all ranks skip together.
// Clipping: opt.clip_grad_norm_(max_norm) is the norm over the whole model (shards' squared norms
// all-reduced), as optim::clip_grad_norm_ over every parameter would give.
// Checkpoints: state_dict() is collective and returns the unsharded state (the same keys, shapes
// and numbering as the wrapped optimizer would have without ZeRO); load_state_dict() takes such a
// state, from a run at any world size, and keeps this rank's pieces.
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "tandem/dist/ddp.h"
#include "tandem/optim/optimizer.h"

namespace tandem::dist {

// What the last step's parameter all-gathers did. On GPUs the times come from CUDA events and are
// read lazily (stats() synchronises with the step they describe).
struct ZeroStats {
  int64_t gathers = 0;          // all-gathers (one per bucket)
  int64_t bytes = 0;            // bytes gathered (the full buckets)
  double gather_ms = 0;         // time the all-gathers took on the communication stream
  double exposed_ms = 0;        // time the next forward (or wait_for_parameters) waited for them
  double hidden_fraction = 0;   // 1 - exposed / gather, clamped to [0, 1]
};

class ZeroRedundancyOptimizer : public optim::Optimizer {
 public:
  // `optimizer` is built as usual over the model's parameters (any groups and hyper-parameters)
  // and not stepped yet; every parameter it holds must be one of ddp's. ddp must have been made
  // with DdpOptions::zero_stage 1 or 2.
  ZeroRedundancyOptimizer(DistributedDataParallel& ddp, std::unique_ptr<optim::Optimizer> optimizer);
  ~ZeroRedundancyOptimizer() override;

  const char* name() const override { return inner_->name(); }
  int stage() const { return stage_; }
  // The wrapped optimizer (its groups now hold this rank's pieces).
  optim::Optimizer& optimizer() { return *inner_; }

  // Zeroes (or drops) the model's gradients; this rank's gradient shard is overwritten by the
  // next synchronised backward.
  void zero_grad(bool set_to_none = true) override;
  // clip_grad_norm_ over the whole model: every rank gets the same norm (0-dim, on the device).
  Tensor clip_grad_norm_(double max_norm);
  // Makes the compute stream (CPU: the host) wait for the last step's parameter all-gathers.
  void wait_for_parameters();

  // Collective (every rank calls it): the unsharded state.
  optim::StateDict state_dict() const override;
  // Takes an unsharded state (saved at any world size) and keeps this rank's part.
  void load_state_dict(const optim::StateDict& state) override;

  // This rank's shard of the flat parameter space of `dtype`: elements [first, second), the same
  // number on every rank.
  std::pair<int64_t, int64_t> shard_range(DType dtype) const;
  // That flat space (padded): every parameter of the dtype is a view of it.
  Tensor flat_parameters(DType dtype) const;
  // This rank's optimizer state in bytes: moments, momentum, master weights and step counts.
  int64_t optimizer_state_bytes() const;
  const ZeroStats& stats();
  // While `timeline` records, each all-gather and the wait for them go into it.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }

 protected:
  void step_impl(const optim::StepScaling* scaling, const std::function<bool(const Tensor&)>* include) override;
  void update(optim::ParamGroup& group, const std::vector<Item>& items, const optim::StepScaling* scaling) override {
    inner_->update(group, items, scaling);
  }
  void check_group(const optim::ParamGroup& group) const override { inner_->check_group(group); }
  std::vector<std::string> state_names() const override { return inner_->state_names(); }
  bool counts_steps() const override { return inner_->counts_steps(); }
  std::vector<std::pair<std::string, double>> hyper_parameters(const optim::ParamGroup& group) const override {
    return inner_->hyper_parameters(group);
  }
  void set_hyper_parameter(optim::ParamGroup& group, const std::string& name, double value) const override {
    inner_->set_hyper_parameter(group, name, value);
  }

 private:
  // The part of a parameter that lies in this rank's shard of its bucket.
  struct Piece {
    size_t bucket = 0;
    int64_t param = 0;     // index into ddp.parameters()
    int64_t start = 0;     // first element, within the parameter
    int64_t length = 0;
  };
  struct Timing;

  void make_flat_parameters();
  void make_pieces();
  // A world of one: each piece's gradient becomes a view of its parameter's own .grad.
  void take_parameter_gradients();

  DistributedDataParallel& ddp_;
  std::unique_ptr<optim::Optimizer> inner_;
  int stage_ = 1;
  ProcessGroup* group_ = nullptr;
  std::map<DType, Tensor> flat_spaces_;      // per dtype: (N * shard,) the flat parameter space
  std::vector<Tensor> flat_params_;          // per bucket: (numel,) its view of the flat space
  std::vector<std::vector<int64_t>> shard_counts_;  // per bucket: (N,) its elements in each rank's shard
  std::vector<int64_t> block_begin_;         // per bucket: where this rank's block starts in it
  std::vector<std::vector<Tensor>> full_;    // per group: the parameters it was given
  std::vector<std::vector<Piece>> pieces_;   // per group: what its params now are
  std::unordered_map<const void*, size_t> bucket_of_piece_;  // piece data -> bucket
  std::vector<std::shared_ptr<Work>> gathers_;                // per bucket, in flight
  bool gathers_pending_ = false;
  ZeroStats stats_;
  bool stats_pending_ = false;
  std::unique_ptr<Timing> timing_;
  Timeline* timeline_ = nullptr;
  std::shared_ptr<ZeroRedundancyOptimizer*> self_;  // reached by ddp's before-forward callback
};

}  // namespace tandem::dist
