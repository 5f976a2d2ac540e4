#include "tandem/optim/sgd.h"

#include "tandem/core/cuda_graph.h"
#include "tandem/core/kernels.h"

namespace tandem::optim {

SGD::SGD(std::vector<Tensor> params, const SgdOptions& options)
    : Optimizer(options.master_weights, options.compact_masters), defaults_(options) {
  TANDEM_CHECK_AS(ValueError, !params.empty(), "SGD: got an empty parameter list");
  add_param_group(std::move(params), options);
}

SgdGroup& SGD::add_param_group(std::vector<Tensor> params) { return add_param_group(std::move(params), defaults_); }

SgdGroup& SGD::add_param_group(std::vector<Tensor> params, const SgdOptions& options) {
  auto group = std::make_unique<SgdGroup>();
  group->params = std::move(params);
  group->lr = options.lr;
  group->weight_decay = options.weight_decay;
  group->momentum = options.momentum;
  group->dampening = options.dampening;
  group->nesterov = options.nesterov;
  return static_cast<SgdGroup&>(add_group(std::move(group)));
}

SgdGroup& SGD::group(size_t index) { return static_cast<SgdGroup&>(param_group(index)); }
const SgdGroup& SGD::group(size_t index) const { return static_cast<const SgdGroup&>(param_group(index)); }

void SGD::check_group(const ParamGroup& base) const {
  const auto& g = static_cast<const SgdGroup&>(base);
  TANDEM_CHECK_AS(ValueError, g.lr >= 0.0, "SGD: invalid learning rate ", g.lr, " (must be >= 0)");
  TANDEM_CHECK_AS(ValueError, g.momentum >= 0.0, "SGD: invalid momentum ", g.momentum, " (must be >= 0)");
  TANDEM_CHECK_AS(ValueError, g.weight_decay >= 0.0, "SGD: invalid weight_decay ", g.weight_decay, " (must be >= 0)");
  TANDEM_CHECK_AS(ValueError, !g.nesterov || (g.momentum > 0.0 && g.dampening == 0.0),
                  "SGD: Nesterov momentum requires a momentum > 0 and zero dampening, got momentum ", g.momentum,
                  " and dampening ", g.dampening);
}

std::vector<std::pair<std::string, double>> SGD::hyper_parameters(const ParamGroup& base) const {
  const auto& g = static_cast<const SgdGroup&>(base);
  return {{"momentum", g.momentum}, {"dampening", g.dampening}, {"nesterov", g.nesterov ? 1.0 : 0.0}};
}

void SGD::set_hyper_parameter(ParamGroup& base, const std::string& name, double value) const {
  auto& g = static_cast<SgdGroup&>(base);
  if (name == "momentum") g.momentum = value;
  else if (name == "dampening") g.dampening = value;
  else if (name == "nesterov") g.nesterov = value != 0.0;
  else TANDEM_THROW(ValueError, "SGD: no hyper-parameter \"", name, "\"");
}

void SGD::update(ParamGroup& base, const std::vector<Item>& items, const StepScaling* scaling) {
  const auto& g = static_cast<const SgdGroup&>(base);
  SgdHyper h;
  h.lr = g.lr;
  h.momentum = g.momentum;
  h.dampening = g.dampening;
  h.weight_decay = g.weight_decay;
  h.nesterov = g.nesterov;
  // Parameters with a momentum buffer, and those at their first update (buf = g): [0] and [1].
  // Without momentum everything goes in [0].
  UpdateTensors lists[2];
  std::vector<ParamState*> created;
  for (const Item& item : items) {
    int first = 0;
    Tensor buffer;
    if (g.momentum != 0.0) {
      auto found = item.state->buffers.find("momentum_buffer");
      first = found == item.state->buffers.end() ? 1 : 0;
      if (first) {
        // Zeros rather than empty: a first step skipped by a GradScaler leaves the buffer as it
        // was, and the next step reads it (buf = momentum * 0 + (1 - dampening) * g, which is
        // PyTorch's first-step buf = g unless dampening is set).
        const Tensor& p = item.param;
        buffer = zeros(p.shape(), TensorOptions(optimizer_state_dtype(p.dtype()), p.device()),
                       p.suggest_memory_format());  // in p's layout, so the update needs no copies
        item.state->buffers["momentum_buffer"] = buffer;
        created.push_back(item.state);
      } else {
        buffer = found->second;
      }
    }
    UpdateTensors& l = lists[first];
    l.params.push_back(item.param);
    l.grads.push_back(item.grad);
    l.masters.push_back(item.master);
    if (g.momentum != 0.0) {
      l.states.resize(1);
      l.states[0].push_back(buffer);
    }
  }
  try {
    for (int first = 0; first < 2; ++first) {
      UpdateTensors& l = lists[first];
      if (l.params.empty()) continue;
      if (scaling != nullptr) {
        l.found_inf = scaling->found_inf;
        l.inv_scale = scaling->inv_scale;
      }
      if (cuda::is_capturing()) l.lr_on_device = g.device_hyper;
      h.first_step = first == 1;
      kernels::sgd_step(l, h);
    }
  } catch (...) {
    for (ParamState* state : created) state->buffers.erase("momentum_buffer");  // never written
    throw;
  }
}

}  // namespace tandem::optim
