#include "tandem/dist/ddp.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_set>
#include <sstream>

#include "tandem/autograd/grad_mode.h"
#include "tandem/autograd/node.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"
#include "tandem/dist/bucket_plan.h"
#include "tandem/dist/internal.h"
#include "tandem/dist/parameter_check.h"
#include "tandem/dist/timeline.h"
#include "tandem/optim/optimizer.h"

namespace tandem::dist {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string describe(const std::string& name, const Tensor& t) {
  std::ostringstream out;
  out << "'" << name << "' " << shape_str(t.shape()) << " " << t.dtype();
  return out.str();
}

double host_ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

struct DistributedDataParallel::Bucket {
  int64_t index = 0;             // position in launch order
  std::vector<int64_t> params;   // indices into params_, in the order they were placed
  std::vector<int64_t> offsets;  // element offset of each in buffer
  Tensor buffer;                 // (numel,) the gradients of its parameters, in their dtype
  Tensor comm;                   // (numel,) the buffer in the communication dtype while in flight
  Tensor shard;                  // (shard_counts[rank],) zero_stage 2: this rank's averaged block
  int64_t numel = 0;             // elements of buffer (ZeRO: the last bucket of a dtype holds its padding)
  int64_t flat_offset = 0;       // ZeRO: where the bucket starts in its dtype's flat parameter space
  std::vector<int64_t> shard_counts;  // ZeRO: (world size,) how many of its elements each rank's shard holds
  int64_t comm_bytes = 0;        // bytes of the last collective
  int64_t pending = 0;           // gradients still to come in this backward
  // buffer holds no gradients yet (they were all dropped, or it is new): each gradient is copied
  // into its slot as it arrives, rather than the bucket zeroed and every gradient added to zeros.
  bool stale = false;
  // Gradients of this backward that arrived outside their slots, with their slot's index: moved
  // in together (kernels::copy_each_) when the bucket launches, not one copy as each arrives.
  std::vector<std::pair<size_t, Tensor>> arrived;
  bool launched = false;
  int64_t launched_after = 0;
  std::shared_ptr<Work> work;
};

// Events on the compute stream around the end of backward, to measure exposed communication.
struct DistributedDataParallel::Timing {
  std::unique_ptr<cuda::Event> backward_end, sync_end;
  // Around the compute stream's wait for the bucket left in flight (overlap_optimizer).
  std::unique_ptr<cuda::Event> late_wait_begin, late_wait_end;
  double host_exposed_ms = 0;
};

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, DdpOptions options)
    : module_(std::move(module)), options_(std::move(options)), timing_(std::make_unique<Timing>()) {
  TANDEM_CHECK_AS(ValueError, module_ != nullptr, "DistributedDataParallel: null module");
  TANDEM_CHECK_AS(ValueError, options_.bucket_cap_mb > 0 && options_.first_bucket_mb > 0,
                  "DistributedDataParallel: bucket sizes must be positive");
  TANDEM_CHECK_AS(ValueError, options_.zero_stage >= 0 && options_.zero_stage <= 2,
                  "DistributedDataParallel: zero_stage is ", options_.zero_stage, "; expected 0, 1 or 2");
  TANDEM_CHECK_AS(ValueError, options_.zero_stage == 0 || (!options_.overlap_optimizer && !options_.comm_dtype),
                  "DistributedDataParallel: zero_stage ", options_.zero_stage,
                  " works without overlap_optimizer and comm_dtype (ZeRO overlaps the parameters' all-gather instead)");
  const World& w = world();
  for (auto& [name, p] : module_->named_parameters()) {
    if (!p.requires_grad()) continue;
    names_.push_back(name);
    params_.push_back(p);
  }
  device_ = params_.empty() ? w.device : params_[0].device();
  for (const Tensor& p : params_) {
    TANDEM_CHECK_AS(DeviceError, p.device() == device_, "DistributedDataParallel: parameters on ", device_, " and ",
                    p.device(), "; move the whole module to one device first");
  }
  group_ = &w.group_for(device_);
  gradients_in_place_ = group_->size() == 1 && !options_.comm_dtype;
  check_same_model_everywhere();
  {
    NoGradGuard no_grad;
    broadcast_from_rank0(module_->parameters(), "ddp parameters from rank 0");
    broadcast_from_rank0(module_->buffers(), "ddp buffers from rank 0");
  }
  coalesce_buffers();
  build_buckets();
  self_ = std::make_shared<DistributedDataParallel*>(this);
  // A gradient-ready hook: the gradient is read when its bucket launches, so column sums still
  // waiting in the backward's batch need not launch at every gradient (autograd/node.h).
  for (size_t i = 0; i < params_.size(); ++i) {
    autograd::register_gradient_ready_hook(params_[i], [self = self_, i](const Tensor&) {
      if (*self != nullptr) (*self)->on_gradient(static_cast<int64_t>(i));
    });
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  if (self_) *self_ = nullptr;
}

void DistributedDataParallel::check_same_model_everywhere() {
  // Every rank all-gathers (count, hash of each parameter's name/shape/dtype) over MPI.
  ProcessGroup& cpu = *world().cpu_group;
  int size = cpu.size();
  Tensor count = from_vector(std::vector<int64_t>{static_cast<int64_t>(params_.size())});
  Tensor counts = empty({size}, DType::i64);
  cpu.all_gather(counts, count, "ddp parameter count")->synchronize();
  std::vector<int64_t> all_counts = counts.to_vector<int64_t>();
  for (int r = 0; r < size; ++r) {
    TANDEM_CHECK_AS(ValueError, all_counts[r] == static_cast<int64_t>(params_.size()),
                    "DistributedDataParallel: rank ", cpu.rank(), " has ", params_.size(),
                    " parameters that require grad but rank ", r, " has ", all_counts[r],
                    "; every rank must build the same model");
  }
  std::vector<int64_t> hashes;
  for (size_t i = 0; i < params_.size(); ++i) hashes.push_back(static_cast<int64_t>(fnv1a(describe(names_[i], params_[i]))));
  if (hashes.empty()) return;
  Tensor mine = from_vector(hashes);
  Tensor all = empty({size * static_cast<int64_t>(hashes.size())}, DType::i64);
  cpu.all_gather(all, mine, "ddp parameter names and shapes")->synchronize();
  std::vector<int64_t> all_hashes = all.to_vector<int64_t>();
  for (size_t i = 0; i < hashes.size(); ++i) {
    for (int r = 0; r < size; ++r) {
      TANDEM_CHECK_AS(ValueError, all_hashes[r * hashes.size() + i] == hashes[i], "DistributedDataParallel: parameter ",
                      i, " differs between rank ", cpu.rank(), " (", describe(names_[i], params_[i]), ") and rank ", r,
                      " (another name, shape or dtype); every rank must build the same model");
    }
  }
}

void DistributedDataParallel::broadcast_from_rank0(const std::vector<Tensor>& tensors, const std::string& label) {
  std::vector<std::shared_ptr<Work>> works;
  for (const Tensor& t : tensors) {
    // A dense tensor in another order (channels-last) is broadcast as the run of memory it fills:
    // every rank builds the same model, so every rank lays it out the same way.
    const bool dense = layout_is_dense(t.shape(), t.strides());
    TANDEM_CHECK_AS(ValueError, dense, "DistributedDataParallel: parameters and buffers must be dense (row-major or "
                    "channels-last), got shape ", shape_str(t.shape()), " with strides ", shape_str(t.strides()));
    const Tensor run = t.is_contiguous() ? t : t.as_strided({t.numel()}, {1}, t.offset());
    works.push_back(world().group_for(t.device()).broadcast(run, 0, label));
  }
  for (auto& w : works) w->wait();
}

void DistributedDataParallel::coalesce_buffers() {
  NoGradGuard no_grad;
  buffers_ = module_->buffers();
  flat_buffers_.clear();
  buffer_data_.assign(buffers_.size(), nullptr);
  std::vector<DType> dtypes;
  for (const Tensor& b : buffers_) {
    if (std::find(dtypes.begin(), dtypes.end(), b.dtype()) == dtypes.end()) dtypes.push_back(b.dtype());
  }
  for (DType dtype : dtypes) {
    int64_t total = 0;
    for (const Tensor& b : buffers_) {
      if (b.dtype() == dtype) total += b.numel();
    }
    Tensor flat = empty({total}, TensorOptions(dtype, buffers_[0].device()));  // (total,)
    int64_t offset = 0;
    for (size_t i = 0; i < buffers_.size(); ++i) {
      const Tensor& b = buffers_[i];
      if (b.dtype() != dtype) continue;
      TANDEM_CHECK_AS(DeviceError, b.device() == flat.device(), "DistributedDataParallel: buffers on ", flat.device(),
                      " and ", b.device(), "; move the whole module to one device first");
      Tensor slot = views::view(views::narrow(flat, 0, offset, b.numel()), b.shape());
      kernels::copy_(slot, b);
      b.set_data(slot);
      buffer_data_[i] = slot.data_ptr();
      offset += b.numel();
    }
    flat_buffers_.push_back(flat);
  }
}

// True while every buffer still lives in its flat tensor (a module moved or re-created its
// buffers since DDP started: then they are coalesced again).
bool DistributedDataParallel::buffers_coalesced() const {
  std::vector<Tensor> now = module_->buffers();
  if (now.size() != buffers_.size()) return false;
  for (size_t i = 0; i < now.size(); ++i) {
    if (!now[i].is_same(buffers_[i]) || now[i].data_ptr() != buffer_data_[i]) return false;
  }
  return true;
}

void DistributedDataParallel::build_buckets() {
  bucket_of_.assign(params_.size(), -1);
  // One open bucket per dtype, as in PyTorch: a model that interleaves dtypes (16-bit weights,
  // f32 batch-norm parameters) would otherwise get a tiny bucket at every switch. A bucket is
  // complete when its last parameter's gradient arrives; buckets are launched in that order.
  struct Planned {
    std::unique_ptr<Bucket> bucket;
    double bytes = 0;
    int64_t completes_at = 0;  // position, in backward order, of its last parameter
  };
  std::vector<Planned> closed;
  std::map<DType, Planned> open;
  auto close = [&](Planned& b) {
    b.bucket->numel = next_slot(*b.bucket);  // a whole number of slots, so the next bucket starts aligned too
    closed.push_back(std::move(b));
    b = Planned{};
  };
  int64_t position = 0;
  if (!options_.bucket_plan.empty()) {  // an explicit plan, already in launch order
    check_bucket_plan(options_.bucket_plan, params_);
    for (const std::vector<int64_t>& members : options_.bucket_plan) {
      Planned b{std::make_unique<Bucket>(), 0.0, position++};
      for (int64_t i : members) {
        b.bucket->offsets.push_back(next_slot(*b.bucket));
        b.bucket->params.push_back(i);
      }
      close(b);
    }
  }
  // Reverse registration order: the order in which backward produces the gradients.
  for (int64_t i = options_.bucket_plan.empty() ? static_cast<int64_t>(params_.size()) - 1 : -1; i >= 0; --i, ++position) {
    const Tensor& p = params_[i];
    double cap = (closed.empty() ? options_.first_bucket_mb : options_.bucket_cap_mb) * kMiB;
    double bytes = static_cast<double>(p.nbytes());
    Planned& current = open[p.dtype()];
    if (current.bucket && current.bytes + bytes > cap) close(current);
    if (!current.bucket) current.bucket = std::make_unique<Bucket>();
    Bucket& b = *current.bucket;
    b.offsets.push_back(next_slot(b));
    b.params.push_back(i);
    current.bytes += bytes;
    current.completes_at = position;
  }
  for (auto& [dtype, b] : open) {
    if (b.bucket) close(b);
  }
  std::stable_sort(closed.begin(), closed.end(),
                   [](const Planned& a, const Planned& b) { return a.completes_at < b.completes_at; });
  for (Planned& b : closed) {
    b.bucket->index = static_cast<int64_t>(buckets_.size());
    for (int64_t i : b.bucket->params) bucket_of_[i] = b.bucket->index;
    buckets_.push_back(std::move(b.bucket));
  }
  if (options_.zero_stage > 0) lay_out_shards();
  // With gradients in place the buckets only carry their collectives: they share a placeholder (below).
  for (auto& b : buckets_) {
    if (gradients_in_place_) break;
    b->buffer = zeros({b->numel}, params_[b->params[0]].options());  // (numel,)
    if (options_.zero_stage == 2) b->shard = my_block(gradient_shards_.at(b->buffer.dtype()), *b);
  }
  if (gradients_in_place_) {
    // A world of one: the collectives read and write nothing, yet each is issued on a tensor of its
    // bucket's size and dtype (so it counts as it would elsewhere). One never-written placeholder
    // per dtype, as large as its largest bucket, rather than memory for every gradient twice.
    std::map<DType, int64_t> largest;
    for (auto& b : buckets_) {
      int64_t& n = largest[params_[b->params[0]].dtype()];
      n = std::max(n, b->numel);
    }
    std::map<DType, Tensor> placeholders;  // dtype -> (largest bucket numel,)
    for (auto& [dtype, n] : largest) placeholders[dtype] = empty({n}, TensorOptions(dtype, device_));
    for (auto& b : buckets_) {
      b->buffer = views::narrow(placeholders[params_[b->params[0]].dtype()], 0, 0, b->numel);  // (numel,)
      if (options_.zero_stage == 2) b->shard = b->buffer;
    }
  }
  ready_.assign(params_.size(), false);
  attach_gradient_views(true);

  // The plan must be the same everywhere, or the collectives would pair the wrong buckets.
  std::vector<int64_t> plan;
  for (auto& b : buckets_) {
    plan.push_back(b->buffer.numel());
    plan.push_back(static_cast<int64_t>(b->params.size()));
  }
  ProcessGroup& cpu = *world().cpu_group;
  Tensor mine = from_vector(std::vector<int64_t>{static_cast<int64_t>(fnv1a(std::string(
      reinterpret_cast<const char*>(plan.data()), plan.size() * sizeof(int64_t))))});
  Tensor all = empty({cpu.size()}, DType::i64);
  cpu.all_gather(all, mine, "ddp bucket plan")->synchronize();
  for (int64_t h : all.to_vector<int64_t>()) {
    TANDEM_CHECK_AS(ValueError, h == mine.item<int64_t>(), "DistributedDataParallel: the bucket plan of rank ",
                    cpu.rank(), " differs from another rank's (different bucket_cap_mb or first_bucket_mb?)");
  }
}

// ZeRO's shard rule: the buckets of each dtype, in launch order, make that dtype's flat parameter
// space; its last bucket is padded so that the space splits into `world size` equal contiguous
// shards, rank r owning the r-th. Each bucket records where it starts in the space and how many of
// its elements fall into each rank's shard: the blocks its reduce-scatter and all-gather move.
void DistributedDataParallel::lay_out_shards() {
  const int64_t world = group_->size();
  std::map<DType, int64_t> used;    // dtype -> elements laid out so far
  std::map<DType, Bucket*> last;    // dtype -> its last bucket
  for (auto& b : buckets_) {
    const DType dtype = params_[b->params[0]].dtype();
    b->flat_offset = used[dtype];
    used[dtype] += b->numel;
    last[dtype] = b.get();
  }
  for (auto& [dtype, b] : last) {
    const int64_t unit = world * slot_alignment(dtype);  // every shard starts aligned as well
    const int64_t padded = (used[dtype] + unit - 1) / unit * unit;
    b->numel += padded - used[dtype];
    shard_numel_[dtype] = padded / world;
  }
  for (auto& b : buckets_) {
    const int64_t shard = shard_numel_.at(params_[b->params[0]].dtype());
    b->shard_counts.assign(world, 0);
    for (int64_t r = 0; r < world; ++r) {
      const int64_t lo = std::max(b->flat_offset, r * shard);
      const int64_t hi = std::min(b->flat_offset + b->numel, (r + 1) * shard);
      b->shard_counts[r] = std::max<int64_t>(0, hi - lo);
    }
  }
  if (options_.zero_stage == 2 && !gradients_in_place_) {
    for (auto& [dtype, n] : shard_numel_) gradient_shards_[dtype] = zeros({n}, TensorOptions(dtype, device_));  // (shard,)
  }
}

int64_t DistributedDataParallel::block_start(const Bucket& b) const {
  return internal::block_offsets(b.shard_counts)[group_->rank()];
}

Tensor DistributedDataParallel::my_block(const Tensor& shard, const Bucket& b) const {
  const int64_t count = b.shard_counts[group_->rank()];
  if (count == 0) return views::narrow(shard, 0, 0, 0);  // (0,) the bucket lies outside this rank's shard
  const int64_t at = b.flat_offset + block_start(b) - group_->rank() * shard.numel();
  return views::narrow(shard, 0, at, count);  // (count,)
}

int64_t DistributedDataParallel::slot_alignment(DType dtype) {
  return static_cast<int64_t>(kSlotAlignmentBytes / dtype_size(dtype));
}

int64_t DistributedDataParallel::next_slot(const Bucket& b) const {
  if (b.params.empty()) return 0;
  const Tensor& last = params_[b.params.back()];
  const int64_t align = slot_alignment(last.dtype());
  return (b.offsets.back() + last.numel() + align - 1) / align * align;
}

Tensor DistributedDataParallel::slot(const Bucket& b, size_t k) const {
  const Tensor& p = params_[b.params[k]];
  // In the parameter's layout: a channels-last weight's gradient stays channels-last in the bucket.
  return views::view_in_format(views::narrow(b.buffer, 0, b.offsets[k], p.numel()), p.shape(),
                               p.suggest_memory_format());
}

// Stage 2 released the bucket after its reduce-scatter: a new one, stale (its gradients are
// copied in as they come); the padding at its end is zeroed, as it is reduced with the rest. The
// gaps between slots are reduced too but never read: no parameter lies there.
void DistributedDataParallel::allocate(Bucket& b) {
  if (b.buffer.defined()) return;
  b.buffer = empty({b.numel}, params_[b.params[0]].options());  // (numel,)
  const int64_t used = b.offsets.back() + params_[b.params.back()].numel();
  if (used < b.numel) kernels::fill_(views::narrow(b.buffer, 0, used, b.numel - used), 0.0);
  b.stale = true;
}

void DistributedDataParallel::attach_gradient_views(bool zero) {
  if (gradients_in_place_) return;
  for (auto& b : buckets_) {
    if (!b->buffer.defined()) {
      // Stage 2 allocates a released bucket when its first gradient arrives (on_gradient), so no
      // bucket holds memory through the forward pass, where activations peak.
      if (options_.zero_stage != 2) allocate(*b);
      continue;
    }
    bool none = true;  // no parameter of the bucket has a gradient (zero_grad(set_to_none))
    for (int64_t i : b->params) none = none && !params_[i].grad().defined();
    if (none) {
      b->stale = true;
      continue;
    }
    if (b->stale) {
      // Gradients accumulated outside the bucket (a backward under no_sync()) move into it.
      for (size_t k = 0; k < b->params.size(); ++k) {
        const Tensor& p = params_[b->params[k]];
        Tensor g = p.grad();
        Tensor s = slot(*b, k);
        if (g.defined()) kernels::copy_(s, g);
        else kernels::fill_(s, 0.0);
        p.set_grad(s);
      }
      b->stale = false;
      continue;
    }
    bool attached = true;
    for (size_t k = 0; k < b->params.size(); ++k) {
      const Tensor& p = params_[b->params[k]];
      Tensor g = p.grad();
      attached = attached && g.defined() && g.storage().is_same(b->buffer.storage()) &&
                 g.offset() == b->buffer.offset() + b->offsets[k] && g.shape() == p.shape();
    }
    if (attached && !zero) continue;
    // A gradient was dropped or replaced: start the bucket from zero.
    kernels::fill_(b->buffer, 0.0);
    for (size_t k = 0; k < b->params.size(); ++k) params_[b->params[k]].set_grad(slot(*b, k));
  }
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  wait_for_gradients();  // a step that never came: the buckets are reused now
  if (before_forward_) before_forward_();
  if (options_.broadcast_buffers && group_->size() > 1) {
    NoGradGuard no_grad;
    if (!buffers_coalesced()) coalesce_buffers();
    broadcast_from_rank0(flat_buffers_, "buffers");
  }
  // The parameter check reads hashes on the host: not inside a CUDA graph capture (replays skip it).
  if (options_.check_parameters_every > 0 && steps_ > 0 && steps_ % options_.check_parameters_every == 0 &&
      steps_ != parameters_checked_at_ && !cuda::is_capturing()) {
    parameters_checked_at_ = steps_;
    check_parameters_agree(names_, params_, steps_, world().timeout_seconds);
  }
  attach_gradient_views(false);
  return module_->forward(x);
}

void DistributedDataParallel::on_gradient(int64_t index) {
  if (!sync_enabled_) return;
  if (!backward_active_) {
    backward_active_ = true;
    ++steps_;
    gradients_seen_ = 0;
    next_to_launch_ = 0;
    std::fill(ready_.begin(), ready_.end(), false);
    for (auto& b : buckets_) {
      b->pending = static_cast<int64_t>(b->params.size());
      b->launched = false;
      b->work.reset();
      b->arrived.clear();  // left by a backward that failed before its buckets launched
    }
    autograd::queue_callback([this] { finish_backward(); });
  }
  if (ready_[index]) return;  // a second accumulation in the same backward adds into the same view
  // The gradient must live in its bucket slot by the time the bucket launches. If it was dropped
  // after forward (zero_grad between forward and backward), accumulation made a fresh tensor: it
  // moves into the slot then, with the bucket's other such gradients (move_arrived_into_slots).
  Bucket& bucket = *buckets_[bucket_of_[index]];
  if (!gradients_in_place_) {
    allocate(bucket);  // a backward without a forward through this DDP after a stage 2 step
    const Tensor& p = params_[index];
    size_t k = std::find(bucket.params.begin(), bucket.params.end(), index) - bucket.params.begin();
    Tensor g = p.grad();
    if (!g.storage().is_same(bucket.buffer.storage()) || g.offset() != bucket.buffer.offset() + bucket.offsets[k]) {
      bucket.arrived.emplace_back(k, g);
    }
  }
  ready_[index] = true;
  ++gradients_seen_;
  --bucket.pending;
  if (options_.overlap) launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  // Strictly in bucket order, so every rank issues the same collectives in the same sequence.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_]->pending == 0) {
    launch(*buckets_[next_to_launch_]);
    ++next_to_launch_;
  }
}

