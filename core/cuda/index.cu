// CUDA index kernels on contiguous (outer, n, inner) layouts: index_select / index_add along the
// middle dim, gather / scatter_add. Negative indices count from the end. A device kernel cannot
// raise, so an out-of-range index gives NaN in a floating output (0 in an integer one) and is
// skipped by the accumulating kernels; the CPU backend raises IndexError for the same input.
#include "tandem/core/backend.h"
#include "tandem/core/cuda/loops.cuh"

namespace tandem::cuda {

namespace {
template <typename T>
__device__ T invalid_value() {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16> || std::is_floating_point_v<T>) {
    return cast_to<T>(NAN);
  } else {
    return T(0);
  }
}

__device__ __forceinline__ bool wrap_index(int64_t& i, int64_t n) {
  if (i < 0) i += n;
  return i >= 0 && i < n;
}

template <typename T>
__global__ void index_select_kernel(const T* x, const int64_t* index, T* out, int64_t outer, int64_t n, int64_t k,
                                    int64_t inner) {
  int64_t total = outer * k * inner;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += stride) {
    int64_t i = p % inner, j = (p / inner) % k, o = p / (inner * k);
    int64_t r = index[j];
    out[p] = wrap_index(r, n) ? x[(o * n + r) * inner + i] : invalid_value<T>();
  }
}

// Atomic accumulation: several index entries may name the same row.
template <typename T>
__device__ void atomic_add(T* address, T value) {
  if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(address), static_cast<unsigned long long>(value));
  } else {
    atomicAdd(address, value);
  }
}

template <typename T>
__global__ void index_add_kernel(T* out, const int64_t* index, const T* src, int64_t outer, int64_t n, int64_t k,
                                 int64_t inner) {
  int64_t total = outer * k * inner;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += stride) {
    int64_t i = p % inner, j = (p / inner) % k, o = p / (inner * k);
    int64_t r = index[j];
    if (wrap_index(r, n)) atomic_add(&out[(o * n + r) * inner + i], src[p]);
  }
}

template <typename T>
__global__ void gather_kernel(const T* x, const int64_t* index, T* out, int64_t outer, int64_t n, int64_t k,
                              int64_t inner) {
  int64_t total = outer * k * inner;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += stride) {
    int64_t i = p % inner, o = p / (inner * k);
    int64_t r = index[p];
    out[p] = wrap_index(r, n) ? x[(o * n + r) * inner + i] : invalid_value<T>();
  }
}

template <typename T>
__global__ void scatter_add_kernel(T* out, const int64_t* index, const T* src, int64_t outer, int64_t n, int64_t k,
                                   int64_t inner) {
  int64_t total = outer * k * inner;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += stride) {
    int64_t i = p % inner, o = p / (inner * k);
    int64_t r = index[p];
    if (wrap_index(r, n)) atomic_add(&out[(o * n + r) * inner + i], src[p]);
  }
}

// Types with a native atomicAdd.
template <typename F>
void dispatch_atomic(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::f16: f(__half{}); return;
    case DType::bf16: f(__nv_bfloat16{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    default:
      TANDEM_THROW(TypeError, op, ": dtype ", dtype_name(dtype),
                   " is not supported on cuda (supported: f32, f64, f16, bf16, i32, i64)");
  }
}

template <typename Launch>
void launch(const char* name, const Tensor& like, int64_t total, Launch&& body) {
  if (total == 0) return;
  NvtxRange range(name);
  DeviceGuard guard(like.device().index);
  body(elementwise_blocks(total), stream_of(like));
  check_launch(name);
}
}  // namespace

void index_select(const Tensor& x, const Tensor& index, const Tensor& out) {
  const int64_t outer = x.shape()[0], n = x.shape()[1], inner = x.shape()[2], k = index.numel();
  dispatch_all(x.dtype(), "index_select", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    launch("index_select", x, outer * k * inner, [&](int blocks, cudaStream_t s) {
      index_select_kernel<T><<<blocks, kElementwiseThreads, 0, s>>>(device_ptr<const T>(x), device_ptr<const int64_t>(index),
                                                                   device_ptr<T>(out), outer, n, k, inner);
    });
  });
}

void index_add(const Tensor& out, const Tensor& index, const Tensor& src) {
  const int64_t outer = out.shape()[0], n = out.shape()[1], inner = out.shape()[2], k = index.numel();
  dispatch_atomic(out.dtype(), "index_add", [&](auto tag) {
    using T = decltype(tag);
    launch("index_add", out, outer * k * inner, [&](int blocks, cudaStream_t s) {
      index_add_kernel<T><<<blocks, kElementwiseThreads, 0, s>>>(device_ptr<T>(out), device_ptr<const int64_t>(index),
                                                                device_ptr<const T>(src), outer, n, k, inner);
    });
  });
}

void gather(const Tensor& x, const Tensor& index, const Tensor& out) {
  const int64_t outer = x.shape()[0], n = x.shape()[1], inner = x.shape()[2], k = index.shape()[1];
  dispatch_all(x.dtype(), "gather", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    launch("gather", x, outer * k * inner, [&](int blocks, cudaStream_t s) {
      gather_kernel<T><<<blocks, kElementwiseThreads, 0, s>>>(device_ptr<const T>(x), device_ptr<const int64_t>(index),
                                                             device_ptr<T>(out), outer, n, k, inner);
    });
  });
}

void scatter_add(const Tensor& out, const Tensor& index, const Tensor& src) {
  const int64_t outer = out.shape()[0], n = out.shape()[1], inner = out.shape()[2], k = index.shape()[1];
  dispatch_atomic(out.dtype(), "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    launch("scatter_add", out, outer * k * inner, [&](int blocks, cudaStream_t s) {
      scatter_add_kernel<T><<<blocks, kElementwiseThreads, 0, s>>>(device_ptr<T>(out), device_ptr<const int64_t>(index),
                                                                  device_ptr<const T>(src), outer, n, k, inner);
    });
  });
}

}  // namespace tandem::cuda
