// All-reduce bandwidth: tandem's ProcessGroup::all_reduce next to the library's own call on the
// same buffers in the same run (ncclAllReduce on GPUs; MPI_Allreduce on the CPU when there is no
// GPU), f32 sum, message sizes from 1 MiB to 1 GiB in powers of two. Run it under mpirun:
//
//   mpirun -np 2 bench/allreduce [--min-mb 1] [--max-mb 1024] [--warmup 5] [--reps 20] [--calls 20]
//                                [--cuda-graph] [--on-current-stream]
//
// Bandwidths follow nccl-tests: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n, in GB/s
// (10^9 bytes), the time being a call's: each round issues --calls calls of one side back to back
// (as nccl-tests' iterations; each tandem call waited for with Work::wait, as a caller that needs
// the result does), then as many of the other, and divides. The times are medians over rounds, the
// slowest rank's; so are the host's microseconds to issue a call. "tandem/raw" is tandem's busbw
// over the raw call's: 1 means no overhead. With --calls 1 a round times one call from an idle GPU,
// the host's time to issue it included. Each size also prints one JSON object on a line of its own.
//
// --cuda-graph (GPUs only) adds the captured mode: each side's --calls calls (tandem's all_reduce +
// wait, the raw ncclAllReduce) captured into one CUDA graph and the graphs replayed; times per
// call, with their own tandem/raw. On one GPU (a world of one) tandem's group
// launches through NCCL like the raw call (InitOptions::nccl_launch_alone), so both sides run NCCL's
// one-rank work and the comparison measures what tandem adds: the event edges to its communication
// stream, the completion events, the watchdog, and in a graph the per-replay watch.
//
// --on-current-stream runs tandem's calls inside a dist::CollectivesOnCurrentStream scope: on the
// caller's stream, as a collective waited for at once runs (PyTorch's async_op=False), without the
// event edges to the communication stream and back.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "allreduce.h"
#include "tandem/core/random.h"
#include "tandem/dist/process_group.h"

namespace tandem::bench {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// tandem's MPI group against MPI_Allreduce on MPI_COMM_WORLD, timed on the host; the ranks line up
// with a barrier before each round.
class MpiBench final : public AllReduceBench {
 public:
  std::string backend() const override { return "mpi"; }
  std::string raw_name() const override { return "MPI_Allreduce"; }
  bool captures() const override { return false; }

