#include "tandem/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "tandem/autograd/grad_mode.h"
#include "tandem/core/backend.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/kernels.h"

namespace tandem::optim {

std::string group_key(size_t group, const std::string& name) {
  return "param_groups." + std::to_string(group) + "." + name;
}

std::string state_key(size_t param, const std::string& name) {
  return "state." + std::to_string(param) + "." + name;
}

namespace {

// Splits "state.<index>.<name>"; false when the key has another form.
bool parse_state_key(const std::string& key, size_t& index, std::string& name) {
  const std::string prefix = "state.";
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size() || dot + 1 == key.size()) return false;
  const std::string digits = key.substr(prefix.size(), dot - prefix.size());
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return false;
  index = static_cast<size_t>(std::stoul(digits));
  name = key.substr(dot + 1);
  return true;
}

double metadata_at(const StateDict& state, const std::string& key) {
  auto it = state.metadata.find(key);
  TANDEM_CHECK_AS(ValueError, it != state.metadata.end(), "load_state_dict: the state lacks \"", key, "\"");
  return it->second;
}

bool is_count(double v) { return v >= 0 && v <= 9.0e15 && std::floor(v) == v; }
}  // namespace

ParamGroup& Optimizer::param_group(size_t index) {
  TANDEM_CHECK_AS(IndexError, index < groups_.size(), name(), ": no parameter group ", index, " (the optimizer has ",
                  groups_.size(), ")");
  return *groups_[index];
}

const ParamGroup& Optimizer::param_group(size_t index) const {
  TANDEM_CHECK_AS(IndexError, index < groups_.size(), name(), ": no parameter group ", index, " (the optimizer has ",
                  groups_.size(), ")");
  return *groups_[index];
}

std::vector<Tensor> Optimizer::params() const {
  std::vector<Tensor> all;
  for (const auto& group : groups_) all.insert(all.end(), group->params.begin(), group->params.end());
  return all;
}

ParamGroup& Optimizer::add_group(std::unique_ptr<ParamGroup> group) {
  std::vector<Tensor> existing = params();
  for (size_t i = 0; i < group->params.size(); ++i) {
    const Tensor& p = group->params[i];
    TANDEM_CHECK_AS(ValueError, p.defined(), name(), ": parameter ", i, " of the new group is an undefined tensor");
    TANDEM_CHECK_AS(TypeError, is_floating(p.dtype()), name(), ": parameter ", i, " of the new group is ", p.dtype(),
                    "; only floating-point tensors (f32, f64, f16, bf16) can be optimized");
    TANDEM_CHECK_AS(ValueError, p.is_leaf(), name(), ": parameter ", i,
                    " of the new group is not a leaf (it is the result of an op); optimize the tensor it came from");
    for (size_t j = 0; j < i; ++j) {
      TANDEM_CHECK_AS(ValueError, !p.is_same(group->params[j]), name(), ": parameter ", i,
                      " of the new group appears twice in it (as parameter ", j, ")");
    }
    for (const Tensor& q : existing) {
      TANDEM_CHECK_AS(ValueError, !p.is_same(q), name(), ": parameter ", i,
                      " of the new group is already in another parameter group");
    }
  }
  check_group(*group);
  state_.emplace_back(group->params.size());
  groups_.push_back(std::move(group));
  return *groups_.back();
}

void Optimizer::step() { step_impl(nullptr); }

void Optimizer::step(const StepScaling& scaling) {
  TANDEM_CHECK_AS(ValueError, scaling.found_inf.defined(), name(), ": step(scaling) needs a found_inf tensor");
  step_impl(&scaling);
}

bool Optimizer::has_master(const Tensor& param) const { return master_weights_ && is_half(param.dtype()); }

bool Optimizer::has_compact_master(const Tensor& param) const {
  return master_weights_ && compact_masters_ && param.dtype() == DType::bf16;
}

std::vector<std::string> Optimizer::state_names_of(const Tensor& param) const {
  std::vector<std::string> names = state_names();
  if (has_master(param)) names.push_back("master");
  return names;
}

