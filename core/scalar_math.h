#pragma once
// Scalar formulas shared by the CPU and CUDA backends, so both compute the same function.
#include <cmath>
#include <type_traits>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TANDEM_HOST_DEVICE inline
#endif

namespace tandem::math {

constexpr double kSqrt2OverPi = 0.7978845608028654;    // sqrt(2 / pi)
constexpr double kInvSqrt2 = 0.7071067811865476;       // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.3989422804014327;     // 1 / sqrt(2 pi)
constexpr double kGeluCubic = 0.044715;

template <typename C>
TANDEM_HOST_DEVICE C sigmoid(C x) { return C(1) / (C(1) + std::exp(-x)); }

template <typename C>
TANDEM_HOST_DEVICE C gelu_tanh(C x) {
  C u = C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
  return C(0.5) * x * (C(1) + std::tanh(u));
}

// GELU's tanh form differentiated through the logistic function: with u = sqrt(2/pi) (x + 0.044715
// x^3), e = e^(-2u) and s = sigmoid(2u) = 1 / (1 + e), 1 + tanh(u) = 2s and 1 - tanh(u)^2 =
// 4s (1 - s), so the derivative of x (1 + tanh(u)) / 2 is s + 2x s (1 - s) du/dx. 1 - s is taken
// as e s, which does not cancel where s nears 1 (computed as 1 - s, the GPU's f32 derivative was
// up to 2e-6 off over [-30, 30]; e s passes the 1e-6 bound of the CUDA test), and is 0 where s is
// (e overflowed). On the GPU, f32 takes the special-function unit's exponential and reciprocal
// (__expf, __fdividef: a few ulp): GELU's backward was bound by tanhf's instructions, not memory.
template <typename C>
TANDEM_HOST_DEVICE C gelu_tanh_grad(C x) {
  const C u = C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
  const C du = C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCubic) * x * x);
#if defined(__CUDA_ARCH__)
  C e, s;
  if constexpr (std::is_same_v<C, float>) {
    e = __expf(-2.0f * u);
    s = __fdividef(1.0f, 1.0f + e);  // 0 where e passes 2^126: s is below 1e-38 there
  } else {
    e = exp(C(-2) * u);
    s = C(1) / (C(1) + e);
  }
#else
  const C e = std::exp(C(-2) * u);
  const C s = C(1) / (C(1) + e);
#endif
  const C complement = s > C(0) ? e * s : C(0);  // 1 - s
  return s + C(2) * x * s * complement * du;
}

template <typename C>
TANDEM_HOST_DEVICE C gelu_erf(C x) { return C(0.5) * x * (C(1) + std::erf(x * C(kInvSqrt2))); }

template <typename C>
TANDEM_HOST_DEVICE C gelu_erf_grad(C x) {
  return C(0.5) * (C(1) + std::erf(x * C(kInvSqrt2))) + x * std::exp(C(-0.5) * x * x) * C(kInvSqrt2Pi);
}

// x * sigmoid(x) differentiated: s (1 + x (1 - s)).
template <typename C>
TANDEM_HOST_DEVICE C silu_grad(C x) {
  C s = sigmoid(x);
  return s * (C(1) + x * (C(1) - s));
}

// PyTorch's softplus: log(1 + exp(beta x)) / beta, and x itself where beta x > threshold (where
// the two agree to the dtype's precision and exp would overflow).
template <typename C>
TANDEM_HOST_DEVICE C softplus(C x, C beta, C threshold) {
  C z = x * beta;
  return z > threshold ? x : std::log1p(std::exp(z)) / beta;
}
template <typename C>
TANDEM_HOST_DEVICE C softplus_grad(C x, C beta, C threshold) {
  C z = x * beta;
  return z > threshold ? C(1) : sigmoid(z);
}

// max/min that propagate NaN, like PyTorch's maximum/minimum.
template <typename C>
TANDEM_HOST_DEVICE C nan_max(C a, C b) { return (a != a || a > b) ? a : b; }
template <typename C>
TANDEM_HOST_DEVICE C nan_min(C a, C b) { return (a != a || a < b) ? a : b; }

}  // namespace tandem::math
