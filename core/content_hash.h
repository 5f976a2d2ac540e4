#pragma once
// The word mix behind kernels::content_hashes, shared by the CPU and CUDA backends so that both
// give the same digest of the same bytes: splitmix64's finaliser over the word and its index.
// A tensor's digest is the wrapping sum of mix(word, index) over its 8-byte words (the last one
// zero-padded), so blocks may add their parts in any order and still agree bit for bit.
#include <cstdint>

#include "tandem/core/scalar_math.h"

namespace tandem::hashing {

TANDEM_HOST_DEVICE uint64_t mix(uint64_t word, uint64_t index) {
  uint64_t z = word ^ (index * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace tandem::hashing