void Optimizer::step_some(const std::function<bool(const Tensor&)>& include) { step_impl(nullptr, &include); }

void Optimizer::step_impl(const StepScaling* scaling, const std::function<bool(const Tensor&)>* include) {
  NoGradGuard no_grad;
  for (size_t g = 0; g < groups_.size(); ++g) {
    ParamGroup& group = *groups_[g];
    check_group(group);
    std::vector<ParamState>& states = state_[g];
    states.resize(group.params.size());  // parameters appended to the group since start empty
    std::vector<Item> items;
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      Tensor grad = p.grad();
      if (!grad.defined() || (include && !(*include)(p))) continue;
      TANDEM_CHECK_AS(ValueError, grad.shape() == p.shape(), name(), ": parameter ", i, " of group ", g, " has shape ",
                      shape_str(p.shape()), " but its gradient has shape ", shape_str(grad.shape()));
      TANDEM_CHECK_AS(TypeError, grad.dtype() == p.dtype(), name(), ": parameter ", i, " of group ", g, " is ",
                      p.dtype(), " but its gradient is ", grad.dtype());
      TANDEM_CHECK_AS(DeviceError, grad.device() == p.device(), name(), ": parameter ", i, " of group ", g, " is on ",
                      p.device(), " but its gradient is on ", grad.device());
      ParamState& state = states[i];
      for (const auto& [buffer_name, buffer] : state.buffers) {
        TANDEM_CHECK_AS(ValueError, buffer.shape() == p.shape() && buffer.device() == p.device(), name(),
                        ": parameter ", i, " of group ", g, " is now ", shape_str(p.shape()), " on ", p.device(),
                        " but its ", buffer_name, " is ", shape_str(buffer.shape()), " on ", buffer.device(),
                        " (move or reshape parameters before creating the optimizer, or load a matching state)");
      }
      if (counts_steps() && !state.step_count.defined()) {
        state.step_count = zeros({}, TensorOptions(DType::f32, p.device()));
      }
      Tensor master;
      if (has_compact_master(p)) {
        // Low halves of zero: the master starts as the parameter, exactly.
        Tensor& low = state.buffers["master_low"];
        if (!low.defined()) low = zeros(p.shape(), TensorOptions(DType::bf16, p.device()), p.suggest_memory_format());
        master = low;
      } else if (has_master(p)) {
        auto found = state.buffers.find("master");
        if (found == state.buffers.end()) {
          master = empty(p.shape(), TensorOptions(DType::f32, p.device()), p.suggest_memory_format());
          kernels::copy_(master, p);
          state.buffers["master"] = master;
        } else {
          master = found->second;
        }
      }
      items.push_back(Item{p, grad, master, &state});
    }
    if (items.empty()) continue;
    if (cuda::is_capturing()) track_lr_on_device(group, items[0].param.device());
    update(group, items, scaling);
  }
}

void Optimizer::track_lr_on_device(ParamGroup& group, Device device) {
  if (!device.is_cuda() || group.device_hyper_capture == cuda::capture_id()) return;
  if (!group.device_hyper.defined() || group.device_hyper.device() != device) {
    cuda::OutsideGraphPool outside(device.index);  // written at the start of every replay: no node may reuse it
    group.device_hyper = empty({2}, TensorOptions(DType::f64, device));  // (2,) lr, 1 - lr * weight_decay
  }
  group.device_hyper_capture = cuda::capture_id();
  ParamGroup* g = &group;
  cuda::write_on_each_replay(group.device_hyper.data_ptr(), 2 * sizeof(double), [g](void* bytes) {
    const double values[2] = {g->lr, 1.0 - g->lr * g->weight_decay};
    std::memcpy(bytes, values, sizeof values);
  });
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const auto& group : groups_) {
    for (const Tensor& p : group->params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (set_to_none) p.set_grad(Tensor());
      else kernels::fill_(grad, 0.0);
    }
  }
}

std::vector<std::pair<std::string, double>> Optimizer::all_hyper_parameters(const ParamGroup& group) const {
  std::vector<std::pair<std::string, double>> all = {
      {"lr", group.lr}, {"weight_decay", group.weight_decay}, {"initial_lr", group.initial_lr}};
  for (auto& entry : hyper_parameters(group)) all.push_back(std::move(entry));
  return all;
}

