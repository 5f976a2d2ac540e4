#pragma once
// CUDA runtime pieces shared by the backend's files: the device guard, tandem's own compute
// stream per device, and the current-stream override.
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include "tandem/core/cuda/check.h"

namespace tandem::cuda {

// Makes `device` current for the scope and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// The stream tandem's kernels on `device` run on: the device's compute stream (created by
// tandem, non-blocking, never the legacy default stream) unless a StreamGuard says otherwise.
cudaStream_t current_stream(int device);
// tandem's compute stream of `device`.
cudaStream_t compute_stream(int device);

// Runs kernels of this thread on `stream` (for `device`) for the scope.
class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

// Names an NVTX range for the scope, so a profiler timeline reads like the code.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Raises a BackendError naming the kernel if its launch failed.
void check_launch(const char* kernel);

// Throws DeviceError unless 0 <= device < device_count().
void check_device(int device);

}  // namespace tandem::cuda