void DistributedDataParallel::move_arrived_into_slots(Bucket& b) {
  if (b.arrived.empty()) return;
  std::vector<Tensor> grads, slots;
  for (const auto& [k, g] : b.arrived) {
    grads.push_back(g);
    slots.push_back(slot(b, k));
  }
  autograd::finish_gradient_sums(grads);  // the hook noted them before their column sums ran
  kernels::copy_each_(slots, grads);
  for (size_t j = 0; j < slots.size(); ++j) params_[b.params[b.arrived[j].first]].set_grad(slots[j]);
  b.arrived.clear();
}

void DistributedDataParallel::launch(Bucket& b) {
  move_arrived_into_slots(b);
  b.launched = true;
  b.launched_after = gradients_seen_;
  bool cast = options_.comm_dtype && *options_.comm_dtype != b.buffer.dtype();
  b.comm = cast ? kernels::to_dtype(b.buffer, *options_.comm_dtype) : b.buffer;
  if (timeline_) timeline_->launching();  // after the cast: where the collective's input is ready
  b.comm_bytes = static_cast<int64_t>(b.comm.nbytes());
  const bool scatter = options_.zero_stage == 2;
  const std::string label = "ddp bucket " + std::to_string(b.index) + " of step " + std::to_string(steps_);
  TimedCollectives timed;  // stats() and the timeline read the buckets' device times
  if (scatter) {
    b.work = group_->reduce_scatter_v(b.shard, b.comm, b.shard_counts, ReduceOp::avg, label);
    // This rank keeps only its shard: the Work holds the full bucket until the collective is done,
    // then it goes back to the allocator. The bucket's first gradient of the next backward makes
    // a new one. (In a world of one the shard is the bucket, which stays.)
    if (!gradients_in_place_) {  // else finish_backward drops them, after ZeRO took them
      for (int64_t i : b.params) params_[i].set_grad(Tensor());
    }
    if (!b.shard.is_same(b.buffer)) b.buffer = Tensor();
    b.comm = Tensor();
  } else {
    b.work = group_->all_reduce(b.comm, ReduceOp::avg, label);
  }
  if (timeline_ && timeline_->recording()) {
    timeline_->collective((scatter ? "reduce_scatter bucket " : "all_reduce bucket ") + std::to_string(b.index), b.work,
                          {{"bucket", static_cast<double>(b.index)},
                           {"bytes", static_cast<double>(b.comm_bytes)},
                           {"gradients", static_cast<double>(b.params.size())},
                           {"launched_after_gradients", static_cast<double>(b.launched_after)}},
                          {{"dtype", dtype_name(b.shard.defined() ? b.shard.dtype() : b.comm.dtype())}});
  }
}

