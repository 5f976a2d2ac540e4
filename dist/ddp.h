#pragma once
// DistributedDataParallel: data-parallel training of a Module over the ranks of a World.
//
// At construction every rank's parameters are checked to be the same (names, shapes, dtypes) and
// parameters and buffers are broadcast from rank 0. Gradients live as views into flat bucket
// buffers: parameters are assigned to buckets in reverse registration order (the order backward
// produces their gradients), one dtype per bucket, up to bucket_cap_mb (the first bucket capped
// at first_bucket_mb so communication starts early). Each parameter's gradient-ready hook
// (autograd/node.h) counts its bucket down and notes a gradient that arrived outside its slot; a
// complete bucket moves those into its slots (one copy_each_) and launches its all-reduce right
// away on the communication stream, in bucket order on every rank. When backward ends, the compute stream waits on the
// buckets' completion events — the host never blocks. Averaging happens in the collective.
// In a world of one at zero_stage 0 without comm_dtype the averages are the gradients themselves:
// they stay where backward puts them, and the buckets' collectives launch nothing (they still
// count for check_in_sync).
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "tandem/dist/process_group.h"
#include "tandem/layers/module.h"

namespace tandem::optim {
class Optimizer;
}

namespace tandem::dist {

class Timeline;

struct DdpOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  // Parameters that get no gradient in a backward are then reduced as zeros; when false (the
  // default) such a parameter is an error naming it.
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;    // rank 0's buffers (batch-norm statistics) at every forward
  std::optional<DType> comm_dtype;  // e.g. bf16: gradients travel in bf16, accumulate in their own dtype
  bool overlap = true;              // false: launch every bucket after backward (for scaling studies)
  // The last bucket to complete (in a GPT, the tied embedding's gradient, ready only when backward
  // ends) is still in flight when backward returns; ddp.step(optimizer) updates every other
  // parameter while it travels, then waits and updates the rest. With this on, step through
  // ddp.step(optimizer), and call ddp.wait_for_gradients() before anything else that reads every
  // gradient (clip_grad_norm_, a GradScaler: those cannot overlap the step).
  bool overlap_optimizer = false;
  // Every this many synchronised backwards (1: every step; 0: never) the ranks compare the
  // collectives they issued (ProcessGroup::check_in_sync, one small host-side all-gather) before
  // the optimizer can consume the reduced gradients; a rank that issued another collective, skipped
  // a bucket or reduced another size or dtype stops every rank with an error naming both sides.
  int64_t check_collectives_every = 1;
  // Every this many synchronised steps (0: never), at the next forward, the ranks compare a hash of
  // every parameter (dist/parameter_check.h); a mismatch names the first parameter that differs,
  // the step, the ranks and the largest difference.
  int64_t check_parameters_every = 0;
  // ZeRO (dist/zero.h): 0 is plain DDP. 1 and 2 are for a dist::ZeroRedundancyOptimizer made over
  // this DDP: the buckets of a dtype, one after another, are its flat parameter space, padded at
  // the end so that each rank owns an equal, contiguous shard of it (shard_numel below). Stage 2
  // reduce-scatters each bucket as it completes (instead of the all-reduce): a rank keeps only its
  // shard of the averaged gradients, and the full bucket is released once its collective is done
  // (the parameters' .grad are then undefined until the next backward). comm_dtype and
  // overlap_optimizer are for stage 0 only.
  int zero_stage = 0;
  // An explicit plan (dist/bucket_plan.h: plan_buckets, decide_bucket_plan): parameter indices in
  // registration order, bucket by bucket in launch order, each parameter once, one dtype per
  // bucket. It must be the same on every rank. Empty: buckets from bucket_cap_mb/first_bucket_mb.
  std::vector<std::vector<int64_t>> bucket_plan;
};

// What the last synchronised backward did. On GPUs the times come from CUDA events and are read
// lazily (stats() synchronises with the step they describe).
struct DdpStats {
  int64_t buckets = 0;
  int64_t bytes = 0;              // bytes all-reduced (in the communication dtype)
  double comm_ms = 0;             // time the collectives took on the communication stream
  double exposed_ms = 0;          // time from the end of backward to the end of communication
  double hidden_fraction = 0;     // 1 - exposed / comm, clamped to [0, 1]
  // For each bucket: how many parameter gradients had been produced when it was launched (out of
  // the total). A first bucket launched before the last gradient is overlap, not an assumption.
  std::vector<int64_t> launched_after_gradients;
  int64_t total_gradients = 0;
};

