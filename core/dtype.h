#pragma once
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

#include "tandem/core/half.h"

namespace tandem {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8, boolean };

const char* dtype_name(DType dtype);   // "f32", "bf16", "bool", ...
size_t dtype_size(DType dtype);        // bytes per element
bool is_floating(DType dtype);         // f32, f64, f16, bf16
bool is_half(DType dtype);             // f16, bf16: stored in 16 bits, computed in f32
DType dtype_from_name(const std::string& name);  // inverse of dtype_name; throws on unknown names
std::ostream& operator<<(std::ostream& out, DType dtype);

// Maps a C++ element type to its DType.
template <typename T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::f16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::bf16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::i64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::u8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::boolean; };

// The type arithmetic on T happens in: f32 for the half types, T itself otherwise.
template <typename T> struct ComputeType { using type = T; };
template <> struct ComputeType<Half> { using type = float; };
template <> struct ComputeType<BFloat16> { using type = float; };
template <typename T> using compute_t = typename ComputeType<T>::type;

}  // namespace tandem
