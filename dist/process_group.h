#pragma once
// The communication layer: the MPI world, process groups over MPI (cpu tensors) and NCCL (cuda
// tensors), and the asynchronous Work handles their collectives return.
//
// Failures. Every group has a watchdog thread. A collective that runs past the timeout
// (InitOptions::timeout_seconds, or $TANDEM_DIST_TIMEOUT) or that NCCL reports as failed marks the
// group failed: the message (rank, operation, bytes, seconds waited) goes to stderr, the NCCL
// communicator is aborted so no kernel spins forever, and Work::wait()/synchronize() and every later
// call on the group raise it as a BackendError. MPI cannot abort a communicator: its pending
// requests are abandoned (their tensors stay alive) and the process skips MPI_Finalize at exit.
// Collectives captured into a CUDA graph (core/cuda_graph.h) are watched in every replay: the
// capture itself issues nothing, each replay issues them again (new sequence numbers, the same
// fingerprints, flight-recorder entries), and one that runs past the timeout fails the group the
// same way, the message saying "in replay N of a CUDA graph"; a later replay is refused.
// When a rank dies, Open MPI's mpirun already ends the whole job (it kills the other ranks and exits
// non-zero, naming the rank and the signal); the timeout catches what mpirun does not see: a rank
// that hangs, or ranks that disagree on the order of collectives.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/core/device.h"
#include "tandem/core/tensor.h"

namespace tandem::dist {

enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"

// A collective in flight. wait(): the caller's current stream (GPU) waits for it without blocking the
// host, or (CPU/MPI) the host blocks until it is done; synchronize(): the host blocks until it is
// done. Errors (a failed or timed-out collective, an aborted communicator) surface from
// wait()/synchronize() as tandem::BackendError naming the rank, the operation, its size in bytes and
// how long it waited.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual void synchronize() = 0;
  virtual bool is_completed() = 0;  // non-blocking query; also true once the collective failed
  // Device time of the collective once completed (CUDA events), else -1. NCCL times a collective
  // only when asked (TimedCollectives, InitOptions::time_collectives): -1 otherwise. MPI: host time
  // from posting the collective until its completion was seen. 0 in a group of one, which launches
  // nothing where the result equals the input (unless InitOptions::nccl_launch_alone).
  virtual double elapsed_ms() = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi" or "nccl"
  // In place on `tensor` (contiguous). GPU: enqueued on the group's communication stream after an
  // event recorded on the caller's current stream; never blocks the host. The Work keeps the tensors
  // of a collective alive until it has completed. MPI reduces f32, f64, i32, i64 and u8 (bool: max,
  // min); 16-bit floats only travel (broadcast, all_gather) there. avg of integers truncates.
  //
  // `label` says what the collective is for ("metrics"); it goes into the collective's
  // fingerprint (see check_in_sync), the flight recorder and error messages, so it must be the
  // same on every rank.
  virtual std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum,
                                           const std::string& label = "") = 0;
  // Several tensors in one grouped launch (NCCL: ncclGroupStart/End; MPI: one request each).
  virtual std::shared_ptr<Work> all_reduce(const std::vector<Tensor>& tensors, ReduceOp op = ReduceOp::sum,
                                           const std::string& label = "") = 0;
  virtual std::shared_ptr<Work> broadcast(const Tensor& tensor, int root = 0, const std::string& label = "") = 0;
  // output (size * n,) gets every rank's input (n,) in rank order. input may be output's own slice
  // at rank * n (in place).
  virtual std::shared_ptr<Work> all_gather(const Tensor& output, const Tensor& input, const std::string& label = "") = 0;
  // output (n,) gets this rank's reduced slice of input (size * n,). output may be input's own slice
  // at rank * n (in place).
  virtual std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input,
                                               ReduceOp op = ReduceOp::sum, const std::string& label = "") = 0;
  // The same with blocks of different sizes: rank r's block is counts[r] elements (0 allowed), and
  // the blocks lie in rank order in `whole` (sum of counts,). all_gather_v: every rank's `part`
  // (counts[rank],) lands in its block of `whole` on every rank. reduce_scatter_v: `part` gets the
  // reduction over ranks of this rank's block of `whole`. In either, `part` may be whole's own
  // block (in place). ZeRO's shards of the flat parameter space cut buckets this way. NCCL: one
  // broadcast (reduce) per non-empty block, rooted at its rank, grouped into one launch; MPI:
  // MPI_Iallgatherv and MPI_Ireduce_scatter. `counts` must be the same on every rank.
  virtual std::shared_ptr<Work> all_gather_v(const Tensor& whole, const Tensor& part, const std::vector<int64_t>& counts,
                                             const std::string& label = "") = 0;
  virtual std::shared_ptr<Work> reduce_scatter_v(const Tensor& part, const Tensor& whole,
                                                 const std::vector<int64_t>& counts, ReduceOp op = ReduceOp::sum,
                                                 const std::string& label = "") = 0;
  // Blocks the host until every rank has reached the barrier (or the timeout passes).
  virtual void barrier() = 0;
  // Aborts the communicator (after a failure) so no collective can hang; later calls raise.
  virtual void abort(const std::string& reason) = 0;

  // Fingerprints. Every collective gets a sequence number in its group and a fingerprint (op, reduce
  // op, dtype, element count, root, label); each rank rolls them into a hash. check_in_sync compares
  // the ranks' hashes with one small host-side all-gather (over MPI) and, when they differ, fails
  // the group on every rank with a BackendError naming the first collective that differs on each
  // side: "rank 1 issued all_reduce #57 'metrics' (1 f32 element, 4 B, sum) where rank 0 issued
  // all_reduce #57 'ddp bucket 3 of step 3' (300000 f32 elements, 1.2 MB, avg)". `where` names the
  // point ("the optimizer step of step 12"). Called by DistributedDataParallel every step.
  // The MPI group also compares every collective's fingerprint before it starts (asynchronously,
  // on a communicator of its own), so a mismatch never reaches Open MPI, which could crash on it.
  // $TANDEM_DIST_DEBUG=detail makes every group compare each fingerprint before launching it
  // (blocking the host), so the collective call itself raises; =off leaves only check_in_sync.
  virtual void check_in_sync(const std::string& where) = 0;
  // Collectives issued in this group so far (the last sequence number).
  virtual uint64_t collectives_issued() const = 0;
};

