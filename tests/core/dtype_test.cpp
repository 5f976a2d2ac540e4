// DTypes (names, sizes, classification) and the host 16-bit float types, checked against known
// IEEE 754 binary16 and bfloat16 bit patterns and against a rounding reference computed in double.
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <type_traits>

#include "support/test_util.h"

namespace tandem {
namespace {

const DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                            DType::i32, DType::i64, DType::u8,  DType::boolean};

float bits_to_float(uint32_t u) { return detail::bits_float(u); }

TEST(DType, NamesAndSizes) {
  EXPECT_STREQ(dtype_name(DType::f32), "f32");
  EXPECT_STREQ(dtype_name(DType::f64), "f64");
  EXPECT_STREQ(dtype_name(DType::f16), "f16");
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_STREQ(dtype_name(DType::i32), "i32");
  EXPECT_STREQ(dtype_name(DType::i64), "i64");
  EXPECT_STREQ(dtype_name(DType::u8), "u8");
  EXPECT_STREQ(dtype_name(DType::boolean), "bool");
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(dtype_size(DType::i32), 4u);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_size(DType::u8), 1u);
  EXPECT_EQ(dtype_size(DType::boolean), 1u);
}

TEST(DType, SizesMatchTheCppTypes) {
  EXPECT_EQ(dtype_size(DTypeOf<float>::value), sizeof(float));
  EXPECT_EQ(dtype_size(DTypeOf<double>::value), sizeof(double));
  EXPECT_EQ(dtype_size(DTypeOf<Half>::value), sizeof(Half));
  EXPECT_EQ(dtype_size(DTypeOf<BFloat16>::value), sizeof(BFloat16));
  EXPECT_EQ(dtype_size(DTypeOf<int32_t>::value), sizeof(int32_t));
  EXPECT_EQ(dtype_size(DTypeOf<int64_t>::value), sizeof(int64_t));
  EXPECT_EQ(dtype_size(DTypeOf<uint8_t>::value), sizeof(uint8_t));
  EXPECT_EQ(dtype_size(DTypeOf<bool>::value), sizeof(bool));
  static_assert(std::is_same_v<compute_t<Half>, float>);
  static_assert(std::is_same_v<compute_t<BFloat16>, float>);
  static_assert(std::is_same_v<compute_t<double>, double>);
  static_assert(std::is_same_v<compute_t<int32_t>, int32_t>);
}

TEST(DType, Classification) {
  for (DType d : kAllDTypes) {
    bool floating = d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16;
    EXPECT_EQ(is_floating(d), floating) << d;
    EXPECT_EQ(is_half(d), d == DType::f16 || d == DType::bf16) << d;
  }
}

TEST(DType, FromNameRoundTripsEveryDType) {
  for (DType d : kAllDTypes) {
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
    std::ostringstream out;
    out << d;
    EXPECT_EQ(out.str(), dtype_name(d));
  }
}

TEST(DType, FromNameRejectsUnknownNames) {
  for (const char* name : {"float32", "F32", "", "boolean", "int"}) {
    EXPECT_TRUE(testing::throws_with<ValueError>([&] { dtype_from_name(name); },
                                                 {std::string("unknown dtype '") + name + "'", "f32", "bool"}));
  }
}

// ---- Half (IEEE binary16) ----

TEST(Half, ExactValuesHaveKnownBits) {
  EXPECT_EQ(Half(1.0f).bits, 0x3C00);
  EXPECT_EQ(Half(-2.5f).bits, 0xC100);
  EXPECT_EQ(Half(0.5f).bits, 0x3800);
  EXPECT_EQ(Half(65504.0f).bits, 0x7BFF);  // the largest finite half
  EXPECT_EQ(Half(-65504.0f).bits, 0xFBFF);
  EXPECT_EQ(Half(0.0f).bits, 0x0000);
  EXPECT_EQ(Half(-0.0f).bits, 0x8000);
  EXPECT_EQ(Half(std::ldexp(1.0f, -14)).bits, 0x0400);         // the smallest normal
  EXPECT_EQ(Half(std::ldexp(1.0f, -24)).bits, 0x0001);         // the smallest subnormal
  EXPECT_EQ(Half(1023 * std::ldexp(1.0f, -24)).bits, 0x03FF);  // the largest subnormal
  EXPECT_EQ(Half(std::ldexp(3.0f, -20)).bits, 0x0030);         // a subnormal: 48 ulps of 2^-24
}

