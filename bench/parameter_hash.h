#pragma once
// A fingerprint of a model's parameters: 64-bit FNV-1a over every parameter's name, dtype, shape
// and bytes, in the model's order. Two runs end with bitwise-identical parameters exactly when
// their hashes agree (barring a 2^-64 collision); train_step --deterministic prints it.
#include <cstdint>
#include <string>

#include "tandem/layers/module.h"

namespace tandem::bench {

uint64_t parameter_hash(const nn::Module& model);  // copies each parameter to the host once
std::string hash_hex(uint64_t hash);               // 16 lowercase hex digits

}  // namespace tandem::bench
