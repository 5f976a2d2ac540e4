#pragma once
// The NCCL group's all-reduce of small tensors among GPUs of one node linked by NVLink: one kernel
// of tandem's own, in which every rank reads the others' copies through CUDA IPC mappings and sums
// them in rank order (a one-shot all-reduce, as PyTorch's intra-node and vLLM's custom all-reduce
// do). Raw NCCL takes the host some 7-13 us to issue an all-reduce, about what the GPU takes to run
// one of 1 MiB; this kernel is one launch, so a small all-reduce stops being host-bound. The
// group decides per call, the same way on every rank (from the size, dtype and op alone), and
// sends everything else to NCCL.
//
// Protocol, per block b of a fixed grid (kPeerBlocks): each rank copies its part b of the tensor
// into its staging slot (two slots, alternating with each call), then tells every other rank by a
// flag in that rank's memory (a release store at system scope) and waits until every other rank's
// flag says the same call (an acquire load). Then it sums part b of every rank's staging in rank
// order, so every rank gets the same bits, and writes it back. A slot is written again only two
// calls later, when every rank has finished the call in between, and so reading the one before.
// A rank waits for the others until the host sets the abort word (the watchdog failed the group,
// as it does any collective pending past the timeout), or at most twice the timeout and 10 s, a
// backstop after which the kernel gives up and says so through a host-mapped status word that the
// watchdog reads.
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/core/dtype.h"
#include "tandem/dist/process_group.h"

namespace tandem {
class Tensor;
}

namespace tandem::dist::internal {

constexpr int kPeerMaxRanks = 8;  // one-shot: each rank reads size - 1 copies, which stops paying past a node
constexpr int kPeerBlocks = 64;    // the grid, fixed: each block's flags count that block's calls
constexpr int kPeerThreads = 512;

// What the kernel is given; pointers are this rank's view (its own or a peer's IPC mapping).
struct PeerAllReduceArgs {
  void* data = nullptr;                   // (n,) the tensor, reduced in place
  int64_t n = 0;
  char* staging[kPeerMaxRanks] = {};      // each rank's 2 slots of slot_bytes
  int64_t slot_bytes = 0;
  uint32_t* flags[kPeerMaxRanks] = {};    // each rank's (kPeerBlocks, kPeerMaxRanks) arrivals: [b][sender]
  uint32_t* calls = nullptr;              // (kPeerBlocks,) this rank's calls so far, per block (not shared)
  int rank = 0, size = 0;
  uint64_t timeout_ns = 0;
  const volatile int* abort_flag = nullptr;  // host-mapped: set by the host to stop waiting
  int* status = nullptr;                     // host-mapped: 1 + the rank waited for past the timeout
};

// Launches the kernel on `stream`; a launch error raises a BackendError.
void launch_peer_all_reduce(const PeerAllReduceArgs& args, DType dtype, ReduceOp op, cudaStream_t stream);

class PeerAllReduce {
 public:
  // Collective over every rank (host all-gathers over MPI). Null, with `why_not` set, where the
  // path cannot run: ranks on several nodes, more than kPeerMaxRanks ranks, a peer GPU not visible
  // or not linked by NVLink (no native atomics over the link), or CUDA IPC refused (a container
  // without a shared IPC namespace). Every rank gets the same answer. `max_read_bytes`: the most a
  // rank reads from the others per call (tensor bytes * (size - 1)); 0 turns the path off.
  static std::unique_ptr<PeerAllReduce> create(int rank, int size, bool one_node, int device, int64_t max_read_bytes,
                                               double timeout_seconds, std::string* why_not);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  // Whether this all-reduce goes through the kernel: same answer on every rank for the same call.
  bool takes(const Tensor& t, ReduceOp op) const;
  void launch(const Tensor& t, ReduceOp op, cudaStream_t stream);
  // The rank that this rank's kernel waited for past the timeout, or -1.
  int timed_out_peer() const;
  // Makes waiting kernels give up (the group failed); never throws.
  void abort();

 private:
  PeerAllReduce() = default;
  PeerAllReduceArgs args_;
  int device_ = 0;
  void* own_ = nullptr;       // this rank's IPC-exported buffer: flags, then the 2 slots
  void* host_words_ = nullptr;  // (2,) int, host-mapped: abort flag, status
  std::vector<void*> opened_;   // peers' buffers mapped here
  bool ran_ = false;            // a kernel may have used the buffers (create() succeeded)
};

}  // namespace tandem::dist::internal
