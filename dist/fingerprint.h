#pragma once
// Internal to dist/: what one collective is (op, reduce op, dtype, element count, root, label) in a
// fixed-size record that travels between ranks as bytes, and the rolling hash of a group's
// sequence of them. Ranks that issue the same collectives in the same order have equal records
// at every sequence number and equal rolling hashes.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/core/dtype.h"
#include "tandem/dist/process_group.h"

namespace tandem::dist::internal {

// Trivially copyable: MPI carries it as bytes. Unused fields are kNone.
struct Fingerprint {
  static constexpr uint8_t kNone = 255;
  static constexpr size_t kLabelBytes = 79;
  uint64_t seq = 0;     // 1, 2, ... per group
  uint64_t count = 0;   // elements (summed over the tensors of a grouped call)
  int32_t root = -1;    // broadcast
  uint8_t dtype = kNone;
  uint8_t reduce = kNone;
  char op[16] = {};     // "all_reduce", NUL-terminated
  char label[kLabelBytes + 1] = {};  // truncated, NUL-terminated

  static Fingerprint make(const char* op, size_t count, std::optional<DType> dtype, std::optional<ReduceOp> reduce,
                          int root, const std::string& label);
  // The same collective (everything but seq)?
  bool matches(const Fingerprint& other) const;
  // "all_reduce #57 'ddp bucket 3 of step 3' (300000 f32 elements, 1.2 MB, avg)"
  std::string describe() const;
  size_t bytes() const;
};

// The next rolling hash after `fingerprint` (FNV-1a over its fields but seq).
uint64_t roll_hash(uint64_t hash, const Fingerprint& fingerprint);
constexpr uint64_t kInitialHash = 1469598103934665603ull;

// "4 B", "12.5 KB", "1.2 MB"
std::string short_bytes(size_t bytes);

// Given every rank's fingerprint of one collective (index = rank), "" when they all match, else the
// error: "rank 1 issued all_reduce #57 'metrics' (1 f32 element, 4 B, sum) where rank 0 issued
// all_reduce #57 'ddp bucket 3 of step 3' (300000 f32 elements, 1.2 MB, avg)", one such clause per
// rank that differs from rank 0.
std::string mismatch_text(const std::vector<Fingerprint>& per_rank);

}  // namespace tandem::dist::internal
