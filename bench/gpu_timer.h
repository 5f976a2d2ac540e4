#pragma once
// Timing GPU work on tandem's compute stream with CUDA events: warm-up runs first, then the
// median of the timed repetitions (each repetition timed by its own pair of events).
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "tandem/core/cuda/runtime.h"

namespace tandem::bench {

inline double median_ms(const std::function<void()>& fn, int warmup = 3, int reps = 20, int device = 0) {
  cudaStream_t stream = cuda::current_stream(device);
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<cudaEvent_t> events(2 * reps);
  for (auto& e : events) TANDEM_CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    TANDEM_CUDA_CHECK(cudaEventRecord(events[2 * i], stream));
    fn();
    TANDEM_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream));
  }
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    times.push_back(ms);
  }
  for (auto& e : events) cudaEventDestroy(e);
  std::nth_element(times.begin(), times.begin() + reps / 2, times.end());
  return times[reps / 2];
}

}  // namespace tandem::bench