void DistributedDataParallel::finish_backward() {
  backward_active_ = false;
  std::vector<std::string> unused;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (!options_.find_unused_parameters) unused.push_back(names_[i]);
    ready_[i] = true;
    Bucket& b = *buckets_[bucket_of_[i]];
    --b.pending;
    // An unused parameter's gradient is zero, as in a bucket zeroed before backward.
    const size_t k = std::find(b.params.begin(), b.params.end(), static_cast<int64_t>(i)) - b.params.begin();
    if (!gradients_in_place_) allocate(b);  // stage 2: a bucket none of whose parameters got a gradient
    if (gradients_in_place_) {
      if (!params_[i].grad().defined()) params_[i].set_grad(zeros(params_[i].shape(), params_[i].options()));
    } else if (b.stale) {
      Tensor s = slot(b, k);
      kernels::fill_(s, 0.0);
      params_[i].set_grad(s);
    }
  }
  for (auto& b : buckets_) b->stale = false;  // every slot holds this backward's gradient now
  if (!unused.empty()) {
    std::string list;
    for (size_t k = 0; k < unused.size() && k < 10; ++k) list += (k ? ", " : "") + unused[k];
    if (unused.size() > 10) list += ", ... (" + std::to_string(unused.size()) + " in all)";
    TANDEM_THROW(ValueError, "DistributedDataParallel: these parameters received no gradient in this backward: ", list,
                 ". Pass find_unused_parameters=true if they are meant to go unused");
  }
  bool gpu = device_.is_cuda();
  const bool captured = cuda::is_capturing();  // a graph records no timings: no statistics for it
  if (gpu && !captured) {
    timing_->backward_end = std::make_unique<cuda::Event>();
    timing_->backward_end->record(device_.index);
  }
  // The span covers what exposed_ms measures: launching what is left, the compute stream's wait
  // for every bucket, and copying results that travelled in another dtype back.
  if (timeline_) timeline_->begin("wait for gradients");
  auto start = std::chrono::steady_clock::now();
  launch_ready_buckets();
  // Before anything can consume the reduced gradients: did every rank issue the same collectives?
  if (options_.check_collectives_every > 0 && steps_ % options_.check_collectives_every == 0) {
    group_->check_in_sync("the optimizer step of step " + std::to_string(steps_));
  }
  in_flight_ = nullptr;
  timing_->late_wait_begin.reset();
  timing_->late_wait_end.reset();
  for (auto& b : buckets_) {
    // The bucket launched last may stay in flight for step() to overlap (only on GPUs: on the
    // CPU the host would block in either place).
    if (options_.overlap_optimizer && gpu && b == buckets_.back() && buckets_.size() > 1 && group_->size() > 1) {
      in_flight_ = b.get();
      continue;
    }
    b->work->wait();  // GPU: the compute stream waits; CPU: the host waits
    if (b->comm.defined() && !b->comm.is_same(b->buffer)) kernels::copy_(b->buffer, b->comm);
  }
  timing_->host_exposed_ms = host_ms_since(start);
  if (gpu && !captured) {
    timing_->sync_end = std::make_unique<cuda::Event>();
    timing_->sync_end->record(device_.index);
  }
  if (timeline_) timeline_->end();
  stats_.buckets = static_cast<int64_t>(buckets_.size());
  stats_.bytes = 0;
  stats_.launched_after_gradients.clear();
  for (auto& b : buckets_) {
    stats_.bytes += b->comm_bytes;
    stats_.launched_after_gradients.push_back(b->launched_after);
  }
  stats_.total_gradients = static_cast<int64_t>(params_.size());
  stats_pending_ = !captured;
  if (gradients_in_place_) {
    if (after_backward_) after_backward_();
    if (options_.zero_stage == 2) {
      for (const Tensor& p : params_) p.set_grad(Tensor());
    }
  }
}

