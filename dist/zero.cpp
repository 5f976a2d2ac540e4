#include "tandem/dist/zero.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "tandem/autograd/grad_mode.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"
#include "tandem/dist/internal.h"
#include "tandem/dist/timeline.h"
#include "tandem/optim/clip.h"

namespace tandem::dist {

using optim::group_key;
using optim::state_key;

// Events on the compute stream around the wait for the all-gathers, to measure what is exposed.
struct ZeroRedundancyOptimizer::Timing {
  std::unique_ptr<cuda::Event> wait_begin, wait_end;
  double host_exposed_ms = 0;
};

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(DistributedDataParallel& ddp,
                                                 std::unique_ptr<optim::Optimizer> optimizer)
    : Optimizer(optimizer ? optimizer->master_weights() : true, optimizer ? optimizer->compact_masters() : false),
      ddp_(ddp),
      inner_(std::move(optimizer)),
      timing_(std::make_unique<Timing>()) {
  TANDEM_CHECK_AS(ValueError, inner_ != nullptr, "ZeroRedundancyOptimizer: null optimizer");
  stage_ = ddp.options().zero_stage;
  TANDEM_CHECK_AS(ValueError, stage_ == 1 || stage_ == 2, "ZeroRedundancyOptimizer: the DistributedDataParallel has ",
                  "zero_stage ", stage_, "; make it with DdpOptions::zero_stage 1 or 2");
  for (const auto& states : inner_->state_) {
    for (const auto& s : states) {
      TANDEM_CHECK_AS(ValueError, s.buffers.empty() && !s.step_count.defined(), "ZeroRedundancyOptimizer: the ",
                      inner_->name(), " has state already; wrap it before its first step (or load a state after)");
    }
  }
  group_ = &ddp.group();
  make_flat_parameters();
  // The optimizer's groups (hyper-parameters, schedules' initial_lr) move here; their parameters
  // become this rank's pieces.
  groups_ = std::move(inner_->groups_);
  state_ = std::move(inner_->state_);
  inner_->groups_.clear();
  inner_->state_.clear();
  make_pieces();
  self_ = std::make_shared<ZeroRedundancyOptimizer*>(this);
  ddp_.set_before_forward([self = self_] {
    if (*self != nullptr) (*self)->wait_for_parameters();
  });
  if (ddp_.gradients_in_place()) {
    ddp_.set_after_backward([self = self_] {
      if (*self != nullptr) (*self)->take_parameter_gradients();
    });
  }
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  if (self_) *self_ = nullptr;
}

void ZeroRedundancyOptimizer::make_flat_parameters() {
  NoGradGuard no_grad;
  const std::vector<Tensor>& params = ddp_.parameters();
  const std::vector<std::vector<int64_t>> plan = ddp_.bucket_plan();
  const int64_t world = group_->size(), rank = group_->rank();
  for (size_t b = 0; b < plan.size(); ++b) {
    const Tensor& first = params[plan[b][0]];
    Tensor& space = flat_spaces_[first.dtype()];
    if (!space.defined()) {
      space = zeros({world * ddp_.shard_numel(first.dtype())}, TensorOptions(first.dtype(), first.device()));  // (padded,)
    }
    Tensor flat = views::narrow(space, 0, ddp_.bucket_flat_offset(b), ddp_.bucket_numel(b));  // (bucket numel,)
    const std::vector<int64_t> offsets = ddp_.bucket_offsets(b);
    for (size_t k = 0; k < plan[b].size(); ++k) {
      const Tensor& p = params[plan[b][k]];
      Tensor slot = views::view_in_format(views::narrow(flat, 0, offsets[k], p.numel()), p.shape(),
                                          p.suggest_memory_format());  // keeps a channels-last layout
      kernels::copy_(slot, p);
      p.set_data(slot);
    }
    flat_params_.push_back(flat);
    shard_counts_.push_back(ddp_.bucket_shard_counts(b));
    block_begin_.push_back(internal::block_offsets(shard_counts_.back())[rank]);  // after the lower ranks' blocks
  }
  gathers_.resize(plan.size());
}

std::pair<int64_t, int64_t> ZeroRedundancyOptimizer::shard_range(DType dtype) const {
  const int64_t shard = ddp_.shard_numel(dtype);
  return {group_->rank() * shard, (group_->rank() + 1) * shard};
}

Tensor ZeroRedundancyOptimizer::flat_parameters(DType dtype) const {
  auto found = flat_spaces_.find(dtype);
  TANDEM_CHECK_AS(ValueError, found != flat_spaces_.end(), "ZeroRedundancyOptimizer: no ", dtype_name(dtype),
                  " parameters");
  return found->second;
}

void ZeroRedundancyOptimizer::make_pieces() {
  NoGradGuard no_grad;
  const std::vector<Tensor>& params = ddp_.parameters();
  const std::vector<std::vector<int64_t>> plan = ddp_.bucket_plan();
  std::vector<size_t> bucket(params.size());
  std::vector<int64_t> offset(params.size());
  for (size_t b = 0; b < plan.size(); ++b) {
    const std::vector<int64_t> offsets = ddp_.bucket_offsets(b);
    for (size_t k = 0; k < plan[b].size(); ++k) {
      bucket[plan[b][k]] = b;
      offset[plan[b][k]] = offsets[k];
    }
  }
  const int64_t rank = group_->rank();
  full_.clear();
  pieces_.clear();
  for (size_t g = 0; g < groups_.size(); ++g) {
    optim::ParamGroup& group = *groups_[g];
    full_.push_back(group.params);
    std::vector<Tensor> mine;
    std::vector<Piece> pieces;
    for (size_t j = 0; j < group.params.size(); ++j) {
      const Tensor& p = group.params[j];
      auto found = std::find_if(params.begin(), params.end(), [&](const Tensor& q) { return q.is_same(p); });
      TANDEM_CHECK_AS(ValueError, found != params.end(), "ZeroRedundancyOptimizer: parameter ", j, " of group ", g, " (",
                      shape_str(p.shape()), " ", p.dtype(),
                      ") is not one of the DistributedDataParallel module's parameters that require grad");
      const int64_t i = found - params.begin();
      const size_t b = bucket[i];
      const int64_t lo = block_begin_[b], hi = lo + shard_counts_[b][rank];  // this rank's block of the bucket
      const int64_t start = std::max(offset[i], lo), end = std::min(offset[i] + p.numel(), hi);
      if (start >= end) continue;
      Tensor piece = views::narrow(flat_params_[b], 0, start, end - start);  // (length,)
      // In a world of one the pieces take the parameters' own gradients after each backward.
      if (!ddp_.gradients_in_place()) piece.set_grad(views::narrow(ddp_.gradient_shard(b), 0, start - lo, end - start));
      bucket_of_piece_[piece.data_ptr()] = b;
      mine.push_back(piece);
      pieces.push_back(Piece{b, i, start - offset[i], end - start});
    }
    group.params = std::move(mine);
    state_[g].assign(group.params.size(), ParamState{});
    pieces_.push_back(std::move(pieces));
  }
}

void ZeroRedundancyOptimizer::step_impl(const optim::StepScaling* scaling,
                                        const std::function<bool(const Tensor&)>* include) {
  TANDEM_CHECK_AS(ValueError, include == nullptr, "ZeroRedundancyOptimizer: step_some is not available; each rank ",
                  "updates its whole shard in step()");
  NoGradGuard no_grad;
  wait_for_parameters();  // two steps without a forward between them
  if (scaling != nullptr && scaling->found_inf.defined() && group_->size() > 1) {
    // Each rank checked its own shard of the gradients: an overflow anywhere skips the step everywhere.
    group_->all_reduce(scaling->found_inf, ReduceOp::max, "zero: found inf")->wait();
  }
  const int64_t world = group_->size(), rank = group_->rank();
  stats_ = ZeroStats{};
  // In a world of one the all-gathers move nothing and there is nothing to overlap: one update
  // over every piece, so the fused kernels get them all at once, as without ZeRO.
  if (world == 1) Optimizer::step_impl(scaling, nullptr);
  for (size_t b = 0; b < flat_params_.size(); ++b) {
    std::function<bool(const Tensor&)> in_bucket = [&](const Tensor& piece) {
      auto found = bucket_of_piece_.find(piece.data_ptr());
      return found != bucket_of_piece_.end() && found->second == b;
    };
    if (world > 1 && shard_counts_[b][rank] > 0) Optimizer::step_impl(scaling, &in_bucket);
    // Gather while the next buckets are updated. Each rank's block of the bucket comes from its owner.
    Tensor& flat = flat_params_[b];
    if (timeline_) timeline_->launching();
    TimedCollectives timed;  // stats() and the timeline read the gathers' device times
    gathers_[b] = group_->all_gather_v(flat, views::narrow(flat, 0, block_begin_[b], shard_counts_[b][rank]),
                                       shard_counts_[b], "zero: parameters of bucket " + std::to_string(b));
    if (timeline_ && timeline_->recording()) {
      timeline_->collective("all_gather bucket " + std::to_string(b), gathers_[b],
                            {{"bucket", static_cast<double>(b)}, {"bytes", static_cast<double>(flat.nbytes())}},
                            {{"dtype", dtype_name(flat.dtype())}});
    }
    ++stats_.gathers;
    stats_.bytes += static_cast<int64_t>(flat.nbytes());
  }
  gathers_pending_ = !flat_params_.empty();
}

void ZeroRedundancyOptimizer::wait_for_parameters() {
  if (!gathers_pending_) return;
  gathers_pending_ = false;
  const Device device = flat_params_[0].device();
  if (timeline_) timeline_->begin("wait for parameters");
  const bool captured = cuda::is_capturing();  // a graph records no timings: no statistics for it
  if (device.is_cuda() && !captured) {
    timing_->wait_begin = std::make_unique<cuda::Event>();
    timing_->wait_begin->record(device.index);
  }
  auto start = std::chrono::steady_clock::now();
  for (auto& work : gathers_) work->wait();  // GPU: the compute stream waits; CPU: the host waits
  timing_->host_exposed_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (device.is_cuda() && !captured) {
    timing_->wait_end = std::make_unique<cuda::Event>();
    timing_->wait_end->record(device.index);
  }
  if (timeline_) timeline_->end();
  stats_pending_ = !captured;
}

const ZeroStats& ZeroRedundancyOptimizer::stats() {
  wait_for_parameters();
  if (!stats_pending_) return stats_;
  stats_pending_ = false;
  double gather = 0;
  for (auto& work : gathers_) {
    if (!work) continue;
    work->synchronize();
    gather += std::max(0.0, work->elapsed_ms());
  }
  if (timing_->wait_end) {
    timing_->wait_end->synchronize();
    stats_.exposed_ms = timing_->wait_begin->elapsed_ms(*timing_->wait_end);
  } else {
    stats_.exposed_ms = timing_->host_exposed_ms;
  }
  stats_.gather_ms = gather > 0 ? gather : stats_.exposed_ms;
  stats_.hidden_fraction = hidden_fraction(stats_.gather_ms, stats_.exposed_ms);
  return stats_;
}

void ZeroRedundancyOptimizer::take_parameter_gradients() {
  NoGradGuard no_grad;
  const std::vector<Tensor>& params = ddp_.parameters();
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t j = 0; j < pieces_[g].size(); ++j) {
      const Piece& piece = pieces_[g][j];
      const Tensor grad = params[piece.param].grad();
      groups_[g]->params[j].set_grad(
          grad.defined() ? views::narrow(views::reshape(grad, {grad.numel()}), 0, piece.start, piece.length) : Tensor());
    }
  }
}

void ZeroRedundancyOptimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  // In a world of one the pieces' gradients are the parameters': dropped with them.
  if (ddp_.gradients_in_place() && set_to_none) {
    for (const Tensor& piece : params()) piece.set_grad(Tensor());
  }
  for (const Tensor& p : ddp_.parameters()) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else kernels::fill_(grad, 0.0);
  }
}

Tensor ZeroRedundancyOptimizer::clip_grad_norm_(double max_norm) {
  TANDEM_CHECK_AS(ValueError, max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  const std::vector<Tensor> pieces = params();
  Device device = flat_params_.empty() ? Device() : flat_params_[0].device();
  DType acc = DType::f32;  // as optim::clip_grad_norm_: f64 for f64 gradients
  for (const Tensor& flat : flat_params_) acc = flat.dtype() == DType::f64 ? DType::f64 : acc;
  Tensor squared = optim::grad_squared_norm(pieces, device);  // 0-dim f64: this rank's shard
  if (group_->size() > 1) group_->all_reduce(squared, ReduceOp::sum, "zero: gradient norm")->wait();
  Tensor norm = kernels::to_dtype(kernels::unary(UnaryOp::sqrt, squared), acc);
  optim::clip_grads_to_norm_(pieces, norm, max_norm);
  return norm;
}

optim::StateDict ZeroRedundancyOptimizer::state_dict() const {
  auto& self = const_cast<ZeroRedundancyOptimizer&>(*this);
  self.wait_for_parameters();
  NoGradGuard no_grad;
  const optim::StateDict local = Optimizer::state_dict();  // this rank's pieces, numbered across groups
  optim::StateDict full;
  full.optimizer = name();
  for (const auto& [key, value] : local.metadata) {
    if (key.rfind("state.", 0) != 0) full.metadata[key] = value;
  }
  // Parameters numbered across the full groups (j), pieces across the groups of pieces (q).
  const std::vector<Tensor>& params = ddp_.parameters();
  std::vector<int64_t> number_of(params.size(), -1);  // ddp parameter -> j
  std::vector<std::string> names = state_names();
  if (master_weights()) names.push_back("master");
  const size_t K = names.size();
  int64_t J = 0;
  for (size_t g = 0; g < full_.size(); ++g) {
    full.metadata[group_key(g, "num_params")] = static_cast<double>(full_[g].size());
    J += static_cast<int64_t>(full_[g].size());
  }
  // Which parameter has which state anywhere, and its step count: (J * (K + 1),) maxed over ranks.
  Tensor found = zeros({J * static_cast<int64_t>(K + 1)}, DType::f64);
  double* f = found.data<double>();
  int64_t j = 0, q = 0;
  for (size_t g = 0; g < pieces_.size(); ++g) {
    size_t next = 0;  // pieces_[g] follows full_[g]'s order, skipping parameters with no piece here
    for (size_t k = 0; k < full_[g].size(); ++k, ++j) {
      auto it = std::find_if(params.begin(), params.end(), [&](const Tensor& p) { return p.is_same(full_[g][k]); });
      const int64_t i = it - params.begin();
      number_of[i] = j;
      for (; next < pieces_[g].size() && pieces_[g][next].param == i; ++next, ++q) {
        for (size_t n = 0; n < K; ++n) {
          if (local.tensors.count(state_key(q, names[n]))) f[j * (K + 1) + n] = 1;
        }
        auto step = local.metadata.find(state_key(q, "step"));
        if (step != local.metadata.end()) f[j * (K + 1) + K] = step->second;
      }
    }
  }
  if (group_->size() > 1) world().cpu_group->all_reduce(found, ReduceOp::max, "zero: states in the checkpoint")->wait();
  f = found.data<double>();

  // Each state, bucket by bucket: this rank's shard, all-gathered into the full bucket.
  const std::vector<std::vector<int64_t>> plan = ddp_.bucket_plan();
  const int64_t rank = group_->rank();
  for (size_t b = 0; b < plan.size(); ++b) {
    const std::vector<int64_t> offsets = ddp_.bucket_offsets(b);
    const Tensor& flat = flat_params_[b];
    const int64_t mine_numel = shard_counts_[b][rank];
    for (size_t n = 0; n < K; ++n) {
      bool any = false;
      for (int64_t i : plan[b]) any = any || (number_of[i] >= 0 && f[number_of[i] * (K + 1) + n] != 0);
      if (!any) continue;
      const DType dtype = names[n] == "master" ? DType::f32 : optimizer_state_dtype(flat.dtype());
      Tensor mine = zeros({mine_numel}, TensorOptions(dtype, flat.device()));    // (this rank's block,)
      Tensor gathered = empty({flat.numel()}, TensorOptions(dtype, flat.device()));  // (numel,)
      int64_t piece_number = 0;
      for (size_t g = 0; g < pieces_.size(); ++g) {
        for (const Piece& piece : pieces_[g]) {
          auto t = local.tensors.find(state_key(piece_number++, names[n]));
          if (piece.bucket != b || t == local.tensors.end()) continue;
          const int64_t at = offsets[std::find(plan[b].begin(), plan[b].end(), piece.param) - plan[b].begin()] +
                             piece.start - block_begin_[b];
          kernels::copy_(views::narrow(mine, 0, at, piece.length), t->second);
        }
      }
      group_->all_gather_v(gathered, mine, shard_counts_[b], "zero: optimizer state of bucket " + std::to_string(b))
          ->wait();
      for (size_t k = 0; k < plan[b].size(); ++k) {
        const int64_t i = plan[b][k];
        if (number_of[i] < 0 || f[number_of[i] * (K + 1) + n] == 0) continue;
        const Tensor& p = params[i];
        full.tensors[state_key(number_of[i], names[n])] =
            kernels::clone(views::view(views::narrow(gathered, 0, offsets[k], p.numel()), p.shape()));
      }
    }
  }
  if (counts_steps()) {
    for (int64_t p = 0; p < J; ++p) {
      if (f[p * (K + 1) + K] > 0) full.metadata[state_key(p, "step")] = f[p * (K + 1) + K];
    }
  }
  return full;
}

void ZeroRedundancyOptimizer::load_state_dict(const optim::StateDict& state) {
  wait_for_parameters();
  NoGradGuard no_grad;
  TANDEM_CHECK_AS(ValueError, state.optimizer == name(), "load_state_dict: the state was saved by ",
                  state.optimizer.empty() ? "an unnamed optimizer" : state.optimizer, ", this optimizer is ", name());
  optim::StateDict local;
  local.optimizer = state.optimizer;
  for (const auto& [key, value] : state.metadata) {
    if (key.rfind("state.", 0) != 0) local.metadata[key] = value;
  }
  const std::vector<Tensor>& params = ddp_.parameters();
  std::vector<std::pair<Tensor, Tensor>> to_split;  // (bf16 parameter, its saved f32 master)
  int64_t j = 0, q = 0;
  for (size_t g = 0; g < full_.size(); ++g) {
    auto saved = state.metadata.find(group_key(g, "num_params"));
    TANDEM_CHECK_AS(ValueError, saved == state.metadata.end() || saved->second == static_cast<double>(full_[g].size()),
                    "load_state_dict: group ", g, " has ", saved->second, " parameters in the state but ",
                    full_[g].size(), " in this ", name());
    if (saved != state.metadata.end()) local.metadata[group_key(g, "num_params")] = static_cast<double>(pieces_[g].size());
    size_t next = 0;
    for (size_t k = 0; k < full_[g].size(); ++k, ++j) {
      const Tensor& p = full_[g][k];
      const int64_t i = std::find_if(params.begin(), params.end(), [&](const Tensor& t) { return t.is_same(p); }) -
                        params.begin();
      const std::string prefix = "state." + std::to_string(j) + ".";
      auto master = state.tensors.find(prefix + "master");
      if (master != state.tensors.end() && has_compact_master(p)) {
        to_split.emplace_back(p, master->second);
      }
      for (; next < pieces_[g].size() && pieces_[g][next].param == i; ++next, ++q) {
        const Piece& piece = pieces_[g][next];
        for (auto it = state.tensors.lower_bound(prefix); it != state.tensors.end() && it->first.rfind(prefix, 0) == 0;
             ++it) {
          TANDEM_CHECK_AS(ValueError, it->second.shape() == p.shape(), "load_state_dict: tensor \"", it->first,
                          "\" has shape ", shape_str(it->second.shape()), " but parameter ", j, " has shape ",
                          shape_str(p.shape()));
          Tensor flat = views::reshape(kernels::contiguous(it->second), {p.numel()});
          local.tensors[state_key(q, it->first.substr(prefix.size()))] = views::narrow(flat, 0, piece.start, piece.length);
        }
        auto step = state.metadata.find(state_key(j, "step"));
        if (step != state.metadata.end()) local.metadata[state_key(q, "step")] = step->second;
      }
    }
  }
  for (const auto& [key, tensor] : state.tensors) {
    size_t dot = key.find('.', 6);
    const std::string digits = key.rfind("state.", 0) == 0 && dot != std::string::npos ? key.substr(6, dot - 6) : "";
    TANDEM_CHECK_AS(ValueError, !digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos &&
                                    digits.size() < 10 && std::stoll(digits) < j,
                    "load_state_dict: unexpected tensor \"", key, "\" (this ", name(), " has ", j, " parameters)");
  }
  Optimizer::load_state_dict(local);
  // Each rank has split the masters of its own pieces, writing their high halves into its block of
  // the parameters. Every rank writes the whole parameters the same way, so that the ranks agree
  // before the next step's all-gathers (a state saved without compact masters was rounded to even).
  for (const auto& [param, master] : to_split) {
    Tensor low = empty(param.shape(), TensorOptions(DType::bf16, param.device()));  // discarded
    Tensor on_device = empty(param.shape(), TensorOptions(DType::f32, param.device()));
    kernels::copy_(on_device, master);
    kernels::split_master_(on_device, param, low);
  }
}

}  // namespace tandem::dist
