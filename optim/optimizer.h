#pragma once
// Optimizers over parameter groups, like torch.optim. An optimizer holds groups of parameters,
// each with its own hyper-parameters (changeable between steps), and a state per parameter
// (momentum buffers, moments, step counts) created at the parameter's first update. step()
// updates every parameter that has a gradient in place: the parameter's storage is written, the
// Tensor handle (and every view of it) stays valid.
//
// The updates are the fused multi-tensor kernels of core/kernels.h (kernels::sgd_step,
// kernels::adamw_step): one launch per group, device and dtype on a GPU. State is f32 for 16-bit
// parameters (optimizer_state_dtype in core/kernels.h), the parameter's dtype otherwise.
//
// Mixed precision: f16 and bf16 parameters get f32 master weights (unless master_weights is off
// in the optimizer's options): a state tensor "master", made from the parameter at its first
// update. The kernel reads the 16-bit gradient and the master, updates master and moments in
// f32, and writes the master rounded to 16 bits into the parameter. With compact_masters on, a
// bf16 parameter's master is the parameter itself (the master's high half, rounded to nearest with
// ties away from zero) and a state tensor "master_low" beside it (its low half, 16-bit words in a
// bf16 tensor): the same f32 master bit for bit (core/master_halves.h) in 2 bytes per parameter
// instead of 4, and 2 bytes less per parameter for the update to move. state_dict() gives such a
// master as an f32 "master", as without it, and load_state_dict() splits a saved "master" again,
// writing its high half into the parameter; checkpoints of either kind load into either.
//
// With a GradScaler (amp/grad_scaler.h) the step takes its found-inf flag and 1 / scale, both on
// the device: the kernels skip the update when the flag is set and unscale gradients as they read
// them, so no step waits for the host. Step counts (AdamW) are 0-dim f32 device tensors for the
// same reason.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::dist {
class ZeroRedundancyOptimizer;
}

namespace tandem::optim {

// Parameters that share hyper-parameters. The optimizer-specific ones live in the optimizer's
// group type (SgdGroup, AdamWGroup), reached through SGD::group(i) or AdamW::group(i).
struct ParamGroup {
  std::vector<Tensor> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
  // What learning-rate schedules scale from (PyTorch's group["initial_lr"]): negative until a
  // schedule first sets this group's lr, which records the lr the group had then.
  double initial_lr = -1.0;
  // Inside a CUDA graph capture (core/cuda_graph.h) the update reads lr from here, (2,) f64 on the
  // parameters' device: lr and 1 - lr * weight_decay, written from the fields above before every
  // replay, so a schedule changes a captured step's lr without a recapture. Undefined until then.
  Tensor device_hyper;
  uint64_t device_hyper_capture = 0;  // the capture that last registered the write

  virtual ~ParamGroup() = default;
};

// An optimizer's state as named tensors and numbers. Parameters are numbered across groups in
// order, as in PyTorch. Tensors: "state.<param>.<name>", e.g. "state.3.exp_avg". Metadata:
// "num_param_groups"; per group "param_groups.<g>.num_params" and one entry per hyper-parameter
// ("param_groups.<g>.lr", ".weight_decay", ".initial_lr", ".momentum", ...; flags as 0 or 1);
// per parameter "state.<param>.step" for optimizers that count steps. Every value is a number,
// so the metadata writes as one flat JSON object.
struct StateDict {
  std::string optimizer;  // "SGD", "AdamW": what load_state_dict expects
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> metadata;
};
// The keys above: "param_groups.<group>.<name>" and "state.<param>.<name>".
std::string group_key(size_t group, const std::string& name);
std::string state_key(size_t param, const std::string& name);

// GradScaler's part in a step: 0-dim f32 tensors on the parameters' device. The step changes
// nothing when *found_inf != 0; otherwise gradients are multiplied by *inv_scale as they are read
// (inv_scale undefined: they are already unscaled).
struct StepScaling {
  Tensor found_inf;
  Tensor inv_scale;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual const char* name() const = 0;

