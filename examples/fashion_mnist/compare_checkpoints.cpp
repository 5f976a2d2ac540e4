// Compares two training checkpoints: the same tensors (names, shapes, dtypes) within a relative
// tolerance (per tensor: max |a - b| <= rtol * max |b|), and the same metadata except the keys
// given to ignore. Exits 0 when they match, 1 (printing the first differences) otherwise.
//
//   compare_checkpoints a.safetensors b.safetensors 1e-5 [ignored-metadata-key...]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "tandem/core/kernels.h"
#include "tandem/core/safetensors.h"

using namespace tandem;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: compare_checkpoints a.safetensors b.safetensors rtol [ignored-metadata-key...]\n");
    return 2;
  }
  const SafetensorsFile a = load_safetensors(argv[1]), b = load_safetensors(argv[2]);
  const double rtol = std::atof(argv[3]);
  const std::set<std::string> ignored(argv + 4, argv + argc);
  int differences = 0;
  auto report = [&](const std::string& what) {
    if (++differences <= 20) std::printf("%s\n", what.c_str());
  };
  for (const auto& [name, t] : a.tensors) {
    if (!b.contains(name)) {
      report("only in the first: " + name);
      continue;
    }
    const Tensor& u = b.at(name);
    if (t.shape() != u.shape() || t.dtype() != u.dtype()) {
      report(name + ": shape or dtype differs");
      continue;
    }
    std::vector<double> x = kernels::to_dtype(t, DType::f64).to_double_vector();
    std::vector<double> y = kernels::to_dtype(u, DType::f64).to_double_vector();
    double difference = 0, scale = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      difference = std::max(difference, std::abs(x[k] - y[k]));
      scale = std::max(scale, std::abs(y[k]));
    }
    if (!(difference <= rtol * scale)) {
      report(name + ": max difference " + std::to_string(difference) + ", " + std::to_string(difference / scale) +
             " of its largest element");
    }
  }
  for (const auto& [name, t] : b.tensors) {
    if (!a.contains(name)) report("only in the second: " + name);
  }
  for (const auto& [key, value] : a.metadata) {
    if (ignored.count(key)) continue;
    auto other = b.metadata.find(key);
    if (other == b.metadata.end() || other->second != value) report("metadata " + key + " differs");
  }
  if (differences > 0) {
    std::printf("%d differences\n", differences);
    return 1;
  }
  std::printf("the checkpoints match (%zu tensors, rtol %g)\n", a.tensors.size(), rtol);
  return 0;
}