// While one lives, the NCCL collectives this thread issues run on its current stream instead of
// the group's communication stream, as PyTorch's do with async_op=False: no event edges to the
// communication stream and back, which cost 2-3 us per all-reduce, eager or replayed (bench/allreduce,
// 2 H100s, 2026-11-28). For collectives the caller waits for at once; they do not overlap the
// caller's later work, which DDP's buckets need (DDP and ZeRO keep the communication stream).
// Everything else is the same: Works, timeouts, fingerprints, capture into CUDA graphs. Nests; no
// effect on the MPI group.
class CollectivesOnCurrentStream {
 public:
  CollectivesOnCurrentStream();
  ~CollectivesOnCurrentStream();
  CollectivesOnCurrentStream(const CollectivesOnCurrentStream&) = delete;
  CollectivesOnCurrentStream& operator=(const CollectivesOnCurrentStream&) = delete;
};

// While one lives, the NCCL collectives this thread issues are timed on the GPU (a pair of timing
// events around each), so that Work::elapsed_ms() reports their device time; outside one they are
// not (-1), unless InitOptions::time_collectives. A timing event between NCCL kernels costs their
// stream some 3 us, an event without timing nothing (2 H100s, 2026-11-28: an all-reduce of 1 MiB
// back to back took 13.6 us, 17.1 with a timing event after each, 19.9 with one before and after),
// which is why PyTorch also times none by default (TORCH_NCCL_ENABLE_TIMING). DDP and ZeRO time
// their buckets (their stats() and the Timeline read them). Nests; no effect on the MPI group, nor
// on collectives captured into a CUDA graph (a graph records no timings).
class TimedCollectives {
 public:
  TimedCollectives();
  ~TimedCollectives();
  TimedCollectives(const TimedCollectives&) = delete;
  TimedCollectives& operator=(const TimedCollectives&) = delete;
};

