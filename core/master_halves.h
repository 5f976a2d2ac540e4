#pragma once
// A bf16 parameter's f32 master weight kept in two 16-bit halves (the optimizers' compact master
// weights, optim/optimizer.h): the parameter itself holds the high half, the master rounded to
// bf16, and a tensor beside it the low half. The master then costs 2 bytes per parameter instead
// of 4, and a fused update moves 26 bytes per AdamW parameter instead of 28, while it still reads
// and writes the full f32 master: join(high(x), low(x)) == x bit for bit for every f32 x that is
// not NaN (a NaN stays a NaN).
//
// The rounding is to nearest with ties away from zero, not to even: on the f32 bit patterns, the
// 65536 neighbours of high << 16 from -0x8000 to +0x7fff all round to `high`, so the low half,
// read as a signed 16-bit offset, says which of them the master is. Round-to-even would give an
// even high half 65537 neighbours (both ties), one too many for 16 bits. Both roundings agree
// except on an exact tie (the low 16 bits 0x8000) under an even high half.
//
// Bit patterns, not values: shared by the CPU and CUDA updates.
#include <cstdint>

#include "tandem/core/scalar_math.h"

namespace tandem::master_halves {

// The high half of the master with bits `bits`: the bf16 parameter.
TANDEM_HOST_DEVICE uint16_t high(uint32_t bits) {
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN: quiet NaN
  return static_cast<uint16_t>((bits + 0x8000u) >> 16);  // no carry into the sign: inf + 0x8000 stays inf
}

// The low half: the master's low 16 bits.
TANDEM_HOST_DEVICE uint16_t low(uint32_t bits) { return static_cast<uint16_t>(bits & 0xffffu); }

// The master's bits from its halves: high << 16 plus the low half as a signed offset (the
// rounding carried into the high half). A pair that no master splits into (other code set the
// parameter to +-0 or +-inf beside an old low half, and the offset would cross into the other sign
// or into NaN) joins to the parameter itself, so that high(join(h, l)) == h for every h that is
// not NaN: an update never jumps from its parameter. Only a NaN pattern can be such a pair (any
// other high << 16 + offset rounds back to high), so the check is left for those: the fused
// update joins every element of every step.
TANDEM_HOST_DEVICE uint32_t join(uint16_t high_half, uint16_t low_half) {
  const uint32_t offset = static_cast<uint32_t>(static_cast<int32_t>(static_cast<int16_t>(low_half)));
  const uint32_t bits = (static_cast<uint32_t>(high_half) << 16) + offset;  // mod 2^32
  if ((bits & 0x7fffffffu) <= 0x7f800000u) return bits;
  return high(bits) == high_half ? bits : static_cast<uint32_t>(high_half) << 16;
}

}  // namespace tandem::master_halves
