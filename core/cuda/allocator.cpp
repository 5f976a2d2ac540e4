// The CUDA caching allocator. Freed blocks stay cached for reuse instead of going back to the
// driver (cudaMalloc/cudaFree synchronise the device and are slow). Blocks are cached per
// stream: a block freed by work on stream S is only handed out again for work on S, so stream
// order alone makes the reuse safe. Small requests (<= 1 MiB) are carved from 2 MiB segments;
// larger ones from segments of their own rounded size (20 MiB for 1-10 MiB requests); a block
// bigger than a request is split and the rest stays cached, however small (so a tensor holds, and
// the statistics count, only its size rounded to 512 bytes, and the rest can join a freed
// neighbour); adjacent free blocks of a segment merge again when freed.
//
// CUDA graphs (core/cuda_graph.h) get pools of their own: while a thread captures, its allocations
// on the device come from the graph's pool (blocks tagged with the pool's id, never handed to
// anyone else), and blocks of the ordinary pool it frees are held until the graph is gone, since
// the graph may still read them when it replays.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "tandem/core/backend.h"
#include "tandem/core/column_sum_batch.h"
#include "tandem/core/cuda/allocator.h"
#include "tandem/core/cuda/runtime.h"
#include "tandem/core/cuda_graph.h"

namespace tandem::cuda {

namespace {
constexpr size_t kMinBlock = 512;                 // every size is rounded up to this
constexpr size_t kSmallRequest = 1 << 20;         // <= 1 MiB: the small pool
constexpr size_t kSmallSegment = 2 << 20;         // segments of the small pool
constexpr size_t kMediumRequest = 10 << 20;       // 1-10 MiB: 20 MiB segments
constexpr size_t kMediumSegment = 20 << 20;
constexpr size_t kLargeRounding = 2 << 20;        // larger requests' segments round to 2 MiB

bool poison_allocations = false;

constexpr int kMaxPoolDevices = 64;
// The graph pool this thread allocates from, per device: 0 = the ordinary pool.
thread_local uint64_t thread_pool[kMaxPoolDevices] = {};

struct Block {
  char* ptr = nullptr;
  size_t size = 0;
  uint64_t pool = 0;  // 0: the ordinary pool; else the graph pool's id
  cudaStream_t stream = nullptr;
  bool small = false;         // belongs to the small pool
  bool allocated = false;
  Block* prev = nullptr;      // neighbours inside the same segment
  Block* next = nullptr;
};

struct BlockOrder {  // by pool, stream, then size, then address: lower_bound finds the best fit
  bool operator()(const Block* a, const Block* b) const {
    if (a->pool != b->pool) return a->pool < b->pool;
    if (a->stream != b->stream) return reinterpret_cast<uintptr_t>(a->stream) < reinterpret_cast<uintptr_t>(b->stream);
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

std::string format_bytes(size_t n) {
  std::ostringstream out;
  if (n >= (size_t(1) << 30)) out << static_cast<double>(n) / (1 << 30) << " GiB";
  else if (n >= (size_t(1) << 20)) out << static_cast<double>(n) / (1 << 20) << " MiB";
  else out << n << " bytes";
  return out.str();
}

size_t rounded(size_t requested) { return std::max(kMinBlock, (requested + kMinBlock - 1) / kMinBlock * kMinBlock); }

class DeviceAllocator {
 public:
  explicit DeviceAllocator(int device) : device_(device) {}

  void* allocate(size_t requested, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t size = rounded(requested);
    bool small = size <= kSmallRequest;
    auto& pool = small ? small_free_ : large_free_;
    Block key;
    key.pool = thread_pool[device_];
    key.stream = stream;
    key.size = size;
    Block* block = nullptr;
    auto it = pool.lower_bound(&key);
    if (it != pool.end() && (*it)->pool == key.pool && (*it)->stream == stream) {
      block = *it;
      pool.erase(it);
    } else {
      block = new_segment(size, small, key.pool, stream, requested);
    }
    split_if_worthwhile(block, size, pool);
    block->allocated = true;
    active_[block->ptr] = block;
    stats_.allocated += block->size;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    if (poison_allocations) TANDEM_CUDA_CHECK(cudaMemsetAsync(block->ptr, 0xFF, block->size, stream));
    return block->ptr;
  }

  // Whether allocating `requested` bytes now would raise the peak of the ordinary pool (a graph's
  // pool is sized by its capture; its allocations are not asked about).
  bool would_set_peak(size_t requested) {
    std::lock_guard<std::mutex> lock(mutex_);
    return thread_pool[device_] == 0 && stats_.allocated + rounded(requested) > stats_.peak_allocated;
  }

  void free(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = active_.find(ptr);
    if (it == active_.end()) return;  // not ours; never throw from a deleter
    Block* block = it->second;
    const uint64_t capturing = thread_pool[device_];
    if (capturing != 0 && block->pool == 0) {
      pools_[capturing].held.push_back(block);  // the graph may read it: freed with the graph's pool
      return;
    }
    active_.erase(it);
    release(block);
  }

  void begin_pool_use(uint64_t pool) {
    std::lock_guard<std::mutex> lock(mutex_);
    pools_[pool];  // exists from now on
    thread_pool[device_] = pool;
  }

  void end_pool_use() { thread_pool[device_] = 0; }

  // The pool's blocks join the ordinary cache on `stream`; the blocks it held are freed.
  void release_pool(uint64_t id, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = pools_.find(id);
    if (found == pools_.end()) return;
    for (Block* head : found->second.segments) {
      for (Block* b = head; b != nullptr; b = b->next) {
        auto& free_set = b->small ? small_free_ : large_free_;
        const bool was_free = !b->allocated && free_set.erase(b) > 0;
        b->pool = 0;
        b->stream = stream;
        if (was_free) free_set.insert(b);
      }
    }
    for (Block* b : found->second.held) {
      active_.erase(b->ptr);
      release(b);
    }
    pools_.erase(found);
  }

  size_t pool_bytes(uint64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = pools_.find(id);
    if (found == pools_.end()) return 0;
    size_t bytes = 0;
    for (Block* head : found->second.segments) {
      for (Block* b = head; b != nullptr; b = b->next) bytes += b->size;
    }
    return bytes;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    release_free_segments();
  }

  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_allocated = stats_.allocated;
  }

 private:
  // A graph's pool: the segments made for it (their first blocks) and the ordinary blocks it holds.
  struct GraphPool {
    std::vector<Block*> segments;
    std::vector<Block*> held;
  };

  // Back into the free lists, merged with free neighbours. Needs mutex_.
  void release(Block* block) {
    block->allocated = false;
    stats_.allocated -= block->size;
    auto& pool = block->small ? small_free_ : large_free_;
    block = merge(block, block->prev, pool);
    block = merge(block, block->next, pool);
    pool.insert(block);
  }

  Block* new_segment(size_t size, bool small, uint64_t pool, cudaStream_t stream, size_t requested) {
    size_t segment = small ? kSmallSegment
                           : (size <= kMediumRequest ? kMediumSegment
                                                     : (size + kLargeRounding - 1) / kLargeRounding * kLargeRounding);
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    cudaError_t status = cudaSuccess;
    // Inside a capture (the graph's pool, or the ordinary pool through OutsideGraphPool): the
    // memory outlives the capture, it is no step of the graph, so the call is made outside the
    // capture's rules. Nothing cached may be freed to make room (cudaFree would wait for the
    // device in the middle of a capture).
    const bool capturing = pool != 0 || is_capturing();
    if (capturing) {
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      TANDEM_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
      status = cudaMalloc(&ptr, segment);
      cudaThreadExchangeStreamCaptureMode(&mode);
    } else {
      status = cudaMalloc(&ptr, segment);
    }
    if (status == cudaErrorMemoryAllocation && !capturing) {
      cudaGetLastError();     // clear the error so the retry and later calls start clean
      release_free_segments();  // give the cache back and try once more
      status = cudaMalloc(&ptr, segment);
    }
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      ++stats_.num_ooms;
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      TANDEM_THROW(OutOfMemoryError, "cuda:", device_, ": out of memory allocating ", format_bytes(requested),
                   capturing ? " inside a CUDA graph capture, which cannot free the cache to make room" : "",
                   " (device total ", format_bytes(total_bytes), ", free ", format_bytes(free_bytes),
                   "; tandem holds ", format_bytes(stats_.allocated), " in tensors and ",
                   format_bytes(stats_.reserved), " reserved, peak ", format_bytes(stats_.peak_allocated), ")");
    }
    TANDEM_CUDA_CHECK(status);
    ++stats_.num_device_allocs;
    stats_.reserved += segment;
    auto* block = new Block;
    block->ptr = static_cast<char*>(ptr);
    block->size = segment;
    block->pool = pool;
    block->stream = stream;
    block->small = small;
    if (pool != 0) pools_[pool].segments.push_back(block);
    return block;
  }

