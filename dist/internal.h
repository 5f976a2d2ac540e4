#pragma once
// Internal to dist/: what init() needs from each backend, and helpers both backends share. Each
// backend entry point is implemented by its backend file or, in a build without that backend, by
// a stub that raises a DeviceError (dist/no_mpi.cpp, dist/no_nccl.cpp).
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/dist/process_group.h"

namespace tandem::dist::internal {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// "4096 bytes" or "4194304 bytes (4 MiB)".
std::string format_bytes(size_t n);
// "2.01 s"
std::string format_seconds(double s);
// The start of every failure message: "rank 0: nccl all_reduce of 4096 bytes".
std::string describe(int rank, const std::string& backend, const char* op, size_t bytes);
// Prints a failure message on stderr, once per line, prefixed with "[tandem] ".
void report_failure(const std::string& message);

// Argument checks shared by the backends (ValueError, TypeError, DeviceError).
void check_tensor(const Tensor& t, const Device& device, const std::string& backend, const char* op,
                  const char* name);
// The tensors of one grouped call must not share memory (each would be reduced twice).
void check_disjoint(const std::vector<Tensor>& tensors, const std::string& backend, const char* op);
// True when `part` is exactly `whole`'s slice [rank * part.numel(), (rank + 1) * part.numel()), the
// in-place layout of all_gather and reduce_scatter. Throws a ValueError when the two overlap in any
// other way.
bool is_rank_slice(const Tensor& whole, const Tensor& part, int rank, const std::string& backend, const char* op);
void check_root(int root, int size, const std::string& backend);
// bool tensors reduce with max (any) or min (all) only (TypeError).
void check_reducible(DType dtype, ReduceOp op, const std::string& backend, const char* name);
// The arguments of all_gather, output (size * n,) and input (n,), and of reduce_scatter, output
// (n,) and input (size * n,): tensors of one dtype on `device` whose element counts fit. True
// when the call is in place (the per-rank part is the whole's own slice at rank * n).
bool check_all_gather(const Tensor& output, const Tensor& input, int rank, int size, const Device& device,
                      const std::string& backend);
bool check_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, int rank, int size,
                          const Device& device, const std::string& backend);
// The arguments of all_gather_v and reduce_scatter_v: `whole` (sum of counts,) and `part`
// (counts[rank],) of one dtype on `device`, one non-negative count per rank. True when `part` is
// whole's own block (in place).
bool check_blocks(const Tensor& whole, const Tensor& part, const std::vector<int64_t>& counts, int rank, int size,
                  const Device& device, const std::string& backend, const char* name);
// Where each rank's block starts in `whole`: (size,) prefix sums of counts.
std::vector<int64_t> block_offsets(const std::vector<int64_t>& counts);

// ---- MPI (dist/mpi_group.cpp or dist/no_mpi.cpp) ----
struct MpiWorld {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::shared_ptr<ProcessGroup> group;  // over a duplicate of MPI_COMM_WORLD
};
// MPI_Init_thread unless MPI is up already; the world's ranks and the CPU group.
MpiWorld mpi_init(double timeout_seconds);
// Stops the group's watchdog, waits a little for pending collectives, then waits (up to the
// timeout) for every rank to reach this point and frees the communicator. Later calls on the
// group raise.
void mpi_shutdown_group(ProcessGroup& group);
// Every rank's `bytes` bytes (rank order), over a communicator that only these host-side checks
// use; blocks up to `timeout` seconds. A world of one without MPI gets its own bytes back.
std::vector<uint8_t> host_all_gather(const void* mine, size_t bytes, double timeout);
// MPI_Finalize, when mpi_init initialised MPI and the shutdown was clean. Otherwise MPI_Finalize
// could wait forever (for pending collectives, or for a rank that never finalizes), so the process
// leaves without it and mpirun reports that.
void mpi_finalize();

// Whether a CollectivesOnCurrentStream scope is alive on the calling thread.
bool collectives_on_current_stream();
// Whether a TimedCollectives scope is alive on the calling thread.
bool collectives_timed();

// ---- NCCL (dist/nccl_group.cpp or dist/no_nccl.cpp) ----
bool nccl_is_built();
// What dist::init settled for the NCCL group (InitOptions and their environment variables).
struct NcclSettings {
  double timeout_seconds = 600;
  bool launch_alone = false;      // InitOptions::nccl_launch_alone
  bool nonblocking = false;       // InitOptions::nccl_nonblocking
  bool time_collectives = false;  // InitOptions::time_collectives
  bool high_priority_stream = false;  // InitOptions::comm_stream_high_priority
  bool one_node = false;              // every rank on this node
  int64_t peer_all_reduce_max_bytes = 0;  // InitOptions::peer_all_reduce_max_bytes
  bool report_peer_path = false;      // say on rank 0 why the peer kernel is off (it was asked for)
};
// A communicator over every rank of `cpu_group`, on `device` (already current); rank 0's
// ncclUniqueId travels through cpu_group.
std::shared_ptr<ProcessGroup> make_nccl_group(ProcessGroup& cpu_group, int device, const NcclSettings& settings);
// Stops the watchdog, then finalizes and destroys the communicator (aborts it when collectives are
// still pending). Later calls on the group raise.
void nccl_shutdown_group(ProcessGroup& group);

}  // namespace tandem::dist::internal
