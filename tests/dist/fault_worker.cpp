// A training-like loop for kill_rank_test.sh: every rank all-reduces a 1 MiB gradient per step over
// MPI, and at step 5 rank 1 either kills itself (SIGKILL; "kill", the default) or stops
// communicating for good ("hang"). The other ranks must end, non-zero, soon after: when a rank
// dies mpirun tears the job down; when one hangs, tandem's timeout raises on the others, they exit
// non-zero, and mpirun then ends the hung one.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tandem/core/random.h"
#include "tandem/dist/process_group.h"

int main(int argc, char** argv) {
  using namespace tandem;
  bool hang = argc > 1 && std::strcmp(argv[1], "hang") == 0;
  dist::InitOptions options;
  options.use_gpu = false;
  const dist::World& w = dist::init(options);
  Tensor grad = randn({1 << 18});  // (262144,) f32
  try {
    for (int step = 0; step < 100000; ++step) {
      if (w.rank == 1 && step == 5) {
        std::printf("rank 1: %s at step %d\n", hang ? "hanging (no more collectives)" : "killing myself (SIGKILL)",
                    step);
        std::fflush(stdout);
        if (!hang) std::raise(SIGKILL);
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      w.cpu_group->all_reduce(grad, dist::ReduceOp::avg)->wait();
      if (w.rank == 0) {
        std::printf("rank 0: step %d done\n", step);
        std::fflush(stdout);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "rank %d: training failed: %s\n", w.rank, e.what());
    return 1;
  }
  return 0;
}
