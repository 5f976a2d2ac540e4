// CUDA device management: device count, memory, and host/device copies. The caching allocator
// and tandem's own streams replace the plain cudaMalloc/legacy-stream calls here in the CUDA
// backend issue; until then each allocation goes straight to the driver.
#include "tandem/core/backend.h"
#include "tandem/core/cuda/check.h"

namespace tandem::cuda {

namespace {
// Makes `device` current for the scope, restoring the previous one after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    TANDEM_CUDA_CHECK(cudaGetDevice(&previous_));
    if (device != previous_) TANDEM_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

void check_device(int device) {
  int count = device_count();
  TANDEM_CHECK_AS(DeviceError, device >= 0 && device < count, "cuda:", device, " does not exist (", count,
                  " CUDA device(s) visible)");
}
}  // namespace

bool is_built() { return true; }

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return count;
}

void* device_allocate(size_t nbytes, int device) {
  check_device(device);
  DeviceGuard guard(device);
  void* p = nullptr;
  cudaError_t status = cudaMalloc(&p, nbytes == 0 ? 1 : nbytes);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    TANDEM_THROW(OutOfMemoryError, "cuda:", device, ": out of memory allocating ", nbytes, " bytes (", free_bytes,
                 " free of ", total_bytes, ")");
  }
  TANDEM_CUDA_CHECK(status);
  return p;
}

void device_free(void* ptr, int device) {
  DeviceGuard guard(device);
  cudaFree(ptr);  // no throw: called from destructors
}

void copy_host_to_device(void* dst, const void* src, size_t nbytes, int device) {
  DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
}

void copy_device_to_host(void* dst, const void* src, size_t nbytes, int device) {
  DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost));
}

void copy_device_to_device(void* dst, int dst_device, const void* src, int src_device, size_t nbytes) {
  TANDEM_CUDA_CHECK(cudaMemcpyPeer(dst, dst_device, src, src_device, nbytes));
}

// Same-device copy. Only the plain byte copy exists until the CUDA kernels land.
void copy(const Tensor& src, const Tensor& dst) {
  if (src.dtype() != dst.dtype() || !src.is_contiguous() || !dst.is_contiguous()) {
    TANDEM_THROW(NotImplementedError, "copy with a dtype cast or strides: not yet implemented for cuda");
  }
  DeviceGuard guard(dst.device().index);
  TANDEM_CUDA_CHECK(cudaMemcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice));
}

void synchronize(int device) {
  DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace tandem::cuda
