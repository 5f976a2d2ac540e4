// CPU optimizer updates: SGD and AdamW over lists of tensors, one plain loop per tensor, and
// GradScaler's check and scale update. The arithmetic is the CUDA kernels' (core/cuda/optim.cu):
// f32 for f32 and 16-bit parameters, f64 for f64 ones, with the state in that type.
#include <cmath>
#include <type_traits>

#include "tandem/core/backend.h"
#include "tandem/core/dispatch.h"
#include "tandem/core/master_halves.h"

namespace tandem::cpu {

namespace {
template <typename T>
using state_t = compute_t<T>;  // f32 for f32, f16 and bf16; f64 for f64

// The scaling part of an update: whether to skip it, and the factor for gradients.
struct Scaling {
  bool skip = false;
  float inv_scale = 1.0f;
};

Scaling scaling_of(const UpdateTensors& t) {
  Scaling s;
  if (t.found_inf.defined()) s.skip = *t.found_inf.data<float>() != 0.0f;
  if (t.inv_scale.defined()) s.inv_scale = *t.inv_scale.data<float>();
  return s;
}

// A compact master (core/master_halves.h): the f32 master of a bf16 parameter element and its low
// half, and back. Only bf16 parameters hold them; the other types never reach these.
template <typename T>
float joined_master(T high, BFloat16 low) {
  if constexpr (std::is_same_v<T, BFloat16>) return detail::bits_float(master_halves::join(high.bits, low.bits));
  else return static_cast<float>(high);
}

template <typename T>
void split_master_into(float master, T& high, BFloat16& low) {
  if constexpr (std::is_same_v<T, BFloat16>) {
    const uint32_t bits = detail::float_bits(master);
    high.bits = master_halves::high(bits);
    low.bits = master_halves::low(bits);
  } else {
    high = T(master);
  }
}

// Calls rule(p_i, g_i, i) -> new p_i for every element of tensor `k`, reading and writing the
// master weight instead of the parameter when there is one: an f32 master, or a bf16 parameter's
// compact master (the parameter and its low halves).
template <typename T, typename Rule>
void for_each_element(const UpdateTensors& t, size_t k, float inv_scale, Rule rule) {
  using C = state_t<T>;
  T* p = t.params[k].data<T>();                                   // (n,)
  const T* g = t.grads[k].data<T>();                              // (n,)
  const Tensor given = t.masters.empty() ? Tensor() : t.masters[k];
  const bool halves = given.defined() && given.dtype() == DType::bf16;
  C* master = given.defined() && !halves ? given.data<C>() : nullptr;  // (n,) or none
  BFloat16* low = halves ? given.data<BFloat16>() : nullptr;           // (n,) 16-bit words, or none
  const int64_t n = t.params[k].numel();
  const C unscale = static_cast<C>(inv_scale);
  for (int64_t i = 0; i < n; ++i) {
    C pi = master != nullptr ? master[i] : halves ? joined_master(p[i], low[i]) : static_cast<C>(p[i]);
    pi = rule(pi, static_cast<C>(g[i]) * unscale, i);
    if (master != nullptr) master[i] = pi;
    if (halves) split_master_into(pi, p[i], low[i]);
    else p[i] = T(pi);
  }
}

template <typename T>
void sgd_typed(const UpdateTensors& t, const SgdHyper& h) {
  using C = state_t<T>;
  const Scaling scaling = scaling_of(t);
  if (scaling.skip) return;
  const C lr = static_cast<C>(h.lr), wd = static_cast<C>(h.weight_decay);
  const C momentum = static_cast<C>(h.momentum), keep = static_cast<C>(1.0 - h.dampening);
  const bool use_momentum = h.momentum != 0.0;
  for (size_t k = 0; k < t.params.size(); ++k) {
    C* buf = use_momentum ? t.states[0][k].data<C>() : nullptr;  // (n,) or none
    for_each_element<T>(t, k, scaling.inv_scale, [&](C p, C g, int64_t i) {
      C d = g + wd * p;
      if (use_momentum) {
        C b = h.first_step ? d : momentum * buf[i] + keep * d;
        buf[i] = b;
        d = h.nesterov ? d + momentum * b : b;
      }
      return p - lr * d;
    });
  }
}

template <typename T>
void adamw_typed(const UpdateTensors& t, const AdamWHyper& h) {
  using C = state_t<T>;
  const Scaling scaling = scaling_of(t);
  if (scaling.skip) return;
  const C decay = static_cast<C>(1.0 - h.lr * h.weight_decay);
  const C beta1 = static_cast<C>(h.beta1), beta2 = static_cast<C>(h.beta2);
  const C one_minus_beta1 = static_cast<C>(1.0 - h.beta1), one_minus_beta2 = static_cast<C>(1.0 - h.beta2);
  const C eps = static_cast<C>(h.eps);
  for (size_t k = 0; k < t.params.size(); ++k) {
    float* count = t.steps[k].data<float>();  // 0-dim
    const double step = static_cast<double>(*count) + 1.0;
    const C step_size = static_cast<C>(h.lr / (1.0 - std::pow(h.beta1, step)));
    const C bc2_sqrt = static_cast<C>(std::sqrt(1.0 - std::pow(h.beta2, step)));
    C* m = t.states[0][k].data<C>();  // (n,)
    C* v = t.states[1][k].data<C>();  // (n,)
    for_each_element<T>(t, k, scaling.inv_scale, [&](C p, C g, int64_t i) {
      C mi = beta1 * m[i] + one_minus_beta1 * g;
      C vi = beta2 * v[i] + one_minus_beta2 * g * g;
      m[i] = mi;
      v[i] = vi;
      C denom = std::sqrt(vi) / bc2_sqrt + eps;
      return p * decay - step_size * mi / denom;
    });
    *count += 1.0f;
  }
}

template <typename T>
void check_and_unscale_typed(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& inv_scale) {
  using C = state_t<T>;
  bool found = false;
  const C unscale = inv_scale.defined() ? static_cast<C>(*inv_scale.data<float>()) : C(1);
  for (const Tensor& grad : grads) {
    T* g = grad.data<T>();  // (n,)
    const int64_t n = grad.numel();
    for (int64_t i = 0; i < n; ++i) {
      const C value = static_cast<C>(g[i]);
      if (!std::isfinite(value)) found = true;
      if (inv_scale.defined()) g[i] = T(value * unscale);
    }
  }
  if (found) *found_inf.data<float>() = 1.0f;
}
}  // namespace

void sgd_step(const UpdateTensors& t, const SgdHyper& h) {
  if (t.params.empty()) return;
  dispatch_floating(t.params[0].dtype(), "sgd_step", "cpu", [&](auto tag) { sgd_typed<decltype(tag)>(t, h); });
}

void adamw_step(const UpdateTensors& t, const AdamWHyper& h) {
  if (t.params.empty()) return;
  dispatch_floating(t.params[0].dtype(), "adamw_step", "cpu", [&](auto tag) { adamw_typed<decltype(tag)>(t, h); });
}

void join_master_halves(const Tensor& param, const Tensor& low_halves, const Tensor& master) {
  const BFloat16* high = param.data<BFloat16>();     // (n,)
  const BFloat16* low = low_halves.data<BFloat16>();  // (n,) 16-bit words
  float* out = master.data<float>();                 // (n,)
  const int64_t n = param.numel();
  for (int64_t i = 0; i < n; ++i) out[i] = detail::bits_float(master_halves::join(high[i].bits, low[i].bits));
}

void split_master(const Tensor& master, const Tensor& param, const Tensor& low_halves) {
  const float* in = master.data<float>();       // (n,)
  BFloat16* high = param.data<BFloat16>();      // (n,)
  BFloat16* low = low_halves.data<BFloat16>();  // (n,) 16-bit words
  const int64_t n = param.numel();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = detail::float_bits(in[i]);
    high[i].bits = master_halves::high(bits);
    low[i].bits = master_halves::low(bits);
  }
}

void non_finite_check_and_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& inv_scale) {
  if (grads.empty()) return;
  dispatch_floating(grads[0].dtype(), "non_finite_check_and_unscale_", "cpu",
                    [&](auto tag) { check_and_unscale_typed<decltype(tag)>(grads, found_inf, inv_scale); });
}

void update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth,
                   double backoff, int64_t growth_interval) {
  float* s = scale.data<float>();              // 0-dim
  int32_t* tracker = growth_tracker.data<int32_t>();  // 0-dim
  if (*found_inf.data<float>() != 0.0f) {
    *s = static_cast<float>(*s * backoff);
    *tracker = 0;
    return;
  }
  const int64_t successful = static_cast<int64_t>(*tracker) + 1;
  if (successful >= growth_interval) {
    const float grown = static_cast<float>(*s * growth);
    if (std::isfinite(grown)) *s = grown;
    *tracker = 0;
  } else {
    *tracker = static_cast<int32_t>(successful);
  }
}

}  // namespace tandem::cpu
