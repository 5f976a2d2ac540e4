// The one-shot all-reduce kernel among GPUs of one node (dist/peer_all_reduce.h has the protocol).
#include <cstdint>

#include "tandem/core/cuda/check.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/dist/peer_all_reduce.h"

namespace tandem::dist::internal {

namespace {

using cuda::acc_t;
using cuda::cast_to;
using cuda::Packed;
using cuda::to_acc;

__device__ __forceinline__ void store_release_system(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_system(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

template <ReduceOp Op, typename A>
__device__ __forceinline__ A combine(A a, A b) {
  if constexpr (Op == ReduceOp::max) return a > b ? a : b;
  else if constexpr (Op == ReduceOp::min) return a < b ? a : b;
  else return a + b;  // sum, avg
}

// Tells every other rank that block b of this call has its part in staging, and waits until all
// have said the same. False when the wait was given up (timeout or abort).
__device__ bool arrive_and_wait(const PeerAllReduceArgs& a, int b, uint32_t call, int* stop) {
  __syncthreads();  // the block's staging writes before the release below
  const int peer = threadIdx.x;
  if (peer < a.size && peer != a.rank) {
    store_release_system(&a.flags[peer][b * kPeerMaxRanks + a.rank], call);
    const uint32_t* mine = &a.flags[a.rank][b * kPeerMaxRanks + peer];
    // A peer may be one call ahead already (it saw this rank's flag and went on): at least `call`.
    const uint64_t start = global_timer_ns();
    uint32_t spins = 0;
    while (static_cast<int32_t>(load_acquire_system(mine) - call) < 0) {
      if ((++spins & 1023u) != 0) continue;
      if (*a.abort_flag != 0) {
        *stop = 1;
        break;
      }
      if (global_timer_ns() - start > a.timeout_ns) {
        atomicCAS(a.status, 0, 1 + peer);
        *stop = 1;
        break;
      }
    }
  }
  __syncthreads();
  return *stop == 0;
}

constexpr int kUnroll = 4;  // vectors per thread in flight at once

template <typename T, ReduceOp Op>
__global__ void __launch_bounds__(kPeerThreads) peer_all_reduce_kernel(PeerAllReduceArgs a) {
  using A = acc_t<T>;
  constexpr int V = 16 / sizeof(T);  // elements per 16-byte access
  __shared__ uint32_t call_shared;
  __shared__ int stop;
  const int b = blockIdx.x;
  if (threadIdx.x == 0) {
    call_shared = a.calls[b] + 1;
    stop = 0;
  }
  __syncthreads();
  const uint32_t call = call_shared;
  const int64_t slot = static_cast<int64_t>(call & 1u) * a.slot_bytes;

  // Block b's part: whole 16-byte vectors [first, last) of the tensor, the last one maybe partial.
  const int64_t vectors = (a.n + V - 1) / V;
  const int64_t per_block = (vectors + kPeerBlocks - 1) / kPeerBlocks;
  const int64_t first = b * per_block;
  const int64_t last = first + per_block < vectors ? first + per_block : vectors;
  T* data = static_cast<T*>(a.data);
  const bool data_aligned = (reinterpret_cast<uintptr_t>(data) & 15u) == 0;

  // 1. This rank's part into its staging (16-byte aligned; the last vector's tail is not read back).
  // Each thread takes kUnroll vectors at a time, their loads in flight together.
  T* own = reinterpret_cast<T*>(a.staging[a.rank] + slot);
  const int64_t stride = static_cast<int64_t>(blockDim.x) * kUnroll;
  for (int64_t v0 = first + threadIdx.x; v0 < last; v0 += stride) {
    Packed<T, V> x[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * static_cast<int64_t>(blockDim.x);
      if (v < last && data_aligned && (v + 1) * V <= a.n) x[u] = reinterpret_cast<const Packed<T, V>*>(data)[v];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * static_cast<int64_t>(blockDim.x);
      if (v >= last) continue;
      if (data_aligned && (v + 1) * V <= a.n) {
        reinterpret_cast<Packed<T, V>*>(own)[v] = x[u];
      } else {
        for (int j = 0; j < V && v * V + j < a.n; ++j) own[v * V + j] = data[v * V + j];
      }
    }
  }

  // 2. Every rank's part b is in its staging.
  if (!arrive_and_wait(a, b, call, &stop)) return;

  // 3. Every rank's part b summed in rank order (the same bits everywhere), back into the tensor:
  // rank by rank, kUnroll vectors of each in flight together.
  for (int64_t v0 = first + threadIdx.x; v0 < last; v0 += stride) {
    A acc[kUnroll][V];
    for (int r = 0; r < a.size; ++r) {
      const uint4* theirs = reinterpret_cast<const uint4*>(a.staging[r] + slot);
      uint4 bits[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + u * static_cast<int64_t>(blockDim.x);
        if (v < last) bits[u] = __ldcg(theirs + v);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const Packed<T, V> x = *reinterpret_cast<const Packed<T, V>*>(&bits[u]);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[u][j] = r == 0 ? to_acc(x.v[j]) : combine<Op>(acc[u][j], to_acc(x.v[j]));
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * static_cast<int64_t>(blockDim.x);
      if (v >= last) continue;
      Packed<T, V> out;
#pragma unroll
      for (int j = 0; j < V; ++j) {
        if constexpr (Op == ReduceOp::avg) acc[u][j] = acc[u][j] / static_cast<A>(a.size);
        out.v[j] = cast_to<T>(acc[u][j]);
      }
      if (data_aligned && (v + 1) * V <= a.n) {
        reinterpret_cast<Packed<T, V>*>(data)[v] = out;
      } else {
        for (int j = 0; j < V && v * V + j < a.n; ++j) data[v * V + j] = out.v[j];
      }
    }
  }
  if (threadIdx.x == 0) a.calls[b] = call;
}

template <typename T>
void launch_typed(const PeerAllReduceArgs& args, ReduceOp op, cudaStream_t stream) {
  const dim3 grid(kPeerBlocks), block(kPeerThreads);
  switch (op) {
    case ReduceOp::sum: peer_all_reduce_kernel<T, ReduceOp::sum><<<grid, block, 0, stream>>>(args); break;
    case ReduceOp::avg: peer_all_reduce_kernel<T, ReduceOp::avg><<<grid, block, 0, stream>>>(args); break;
    case ReduceOp::max: peer_all_reduce_kernel<T, ReduceOp::max><<<grid, block, 0, stream>>>(args); break;
    case ReduceOp::min: peer_all_reduce_kernel<T, ReduceOp::min><<<grid, block, 0, stream>>>(args); break;
  }
}

}  // namespace

void launch_peer_all_reduce(const PeerAllReduceArgs& args, DType dtype, ReduceOp op, cudaStream_t stream) {
  switch (dtype) {
    case DType::f32: launch_typed<float>(args, op, stream); break;
    case DType::f64: launch_typed<double>(args, op, stream); break;
    case DType::f16: launch_typed<__half>(args, op, stream); break;
    case DType::bf16: launch_typed<__nv_bfloat16>(args, op, stream); break;
    case DType::i32: launch_typed<int32_t>(args, op, stream); break;
    case DType::i64: launch_typed<int64_t>(args, op, stream); break;
    default: TANDEM_THROW(BackendError, "peer all-reduce: no kernel for ", dtype_name(dtype));
  }
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tandem::dist::internal
