// The GPU half of the all-reduce benchmark: tandem's NCCL group (comm stream, events, watchdog)
// against a raw ncclAllReduce on the compute stream, through a second communicator of the same
// ranks, on the same buffer. CUDA events on the caller's stream time each side's calls of a
// round, issued back to back from an idle GPU (as nccl-tests times its iterations): a side whose
// host issues a call more slowly than the GPU runs one falls behind. In the captured mode each
// side's calls are captured into a CUDA graph (tandem's through cuda::Graph, as a training step
// is; the raw calls with CUDA's own stream capture) and the graphs replayed.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "allreduce.h"
#include "tandem/core/cuda/runtime.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/random.h"
#include "tandem/dist/check.h"
#include "tandem/dist/process_group.h"

namespace tandem::bench {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `calls` raw calls captured into an executable graph, through a stream of its own; written in DOT
// form to `dot_path` unless it is empty.
class RawGraph {
 public:
  RawGraph(const std::function<void(cudaStream_t)>& call, int calls, const std::string& dot_path) {
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; ++i) call(stream_);
    cudaGraph_t graph = nullptr;
    TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
    if (!dot_path.empty()) TANDEM_CUDA_CHECK(cudaGraphDebugDotPrint(graph, dot_path.c_str(), cudaGraphDebugDotFlagsVerbose));
    cudaError_t status = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    TANDEM_CUDA_CHECK(status);
  }
  ~RawGraph() {
    cudaStreamSynchronize(stream_);
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    cudaStreamDestroy(stream_);
  }
  RawGraph(const RawGraph&) = delete;
  RawGraph& operator=(const RawGraph&) = delete;
  void replay(cudaStream_t stream) { TANDEM_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

 private:
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Milliseconds from events[first + stride * i] to the event after it, for i < count, each divided
// by `per` (the calls a graph holds); the stream must be done with them.
std::vector<double> elapsed_pairs(const std::vector<cudaEvent_t>& events, size_t first, size_t stride, int count,
                                  double per) {
  std::vector<double> ms;
  for (int i = 0; i < count; ++i) {
    float v = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&v, events[first + stride * i], events[first + stride * i + 1]));
    ms.push_back(v / per);
  }
  return ms;
}

class NcclBench final : public AllReduceBench {
 public:
  NcclBench() {
    const dist::World& w = dist::world();
    device_ = w.device.index;
    ncclUniqueId id;
    if (w.rank == 0) TANDEM_NCCL_CHECK(ncclGetUniqueId(&id));
    TANDEM_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    cuda::DeviceGuard guard(device_);
    TANDEM_NCCL_CHECK(ncclCommInitRank(&comm_, w.size, id, w.rank));
  }
  ~NcclBench() override { ncclCommDestroy(comm_); }

  std::string backend() const override { return "nccl"; }
  std::string raw_name() const override { return "ncclAllReduce"; }
  bool captures() const override { return true; }