TEST(Half, InfinityAndNaN) {
  float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Half(inf).bits, 0x7C00);
  EXPECT_EQ(Half(-inf).bits, 0xFC00);
  for (uint32_t nan_bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FBFFFFFu}) {
    Half h(bits_to_float(nan_bits));
    EXPECT_EQ(h.bits & 0x7C00, 0x7C00) << std::hex << nan_bits;
    EXPECT_NE(h.bits & 0x03FF, 0) << "NaN " << std::hex << nan_bits << " became an infinity";
    EXPECT_TRUE(std::isnan(static_cast<float>(h)));
  }
  EXPECT_TRUE(std::isinf(static_cast<float>(Half(inf))));
}

TEST(Half, OverflowRoundsToInfinityOnlyPastTheHalfwayPoint) {
  EXPECT_EQ(Half(65519.0f).bits, 0x7BFF);  // below the midpoint 65520: stays finite
  EXPECT_EQ(Half(65520.0f).bits, 0x7C00);  // the midpoint ties to even (the infinity)
  EXPECT_EQ(Half(1e6f).bits, 0x7C00);
  EXPECT_EQ(Half(-1e6f).bits, 0xFC00);
  EXPECT_EQ(Half(std::numeric_limits<float>::max()).bits, 0x7C00);
}

TEST(Half, RoundsToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 (0x3C00, even) and 1 + 2^-10 (0x3C01): even wins.
  EXPECT_EQ(Half(1.0f + std::ldexp(1.0f, -11)).bits, 0x3C00);
  // 1 + 3 * 2^-11 lies halfway between 0x3C01 and 0x3C02: even wins again, this time upwards.
  EXPECT_EQ(Half(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3C02);
  // Just above a midpoint rounds up.
  EXPECT_EQ(Half(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)).bits, 0x3C01);
  // 0.1 is not exact: its nearest half is 0x2E66.
  EXPECT_EQ(Half(0.1f).bits, 0x2E66);
  // Subnormal midpoints: 0.5, 1.5 and 2.5 ulps of 2^-24.
  float ulp = std::ldexp(1.0f, -24);
  EXPECT_EQ(Half(0.5f * ulp).bits, 0x0000);
  EXPECT_EQ(Half(1.5f * ulp).bits, 0x0002);
  EXPECT_EQ(Half(2.5f * ulp).bits, 0x0002);
  EXPECT_EQ(Half(0.51f * ulp).bits, 0x0001);
  // Rounding up out of the subnormal range gives the smallest normal.
  EXPECT_EQ(Half(1023.5f * ulp).bits, 0x0400);
}

TEST(Half, ToFloatOfKnownBits) {
  EXPECT_EQ(Half::to_float(0x3C00), 1.0f);
  EXPECT_EQ(Half::to_float(0xC100), -2.5f);
  EXPECT_EQ(Half::to_float(0x7BFF), 65504.0f);
  EXPECT_EQ(Half::to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(Half::to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(Half::to_float(0x83FF), -1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(Half::to_float(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Half::to_float(0x7E00)));
  EXPECT_TRUE(std::signbit(Half::to_float(0x8000)));
}

TEST(Half, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    auto bits = static_cast<uint16_t>(b);
    float f = Half::to_float(bits);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Half::to_float(Half::from_float(f))));
    } else {
      ASSERT_EQ(Half::from_float(f), bits) << "bits 0x" << std::hex << b;
    }
  }
}

// The nearest binary16 of a finite float, by round-to-nearest-even in double.
uint16_t reference_half(float f) {
  double a = std::fabs(static_cast<double>(f));
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (a < std::ldexp(1.0, -14))
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0)));
  int e = std::ilogb(a);
  double q = std::nearbyint(std::ldexp(a, -e) * 1024.0);  // in [1024, 2048]
  if (q == 2048.0) {
    q = 1024.0;
    ++e;
  }
  if (e > 15) return static_cast<uint16_t>(sign | 0x7C00);
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | (static_cast<int>(q) - 1024));
}

