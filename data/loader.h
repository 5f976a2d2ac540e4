#pragma once
// Mini-batches over in-memory tensors, prepared one step ahead on a background thread.
//
//   DataLoaderOptions options;
//   options.batch_size = 128;
//   options.device = Device("cuda");
//   DataLoader loader(images, labels, options);
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);
//     while (auto batch = loader.next()) step(batch->inputs, batch->targets);
//   }
//
// The order of an epoch depends only on (seed, epoch): a shuffled epoch is randperm under a
// Generator seeded with seed + epoch (as PyTorch's DistributedSampler does), so a run is
// reproducible and a resumed run sees the same batches. One thread drives a loader.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::data {

struct Batch {
  Tensor inputs;                        // (B, ...) on the loader's device
  Tensor targets;                       // (B, ...) on the loader's device
  int64_t index = 0;                    // the batch's number within the epoch
  std::vector<int64_t> sample_indices;  // (B,) the samples it holds, as rows of the full tensors
};

struct DataLoaderOptions {
  int64_t batch_size = 64;
  bool shuffle = true;
  bool drop_last = false;  // drop a last batch smaller than batch_size
  uint64_t seed = 0;
  Device device;  // where batches are delivered
  // Batches prepared ahead by the background thread; 0 prepares each one in next(), on the
  // calling thread, with no thread at all.
  int64_t prefetch = 2;
  // Runs on each batch before it is moved to `device` (on the background thread when there is one),
  // e.g. data augmentation on the cpu. An exception it throws comes out of next().
  std::function<void(Batch&)> transform;
};

class DataLoader {
 public:
  // inputs (N, ...) and targets (N, ...) share N; they stay in memory where they are (cpu or the
  // target device) and are not copied.
  DataLoader(Tensor inputs, Tensor targets, DataLoaderOptions options = {});
  ~DataLoader();  // stops the background thread; never throws
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Samples to draw from, as rows of the full tensors (repeats allowed), e.g. one rank's shard;
  // without a call, every row. Ends the current epoch: call start_epoch before next().
  void set_indices(std::vector<int64_t> indices);
  void clear_indices();

  // Starts `epoch` (any earlier one is abandoned), from batch `first_batch` on: a run resumed
  // mid-epoch passes the number of batches it already took.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The epoch's next batch, or nothing at its end. Rethrows an error raised while preparing it.
  std::optional<Batch> next();

  int64_t num_samples() const;              // rows per epoch: the index subset's size, else N
  int64_t num_batches() const;              // per epoch, with drop_last applied
  int64_t epoch() const { return epoch_; }  // the last started, -1 before any
  const DataLoaderOptions& options() const { return options_; }

 private:
  struct Shared;
  Batch make_batch(int64_t index, std::vector<int64_t> rows) const;
  void worker_loop();

  Tensor inputs_;
  Tensor targets_;
  DataLoaderOptions options_;
  std::vector<int64_t> indices_;  // empty: every row
  bool has_indices_ = false;
  int64_t epoch_ = -1;
  std::unique_ptr<Shared> shared_;  // state shared with the background thread
};

}  // namespace tandem::data
