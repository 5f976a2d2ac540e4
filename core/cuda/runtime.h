#pragma once
// CUDA runtime pieces shared by the backend's files: the device guard, tandem's own compute
// stream per device, and the current-stream override.
#include <cuda_runtime.h>

#include "tandem/core/cuda/check.h"
#include "tandem/core/cuda_api.h"

namespace tandem::cuda {

// DeviceGuard, StreamGuard and ProfilerRange are declared in the public cuda_api.h.
using NvtxRange = ProfilerRange;  // the name the backend's files use

// The stream tandem's kernels on `device` run on: the device's compute stream (created by
// tandem, non-blocking, never the legacy default stream) unless a StreamGuard says otherwise.
cudaStream_t current_stream(int device);
// tandem's compute stream of `device`.
cudaStream_t compute_stream(int device);
// Sets this thread's stream override for `device` (what a StreamGuard does for a scope); null: none.
void set_stream_override(int device, cudaStream_t stream);
// The stream graph captures record on (core/cuda/graph.cpp), one per device.
cudaStream_t capture_stream(int device);

// Inside a capture on this thread (graph.cpp): a host-to-device copy goes through pinned memory the
// graph owns, so that every replay uploads what the capture saw.
bool capturing_uploads();
void captured_upload(void* dst, const void* src, size_t nbytes, cudaStream_t stream);

// Raises a BackendError naming the kernel if its launch failed.
void check_launch(const char* kernel);

// Whether launch_dependent (dependent_launch.cuh) asks for programmatic dependent launch: on
// devices of compute capability 9.0 and up, unless TANDEM_DEPENDENT_LAUNCH=0.
bool dependent_launch_enabled(int device);

// Throws DeviceError unless 0 <= device < device_count().
void check_device(int device);

// Lets `kernel` launch on `device` with `bytes` of dynamic shared memory, opting in past the default
// 48 KiB. The attribute is set once per kernel, device and larger size, not at every launch: the
// call takes host time.
void allow_dynamic_shared_memory(const void* kernel, int device, size_t bytes);
template <typename Kernel>
void allow_dynamic_shared_memory(Kernel* kernel, int device, size_t bytes) {
  allow_dynamic_shared_memory(reinterpret_cast<const void*>(kernel), device, bytes);
}

}  // namespace tandem::cuda
