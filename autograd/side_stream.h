#pragma once
// Weight gradients beside backward. A matrix product's weight gradient is read by nothing later in
// backward but its leaf's accumulation (and what runs after backward: DDP's buckets, the
// optimizer). On CUDA, backward can put those products on a second stream, where they run beside
// the nodes that follow and fill the SMs that small kernels leave idle (attention's backward over
// few tokens, layer norms, GELU's backward), the weight-gradient overlap that pipeline schedules
// such as Megatron's also use.
//
// What keeps it correct. An item of side work starts after everything given to the compute stream
// before it (an event edge). The tensors it reads are held until the item is joined, so their
// memory is not reused while it runs. The tensors it makes are pending: before the compute stream
// reads one (as a node's gradient, a pending gradient a node folds, or one of two gradients the
// engine adds), the engine makes the compute stream wait for the item. A leaf's accumulation of a
// pending gradient runs on the side stream too, and the leaf's hooks (DDP's) run once its item is
// joined. Items are joined in order: at most kItemsAhead behind the newest, which bounds the memory
// they hold, and all of them before backward returns, so that afterwards every gradient is ready on
// the compute stream as before. Results are the same bits: the same kernels run, on another stream.
//
// Everywhere else (the CPU, no backward running, the mode off) the work runs in place.
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "tandem/core/cuda_api.h"
#include "tandem/core/tensor.h"

namespace tandem::autograd {

// Whether backward puts weight-gradient products on the side stream. Off by default
// (TANDEM_WEIGHT_GRADIENTS_BESIDE=1 turns it on at start-up): it is a trade. On one H200 it took
// 0.4-2% off GPT-2's B8 and B1 T128 bf16 steps and the MLP's, eager and replayed, but made GPT-2
// B1 T1024's replayed step 1% longer (the products beside attention's and layer norm's backward
// slow them more than the overlap saves; fewer items beside were slower still), and an eager
// step's peak memory grows by what the items hold (the MLP's by 42 MiB). See docs/performance-notes.md,
// "Weight gradients beside backward".
void set_weight_gradients_beside(bool enabled);
bool weight_gradients_beside();

// Runs `work` on the side stream of `reads`' device when a backward runs on this thread, the mode
// is on and every defined tensor in `reads` is on one CUDA device; otherwise in place. `reads`: the
// tensors `work` reads (held until the item is joined). Returns what `work` returns, each result
// pending until joined.
std::vector<Tensor> run_beside(const std::vector<Tensor>& reads, const std::function<std::vector<Tensor>()>& work);

namespace detail {

// The side work of one backward pass (run_backward makes one per pass).
class SideWork {
 public:
  // Items joined beyond this many behind the newest: about one transformer block's weight
  // products (GPT-2's block makes four items).
  static constexpr size_t kItemsAhead = 4;

  SideWork() = default;
  // Makes the compute stream wait for whatever is left, so that the tensors items hold outlive
  // their readers (hooks of items not joined do not run: backward is being abandoned).
  ~SideWork();
  SideWork(const SideWork&) = delete;
  SideWork& operator=(const SideWork&) = delete;

  // Runs `work` on the side stream of `device` after the compute stream's work so far; returns the
  // new item's id. The item holds `reads`. Small work (a leaf's accumulation) passes counted =
  // false: it does not count towards kItemsAhead.
  uint64_t launch(int device, std::vector<Tensor> reads, const std::function<void()>& work, bool counted = true);
  // t (its storage) is pending on `item`.
  void mark(const Tensor& t, uint64_t item);
  // The item t waits for, or 0 when it is ready on the compute stream.
  uint64_t item_of(const Tensor& t) const;
  // Runs fn once `item` is joined.
  void defer(uint64_t item, std::function<void()> fn);
  // Joins the item t waits for (and every older one); nothing when t is ready.
  void join_for(const Tensor& t);
  void join_all();

 private:
  struct Item {
    uint64_t id = 0;
    int device = -1;
    bool counted = true;
    void* compute = nullptr;  // the compute stream it left (a cudaStream_t)
    std::unique_ptr<cuda::Event> done;
    std::vector<Tensor> held;
    std::vector<std::function<void()>> deferred;
  };
  void join_through(uint64_t id, bool run_deferred);

  std::vector<Item> items_;                            // not yet joined, oldest first (a few)
  std::unordered_map<const void*, uint64_t> pending_;  // storage -> the item that makes it
  // Neither allocates until the first item: a backward without side work costs nothing here.
  uint64_t next_id_ = 1;
};

// The side work of the backward running on this thread, or null.
SideWork* current_side_work();
// Makes `work` the current side work for the scope (run_backward's).
class SideWorkScope {
 public:
  explicit SideWorkScope(SideWork* work);
  ~SideWorkScope();

 private:
  SideWork* outer_;
};

}  // namespace detail
}  // namespace tandem::autograd