TEST(Half, RandomFloatsRoundLikeAReferenceInDouble) {
  std::mt19937_64 rng(testing::next_seed());
  // Exponents from deep in the subnormal range to past the overflow point.
  std::uniform_int_distribution<uint32_t> exponent(127 - 30, 127 + 17), mantissa(0, 0x7FFFFF), sign(0, 1);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = (sign(rng) << 31) | (exponent(rng) << 23) | mantissa(rng);
    float f = bits_to_float(bits);
    ASSERT_EQ(Half::from_float(f), reference_half(f)) << "float bits 0x" << std::hex << bits;
  }
}

// ---- BFloat16 ----

TEST(BFloat16, ExactValuesHaveKnownBits) {
  EXPECT_EQ(BFloat16(1.0f).bits, 0x3F80);
  EXPECT_EQ(BFloat16(-2.5f).bits, 0xC020);
  EXPECT_EQ(BFloat16(65504.0f).bits, 0x4780);  // 65504 is not exact in bf16: rounds to 65536
  EXPECT_EQ(BFloat16(0.0f).bits, 0x0000);
  EXPECT_EQ(BFloat16(-0.0f).bits, 0x8000);
  EXPECT_EQ(BFloat16(3.14159265f).bits, 0x4049);  // 3.140625
  EXPECT_EQ(static_cast<float>(BFloat16(-2.5f)), -2.5f);
  EXPECT_EQ(static_cast<float>(BFloat16(3.14159265f)), 3.140625f);
}

TEST(BFloat16, InfinityNaNAndOverflow) {
  float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(BFloat16(inf).bits, 0x7F80);
  EXPECT_EQ(BFloat16(-inf).bits, 0xFF80);
  EXPECT_EQ(BFloat16(std::numeric_limits<float>::max()).bits, 0x7F80);  // rounds past the largest bf16
  for (uint32_t nan_bits : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7F80FFFFu}) {
    BFloat16 b(bits_to_float(nan_bits));
    EXPECT_TRUE(std::isnan(static_cast<float>(b))) << "NaN 0x" << std::hex << nan_bits << " became 0x" << b.bits;
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(BFloat16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3F80);      // midpoint, even is down
  EXPECT_EQ(BFloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3F82);  // midpoint, even is up
  EXPECT_EQ(BFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)).bits, 0x3F81);
  EXPECT_EQ(BFloat16(bits_to_float(0x3F80FFFFu)).bits, 0x3F81);
  EXPECT_EQ(BFloat16(bits_to_float(0x000116C2u)).bits, 0x0001);  // a float subnormal
}

TEST(BFloat16, EveryBitPatternRoundTripsThroughFloat) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    BFloat16 x;
    x.bits = static_cast<uint16_t>(b);
    float f = x;
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(f))));
    } else {
      ASSERT_EQ(BFloat16::from_float(f), x.bits) << "bits 0x" << std::hex << b;
    }
  }
}

uint16_t reference_bf16(float f) {
  double a = std::fabs(static_cast<double>(f));
  uint32_t sign = std::signbit(f) ? 0x8000u : 0u;
  if (a < std::ldexp(1.0, -126)) {  // float subnormals: 7 mantissa bits at a fixed 2^-133 step
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(std::ldexp(a, 133))));
  }
  int e = std::ilogb(a);
  double q = std::nearbyint(std::ldexp(a, -e) * 128.0);  // in [128, 256]
  if (q == 256.0) {
    q = 128.0;
    ++e;
  }
  if (e > 127) return static_cast<uint16_t>(sign | 0x7F80u);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(e + 127) << 7) | (static_cast<uint32_t>(q) - 128));
}

TEST(BFloat16, RandomFloatsRoundLikeAReferenceInDouble) {
  std::mt19937_64 rng(testing::next_seed());
  std::uniform_int_distribution<uint32_t> bits_dist(0, 0xFFFFFFFFu);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = bits_dist(rng);
    float f = bits_to_float(bits);
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(BFloat16::from_float(f), reference_bf16(f)) << "float bits 0x" << std::hex << bits;
  }
}

}  // namespace
}  // namespace tandem
