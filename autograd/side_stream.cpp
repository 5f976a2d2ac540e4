#include "tandem/autograd/side_stream.h"

#include <atomic>
#include <cstdlib>
#include <exception>
#include <string>

#include "tandem/core/column_sum_batch.h"
#include "tandem/core/cuda_api.h"

namespace tandem::autograd {

namespace {
std::atomic<bool> beside_enabled{[] {
  const char* v = std::getenv("TANDEM_WEIGHT_GRADIENTS_BESIDE");
  return v != nullptr && std::string(v) == "1";
}()};

thread_local detail::SideWork* current = nullptr;

// Events for ordering only, kept per thread and device for the next pass (making one costs more
// than recording it). An event goes back once the compute stream's wait on it has been issued.
struct EventPool {
  int device = -1;
  std::vector<std::unique_ptr<cuda::Event>> spare;
};
thread_local EventPool event_pool;

std::unique_ptr<cuda::Event> take_event(int device) {
  EventPool& pool = event_pool;
  if (pool.device != device) {  // another device: events belong to the device they were made on
    pool.spare.clear();
    pool.device = device;
  }
  if (!pool.spare.empty()) {
    std::unique_ptr<cuda::Event> e = std::move(pool.spare.back());
    pool.spare.pop_back();
    return e;
  }
  cuda::DeviceGuard guard(device);
  return std::make_unique<cuda::Event>(/*timing=*/false);
}

void give_back(int device, std::unique_ptr<cuda::Event> e) {
  if (e && event_pool.device == device) event_pool.spare.push_back(std::move(e));
}

// The one CUDA device of the defined tensors in `reads`, or -1.
int cuda_device_of(const std::vector<Tensor>& reads) {
  int device = -1;
  for (const Tensor& t : reads) {
    if (!t.defined()) continue;
    if (!t.device().is_cuda() || (device >= 0 && t.device().index != device)) return -1;
    device = t.device().index;
  }
  return device;
}
}  // namespace

void set_weight_gradients_beside(bool enabled) { beside_enabled = enabled; }
bool weight_gradients_beside() { return beside_enabled; }

std::vector<Tensor> run_beside(const std::vector<Tensor>& reads, const std::function<std::vector<Tensor>()>& work) {
  detail::SideWork* side = current;
  const int device = side != nullptr && beside_enabled ? cuda_device_of(reads) : -1;
  if (device < 0) return work();
  std::vector<Tensor> results;
  const uint64_t item = side->launch(device, reads, [&] { results = work(); });
  for (const Tensor& t : results) {
    if (t.defined()) side->mark(t, item);
  }
  return results;
}

namespace detail {

SideWork::~SideWork() {
  try {
    if (!items_.empty()) join_through(items_.back().id, /*run_deferred=*/false);
  } catch (...) {
    // Already unwinding from an error, or the device failed: nothing more can be ordered.
  }
}

uint64_t SideWork::launch(int device, std::vector<Tensor> reads, const std::function<void()>& work, bool counted) {
  cuda::DeviceGuard device_guard(device);
  cuda::StreamHandle compute = cuda::current_stream_handle(device);
  cuda::StreamHandle side = cuda::side_stream(device);
  // The side stream starts after the compute stream's work so far (what made `reads`).
  std::unique_ptr<cuda::Event> start = take_event(device);
  start->record_on(compute);
  start->wait_on(side);
  give_back(device, std::move(start));
  std::exception_ptr failed;
  {
    cuda::StreamGuard on_side(device, side);
    // Column sums launched by side work run on the side stream with it, not later in a batch
    // that the compute stream's wait for this item would miss.
    ColumnSumBatchScope launch_sums_now(nullptr);
    try {
      work();
    } catch (...) {
      failed = std::current_exception();  // still an item: what it launched reads `reads`
    }
  }
  Item item;
  item.id = next_id_++;
  item.device = device;
  item.counted = counted;
  item.compute = compute;
  item.done = take_event(device);
  item.done->record_on(side);
  item.held = std::move(reads);
  items_.push_back(std::move(item));
  if (failed) std::rethrow_exception(failed);
  const uint64_t id = items_.back().id;
  // Join the newest counted item that has kItemsAhead counted items after it (and all before it).
  size_t newer = 0;
  for (auto it = items_.rbegin(); it != items_.rend(); ++it) {
    if (!it->counted) continue;
    if (newer++ == kItemsAhead) {
      join_through(it->id, /*run_deferred=*/true);
      break;
    }
  }
  return id;
}

void SideWork::mark(const Tensor& t, uint64_t item) {
  const void* key = t.storage().data();
  if (key != nullptr) pending_[key] = item;
}

uint64_t SideWork::item_of(const Tensor& t) const {
  if (!t.defined() || pending_.empty()) return 0;
  auto it = pending_.find(t.storage().data());
  return it == pending_.end() ? 0 : it->second;
}

void SideWork::defer(uint64_t item, std::function<void()> fn) {
  for (Item& i : items_) {
    if (i.id == item) {
      i.deferred.push_back(std::move(fn));
      return;
    }
  }
  fn();  // already joined
}

void SideWork::join_for(const Tensor& t) {
  const uint64_t item = item_of(t);
  if (item != 0) join_through(item, /*run_deferred=*/true);
}

void SideWork::join_all() {
  if (!items_.empty()) join_through(items_.back().id, /*run_deferred=*/true);
}

void SideWork::join_through(uint64_t id, bool run_deferred) {
  while (!items_.empty() && items_.front().id <= id) {
    Item item = std::move(items_.front());
    items_.erase(items_.begin());
    item.done->wait_on(item.compute);
    for (auto it = pending_.begin(); it != pending_.end();) {
      it = it->second <= item.id ? pending_.erase(it) : std::next(it);
    }
    give_back(item.device, std::move(item.done));
    item.held.clear();  // the compute stream now orders their reuse after the item
    if (run_deferred) {
      for (auto& fn : item.deferred) fn();
    }
  }
}

SideWork* current_side_work() { return current; }

SideWorkScope::SideWorkScope(SideWork* work) : outer_(current) { current = work; }
SideWorkScope::~SideWorkScope() { current = outer_; }

}  // namespace detail
}  // namespace tandem::autograd
