// Half of the safetensors interoperability check with Python's `safetensors` package
// (safetensors_interop.py is the other half). Both sides fill tensors of every dtype from one
// formula, so each can check the other's file without sharing data:
//   safetensors_interop write PATH   writes the tensors and metadata {"writer": "tandem"}
//   safetensors_interop read PATH [--without-bf16]
//                                    checks a file written by Python: names, dtypes, shapes, values
//                                    (--without-bf16: numpy, which has no bf16, wrote it)
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "tandem/core/kernels.h"
#include "tandem/core/safetensors.h"
#include "tandem/core/views.h"

using namespace tandem;

namespace {
// Element i of tensor k: small multiples of 1/8, exact in every float dtype; integers and
// booleans from the same numerator.
double value(DType dtype, int64_t k, int64_t i) {
  const int64_t n = (i * 37 + k * 11) % 101;
  switch (dtype) {
    case DType::u8: return static_cast<double>(n);
    case DType::boolean: return static_cast<double>(n % 2);
    case DType::i32:
    case DType::i64: return static_cast<double>(n - 50);
    default: return static_cast<double>(n - 50) / 8.0;
  }
}

struct Spec {
  std::string name;
  DType dtype;
  Shape shape;
};

// The tensors each writer produces: Python's have other shapes than tandem's.
std::vector<Spec> specs(bool python) {
  const DType dtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8,
                          DType::boolean};
  std::vector<Spec> out;
  int64_t k = 0;
  for (DType d : dtypes) {
    Shape shape = python ? Shape{k + 1, 3} : Shape{2, k + 2, 3};
    out.push_back({std::string("t_") + safetensors_dtype_name(d), d, shape});
    ++k;
  }
  out.push_back({"scalar_f32", DType::f32, {}});
  out.push_back({"empty_f32", DType::f32, {0, 4}});
  return out;
}

Tensor make(const Spec& s, int64_t k) {
  const int64_t n = shape_numel(s.shape);
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[i] = value(s.dtype, k, i);
  // from_vector reads an empty shape as "1-D"; the view gives 0-dim tensors their shape.
  Tensor flat = kernels::to_dtype(from_vector(values, {n}, DType::f64), s.dtype);
  return views::view(flat, s.shape);
}
}  // namespace

int main(int argc, char** argv) {
  const bool without_bf16 = argc == 4 && std::string(argv[3]) == "--without-bf16";
  if ((argc != 3 && !without_bf16) || (std::string(argv[1]) != "write" && std::string(argv[1]) != "read")) {
    std::fprintf(stderr, "usage: %s write PATH | read PATH [--without-bf16]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1], path = argv[2];
  try {
    if (mode == "write") {
      std::vector<std::pair<std::string, Tensor>> tensors;
      int64_t k = 0;
      for (const Spec& s : specs(false)) tensors.emplace_back(s.name, make(s, k++));
      save_safetensors(path, tensors, {{"writer", "tandem"}});
      std::printf("wrote %zu tensors to %s\n", tensors.size(), path.c_str());
      return 0;
    }
    SafetensorsFile file = load_safetensors(path);
    int failures = 0;
    const size_t expected = specs(true).size() - (without_bf16 ? 1 : 0);
    if (file.tensors.size() != expected) {
      std::printf("FAIL: %zu tensors, expected %zu\n", file.tensors.size(), expected);
      ++failures;
    }
    int64_t k = 0;
    for (const Spec& s : specs(true)) {
      if (without_bf16 && s.dtype == DType::bf16) {
        ++k;
        continue;
      }
      auto it = file.tensors.find(s.name);
      if (it == file.tensors.end()) {
        std::printf("FAIL: no tensor %s\n", s.name.c_str());
        ++failures;
      } else if (it->second.dtype() != s.dtype || it->second.shape() != s.shape) {
        std::printf("FAIL: %s is %s %s, expected %s %s\n", s.name.c_str(), dtype_name(it->second.dtype()),
                    shape_str(it->second.shape()).c_str(), dtype_name(s.dtype), shape_str(s.shape).c_str());
        ++failures;
      } else if (it->second.to_double_vector() != make(s, k).to_double_vector()) {
        std::printf("FAIL: %s has other values\n", s.name.c_str());
        ++failures;
      } else {
        std::printf("ok: %s %s %s\n", s.name.c_str(), dtype_name(s.dtype), shape_str(s.shape).c_str());
      }
      ++k;
    }
    auto writer = file.metadata.find("writer");
    if (writer == file.metadata.end() || writer->second != "python") {
      std::printf("FAIL: metadata writer is not \"python\"\n");
      ++failures;
    }
    std::printf("%s: %d failure(s)\n", path.c_str(), failures);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "safetensors_interop: %s\n", e.what());
    return 1;
  }
}
