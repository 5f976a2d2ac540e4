#include "tandem/core/cuda/runtime.h"

#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda_graph.h"

namespace tandem::cuda {

namespace {
constexpr int kMaxDevices = 64;
thread_local cudaStream_t stream_override[kMaxDevices] = {};
}  // namespace

DeviceGuard::DeviceGuard(int device) {
  TANDEM_CUDA_CHECK(cudaGetDevice(&previous_));
  if (device != previous_) TANDEM_CUDA_CHECK(cudaSetDevice(device));
}

// Restores the device only where it changed: cudaGetDevice reads a thread-local, while
// cudaSetDevice costs a driver call even to the same device, and every collective and event
// record takes a guard (or several).
DeviceGuard::~DeviceGuard() {
  int current = previous_;
  if (cudaGetDevice(&current) != cudaSuccess || current != previous_) cudaSetDevice(previous_);
}

bool is_built() { return true; }

// Asked once: the devices a process sees are fixed when CUDA starts, and check_device asks on
// every stream lookup.
int device_count() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the "no device" error so later calls start clean
      return 0;
    }
    return n;
  }();
  return count;
}

bool is_available() { return device_count() > 0; }

int64_t l2_cache_bytes(int device) {
  static std::atomic<int64_t> bytes[kMaxDevices];  // per device: 0 not asked yet
  if (device < 0 || device >= kMaxDevices) return 0;
  if (bytes[device] == 0) {
    int size = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&size, cudaDevAttrL2CacheSize, device));
    bytes[device] = size;
  }
  return bytes[device];
}

void check_device(int device) {
  int count = device_count();
  TANDEM_CHECK_AS(DeviceError, device >= 0 && device < count && device < kMaxDevices, "cuda:", device,
                  " does not exist (", count, " CUDA device(s) visible)");
}

namespace {
// One non-blocking stream per device, made at the first use and kept for the process; at the
// device's greatest priority or the default one.
class StreamPerDevice {
 public:
  explicit StreamPerDevice(bool highest_priority) : highest_priority_(highest_priority) {}
  cudaStream_t get(int device) {
    check_device(device);
    std::call_once(once_[device], [this, device] {
      DeviceGuard guard(device);
      int least = 0, greatest = 0;
      if (highest_priority_) TANDEM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      TANDEM_CUDA_CHECK(cudaStreamCreateWithPriority(&streams_[device], cudaStreamNonBlocking,
                                                     highest_priority_ ? greatest : 0));
    });
    return streams_[device];
  }

 private:
  bool highest_priority_;
  std::once_flag once_[kMaxDevices];
  cudaStream_t streams_[kMaxDevices] = {};
};
}  // namespace

cudaStream_t compute_stream(int device) {
  static auto* streams = new StreamPerDevice(false);  // never destroyed: used until exit
  return streams->get(device);
}

cudaStream_t capture_stream(int device) {
  static auto* streams = new StreamPerDevice(false);
  return streams->get(device);
}

cudaStream_t current_stream(int device) {
  check_device(device);
  cudaStream_t s = stream_override[device];
  return s != nullptr ? s : compute_stream(device);
}

StreamHandle current_stream_handle(int device) { return current_stream(device); }

void set_stream_override(int device, cudaStream_t stream) {
  check_device(device);
  stream_override[device] = stream;
}

StreamHandle collective_stream(int device, bool highest_priority) {
  static auto* highest = new StreamPerDevice(true);
  static auto* default_priority = new StreamPerDevice(false);
  return (highest_priority ? highest : default_priority)->get(device);
}

StreamHandle side_stream(int device) {
  static auto* streams = new StreamPerDevice(false);
  return streams->get(device);
}

void set_device(int device) { TANDEM_CUDA_CHECK(cudaSetDevice(device)); }

StreamGuard::StreamGuard(int device, StreamHandle stream) : device_(device) {
  check_device(device);
  previous_ = stream_override[device];
  stream_override[device] = static_cast<cudaStream_t>(stream);
}

StreamGuard::~StreamGuard() { stream_override[device_] = static_cast<cudaStream_t>(previous_); }

ProfilerRange::ProfilerRange(const char* name) { nvtxRangePushA(name); }
ProfilerRange::~ProfilerRange() { nvtxRangePop(); }

void check_launch(const char* kernel) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    TANDEM_THROW(BackendError, "CUDA kernel ", kernel, " failed to launch: ", cudaGetErrorName(status), ": ",
                 cudaGetErrorString(status));
  }
}

void allow_dynamic_shared_memory(const void* kernel, int device, size_t bytes) {
  constexpr size_t kDefaultLimit = 48 * 1024;
  if (bytes <= kDefaultLimit) return;
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> allowed;  // (kernel, device) -> bytes set
  std::lock_guard<std::mutex> lock(mutex);
  size_t& set = allowed[{kernel, device}];
  if (bytes <= set) return;
  DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  set = bytes;
}

bool dependent_launch_enabled(int device) {
  static const bool allowed = [] {
    const char* v = std::getenv("TANDEM_DEPENDENT_LAUNCH");
    return v == nullptr || std::string(v) != "0";
  }();
  static std::atomic<int> capable[kMaxDevices];  // per device: 0 not asked yet, 1 yes, 2 no
  if (!allowed || device < 0 || device >= kMaxDevices) return false;
  if (capable[device] == 0) {
    int major = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    capable[device] = major >= 9 ? 1 : 2;
  }
  return capable[device] == 1;
}

Event::Event(bool timing) {
  cudaEvent_t e = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  handle_ = e;
}

Event::~Event() { cudaEventDestroy(static_cast<cudaEvent_t>(handle_)); }

void Event::record(int device) {
  DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), current_stream(device)));
  recorded_ = true;
}

void Event::record_on(StreamHandle stream) {
  TANDEM_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream)));
  recorded_ = true;
}

void Event::wait_on(StreamHandle stream) const {
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(handle_), 0));
}

void Event::wait(int device) const {
  DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(current_stream(device), static_cast<cudaEvent_t>(handle_), 0));
}

void Event::synchronize() const {
  check_not_capturing("waiting on the host for a CUDA event (Event::synchronize, Work::synchronize)");
  TANDEM_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_))); }

bool Event::query() const {
  check_not_capturing("querying a CUDA event from the host");
  cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (status == cudaErrorNotReady) return false;
  TANDEM_CUDA_CHECK(status);
  return true;
}

double Event::elapsed_ms(const Event& end) const {
  check_not_capturing("reading the time between two CUDA events");
  float ms = 0;
  TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_), static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

void synchronize(int device) {
  check_not_capturing("cuda::synchronize()");
  DeviceGuard guard(device);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(compute_stream(device)));
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
}

void profiler_start() { TANDEM_CUDA_CHECK(cudaProfilerStart()); }
void profiler_stop() { TANDEM_CUDA_CHECK(cudaProfilerStop()); }

}  // namespace tandem::cuda
