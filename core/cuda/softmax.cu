// CUDA softmax / log_softmax (forward and backward) and the fused cross-entropy, over the middle
// dim of contiguous (outer, n, inner) tensors. Rows (inner == 1) get a block each: one pass finds
// each thread's running max and sum of exponentials (online softmax), the block combines them, a
// second pass writes. Other dims get a thread per (outer, inner) column.
#include <limits>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"

namespace tandem::cuda {

namespace {
template <typename T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;  // f32 for f32/f16/bf16

template <typename A>
__device__ A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <typename A>
__device__ A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum / max over the block, returned to every thread. blockDim.x is a multiple of 32.
template <typename A>
__device__ A block_sum(A v) {
  __shared__ A shared[32];
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  A total = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : A(0);
  if (threadIdx.x < 32) total = warp_sum(total);
  if (threadIdx.x == 0) shared[0] = total;
  __syncthreads();
  A result = shared[0];
  __syncthreads();  // the shared slots may be reused by the caller's next reduction
  return result;
}
template <typename A>
__device__ A block_max(A v) {
  __shared__ A shared[32];
  v = warp_max(v);
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = v;
  __syncthreads();
  A total = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : -std::numeric_limits<A>::infinity();
  if (threadIdx.x < 32) total = warp_max(total);
  if (threadIdx.x == 0) shared[0] = total;
  __syncthreads();
  A result = shared[0];
  __syncthreads();
  return result;
}

// Running (max, sum of exp(x - max)) of one thread, folded one value at a time.
template <typename A>
struct Online {
  A max = -std::numeric_limits<A>::infinity();
  A sum = A(0);
  __device__ void add(A x) {
    if (x == -std::numeric_limits<A>::infinity()) return;  // contributes exp(-inf) = 0
    if (x > max) {
      sum = sum * exp(max - x) + A(1);  // exp(-inf) is 0 for the first value
      max = x;
    } else {
      sum += exp(x - max);
    }
  }
};

// The block's log-sum-exp from each thread's online state.
template <typename A>
__device__ A block_logsumexp(const Online<A>& mine) {
  A m = block_max(mine.max);
  A contribution = (mine.max == -std::numeric_limits<A>::infinity()) ? A(0) : mine.sum * exp(mine.max - m);
  A s = block_sum(contribution);
  return m + log(s);
}

int row_threads(int64_t n) {
  int threads = 32;
  while (threads < 1024 && threads * 8 < n) threads *= 2;
  return threads;
}

template <typename T, bool Log>
__global__ void softmax_rows(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  dependent_kernel_begin();
  using A = stat_t<acc_t<T>>;
  const T* in = x + blockIdx.x * n;
  T* out = y + blockIdx.x * n;
  Online<A> state;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) state.add(static_cast<A>(to_acc(in[i])));
  A lse = block_logsumexp(state);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A v = static_cast<A>(to_acc(in[i])) - lse;
    out[i] = cast_to<T>(Log ? v : exp(v));
  }
}

// Rows short enough to live in registers: every thread loads kItems vectors of V elements
// once (16-byte loads), so the row is read once and written once. n % V == 0, rows 16-byte
// aligned, n <= kRegisterThreads * V * kItems.
constexpr int kRegisterThreads = 256;

template <typename T, int V, int kItems, bool Log>
__global__ void __launch_bounds__(kRegisterThreads) softmax_rows_in_registers(const T* __restrict__ x, T* __restrict__ y,
                                                                               int64_t n) {
  dependent_kernel_begin();
  using A = stat_t<acc_t<T>>;
  const int64_t vectors = n / V;
  const Packed<T, V>* in = reinterpret_cast<const Packed<T, V>*>(x + blockIdx.x * n);
  Packed<T, V>* out = reinterpret_cast<Packed<T, V>*>(y + blockIdx.x * n);
  A v[kItems][V];
  A m = -std::numeric_limits<A>::infinity();
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    int64_t j = threadIdx.x + static_cast<int64_t>(i) * kRegisterThreads;
    if (j < vectors) {
      Packed<T, V> p = in[j];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        v[i][k] = static_cast<A>(to_acc(p.v[k]));
        m = max(m, v[i][k]);
      }
    }
  }
  m = block_max(m);
  A s = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    int64_t j = threadIdx.x + static_cast<int64_t>(i) * kRegisterThreads;
    if (j < vectors) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        A e = exp(v[i][k] - m);
        s += e;
        if (!Log) v[i][k] = e;
      }
    }
  }
  s = block_sum(s);
  const A scale = A(1) / s, shift = m + log(s);
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    int64_t j = threadIdx.x + static_cast<int64_t>(i) * kRegisterThreads;
    if (j < vectors) {
      Packed<T, V> p;
#pragma unroll
      for (int k = 0; k < V; ++k) p.v[k] = cast_to<T>(Log ? v[i][k] - shift : v[i][k] * scale);
      out[j] = p;
    }
  }
}

