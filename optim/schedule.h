#pragma once
// Learning-rate schedules as closed forms of the step number, like torch.optim.lr_scheduler.
// A schedule sets every group's lr from the group's initial lr (ParamGroup::initial_lr, recorded
// the first time a schedule sets the group), so groups with different learning rates keep their
// ratio. Call step(optimizer) after optimizer.step(), as in PyTorch; the first call sets the lr of
// step 1. Before training, apply(optimizer, 0) sets step 0's lr (it matters for warmup, whose lr
// starts at 0); to resume, apply(optimizer, saved last_step()).
#include <cstdint>

#include "tandem/optim/optimizer.h"

namespace tandem::optim {

class LRSchedule {
 public:
  virtual ~LRSchedule() = default;

  // The learning rate at `step` of a group whose initial learning rate is base_lr.
  double lr_at(int64_t step, double base_lr) const;
  // The same for the initial learning rate of the first group of the optimizer this schedule last
  // set (a ValueError before it has set one).
  double lr_at(int64_t step) const;

  // Moves to the next step and sets every group's lr.
  void step(Optimizer& optimizer);
  // Sets every group's lr for `step`, which becomes the current step.
  void apply(Optimizer& optimizer, int64_t step);
  int64_t last_step() const { return last_step_; }

 protected:
  virtual double compute(int64_t step, double base_lr) const = 0;

 private:
  int64_t last_step_ = 0;
  double base_lr_ = -1.0;
};

// lr = base_lr * gamma^floor(step / step_size)  (torch.optim.lr_scheduler.StepLR).
class StepLR : public LRSchedule {
 public:
  StepLR(int64_t step_size, double gamma = 0.1);

 protected:
  double compute(int64_t step, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * step / t_max)) / 2, continuing the cosine
// past t_max (torch.optim.lr_scheduler.CosineAnnealingLR's closed form).
class CosineAnnealingLR : public LRSchedule {
 public:
  CosineAnnealingLR(int64_t t_max, double eta_min = 0.0);

 protected:
  double compute(int64_t step, double base_lr) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// Linear warmup from 0, then a cosine decay to min_lr, held after total_steps:
// step < warmup_steps: lr = base_lr * step / warmup_steps; after it, with
// progress = min(1, (step - warmup_steps) / (total_steps - warmup_steps)),
// lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * progress)) / 2. (Hugging Face's
// get_cosine_with_min_lr_schedule_with_warmup, as a LambdaLR in PyTorch.)
class WarmupCosineLR : public LRSchedule {
 public:
  WarmupCosineLR(int64_t warmup_steps, int64_t total_steps, double min_lr = 0.0);

 protected:
  double compute(int64_t step, double base_lr) const override;

 private:
  int64_t warmup_steps_;
  int64_t total_steps_;
  double min_lr_;
};

}  // namespace tandem::optim
