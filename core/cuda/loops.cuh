#pragma once
// Elementwise launchers: out[i] = f(a[i], ...) over out's shape. Contiguous operands take a
// vectorised path (16-byte loads), and so do two operands of which one repeats along leading
// dims (a bias or a position table broadcast over rows); anything else (transposed, sliced,
// broadcast elsewhere) goes through the strided indexer.
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"

namespace tandem::cuda {

constexpr int kElementwiseThreads = 256;

template <typename... Ts>
constexpr int vector_width() {
  constexpr size_t widest = std::max({sizeof(Ts)...});
  return static_cast<int>(16 / widest) > 0 ? static_cast<int>(16 / widest) : 1;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether every operand has out's shape and strides and out is dense (row-major, channels-last or
// any other dense order): then element i of each is at offset i, and the flat kernels apply.
inline bool same_dense_layout(const Tensor& out, std::initializer_list<const Tensor*> inputs) {
  for (const Tensor* t : inputs) {
    if (t->shape() != out.shape()) return false;
    if (t->strides() != out.strides() && !(t->is_contiguous() && out.is_contiguous())) return false;
  }
  return out.is_contiguous() || layout_is_dense(out.shape(), out.strides());
}

// When out is row-major and t (expanded to out's shape) is a contiguous block repeated along
// out's leading dims (stride 0 there, or size 1): the block's size, so that element i of t is at
// offset i % period. 0 otherwise. A t without broadcast dims gives out.numel().
inline int64_t repeat_period(const Tensor& t, const Tensor& out) {
  if (!out.is_contiguous() || t.shape() != out.shape()) return 0;
  const Shape& shape = out.shape();
  const Strides& strides = t.strides();
  int64_t period = 1;
  size_t d = shape.size();
  for (; d > 0 && (shape[d - 1] == 1 || strides[d - 1] == period); --d) period *= shape[d - 1];
  for (size_t k = 0; k < d; ++k) {
    if (shape[k] != 1 && strides[k] != 0) return 0;
  }
  return period;
}

template <int V, typename TA, typename TO, typename F>
__global__ void map1_contiguous(int64_t n, const TA* __restrict__ a, TO* __restrict__ out, F f) {
  dependent_kernel_begin();
  int64_t n_vec = n / V;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
    Packed<TA, V> va = reinterpret_cast<const Packed<TA, V>*>(a)[i];
    Packed<TO, V> vo;
#pragma unroll
    for (int k = 0; k < V; ++k) vo.v[k] = f(va.v[k]);
    reinterpret_cast<Packed<TO, V>*>(out)[i] = vo;
  }
  for (int64_t i = n_vec * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = f(a[i]);
  }
}

template <int V, typename TA, typename TB, typename TO, typename F>
__global__ void map2_contiguous(int64_t n, const TA* __restrict__ a, const TB* __restrict__ b, TO* __restrict__ out,
                                F f) {
  dependent_kernel_begin();
  int64_t n_vec = n / V;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
    Packed<TA, V> va = reinterpret_cast<const Packed<TA, V>*>(a)[i];
    Packed<TB, V> vb = reinterpret_cast<const Packed<TB, V>*>(b)[i];
    Packed<TO, V> vo;
#pragma unroll
    for (int k = 0; k < V; ++k) vo.v[k] = f(va.v[k], vb.v[k]);
    reinterpret_cast<Packed<TO, V>*>(out)[i] = vo;
  }
  for (int64_t i = n_vec * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = f(a[i], b[i]);
  }
}

// a and b repeat every period_a and period_b elements (repeat_period; n for an operand that does
// not repeat), both periods whole vectors of V.
template <int V, typename TA, typename TB, typename TO, typename F>
__global__ void map2_repeating(int64_t n, const TA* __restrict__ a, int64_t period_a, const TB* __restrict__ b,
                               int64_t period_b, TO* __restrict__ out, F f) {
  dependent_kernel_begin();
  int64_t n_vec = n / V, vectors_a = period_a / V, vectors_b = period_b / V;
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_vec; i += stride) {
    Packed<TA, V> va = reinterpret_cast<const Packed<TA, V>*>(a)[i % vectors_a];
    Packed<TB, V> vb = reinterpret_cast<const Packed<TB, V>*>(b)[i % vectors_b];
    Packed<TO, V> vo;
#pragma unroll
    for (int k = 0; k < V; ++k) vo.v[k] = f(va.v[k], vb.v[k]);
    reinterpret_cast<Packed<TO, V>*>(out)[i] = vo;
  }
  for (int64_t i = n_vec * V + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = f(a[i % period_a], b[i % period_b]);
  }
}

// Whether map2_repeating takes a and b into out with 16-byte loads: both repeat (repeat_period) in
// whole vectors, all three pointers aligned. Otherwise (a scalar broadcast, a block of an odd size)
// the strided indexer is faster than a division per element (the MLP's loss gradient, one H200).
template <typename TA, typename TB, typename TO>
bool repeats_in_vectors(int64_t period_a, const TA* a, int64_t period_b, const TB* b, const TO* out) {
  constexpr int V = vector_width<TA, TB, TO>();
  return V > 1 && period_a > 0 && period_b > 0 && period_a % V == 0 && period_b % V == 0 && aligned16(a) &&
         aligned16(b) && aligned16(out);
}

