#pragma once
// Maps a runtime DType to a C++ type: dispatch_*(dtype, op, device, [&](auto tag) { using T =
// decltype(tag); ... }). Unsupported dtypes raise a TypeError naming the op, dtype and device.
#include <cstdint>

#include "tandem/core/dtype.h"
#include "tandem/core/error.h"

namespace tandem {

template <typename F>
void dispatch_floating(DType dtype, const char* op, const char* device, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::f16: f(Half{}); return;
    case DType::bf16: f(BFloat16{}); return;
    default:
      TANDEM_THROW(TypeError, op, ": dtype ", dtype_name(dtype), " is not supported on ", device,
                   " (supported: f32, f64, f16, bf16)");
  }
}

// Floating and integer types (no bool).
template <typename F>
void dispatch_numeric(DType dtype, const char* op, const char* device, F&& f) {
  switch (dtype) {
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::u8: f(uint8_t{}); return;
    case DType::boolean:
      TANDEM_THROW(TypeError, op, ": dtype bool is not supported on ", device,
                   " (supported: f32, f64, f16, bf16, i32, i64, u8)");
    default: dispatch_floating(dtype, op, device, f);
  }
}

template <typename F>
void dispatch_all(DType dtype, const char* op, const char* device, F&& f) {
  if (dtype == DType::boolean) {
    f(bool{});
    return;
  }
  dispatch_numeric(dtype, op, device, f);
}

// Converts between element types through their compute types (bool: non-zero is true).
template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(v) != compute_t<From>(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<compute_t<From>>) {
    // Truncate through i64, so a negative value wraps into an unsigned type (as in PyTorch)
    // instead of being undefined behaviour.
    return static_cast<To>(static_cast<int64_t>(static_cast<compute_t<From>>(v)));
  } else {
    return To(static_cast<compute_t<To>>(static_cast<compute_t<From>>(v)));
  }
}

}  // namespace tandem
