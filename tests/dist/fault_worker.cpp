// A training-like loop for kill_rank_test.sh: every rank all-reduces a 1 MiB gradient per step over
// MPI (or, with TANDEM_FAULT_ON_GPU=1, a GPU tensor over NCCL), labelled "gradients of step N",
// and at step 5 rank 1 either kills itself (SIGKILL; "kill", the default), stops communicating for
// good ("hang"), or stops its process (SIGSTOP; "stop"). The other ranks must end, non-zero, soon
// after: when a rank dies mpirun tears the job down; when one hangs or is stopped, tandem's timeout
// raises on the others (writing their flight recorders where $TANDEM_DIST_DUMP_DIR says), they
// exit non-zero, and mpirun then ends the hung one.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "tandem/core/random.h"
#include "tandem/dist/process_group.h"

int main(int argc, char** argv) {
  using namespace tandem;
  bool hang = argc > 1 && std::strcmp(argv[1], "hang") == 0;
  bool stop = argc > 1 && std::strcmp(argv[1], "stop") == 0;
  const char* on_gpu_env = std::getenv("TANDEM_FAULT_ON_GPU");
  const bool on_gpu = on_gpu_env != nullptr && std::strcmp(on_gpu_env, "1") == 0;
  dist::InitOptions options;
  options.use_gpu = on_gpu;
  const dist::World& w = dist::init(options);
  const Device device = on_gpu ? w.device : Device();
  dist::ProcessGroup& group = w.group_for(device);
  Tensor grad = randn({1 << 18}, TensorOptions(DType::f32, device));  // (262144,) f32
  if (w.rank == 0) std::printf("rank 0: all-reducing on %s\n", device.str().c_str());
  try {
    for (int step = 0; step < 100000; ++step) {
      if (w.rank == 1 && step == 5) {
        std::printf("rank 1: %s at step %d\n",
                    hang   ? "hanging (no more collectives)"
                    : stop ? "stopping my process (SIGSTOP)"
                           : "killing myself (SIGKILL)",
                    step);
        std::fflush(stdout);
        if (stop) std::raise(SIGSTOP);
        if (!hang && !stop) std::raise(SIGKILL);
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      group.all_reduce(grad, dist::ReduceOp::avg, "gradients of step " + std::to_string(step))->synchronize();
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
