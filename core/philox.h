#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. Element i of a draw under (seed, offset) uses counter offset + i, so
// the CPU and every GPU thread produce the same stream independent of how the work is split.
#include <cstdint>

#include "tandem/core/scalar_math.h"

namespace tandem::philox {

struct Block {
  uint32_t w[4];
};

TANDEM_HOST_DEVICE uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  return static_cast<uint32_t>(product);
}

TANDEM_HOST_DEVICE Block generate(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, hi1;
    uint32_t lo0 = mulhilo(0xD2511F53u, c0, &hi0);
    uint32_t lo1 = mulhilo(0xCD9E8D57u, c2, &hi1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Block{{c0, c1, c2, c3}};
}

// A double in [0, 1) from 53 random bits of two words.
TANDEM_HOST_DEVICE double to_unit(uint32_t hi, uint32_t lo) {
  uint64_t bits = ((static_cast<uint64_t>(hi) << 32) | lo) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);  // 2^-53
}

TANDEM_HOST_DEVICE double uniform(uint64_t seed, uint64_t counter) {
  Block b = generate(seed, counter);
  return to_unit(b.w[0], b.w[1]);
}

// Standard normal by Box-Muller from the block's two 53-bit uniforms.
TANDEM_HOST_DEVICE double normal(uint64_t seed, uint64_t counter) {
  Block b = generate(seed, counter);
  double u1 = to_unit(b.w[0], b.w[1]) + 0.5 / 9007199254740992.0;  // (0, 1): keeps log finite
  double u2 = to_unit(b.w[2], b.w[3]);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace tandem::philox
