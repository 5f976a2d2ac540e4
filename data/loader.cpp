#include "tandem/data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"
#include "tandem/core/random.h"

namespace tandem::data {

struct DataLoader::Shared {
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  bool active = false;         // an epoch is running (set by start_epoch, cleared by set_indices)
  uint64_t generation = 0;     // bumped whenever the running epoch is abandoned
  std::vector<int64_t> order;  // the epoch's rows, in the order batches take them
  int64_t end_batch = 0;
  int64_t next_prepare = 0;  // the background thread's next batch
  int64_t next_return = 0;   // next()'s next batch
  std::deque<Batch> ready;   // prepared, in batch order
  std::exception_ptr error;  // raised preparing batch next_return + ready.size(); sticky
  std::thread thread;
};

namespace {

// t on `device`. A cpu batch bound for a GPU goes through page-locked memory, and the copy is
// waited for here (on the background thread), so the pinned buffer can be freed afterwards.
Tensor move_to(const Tensor& t, Device device) {
  if (t.device() == device) return t;
  if (t.device().is_cpu() && device.is_cuda()) {
    Tensor pinned = pin_memory(t);
    Tensor out = kernels::to_device(pinned, device);
    // Wait for this copy (and what the stream ran before it) only: a device-wide synchronisation
    // from this thread would break a CUDA graph capture under way on the training thread.
    cuda::Event copied;
    copied.record(device.index);
    copied.synchronize();
    return out;
  }
  return kernels::to_device(t, device);
}

}  // namespace

DataLoader::DataLoader(Tensor inputs, Tensor targets, DataLoaderOptions options)
    : inputs_(std::move(inputs)),
      targets_(std::move(targets)),
      options_(std::move(options)),
      shared_(std::make_unique<Shared>()) {
  TANDEM_CHECK_AS(ValueError, inputs_.defined() && targets_.defined(),
                  "DataLoader: inputs and targets must be defined");
  TANDEM_CHECK_AS(ValueError, inputs_.dim() >= 1 && targets_.dim() >= 1, "DataLoader: inputs ",
                  shape_str(inputs_.shape()), " and targets ", shape_str(targets_.shape()),
                  " need a leading sample dim");
  TANDEM_CHECK_AS(ValueError, inputs_.size(0) == targets_.size(0), "DataLoader: inputs hold ", inputs_.size(0),
                  " samples but targets ", targets_.size(0));
  TANDEM_CHECK_AS(ValueError, options_.batch_size > 0, "DataLoader: batch_size must be positive, got ",
                  options_.batch_size);
  TANDEM_CHECK_AS(ValueError, options_.prefetch >= 0, "DataLoader: prefetch must be >= 0, got ", options_.prefetch);
  TANDEM_CHECK_AS(DeviceError, !options_.device.is_cuda() || cuda::is_available(), "DataLoader: batches for ",
                  options_.device, " but ", cuda::is_built() ? "no GPU is visible" : "tandem was built without CUDA");
  if (options_.prefetch > 0) shared_->thread = std::thread([this] { worker_loop(); });
}

DataLoader::~DataLoader() {
  try {
    if (shared_->thread.joinable()) {
      {
        std::lock_guard<std::mutex> lock(shared_->mutex);
        shared_->stop = true;
      }
      shared_->cv.notify_all();
      shared_->thread.join();  // after the batch in progress, if any
    }
  } catch (...) {
    // Nothing sensible to do while destroying; the thread cannot outlive a failed join anyway.
  }
}

int64_t DataLoader::num_samples() const {
  return has_indices_ ? static_cast<int64_t>(indices_.size()) : inputs_.size(0);
}

int64_t DataLoader::num_batches() const {
  int64_t n = num_samples();
  int64_t bs = options_.batch_size;
  return options_.drop_last ? n / bs : (n + bs - 1) / bs;
}

void DataLoader::set_indices(std::vector<int64_t> indices) {
  int64_t n = inputs_.size(0);
  for (size_t i = 0; i < indices.size(); ++i) {
    TANDEM_CHECK_AS(IndexError, indices[i] >= 0 && indices[i] < n, "DataLoader::set_indices: index ", indices[i],
                    " at position ", i, " is outside [0, ", n, ")");
  }
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->active = false;
  shared_->generation++;
  shared_->ready.clear();
  shared_->error = nullptr;
  indices_ = std::move(indices);
  has_indices_ = true;
}

void DataLoader::clear_indices() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  shared_->active = false;
  shared_->generation++;
  shared_->ready.clear();
  shared_->error = nullptr;
  indices_.clear();
  has_indices_ = false;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  TANDEM_CHECK_AS(ValueError, epoch >= 0, "DataLoader::start_epoch: epoch must be >= 0, got ", epoch);
  int64_t batches = num_batches();
  TANDEM_CHECK_AS(ValueError, first_batch >= 0 && first_batch <= batches, "DataLoader::start_epoch: first_batch ",
                  first_batch, " is outside [0, ", batches, "]");
  int64_t n = num_samples();
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = has_indices_ ? indices_[i] : i;
  if (options_.shuffle && n > 1) {
    Generator gen(options_.seed + static_cast<uint64_t>(epoch));
    std::vector<int64_t> perm = randperm(n, &gen).to_vector<int64_t>();
    std::vector<int64_t> shuffled(order.size());
    for (int64_t i = 0; i < n; ++i) shuffled[i] = order[perm[i]];
    order = std::move(shuffled);
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->generation++;
    shared_->ready.clear();
    shared_->error = nullptr;
    shared_->order = std::move(order);
    shared_->end_batch = batches;
    shared_->next_prepare = first_batch;
    shared_->next_return = first_batch;
    shared_->active = true;
  }
  shared_->cv.notify_all();
  epoch_ = epoch;
}

