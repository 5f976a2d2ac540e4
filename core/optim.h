#pragma once
// Fused optimizer updates and GradScaler's kernels (device-neutral side). Backends:
// core/cpu/optim.cpp, core/cuda/optim.cu.
#include <cstdint>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem {

// One SGD step, PyTorch's rule: g = grad + weight_decay * p; with momentum, buf = g on the first
// step and buf = momentum * buf + (1 - dampening) * g after it; g = nesterov ? g + momentum * buf
// : buf; p -= lr * g. The one declaration of SGD's hyper-parameters, in torch.optim.SGD's order
// and with its defaults: optim::SgdOptions is this struct.
struct SgdHyper {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening 0
  // Optimizer-wide (optim::SGD's constructor reads them; the kernels do not): f16/bf16 parameters
  // are updated through f32 master weights, which for bf16 parameters are kept as the parameter
  // plus a 16-bit low half when compact_masters is on (core/master_halves.h).
  bool master_weights = true;
  bool compact_masters = false;
  // Set by the optimizer per step, not an option: the momentum buffers hold nothing yet, so they
  // are set to g, not read.
  bool first_step = false;
};

// One AdamW step, PyTorch's rule: p *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g;
// v = beta2 v + (1 - beta2) g^2; p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), where
// bc1 = 1 - beta1^t and bc2 = 1 - beta2^t for the parameter's step t (its step count + 1).
// The one declaration of AdamW's hyper-parameters, in torch.optim.AdamW's order and with its
// defaults: optim::AdamWOptions is this struct.
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  // Optimizer-wide (optim::AdamW's constructor reads them; the kernels do not): f16/bf16 parameters
  // are updated through f32 master weights, which for bf16 parameters are kept as the parameter
  // plus a 16-bit low half when compact_masters is on (core/master_halves.h).
  bool master_weights = true;
  bool compact_masters = false;
};

// The tensors of one fused optimizer update, one entry per parameter in every list.
// - grads: the parameter's dtype and shape.
// - states: [role][parameter], contiguous, in optimizer_state_dtype(): SGD's momentum buffers
//   (one role, or none when the momentum is 0), AdamW's exp_avg and exp_avg_sq.
// - steps (AdamW): 0-dim f32 step counts, read on the device (the bias corrections use count + 1)
//   and incremented by the update, so a skipped step leaves them as they were.
// - masters: empty, or one per parameter (undefined where it has none): an f32 master weight, or
//   for a bf16 parameter the low halves of its f32 master in a bf16 tensor of its shape (16-bit
//   words, not values: core/master_halves.h; the parameter holds the high halves). The update
//   reads and writes the master in f32 and stores it rounded into the parameter (with low halves,
//   the master's high halves into the parameter and its low halves beside it).
// - found_inf, inv_scale (GradScaler): 0-dim f32 tensors on the parameters' device, or
//   undefined. When *found_inf != 0 the update changes nothing, decided on the device; otherwise
//   every gradient is multiplied by *inv_scale as it is read.
// - lr_on_device: undefined, or (2,) f64 on the parameters' device holding lr and
//   1 - lr * weight_decay, read by the update instead of the hyper-parameters' lr (a CUDA graph
//   replays the update with the lr of its step; optim::ParamGroup::device_hyper).
struct UpdateTensors {
  std::vector<Tensor> params, grads;
  std::vector<std::vector<Tensor>> states;
  std::vector<Tensor> steps;
  std::vector<Tensor> masters;
  Tensor found_inf, inv_scale;
  Tensor lr_on_device;
};

// The dtype of optimizer state (momentum, moments): f32 for 16-bit parameters, else theirs.
inline DType optimizer_state_dtype(DType param) { return is_half(param) ? DType::f32 : param; }

namespace kernels {

// Fused optimizer updates over lists of tensors, in place (see SgdHyper, AdamWHyper,
// UpdateTensors). Parameters may have different dtypes and devices (one fused update per device
// and dtype) and any layout.
void sgd_step(const UpdateTensors& t, const SgdHyper& h);
void adamw_step(const UpdateTensors& t, const AdamWHyper& h);

// Compact master weights (core/master_halves.h). join_master_halves: the f32 masters (of param's
// shape, contiguous) of a bf16 parameter and the low halves beside it. split_master_: writes the
// f32 master's high halves into the bf16 parameter and its low halves into `low_halves` (bf16, the
// parameter's shape), so that join_master_halves gives the master back bit for bit.
Tensor join_master_halves(const Tensor& param, const Tensor& low_halves);
void split_master_(const Tensor& master, const Tensor& param, const Tensor& low_halves);

// GradScaler's kernels. non_finite_check_and_unscale_ sets found_inf (0-dim f32) to 1 when any
// element of `grads` is inf or NaN (it never clears it), and multiplies every gradient in place by
// inv_scale (0-dim f32) unless inv_scale is undefined. update_scale_ applies PyTorch's dynamic
// loss scaling rule on the device: after an overflow scale *= backoff and growth_tracker = 0;
// otherwise growth_tracker += 1, and at growth_interval the scale is multiplied by growth (if
// that stays finite) and the tracker restarts. scale and found_inf are 0-dim f32, growth_tracker
// 0-dim i32, all on one device.
void non_finite_check_and_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& inv_scale);
void update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth,
                   double backoff, int64_t growth_interval);

}  // namespace kernels
}  // namespace tandem
