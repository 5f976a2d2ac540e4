#include "tandem/core/column_sum_batch.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <utility>

namespace tandem {

namespace {
thread_local ColumnSumBatch* current = nullptr;
std::atomic<bool> batched{[] {
  const char* v = std::getenv("TANDEM_BATCH_COLUMN_SUMS");
  return v == nullptr || std::string(v) != "0";
}()};
std::atomic<uint64_t> flushes{0};
}  // namespace

void set_column_sums_batched(bool enabled) { batched = enabled; }
bool column_sums_batched() { return batched; }

void ColumnSumBatch::add(Launcher launcher, int device, void* stream, const Sum& sum, const Tensor& partial) {
  Group* group = nullptr;
  for (Group& g : groups_) {
    if (g.launcher == launcher && g.device == device && g.stream == stream) group = &g;
  }
  if (group == nullptr) {
    groups_.push_back(Group{launcher, device, stream, {}});
    group = &groups_.back();
  }
  group->sums.push_back(sum);
  const auto start = reinterpret_cast<uintptr_t>(sum.out);
  waiting_[start] = start + sum.out_bytes;
  held_.push_back(partial);
  held_bytes_ += partial.storage().nbytes();
  if (held_bytes_ > kMaxHeldBytes) flush();
}

bool ColumnSumBatch::waits_for(const Tensor& t) const {
  if (waiting_.empty() || !t.defined() || !t.storage().defined()) return false;
  const auto start = reinterpret_cast<uintptr_t>(t.storage().data());
  const uintptr_t end = start + t.storage().nbytes();
  // The outputs are disjoint, so the one starting last before `end` reaches furthest.
  auto it = waiting_.lower_bound(end);
  if (it == waiting_.begin()) return false;
  --it;
  return it->second > start;
}

void ColumnSumBatch::flush() {
  if (groups_.empty()) return;
  ++flushes;
  // Taken out first: a launcher that throws leaves the batch empty, not half launched twice.
  std::vector<Group> groups = std::move(groups_);
  std::vector<Tensor> held = std::move(held_);
  groups_.clear();
  held_.clear();
  waiting_.clear();
  held_bytes_ = 0;
  for (const Group& g : groups) g.launcher(g.sums, g.device, g.stream);
  // `held` goes here, after the launches: the allocator orders its reuse on the same stream.
}

uint64_t column_sum_batch_flushes() { return flushes; }

ColumnSumBatch* current_column_sum_batch() { return current; }

ColumnSumBatchScope::ColumnSumBatchScope(ColumnSumBatch* batch) : outer_(current) { current = batch; }
ColumnSumBatchScope::~ColumnSumBatchScope() { current = outer_; }

}  // namespace tandem
