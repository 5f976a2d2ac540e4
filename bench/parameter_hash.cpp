#include "parameter_hash.h"

#include <cstdio>

#include "tandem/core/copy.h"

namespace tandem::bench {

namespace {
constexpr uint64_t kFnvOffset = 14695981039346656037ull;
constexpr uint64_t kFnvPrime = 1099511628211ull;

void fnv1a(uint64_t& h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= kFnvPrime;
  }
}
}  // namespace

uint64_t parameter_hash(const nn::Module& model) {
  uint64_t h = kFnvOffset;
  for (const auto& [name, p] : model.named_parameters()) {
    Tensor host = contiguous(p.detach().to(Device("cpu")));  // same shape and dtype as p
    fnv1a(h, name.data(), name.size());
    int dtype = static_cast<int>(host.dtype());
    fnv1a(h, &dtype, sizeof dtype);
    for (int64_t d : host.shape()) fnv1a(h, &d, sizeof d);
    fnv1a(h, host.data_ptr(), static_cast<size_t>(host.numel()) * host.element_size());
  }
  return h;
}

std::string hash_hex(uint64_t hash) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

}  // namespace tandem::bench