  AllReduceTiming time(size_t bytes, int warmup, int reps, int calls, bool graph) override {
    const dist::World& w = dist::world();
    cuda::DeviceGuard guard(device_);
    cudaStream_t stream = cuda::current_stream(device_);
    // (n,) f32 of normal values: never zeros. Sums grow by the world size per call, far from
    // overflowing within one size's calls.
    int64_t n = static_cast<int64_t>(bytes / sizeof(float));
    Tensor buffer = randn({n}, TensorOptions(DType::f32, w.device));
    auto run_tandem = [&] { w.gpu_group->all_reduce(buffer, dist::ReduceOp::sum)->wait(); };
    auto run_raw = [&] {
      TANDEM_NCCL_CHECK(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), static_cast<size_t>(n), ncclFloat32,
                                      ncclSum, comm_, stream));
    };
    for (int i = 0; i < warmup; ++i) {
      run_tandem();
      run_raw();
    }
    // Round i: events 4i and 4i + 1 around the tandem calls, 4i + 2 and 4i + 3 around the raw ones.
    // Each side starts from an idle GPU with the ranks lined up, so both pay the host's latency to
    // their first call alike (the side that went second used to find the other's last calls still
    // running and its own first calls queued: up to one call's time ahead); the order alternates.
    std::vector<cudaEvent_t> events(4 * reps);
    for (auto& e : events) TANDEM_CUDA_CHECK(cudaEventCreate(&e));
    std::vector<double> tandem_host_us, raw_host_us;
    auto host_us_per_call = [calls](const auto& call) {
      auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) call();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / calls;
    };
    auto time_side = [&](bool tandem_side, int round) {
      const size_t first = 4 * static_cast<size_t>(round) + (tandem_side ? 0 : 2);
      TANDEM_CUDA_CHECK(cudaEventRecord(events[first], stream));
      if (tandem_side) {
        tandem_host_us.push_back(host_us_per_call(run_tandem));
      } else {
        raw_host_us.push_back(host_us_per_call(run_raw));
      }
      TANDEM_CUDA_CHECK(cudaEventRecord(events[first + 1], stream));
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
      TANDEM_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    };
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));  // the warm-up calls
    TANDEM_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    for (int i = 0; i < reps; ++i) {
      const bool tandem_first = i % 2 == 0;
      time_side(tandem_first, i);
      time_side(!tandem_first, i);
    }
    AllReduceTiming t;
    t.tandem_ms = median(elapsed_pairs(events, 0, 4, reps, calls));
    t.raw_ms = median(elapsed_pairs(events, 2, 4, reps, calls));
    t.tandem_host_us = median(tandem_host_us);
    t.raw_host_us = median(raw_host_us);
    for (auto& e : events) cudaEventDestroy(e);
    if (graph) time_graphs(run_tandem, buffer, calls, t);
    return t;
  }

 private:
  // Each side's calls captured into a graph of `calls` and replayed, one side after the other per
  // round, so that the host prepares one side's replay while the other side's runs. Sums grow by
  // the world size per call: with 4 or more ranks the graphs' calls take them to inf, which costs
  // NCCL's kernels nothing.
  void time_graphs(const std::function<void()>& run_tandem, const Tensor& buffer, int calls, AllReduceTiming& t) {
    cudaStream_t stream = cuda::current_stream(device_);
    const size_t n = static_cast<size_t>(buffer.numel());
    cuda::synchronize(device_);  // nothing eager left in flight when the capture starts
    cuda::Graph tandem_graph;
    {
      cuda::GraphCapture capture(tandem_graph, device_);
      for (int i = 0; i < calls; ++i) run_tandem();
      capture.end();
    }
    auto dot_path = [&](const char* side) {
      if (graph_dump_dir.empty()) return std::string();
      return graph_dump_dir + "/" + side + "_" + std::to_string(buffer.nbytes()) + "_rank" +
             std::to_string(dist::world().rank) + ".dot";
    };
    if (!graph_dump_dir.empty()) tandem_graph.debug_dump(dot_path("tandem"));
    RawGraph raw_graph(
        [&](cudaStream_t s) {
          TANDEM_NCCL_CHECK(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), n, ncclFloat32, ncclSum, comm_, s));
        },
        calls, dot_path("raw"));
    const int rounds = 1 + kGraphReplays;  // the first is a warm-up
    std::vector<cudaEvent_t> events(4 * rounds);
    for (auto& e : events) TANDEM_CUDA_CHECK(cudaEventCreate(&e));
    for (int i = 0; i < rounds; ++i) {
      TANDEM_CUDA_CHECK(cudaEventRecord(events[4 * i], stream));
      tandem_graph.replay();  // on the current stream
      TANDEM_CUDA_CHECK(cudaEventRecord(events[4 * i + 1], stream));
      TANDEM_CUDA_CHECK(cudaEventRecord(events[4 * i + 2], stream));
      raw_graph.replay(stream);
      TANDEM_CUDA_CHECK(cudaEventRecord(events[4 * i + 3], stream));
    }
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    t.tandem_graph_ms = median(elapsed_pairs(events, 4, 4, kGraphReplays, calls));
    t.raw_graph_ms = median(elapsed_pairs(events, 6, 4, kGraphReplays, calls));
    for (auto& e : events) cudaEventDestroy(e);
  }

  int device_ = 0;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<AllReduceBench> make_gpu_bench() { return std::make_unique<NcclBench>(); }

}  // namespace tandem::bench