  // Splits off the part of block past `size` as a free block. In the large pool a rest of 1 MiB
  // or less serves no request alone, but left inside the block it would count as allocated and
  // could not join a neighbour freed before the block.
  template <typename Pool>
  void split_if_worthwhile(Block* block, size_t size, Pool& pool) {
    size_t remainder = block->size - size;
    if (remainder < kMinBlock) return;
    auto* rest = new Block;
    rest->ptr = block->ptr + size;
    rest->size = remainder;
    rest->pool = block->pool;
    rest->stream = block->stream;
    rest->small = block->small;
    rest->prev = block;
    rest->next = block->next;
    if (block->next) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.insert(rest);
  }

  // Folds a free neighbour into block; returns the surviving block.
  template <typename Pool>
  Block* merge(Block* block, Block* neighbour, Pool& pool) {
    if (neighbour == nullptr || neighbour->allocated) return block;
    pool.erase(neighbour);
    Block* first = neighbour == block->prev ? neighbour : block;
    Block* second = first == block ? neighbour : block;
    first->size += second->size;
    first->next = second->next;
    if (second->next) second->next->prev = first;
    delete second;
    return first;
  }

  void release_free_segments() {
    for (auto* pool : {&small_free_, &large_free_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev == nullptr && b->next == nullptr && b->pool == 0) {  // a whole segment, unused
          DeviceGuard guard(device_);
          cudaFree(b->ptr);
          stats_.reserved -= b->size;
          delete b;
          it = pool->erase(it);
        } else {
          ++it;
        }
      }
    }
  }

