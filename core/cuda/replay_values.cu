// The kernel of write_on_each_replay's graph nodes (see replay_values.h).
#include "tandem/core/cuda/replay_values.h"

namespace tandem::cuda {

namespace {
constexpr unsigned kReplayValueThreads = 64;  // a thread a byte: kReplayValueBytes at most

__global__ void __launch_bounds__(kReplayValueThreads)
    write_replay_values(ReplayValues values, unsigned char* dst, unsigned nbytes) {
  if (threadIdx.x < nbytes) dst[threadIdx.x] = values.bytes[threadIdx.x];
}
static_assert(kReplayValueThreads >= kReplayValueBytes, "one thread per byte");
}  // namespace

cudaKernelNodeParams replay_values_node(const ReplayValues* values, void* const* dst, const unsigned* nbytes,
                                        void* args[3]) {
  args[0] = const_cast<ReplayValues*>(values);
  args[1] = const_cast<void**>(dst);
  args[2] = const_cast<unsigned*>(nbytes);
  cudaKernelNodeParams params{};
  params.func = reinterpret_cast<void*>(write_replay_values);
  params.gridDim = dim3(1);
  params.blockDim = dim3(kReplayValueThreads);
  params.sharedMemBytes = 0;
  params.kernelParams = args;
  return params;
}

}  // namespace tandem::cuda
