// The GPU half of the all-reduce benchmark in a build without NCCL: there is none.
#include "allreduce.h"

namespace tandem::bench {

std::unique_ptr<AllReduceBench> make_gpu_bench() { return nullptr; }

}  // namespace tandem::bench