// Launches the register-resident kernel with the fewest items per thread that hold the row;
// returns false when the row does not qualify.
template <typename T, bool Log>
bool launch_rows_in_registers(const T* x, T* y, int64_t outer, int64_t n, cudaStream_t stream) {
  constexpr int V = 16 / sizeof(T);
  if (n % V != 0 || reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(y) % 16 != 0) return false;
  const int64_t per_item = static_cast<int64_t>(kRegisterThreads) * V;
  const unsigned blocks = static_cast<unsigned>(outer);
  if (n <= per_item)
    launch_dependent(softmax_rows_in_registers<T, V, 1, Log>, blocks, kRegisterThreads, 0, stream, x, y, n);
  else if (n <= 2 * per_item)
    launch_dependent(softmax_rows_in_registers<T, V, 2, Log>, blocks, kRegisterThreads, 0, stream, x, y, n);
  else if (n <= 4 * per_item)
    launch_dependent(softmax_rows_in_registers<T, V, 4, Log>, blocks, kRegisterThreads, 0, stream, x, y, n);
  else if (n <= 8 * per_item)
    launch_dependent(softmax_rows_in_registers<T, V, 8, Log>, blocks, kRegisterThreads, 0, stream, x, y, n);
  else return false;
  return true;
}

template <typename T, bool Log>
__global__ void softmax_columns(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner) {
  dependent_kernel_begin();
  using A = stat_t<acc_t<T>>;
  int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= outer * inner) return;
  int64_t base = (column / inner) * n * inner + column % inner;
  Online<A> state;
  for (int64_t r = 0; r < n; ++r) state.add(static_cast<A>(to_acc(x[base + r * inner])));
  A lse = state.max + log(state.sum);
  for (int64_t r = 0; r < n; ++r) {
    A v = static_cast<A>(to_acc(x[base + r * inner])) - lse;
    y[base + r * inner] = cast_to<T>(Log ? v : exp(v));
  }
}

// softmax: dx = y * (g - sum(g * y));  log_softmax: dx = g - exp(y) * sum(g)
template <typename T, bool Log>
__global__ void softmax_backward_rows(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ dx, int64_t n) {
  dependent_kernel_begin();
  using A = stat_t<acc_t<T>>;
  int64_t base = blockIdx.x * n;
  A dot = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A gv = static_cast<A>(to_acc(g[base + i]));
    dot += Log ? gv : gv * static_cast<A>(to_acc(y[base + i]));
  }
  dot = block_sum(dot);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    A gv = static_cast<A>(to_acc(g[base + i])), yv = static_cast<A>(to_acc(y[base + i]));
    dx[base + i] = cast_to<T>(Log ? gv - exp(yv) * dot : yv * (gv - dot));
  }
}

template <typename T, bool Log>
__global__ void softmax_backward_columns(const T* __restrict__ g, const T* __restrict__ y, T* __restrict__ dx,
                                         int64_t outer, int64_t n, int64_t inner) {
  dependent_kernel_begin();
  using A = stat_t<acc_t<T>>;
  int64_t column = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (column >= outer * inner) return;
  int64_t base = (column / inner) * n * inner + column % inner;
  A dot = 0;
  for (int64_t r = 0; r < n; ++r) {
    A gv = static_cast<A>(to_acc(g[base + r * inner]));
    dot += Log ? gv : gv * static_cast<A>(to_acc(y[base + r * inner]));
  }
  for (int64_t r = 0; r < n; ++r) {
    int64_t i = base + r * inner;
    A gv = static_cast<A>(to_acc(g[i])), yv = static_cast<A>(to_acc(y[i]));
    dx[i] = cast_to<T>(Log ? gv - exp(yv) * dot : yv * (gv - dot));
  }
}

