#include "tandem/layers/module.h"

#include <set>

#include "tandem/autograd/grad_mode.h"
#include "tandem/core/kernels.h"

namespace tandem::nn {

Tensor Module::forward(const Tensor&) {
  TANDEM_THROW(NotImplementedError, type_name(), " has no single-input forward(); call its own forward method");
}

void Module::check_name(const std::string& name) const {
  TANDEM_CHECK_AS(ValueError, !name.empty() && name.find('.') == std::string::npos, type_name(),
                  ": invalid name '", name, "' (non-empty, no dots)");
  for (const auto* list : {&parameters_, &buffers_}) {
    for (const auto& [n, t] : *list) {
      TANDEM_CHECK_AS(ValueError, n != name, type_name(), ": '", name, "' is already registered");
    }
  }
  for (const auto& [n, m] : children_) {
    TANDEM_CHECK_AS(ValueError, n != name, type_name(), ": '", name, "' is already registered");
  }
}

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check_name(name);
  if (!value.requires_grad()) value.requires_grad_(true);
  parameters_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check_name(name);
  buffers_.emplace_back(name, value);
  return value;
}

void Module::collect(const std::string& prefix, bool parameters, NamedTensors& out) const {
  for (const auto& [name, t] : parameters ? parameters_ : buffers_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", parameters, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::buffers() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_buffers()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const Tensor& p : parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (const auto* list : {&parameters_, &buffers_}) {
    for (const auto& [name, t] : *list) {
      t.set_data(kernels::to_device(t, device));
      if (t.grad().defined()) t.set_grad(kernels::to_device(t.grad(), device));
    }
  }
  for (auto& [name, child] : children_) child->to(device);
}

void Module::to(DType dtype) {
  NoGradGuard no_grad;
  for (const auto* list : {&parameters_, &buffers_}) {
    for (const auto& [name, t] : *list) {
      if (!is_floating(t.dtype())) continue;
      t.set_grad(Tensor());
      t.set_data(kernels::to_dtype(t, dtype));
    }
  }
  for (auto& [name, child] : children_) child->to(dtype);
}

void Module::to(MemoryFormat format) {
  NoGradGuard no_grad;
  for (const auto* list : {&parameters_, &buffers_}) {
    for (const auto& [name, t] : *list) {
      if (t.dim() != 4) continue;
      t.set_data(kernels::contiguous(t, format));
      if (t.grad().defined()) t.set_grad(kernels::contiguous(t.grad(), format));
    }
  }
  for (auto& [name, child] : children_) child->to(format);
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) p.set_grad(Tensor());
    else kernels::fill_(p.grad(), 0.0);
  }
}

NamedTensors Module::state_dict() const {
  NamedTensors out = named_parameters();
  NamedTensors b = named_buffers();
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  NoGradGuard no_grad;
  std::set<std::string> used;
  for (const auto& [name, t] : state_dict()) {
    auto it = state.find(name);
    if (it == state.end()) {
      TANDEM_CHECK_AS(ValueError, !strict, "load_state_dict: '", name, "' is missing from the state");
      continue;
    }
    TANDEM_CHECK_AS(ValueError, it->second.shape() == t.shape(), "load_state_dict: '", name, "' has shape ",
                    shape_str(it->second.shape()), " in the state but ", shape_str(t.shape()), " in the model");
    kernels::copy_(t, kernels::to_device(it->second, t.device()));
    used.insert(name);
  }
  if (strict) {
    for (const auto& [name, t] : state) {
      TANDEM_CHECK_AS(ValueError, used.count(name), "load_state_dict: the state has '", name,
                      "', which the model does not");
    }
  }
}

}  // namespace tandem::nn