void DistributedDataParallel::wait_for_gradients() {
  if (!in_flight_) return;
  Bucket& b = *in_flight_;
  in_flight_ = nullptr;
  if (timeline_) timeline_->begin("wait for the last bucket");
  const bool timed = !cuda::is_capturing();
  if (timed) {
    timing_->late_wait_begin = std::make_unique<cuda::Event>();
    timing_->late_wait_begin->record(device_.index);
  }
  b.work->wait();
  if (!b.comm.is_same(b.buffer)) kernels::copy_(b.buffer, b.comm);
  if (timed) {
    timing_->late_wait_end = std::make_unique<cuda::Event>();
    timing_->late_wait_end->record(device_.index);
  }
  if (timeline_) timeline_->end();
}

void DistributedDataParallel::step(optim::Optimizer& opt) {
  if (!in_flight_) {
    opt.step();
    return;
  }
  std::unordered_set<const void*> late;  // data of the parameters whose gradients are in flight
  for (int64_t i : in_flight_->params) late.insert(params_[i].data_ptr());
  opt.step_some([&](const Tensor& p) { return late.count(p.data_ptr()) == 0; });
  wait_for_gradients();
  opt.step_some([&](const Tensor& p) { return late.count(p.data_ptr()) != 0; });
}

const DdpStats& DistributedDataParallel::stats() {
  wait_for_gradients();
  if (!stats_pending_) return stats_;
  stats_pending_ = false;
  double comm = 0;
  for (auto& b : buckets_) {
    if (!b->work) continue;
    b->work->synchronize();
    double ms = b->work->elapsed_ms();
    comm += ms > 0 ? ms : 0;
  }
  if (device_.is_cuda() && timing_->sync_end) {
    timing_->sync_end->synchronize();
    stats_.exposed_ms = timing_->backward_end->elapsed_ms(*timing_->sync_end);
    if (timing_->late_wait_end) {
      timing_->late_wait_end->synchronize();
      stats_.exposed_ms += timing_->late_wait_begin->elapsed_ms(*timing_->late_wait_end);
    }
  } else {
    stats_.exposed_ms = timing_->host_exposed_ms;
  }
  stats_.comm_ms = comm > 0 ? comm : stats_.exposed_ms;
  stats_.hidden_fraction = hidden_fraction(stats_.comm_ms, stats_.exposed_ms);
  return stats_;
}