void Optimizer::set_any_hyper_parameter(ParamGroup& group, const std::string& key, double value) const {
  if (key == "lr") group.lr = value;
  else if (key == "weight_decay") group.weight_decay = value;
  else if (key == "initial_lr") group.initial_lr = value;
  else set_hyper_parameter(group, key, value);
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& states : state_) {
    for (const ParamState& s : states) {
      for (const auto& entry : s.buffers) bytes += static_cast<int64_t>(entry.second.nbytes());
      if (s.step_count.defined()) bytes += static_cast<int64_t>(s.step_count.nbytes());
    }
  }
  return bytes;
}

StateDict Optimizer::state_dict() const {
  StateDict state;
  state.optimizer = name();
  state.metadata["num_param_groups"] = static_cast<double>(groups_.size());
  size_t index = 0;  // parameters numbered across groups
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = *groups_[g];
    state.metadata[group_key(g, "num_params")] = static_cast<double>(group.params.size());
    for (const auto& [key, value] : all_hyper_parameters(group)) state.metadata[group_key(g, key)] = value;
    for (size_t i = 0; i < group.params.size(); ++i, ++index) {
      if (i >= state_[g].size() || state_[g][i].buffers.empty()) continue;
      const ParamState& ps = state_[g][i];
      for (const auto& [buffer_name, buffer] : ps.buffers) {
        if (buffer_name == "master_low") {  // a compact master, saved whole
          state.tensors[state_key(index, "master")] = kernels::join_master_halves(group.params[i], buffer);
        } else {
          state.tensors[state_key(index, buffer_name)] = buffer;
        }
      }
      if (counts_steps() && ps.step_count.defined()) {
        state.metadata[state_key(index, "step")] = ps.step_count.item_double();  // waits for the device
      }
    }
  }
  return state;
}

