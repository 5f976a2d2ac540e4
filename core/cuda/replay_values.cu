// The kernel of write_on_each_replay's graph nodes (see replay_values.h).
#include "tandem/core/cuda/replay_values.h"

#include "tandem/core/cuda/dependent_launch.cuh"

namespace tandem::cuda {

namespace {
constexpr unsigned kReplayValueThreads = 64;  // a thread a byte: kReplayValueBytes at most

__global__ void __launch_bounds__(kReplayValueThreads)
    write_replay_values(ReplayValues values, unsigned char* dst, unsigned nbytes) {
  // Waits for the nodes before it (they may still read the values of the write before this one),
  // letting the node after it (the optimizer's update) start its launch first.
  dependent_kernel_begin_dependents_first();
  if (threadIdx.x < nbytes) dst[threadIdx.x] = values.bytes[threadIdx.x];
}
static_assert(kReplayValueThreads >= kReplayValueBytes, "one thread per byte");
}  // namespace

void launch_replay_values(const ReplayValues& values, void* dst, unsigned nbytes, cudaStream_t stream) {
  launch_dependent(write_replay_values, dim3(1), dim3(kReplayValueThreads), 0, stream, values,
                   static_cast<unsigned char*>(dst), nbytes);
  check_launch("write_on_each_replay");
}

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
