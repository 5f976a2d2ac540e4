#include "tandem/amp/grad_scaler.h"

#include <cmath>

#include "tandem/autograd/grad_mode.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/kernels.h"

namespace tandem::amp {

GradScaler::GradScaler(Device device, const GradScalerOptions& options) : options_(options), device_(device) {
  TANDEM_CHECK_AS(ValueError, std::isfinite(options.init_scale) && options.init_scale > 0.0,
                  "GradScaler: init_scale must be finite and > 0, got ", options.init_scale);
  TANDEM_CHECK_AS(ValueError, options.growth_factor > 1.0, "GradScaler: growth_factor must be > 1, got ",
                  options.growth_factor);
  TANDEM_CHECK_AS(ValueError, options.backoff_factor > 0.0 && options.backoff_factor < 1.0,
                  "GradScaler: backoff_factor must be in (0, 1), got ", options.backoff_factor);
  TANDEM_CHECK_AS(ValueError, options.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got ",
                  options.growth_interval);
  scale_ = full({}, options.init_scale, TensorOptions(DType::f32, device));
  growth_tracker_ = zeros({}, TensorOptions(DType::i32, device));
  found_inf_ = zeros({}, TensorOptions(DType::f32, device));
}

void GradScaler::check_device(const Tensor& t, const char* what) const {
  TANDEM_CHECK_AS(DeviceError, t.device() == device_, "GradScaler: ", what, " is on ", t.device(),
                  " but the scaler was made for ", device_);
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!options_.enabled) return loss;
  TANDEM_CHECK_AS(ValueError, loss.defined(), "GradScaler::scale: the loss is an undefined tensor");
  TANDEM_CHECK_AS(TypeError, is_floating(loss.dtype()), "GradScaler::scale: the loss is ", loss.dtype(),
                  "; expected a floating-point tensor");
  check_device(loss, "the loss");
  const Tensor wide = loss.dtype() == DType::f32 ? loss : to(loss, DType::f32);
  return wide * scale_;
}

GradScaler::Stage& GradScaler::stage_of(const optim::Optimizer& optimizer) {
  return stages_.emplace(&optimizer, Stage::ready).first->second;
}

void GradScaler::begin_check() {
  if (checked_) return;
  NoGradGuard no_grad;
  kernels::fill_(found_inf_, 0.0);
  inv_scale_ = kernels::unary(UnaryOp::pow_scalar, scale_, -1.0);
  checked_ = true;
}

namespace {
std::vector<Tensor> gradients_of(const optim::Optimizer& optimizer) {
  std::vector<Tensor> grads;
  for (const Tensor& p : optimizer.params()) {
    Tensor g = p.grad();
    if (g.defined()) grads.push_back(g);
  }
  return grads;
}
}  // namespace

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  Stage& stage = stage_of(optimizer);
  TANDEM_CHECK_AS(ValueError, stage == Stage::ready, "GradScaler::unscale_: ",
                  stage == Stage::unscaled ? "unscale_() was already called" : "step() was already called",
                  " on this optimizer since the last update()");
  std::vector<Tensor> grads = gradients_of(optimizer);
  for (const Tensor& g : grads) check_device(g, "a gradient");
  begin_check();
  kernels::non_finite_check_and_unscale_(grads, found_inf_, inv_scale_);
  stage = Stage::unscaled;
}

void GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return;
  }
  Stage& stage = stage_of(optimizer);
  TANDEM_CHECK_AS(ValueError, stage != Stage::stepped,
                  "GradScaler::step: step() was already called on this optimizer since the last update()");
  if (stage == Stage::ready) {
    std::vector<Tensor> grads = gradients_of(optimizer);
    for (const Tensor& g : grads) check_device(g, "a gradient");
    begin_check();
    kernels::non_finite_check_and_unscale_(grads, found_inf_, Tensor());  // check only: the step unscales
    optimizer.step(optim::StepScaling{found_inf_, inv_scale_});
  } else {
    optimizer.step(optim::StepScaling{found_inf_, Tensor()});
  }
  stage = Stage::stepped;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  TANDEM_CHECK_AS(ValueError, checked_,
                  "GradScaler::update: no gradients were checked since the last update() (call step() first)");
  kernels::update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor, options_.backoff_factor,
                         options_.growth_interval);
  stages_.clear();
  checked_ = false;
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  TANDEM_CHECK_AS(ValueError, std::isfinite(new_scale) && new_scale > 0.0,
                  "GradScaler::update: the new scale must be finite and > 0, got ", new_scale);
  kernels::fill_(scale_, new_scale);
  kernels::fill_(growth_tracker_, 0.0);
  stages_.clear();
  checked_ = false;
}

double GradScaler::get_scale() const { return options_.enabled ? scale_.item_double() : 1.0; }
int64_t GradScaler::get_growth_tracker() const { return growth_tracker_.item<int64_t>(); }
bool GradScaler::found_inf() const { return found_inf_.item_double() != 0.0; }

std::map<std::string, double> GradScaler::state_dict() const {
  return {{"scale", get_scale()},
          {"growth_tracker", static_cast<double>(get_growth_tracker())},
          {"growth_factor", options_.growth_factor},
          {"backoff_factor", options_.backoff_factor},
          {"growth_interval", static_cast<double>(options_.growth_interval)}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  auto at = [&](const char* key) {
    auto it = state.find(key);
    TANDEM_CHECK_AS(ValueError, it != state.end(), "GradScaler::load_state_dict: the state lacks \"", key, "\"");
    return it->second;
  };
  const double scale = at("scale"), tracker = at("growth_tracker");
  const double growth = at("growth_factor"), backoff = at("backoff_factor"), interval = at("growth_interval");
  TANDEM_CHECK_AS(ValueError, std::isfinite(scale) && scale > 0.0, "GradScaler::load_state_dict: bad scale ", scale);
  TANDEM_CHECK_AS(ValueError, tracker >= 0 && tracker == std::floor(tracker) && tracker < 2147483648.0,
                  "GradScaler::load_state_dict: bad growth_tracker ", tracker);
  TANDEM_CHECK_AS(ValueError, growth > 1.0 && backoff > 0.0 && backoff < 1.0 && interval >= 1 &&
                                  interval == std::floor(interval),
                  "GradScaler::load_state_dict: bad growth_factor, backoff_factor or growth_interval (", growth, ", ",
                  backoff, ", ", interval, ")");
  options_.growth_factor = growth;
  options_.backoff_factor = backoff;
  options_.growth_interval = static_cast<int64_t>(interval);
  kernels::fill_(scale_, scale);
  kernels::fill_(growth_tracker_, tracker);
}

}  // namespace tandem::amp
