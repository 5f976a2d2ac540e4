#pragma once
// Shared pieces of the CUDA kernels: device element types, launch checking with NVTX ranges,
// and the strided indexer for elementwise loops.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <vector>

#include "tandem/core/cuda/runtime.h"
#include "tandem/core/dispatch.h"
#include "tandem/core/tensor.h"

namespace tandem::cuda {

// ---- element types: host Half/BFloat16 are bit-compatible with __half/__nv_bfloat16 ----
template <typename T> struct DeviceTypeOf { using type = T; };
template <> struct DeviceTypeOf<Half> { using type = __half; };
template <> struct DeviceTypeOf<BFloat16> { using type = __nv_bfloat16; };
template <typename T> using device_t = typename DeviceTypeOf<T>::type;

// The type arithmetic happens in: float for the 16-bit floats, the type itself otherwise.
template <typename T> struct AccOf { using type = T; };
template <> struct AccOf<__half> { using type = float; };
template <> struct AccOf<__nv_bfloat16> { using type = float; };
template <typename T> using acc_t = typename AccOf<T>::type;

template <typename T>
__host__ __device__ __forceinline__ acc_t<T> to_acc(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return v;
}

// Converts any element type to any other (bool: non-zero is true), through float or double.
template <typename To, typename From>
__host__ __device__ __forceinline__ To cast_to(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __half> || std::is_same_v<From, __nv_bfloat16>) {
    return cast_to<To>(to_acc(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From(0);
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    return static_cast<To>(static_cast<int64_t>(v));  // wraps into unsigned types, as on the CPU
  } else {
    return static_cast<To>(v);
  }
}

// ---- vectors ----
// V elements of T loaded or stored as one access (16 bytes at most, aligned to its size).
template <typename T, int V>
struct alignas(sizeof(T) * V) Packed {
  T v[V];
};

template <typename T, int V>
__device__ __forceinline__ Packed<T, V> load_packed(const T* p, int64_t vector_index) {
  return reinterpret_cast<const Packed<T, V>*>(p)[vector_index];
}

template <typename T, int V>
__device__ __forceinline__ void store_packed(T* p, int64_t vector_index, const Packed<T, V>& v) {
  reinterpret_cast<Packed<T, V>*>(p)[vector_index] = v;
}

// A vector's elements in acc_t<T>. 16-bit types go a 32-bit word (two elements) at a time: a
// bf16's float is its bits moved to the high half, one instruction each, where converting
// element by element also spends one to take the high element out of its word.
template <typename T, int V>
__device__ __forceinline__ void unpack(const Packed<T, V>& p, acc_t<T> (&out)[V]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && V % 2 == 0) {
    const auto* words = reinterpret_cast<const uint32_t*>(p.v);
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  } else if constexpr (std::is_same_v<T, __half> && V % 2 == 0) {
    const auto* pairs = reinterpret_cast<const __half2*>(p.v);
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      const float2 f = __half22float2(pairs[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) out[k] = to_acc(p.v[k]);
  }
}

// V values rounded to T (to nearest, ties to even, as cast_to rounds), 16-bit types two at a time
// (one conversion instruction a pair, with no repacking after it).
template <typename T, int V>
__device__ __forceinline__ Packed<T, V> pack_rounded(const acc_t<T> (&in)[V]) {
  Packed<T, V> p;
  if constexpr (std::is_same_v<T, __nv_bfloat16> && V % 2 == 0) {
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(p.v);
#pragma unroll
    for (int i = 0; i < V / 2; ++i) pairs[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  } else if constexpr (std::is_same_v<T, __half> && V % 2 == 0) {
    auto* pairs = reinterpret_cast<__half2*>(p.v);
#pragma unroll
    for (int i = 0; i < V / 2; ++i) pairs[i] = __floats2half2_rn(in[2 * i], in[2 * i + 1]);
  } else {
#pragma unroll
    for (int k = 0; k < V; ++k) p.v[k] = cast_to<T>(in[k]);
  }
  return p;
}

// ---- launching ----
inline int blocks_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 8) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > max_blocks ? max_blocks : b));
}

// The number of SMs of `device` (at least 1), for grids sized to fill the GPU.
inline int multiprocessors(int device) {
  int count = 0;
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count > 0 ? count : 1;
}

// ---- strided elementwise indexing ----
constexpr int kMaxDims = 10;

// Offsets (in elements) of N operands that share one shape, from a linear row-major index.
template <int N>
struct Indexer {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[N][kMaxDims];

  __device__ __forceinline__ void offsets(int64_t linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      int64_t i = linear % sizes[d];
      linear /= sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
  }
};

template <int N>
Indexer<N> make_indexer(const Shape& shape, const std::array<const Tensor*, N>& operands) {
  std::vector<Strides> strides;
  for (const Tensor* t : operands) strides.push_back(t->strides());
  CollapsedDims c = collapse_dims(shape, strides);
  TANDEM_CHECK_AS(NotImplementedError, static_cast<int>(c.sizes.size()) <= kMaxDims, "cuda: a strided layout with ",
                  c.sizes.size(), " dims that cannot be merged (at most ", kMaxDims, " supported); call contiguous() first");
  Indexer<N> idx;
  idx.ndim = static_cast<int>(c.sizes.size());
  for (int d = 0; d < idx.ndim; ++d) {
    idx.sizes[d] = c.sizes[d];
    for (int k = 0; k < N; ++k) idx.strides[k][d] = c.strides[k][d];
  }
  return idx;
}

template <typename T>
T* device_ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// The stream of a tensor's device, with that device made current.
inline cudaStream_t stream_of(const Tensor& t) { return current_stream(t.device().index); }

}  // namespace tandem::cuda
