#pragma once
// Programmatic dependent launch (Hopper and later): a kernel launched with launch_dependent may
// be scheduled while the kernel ahead of it in the stream is still finishing, instead of after its
// last block has exited and its writes have been flushed. The GPU then overlaps one kernel's
// launch and block scheduling with the previous kernel's last wave: a few hundred nanoseconds per
// kernel, which adds up over the hundreds of small kernels of a training step.
//
// The contract, kept by every kernel launched this way: its first statement is
// dependent_kernel_begin(), which waits until the previous grid has completed and its memory is
// visible (griddepcontrol.wait) before the kernel reads or writes anything, and then lets the
// next dependent kernel be scheduled once every block of this one has started
// (griddepcontrol.launch_dependents). So results are the same as with ordinary launches; only the
// scheduling changes. A kernel that starts this way may still be launched with <<<>>>: with no
// dependency to wait for, both instructions do nothing. Stream capture turns these launches into
// programmatic edges of the graph.
//
// TANDEM_DEPENDENT_LAUNCH=0 launches them as ordinary kernels (to rule the scheduling out when
// looking for a race).
#include <cuda_runtime.h>

#include <utility>

#include "tandem/core/cuda/runtime.h"

namespace tandem::cuda {

__device__ __forceinline__ void dependent_kernel_begin() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// For a small kernel whose dependents need nothing from it until it completes: lets the next
// dependent kernel be scheduled at once (its blocks wait in its own dependent_kernel_begin for this
// kernel to complete, which it does only after the wait here), then waits as dependent_kernel_begin
// does. The dependent's launch then overlaps the kernel before this one instead of starting after it.
__device__ __forceinline__ void dependent_kernel_begin_dependents_first() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared, stream>>>(args...), allowed to start before the previous kernel
// in `stream` finishes (see above). The kernel must begin with dependent_kernel_begin().
template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                      Args&&... args) {
  cudaLaunchAttribute attribute[1] = {};
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  config.attrs = attribute;
  config.numAttrs = dependent_launch_enabled(device) ? 1 : 0;
  // Launch errors are reported by the caller's check_launch, as for <<<>>>.
  (void)cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace tandem::cuda