template <typename T>
void softmax_typed(const Tensor& x, const Tensor& out, bool log) {
  const int64_t outer = x.shape()[0], n = x.shape()[1], inner = x.shape()[2];
  if (outer * inner == 0 || n == 0) return;
  NvtxRange range(log ? "log_softmax" : "softmax");
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = stream_of(x);
  const T* px = device_ptr<const T>(x);
  T* py = device_ptr<T>(out);
  if (inner == 1) {
    bool done = log ? launch_rows_in_registers<T, true>(px, py, outer, n, stream)
                    : launch_rows_in_registers<T, false>(px, py, outer, n, stream);
    int threads = row_threads(n);
    if (!done && log)
      launch_dependent(softmax_rows<T, true>, static_cast<unsigned>(outer), threads, 0, stream, px, py, n);
    if (!done && !log)
      launch_dependent(softmax_rows<T, false>, static_cast<unsigned>(outer), threads, 0, stream, px, py, n);
  } else {
    int blocks = blocks_for(outer * inner, 256, INT32_MAX);
    if (log)
      launch_dependent(softmax_columns<T, true>, blocks, 256, 0, stream, px, py, outer, n, inner);
    else
      launch_dependent(softmax_columns<T, false>, blocks, 256, 0, stream, px, py, outer, n, inner);
  }
  check_launch("softmax");
}

template <typename T>
void softmax_backward_typed(const Tensor& grad, const Tensor& y, const Tensor& out, bool log) {
  const int64_t outer = y.shape()[0], n = y.shape()[1], inner = y.shape()[2];
  if (outer * inner == 0 || n == 0) return;
  NvtxRange range("softmax_backward");
  DeviceGuard guard(y.device().index);
  cudaStream_t stream = stream_of(y);
  const T* pg = device_ptr<const T>(grad);
  const T* py = device_ptr<const T>(y);
  T* pd = device_ptr<T>(out);
  if (inner == 1) {
    int threads = row_threads(n);
    if (log)
      launch_dependent(softmax_backward_rows<T, true>, static_cast<unsigned>(outer), threads, 0, stream, pg, py, pd, n);
    else
      launch_dependent(softmax_backward_rows<T, false>, static_cast<unsigned>(outer), threads, 0, stream, pg, py, pd,
                       n);
  } else {
    int blocks = blocks_for(outer * inner, 256, INT32_MAX);
    if (log)
      launch_dependent(softmax_backward_columns<T, true>, blocks, 256, 0, stream, pg, py, pd, outer, n, inner);
    else
      launch_dependent(softmax_backward_columns<T, false>, blocks, 256, 0, stream, pg, py, pd, outer, n, inner);
  }
  check_launch("softmax_backward");
}

// Where a row of logits (C,) meets 16-byte vectors of V elements: up to V-1 elements before the
// first vector boundary (the head), whole vectors, then up to V-1 elements (the tail). Rows whose
// C is not a multiple of V (GPT-2's 50257 classes) start anywhere within a vector, so every row
// has its own split. V is 1 when a buffer's base is not 16-byte aligned: then the row is all
// "vectors" of one element.
template <typename T, int V>
struct RowSplit {
  int lead;         // elements of the first vector that precede the row (0 when it starts aligned)
  int64_t head;     // elements before the first whole vector
  int64_t vectors;  // whole vectors from element `head` on
  int64_t tail;     // first element after the vectors; the tail is [tail, C)
  __device__ RowSplit(const T* row, int64_t classes) {
    lead = static_cast<int>((reinterpret_cast<uintptr_t>(row) / sizeof(T)) % V);
    head = lead == 0 ? 0 : min(static_cast<int64_t>(V - lead), classes);
    vectors = (classes - head) / V;
    tail = head + vectors * V;
  }
};

