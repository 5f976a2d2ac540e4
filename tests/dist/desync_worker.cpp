// Ranks that disagree, for desync_test.sh: a training-like loop of labelled all-reduces ("ddp bucket
// b of step s", three buckets a step) in which rank 1 goes wrong at step 3 in the way CASE says:
//   extra      it all-reduces one more tensor, 'metrics' (4 B), before the step's buckets
//   skip       it skips bucket 1
//   size       its bucket 1 has one element more
//   dtype      its bucket 1 is f64 where the others' is f32
//   broadcast  it broadcasts bucket 1 where the others all-reduce it
//   label      (run with TANDEM_DIST_DEBUG=off) its bucket 1 is labelled 'metrics', same size and
//              dtype: MPI completes it, and the check at the end of the step names it
// Every step ends with ProcessGroup::check_in_sync, as DistributedDataParallel does before the
// optimizer step. Each rank prints "rank R: stopped: <error>" and exits 3 once every rank has; with
// $TANDEM_DESYNC_OUT set it also writes that line to $TANDEM_DESYNC_OUT/rank<R>.txt, which the test
// reads: mpirun ends the job when the first rank exits non-zero, and on a loaded machine a rank's
// forwarded output can be cut off then, while a file it wrote is complete.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <cstring>
#include <string>

#include "tandem/core/random.h"
#include "tandem/dist/process_group.h"

int main(int argc, char** argv) {
  using namespace tandem;
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode != "extra" && mode != "skip" && mode != "size" && mode != "dtype" && mode != "broadcast" &&
      mode != "label") {
    std::fprintf(stderr, "usage: desync_worker extra|skip|size|dtype|broadcast|label\n");
    return 2;
  }
  dist::InitOptions options;
  options.use_gpu = false;
  const dist::World& w = dist::init(options);
  dist::ProcessGroup& group = *w.cpu_group;
  const bool culprit = w.rank == 1;
  int status = 0;
  try {
    for (int step = 1; step <= 6; ++step) {
      const bool wrong = culprit && step == 3;
      if (wrong && mode == "extra") group.all_reduce(ones({1}), dist::ReduceOp::sum, "metrics")->wait();
      for (int bucket = 0; bucket < 3; ++bucket) {
        std::string label = "ddp bucket " + std::to_string(bucket) + " of step " + std::to_string(step);
        Tensor grad = randn({1000});  // (1000,) f32: 4 KB
        if (wrong && bucket == 1) {
          if (mode == "skip") continue;
          if (mode == "size") grad = randn({1001});
          if (mode == "dtype") grad = randn({1000}, DType::f64);
          if (mode == "label") label = "metrics";
          if (mode == "broadcast") {
            group.broadcast(grad, 0, label)->wait();
            continue;
          }
        }
        group.all_reduce(grad, dist::ReduceOp::avg, label)->wait();
      }
      group.check_in_sync("the optimizer step of step " + std::to_string(step));
      std::printf("rank %d: step %d done\n", w.rank, step);
      std::fflush(stdout);
    }
  } catch (const Error& e) {
    std::printf("rank %d: stopped: %s\n", w.rank, e.what());
    std::fflush(stdout);
    if (const char* dir = std::getenv("TANDEM_DESYNC_OUT")) {
      std::ofstream(std::string(dir) + "/rank" + std::to_string(w.rank) + ".txt")
          << "rank " << w.rank << ": stopped: " << e.what() << "\n";
    }
    status = 3;
  }
  // Every rank prints before any exits (mpirun ends the job when the first exits non-zero). The
  // world communicator is not tandem's, so a failed group leaves it usable.
  MPI_Barrier(MPI_COMM_WORLD);
  return status;
}
