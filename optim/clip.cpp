#include "tandem/optim/clip.h"

#include <cmath>
#include <limits>

#include "tandem/autograd/grad_mode.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem::optim {

namespace {
// A 0-dim tensor filled on its device (no upload from the host).
Tensor device_scalar(double value, DType dtype, Device device) {
  Tensor t = empty({}, TensorOptions(dtype, device));
  kernels::fill_(t, value);
  return t;
}

// The gradients of `params` that exist, checked to be floating point; acc becomes f64 when one is.
std::vector<Tensor> gradients(const std::vector<Tensor>& params, DType& acc) {
  std::vector<Tensor> grads;
  acc = DType::f32;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor g = params[i].grad();
    if (!g.defined()) continue;
    TANDEM_CHECK_AS(TypeError, is_floating(g.dtype()), "clip_grad_norm_: the gradient of parameter ", i, " is ",
                    g.dtype(), "; gradients must be floating point");
    if (g.dtype() == DType::f64) acc = DType::f64;
    grads.push_back(g);
  }
  return grads;
}
}  // namespace

Tensor grad_squared_norm(const std::vector<Tensor>& params, Device device) {
  NoGradGuard no_grad;
  DType acc;
  std::vector<Tensor> grads = gradients(params, acc);
  if (grads.empty()) return zeros({}, TensorOptions(DType::f64, device));
  std::vector<Tensor> sums;  // (1,) per gradient: its sum of squares
  for (const Tensor& g : grads) {
    Tensor x = kernels::to_dtype(g, DType::f64);
    Tensor s = kernels::reduce(ReduceOp::sum, kernels::unary(UnaryOp::pow_scalar, x, 2.0), {}, false);  // 0-dim
    sums.push_back(views::unsqueeze(kernels::to_device(s, device), 0));
  }
  return kernels::reduce(ReduceOp::sum, kernels::cat(sums, 0), {}, false);
}

void clip_grads_to_norm_(const std::vector<Tensor>& params, const Tensor& norm, double max_norm) {
  TANDEM_CHECK_AS(ValueError, max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  DType acc;
  std::vector<Tensor> grads = gradients(params, acc);
  const DType dtype = norm.dtype();
  const Device device = norm.device();
  Tensor denom = kernels::binary(BinaryOp::add, norm, device_scalar(1e-6, dtype, device));
  Tensor coef = kernels::binary(BinaryOp::div, device_scalar(max_norm, dtype, device), denom);
  coef = kernels::unary(UnaryOp::clamp, coef, -std::numeric_limits<double>::infinity(), 1.0);  // 0-dim
  for (Tensor& g : grads) {
    Tensor c = kernels::to_device(coef, g.device());
    // In the accumulation type, then rounded once into the gradient's dtype.
    kernels::copy_(g, kernels::binary(BinaryOp::mul, kernels::to_dtype(g, dtype), c));
  }
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  TANDEM_CHECK_AS(ValueError, max_norm >= 0.0, "clip_grad_norm_: max_norm must be >= 0, got ", max_norm);
  NoGradGuard no_grad;
  DType acc;
  std::vector<Tensor> grads = gradients(params, acc);
  if (grads.empty()) return zeros({}, TensorOptions(DType::f32));
  Tensor squared = grad_squared_norm(params, grads[0].device());                          // 0-dim f64
  Tensor norm = kernels::to_dtype(kernels::unary(UnaryOp::sqrt, squared), acc);           // 0-dim
  clip_grads_to_norm_(params, norm, max_norm);
  return norm;
}

}  // namespace tandem::optim