// exp(x - shift) for the cross-entropy kernels: in f32 as 2^(x log2(e) - shift log2(e)), one FFMA
// and one SFU op (ex2.approx, relative error about 2^-22; the product's rounding adds about 1e-6
// for exponents near 10: below f32 training's noise, far below bf16's). exp itself in f64.
// Each element of a row takes two of these (its sum, then its gradient), so their cost decides
// the fused kernel's speed once the row is read once.
constexpr float kLog2e = 1.4426950408889634f;

template <typename A>
struct ExpFrom {
  A scaled_shift;  // shift * log2(e) in f32; shift in f64
  __device__ explicit ExpFrom(A shift) {
    if constexpr (std::is_same_v<A, float>) scaled_shift = shift * kLog2e;
    else scaled_shift = shift;
  }
  __device__ A operator()(A x) const {
    if constexpr (std::is_same_v<A, float>) {
      float y;
      asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(fmaf(x, kLog2e, -scaled_shift)));
      return y;
    } else {
      return exp(x - scaled_shift);
    }
  }
};

// Folds values into a thread's running max `m` and sum `s` of exp(x - m) (one rescale per call)
// and, when Summed (label smoothing), their plain sum `total`.
template <bool Summed, typename A>
__device__ __forceinline__ void fold_values(const A* v, int n, A& m, A& s, A& total) {
  A local = -std::numeric_limits<A>::infinity();
  for (int k = 0; k < n; ++k) {
    local = max(local, v[k]);
    if constexpr (Summed) total += v[k];
  }
  if (local == -std::numeric_limits<A>::infinity()) return;  // contributes exp(-inf) = 0
  if (local > m) {
    s *= ExpFrom<A>(local)(m);  // exp(-inf) is 0 for the first values
    m = local;
  }
  const ExpFrom<A> exp_from_m(m);
  for (int k = 0; k < n; ++k) s += exp_from_m(v[k]);
}

// One row's gradient, d[e] = unit * exp(x[e] - lse) - unit * y[e] (one rounding, an FMA) with
// y = eps / C everywhere plus 1 - eps at the target t; all zeros for an ignored row. x's scalars
// come from scalar_at(e) and its vectors from vector_at(j). Every element is first written as a
// non-target; then the thread that wrote the target's element writes it again (its own stores
// land in order). Shared by the fused kernel and the separate backward, so that both write the
// same bits for the same lse and unit.
template <typename T, int V, typename A, typename ScalarAt, typename VectorAt>
__device__ __forceinline__ void write_row_gradient(const RowSplit<T, V>& split, int64_t classes, T* d, int64_t t,
                                                   bool ignored, A unit, A lse, A eps, ScalarAt scalar_at,
                                                   VectorAt vector_at) {
  using P = Packed<T, V>;
  P* d_vectors = reinterpret_cast<P*>(d + split.head);  // (vectors,)
  const int64_t tail_count = classes - split.tail;
  if (ignored) {
    P zeros;
#pragma unroll
    for (int k = 0; k < V; ++k) zeros.v[k] = cast_to<T>(A(0));
    if (threadIdx.x < split.head) d[threadIdx.x] = zeros.v[0];
    if (threadIdx.x < tail_count) d[split.tail + threadIdx.x] = zeros.v[0];
    for (int64_t j = threadIdx.x; j < split.vectors; j += blockDim.x) d_vectors[j] = zeros;
    return;
  }
  const ExpFrom<A> p_of(lse);
  const A uniform = eps / static_cast<A>(classes);
  const A minus_unit_uniform = -(unit * uniform);
  // A non-target element's gradient before rounding to T.
  auto unrounded = [&](A v) { return fma(unit, p_of(v), minus_unit_uniform); };
  if (threadIdx.x < split.head) d[threadIdx.x] = cast_to<T>(unrounded(scalar_at(threadIdx.x)));
  if (threadIdx.x < tail_count) {
    d[split.tail + threadIdx.x] = cast_to<T>(unrounded(scalar_at(split.tail + threadIdx.x)));
  }
  for (int64_t j = threadIdx.x; j < split.vectors; j += blockDim.x) {
    A v[V];
    unpack(vector_at(j), v);  // A is acc_t<T> (f32 for the 16-bit types)
#pragma unroll
    for (int k = 0; k < V; ++k) v[k] = unrounded(v[k]);
    d_vectors[j] = pack_rounded<T, V>(v);  // the same rounding as cast_to
  }
  if (t < 0 || t >= classes) return;  // an invalid target: every element is a non-target
  const int64_t owner = t < split.head ? t : t >= split.tail ? t - split.tail : ((t - split.head) / V) % blockDim.x;
  if (threadIdx.x == owner) {
    const A at_target = uniform + (A(1) - eps);
    d[t] = cast_to<T>(fma(unit, p_of(scalar_at(t)), -(unit * at_target)));
  }
}