std::vector<std::vector<int64_t>> DistributedDataParallel::bucket_plan() const {
  std::vector<std::vector<int64_t>> plan;
  for (auto& b : buckets_) plan.push_back(b->params);
  return plan;
}

std::vector<int64_t> DistributedDataParallel::bucket_offsets(size_t bucket) const {
  TANDEM_CHECK_AS(IndexError, bucket < buckets_.size(), "DistributedDataParallel: no bucket ", bucket, " (there are ",
                  buckets_.size(), ")");
  return buckets_[bucket]->offsets;
}

int64_t DistributedDataParallel::bucket_numel(size_t bucket) const {
  TANDEM_CHECK_AS(IndexError, bucket < buckets_.size(), "DistributedDataParallel: no bucket ", bucket, " (there are ",
                  buckets_.size(), ")");
  return buckets_[bucket]->numel;
}

Tensor DistributedDataParallel::gradient_shard(size_t bucket) const {
  TANDEM_CHECK_AS(IndexError, bucket < buckets_.size(), "DistributedDataParallel: no bucket ", bucket, " (there are ",
                  buckets_.size(), ")");
  const Bucket& b = *buckets_[bucket];
  if (b.shard.defined()) return b.shard;
  TANDEM_CHECK_AS(ValueError, options_.zero_stage == 1, "DistributedDataParallel: gradient shards need zero_stage 1 or 2");
  return views::narrow(b.buffer, 0, block_start(b), b.shard_counts[group_->rank()]);
}

