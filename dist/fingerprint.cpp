#include "tandem/dist/fingerprint.h"

#include <cstdio>
#include <cstring>

#include "tandem/core/error.h"

namespace tandem::dist::internal {

Fingerprint Fingerprint::make(const char* op, size_t count, std::optional<DType> dtype,
                              std::optional<ReduceOp> reduce, int root, const std::string& label) {
  Fingerprint f;
  f.count = count;
  f.root = root;
  f.dtype = dtype ? static_cast<uint8_t>(*dtype) : kNone;
  f.reduce = reduce ? static_cast<uint8_t>(*reduce) : kNone;
  std::strncpy(f.op, op, sizeof(f.op) - 1);
  std::strncpy(f.label, label.c_str(), kLabelBytes);
  return f;
}

bool Fingerprint::matches(const Fingerprint& o) const {
  return count == o.count && root == o.root && dtype == o.dtype && reduce == o.reduce &&
         std::strncmp(op, o.op, sizeof(op)) == 0 && std::strncmp(label, o.label, sizeof(label)) == 0;
}

size_t Fingerprint::bytes() const { return dtype == kNone ? 0 : count * dtype_size(static_cast<DType>(dtype)); }

std::string short_bytes(size_t n) {
  char text[32];
  if (n < 1000) {
    std::snprintf(text, sizeof(text), "%zu B", n);
  } else if (n < 1000 * 1000) {
    std::snprintf(text, sizeof(text), "%.1f KB", n / 1e3);
  } else if (n < size_t(1000) * 1000 * 1000) {
    std::snprintf(text, sizeof(text), "%.1f MB", n / 1e6);
  } else {
    std::snprintf(text, sizeof(text), "%.2f GB", n / 1e9);
  }
  return text;
}

std::string Fingerprint::describe() const {
  if (op[0] == '\0') return ::tandem::detail::concat("no collective #", seq);
  std::string text = ::tandem::detail::concat(op, " #", seq, " '", label, "'");
  if (dtype == kNone) return text;
  text += ::tandem::detail::concat(" (", count, " ", dtype_name(static_cast<DType>(dtype)),
                                   count == 1 ? " element, " : " elements, ", short_bytes(bytes()));
  if (reduce != kNone) text += ::tandem::detail::concat(", ", reduce_op_name(static_cast<ReduceOp>(reduce)));
  if (root >= 0) text += ::tandem::detail::concat(", root ", root);
  return text + ")";
}

namespace {
uint64_t fnv(uint64_t hash, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}
}  // namespace

uint64_t roll_hash(uint64_t hash, const Fingerprint& f) {
  hash = fnv(hash, &f.count, sizeof(f.count));
  hash = fnv(hash, &f.root, sizeof(f.root));
  hash = fnv(hash, &f.dtype, sizeof(f.dtype));
  hash = fnv(hash, &f.reduce, sizeof(f.reduce));
  hash = fnv(hash, f.op, std::strlen(f.op));
  return fnv(hash, f.label, std::strlen(f.label));
}

std::string mismatch_text(const std::vector<Fingerprint>& per_rank) {
  std::string text;
  for (size_t r = 1; r < per_rank.size(); ++r) {
    if (per_rank[r].matches(per_rank[0])) continue;
    if (!text.empty()) text += "; ";
    text += ::tandem::detail::concat("rank ", r, " issued ", per_rank[r].describe(), " where rank 0 issued ",
                                     per_rank[0].describe());
  }
  return text;
}

}  // namespace tandem::dist::internal
