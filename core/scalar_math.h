#pragma once
// Scalar formulas shared by the CPU and CUDA backends, so both compute the same function.
#include <cmath>

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

template <typename C>
TANDEM_HOST_DEVICE C gelu_tanh_grad(C x) {
  C u = C(kSqrt2OverPi) * (x + C(kGeluCubic) * x * x * x);
  C t = std::tanh(u);
  return C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * C(kSqrt2OverPi) * (C(1) + C(3 * kGeluCubic) * x * x);
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
