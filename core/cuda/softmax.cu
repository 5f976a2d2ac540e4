// CUDA softmax / log_softmax (forward and backward) and the fused cross-entropy, over the middle
// dim of contiguous (outer, n, inner) tensors. Rows (inner == 1) get a block each: one pass finds
// each thread's running max and sum of exponentials (online softmax), the block combines them, a
// second pass writes. Other dims get a thread per (outer, inner) column.
#include <limits>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/common.cuh"

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

template <typename T, int V>
struct alignas(sizeof(T) * V) Packed {
  T v[V];
};

template <typename T, int V, int kItems, bool Log>
__global__ void __launch_bounds__(kRegisterThreads) softmax_rows_in_registers(const T* __restrict__ x, T* __restrict__ y,
                                                                               int64_t n) {
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
  if (n <= per_item) softmax_rows_in_registers<T, V, 1, Log><<<blocks, kRegisterThreads, 0, stream>>>(x, y, n);
  else if (n <= 2 * per_item) softmax_rows_in_registers<T, V, 2, Log><<<blocks, kRegisterThreads, 0, stream>>>(x, y, n);
  else if (n <= 4 * per_item) softmax_rows_in_registers<T, V, 4, Log><<<blocks, kRegisterThreads, 0, stream>>>(x, y, n);
  else if (n <= 8 * per_item) softmax_rows_in_registers<T, V, 8, Log><<<blocks, kRegisterThreads, 0, stream>>>(x, y, n);
  else return false;
  return true;
}

template <typename T, bool Log>
__global__ void softmax_columns(const T* __restrict__ x, T* __restrict__ y, int64_t outer, int64_t n, int64_t inner) {
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
    if (!done && log) softmax_rows<T, true><<<static_cast<unsigned>(outer), threads, 0, stream>>>(px, py, n);
    if (!done && !log) softmax_rows<T, false><<<static_cast<unsigned>(outer), threads, 0, stream>>>(px, py, n);
  } else {
    int blocks = blocks_for(outer * inner, 256, INT32_MAX);
    if (log) softmax_columns<T, true><<<blocks, 256, 0, stream>>>(px, py, outer, n, inner);
    else softmax_columns<T, false><<<blocks, 256, 0, stream>>>(px, py, outer, n, inner);
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
    if (log) softmax_backward_rows<T, true><<<static_cast<unsigned>(outer), threads, 0, stream>>>(pg, py, pd, n);
    else softmax_backward_rows<T, false><<<static_cast<unsigned>(outer), threads, 0, stream>>>(pg, py, pd, n);
  } else {
    int blocks = blocks_for(outer * inner, 256, INT32_MAX);
    if (log) softmax_backward_columns<T, true><<<blocks, 256, 0, stream>>>(pg, py, pd, outer, n, inner);
    else softmax_backward_columns<T, false><<<blocks, 256, 0, stream>>>(pg, py, pd, outer, n, inner);
  }
  check_launch("softmax_backward");
}

// One block per row of logits (N, C), read V elements at a time (16-byte loads when C % V == 0 and
// the rows are aligned; V = 1 otherwise). An out-of-range target (other than ignore_index) gives a
// NaN loss for its row: a device kernel cannot raise, and NaN cannot go unnoticed.
template <typename T, int V>
__global__ void cross_entropy_forward_rows(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                           stat_t<acc_t<T>>* losses, stat_t<acc_t<T>>* lse_out, int64_t classes,
                                           int64_t ignore_index, double smoothing) {
  using A = stat_t<acc_t<T>>;
  const T* x = logits + blockIdx.x * classes;                               // (C,)
  const Packed<T, V>* packs = reinterpret_cast<const Packed<T, V>*>(x);  // (C / V,)
  // Each thread keeps a running max and sum of exp(x - max), rescaled once per vector.
  A m = -std::numeric_limits<A>::infinity(), s = 0, total = 0;
  for (int64_t j = threadIdx.x; j < classes / V; j += blockDim.x) {
    const Packed<T, V> p = packs[j];
    A v[V];
    A local = -std::numeric_limits<A>::infinity();
#pragma unroll
    for (int k = 0; k < V; ++k) {
      v[k] = static_cast<A>(to_acc(p.v[k]));
      local = max(local, v[k]);
      total += v[k];
    }
    if (local == -std::numeric_limits<A>::infinity()) continue;  // contributes exp(-inf) = 0
    if (local > m) {
      s *= exp(m - local);  // exp(-inf) is 0 for the first vector
      m = local;
    }
#pragma unroll
    for (int k = 0; k < V; ++k) s += exp(v[k] - m);
  }
  const A row_max = block_max(m);
  const A lse = row_max + log(block_sum(m == -std::numeric_limits<A>::infinity() ? A(0) : s * exp(m - row_max)));
  total = block_sum(total);
  if (threadIdx.x != 0) return;
  lse_out[blockIdx.x] = lse;
  int64_t t = target[blockIdx.x];
  if (t == ignore_index) {
    losses[blockIdx.x] = A(0);
  } else if (t < 0 || t >= classes) {
    losses[blockIdx.x] = A(NAN);
  } else {
    A eps = static_cast<A>(smoothing);
    losses[blockIdx.x] = lse - (A(1) - eps) * static_cast<A>(to_acc(x[t])) - eps / static_cast<A>(classes) * total;
  }
}