  // One update of every parameter that has a gradient; parameters without one are skipped.
  void step();
  // The same under a GradScaler, which calls it (see StepScaling).
  void step(const StepScaling& scaling);
  // Updates only the parameters for which `include` is true (those with gradients), as step()
  // would: for splitting one step into parts that run as their gradients become ready.
  void step_some(const std::function<bool(const Tensor& param)>& include);
  // Whether f16/bf16 parameters are updated through f32 master weights, and whether bf16 ones keep
  // them as the parameter plus a low half.
  bool master_weights() const { return master_weights_; }
  bool compact_masters() const { return compact_masters_; }
  // set_to_none drops the gradients (the next backward creates new ones); otherwise they are
  // zeroed in place, which keeps gradient buffers that are views (DDP's buckets) valid.
  virtual void zero_grad(bool set_to_none = true);

  size_t num_param_groups() const { return groups_.size(); }
  ParamGroup& param_group(size_t index);
  const ParamGroup& param_group(size_t index) const;
  std::vector<Tensor> params() const;  // every group's, in order

  // Bytes of this optimizer's state on this process: moments, momentum buffers, master weights
  // and step counts.
  int64_t state_bytes() const;

  // The tensors are the optimizer's own state buffers, not copies (but a compact master, joined
  // into a new f32 tensor): clone or save them before the next step if they must not change.
  virtual StateDict state_dict() const;
  // Restores hyper-parameters and state saved by state_dict() of the same kind of optimizer over
  // parameters of the same groups, shapes and dtypes. Checks everything before changing anything;
  // the tensors are copied onto each parameter's device.
  virtual void load_state_dict(const StateDict& state);

 protected:
  // What step(), step(scaling) and step_some() run: updates the parameters with gradients (those
  // `include` accepts, when given). A wrapper that shards the update (dist::ZeroRedundancyOptimizer)
  // replaces it and calls this one for its own shard.
  virtual void step_impl(const StepScaling* scaling, const std::function<bool(const Tensor&)>* include = nullptr);

  Optimizer(bool master_weights, bool compact_masters)
      : master_weights_(master_weights), compact_masters_(compact_masters) {}

  // One parameter's state: named buffers of its shape (contiguous, in optimizer_state_dtype(),
  // "master" among them for a 16-bit parameter with master weights, or "master_low" for a bf16
  // one with compact masters) and, for optimizers that count them, the steps taken as a 0-dim f32
  // tensor on its device.
  struct ParamState {
    std::map<std::string, Tensor> buffers;
    Tensor step_count;
  };
  // A parameter that has a gradient, handed to update(); master is undefined where it has none,
  // and a compact master's low halves (bf16) where it has one (kernels::adamw_step takes either).
  struct Item {
    Tensor param;
    Tensor grad;
    Tensor master;
    ParamState* state;
  };

  // Checks the group (floating-point leaf tensors, none already in this optimizer, valid
  // hyper-parameters) and appends it.
  ParamGroup& add_group(std::unique_ptr<ParamGroup> group);

  // ---- what each optimizer provides ----
  // Updates the items of one group (all with gradients of their parameter's shape and dtype),
  // under the scaling when it is given.
  virtual void update(ParamGroup& group, const std::vector<Item>& items, const StepScaling* scaling) = 0;
  // Throws a ValueError naming a hyper-parameter out of range.
  virtual void check_group(const ParamGroup& group) const = 0;
  // The names of the state buffers a parameter has once updated.
  virtual std::vector<std::string> state_names() const = 0;
  virtual bool counts_steps() const = 0;
  // The group's optimizer-specific hyper-parameters by name, and how to set one.
  virtual std::vector<std::pair<std::string, double>> hyper_parameters(const ParamGroup& group) const = 0;
  virtual void set_hyper_parameter(ParamGroup& group, const std::string& name, double value) const = 0;

 private:
  // ZeRO takes over an optimizer's groups and calls its update() on this rank's shard.
  friend class dist::ZeroRedundancyOptimizer;

  std::vector<std::pair<std::string, double>> all_hyper_parameters(const ParamGroup& group) const;
  // Inside a graph capture: makes the group's device_hyper and has every replay write it first.
  static void track_lr_on_device(ParamGroup& group, Device device);
  void set_any_hyper_parameter(ParamGroup& group, const std::string& name, double value) const;
  bool has_master(const Tensor& param) const;
  bool has_compact_master(const Tensor& param) const;                  // a bf16 one, with compact_masters
  std::vector<std::string> state_names_of(const Tensor& param) const;  // state_names() + "master"

  bool master_weights_;
  bool compact_masters_;

  std::vector<std::unique_ptr<ParamGroup>> groups_;
  std::vector<std::vector<ParamState>> state_;  // [group][parameter]
};

}  // namespace tandem::optim