void Optimizer::load_state_dict(const StateDict& state) {
  TANDEM_CHECK_AS(ValueError, state.optimizer == name(), "load_state_dict: the state was saved by ",
                  state.optimizer.empty() ? "an unnamed optimizer" : state.optimizer, ", this optimizer is ", name());
  const double saved_groups = metadata_at(state, "num_param_groups");
  TANDEM_CHECK_AS(ValueError, saved_groups == static_cast<double>(groups_.size()), "load_state_dict: the state has ",
                  saved_groups, " parameter groups, this ", name(), " has ", groups_.size());

  // Every metadata key the state may hold, with the parameter each state entry belongs to.
  std::set<std::string> known = {"num_param_groups"};
  std::vector<const Tensor*> flat;  // parameters numbered across groups
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& group = *groups_[g];
    const double saved = metadata_at(state, group_key(g, "num_params"));
    TANDEM_CHECK_AS(ValueError, saved == static_cast<double>(group.params.size()), "load_state_dict: group ", g,
                    " has ", saved, " parameters in the state but ", group.params.size(), " in this ", name());
    known.insert(group_key(g, "num_params"));
    for (const auto& entry : all_hyper_parameters(group)) {
      metadata_at(state, group_key(g, entry.first));
      known.insert(group_key(g, entry.first));
    }
    for (const Tensor& p : group.params) flat.push_back(&p);
  }

  std::vector<std::map<std::string, Tensor>> buffers(flat.size());
  for (const auto& [key, tensor] : state.tensors) {
    size_t index = 0;
    std::string buffer_name;
    TANDEM_CHECK_AS(ValueError, parse_state_key(key, index, buffer_name), "load_state_dict: unexpected tensor \"", key,
                    "\" (state tensors are named state.<param>.<name>)");
    TANDEM_CHECK_AS(ValueError, index < flat.size(), "load_state_dict: tensor \"", key, "\" is for parameter ", index,
                    " but this ", name(), " has ", flat.size(), " parameters");
    const Tensor& p = *flat[index];
    const std::vector<std::string> names = state_names_of(p);
    TANDEM_CHECK_AS(ValueError, std::find(names.begin(), names.end(), buffer_name) != names.end(),
                    "load_state_dict: tensor \"", key, "\" is not state of a ", p.dtype(), " parameter of ", name(),
                    buffer_name == "master" ? " (master weights are for f16 and bf16 parameters, when enabled)" : "");
    TANDEM_CHECK_AS(ValueError, tensor.defined(), "load_state_dict: tensor \"", key, "\" is undefined");
    TANDEM_CHECK_AS(ValueError, tensor.shape() == p.shape(), "load_state_dict: tensor \"", key, "\" has shape ",
                    shape_str(tensor.shape()), " but parameter ", index, " has shape ", shape_str(p.shape()));
    const DType expected = buffer_name == "master" ? DType::f32 : optimizer_state_dtype(p.dtype());
    TANDEM_CHECK_AS(TypeError, tensor.dtype() == expected, "load_state_dict: tensor \"", key, "\" is ",
                    tensor.dtype(), " but the state of a ", p.dtype(), " parameter is ", expected);
    buffers[index][buffer_name] = tensor;
  }
  std::vector<int64_t> steps(flat.size(), 0);
  for (size_t i = 0; i < flat.size(); ++i) {
    if (buffers[i].empty()) continue;
    // The optimizer's own buffers come all or none (SGD without momentum has none); a 16-bit
    // parameter with master weights must have its master once it has any state.
    std::vector<std::string> required;
    for (const std::string& n : state_names()) {
      if (buffers[i].count(n) == 1) required = state_names();
    }
    if (has_master(*flat[i])) required.push_back("master");
    for (const std::string& n : required) {
      TANDEM_CHECK_AS(ValueError, buffers[i].count(n) == 1, "load_state_dict: the state has ",
                      buffers[i].begin()->first, " for parameter ", i, " but lacks its ", n);
    }
    if (counts_steps()) {
      const std::string key = state_key(i, "step");
      const double step = metadata_at(state, key);
      TANDEM_CHECK_AS(ValueError, is_count(step) && step >= 1, "load_state_dict: \"", key,
                      "\" must be a whole number >= 1, got ", step);
      steps[i] = static_cast<int64_t>(step);
      known.insert(key);
    }
  }
  for (const auto& entry : state.metadata) {
    TANDEM_CHECK_AS(ValueError, known.count(entry.first) == 1, "load_state_dict: unexpected metadata \"", entry.first,
                    "\" for ", name());
  }

  // Hyper-parameters: set them, and put every group back if one is out of range.
  std::vector<std::vector<std::pair<std::string, double>>> previous;
  for (const auto& group : groups_) previous.push_back(all_hyper_parameters(*group));
  try {
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (const auto& entry : previous[g]) {
        set_any_hyper_parameter(*groups_[g], entry.first, state.metadata.at(group_key(g, entry.first)));
      }
      check_group(*groups_[g]);
    }
  } catch (...) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (const auto& entry : previous[g]) set_any_hyper_parameter(*groups_[g], entry.first, entry.second);
    }
    throw;
  }

  size_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<ParamState> fresh(groups_[g]->params.size());
    for (size_t i = 0; i < fresh.size(); ++i, ++index) {
      const Tensor& p = *flat[index];
      for (const auto& [buffer_name, saved] : buffers[index]) {
        Tensor copy = empty(p.shape(), TensorOptions(saved.dtype(), p.device()));
        kernels::copy_(copy, saved);
        if (buffer_name == "master" && has_compact_master(p)) {
          Tensor low = empty(p.shape(), TensorOptions(DType::bf16, p.device()), p.suggest_memory_format());
          kernels::split_master_(copy, p, low);  // the parameter takes the master's high half
          fresh[i].buffers["master_low"] = low;
        } else {
          fresh[i].buffers[buffer_name] = copy;
        }
      }
      if (counts_steps() && !buffers[index].empty()) {
        fresh[i].step_count = full({}, static_cast<double>(steps[index]), TensorOptions(DType::f32, p.device()));
      }
    }
    state_[g] = std::move(fresh);
  }
}

}  // namespace tandem::optim
