// CUDA index kernels on contiguous (outer, n, inner) layouts: index_select / index_add along the
// middle dim, gather / scatter_add. Negative indices count from the end. A device kernel cannot
// raise, so an out-of-range index gives NaN in a floating output (0 in an integer one) and is
// skipped by the accumulating kernels; the CPU backend raises IndexError for the same input.
//
// index_select and index_add move whole rows of `inner` elements. Where a row is a whole number of
// 16-byte vectors, at least kMinRowVectors of them, at 16-byte aligned addresses (an embedding's
// rows), they take row kernels: one warp per (outer, j) row, which reads the row's index once and
// whose lanes move the row's vectors. Otherwise one thread per element, which finds its row and
// column by dividing its flat position.
//
// index_add and scatter_add accumulate with atomics, whose order varies run to run. Under
// deterministic mode the floating types take ordered twins instead, which add in the CPU
// backend's order (ascending source position, rounding to the element type after every add) and
// so give the CPU backend's bits:
//  - index_add: the index is sorted stably (cub's radix sort) with its positions, and one thread
//    per (outer, row, inner) element that starts a run of equal rows adds the whole run;
//  - scatter_add: one thread per (outer, inner) column walks that column's k entries in order
//    (a column's entries only ever land in the same column of `out`).
// Integer atomics are exact in any order, so integer dtypes keep the atomic kernels.
#include <cub/device/device_radix_sort.cuh>

#include <climits>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/loops.cuh"
#include "tandem/core/determinism.h"

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
  dependent_kernel_begin();
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
  dependent_kernel_begin();
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
  dependent_kernel_begin();
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
  dependent_kernel_begin();
  int64_t total = outer * k * inner;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += stride) {
    int64_t i = p % inner, o = p / (inner * k);
    int64_t r = index[p];
    if (wrap_index(r, n)) atomic_add(&out[(o * n + r) * inner + i], src[p]);
  }
}

// out += src rounded to T, as the CPU backend adds.
template <typename T>
__device__ __forceinline__ T add_rounded(T a, T b) {
  return cast_to<T>(to_acc(a) + to_acc(b));
}

// Ordered index_add, step 1: row keys for the sort (an out-of-range index becomes n, sorted last
// and skipped) and the positions 0..k-1 that travel with them.
__global__ void index_keys_kernel(const int64_t* index, int64_t* keys, int64_t* positions, int64_t n, int64_t k) {
  dependent_kernel_begin();
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < k; j += stride) {
    int64_t r = index[j];
    keys[j] = wrap_index(r, n) ? r : n;
    positions[j] = j;
  }
}

// Ordered index_add, step 2: over (outer, sorted position q, inner); the thread at the start of a
// run of equal keys adds the run's sources in ascending source position (the sort is stable).
template <typename T>
__global__ void index_add_runs_kernel(T* out, const int64_t* sorted_keys, const int64_t* sorted_positions,
                                      const T* src, int64_t outer, int64_t n, int64_t k, int64_t inner) {
  dependent_kernel_begin();
  int64_t total = outer * k * inner;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < total; p += stride) {
    int64_t i = p % inner, q = (p / inner) % k, o = p / (inner * k);
    int64_t r = sorted_keys[q];
    if (r >= n || (q > 0 && sorted_keys[q - 1] == r)) continue;
    T* d = &out[(o * n + r) * inner + i];
    T acc = *d;
    for (int64_t t = q; t < k && sorted_keys[t] == r; ++t) {
      acc = add_rounded(acc, src[(o * k + sorted_positions[t]) * inner + i]);
    }
    *d = acc;
  }
}

// ---- row kernels: a warp per (outer, j) row of `vectors` 16-byte vectors ----
constexpr int kRowWarps = 8;           // rows per block
constexpr int64_t kMinRowVectors = 8;  // shorter rows leave most of a warp idle: one thread per element

