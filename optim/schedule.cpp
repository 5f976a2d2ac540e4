#include "tandem/optim/schedule.h"

#include <algorithm>
#include <cmath>

namespace tandem::optim {

namespace {
constexpr double kPi = 3.14159265358979323846;
}

double LRSchedule::lr_at(int64_t step, double base_lr) const {
  TANDEM_CHECK_AS(ValueError, step >= 0, "lr_at: the step must be >= 0, got ", step);
  return compute(step, base_lr);
}

double LRSchedule::lr_at(int64_t step) const {
  TANDEM_CHECK_AS(ValueError, base_lr_ >= 0.0,
                  "lr_at(step): the schedule has not set an optimizer's learning rate yet, so it has no base "
                  "learning rate; call step(optimizer) or apply(optimizer, step) first, or pass one: "
                  "lr_at(step, base_lr)");
  return lr_at(step, base_lr_);
}

void LRSchedule::step(Optimizer& optimizer) { apply(optimizer, last_step_ + 1); }

void LRSchedule::apply(Optimizer& optimizer, int64_t step) {
  TANDEM_CHECK_AS(ValueError, step >= 0, "LR schedule: the step must be >= 0, got ", step);
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    ParamGroup& group = optimizer.param_group(g);
    if (group.initial_lr < 0.0) group.initial_lr = group.lr;
  }
  for (size_t g = 0; g < optimizer.num_param_groups(); ++g) {
    ParamGroup& group = optimizer.param_group(g);
    group.lr = compute(step, group.initial_lr);
  }
  if (optimizer.num_param_groups() > 0) base_lr_ = optimizer.param_group(0).initial_lr;
  last_step_ = step;
}

StepLR::StepLR(int64_t step_size, double gamma) : step_size_(step_size), gamma_(gamma) {
  TANDEM_CHECK_AS(ValueError, step_size > 0, "StepLR: step_size must be > 0, got ", step_size);
}

double StepLR::compute(int64_t step, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(step / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(int64_t t_max, double eta_min) : t_max_(t_max), eta_min_(eta_min) {
  TANDEM_CHECK_AS(ValueError, t_max > 0, "CosineAnnealingLR: t_max must be > 0, got ", t_max);
}

double CosineAnnealingLR::compute(int64_t step, double base_lr) const {
  double angle = kPi * static_cast<double>(step) / static_cast<double>(t_max_);
  return eta_min_ + (base_lr - eta_min_) * (1.0 + std::cos(angle)) / 2.0;
}

WarmupCosineLR::WarmupCosineLR(int64_t warmup_steps, int64_t total_steps, double min_lr)
    : warmup_steps_(warmup_steps), total_steps_(total_steps), min_lr_(min_lr) {
  TANDEM_CHECK_AS(ValueError, warmup_steps >= 0 && total_steps > warmup_steps,
                  "WarmupCosineLR: need 0 <= warmup_steps < total_steps, got warmup_steps ", warmup_steps,
                  " and total_steps ", total_steps);
}

double WarmupCosineLR::compute(int64_t step, double base_lr) const {
  if (step < warmup_steps_) return base_lr * static_cast<double>(step) / static_cast<double>(warmup_steps_);
  double progress = std::min(1.0, static_cast<double>(step - warmup_steps_) /
                                      static_cast<double>(total_steps_ - warmup_steps_));
  return min_lr_ + (base_lr - min_lr_) * (1.0 + std::cos(kPi * progress)) / 2.0;
}

}  // namespace tandem::optim