  int device_;
  std::mutex mutex_;
  std::set<Block*, BlockOrder> small_free_, large_free_;
  std::unordered_map<void*, Block*> active_;
  std::unordered_map<uint64_t, GraphPool> pools_;
  MemoryStats stats_;
};

DeviceAllocator& allocator(int device) {
  static std::mutex mutex;
  // Never destroyed: tensors freed during static destruction still find their allocator.
  static auto* allocators = new std::unordered_map<int, std::unique_ptr<DeviceAllocator>>();
  std::lock_guard<std::mutex> lock(mutex);
  auto& a = (*allocators)[device];
  if (!a) a = std::make_unique<DeviceAllocator>(device);
  return *a;
}
}  // namespace

void* device_allocate(size_t nbytes, int device) {
  check_device(device);
  DeviceAllocator& a = allocator(device);
  // Column sums waiting in this thread's backward pass hold their partial rows until they launch
  // (core/column_sum_batch.h). Launching them before an allocation that would set a new peak
  // frees those rows first, so waiting never raises the peak: where a step's peak comes late in
  // backward (the MLP's), the sums launch there; where it comes earlier (GPT-2's), they still go
  // in one launch.
  ColumnSumBatch* batch = current_column_sum_batch();
  if (batch != nullptr && !batch->empty() && a.would_set_peak(nbytes)) batch->flush();
  return a.allocate(nbytes, current_stream(device));
}

void device_free(void* ptr, int device) { allocator(device).free(ptr); }

MemoryStats memory_stats(int device) {
  check_device(device);
  return allocator(device).stats();
}
size_t memory_allocated(int device) { return memory_stats(device).allocated; }
size_t memory_reserved(int device) { return memory_stats(device).reserved; }
size_t max_memory_allocated(int device) { return memory_stats(device).peak_allocated; }
void reset_peak_memory_stats(int device) {
  check_device(device);
  allocator(device).reset_peak();
}
void empty_cache(int device) {
  check_device(device);
  allocator(device).empty_cache();
}
void set_poison_allocations(bool enabled) { poison_allocations = enabled; }

void begin_pool_use(int device, uint64_t pool) {
  check_device(device);
  TANDEM_CHECK_AS(DeviceError, device < kMaxPoolDevices, "cuda:", device, ": graph pools reach devices below ",
                  kMaxPoolDevices);
  allocator(device).begin_pool_use(pool);
}
void end_pool_use(int device) { allocator(device).end_pool_use(); }
void release_pool(int device, uint64_t pool, cudaStream_t stream) { allocator(device).release_pool(pool, stream); }
size_t pool_bytes(int device, uint64_t pool) { return allocator(device).pool_bytes(pool); }

}  // namespace tandem::cuda
