#include "tandem/optim/adamw.h"

#include "tandem/core/cuda_graph.h"
#include "tandem/core/kernels.h"

namespace tandem::optim {

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options)
    : Optimizer(options.master_weights, options.compact_masters), defaults_(options) {
  TANDEM_CHECK_AS(ValueError, !params.empty(), "AdamW: got an empty parameter list");
  add_param_group(std::move(params), options);
}

AdamWGroup& AdamW::add_param_group(std::vector<Tensor> params) {
  return add_param_group(std::move(params), defaults_);
}

AdamWGroup& AdamW::add_param_group(std::vector<Tensor> params, const AdamWOptions& options) {
  auto group = std::make_unique<AdamWGroup>();
  group->params = std::move(params);
  group->lr = options.lr;
  group->weight_decay = options.weight_decay;
  group->beta1 = options.beta1;
  group->beta2 = options.beta2;
  group->eps = options.eps;
  return static_cast<AdamWGroup&>(add_group(std::move(group)));
}

AdamWGroup& AdamW::group(size_t index) { return static_cast<AdamWGroup&>(param_group(index)); }
const AdamWGroup& AdamW::group(size_t index) const { return static_cast<const AdamWGroup&>(param_group(index)); }

void AdamW::check_group(const ParamGroup& base) const {
  const auto& g = static_cast<const AdamWGroup&>(base);
  TANDEM_CHECK_AS(ValueError, g.lr >= 0.0, "AdamW: invalid learning rate ", g.lr, " (must be >= 0)");
  TANDEM_CHECK_AS(ValueError, g.eps >= 0.0, "AdamW: invalid eps ", g.eps, " (must be >= 0)");
  TANDEM_CHECK_AS(ValueError, g.beta1 >= 0.0 && g.beta1 < 1.0, "AdamW: invalid beta1 ", g.beta1,
                  " (must be in [0, 1))");
  TANDEM_CHECK_AS(ValueError, g.beta2 >= 0.0 && g.beta2 < 1.0, "AdamW: invalid beta2 ", g.beta2,
                  " (must be in [0, 1))");
  TANDEM_CHECK_AS(ValueError, g.weight_decay >= 0.0, "AdamW: invalid weight_decay ", g.weight_decay,
                  " (must be >= 0)");
}

std::vector<std::pair<std::string, double>> AdamW::hyper_parameters(const ParamGroup& base) const {
  const auto& g = static_cast<const AdamWGroup&>(base);
  return {{"beta1", g.beta1}, {"beta2", g.beta2}, {"eps", g.eps}};
}

void AdamW::set_hyper_parameter(ParamGroup& base, const std::string& name, double value) const {
  auto& g = static_cast<AdamWGroup&>(base);
  if (name == "beta1") g.beta1 = value;
  else if (name == "beta2") g.beta2 = value;
  else if (name == "eps") g.eps = value;
  else TANDEM_THROW(ValueError, "AdamW: no hyper-parameter \"", name, "\"");
}

void AdamW::update(ParamGroup& base, const std::vector<Item>& items, const StepScaling* scaling) {
  const auto& g = static_cast<const AdamWGroup&>(base);
  UpdateTensors lists;
  lists.states.resize(2);
  for (const Item& item : items) {
    ParamState& state = *item.state;
    if (state.buffers.count("exp_avg") == 0) {
      const Tensor& p = item.param;
      TensorOptions options(optimizer_state_dtype(p.dtype()), p.device());
      state.buffers["exp_avg"] = zeros(p.shape(), options, p.suggest_memory_format());  // in p's layout
      state.buffers["exp_avg_sq"] = zeros(p.shape(), options, p.suggest_memory_format());
    }
    lists.params.push_back(item.param);
    lists.grads.push_back(item.grad);
    lists.states[0].push_back(state.buffers.at("exp_avg"));
    lists.states[1].push_back(state.buffers.at("exp_avg_sq"));
    lists.steps.push_back(state.step_count);  // read and incremented on the device
    lists.masters.push_back(item.master);
  }
  if (scaling != nullptr) {
    lists.found_inf = scaling->found_inf;
    lists.inv_scale = scaling->inv_scale;
  }
  if (cuda::is_capturing()) lists.lr_on_device = g.device_hyper;
  AdamWHyper h;
  h.lr = g.lr;
  h.beta1 = g.beta1;
  h.beta2 = g.beta2;
  h.eps = g.eps;
  h.weight_decay = g.weight_decay;
  kernels::adamw_step(lists, h);
}

}  // namespace tandem::optim
