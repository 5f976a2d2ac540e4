#pragma once
// Dynamic loss scaling for f16 training (optional for bf16), as torch.amp.GradScaler:
//
//   amp::GradScaler scaler(device);
//   scaler.scale(loss).backward();   // gradients of loss * scale: small ones stay representable
//   scaler.unscale_(optimizer);      // optional, before clip_grad_norm_ on true gradients
//   scaler.step(optimizer);          // unscales, and skips the update if a gradient is inf/NaN
//   scaler.update();                 // backs the scale off after an overflow, grows it after
//                                    // growth_interval clean steps
//
// Everything stays on the device: the scale, the growth tracker and the found-inf flag are 0-dim
// tensors; step() runs one multi-tensor check over the gradients and hands the flag to the
// optimizer's fused kernel, which skips the update on the device. No step waits for the host.
//
// Under DistributedDataParallel the skip decision follows from the reduced gradients: the check
// runs after backward, on gradients that the all-reduce has already summed over every rank, and
// an inf or NaN on any rank makes the sum inf or NaN on every rank. So every rank skips the same
// steps and keeps the same scale without an extra collective.
//
// One flag per scaler and step: with several optimizers, an overflow found in one optimizer's
// gradients also skips the optimizers stepped after it in the same iteration.
#include <map>
#include <string>

#include "tandem/core/tensor.h"
#include "tandem/optim/optimizer.h"

namespace tandem::amp {

// PyTorch's defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // disabled: scale() returns the loss, step() is optimizer.step()
};

class GradScaler {
 public:
  // The scaler's tensors live on `device`, which must be the device of the losses and of every
  // parameter it steps.
  explicit GradScaler(Device device, const GradScalerOptions& options = {});

  bool is_enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // loss * scale, in f32 (a 16-bit loss is cast first, so the product cannot overflow there).
  Tensor scale(const Tensor& loss);
  // Divides the optimizer's gradients by the scale in place and records overflows. At most once
  // per optimizer between update() calls; step() then does not unscale again.
  void unscale_(optim::Optimizer& optimizer);
  // optimizer.step() with the unscaling and the skip decision on the device.
  void step(optim::Optimizer& optimizer);
  // Adjusts the scale from this iteration's overflow flag (PyTorch's rule, see update_scale_ in
  // core/kernels.h) and starts a new iteration.
  void update();
  // Sets the scale (and restarts the growth count) instead of the dynamic rule.
  void update(double new_scale);

  // Reading these waits for the device.
  double get_scale() const;
  int64_t get_growth_tracker() const;
  // Whether the last step() found an inf or NaN (so the update was skipped); false before one.
  bool found_inf() const;

  // The scale and growth tracker with the options, as numbers, for checkpoints.
  std::map<std::string, double> state_dict() const;
  void load_state_dict(const std::map<std::string, double>& state);

 private:
  enum class Stage { ready, unscaled, stepped };
  void check_device(const Tensor& t, const char* what) const;
  Stage& stage_of(const optim::Optimizer& optimizer);
  void begin_check();  // clears found_inf_ at the first check of an iteration

  GradScalerOptions options_;
  Device device_;
  Tensor scale_;           // () f32
  Tensor growth_tracker_;  // () i32: clean steps since the last growth or backoff
  Tensor found_inf_;       // () f32: 1 when this iteration's gradients overflowed
  Tensor inv_scale_;       // () f32: 1 / scale, made by the first check of an iteration
  bool checked_ = false;   // found_inf_ holds this iteration's flag
  std::map<const optim::Optimizer*, Stage> stages_;
};

}  // namespace tandem::amp
