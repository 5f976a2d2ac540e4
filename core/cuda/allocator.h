#pragma once
// The caching allocator's graph pools (allocator.cpp), for core/cuda/graph.cpp.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

// From now on the calling thread's allocations on `device` come from pool `pool` (non-zero, made on
// first use), and the ordinary blocks it frees are held by the pool, until end_pool_use().
void begin_pool_use(int device, uint64_t pool);
void end_pool_use(int device);
// Gives the pool back once the device is done with it: its blocks join the ordinary cache as
// blocks of `stream` (those still in use go there when freed), and the blocks it held are freed.
void release_pool(int device, uint64_t pool, cudaStream_t stream);
// Device memory the pool's segments hold.
size_t pool_bytes(int device, uint64_t pool);

}  // namespace tandem::cuda
