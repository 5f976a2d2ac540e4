// CPU optimizer updates: SGD and AdamW over lists of tensors, one plain loop per tensor. The
// arithmetic is the CUDA kernels' (core/cuda/optim.cu): f32 for f32 and 16-bit parameters, f64
// for f64 ones, with the state in that type.
#include <cmath>

#include "tandem/core/backend.h"
#include "tandem/core/dispatch.h"

namespace tandem::cpu {

namespace {
template <typename T>
using state_t = compute_t<T>;  // f32 for f32, f16 and bf16; f64 for f64

template <typename T>
void sgd_typed(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               const std::vector<Tensor>& momentum_buffers, const SgdHyper& h) {
  using C = state_t<T>;
  const C lr = static_cast<C>(h.lr), wd = static_cast<C>(h.weight_decay);
  const C momentum = static_cast<C>(h.momentum), keep = static_cast<C>(1.0 - h.dampening);
  const bool use_momentum = h.momentum != 0.0;
  for (size_t t = 0; t < params.size(); ++t) {
    T* p = params[t].data<T>();                                      // (n,)
    const T* g = grads[t].data<T>();                                 // (n,)
    C* buf = use_momentum ? momentum_buffers[t].data<C>() : nullptr;  // (n,) or none
    const int64_t n = params[t].numel();
    for (int64_t i = 0; i < n; ++i) {
      C pi = static_cast<C>(p[i]);
      C d = static_cast<C>(g[i]) + wd * pi;
      if (use_momentum) {
        C b = h.first_step ? d : momentum * buf[i] + keep * d;
        buf[i] = b;
        d = h.nesterov ? d + momentum * b : b;
      }
      p[i] = T(pi - lr * d);
    }
  }
}

template <typename T>
void adamw_typed(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                 const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq, const AdamWHyper& h) {
  using C = state_t<T>;
  const C decay = static_cast<C>(1.0 - h.lr * h.weight_decay);
  const C beta1 = static_cast<C>(h.beta1), beta2 = static_cast<C>(h.beta2);
  const C one_minus_beta1 = static_cast<C>(1.0 - h.beta1), one_minus_beta2 = static_cast<C>(1.0 - h.beta2);
  const C step_size = static_cast<C>(h.lr / h.bias_correction1());
  const C bc2_sqrt = static_cast<C>(std::sqrt(h.bias_correction2()));
  const C eps = static_cast<C>(h.eps);
  for (size_t t = 0; t < params.size(); ++t) {
    T* p = params[t].data<T>();           // (n,)
    const T* g = grads[t].data<T>();      // (n,)
    C* m = exp_avg[t].data<C>();          // (n,)
    C* v = exp_avg_sq[t].data<C>();       // (n,)
    const int64_t n = params[t].numel();
    for (int64_t i = 0; i < n; ++i) {
      C gi = static_cast<C>(g[i]);
      C mi = beta1 * m[i] + one_minus_beta1 * gi;
      C vi = beta2 * v[i] + one_minus_beta2 * gi * gi;
      m[i] = mi;
      v[i] = vi;
      C denom = std::sqrt(vi) / bc2_sqrt + eps;
      p[i] = T(static_cast<C>(p[i]) * decay - step_size * mi / denom);
    }
  }
}
}  // namespace

void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              const std::vector<Tensor>& momentum_buffers, const SgdHyper& h) {
  if (params.empty()) return;
  dispatch_floating(params[0].dtype(), "sgd_step", "cpu",
                    [&](auto tag) { sgd_typed<decltype(tag)>(params, grads, momentum_buffers, h); });
}

void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                const std::vector<Tensor>& exp_avg_sq, const AdamWHyper& h) {
  if (params.empty()) return;
  dispatch_floating(params[0].dtype(), "adamw_step", "cpu",
                    [&](auto tag) { adamw_typed<decltype(tag)>(params, grads, exp_avg, exp_avg_sq, h); });
}

}  // namespace tandem::cpu
