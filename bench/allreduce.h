#pragma once
// The all-reduce benchmark's two halves: the CPU path (tandem's MPI group against MPI_Allreduce)
// lives in allreduce.cpp, the GPU path (tandem's NCCL group against ncclAllReduce) in
// allreduce_gpu.cpp, or allreduce_no_gpu.cpp in a build without NCCL.
#include <cstddef>
#include <memory>
#include <string>

namespace tandem::bench {

// Milliseconds per call: a round's time over its calls.
struct AllReduceTiming {
  double tandem_ms = 0;  // ProcessGroup::all_reduce + Work::wait
  double raw_ms = 0;     // the library's own call on the same buffer
  // GPU: host microseconds to issue each (the calls return before the GPU work ends); 0 on the CPU.
  double tandem_host_us = 0;
  double raw_host_us = 0;
  // GPU with a CUDA graph (time(..., graph = true)): the same calls captured, a round's calls in
  // one graph, replayed.
  double tandem_graph_ms = 0;
  double raw_graph_ms = 0;
};

// Timed replays of each side's graph per size (after one warm-up replay): a replay holds --calls
// calls already.
constexpr int kGraphReplays = 5;

class AllReduceBench {
 public:
  virtual ~AllReduceBench() = default;
  virtual std::string backend() const = 0;   // "nccl" or "mpi"
  virtual std::string raw_name() const = 0;  // "ncclAllReduce" or "MPI_Allreduce"
  // Whether time() can capture the calls into CUDA graphs.
  virtual bool captures() const = 0;
  // Medians over `reps` rounds after `warmup` rounds; each round runs `calls` calls of each side
  // back to back, one side after the other. With `graph` (only where captures()), each side's
  // `calls` calls are also captured into one graph and replayed.
  virtual AllReduceTiming time(size_t bytes, int warmup, int reps, int calls, bool graph) = 0;

  // Where time(..., graph = true) writes each side's captured graph in DOT form (empty: nowhere):
  // tandem_<bytes>_rank<r>.dot and raw_<bytes>_rank<r>.dot.
  std::string graph_dump_dir;
};

// The NCCL benchmark on this rank's GPU, or null in a build without NCCL.
std::unique_ptr<AllReduceBench> make_gpu_bench();

}  // namespace tandem::bench
