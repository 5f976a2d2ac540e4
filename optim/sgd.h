#pragma once
// Stochastic gradient descent with momentum, dampening, Nesterov momentum and weight decay, as
// torch.optim.SGD: g = grad + weight_decay * p; with momentum, buf = g at a parameter's first
// update and buf = momentum * buf + (1 - dampening) * g after; g = nesterov ? g + momentum * buf
// : buf; p -= lr * g.
#include <vector>

#include "tandem/core/optim.h"
#include "tandem/optim/optimizer.h"

namespace tandem::optim {

// Hyper-parameters, in torch.optim.SGD's order and with its defaults (declared once, with the
// fused kernel's, in core/optim.h; first_step is the optimizer's to set, not an option).
using SgdOptions = SgdHyper;

struct SgdGroup : ParamGroup {
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, const SgdOptions& options = {});

  // Adds a group with the defaults given at construction, or with its own options; returns it, so
  // its hyper-parameters can be changed: sgd.add_param_group(head).lr = 0.1.
  SgdGroup& add_param_group(std::vector<Tensor> params);
  SgdGroup& add_param_group(std::vector<Tensor> params, const SgdOptions& options);
  SgdGroup& group(size_t index);
  const SgdGroup& group(size_t index) const;
  const SgdOptions& defaults() const { return defaults_; }

  const char* name() const override { return "SGD"; }

 protected:
  void update(ParamGroup& group, const std::vector<Item>& items, const StepScaling* scaling) override;
  void check_group(const ParamGroup& group) const override;
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
  bool counts_steps() const override { return false; }
  std::vector<std::pair<std::string, double>> hyper_parameters(const ParamGroup& group) const override;
  void set_hyper_parameter(ParamGroup& group, const std::string& name, double value) const override;

 private:
  SgdOptions defaults_;
};

}  // namespace tandem::optim
