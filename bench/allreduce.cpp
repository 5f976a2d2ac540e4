// All-reduce bandwidth: tandem's ProcessGroup::all_reduce next to the library's own call on the
// same buffers in the same run (ncclAllReduce on GPUs; MPI_Allreduce on the CPU when there is no
// GPU), f32 sum, message sizes from 1 MiB to 1 GiB in powers of two. Run it under mpirun:
//
//   mpirun -np 2 bench/allreduce [--min-mb 1] [--max-mb 1024] [--warmup 5] [--reps 20]
//
// Bandwidths follow nccl-tests: algbw = bytes / time, busbw = algbw * 2 (n - 1) / n, in GB/s
// (10^9 bytes). The times are medians over rounds (each round runs both, one after the other), the
// slowest rank's. "tandem/raw" is tandem's busbw over the raw call's: 1 means no overhead. Each
// size also prints one JSON object on a line of its own.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
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
// with a barrier before each call.
class MpiBench final : public AllReduceBench {
 public:
  std::string backend() const override { return "mpi"; }
  std::string raw_name() const override { return "MPI_Allreduce"; }

  AllReduceTiming time(size_t bytes, int warmup, int reps) override {
    const dist::World& w = dist::world();
    int n = static_cast<int>(bytes / sizeof(float));
    Tensor buffer = randn({n});  // (n,) f32, never zeros
    auto seconds = [](auto&& fn) {
      MPI_Barrier(MPI_COMM_WORLD);
      auto start = std::chrono::steady_clock::now();
      fn();
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    auto run_tandem = [&] { w.cpu_group->all_reduce(buffer, dist::ReduceOp::sum)->wait(); };
    auto run_raw = [&] { MPI_Allreduce(MPI_IN_PLACE, buffer.data_ptr(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
    std::vector<double> tandem_ms, raw_ms;
    for (int i = 0; i < warmup + reps; ++i) {
      double a = seconds(run_tandem) * 1e3;
      double b = seconds(run_raw) * 1e3;
      if (i >= warmup) {
        tandem_ms.push_back(a);
        raw_ms.push_back(b);
      }
    }
    return {median(tandem_ms), median(raw_ms)};
  }
};

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  using namespace tandem;
  int min_mb = 1, max_mb = 0, warmup = 5, reps = 20;
  CLI::App app("All-reduce bandwidth: tandem's process group against the raw library call (run under mpirun)");
  app.add_option("--min-mb", min_mb, "smallest message, MiB (a power of two)")->check(CLI::PositiveNumber);
  app.add_option("--max-mb", max_mb, "largest message, MiB (default 1024 on GPUs, 64 on the CPU)");
  app.add_option("--warmup", warmup, "untimed rounds per size")->check(CLI::NonNegativeNumber);
  app.add_option("--reps", reps, "timed rounds per size")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  const dist::World& w = dist::init();
  std::unique_ptr<bench::AllReduceBench> bench;
  if (w.gpu_group != nullptr) bench = bench::make_gpu_bench();
  if (bench == nullptr) bench = std::make_unique<bench::MpiBench>();
  if (max_mb <= 0) max_mb = bench->backend() == "nccl" ? 1024 : 64;
  double bus_factor = w.size > 1 ? 2.0 * (w.size - 1) / w.size : 0.0;

  if (w.rank == 0) {
    std::printf("# tandem %s all_reduce vs %s: %d ranks, f32 sum, %s; median of %d rounds after %d warm-up\n",
                bench->backend().c_str(), bench->raw_name().c_str(), w.size, w.device.str().c_str(), reps, warmup);
    std::printf("# %12s  %10s %10s %10s  %10s %10s %10s  %10s  %s\n", "bytes", "tandem ms", "algbw", "busbw", "raw ms",
                "algbw", "busbw", "tandem/raw", "host us to issue: tandem raw (rank 0)");
    std::fflush(stdout);
  }
  for (size_t mb = static_cast<size_t>(min_mb); mb <= static_cast<size_t>(max_mb); mb *= 2) {
    size_t bytes = mb << 20;
    bench::AllReduceTiming t = bench->time(bytes, warmup, reps);
    double slowest[2] = {t.tandem_ms, t.raw_ms};
    MPI_Allreduce(MPI_IN_PLACE, slowest, 2, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (w.rank != 0) continue;
    double tandem_algbw = static_cast<double>(bytes) / (slowest[0] * 1e-3) / 1e9;
    double raw_algbw = static_cast<double>(bytes) / (slowest[1] * 1e-3) / 1e9;
    double ratio = raw_algbw > 0 ? tandem_algbw / raw_algbw : 0.0;
    std::printf("  %12zu  %10.4f %10.2f %10.2f  %10.4f %10.2f %10.2f  %10.3f  %6.1f %6.1f\n", bytes, slowest[0],
                tandem_algbw, tandem_algbw * bus_factor, slowest[1], raw_algbw, raw_algbw * bus_factor, ratio,
                t.tandem_host_us, t.raw_host_us);
    std::printf(
        "{\"bench\": \"allreduce\", \"backend\": \"%s\", \"ranks\": %d, \"dtype\": \"f32\", \"bytes\": %zu, "
        "\"tandem_ms\": %.5f, \"raw_ms\": %.5f, \"tandem_algbw_gbs\": %.3f, \"tandem_busbw_gbs\": %.3f, "
        "\"raw_algbw_gbs\": %.3f, \"raw_busbw_gbs\": %.3f, \"tandem_over_raw\": %.4f, \"tandem_host_us\": %.2f, "
        "\"raw_host_us\": %.2f}\n",
        bench->backend().c_str(), w.size, bytes, slowest[0], slowest[1], tandem_algbw, tandem_algbw * bus_factor,
        raw_algbw, raw_algbw * bus_factor, ratio, t.tandem_host_us, t.raw_host_us);
    std::fflush(stdout);
  }
  bench.reset();
  dist::finalize();
  return 0;
}
