// copy_each: many same-dtype contiguous copies in one launch (backend.h). DDP moves each bucket's
// gradients into the bucket this way before its all-reduce: GPT-2 124M's 148 gradients were 148
// cudaMemcpyAsync calls a step on each of 2 GPUs, each with its own gap of idle GPU.
#include <algorithm>
#include <cstdint>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"

namespace tandem::cuda {

namespace {
// The pairs of one launch, in its parameters (no table to upload, so it can launch as a dependent
// launch right behind the kernel before it): pair i's bytes are cut into chunks of kChunkBytes,
// numbered from chunk_starts[i]; block b copies chunks b, b + gridDim.x, ...
constexpr int kPairsPerLaunch = 32;
constexpr int64_t kChunkBytes = 64 << 10;
constexpr int kCopyThreads = 256;

struct CopyPairs {
  const unsigned char* src[kPairsPerLaunch];
  unsigned char* dst[kPairsPerLaunch];
  int64_t bytes[kPairsPerLaunch];
  int64_t chunk_starts[kPairsPerLaunch + 1];  // chunk_starts[count]: the launch's chunks in all
  int count = 0;
};
static_assert(sizeof(CopyPairs) <= 2048, "the pairs fit in a kernel's parameters");

__global__ void __launch_bounds__(kCopyThreads) copy_each_kernel(const __grid_constant__ CopyPairs pairs) {
  dependent_kernel_begin();
  const int64_t chunks = pairs.chunk_starts[pairs.count];
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    int i = 0;
    while (c >= pairs.chunk_starts[i + 1]) ++i;
    const int64_t start = (c - pairs.chunk_starts[i]) * kChunkBytes;
    const int64_t length = pairs.bytes[i] - start < kChunkBytes ? pairs.bytes[i] - start : kChunkBytes;
    const unsigned char* src = pairs.src[i] + start;
    unsigned char* dst = pairs.dst[i] + start;
    // 16 bytes a thread where both ends allow it, the rest (a tail, or a misaligned pair) a byte a thread.
    int64_t done = 0;
    if ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) % 16 == 0) {
      const int64_t vectors = length / 16;
      const uint4* s = reinterpret_cast<const uint4*>(src);
      uint4* d = reinterpret_cast<uint4*>(dst);
      for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) d[v] = s[v];
      done = vectors * 16;
    }
    for (int64_t b = done + threadIdx.x; b < length; b += blockDim.x) dst[b] = src[b];
  }
}
}  // namespace

void copy_each(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts) {
  if (dsts.empty()) return;
  const int device = dsts.front().device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = current_stream(device);
  const int64_t max_blocks = 4LL * multiprocessors(device);
  for (size_t first = 0; first < dsts.size(); first += kPairsPerLaunch) {
    CopyPairs pairs;
    pairs.chunk_starts[0] = 0;
    for (size_t i = first; i < std::min(dsts.size(), first + kPairsPerLaunch); ++i) {
      const int k = pairs.count++;
      pairs.src[k] = static_cast<const unsigned char*>(srcs[i].data_ptr());
      pairs.dst[k] = static_cast<unsigned char*>(dsts[i].data_ptr());
      pairs.bytes[k] = static_cast<int64_t>(dsts[i].nbytes());
      pairs.chunk_starts[k + 1] = pairs.chunk_starts[k] + (pairs.bytes[k] + kChunkBytes - 1) / kChunkBytes;
    }
    const int64_t chunks = pairs.chunk_starts[pairs.count];
    if (chunks == 0) continue;
    launch_dependent(copy_each_kernel, dim3(static_cast<unsigned>(std::min(chunks, max_blocks))),
                     dim3(kCopyThreads), 0, stream, pairs);
    check_launch("copy_each");
  }
}

}  // namespace tandem::cuda