// What the cross-entropy kernel does after the loss: nothing, or also write the gradient for an
// upstream gradient of 1, reading the row again from shared memory (where the first pass kept it:
// the row is read from global memory once) or from global memory (rows too long to keep).
enum class GradPass { none, from_shared, from_global };

// Vectors each thread loads before using any, so that enough bytes are in flight.
constexpr int kCrossEntropyLoads = 4;

// One block per row of logits (N, C). The first pass reads the row (16-byte loads where the split
// allows) into each thread's online max and sum; the block combines them into the row's
// log-sum-exp and thread 0 writes the loss. An out-of-range target (other than ignore_index)
// gives a NaN loss for its row: a device kernel cannot raise, and NaN cannot go unnoticed.
// With a gradient pass, grad (N, C) gets (softmax(x) - y) / count, y the (smoothed) one-hot
// target, count the mean's divisor (null: 1); ignored rows get 0. logits and grad have the same
// 16-byte alignment, so one split serves both.
template <typename T, int V, GradPass Grad>
__global__ void __launch_bounds__(1024) cross_entropy_rows(const T* __restrict__ logits,
                                                           const int64_t* __restrict__ target,
                                                           const stat_t<acc_t<T>>* count, stat_t<acc_t<T>>* losses,
                                                           stat_t<acc_t<T>>* lse_out, T* __restrict__ grad,
                                                           int64_t classes, int64_t ignore_index, double smoothing) {
  dependent_kernel_begin();
  using A = stat_t<acc_t<T>>;
  using P = Packed<T, V>;
  extern __shared__ __align__(16) unsigned char shared_row[];
  T* kept = reinterpret_cast<T*>(shared_row);  // (lead + C,): element e at kept[lead + e]
  const T* x = logits + blockIdx.x * classes;  // (C,)
  const RowSplit<T, V> split(x, classes);
  const P* x_vectors = reinterpret_cast<const P*>(x + split.head);        // (vectors,)
  P* kept_vectors = reinterpret_cast<P*>(kept + split.lead + split.head);  // (vectors,), aligned

  A m = -std::numeric_limits<A>::infinity(), s = 0, total = 0;
  // The first pass, written once for rows with label smoothing (which also sum the logits) and
  // once for rows without.
  auto first_pass = [&](auto smoothed) {
    auto fold_scalar = [&](int64_t e) {
      if constexpr (Grad == GradPass::from_shared) kept[split.lead + e] = x[e];
      const A v = static_cast<A>(to_acc(x[e]));
      fold_values<decltype(smoothed)::value>(&v, 1, m, s, total);
    };
    if (threadIdx.x < split.head) fold_scalar(threadIdx.x);
    if (threadIdx.x < classes - split.tail) fold_scalar(split.tail + threadIdx.x);
    for (int64_t j0 = threadIdx.x; j0 < split.vectors; j0 += kCrossEntropyLoads * blockDim.x) {
      P p[kCrossEntropyLoads];
#pragma unroll
      for (int u = 0; u < kCrossEntropyLoads; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * blockDim.x;
        if (j < split.vectors) p[u] = x_vectors[j];
      }
#pragma unroll
      for (int u = 0; u < kCrossEntropyLoads; ++u) {
        const int64_t j = j0 + static_cast<int64_t>(u) * blockDim.x;
        if (j >= split.vectors) break;
        if constexpr (Grad == GradPass::from_shared) kept_vectors[j] = p[u];
        A v[V];
        unpack(p[u], v);
        fold_values<decltype(smoothed)::value>(v, V, m, s, total);
      }
    }
  };
  if (smoothing != 0.0) first_pass(std::true_type{});
  else first_pass(std::false_type{});
  const A row_max = block_max(m);
  const A lse = row_max + log(block_sum(m == -std::numeric_limits<A>::infinity() ? A(0) : s * ExpFrom<A>(row_max)(m)));
  total = block_sum(total);
  const int64_t t = target[blockIdx.x];
  const bool ignored = t == ignore_index;
  const A eps = static_cast<A>(smoothing);
  if (threadIdx.x == 0) {
    if (lse_out) lse_out[blockIdx.x] = lse;
    if (ignored) {
      losses[blockIdx.x] = A(0);
    } else if (t < 0 || t >= classes) {
      losses[blockIdx.x] = A(NAN);
    } else {
      losses[blockIdx.x] = lse - (A(1) - eps) * static_cast<A>(to_acc(x[t])) - eps / static_cast<A>(classes) * total;
    }
  }
  if constexpr (Grad != GradPass::none) {
    // Each thread reads back only what it kept itself: no barrier needed beyond the reductions'.
    const A unit = count ? A(1) / *count : A(1);
    auto scalar_at = [&](int64_t e) {
      return static_cast<A>(to_acc(Grad == GradPass::from_shared ? kept[split.lead + e] : x[e]));
    };
    auto vector_at = [&](int64_t j) { return Grad == GradPass::from_shared ? kept_vectors[j] : x_vectors[j]; };
    write_row_gradient(split, classes, grad + blockIdx.x * classes, t, ignored, unit, lse, eps, scalar_at, vector_at);
  }
}

