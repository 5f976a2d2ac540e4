#pragma once
// Host-side 16-bit float types. They store bits and convert through float; arithmetic on them
// always happens in float (half types accumulate in f32 everywhere in tandem).
#include <cstdint>
#include <cstring>

namespace tandem {

namespace detail {
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
}  // namespace detail

// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  Half(float f) : bits(from_float(f)) {}  // NOLINT: implicit like the built-in float types
  operator float() const { return to_float(bits); }

  static uint16_t from_float(float f) {
    // Round to nearest even, with overflow to inf, NaN kept NaN, and subnormals.
    uint32_t x = detail::float_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
    if (abs < 0x38800000u) {  // result is subnormal or zero: scale into the subnormal grid
      float scaled = detail::bits_float(abs) * 16777216.0f;  // 2^24: one subnormal ulp -> 1.0
      uint32_t m = static_cast<uint32_t>(scaled);
      float rem = scaled - static_cast<float>(m);
      if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
      return static_cast<uint16_t>(sign | m);
    }
    uint32_t mant_odd = (abs >> 13) & 1u;
    abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
    return static_cast<uint16_t>(sign | (abs >> 13));
  }
  static float to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) return detail::bits_float(sign | 0x7f800000u | (mant << 13));
    if (exp == 0) {
      float v = static_cast<float>(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
      return sign ? -v : v;
    }
    return detail::bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  }
};

// bfloat16: the top 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa bits).
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  BFloat16(float f) : bits(from_float(f)) {}  // NOLINT: implicit like the built-in float types
  operator float() const { return detail::bits_float(static_cast<uint32_t>(bits) << 16); }

  static uint16_t from_float(float f) {
    uint32_t x = detail::float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
    return static_cast<uint16_t>((x + rounding) >> 16);
  }
};

}  // namespace tandem