// out (outer, k, inner) = x (outer, n, inner) at rows index (k,).
template <typename T, int V>
__global__ void __launch_bounds__(32 * kRowWarps)
    index_select_rows_kernel(const T* __restrict__ x, const int64_t* __restrict__ index, T* __restrict__ out,
                             int64_t outer, int64_t n, int64_t k, int64_t vectors) {
  dependent_kernel_begin();
  const int64_t rows = outer * k, stride = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.y; row < rows; row += stride) {
    const int64_t o = row / k;
    int64_t r = index[row - o * k];
    T* to = out + row * vectors * V;  // (inner,)
    if (wrap_index(r, n)) {
      const T* from = x + (o * n + r) * vectors * V;  // (inner,)
      for (int64_t v = threadIdx.x; v < vectors; v += 32) store_packed<T, V>(to, v, load_packed<T, V>(from, v));
    } else {
      Packed<T, V> invalid;
#pragma unroll
      for (int e = 0; e < V; ++e) invalid.v[e] = invalid_value<T>();
      for (int64_t v = threadIdx.x; v < vectors; v += 32) store_packed<T, V>(to, v, invalid);
    }
  }
}

// V elements added atomically at p: in pairs for the 16-bit floats (each half of a pair is its own
// atomic add, as two single adds would be).
template <typename T, int V>
__device__ __forceinline__ void atomic_add_vector(T* p, const Packed<T, V>& add) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && V % 2 == 0) {
#pragma unroll
    for (int e = 0; e < V; e += 2) {
      atomicAdd(reinterpret_cast<__nv_bfloat162*>(p + e), __nv_bfloat162(add.v[e], add.v[e + 1]));
    }
  } else if constexpr (std::is_same_v<T, __half> && V % 2 == 0) {
#pragma unroll
    for (int e = 0; e < V; e += 2) atomicAdd(reinterpret_cast<__half2*>(p + e), __half2(add.v[e], add.v[e + 1]));
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) atomic_add(p + e, add.v[e]);
  }
}

// out (outer, n, inner) at rows index (k,) += src (outer, k, inner), atomically.
template <typename T, int V>
__global__ void __launch_bounds__(32 * kRowWarps)
    index_add_rows_kernel(T* out, const int64_t* __restrict__ index, const T* __restrict__ src, int64_t outer,
                          int64_t n, int64_t k, int64_t vectors) {
  dependent_kernel_begin();
  const int64_t rows = outer * k, stride = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.y; row < rows; row += stride) {
    const int64_t o = row / k;
    int64_t r = index[row - o * k];
    if (!wrap_index(r, n)) continue;
    T* to = out + (o * n + r) * vectors * V;  // (inner,)
    const T* from = src + row * vectors * V;  // (inner,)
    for (int64_t v = threadIdx.x; v < vectors; v += 32) atomic_add_vector<T, V>(to + v * V, load_packed<T, V>(from, v));
  }
}

// Ordered index_add, step 2 by rows: the warp of the row at the start of a run of equal keys adds
// the run's source rows in ascending source position, rounding after every add, as
// index_add_runs_kernel does element by element (the same bits).
template <typename T, int V>
__global__ void __launch_bounds__(32 * kRowWarps)
    index_add_runs_rows_kernel(T* out, const int64_t* __restrict__ sorted_keys,
                               const int64_t* __restrict__ sorted_positions, const T* __restrict__ src, int64_t outer,
                               int64_t n, int64_t k, int64_t vectors) {
  dependent_kernel_begin();
  const int64_t rows = outer * k, stride = static_cast<int64_t>(gridDim.x) * kRowWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.y; row < rows; row += stride) {
    const int64_t o = row / k, q = row - o * k;
    const int64_t r = sorted_keys[q];
    if (r >= n || (q > 0 && sorted_keys[q - 1] == r)) continue;
    T* to = out + (o * n + r) * vectors * V;  // (inner,)
    for (int64_t v = threadIdx.x; v < vectors; v += 32) {
      Packed<T, V> acc = load_packed<T, V>(to, v);
      for (int64_t t = q; t < k && sorted_keys[t] == r; ++t) {
        const Packed<T, V> add = load_packed<T, V>(src + (o * k + sorted_positions[t]) * vectors * V, v);
#pragma unroll
        for (int e = 0; e < V; ++e) acc.v[e] = add_rounded(acc.v[e], add.v[e]);
      }
      store_packed<T, V>(to, v, acc);
    }
  }
}

// Whether rows of `inner` T at these addresses take the row kernels (see the top of this file).
template <typename T>
bool takes_rows(int64_t inner, std::initializer_list<const void*> pointers) {
  constexpr int V = vector_width<T>();  // elements per 16-byte vector
  if (inner % V != 0 || inner / V < kMinRowVectors) return false;
  for (const void* p : pointers) {
    if (!aligned16(p)) return false;
  }
  return true;
}