// dx = row_grad * (softmax(x) - y), y the (smoothed) one-hot target; split as above.
template <typename T, int V>
__global__ void cross_entropy_backward_rows(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                            const stat_t<acc_t<T>>* lse, const stat_t<acc_t<T>>* row_grad,
                                            T* __restrict__ dx, int64_t classes, int64_t ignore_index,
                                            double smoothing) {
  dependent_kernel_begin();
  using A = stat_t<acc_t<T>>;
  using P = Packed<T, V>;
  const int64_t row = blockIdx.x;
  const T* x = logits + row * classes;  // (C,)
  const RowSplit<T, V> split(x, classes);
  const P* x_vectors = reinterpret_cast<const P*>(x + split.head);  // (vectors,)
  const int64_t t = target[row];
  const bool ignored = t == ignore_index;
  write_row_gradient(
      split, classes, dx + row * classes, t, ignored, ignored ? A(0) : row_grad[row], lse[row],
      static_cast<A>(smoothing), [&](int64_t e) { return static_cast<A>(to_acc(x[e])); },
      [&](int64_t j) { return x_vectors[j]; });
}

// Elements per load for rows at x (and out, when given; they must share x's alignment, as
// buffers of one shape from 16-byte aligned bases do): 16 bytes' worth when the bases allow.
template <typename T>
int cross_entropy_vector(const void* x, const void* out) {
  constexpr int V = 16 / sizeof(T);
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && (!out || reinterpret_cast<uintptr_t>(out) % 16 == 0);
  return V > 1 && aligned ? V : 1;
}

// Threads per cross-entropy row: one per 8 vectors, up to `most`. The forward kernels take at most
// 512 (two blocks per SM of the rows kept in shared memory), both of them, so that the forward-only
// kernel and the one writing the gradient add a row in the same order: the same loss and lse.
int cross_entropy_threads(int64_t classes, int v, int most) { return std::min(most, row_threads(classes / v)); }
constexpr int kCrossEntropyForwardThreads = 512;

// The largest dynamic shared memory a block may opt in to on `device`.
int max_shared_per_block(int device) {
  int bytes = 0;
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return bytes;
}
}  // namespace

void softmax(const Tensor& x, const Tensor& out, bool log) {
  dispatch_floating(x.dtype(), log ? "log_softmax" : "softmax", "cuda",
                    [&](auto tag) { softmax_typed<device_t<decltype(tag)>>(x, out, log); });
}

void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& out, bool log) {
  dispatch_floating(y.dtype(), "softmax_backward", "cuda",
                    [&](auto tag) { softmax_backward_typed<device_t<decltype(tag)>>(grad, y, out, log); });
}