// The share of a collective's time that other work hid: 1 - exposed / comm, clamped to [0, 1].
inline double hidden_fraction(double comm_ms, double exposed_ms) {
  const double hidden = comm_ms > 0 ? 1.0 - exposed_ms / comm_ms : 0.0;
  return hidden < 0 ? 0.0 : (hidden > 1 ? 1.0 : hidden);
}

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Broadcasts buffers if asked, readies the buckets, and runs the module.
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }
  nn::Module& module() { return *module_; }
  std::shared_ptr<nn::Module> module_ptr() { return module_; }
  ProcessGroup& group() { return *group_; }

  // While alive, backward accumulates gradients locally without communicating (gradient
  // accumulation); the next backward outside it reduces the accumulated sums.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp), previous_(ddp.sync_enabled_) { ddp.sync_enabled_ = false; }
    ~NoSync() { ddp_.sync_enabled_ = previous_; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // opt.step() with the last bucket's communication overlapped by the update of the others when
  // overlap_optimizer is on (plain opt.step() otherwise). The result is the same.
  void step(optim::Optimizer& opt);
  // Makes the compute stream wait for every gradient (a no-op unless a bucket was left in flight
  // by overlap_optimizer).
  void wait_for_gradients();

  const DdpStats& stats();
  // While `timeline` records (dist/timeline.h), each bucket's all-reduce and the compute stream's
  // wait for them at the end of backward go into it. nullptr (the default) turns this off.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }
  // Bytes the gradient buckets hold now. Stage 0 and 1 hold every bucket all the time; stage 2
  // holds a bucket from its first gradient in backward until its reduce-scatter is done.
  int64_t bucket_bytes_held() const;
  // The bucket plan: parameter indices (registration order) per bucket, in launch order.
  std::vector<std::vector<int64_t>> bucket_plan() const;

  // ---- what a ZeroRedundancyOptimizer over this DDP uses ----
  const DdpOptions& options() const { return options_; }
  const std::vector<Tensor>& parameters() const { return params_; }  // those that require grad, in order
  // Where bucket b (launch order) keeps each of its parameters: element offsets in the flat,
  // padded bucket of `bucket_numel(b)` elements.
  std::vector<int64_t> bucket_offsets(size_t bucket) const;
  int64_t bucket_numel(size_t bucket) const;
  // ZeRO's shard rule (zero_stage 1, 2): the buckets of each dtype, in launch order, make that
  // dtype's flat parameter space, padded at its end to a multiple of the world size; rank r owns
  // the contiguous elements [r * shard_numel, (r + 1) * shard_numel) of it.
  int64_t shard_numel(DType dtype) const;
  int64_t bucket_flat_offset(size_t bucket) const;  // where bucket b starts in its dtype's space
  // (world size,) how many of bucket b's elements lie in each rank's shard (they follow in rank order).
  std::vector<int64_t> bucket_shard_counts(size_t bucket) const;
  // The part of bucket b's averaged gradient that lies in this rank's shard
  // (bucket_shard_counts(b)[rank] elements, maybe 0): a view of the bucket (stage 1) or of this
  // rank's gradient shard, which the reduce-scatters write (stage 2). Valid for the life of this
  // DDP; its content is this step's once backward has finished.
  Tensor gradient_shard(size_t bucket) const;
  // Called at the start of every forward (ZeRO waits there for the parameters' all-gathers).
  void set_before_forward(std::function<void()> callback) { before_forward_ = std::move(callback); }
  // A world of one without comm_dtype: the averaged gradients are the parameters' own .grad
  // (backward's tensors, not bucket views), and gradient_shard() holds nothing. At the end of each
  // synchronised backward `after_backward` is called while they are still set; under zero_stage 2
  // they are dropped after it.
  bool gradients_in_place() const { return gradients_in_place_; }
  void set_after_backward(std::function<void()> callback) { after_backward_ = std::move(callback); }

 private:
  struct Bucket;
  void check_same_model_everywhere();
  void coalesce_buffers();
  bool buffers_coalesced() const;
  void build_buckets();
  void attach_gradient_views(bool zero);
  void on_gradient(int64_t param_index);
  void launch_ready_buckets();
  void move_arrived_into_slots(Bucket& bucket);  // Bucket::arrived, before it launches
  void launch(Bucket& bucket);
  void finish_backward();
  void broadcast_from_rank0(const std::vector<Tensor>& tensors, const std::string& label);
  void allocate(Bucket& bucket);
  void lay_out_shards();
  int64_t block_start(const Bucket& bucket) const;  // where this rank's block starts in the bucket
  Tensor my_block(const Tensor& shard, const Bucket& bucket) const;  // that block's place in a (shard,) tensor
  void check_zero_bucket(size_t bucket) const;
  Tensor slot(const Bucket& bucket, size_t k) const;  // parameter k's gradient view in the bucket
  // Each gradient slot (and, under ZeRO, each parameter in the flat space) starts on a
  // 256-byte boundary, as the parameters did in their own allocations: GEMM libraries choose
  // their kernels by pointer alignment, so packed but misaligned weights would run other (slower,
  // differently rounded) kernels. The gaps cost under 256 bytes per parameter.
  static constexpr size_t kSlotAlignmentBytes = 256;
  static int64_t slot_alignment(DType dtype);    // in elements
  int64_t next_slot(const Bucket& bucket) const;  // where the next slot after the bucket's last would start

  std::shared_ptr<nn::Module> module_;
  DdpOptions options_;
  ProcessGroup* group_ = nullptr;
  Device device_;
  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::map<DType, int64_t> shard_numel_;     // ZeRO: per dtype, the elements of each rank's shard
  std::map<DType, Tensor> gradient_shards_;  // zero_stage 2: per dtype, (shard_numel,) this rank's averaged gradients
  // The module's buffers (batch-norm statistics), re-pointed at views of one flat tensor per
  // dtype, so the broadcast before each forward is one collective per dtype, not one per buffer.
  std::vector<Tensor> buffers_;       // the module's buffer handles, in order
  std::vector<Tensor> flat_buffers_;  // (total elements of that dtype,) each
  std::vector<void*> buffer_data_;    // where each buffer's data was put, to notice a module moved since
  std::vector<int64_t> bucket_of_;   // param index -> bucket
  std::vector<bool> ready_;          // param index -> gradient produced this backward
  int64_t gradients_seen_ = 0;
  size_t next_to_launch_ = 0;
  Bucket* in_flight_ = nullptr;  // the bucket overlap_optimizer left in flight after backward
  bool sync_enabled_ = true;
  // A world of one with no comm_dtype: every all-reduce (reduce-scatter) is the identity, so the
  // gradients stay where backward puts them (as without DDP); the collectives still count.
  bool gradients_in_place_ = false;
  int64_t steps_ = 0;  // synchronised backwards so far; the current one's number while it runs
  int64_t parameters_checked_at_ = 0;
  bool backward_active_ = false;
  DdpStats stats_;
  bool stats_pending_ = false;
  struct Timing;
  std::unique_ptr<Timing> timing_;
  Timeline* timeline_ = nullptr;
  std::function<void()> before_forward_;
  std::function<void()> after_backward_;
  // The hooks on the parameters reach this object through here; the destructor clears it, so a
  // module that outlives its DDP wrapper never calls into freed memory.
  std::shared_ptr<DistributedDataParallel*> self_;
};

// Shards dataset indices across ranks, reshuffled each epoch from a seed shared by all ranks.
// Every rank gets the same number of indices: padded by repeating the first ones (or, with
// drop_last, the tail is dropped), so no rank runs an extra step and no collective hangs.
class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world_size, bool shuffle = true, uint64_t seed = 0,
                     bool drop_last = false);
  std::vector<int64_t> indices(int64_t epoch) const;
  int64_t num_samples() const { return num_samples_; }
  // How many of this rank's num_samples() are real samples rather than padding (repeats added so
  // every rank has as many); they come first in indices(). Evaluation counts only these.
  int64_t num_real_samples() const;

 private:
  int64_t dataset_size_;
  int rank_, world_size_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
};

}  // namespace tandem::dist