// A row kernel's launch over `rows` rows, on `stream`.
template <typename... Params, typename... Args>
void launch_rows(void (*kernel)(Params...), int64_t rows, cudaStream_t stream, Args&&... args) {
  launch_dependent(kernel, blocks_for(rows, kRowWarps), dim3(32, kRowWarps), 0, stream, std::forward<Args>(args)...);
}

// Ordered scatter_add: one thread per (outer, inner) column, its k entries in order.
template <typename T>
__global__ void scatter_add_columns_kernel(T* out, const int64_t* index, const T* src, int64_t outer, int64_t n,
                                           int64_t k, int64_t inner) {
  dependent_kernel_begin();
  int64_t total = outer * inner;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < total; c += stride) {
    int64_t i = c % inner, o = c / inner;
    for (int64_t j = 0; j < k; ++j) {
      int64_t pos = (o * k + j) * inner + i;
      int64_t r = index[pos];
      if (!wrap_index(r, n)) continue;
      T* d = &out[(o * n + r) * inner + i];
      *d = add_rounded(*d, src[pos]);
    }
  }
}

// Whether an accumulation of `dtype` takes the ordered twin: floating types in deterministic mode.
bool ordered(DType dtype) {
  return are_deterministic_algorithms_enabled() && dtype != DType::i32 && dtype != DType::i64;
}

// Significant bits of the largest key, n: the radix sort looks at no more.
int key_bits(int64_t n) {
  int bits = 1;
  while (bits < 63 && (int64_t{1} << bits) <= n) ++bits;
  return bits;
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
      constexpr int V = vector_width<T>();  // elements per 16-byte vector
      if (takes_rows<T>(inner, {x.data_ptr(), out.data_ptr()})) {
        launch_rows(index_select_rows_kernel<T, V>, outer * k, s, device_ptr<const T>(x),
                    device_ptr<const int64_t>(index), device_ptr<T>(out), outer, n, k, inner / V);
      } else {
        launch_dependent(index_select_kernel<T>, blocks, kElementwiseThreads, 0, s, device_ptr<const T>(x),
                         device_ptr<const int64_t>(index), device_ptr<T>(out), outer, n, k, inner);
      }
    });
  });
}

namespace {
void index_add_ordered(const Tensor& out, const Tensor& index, const Tensor& src) {
  const int64_t outer = out.shape()[0], n = out.shape()[1], inner = out.shape()[2], k = index.numel();
  if (k == 0 || outer * inner == 0) return;
  if (k > INT_MAX) {
    alert_not_deterministic(detail::concat("index_add of ", k, " index entries (the ordered path sorts at most ",
                                           INT_MAX, ")"));
  }
  NvtxRange range("index_add_ordered");
  DeviceGuard guard(out.device().index);
  cudaStream_t s = stream_of(out);
  const TensorOptions i64(DType::i64, out.device());
  Tensor keys = empty({k}, i64), positions = empty({k}, i64);                // (k,) i64 each
  Tensor sorted_keys = empty({k}, i64), sorted_positions = empty({k}, i64);  // (k,) i64 each
  launch_dependent(index_keys_kernel, elementwise_blocks(k), kElementwiseThreads, 0, s,
                   device_ptr<const int64_t>(index), device_ptr<int64_t>(keys), device_ptr<int64_t>(positions), n, k);
  check_launch("index_add_ordered keys");
  const int bits = key_bits(n);
  size_t temp_bytes = 0;
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, device_ptr<const int64_t>(keys),
                                                    device_ptr<int64_t>(sorted_keys), device_ptr<const int64_t>(positions),
                                                    device_ptr<int64_t>(sorted_positions), static_cast<int>(k), 0,
                                                    bits, s));
  Tensor temp = empty({static_cast<int64_t>(temp_bytes) + 1}, TensorOptions(DType::u8, out.device()));  // (bytes,) u8
  TANDEM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data_ptr(), temp_bytes, device_ptr<const int64_t>(keys),
                                                    device_ptr<int64_t>(sorted_keys), device_ptr<const int64_t>(positions),
                                                    device_ptr<int64_t>(sorted_positions), static_cast<int>(k), 0,
                                                    bits, s));
  dispatch_atomic(out.dtype(), "index_add", [&](auto tag) {
    using T = decltype(tag);
    constexpr int V = vector_width<T>();  // elements per 16-byte vector
    if (takes_rows<T>(inner, {out.data_ptr(), src.data_ptr()})) {
      launch_rows(index_add_runs_rows_kernel<T, V>, outer * k, s, device_ptr<T>(out),
                  device_ptr<const int64_t>(sorted_keys), device_ptr<const int64_t>(sorted_positions),
                  device_ptr<const T>(src), outer, n, k, inner / V);
    } else {
      launch_dependent(index_add_runs_kernel<T>, elementwise_blocks(outer * k * inner), kElementwiseThreads, 0, s,
                       device_ptr<T>(out), device_ptr<const int64_t>(sorted_keys),
                       device_ptr<const int64_t>(sorted_positions), device_ptr<const T>(src), outer, n, k, inner);
    }
  });
  check_launch("index_add_ordered");
}

