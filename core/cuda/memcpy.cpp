// Copies between the host and CUDA devices, ordered on the devices' current streams.
#include "tandem/core/backend.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/cuda/runtime.h"

namespace tandem::cuda {

void copy_host_to_device(void* dst, const void* src, size_t nbytes, int device) {
  DeviceGuard guard(device);
  if (capturing_uploads()) {
    captured_upload(dst, src, nbytes, current_stream(device));
    return;
  }
  // From pageable memory the call returns once the source has been read, so the host buffer
  // may be freed right after; the device side stays ordered on the stream.
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, current_stream(device)));
}

void copy_device_to_host(void* dst, const void* src, size_t nbytes, int device) {
  check_not_capturing("copying a cuda tensor to the host (item(), to_double_vector(), .to(cpu))");
  DeviceGuard guard(device);
  cudaStream_t stream = current_stream(device);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host reads dst next
}

void copy_device_to_device(void* dst, int dst_device, const void* src, int src_device, size_t nbytes) {
  check_not_capturing("a copy between two GPUs (it waits for the source on the host)");
  {
    DeviceGuard guard(src_device);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(current_stream(src_device)));  // src is complete
  }
  DeviceGuard guard(dst_device);
  TANDEM_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, nbytes, current_stream(dst_device)));
}

void* pinned_allocate(size_t nbytes) {
  void* p = nullptr;
  cudaError_t status = cudaHostAlloc(&p, nbytes == 0 ? 1 : nbytes, cudaHostAllocDefault);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    TANDEM_THROW(OutOfMemoryError, "could not allocate ", nbytes, " bytes of pinned host memory");
  }
  TANDEM_CUDA_CHECK(status);
  return p;
}

void pinned_free(void* ptr) { cudaFreeHost(ptr); }  // no throw: called from destructors

}  // namespace tandem::cuda