Batch DataLoader::make_batch(int64_t index, std::vector<int64_t> rows) const {
  auto count = static_cast<int64_t>(rows.size());
  Tensor idx = from_vector(rows, {count});  // (B,) i64 on the cpu
  Batch batch;
  batch.index = index;
  // A data set already on a GPU is gathered there.
  batch.inputs = kernels::index_select(inputs_, 0, kernels::to_device(idx, inputs_.device()));     // (B, ...)
  batch.targets = kernels::index_select(targets_, 0, kernels::to_device(idx, targets_.device()));  // (B, ...)
  batch.sample_indices = std::move(rows);
  if (options_.transform) options_.transform(batch);
  batch.inputs = move_to(batch.inputs, options_.device);
  batch.targets = move_to(batch.targets, options_.device);
  return batch;
}

namespace {
// The rows of batch `index`.
std::vector<int64_t> batch_rows(const std::vector<int64_t>& order, int64_t index, int64_t batch_size) {
  auto n = static_cast<int64_t>(order.size());
  int64_t begin = index * batch_size;
  int64_t end = std::min(begin + batch_size, n);
  return std::vector<int64_t>(order.begin() + begin, order.begin() + end);
}
}  // namespace

void DataLoader::worker_loop() {
  Shared& s = *shared_;
  // A new thread's current CUDA device is device 0. This one works for the loader's device: the
  // events of its copies belong to the context current at their creation, and one made for device
  // 0 cannot be recorded on another device's stream (a rank on cuda:1 failed so). PyTorch's
  // pin-memory thread sets its device the same way.
  std::exception_ptr device_error;
  if (options_.device.is_cuda()) {
    try {
      cuda::set_device(options_.device.index);
    } catch (...) {
      device_error = std::current_exception();  // raised with the first batch
    }
  }
  std::unique_lock<std::mutex> lock(s.mutex);
  while (true) {
    s.cv.wait(lock, [&] {
      return s.stop || (s.active && !s.error && s.next_prepare < s.end_batch &&
                        static_cast<int64_t>(s.ready.size()) < options_.prefetch);
    });
    if (s.stop) return;
    uint64_t generation = s.generation;
    int64_t index = s.next_prepare++;
    std::optional<Batch> batch;
    std::exception_ptr error;
    try {
      if (device_error) std::rethrow_exception(device_error);
      std::vector<int64_t> rows = batch_rows(s.order, index, options_.batch_size);
      lock.unlock();
      batch = make_batch(index, std::move(rows));
    } catch (...) {
      error = std::current_exception();
    }
    // Tensors of a batch from an abandoned epoch are freed outside the lock.
    if (!lock.owns_lock()) lock.lock();
    if (generation != s.generation) {
      lock.unlock();
      batch.reset();
      lock.lock();
      continue;
    }
    if (error) {
      s.error = error;
    } else {
      s.ready.push_back(std::move(*batch));
    }
    s.cv.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  Shared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mutex);
  TANDEM_CHECK_AS(ValueError, s.active, "DataLoader::next: no epoch is running; call start_epoch(epoch) first",
                  epoch_ >= 0 ? " (set_indices and clear_indices end the running epoch)" : "");
  if (s.next_return >= s.end_batch) return std::nullopt;
  if (options_.prefetch == 0) {
    if (s.error) std::rethrow_exception(s.error);
    std::vector<int64_t> rows = batch_rows(s.order, s.next_return, options_.batch_size);
    try {
      Batch batch = make_batch(s.next_return, std::move(rows));
      s.next_return++;
      return batch;
    } catch (...) {
      s.error = std::current_exception();
      throw;
    }
  }
  s.cv.wait(lock, [&] { return !s.ready.empty() || s.error; });
  if (s.ready.empty()) std::rethrow_exception(s.error);
  Batch batch = std::move(s.ready.front());
  s.ready.pop_front();
  s.next_return++;
  lock.unlock();
  s.cv.notify_all();
  return batch;
}

}  // namespace tandem::data