void scatter_add_ordered(const Tensor& out, const Tensor& index, const Tensor& src) {
  const int64_t outer = out.shape()[0], n = out.shape()[1], inner = out.shape()[2], k = index.shape()[1];
  dispatch_atomic(out.dtype(), "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    launch("scatter_add_ordered", out, outer * inner, [&](int blocks, cudaStream_t s) {
      launch_dependent(scatter_add_columns_kernel<T>, blocks, kElementwiseThreads, 0, s, device_ptr<T>(out),
                       device_ptr<const int64_t>(index), device_ptr<const T>(src), outer, n, k, inner);
    });
  });
}
}  // namespace

void index_add(const Tensor& out, const Tensor& index, const Tensor& src, bool in_order) {
  const bool integer = out.dtype() == DType::i32 || out.dtype() == DType::i64;  // exact in any order
  if (ordered(out.dtype()) || (in_order && !integer)) return index_add_ordered(out, index, src);
  const int64_t outer = out.shape()[0], n = out.shape()[1], inner = out.shape()[2], k = index.numel();
  dispatch_atomic(out.dtype(), "index_add", [&](auto tag) {
    using T = decltype(tag);
    launch("index_add", out, outer * k * inner, [&](int blocks, cudaStream_t s) {
      constexpr int V = vector_width<T>();  // elements per 16-byte vector
      if (takes_rows<T>(inner, {out.data_ptr(), src.data_ptr()})) {
        launch_rows(index_add_rows_kernel<T, V>, outer * k, s, device_ptr<T>(out), device_ptr<const int64_t>(index),
                    device_ptr<const T>(src), outer, n, k, inner / V);
      } else {
        launch_dependent(index_add_kernel<T>, blocks, kElementwiseThreads, 0, s, device_ptr<T>(out),
                         device_ptr<const int64_t>(index), device_ptr<const T>(src), outer, n, k, inner);
      }
    });
  });
}

void gather(const Tensor& x, const Tensor& index, const Tensor& out) {
  const int64_t outer = x.shape()[0], n = x.shape()[1], inner = x.shape()[2], k = index.shape()[1];
  dispatch_all(x.dtype(), "gather", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    launch("gather", x, outer * k * inner, [&](int blocks, cudaStream_t s) {
      launch_dependent(gather_kernel<T>, blocks, kElementwiseThreads, 0, s, device_ptr<const T>(x),
                       device_ptr<const int64_t>(index), device_ptr<T>(out), outer, n, k, inner);
    });
  });
}

void scatter_add(const Tensor& out, const Tensor& index, const Tensor& src) {
  if (ordered(out.dtype())) return scatter_add_ordered(out, index, src);
  const int64_t outer = out.shape()[0], n = out.shape()[1], inner = out.shape()[2], k = index.shape()[1];
  dispatch_atomic(out.dtype(), "scatter_add", [&](auto tag) {
    using T = decltype(tag);
    launch("scatter_add", out, outer * k * inner, [&](int blocks, cudaStream_t s) {
      launch_dependent(scatter_add_kernel<T>, blocks, kElementwiseThreads, 0, s, device_ptr<T>(out),
                       device_ptr<const int64_t>(index), device_ptr<const T>(src), outer, n, k, inner);
    });
  });
}

}  // namespace tandem::cuda
