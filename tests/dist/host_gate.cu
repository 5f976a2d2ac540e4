#include <cuda_runtime.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "dist/host_gate.h"

namespace tandem::dist::testing {
namespace {

__global__ void spin_until_open(const volatile int* flag) {
  // Sleeps between reads: one thread on one SM, polling host memory over the bus.
  while (*flag == 0) __nanosleep(20000);
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

}  // namespace

HostGate::HostGate() {
  void* host = nullptr;
  check(cudaHostAlloc(&host, sizeof(int), cudaHostAllocMapped), "HostGate: cudaHostAlloc");
  flag_ = static_cast<volatile int*>(host);
  *flag_ = 0;
  void* device = nullptr;
  check(cudaHostGetDevicePointer(&device, host, 0), "HostGate: cudaHostGetDevicePointer");
  device_flag_ = static_cast<int*>(device);
}

HostGate::~HostGate() {
  open();
  // The held kernels read the flag until they see it set: free it once they have ended.
  cudaError_t status = cudaDeviceSynchronize();
  if (status == cudaSuccess) status = cudaFreeHost(const_cast<int*>(flag_));
  if (status != cudaSuccess) std::fprintf(stderr, "HostGate: cudaFreeHost: %s\n", cudaGetErrorString(status));
}

void HostGate::hold(void* stream) {
  spin_until_open<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(device_flag_);
  check(cudaGetLastError(), "HostGate: launching the spinning kernel");
}

void HostGate::open() {
  *flag_ = 1;
  __sync_synchronize();  // the store leaves the CPU now; the kernel's next read sees it
}

}  // namespace tandem::dist::testing