void cross_entropy_forward(const Tensor& logits, const Tensor& target, const Tensor& losses, const Tensor& lse,
                           int64_t ignore_index, double smoothing) {
  dispatch_floating(logits.dtype(), "cross_entropy", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using A = stat_t<acc_t<T>>;
    const int64_t n = logits.shape()[0], c = logits.shape()[1];
    if (n == 0) return;
    NvtxRange range("cross_entropy");
    DeviceGuard guard(logits.device().index);
    constexpr int V = 16 / sizeof(T);
    const int v = cross_entropy_vector<T>(logits.data_ptr(), nullptr);
    auto kernel = v == V ? cross_entropy_rows<T, V, GradPass::none> : cross_entropy_rows<T, 1, GradPass::none>;
    const int threads = cross_entropy_threads(c, v, kCrossEntropyForwardThreads);
    launch_dependent(kernel, static_cast<unsigned>(n), threads, 0, stream_of(logits), device_ptr<const T>(logits),
                     device_ptr<const int64_t>(target), nullptr, device_ptr<A>(losses), device_ptr<A>(lse), nullptr, c,
                     ignore_index, smoothing);
    check_launch("cross_entropy");
  });
}

void cross_entropy_with_grad(const Tensor& logits, const Tensor& target, const Tensor& count, const Tensor& losses,
                             const Tensor& grad, int64_t ignore_index, double smoothing) {
  dispatch_floating(logits.dtype(), "cross_entropy_with_grad", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using A = stat_t<acc_t<T>>;
    const int64_t n = logits.shape()[0], c = logits.shape()[1];
    if (n == 0) return;
    NvtxRange range("cross_entropy_with_grad");
    const int device = logits.device().index;
    DeviceGuard guard(device);
    constexpr int V = 16 / sizeof(T);
    const int v = cross_entropy_vector<T>(logits.data_ptr(), grad.data_ptr());
    // The row, and the up to V-1 elements before it in its first vector.
    const size_t kept_bytes = static_cast<size_t>(c + V) * sizeof(T);
    // The block reductions' own static shared memory (under 1 KB) comes on top.
    const bool keep = kept_bytes + 1024 <= static_cast<size_t>(max_shared_per_block(device));
    auto kernel = v == V ? (keep ? cross_entropy_rows<T, V, GradPass::from_shared>
                                 : cross_entropy_rows<T, V, GradPass::from_global>)
                         : (keep ? cross_entropy_rows<T, 1, GradPass::from_shared>
                                 : cross_entropy_rows<T, 1, GradPass::from_global>);
    const size_t shared = keep ? kept_bytes : 0;
    allow_dynamic_shared_memory(kernel, device, shared);
    const int threads = cross_entropy_threads(c, v, kCrossEntropyForwardThreads);
    launch_dependent(kernel, static_cast<unsigned>(n), threads, shared, stream_of(logits), device_ptr<const T>(logits),
                     device_ptr<const int64_t>(target), count.defined() ? device_ptr<const A>(count) : nullptr,
                     device_ptr<A>(losses), nullptr, device_ptr<T>(grad), c, ignore_index, smoothing);
    check_launch("cross_entropy_with_grad");
  });
}

void cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& row_grad,
                            const Tensor& out, int64_t ignore_index, double smoothing) {
  dispatch_floating(logits.dtype(), "cross_entropy_backward", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using A = stat_t<acc_t<T>>;
    const int64_t n = logits.shape()[0], c = logits.shape()[1];
    if (n == 0) return;
    NvtxRange range("cross_entropy_backward");
    DeviceGuard guard(logits.device().index);
    constexpr int V = 16 / sizeof(T);
    const int v = cross_entropy_vector<T>(logits.data_ptr(), out.data_ptr());
    auto kernel = v == V ? cross_entropy_backward_rows<T, V> : cross_entropy_backward_rows<T, 1>;
    launch_dependent(kernel, static_cast<unsigned>(n), cross_entropy_threads(c, v, 1024), 0, stream_of(logits),
                     device_ptr<const T>(logits), device_ptr<const int64_t>(target), device_ptr<const A>(lse),
                     device_ptr<const A>(row_grad), device_ptr<T>(out), c, ignore_index, smoothing);
    check_launch("cross_entropy_backward");
  });
}

}  // namespace tandem::cuda