int64_t DistributedDataParallel::bucket_bytes_held() const {
  if (gradients_in_place_) return 0;  // the buckets are views of one placeholder that holds nothing
  int64_t bytes = 0;
  for (const auto& b : buckets_) bytes += b->buffer.defined() ? static_cast<int64_t>(b->buffer.nbytes()) : 0;
  return bytes;
}

int64_t DistributedDataParallel::bucket_flat_offset(size_t bucket) const {
  check_zero_bucket(bucket);
  return buckets_[bucket]->flat_offset;
}

std::vector<int64_t> DistributedDataParallel::bucket_shard_counts(size_t bucket) const {
  check_zero_bucket(bucket);
  return buckets_[bucket]->shard_counts;
}

int64_t DistributedDataParallel::shard_numel(DType dtype) const {
  auto found = shard_numel_.find(dtype);
  TANDEM_CHECK_AS(ValueError, found != shard_numel_.end(), "DistributedDataParallel: no ", dtype_name(dtype),
                  " parameters are sharded (zero_stage ", options_.zero_stage, ")");
  return found->second;
}

void DistributedDataParallel::check_zero_bucket(size_t bucket) const {
  TANDEM_CHECK_AS(IndexError, bucket < buckets_.size(), "DistributedDataParallel: no bucket ", bucket, " (there are ",
                  buckets_.size(), ")");
  TANDEM_CHECK_AS(ValueError, options_.zero_stage > 0, "DistributedDataParallel: shards need zero_stage 1 or 2");
}

}  // namespace tandem::dist
