#include "tandem/core/dtype.h"

#include "tandem/core/error.h"

namespace tandem {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::boolean: return "bool";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::u8:
    case DType::boolean: return 1;
  }
  return 0;
}

bool is_floating(DType dtype) {
  return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
}

bool is_half(DType dtype) { return dtype == DType::f16 || dtype == DType::bf16; }

DType dtype_from_name(const std::string& name) {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8,
                  DType::boolean}) {
    if (name == dtype_name(d)) return d;
  }
  TANDEM_THROW(ValueError, "unknown dtype '", name,
               "': expected one of f32, f64, f16, bf16, i32, i64, u8, bool");
}

std::ostream& operator<<(std::ostream& out, DType dtype) { return out << dtype_name(dtype); }

}  // namespace tandem
