#pragma once
// Column sums of gradients, finished together. The CUDA backward kernels that sum a gradient's
// columns (layer norm's weight, bias and residual-bias gradients, linear layers' bias gradients)
// write one partial row per block and add those rows in a second, small launch. On its own that
// launch takes a few microseconds (one round of loads, then block scheduling), 49 times in a GPT-2
// step.
//
// Inside a backward pass the engine makes a batch current, and the second launch waits in it: the
// partial rows are held, the results' memory is marked as waiting, and one launch adds every
// waiting sum, in the same order as alone (so to the same bits), when the engine is about to read
// one of the results (a node's gradient, two gradients it adds, a leaf's accumulation into .grad
// that exists, a hook), when the held partial rows pass kMaxHeldBytes, before an allocation that
// would set a new peak of the device's memory (so holding them never raises the peak; the CUDA
// allocator asks), or when backward ends.
// Parameters' gradients are read by nothing later in backward but their leaves, so in a step
// without hooks (one GPU) the whole backward's sums go in one launch.
//
// Elsewhere (no backward running, the CPU) nothing is current and the sums launch at once, as they
// do everywhere with set_column_sums_batched(false) or TANDEM_BATCH_COLUMN_SUMS=0 at start-up.
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem {

class ColumnSumBatch {
 public:
  // One column sum: `parts` partial rows (parts, d) at `partial`, added into the (d,) output at
  // `out`, `out_bytes` long. The element types are the launcher's.
  struct Sum {
    const void* partial = nullptr;
    void* out = nullptr;
    int64_t parts = 0;
    int64_t d = 0;
    size_t out_bytes = 0;
  };
  // Launches `sums` (all of one pair of element types) on `stream` of `device`, in order.
  using Launcher = void (*)(const std::vector<Sum>& sums, int device, void* stream);

  // Held partial rows beyond which the batch launches at once (bounds the memory it keeps).
  static constexpr size_t kMaxHeldBytes = size_t{64} << 20;

  ColumnSumBatch() = default;
  ColumnSumBatch(const ColumnSumBatch&) = delete;
  ColumnSumBatch& operator=(const ColumnSumBatch&) = delete;
  // Sums never launched are dropped with their partial rows: backward is being abandoned.
  ~ColumnSumBatch() = default;

  // Makes `sum` wait for the next flush; `partial` (its partial rows' tensor) is held until then.
  void add(Launcher launcher, int device, void* stream, const Sum& sum, const Tensor& partial);
  bool empty() const { return groups_.empty(); }
  // Whether t's memory overlaps a waiting sum's output.
  bool waits_for(const Tensor& t) const;
  // Launches every waiting sum; nothing when none waits.
  void flush();
  // flush() when t waits for a sum here.
  void flush_for(const Tensor& t) {
    if (waits_for(t)) flush();
  }

 private:
  struct Group {
    Launcher launcher = nullptr;
    int device = -1;
    void* stream = nullptr;
    std::vector<Sum> sums;
  };
  std::vector<Group> groups_;               // in the order of their first sum
  std::map<uintptr_t, uintptr_t> waiting_;  // output start -> end, disjoint
  std::vector<Tensor> held_;                // the partial rows
  size_t held_bytes_ = 0;
};

// Whether backward passes batch their column sums (on unless TANDEM_BATCH_COLUMN_SUMS=0).
void set_column_sums_batched(bool enabled);
bool column_sums_batched();

// Flushes that launched something, in this process so far (what tests and benchmarks count).
uint64_t column_sum_batch_flushes();

// The batch of the backward pass running on this thread, or null.
ColumnSumBatch* current_column_sum_batch();

// Makes `batch` current for the scope (null: sums launch at once).
class ColumnSumBatchScope {
 public:
  explicit ColumnSumBatchScope(ColumnSumBatch* batch);
  ~ColumnSumBatchScope();
  ColumnSumBatchScope(const ColumnSumBatchScope&) = delete;
  ColumnSumBatchScope& operator=(const ColumnSumBatchScope&) = delete;

 private:
  ColumnSumBatch* outer_;
};

}  // namespace tandem