  AllReduceTiming time(size_t bytes, int warmup, int reps, int calls, bool /*graph*/) override {
    const dist::World& w = dist::world();
    int n = static_cast<int>(bytes / sizeof(float));
    Tensor buffer = randn({n});  // (n,) f32, never zeros
    auto seconds_per_call = [calls](auto&& fn) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) fn();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
    };
    auto run_tandem = [&] { w.cpu_group->all_reduce(buffer, dist::ReduceOp::sum)->wait(); };
    auto run_raw = [&] { MPI_Allreduce(MPI_IN_PLACE, buffer.data_ptr(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
    for (int i = 0; i < warmup; ++i) {
      run_tandem();
      run_raw();
    }
    std::vector<double> tandem_ms, raw_ms;
    for (int i = 0; i < reps; ++i) {
      tandem_ms.push_back(seconds_per_call(run_tandem) * 1e3);
      raw_ms.push_back(seconds_per_call(run_raw) * 1e3);
    }
    AllReduceTiming t;
    t.tandem_ms = median(tandem_ms);
    t.raw_ms = median(raw_ms);
    return t;
  }
};

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  using namespace tandem;
  int min_mb = 1, max_mb = 0, warmup = 5, reps = 20, calls = 20;
  bool cuda_graph = false, on_current_stream = false;
  std::string dump_graphs;
  CLI::App app("All-reduce bandwidth: tandem's process group against the raw library call (run under mpirun)");
  app.add_option("--min-mb", min_mb, "smallest message, MiB (a power of two)")->check(CLI::PositiveNumber);
  app.add_option("--max-mb", max_mb, "largest message, MiB (default 1024 on GPUs, 64 on the CPU)");
  app.add_option("--warmup", warmup, "untimed calls of each side per size")->check(CLI::NonNegativeNumber);
  app.add_option("--reps", reps, "timed rounds per size")->check(CLI::PositiveNumber);
  app.add_option("--calls", calls,
                 "calls per round and side, issued back to back (1: each call alone, from an idle GPU); also the "
                 "calls a graph holds")
      ->check(CLI::PositiveNumber);
  CLI::Option* graph_flag = app.add_flag("--cuda-graph", cuda_graph,
               "also time both sides captured into CUDA graphs (--calls calls per graph) and replayed (GPUs only)");
  app.add_option("--dump-graphs", dump_graphs,
                 "with --cuda-graph: write each side's captured graph per size to this existing folder in DOT form "
                 "(tandem_<bytes>_rank<r>.dot, raw_<bytes>_rank<r>.dot)")
      ->check(CLI::ExistingDirectory)
      ->needs(graph_flag);
  app.add_flag("--on-current-stream", on_current_stream,
               "tandem's calls run on the caller's stream (dist::CollectivesOnCurrentStream), not the group's "
               "communication stream (GPUs)");
  CLI11_PARSE(app, argc, argv);

  // A world of one launches through NCCL too, so that one GPU compares the same work on both sides.
  dist::InitOptions options;
  options.nccl_launch_alone = true;
  const dist::World& w = dist::init(options);
  std::unique_ptr<bench::AllReduceBench> bench;
  if (w.gpu_group != nullptr) bench = bench::make_gpu_bench();
  if (bench == nullptr) bench = std::make_unique<bench::MpiBench>();
  if (cuda_graph && !bench->captures()) {
    if (w.rank == 0) {
      std::fprintf(stderr,
                   "allreduce: --cuda-graph captures NCCL collectives into CUDA graphs, but this run takes the CPU "
                   "path (tandem's MPI group against MPI_Allreduce: %s); run it on GPUs, one per rank\n",
                   w.device.is_cuda() ? "this rank has no NCCL group" : "no CUDA device");
    }
    bench.reset();
    dist::finalize();
    return 2;
  }
  bench->graph_dump_dir = dump_graphs;
  if (max_mb <= 0) max_mb = bench->backend() == "nccl" ? 1024 : 64;
  std::optional<dist::CollectivesOnCurrentStream> on_caller_stream;  // every collective below is this thread's
  if (on_current_stream) on_caller_stream.emplace();
  double bus_factor = w.size > 1 ? 2.0 * (w.size - 1) / w.size : 0.0;

  if (w.rank == 0) {
    std::printf("# tandem %s all_reduce vs %s: %d ranks, f32 sum, %s; ms per call, median of %d rounds of %d calls "
                "back to back after %d warm-up calls\n",
                bench->backend().c_str(), bench->raw_name().c_str(), w.size, w.device.str().c_str(), reps, calls,
                warmup);
    if (bench->backend() == "nccl" && w.size == 1) {
      std::printf("# a world of one: tandem's group launches through NCCL as the raw call does (nccl_launch_alone, "
                  "unless $TANDEM_NCCL_LAUNCH_ALONE=0); busbw is 0 for one rank, compare algbw\n");
    }
    if (on_current_stream) {
      std::printf("# tandem's calls run on the caller's stream (dist::CollectivesOnCurrentStream)%s\n",
                  bench->backend() == "nccl" ? "" : ": no effect on the MPI group");
    }
    if (cuda_graph) {
      std::printf("# graph: each side's %d calls captured into one CUDA graph, replayed %d times after one warm-up "
                  "replay; ms per call, median over replays\n",
                  calls, bench::kGraphReplays);
    }
    std::printf("# %12s  %10s %10s %10s  %10s %10s %10s  %10s  %s", "bytes", "tandem ms", "algbw", "busbw", "raw ms",
                "algbw", "busbw", "tandem/raw", "host us to issue: tandem raw (slowest rank)");
    if (cuda_graph) {
      std::printf("  %10s %10s %10s %10s %10s", "graph: tandem ms", "busbw", "raw ms", "busbw", "tandem/raw");
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  for (size_t mb = static_cast<size_t>(min_mb); mb <= static_cast<size_t>(max_mb); mb *= 2) {
    size_t bytes = mb << 20;
    bench::AllReduceTiming t = bench->time(bytes, warmup, reps, calls, cuda_graph);
    double slowest[6] = {t.tandem_ms, t.raw_ms, t.tandem_graph_ms, t.raw_graph_ms, t.tandem_host_us, t.raw_host_us};
    MPI_Allreduce(MPI_IN_PLACE, slowest, 6, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (w.rank != 0) continue;
    auto algbw = [&](double ms) { return ms > 0 ? static_cast<double>(bytes) / (ms * 1e-3) / 1e9 : 0.0; };
    auto ratio = [](double tandem, double raw) { return raw > 0 ? tandem / raw : 0.0; };
    const double tandem_algbw = algbw(slowest[0]), raw_algbw = algbw(slowest[1]);
    const double tandem_graph_algbw = algbw(slowest[2]), raw_graph_algbw = algbw(slowest[3]);
    std::printf("  %12zu  %10.4f %10.2f %10.2f  %10.4f %10.2f %10.2f  %10.3f  %6.1f %6.1f", bytes, slowest[0],
                tandem_algbw, tandem_algbw * bus_factor, slowest[1], raw_algbw, raw_algbw * bus_factor,
                ratio(tandem_algbw, raw_algbw), slowest[4], slowest[5]);
    if (cuda_graph) {
      std::printf("  %16.4f %10.2f %10.4f %10.2f %10.3f", slowest[2], tandem_graph_algbw * bus_factor, slowest[3],
                  raw_graph_algbw * bus_factor, ratio(tandem_graph_algbw, raw_graph_algbw));
    }
    std::printf("\n");
    std::printf(
        "{\"bench\": \"allreduce\", \"backend\": \"%s\", \"ranks\": %d, \"on_current_stream\": %s, "
        "\"calls_per_round\": %d, \"dtype\": \"f32\", \"bytes\": %zu, "
        "\"tandem_ms\": %.5f, \"raw_ms\": %.5f, \"tandem_algbw_gbs\": %.3f, \"tandem_busbw_gbs\": %.3f, "
        "\"raw_algbw_gbs\": %.3f, \"raw_busbw_gbs\": %.3f, \"tandem_over_raw\": %.4f, \"tandem_host_us\": %.2f, "
        "\"raw_host_us\": %.2f",
        bench->backend().c_str(), w.size, on_current_stream ? "true" : "false", calls, bytes, slowest[0], slowest[1],
        tandem_algbw, tandem_algbw * bus_factor, raw_algbw, raw_algbw * bus_factor, ratio(tandem_algbw, raw_algbw),
        slowest[4], slowest[5]);
    if (cuda_graph) {
      std::printf(
          ", \"calls_per_graph\": %d, \"tandem_graph_ms\": %.5f, \"raw_graph_ms\": %.5f, "
          "\"tandem_graph_algbw_gbs\": %.3f, \"tandem_graph_busbw_gbs\": %.3f, \"raw_graph_algbw_gbs\": %.3f, "
          "\"raw_graph_busbw_gbs\": %.3f, \"tandem_over_raw_graph\": %.4f",
          calls, slowest[2], slowest[3], tandem_graph_algbw, tandem_graph_algbw * bus_factor,
          raw_graph_algbw, raw_graph_algbw * bus_factor, ratio(tandem_graph_algbw, raw_graph_algbw));
    }
    std::printf("}\n");
    std::fflush(stdout);
  }
  on_caller_stream.reset();
  bench.reset();
  dist::finalize();
  return 0;
}
