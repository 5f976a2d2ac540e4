#pragma once
// Adam with decoupled weight decay, as torch.optim.AdamW: at step t of a parameter,
// p *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
// p -= lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps).
// Moments are f32 for f32 and 16-bit parameters, f64 for f64 ones; each parameter counts its own
// steps (one that had no gradient at some step is a step behind), as in PyTorch, in a 0-dim f32
// tensor on its device (exact up to 2^24 steps).
#include <vector>

#include "tandem/core/optim.h"
#include "tandem/optim/optimizer.h"

namespace tandem::optim {

// Hyper-parameters, in torch.optim.AdamW's order and with its defaults (declared once, with the
// fused kernel's, in core/optim.h).
using AdamWOptions = AdamWHyper;

struct AdamWGroup : ParamGroup {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});

  // Adds a group with the defaults given at construction, or with its own options; returns it, so
  // its hyper-parameters can be changed: adamw.add_param_group(norms).weight_decay = 0.
  AdamWGroup& add_param_group(std::vector<Tensor> params);
  AdamWGroup& add_param_group(std::vector<Tensor> params, const AdamWOptions& options);
  AdamWGroup& group(size_t index);
  const AdamWGroup& group(size_t index) const;
  const AdamWOptions& defaults() const { return defaults_; }

  const char* name() const override { return "AdamW"; }

 protected:
  void update(ParamGroup& group, const std::vector<Item>& items, const StepScaling* scaling) override;
  void check_group(const ParamGroup& group) const override;
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  bool counts_steps() const override { return true; }
  std::vector<std::pair<std::string, double>> hyper_parameters(const ParamGroup& group) const override;
  void set_hyper_parameter(ParamGroup& group, const std::string& name, double value) const override;

 private:
  AdamWOptions defaults_;
};

}  // namespace tandem::optim
