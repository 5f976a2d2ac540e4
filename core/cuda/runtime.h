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

// Raises a BackendError naming the kernel if its launch failed.
void check_launch(const char* kernel);

// Throws DeviceError unless 0 <= device < device_count().
void check_device(int device);

}  // namespace tandem::cuda