// dx = row_grad * (softmax(x) - y), y the (smoothed) one-hot target; V elements at a time.
template <typename T, int V>
__global__ void cross_entropy_backward_rows(const T* __restrict__ logits, const int64_t* __restrict__ target,
                                            const stat_t<acc_t<T>>* lse, const stat_t<acc_t<T>>* row_grad,
                                            T* __restrict__ dx, int64_t classes, int64_t ignore_index,
                                            double smoothing) {
  using A = stat_t<acc_t<T>>;
  const int64_t row = blockIdx.x;
  const Packed<T, V>* x = reinterpret_cast<const Packed<T, V>*>(logits + row * classes);  // (C / V,)
  Packed<T, V>* d = reinterpret_cast<Packed<T, V>*>(dx + row * classes);                // (C / V,)
  const int64_t t = target[row];
  const bool ignored = t == ignore_index;
  const A g = ignored ? A(0) : row_grad[row], l = lse[row];
  const A eps = static_cast<A>(smoothing);
  const A uniform = eps / static_cast<A>(classes);
  for (int64_t j = threadIdx.x; j < classes / V; j += blockDim.x) {
    const Packed<T, V> p = x[j];
    Packed<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = j * V + k;
      const A y = uniform + (c == t ? A(1) - eps : A(0));
      out.v[k] = cast_to<T>(ignored ? A(0) : g * (exp(static_cast<A>(to_acc(p.v[k])) - l) - y));
    }
    d[j] = out;
  }
}

// Elements per load for rows of `classes` at x (and out): 16 bytes' worth where they allow.
template <typename T>
int cross_entropy_vector(const void* x, const void* out, int64_t classes) {
  constexpr int V = 16 / sizeof(T);
  const bool aligned = reinterpret_cast<uintptr_t>(x) % 16 == 0 && (!out || reinterpret_cast<uintptr_t>(out) % 16 == 0);
  return V > 1 && classes % V == 0 && aligned ? V : 1;
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
    const bool vectorised = cross_entropy_vector<T>(logits.data_ptr(), nullptr, c) == V;
    auto kernel = vectorised ? cross_entropy_forward_rows<T, V> : cross_entropy_forward_rows<T, 1>;
    kernel<<<static_cast<unsigned>(n), row_threads(vectorised ? c / V : c), 0, stream_of(logits)>>>(
        device_ptr<const T>(logits), device_ptr<const int64_t>(target), device_ptr<A>(losses), device_ptr<A>(lse), c,
        ignore_index, smoothing);
    check_launch("cross_entropy");
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
    const bool vectorised = cross_entropy_vector<T>(logits.data_ptr(), out.data_ptr(), c) == V;
    auto kernel = vectorised ? cross_entropy_backward_rows<T, V> : cross_entropy_backward_rows<T, 1>;
    kernel<<<static_cast<unsigned>(n), row_threads(vectorised ? c / V : c), 0, stream_of(logits)>>>(
        device_ptr<const T>(logits), device_ptr<const int64_t>(target), device_ptr<const A>(lse),
        device_ptr<const A>(row_grad), device_ptr<T>(out), c, ignore_index, smoothing);
    check_launch("cross_entropy_backward");
  });
}

}  // namespace tandem::cuda