template <typename TA, typename TO, typename F>
__global__ void map1_strided(int64_t n, const TA* a, TO* out, Indexer<2> idx, F f) {
  dependent_kernel_begin();
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[2];
    idx.offsets(i, off);
    out[off[1]] = f(a[off[0]]);
  }
}

template <typename TA, typename TB, typename TO, typename F>
__global__ void map2_strided(int64_t n, const TA* a, const TB* b, TO* out, Indexer<3> idx, F f) {
  dependent_kernel_begin();
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[3];
    idx.offsets(i, off);
    out[off[2]] = f(a[off[0]], b[off[1]]);
  }
}

template <typename TA, typename TB, typename TC, typename TO, typename F>
__global__ void map3_strided(int64_t n, const TA* a, const TB* b, const TC* c, TO* out, Indexer<4> idx, F f) {
  dependent_kernel_begin();
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    int64_t off[4];
    idx.offsets(i, off);
    out[off[3]] = f(a[off[0]], b[off[1]], c[off[2]]);
  }
}

// Blocks for a grid-stride loop: enough to fill the GPU several times over, no more.
inline int elementwise_blocks(int64_t work) { return blocks_for(work, kElementwiseThreads, 132 * 32); }

template <typename TA, typename TO, typename F>
void map1(const char* name, const Tensor& a, const Tensor& out, F f) {
  int64_t n = out.numel();
  if (n == 0) return;
  NvtxRange range(name);
  DeviceGuard guard(out.device().index);
  cudaStream_t stream = stream_of(out);
  const TA* pa = device_ptr<const TA>(a);
  TO* po = device_ptr<TO>(out);
  if (same_dense_layout(out, {&a})) {
    constexpr int V = vector_width<TA, TO>();
    bool vec = aligned16(pa) && aligned16(po);
    if (vec)
      launch_dependent(map1_contiguous<V, TA, TO, F>, elementwise_blocks(n / V + 1), kElementwiseThreads, 0, stream, n,
                       pa, po, f);
    else
      launch_dependent(map1_contiguous<1, TA, TO, F>, elementwise_blocks(n), kElementwiseThreads, 0, stream, n, pa, po,
                       f);
  } else {
    Indexer<2> idx = make_indexer<2>(out.shape(), {&a, &out});
    launch_dependent(map1_strided<TA, TO, F>, elementwise_blocks(n), kElementwiseThreads, 0, stream, n, pa, po, idx, f);
  }
  check_launch(name);
}

template <typename TA, typename TB, typename TO, typename F>
void map2(const char* name, const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  int64_t n = out.numel();
  if (n == 0) return;
  NvtxRange range(name);
  DeviceGuard guard(out.device().index);
  cudaStream_t stream = stream_of(out);
  const TA* pa = device_ptr<const TA>(a);
  const TB* pb = device_ptr<const TB>(b);
  TO* po = device_ptr<TO>(out);
  if (same_dense_layout(out, {&a, &b})) {
    constexpr int V = vector_width<TA, TB, TO>();
    bool vec = aligned16(pa) && aligned16(pb) && aligned16(po);
    if (vec)
      launch_dependent(map2_contiguous<V, TA, TB, TO, F>, elementwise_blocks(n / V + 1), kElementwiseThreads, 0, stream,
                       n, pa, pb, po, f);
    else
      launch_dependent(map2_contiguous<1, TA, TB, TO, F>, elementwise_blocks(n), kElementwiseThreads, 0, stream, n, pa,
                       pb, po, f);
  } else if (const int64_t period_a = repeat_period(a, out), period_b = repeat_period(b, out);
             repeats_in_vectors(period_a, pa, period_b, pb, po)) {
    constexpr int V = vector_width<TA, TB, TO>();
    launch_dependent(map2_repeating<V, TA, TB, TO, F>, elementwise_blocks(n / V + 1), kElementwiseThreads, 0, stream, n,
                     pa, period_a, pb, period_b, po, f);
  } else {
    Indexer<3> idx = make_indexer<3>(out.shape(), {&a, &b, &out});
    launch_dependent(map2_strided<TA, TB, TO, F>, elementwise_blocks(n), kElementwiseThreads, 0, stream, n, pa, pb, po,
                     idx, f);
  }
  check_launch(name);
}

template <typename TA, typename TB, typename TC, typename TO, typename F>
void map3(const char* name, const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& out, F f) {
  int64_t n = out.numel();
  if (n == 0) return;
  NvtxRange range(name);
  DeviceGuard guard(out.device().index);
  Indexer<4> idx = make_indexer<4>(out.shape(), {&a, &b, &c, &out});
  launch_dependent(map3_strided<TA, TB, TC, TO, F>, elementwise_blocks(n), kElementwiseThreads, 0, stream_of(out), n,
                   device_ptr<const TA>(a), device_ptr<const TB>(b), device_ptr<const TC>(c), device_ptr<TO>(out), idx,
                   f);
  check_launch(name);
}

}  // namespace tandem::cuda