struct InitOptions {
  double timeout_seconds = 600;  // per collective (creating a communicator gets at least 60 s); $TANDEM_DIST_TIMEOUT overrides it
  bool use_gpu = true;           // bind to a GPU and make the NCCL group when CUDA devices exist
  // Where each group's flight recorder (its last collectives, as JSON) is written when it fails or
  // the process gets SIGTERM/SIGINT: <dump_dir>/rank<R>-<backend>.json. "" (the default) takes
  // $TANDEM_DIST_DUMP_DIR; with neither nothing is written. scripts/dist_analyze.py reads them.
  // $TANDEM_DIST_RECORDER_SIZE sets how many collectives each keeps (256).
  std::string dump_dir;
  // In a world of one the NCCL group launches nothing by default: a collective's result is its
  // input, so its Work is complete at once. With this set it launches every collective through NCCL
  // all the same (for one rank NCCL copies, or does nothing in place), so that a single GPU runs
  // what several do: the event edges to the communication stream, the completion events, the
  // watchdog and its timeout, captured collectives watched in replays. For benchmarks and tests.
  // $TANDEM_NCCL_LAUNCH_ALONE=1 (or 0) overrides it. No effect on the MPI group or with 2+ ranks.
  bool nccl_launch_alone = false;
  // The NCCL communicator is blocking by default (as PyTorch's): NCCL launches each collective on
  // the calling thread, in some 15 us of host time. A blocking call that waits on a peer that is
  // gone inside NCCL (creating the communicator, the first collective that connects to a peer)
  // cannot be aborted: past the timeout the rank reports it and exits (status 1). With this set the
  // communicator is non-blocking and every call can be aborted, which raises a BackendError instead,
  // but NCCL then launches each call on a thread of its own: about 100 us of host time per
  // collective (2 H100s, 2026-11-28). $TANDEM_NCCL_NONBLOCKING=1 (or 0) overrides it.
  bool nccl_nonblocking = false;
  // Every NCCL collective timed, as inside a TimedCollectives scope (some 3 us of GPU time per
  // timing event, two per collective). $TANDEM_TIME_COLLECTIVES=1 (or 0) overrides it.
  bool time_collectives = false;
  // The NCCL group's communication stream at the device's highest priority (as PyTorch's
  // is_high_priority_stream) rather than the default one. On 2 H200s an all-reduce of 1 MiB on a
  // highest-priority stream ordered after the compute stream took the GPU 1.1-1.3 us longer than
  // on a default-priority one, and DDP's steps were the same either way (docs/performance-notes.md,
  // "Collectives on several GPUs"). The priority lets NCCL's blocks be scheduled ahead of the
  // compute stream's when both wait for the GPU.
  // $TANDEM_COMM_STREAM_HIGH_PRIORITY=1 (or 0) overrides it.
  bool comm_stream_high_priority = false;
  // An all-reduce of one cuda tensor of f32, f64, f16, bf16 (any op) or i32, i64 (sum, max, min)
  // runs on tandem's own one-shot kernel rather than NCCL when every rank is on one node, 2 to 8
  // ranks, their GPUs linked by NVLink, and each rank reads at most this many bytes from the others
  // (the tensor's bytes times size - 1; so 8 MiB tensors on 2 ranks, 1.1 MiB on 8). The kernel is
  // one launch where NCCL's call takes the host some 7-13 us, which decides a small all-reduce's
  // speed, and on 2 H200s it also ran 1-16 MiB faster than NCCL's (docs/performance-notes.md,
  // "Collectives on several GPUs"; not measured on more ranks, where each rank reads more:
  // bench/allreduce tells). Every rank computes the same bits (a sum in rank order); NCCL's may
  // differ from them in the last bits. It keeps two staging buffers of the largest tensor on each
  // GPU. 0 turns it off.
  // $TANDEM_PEER_ALL_REDUCE_MAX_BYTES overrides it, and when set says on rank 0 why the path is off
  // where it is.
  int64_t peer_all_reduce_max_bytes = int64_t{8} << 20;
};

struct World {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  double timeout_seconds = 600;             // per collective and per cross-rank check
  Device device;                            // cuda:(local_rank % device_count) or cpu
  std::shared_ptr<ProcessGroup> cpu_group;  // MPI, always
  std::shared_ptr<ProcessGroup> gpu_group;  // NCCL, when the device is a GPU (and NCCL is built)
  // gpu_group for cuda tensors, cpu_group for cpu ones. Throws a DeviceError for a GPU other than
  // this rank's, or when there is no NCCL group (saying why).
  ProcessGroup& group_for(const Device& d) const;
};

// Initialises MPI (if not yet; with MPI_THREAD_MULTIPLE if available, else SERIALIZED), reads
// rank/size, finds the local rank with MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), binds the process
// to GPU local_rank % device_count (cudaSetDevice), creates the NCCL communicator from an
// ncclUniqueId that rank 0 broadcasts over MPI. Idempotent: later calls return the same World (their
// options are ignored). Works as a world of one without mpirun. NCCL needs a GPU per rank: when a
// node runs more ranks than it has GPUs, the world has no gpu_group (group_for says so).
const World& init(const InitOptions& options = {});
bool is_initialized();
const World& world();  // throws if init() was not called
// Destroys communicators, MPI_Finalize (only if init() initialised MPI, and only when no collective
// is left pending, which would make it hang); safe to call twice; registered atexit by init. MPI
// cannot be initialised again afterwards.
void finalize();

}  // namespace tandem::dist
