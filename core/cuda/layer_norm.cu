// CUDA layer norm over the last dim of contiguous (rows, D) tensors, statistics in f32 (f64 for
// f64). One warp per row: the forward keeps a short row in registers (16-byte loads when D and
// the pointers allow), so it reads x once and writes out once. The backward computes dx per row
// (a short row's dy, x and pending held in registers) and sums dy * xhat and dy per column into
// each warp's own shared-memory slice; a block adds its warps' sums in order into one f32 partial
// row, and a second kernel adds the blocks' partial rows in order. Up to 128 rows one launch does
// it all: blocks beside the rows' sum whole columns. With fewer rows than the SMs can keep busy a
// warp each, both ways split each row over several warps (a 16-byte vector a thread). When asked,
// the backward also sums dx itself per column the same way (add_layer_norm's residual bias takes
// that as its gradient). No atomics: the weight and bias gradients and dx's sums are the same bits
// on every run.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/partial_rows.cuh"

namespace tandem::cuda {

namespace {
template <typename T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

constexpr int kForwardWarps = 4;             // rows per forward block
constexpr int kMaxBackwardWarps = 8;         // rows in flight per backward block
constexpr size_t kSharedBudget = 48u << 10;  // shared memory a block may use without opting in

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, int V>
__device__ __forceinline__ void load_vector(const T* p, int64_t j, stat_t<acc_t<T>> (&out)[V]) {
  Packed<T, V> pack = reinterpret_cast<const Packed<T, V>*>(p)[j];
#pragma unroll
  for (int k = 0; k < V; ++k) out[k] = static_cast<stat_t<acc_t<T>>>(to_acc(pack.v[k]));
}

// One row of the forward: x's row, and with a residual also the residual's and sum's rows.
template <typename T>
struct ForwardRow {
  const T* x;              // (D,)
  const T* residual;       // (D,), or null
  const T* residual_bias;  // (D,), or null
  T* sum;                  // (D,), or null when there is no residual
  T* out;                  // (D,)
};

template <typename T>
__device__ __forceinline__ ForwardRow<T> forward_row(const T* x, const T* residual, const T* residual_bias, T* sum,
                                                     T* out, int64_t row, int64_t d) {
  return {x + row * d, residual ? residual + row * d : nullptr, residual_bias, residual ? sum + row * d : nullptr,
          out + row * d};
}

// The first read of vector j of the row to normalise: x's, or with a residual x + residual
// (x + (residual + residual_bias) with a residual bias), each add rounded to T as the add kernels
// round, and written to sum on the way.
template <typename T, int V>
__device__ __forceinline__ void load_forward_input(const ForwardRow<T>& r, int64_t j, stat_t<acc_t<T>> (&v)[V]) {
  using S = stat_t<acc_t<T>>;
  load_vector<T, V>(r.x, j, v);
  if (!r.residual) return;
  S res[V];
  load_vector<T, V>(r.residual, j, res);
  if (r.residual_bias) {
    S rb[V];
    load_vector<T, V>(r.residual_bias, j, rb);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      res[k] = static_cast<S>(to_acc(cast_to<T>(static_cast<acc_t<T>>(res[k]) + static_cast<acc_t<T>>(rb[k]))));
    }
  }
  Packed<T, V> pack;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    pack.v[k] = cast_to<T>(static_cast<acc_t<T>>(v[k]) + static_cast<acc_t<T>>(res[k]));
    v[k] = static_cast<S>(to_acc(pack.v[k]));
  }
  reinterpret_cast<Packed<T, V>*>(r.sum)[j] = pack;
}

// Vector j of the output: (v - mu) * rs, times the weight and plus the bias where given, in T.
template <typename T, int V>
__device__ __forceinline__ void store_forward_output(const ForwardRow<T>& r, const T* weight, const T* bias, int64_t j,
                                                     const stat_t<acc_t<T>> (&v)[V], stat_t<acc_t<T>> mu,
                                                     stat_t<acc_t<T>> rs) {
  using S = stat_t<acc_t<T>>;
  S w[V], b[V];
  if (weight) load_vector<T, V>(weight, j, w);
  if (bias) load_vector<T, V>(bias, j, b);
  Packed<T, V> pack;
#pragma unroll
  for (int k = 0; k < V; ++k) {
    S y = (v[k] - mu) * rs;
    if (weight) y *= w[k];
    if (bias) y += b[k];
    pack.v[k] = cast_to<T>(y);
  }
  reinterpret_cast<Packed<T, V>*>(r.out)[j] = pack;
}

// Row `row` of x (rows, D), normalised into out; each lane owns vectors lane, lane + 32, ... of V
// elements. kItems > 0: the row is held in registers (D <= 32 * V * kItems); kItems == 0: it is
// streamed three times (L1 serves the re-reads). With a residual (rows, D), the row normalised
// is x + residual, rounded to T as the add kernel would, and it is also written to sum; with a
// residual_bias (D,) too, x + (residual + residual_bias), each add rounded to T.
template <typename T, int V, int kItems>
__global__ void __launch_bounds__(kForwardWarps * 32)
    layer_norm_forward_rows(const T* __restrict__ x, const T* __restrict__ residual,
                            const T* __restrict__ residual_bias, const T* __restrict__ weight,
                            const T* __restrict__ bias, T* __restrict__ sum, T* __restrict__ out,
                            stat_t<acc_t<T>>* __restrict__ mean, stat_t<acc_t<T>>* __restrict__ rstd, int64_t rows,
                            int64_t d, double eps) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  const int lane = threadIdx.x;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kForwardWarps + threadIdx.y;
  if (row >= rows) return;    // the whole warp leaves together
  const ForwardRow<T> r = forward_row(x, residual, residual_bias, sum, out, row, d);
  const int64_t vectors = d / V;
  const S inv_d = S(1) / static_cast<S>(d);
  auto first_load = [&](int64_t j, S(&v)[V]) { load_forward_input<T, V>(r, j, v); };
  const T* again = r.residual ? r.sum : r.x;  // where the streamed passes re-read the row

  S mu = 0, rs = 0;
  auto write = [&](int64_t j, const S(&v)[V]) { store_forward_output<T, V>(r, weight, bias, j, v, mu, rs); };

  if constexpr (kItems > 0) {
    S v[kItems][V];
    S total = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t j = lane + 32 * i;
      if (j < vectors) {
        first_load(j, v[i]);
#pragma unroll
        for (int k = 0; k < V; ++k) total += v[i][k];
      }
    }
    mu = warp_sum(total) * inv_d;
    S squares = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (lane + 32 * i < vectors) {
#pragma unroll
        for (int k = 0; k < V; ++k) squares += (v[i][k] - mu) * (v[i][k] - mu);
      }
    }
    rs = S(1) / sqrt(warp_sum(squares) * inv_d + static_cast<S>(eps));
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      const int64_t j = lane + 32 * i;
      if (j < vectors) write(j, v[i]);
    }
  } else {
    S v[V];
    S total = 0;
    for (int64_t j = lane; j < vectors; j += 32) {
      first_load(j, v);
#pragma unroll
      for (int k = 0; k < V; ++k) total += v[k];
    }
    mu = warp_sum(total) * inv_d;
    S squares = 0;
    for (int64_t j = lane; j < vectors; j += 32) {
      load_vector<T, V>(again, j, v);
#pragma unroll
      for (int k = 0; k < V; ++k) squares += (v[k] - mu) * (v[k] - mu);
    }
    rs = S(1) / sqrt(warp_sum(squares) * inv_d + static_cast<S>(eps));
    for (int64_t j = lane; j < vectors; j += 32) {
      load_vector<T, V>(again, j, v);
      write(j, v);
    }
  }
  if (lane == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// Rows split over W warps, for few rows: a thread holds one 16-byte vector of V elements (D <=
// 32 * W * V), and a block of (32 * W, split_rows_per_block(W)) threads takes that many rows.
// With one warp a row, GPT-2 B1 T1024's 1024 rows of 768 left each SM about 8 warps, each working
// through its 24 elements a lane one dependent instruction after another (ncu on one H200: 5.6 us a
// call, the SMs active for 56% of it and issuing an instruction every 4 cycles). A row's sums add
// its warps' sums in warp order through shared memory.
constexpr int split_rows_per_block(int W) { return W <= 2 ? 4 : W <= 4 ? 2 : 1; }
constexpr int kSplitWarpsPerSm = 16;  // split when one warp a row would give an SM fewer warps than this

template <typename T, int V, int W>
__global__ void __launch_bounds__(32 * W * split_rows_per_block(W))
    layer_norm_forward_split_rows(const T* __restrict__ x, const T* __restrict__ residual,
                                  const T* __restrict__ residual_bias, const T* __restrict__ weight,
                                  const T* __restrict__ bias, T* __restrict__ sum, T* __restrict__ out,
                                  stat_t<acc_t<T>>* __restrict__ mean, stat_t<acc_t<T>>* __restrict__ rstd,
                                  int64_t rows, int64_t d, double eps) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  constexpr int R = split_rows_per_block(W);
  __shared__ S warp_sums[2][R][W];  // (the mean's, the variance's; row of the block; warp of the row)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * R + threadIdx.y;
  const int64_t j = threadIdx.x;  // this thread's vector of the row
  // Every thread reaches the barriers below, those past the last row or the row's end included.
  const bool owned = row < rows && j < d / V;
  const ForwardRow<T> r = forward_row(x, residual, residual_bias, sum, out, row < rows ? row : 0, d);
  const S inv_d = S(1) / static_cast<S>(d);
  auto row_sum = [&](int which, S value) {
    value = warp_sum(value);
    if (lane == 0) warp_sums[which][threadIdx.y][warp] = value;
    __syncthreads();
    S total = 0;
#pragma unroll
    for (int w = 0; w < W; ++w) total += warp_sums[which][threadIdx.y][w];
    return total;
  };
  S v[V] = {};
  S total = 0;
  if (owned) {
    load_forward_input<T, V>(r, j, v);
#pragma unroll
    for (int k = 0; k < V; ++k) total += v[k];
  }
  const S mu = row_sum(0, total) * inv_d;
  S squares = 0;
  if (owned) {
#pragma unroll
    for (int k = 0; k < V; ++k) squares += (v[k] - mu) * (v[k] - mu);
  }
  const S rs = S(1) / sqrt(row_sum(1, squares) * inv_d + static_cast<S>(eps));
  if (owned) store_forward_output<T, V>(r, weight, bias, j, v, mu, rs);
  if (row < rows && threadIdx.x == 0) {
    mean[row] = mu;
    rstd[row] = rs;
  }
}

// The column sums a backward block keeps: dy * xhat's (the weight's gradient) and dy's (the
// bias's), and with partial_ds set also dx's as rounded (a bias added into x).
template <typename S>
__device__ __forceinline__ int column_sums(const S* partial_ds) {
  return partial_ds != nullptr ? 3 : 2;
}

// The block's column sums: the warps' slices of shared (warps, sums, slice), column c of each sum
// at offset(c), added in warp order into row blockIdx.x of partial_dw, partial_db and, with three
// sums, partial_ds (gridDim.x, D) each.
template <typename S, typename Offset>
__device__ void store_block_partials(const S* shared, int sums, int64_t slice, Offset offset, int64_t d,
                                     S* partial_dw, S* partial_db, S* partial_ds) {
  const int warps = blockDim.y;
  for (int64_t c = threadIdx.y * 32 + threadIdx.x; c < d; c += static_cast<int64_t>(warps) * 32) {
    const int64_t o = offset(c);
    for (int k = 0; k < sums; ++k) {
      S total = 0;
      for (int w = 0; w < warps; ++w) total += shared[(static_cast<int64_t>(w) * sums + k) * slice + o];
      S* partial = k == 0 ? partial_dw : k == 1 ? partial_db : partial_ds;  // (gridDim.x, D)
      partial[static_cast<int64_t>(blockIdx.x) * d + c] = total;
    }
  }
}

// dx per row (one warp per row, rows strided over the grid), plus pending's row where pending is
// set (the gradient x's other uses gave, added before rounding); with partial_dw set, also this
// block's column sums of dy * xhat and dy (and of dx with partial_ds set) into partial_dw,
// partial_db, partial_ds (gridDim.x, D), through shared memory (warps, sums, D) in S.
template <typename T, int V>
__global__ void layer_norm_backward_rows(const T* __restrict__ grad_out, const T* __restrict__ x,
                                         const T* __restrict__ weight, const stat_t<acc_t<T>>* __restrict__ mean,
                                         const stat_t<acc_t<T>>* __restrict__ rstd, const T* __restrict__ pending,
                                         T* __restrict__ grad_x,
                                         stat_t<acc_t<T>>* __restrict__ partial_dw,
                                         stat_t<acc_t<T>>* __restrict__ partial_db,
                                         stat_t<acc_t<T>>* __restrict__ partial_ds, int64_t rows, int64_t d) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  extern __shared__ unsigned char shared_raw[];
  S* shared = reinterpret_cast<S*>(shared_raw);  // (warps, sums, D)
  const int lane = threadIdx.x, warps = blockDim.y;
  const bool columns = partial_dw != nullptr;
  const int sums = column_sums(partial_ds);
  S* my_dw = shared + static_cast<int64_t>(threadIdx.y) * sums * d;  // (D,)
  S* my_db = my_dw + d;                                              // (D,)
  S* my_ds = partial_ds ? my_db + d : nullptr;                       // (D,)
  if (columns) {
    for (int64_t c = lane; c < static_cast<int64_t>(sums) * d; c += 32) my_dw[c] = S(0);
    __syncwarp();
  }
  const int64_t vectors = d / V;
  const S inv_d = S(1) / static_cast<S>(d);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + threadIdx.y; row < rows;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const T* gr = grad_out + row * d;  // (D,)
    const T* xr = x + row * d;         // (D,)
    const T* pendr = pending ? pending + row * d : nullptr;  // (D,)
    T* dxr = grad_x + row * d;         // (D,)
    const S mu = mean[row], rs = rstd[row];
    S sum_g = 0, sum_gx = 0;
    S gv[V], xv[V], wv[V], pv[V];
    for (int64_t j = lane; j < vectors; j += 32) {
      load_vector<T, V>(gr, j, gv);
      load_vector<T, V>(xr, j, xv);
      if (weight) load_vector<T, V>(weight, j, wv);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const S g = weight ? gv[k] * wv[k] : gv[k];
        sum_g += g;
        sum_gx += g * (xv[k] - mu) * rs;
      }
    }
    const S a = warp_sum(sum_g) * inv_d, b = warp_sum(sum_gx) * inv_d;
    for (int64_t j = lane; j < vectors; j += 32) {
      load_vector<T, V>(gr, j, gv);
      load_vector<T, V>(xr, j, xv);
      if (weight) load_vector<T, V>(weight, j, wv);
      if (pendr) load_vector<T, V>(pendr, j, pv);
      S dx[V];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const S xhat = (xv[k] - mu) * rs;
        const S g = weight ? gv[k] * wv[k] : gv[k];
        dx[k] = rs * (g - a - xhat * b);
        if (pendr) dx[k] += pv[k];
        if (columns) {
          my_dw[j * V + k] += gv[k] * xhat;  // each lane owns its columns: no races, a fixed order
          my_db[j * V + k] += gv[k];
        }
      }
      const Packed<T, V> pack = pack_rounded<T, V>(dx);
      if (my_ds) {
        unpack(pack, dx);  // dx as rounded
#pragma unroll
        for (int k = 0; k < V; ++k) my_ds[j * V + k] += dx[k];
      }
      reinterpret_cast<Packed<T, V>*>(dxr)[j] = pack;
    }
  }
  if (!columns) return;
  __syncthreads();
  store_block_partials(shared, sums, d, [](int64_t c) { return c; }, d, partial_dw, partial_db, partial_ds);
}

// Where column c of a row lies in a warp's slice of column sums in shared memory, for rows whose
// lanes own vectors lane, lane + 32, ... of V elements (item i holds vector 32 * i + lane): the
// slice is [item][16-byte chunk of the vector][lane][element], so that a warp's 16-byte accesses
// to one chunk of one item are contiguous (no bank conflicts). Covers 32 * V * kItems columns.
template <typename S, int V>
struct SumSlice {
  static constexpr int kChunk = 16 / static_cast<int>(sizeof(S));  // S per 16 bytes
  static constexpr int kChunks = V / kChunk;                        // 16-byte chunks per vector
  static_assert(kChunks >= 1 && V % kChunk == 0, "a vector is a whole number of 16-byte chunks");
  __device__ static int64_t offset(int64_t c) {
    const int64_t j = c / V, r = c % V;
    return ((j / 32 * kChunks + r / kChunk) * 32 + j % 32) * kChunk + r % kChunk;
  }
  // Adds add[V] (one item's values) to the slice at item i of this lane.
  __device__ static void accumulate(S* slice, int i, int lane, const S (&add)[V]) {
#pragma unroll
    for (int q = 0; q < kChunks; ++q) {
      auto* chunk = reinterpret_cast<Packed<S, kChunk>*>(slice + ((i * kChunks + q) * 32 + lane) * kChunk);
      Packed<S, kChunk> v = *chunk;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) v.v[e] += add[q * kChunk + e];
      *chunk = v;
    }
  }
};

// Short rows, at most 32 * V * kItems elements (GPT-2's 768 in bf16 is three 16-byte vectors per
// lane), one warp per row: each lane loads its vectors of dy, x and pending as raw 16-byte packs
// before the row's sums, so one memory round trip serves the whole row, and dx is computed from
// them in registers. With `sums` set (this warp's slice (2, 32 * V * kItems) in S, laid out as
// SumSlice says: dy * xhat's sums, then dy's), the lane adds its columns there, and with `dx_sums`
// set (a slice (32 * V * kItems) likewise) dx's as rounded: in shared memory
// rather than registers, which keeps the registers for the loads in flight (with the sums in
// registers as well, GPT-2's rows spilled and took 30-33 us at 8192 rows on an H200, against 21-24
// us now). The rows are strided over `blocks` blocks, this one being `block`.
template <typename T, int V, int kItems>
__device__ __forceinline__ void backward_short_rows(
    const T* __restrict__ grad_out, const T* __restrict__ x, const T* __restrict__ weight,
    const stat_t<acc_t<T>>* __restrict__ mean, const stat_t<acc_t<T>>* __restrict__ rstd,
    const T* __restrict__ pending, T* __restrict__ grad_x, stat_t<acc_t<T>>* sums, stat_t<acc_t<T>>* dx_sums,
    int64_t rows, int64_t d, int64_t block, int64_t blocks) {
  using S = stat_t<acc_t<T>>;
  using Slice = SumSlice<S, V>;
  constexpr int64_t kSlice = 32 * V * kItems;
  const int lane = threadIdx.x, warps = blockDim.y;
  const int64_t vectors = d / V;
  const S inv_d = S(1) / static_cast<S>(d);
  auto owned = [&](int i) { return lane + 32 * i < vectors; };  // this lane's i-th vector exists
  if (sums) {
    for (int64_t o = lane; o < 2 * kSlice; o += 32) sums[o] = S(0);
  }
  if (dx_sums) {
    for (int64_t o = lane; o < kSlice; o += 32) dx_sums[o] = S(0);
  }
  __syncwarp();
  for (int64_t row = block * warps + threadIdx.y; row < rows; row += blocks * warps) {
    const S mu = mean[row], rs = rstd[row];
    Packed<T, V> gv[kItems], xv[kItems], pv[kItems];  // this lane's vectors of the row's dy, x, pending
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (!owned(i)) continue;
      gv[i] = reinterpret_cast<const Packed<T, V>*>(grad_out + row * d)[lane + 32 * i];
      xv[i] = reinterpret_cast<const Packed<T, V>*>(x + row * d)[lane + 32 * i];
      if (pending) pv[i] = reinterpret_cast<const Packed<T, V>*>(pending + row * d)[lane + 32 * i];
    }
    S sum_g = 0, sum_gx = 0;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (!owned(i)) continue;
      S g[V], xs[V];
      unpack(gv[i], g);
      unpack(xv[i], xs);
      if (weight) {
        S wv[V];  // the weight, read again per row from L1 rather than held in registers
        load_vector<T, V>(weight, lane + 32 * i, wv);
#pragma unroll
        for (int k = 0; k < V; ++k) g[k] *= wv[k];
      }
#pragma unroll
      for (int k = 0; k < V; ++k) {
        sum_g += g[k];
        sum_gx += g[k] * ((xs[k] - mu) * rs);
      }
    }
    const S a = warp_sum(sum_g) * inv_d, b = warp_sum(sum_gx) * inv_d;
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      if (!owned(i)) continue;
      S dy[V], xhat[V], dx[V];
      unpack(gv[i], dy);
      unpack(xv[i], xhat);
#pragma unroll
      for (int k = 0; k < V; ++k) xhat[k] = (xhat[k] - mu) * rs;
      if (weight) {
        S wv[V];
        load_vector<T, V>(weight, lane + 32 * i, wv);
#pragma unroll
        for (int k = 0; k < V; ++k) dx[k] = rs * (dy[k] * wv[k] - a - xhat[k] * b);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) dx[k] = rs * (dy[k] - a - xhat[k] * b);
      }
      if (pending) {
        S p[V];
        unpack(pv[i], p);
#pragma unroll
        for (int k = 0; k < V; ++k) dx[k] += p[k];
      }
      const Packed<T, V> pack = pack_rounded<T, V>(dx);
      reinterpret_cast<Packed<T, V>*>(grad_x + row * d)[lane + 32 * i] = pack;
      if (sums) {  // each lane owns its columns: no races, and a fixed order
#pragma unroll
        for (int k = 0; k < V; ++k) xhat[k] *= dy[k];  // dy * xhat
        Slice::accumulate(sums, i, lane, xhat);
        Slice::accumulate(sums + kSlice, i, lane, dy);
      }
      if (dx_sums) {
        unpack(pack, dx);  // dx as rounded
        Slice::accumulate(dx_sums, i, lane, dx);
      }
    }
  }
}

// The backward's rows split over W warps, for few rows (as the forward's split above): a thread
// holds one 16-byte vector of V elements of a row (D <= 32 * W * V), a block of (32 * W,
// split_backward_rows(W)) threads, 24 warps, takes that many rows at a time and strides over the
// rest. A thread keeps the same columns for every row it takes, so its column sums of dy * xhat
// and dy (and dx's with partial_ds set) stay in registers; the block adds them over its rows in
// order, through shared memory (rows, sums, 32 * W * V) in S, into row blockIdx.x of partial_dw,
// partial_db and partial_ds (gridDim.x, D), which sum_partial_rows then adds. The two sums that
// give dx are a row's warps' sums added in warp order, through shared memory.
constexpr int split_backward_rows(int W) { return 24 / W; }
constexpr int split_row_sums(int W) { return 2 * split_backward_rows(W) * W * 2; }  // S values

template <typename T, int V, int W>
__global__ void __launch_bounds__(32 * W * split_backward_rows(W))
    layer_norm_backward_split_rows(const T* __restrict__ grad_out, const T* __restrict__ x,
                                   const T* __restrict__ weight, const stat_t<acc_t<T>>* __restrict__ mean,
                                   const stat_t<acc_t<T>>* __restrict__ rstd, const T* __restrict__ pending,
                                   T* __restrict__ grad_x, stat_t<acc_t<T>>* __restrict__ partial_dw,
                                   stat_t<acc_t<T>>* __restrict__ partial_db, stat_t<acc_t<T>>* __restrict__ partial_ds,
                                   int64_t rows, int64_t d) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  constexpr int R = split_backward_rows(W);
  constexpr int64_t kWidth = 32 * W * V;  // the columns a row's threads cover
  // Dynamic shared memory: the rows' sums (iteration parity, row of the block, warp, dy's and dy *
  // xhat's) and after them, when partial_dw is set, the column sums (R, sums, kWidth).
  extern __shared__ unsigned char shared_raw[];
  auto row_sums = reinterpret_cast<S(*)[R][W][2]>(shared_raw);                   // (2, R, W, 2)
  S* column_sums_shared = reinterpret_cast<S*>(shared_raw) + split_row_sums(W);  // (R, sums, kWidth)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t j = threadIdx.x;  // this thread's vector of every row it takes
  const bool in_row = j < d / V;
  const S inv_d = S(1) / static_cast<S>(d);
  S wv[V];  // the weight's vector j, the same for every row
#pragma unroll
  for (int k = 0; k < V; ++k) wv[k] = S(1);
  if (weight && in_row) load_vector<T, V>(weight, j, wv);
  S dw[V] = {}, db[V] = {}, ds[V] = {};
  int parity = 0;
  // Every thread of the block runs every iteration (the barrier), those past the last row too.
  for (int64_t first = static_cast<int64_t>(blockIdx.x) * R; first < rows;
       first += static_cast<int64_t>(gridDim.x) * R, parity ^= 1) {
    const int64_t row = first + threadIdx.y;
    const bool owned = in_row && row < rows;
    Packed<T, V> gv = {}, xv = {}, pv = {};
    S mu = 0, rs = 0;
    if (owned) {
      gv = reinterpret_cast<const Packed<T, V>*>(grad_out + row * d)[j];
      xv = reinterpret_cast<const Packed<T, V>*>(x + row * d)[j];
      if (pending) pv = reinterpret_cast<const Packed<T, V>*>(pending + row * d)[j];
      mu = mean[row];
      rs = rstd[row];
    }
    S dy[V], xhat[V], sum_g = 0, sum_gx = 0;
    unpack(gv, dy);
    unpack(xv, xhat);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      xhat[k] = (xhat[k] - mu) * rs;
      const S g = dy[k] * wv[k];
      sum_g += g;
      sum_gx += g * xhat[k];
    }
    sum_g = warp_sum(sum_g);
    sum_gx = warp_sum(sum_gx);
    if (lane == 0) {
      row_sums[parity][threadIdx.y][warp][0] = sum_g;
      row_sums[parity][threadIdx.y][warp][1] = sum_gx;
    }
    __syncthreads();  // also keeps the other parity's sums until every thread has read them
    S a = 0, b = 0;
#pragma unroll
    for (int w = 0; w < W; ++w) {
      a += row_sums[parity][threadIdx.y][w][0];
      b += row_sums[parity][threadIdx.y][w][1];
    }
    a *= inv_d;
    b *= inv_d;
    if (!owned) continue;
    S dx[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      dx[k] = rs * (dy[k] * wv[k] - a - xhat[k] * b);
      dw[k] += dy[k] * xhat[k];
      db[k] += dy[k];
    }
    if (pending) {
      S p[V];
      unpack(pv, p);
#pragma unroll
      for (int k = 0; k < V; ++k) dx[k] += p[k];
    }
    const Packed<T, V> pack = pack_rounded<T, V>(dx);
    unpack(pack, dx);  // dx as rounded
#pragma unroll
    for (int k = 0; k < V; ++k) ds[k] += dx[k];
    reinterpret_cast<Packed<T, V>*>(grad_x + row * d)[j] = pack;
  }
  if (!partial_dw) return;
  const int sums = column_sums(partial_ds);
  S* mine =
      column_sums_shared + static_cast<int64_t>(threadIdx.y) * sums * kWidth + j * V;  // (sums, kWidth) of row slot y
#pragma unroll
  for (int k = 0; k < V; ++k) {
    mine[k] = dw[k];
    mine[kWidth + k] = db[k];
    if (partial_ds) mine[2 * kWidth + k] = ds[k];
  }
  __syncthreads();
  const int threads = 32 * W * R;
  for (int64_t c = threadIdx.y * 32 * W + threadIdx.x; c < d; c += threads) {
    for (int s = 0; s < sums; ++s) {
      S total = 0;
      for (int y = 0; y < R; ++y) total += column_sums_shared[(static_cast<int64_t>(y) * sums + s) * kWidth + c];
      S* partial = s == 0 ? partial_dw : s == 1 ? partial_db : partial_ds;  // (gridDim.x, D)
      partial[static_cast<int64_t>(blockIdx.x) * d + c] = total;
    }
  }
}

// Short-row backward blocks resident per SM: 128 registers per thread (no spills in 16 bits at
// three vectors per lane) and up to 48 KiB of sums per block (72 KiB with dx's sums).
constexpr int kShortRowBlocksPerSm = 2;

// Short rows with their column sums: each warp's sums in its slice of shared (warps, sums, 32 *
// V * kItems), then the block adds its warps' slices in warp order into row blockIdx.x of
// partial_dw, partial_db and partial_ds when set (gridDim.x, D). Without partial_dw, dx alone.
template <typename T, int V, int kItems>
__global__ void __launch_bounds__(kMaxBackwardWarps * 32, kShortRowBlocksPerSm)
    layer_norm_backward_short_rows(const T* __restrict__ grad_out, const T* __restrict__ x,
                                   const T* __restrict__ weight, const stat_t<acc_t<T>>* __restrict__ mean,
                                   const stat_t<acc_t<T>>* __restrict__ rstd, const T* __restrict__ pending,
                                   T* __restrict__ grad_x, stat_t<acc_t<T>>* __restrict__ partial_dw,
                                   stat_t<acc_t<T>>* __restrict__ partial_db,
                                   stat_t<acc_t<T>>* __restrict__ partial_ds, int64_t rows, int64_t d) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  constexpr int64_t kSlice = 32 * V * kItems;
  extern __shared__ unsigned char shared_raw[];
  const int sums_per_warp = column_sums(partial_ds);
  S* shared = reinterpret_cast<S*>(shared_raw);  // (warps, sums_per_warp, kSlice) when partial_dw is set
  S* sums = partial_dw ? shared + static_cast<int64_t>(threadIdx.y) * sums_per_warp * kSlice : nullptr;
  S* dx_sums = partial_ds ? sums + 2 * kSlice : nullptr;
  backward_short_rows<T, V, kItems>(grad_out, x, weight, mean, rstd, pending, grad_x, sums, dx_sums, rows, d,
                                    blockIdx.x, gridDim.x);
  if (!partial_dw) return;
  __syncthreads();
  store_block_partials(shared, sums_per_warp, kSlice, [](int64_t c) { return SumSlice<S, V>::offset(c); }, d,
                       partial_dw, partial_db, partial_ds);
}

// Few rows (at most kFewRows), in one launch of (32, warps) blocks: the first row_blocks compute
// dx as above; each block after them sums 32 columns of dy * xhat and dy over every row (the
// warps stride the rows, then their sums are added in warp order) and writes grad_weight and
// grad_bias (either may be null) directly. No partial rows and no second kernel: at GPT-2's 128
// rows (B 1, T 128) the step's layer norms are bound by launches and latency, not by bytes. At
// 256 rows the column blocks' longer loops made the step slower than the two kernels (one H200).
// With partial_ds set, the row blocks also sum their rows' dx per column (in shared slices of
// (warps, 32 * V * kItems)) into row blockIdx.x of partial_ds (row_blocks, D), for a second kernel
// to add: the column blocks cannot wait for the row blocks' dx.
constexpr int64_t kFewRows = 128;
template <typename T, int V, int kItems>
__global__ void __launch_bounds__(kMaxBackwardWarps * 32)
    layer_norm_backward_few_rows(const T* __restrict__ grad_out, const T* __restrict__ x,
                                 const T* __restrict__ weight, const stat_t<acc_t<T>>* __restrict__ mean,
                                 const stat_t<acc_t<T>>* __restrict__ rstd, const T* __restrict__ pending,
                                 T* __restrict__ grad_x, T* __restrict__ grad_weight, T* __restrict__ grad_bias,
                                 stat_t<acc_t<T>>* __restrict__ partial_ds, int64_t rows, int64_t d,
                                 unsigned row_blocks) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  if (blockIdx.x < row_blocks) {
    constexpr int64_t kSlice = 32 * V * kItems;
    extern __shared__ unsigned char shared_raw[];
    S* shared = reinterpret_cast<S*>(shared_raw);  // (warps, kSlice) when partial_ds is set
    S* dx_sums = partial_ds ? shared + static_cast<int64_t>(threadIdx.y) * kSlice : nullptr;
    backward_short_rows<T, V, kItems>(grad_out, x, weight, mean, rstd, pending, grad_x, nullptr, dx_sums, rows, d,
                                      blockIdx.x, row_blocks);
    if (!partial_ds) return;
    __syncthreads();
    store_block_partials(shared, 1, kSlice, [](int64_t c) { return SumSlice<S, V>::offset(c); }, d, partial_ds,
                         static_cast<S*>(nullptr), static_cast<S*>(nullptr));
    return;
  }
  __shared__ S sums[2][kMaxBackwardWarps][32];  // (weight/bias, warp, column)
  const int lane = threadIdx.x, warp = threadIdx.y;
  const int64_t c = static_cast<int64_t>(blockIdx.x - row_blocks) * 32 + lane;
  S dw = 0, db = 0;
  if (c < d) {
    for (int64_t r = warp; r < rows; r += blockDim.y) {
      const S g = static_cast<S>(to_acc(grad_out[r * d + c]));
      dw += g * ((static_cast<S>(to_acc(x[r * d + c])) - mean[r]) * rstd[r]);
      db += g;
    }
  }
  sums[0][warp][lane] = dw;
  sums[1][warp][lane] = db;
  __syncthreads();
  T* out = warp == 0 ? grad_weight : grad_bias;  // warp 0 writes the weight's, warp 1 the bias's
  if (warp > 1 || out == nullptr || c >= d) return;
  S total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.y); ++w) total += sums[warp][w][lane];
  out[c] = cast_to<T>(total);
}

// Column sums for rows too wide for shared memory, after dx is written: block (32, 8) covers 32
// columns; blockIdx.y picks a chunk of rows; partial_dw, partial_db and, when set, partial_ds
// (the sums of grad_x) (gridDim.y, D).
constexpr int kColumnRows = 8;
template <typename T>
__global__ void layer_norm_column_partials(const T* __restrict__ grad_out, const T* __restrict__ x,
                                           const T* __restrict__ grad_x,
                                           const stat_t<acc_t<T>>* __restrict__ mean,
                                           const stat_t<acc_t<T>>* __restrict__ rstd,
                                           stat_t<acc_t<T>>* __restrict__ partial_dw,
                                           stat_t<acc_t<T>>* __restrict__ partial_db,
                                           stat_t<acc_t<T>>* __restrict__ partial_ds, int64_t rows, int64_t d,
                                           int64_t rows_per_chunk) {
  dependent_kernel_begin();
  using S = stat_t<acc_t<T>>;
  __shared__ S shared[3][kColumnRows][32];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  S dw = 0, db = 0, ds = 0;
  if (c < d) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kColumnRows) {
      const S g = static_cast<S>(to_acc(grad_out[r * d + c]));
      dw += g * (static_cast<S>(to_acc(x[r * d + c])) - mean[r]) * rstd[r];
      db += g;
      if (partial_ds) ds += static_cast<S>(to_acc(grad_x[r * d + c]));
    }
  }
  shared[0][threadIdx.y][threadIdx.x] = dw;
  shared[1][threadIdx.y][threadIdx.x] = db;
  shared[2][threadIdx.y][threadIdx.x] = ds;
  __syncthreads();
  if (threadIdx.y != 0 || c >= d) return;
  for (int i = 1; i < kColumnRows; ++i) {
    dw += shared[0][i][threadIdx.x];
    db += shared[1][i][threadIdx.x];
    ds += shared[2][i][threadIdx.x];
  }
  partial_dw[static_cast<int64_t>(blockIdx.y) * d + c] = dw;
  partial_db[static_cast<int64_t>(blockIdx.y) * d + c] = db;
  if (partial_ds) partial_ds[static_cast<int64_t>(blockIdx.y) * d + c] = ds;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, int V, int W>
void launch_forward_split(const T* x, const T* r, const T* rb, const T* w, const T* b, T* sum, T* out,
                          stat_t<acc_t<T>>* mean, stat_t<acc_t<T>>* rstd, int64_t rows, int64_t d, double eps,
                          cudaStream_t stream) {
  constexpr int R = split_rows_per_block(W);
  const unsigned grid = static_cast<unsigned>((rows + R - 1) / R);
  launch_dependent(layer_norm_forward_split_rows<T, V, W>, grid, dim3(32 * W, R), 0, stream, x, r, rb, w, b, sum, out,
                   mean, rstd, rows, d, eps);
}

template <typename T, int V>
void launch_forward(const T* x, const T* r, const T* rb, const T* w, const T* b, T* sum, T* out, stat_t<acc_t<T>>* mean,
                    stat_t<acc_t<T>>* rstd, int64_t rows, int64_t d, double eps, int device, cudaStream_t stream) {
  const int64_t per_item = 32 * V;
  const int64_t warps_per_row = (d / V + 31) / 32;  // for one vector a thread
  if constexpr (V > 1) {                            // rows in 16-byte vectors
    if (warps_per_row >= 2 && warps_per_row <= 8 && rows < kSplitWarpsPerSm * multiprocessors(device)) {
      auto split = warps_per_row == 2   ? launch_forward_split<T, V, 2>
                   : warps_per_row == 3 ? launch_forward_split<T, V, 3>
                   : warps_per_row == 4 ? launch_forward_split<T, V, 4>
                   : warps_per_row <= 6 ? launch_forward_split<T, V, 6>
                                        : launch_forward_split<T, V, 8>;
      split(x, r, rb, w, b, sum, out, mean, rstd, rows, d, eps, stream);
      return;
    }
  }
  const dim3 block(32, kForwardWarps);
  const unsigned grid = static_cast<unsigned>((rows + kForwardWarps - 1) / kForwardWarps);
  if (d <= 3 * per_item) {  // GPT-2's 768 in 16 bits: 56 registers a thread against 64 holding 4 items
    launch_dependent(layer_norm_forward_rows<T, V, 3>, grid, block, 0, stream, x, r, rb, w, b, sum, out, mean, rstd,
                     rows, d, eps);
  } else if (d <= 4 * per_item) {
    launch_dependent(layer_norm_forward_rows<T, V, 4>, grid, block, 0, stream, x, r, rb, w, b, sum, out, mean, rstd,
                     rows, d, eps);
  } else if (d <= 8 * per_item) {
    launch_dependent(layer_norm_forward_rows<T, V, 8>, grid, block, 0, stream, x, r, rb, w, b, sum, out, mean, rstd,
                     rows, d, eps);
  } else {
    launch_dependent(layer_norm_forward_rows<T, V, 0>, grid, block, 0, stream, x, r, rb, w, b, sum, out, mean, rstd,
                     rows, d, eps);
  }
}

// residual and sum: both (rows, D), or both undefined; residual_bias (D,) or undefined.
template <typename T>
void forward_typed(const Tensor& x, const Tensor& residual, const Tensor& residual_bias, const Tensor& weight,
                   const Tensor& bias, const Tensor& sum, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                   double eps) {
  using S = stat_t<acc_t<T>>;
  const int64_t rows = x.shape()[0], d = x.shape()[1];
  NvtxRange range(residual.defined() ? "add_layer_norm" : "layer_norm");
  DeviceGuard guard(x.device().index);
  cudaStream_t stream = stream_of(x);
  const T* px = device_ptr<const T>(x);                                            // (rows, D)
  const T* prr = residual.defined() ? device_ptr<const T>(residual) : nullptr;     // (rows, D)
  const T* prb = residual_bias.defined() ? device_ptr<const T>(residual_bias) : nullptr;  // (D,)
  const T* pw = weight.defined() ? device_ptr<const T>(weight) : nullptr;          // (D,)
  const T* pb = bias.defined() ? device_ptr<const T>(bias) : nullptr;              // (D,)
  T* ps = sum.defined() ? device_ptr<T>(sum) : nullptr;                            // (rows, D)
  T* po = device_ptr<T>(out);                                                      // (rows, D)
  S* pm = device_ptr<S>(mean);                                                     // (rows,)
  S* pr = device_ptr<S>(rstd);                                                     // (rows,)
  constexpr int V = 16 / sizeof(T);
  const bool vectorised = d % V == 0 && aligned16(px) && aligned16(po) && (!pw || aligned16(pw)) &&
                          (!pb || aligned16(pb)) && (!prr || aligned16(prr)) && (!prb || aligned16(prb)) &&
                          (!ps || aligned16(ps));
  const int device = x.device().index;
  if (vectorised)
    launch_forward<T, V>(px, prr, prb, pw, pb, ps, po, pm, pr, rows, d, eps, device, stream);
  else
    launch_forward<T, 1>(px, prr, prb, pw, pb, ps, po, pm, pr, rows, d, eps, device, stream);
  check_launch(residual.defined() ? "add_layer_norm" : "layer_norm");
}

template <typename T>
void backward_typed(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                    const Tensor& rstd, const Tensor& pending, const Tensor& grad_x, const Tensor& grad_weight,
                    const Tensor& grad_bias, const Tensor& grad_x_sum) {
  using S = stat_t<acc_t<T>>;
  const int64_t rows = x.shape()[0], d = x.shape()[1];
  NvtxRange range("layer_norm_backward");
  const int device = x.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(x);
  const T* pg = device_ptr<const T>(grad_out);                             // (rows, D)
  const T* px = device_ptr<const T>(x);                                    // (rows, D)
  const T* pw = weight.defined() ? device_ptr<const T>(weight) : nullptr;  // (D,)
  const S* pm = device_ptr<const S>(mean);                                 // (rows,)
  const S* pr = device_ptr<const S>(rstd);                                 // (rows,)
  const T* pp = pending.defined() ? device_ptr<const T>(pending) : nullptr;  // (rows, D)
  T* pdx = device_ptr<T>(grad_x);                                          // (rows, D)
  // The column sums: the weight's and bias's gradients, and dx's sums (grad_x_sum) when wanted.
  const bool x_sum = grad_x_sum.defined();
  const bool columns = grad_weight.defined() || grad_bias.defined() || x_sum;
  const int sums = x_sum ? 3 : 2;
  // The blocks' partial column sums, (parts, D) each in S: dy * xhat's, dy's, and dx's with x_sum.
  struct Partials {
    Tensor dw, db, ds;
    S* ptr(const Tensor& t) const { return t.defined() ? device_ptr<S>(t) : nullptr; }
  };
  auto make_partials = [&](int64_t parts) {
    Partials p;
    if (!columns) return p;
    TensorOptions o(mean.dtype(), x.device());
    p.dw = empty({parts, d}, o);
    p.db = empty({parts, d}, o);
    if (x_sum) p.ds = empty({parts, d}, o);
    return p;
  };
  // grad_weight, grad_bias and grad_x_sum from the blocks' partial column sums (with dx_only,
  // grad_x_sum alone).
  auto reduce_partials = [&](const Partials& p, bool dx_only = false) {
    PartialRowSums<S, T> column_sums;
    if (!dx_only) column_sums.add(p.dw, grad_weight);
    if (!dx_only) column_sums.add(p.db, grad_bias);
    if (x_sum) column_sums.add(p.ds, grad_x_sum);
    column_sums.launch(device, stream);
  };

  constexpr int V = 16 / sizeof(T);
  const bool vectorised = d % V == 0 && aligned16(pg) && aligned16(px) && aligned16(pdx) && (!pw || aligned16(pw)) &&
                          (!pp || aligned16(pp));
  const int64_t per_item = 32 * V;
  if (vectorised && columns && rows <= kFewRows && d <= 3 * per_item) {
    const dim3 few_block(32, kMaxBackwardWarps);
    const unsigned row_blocks = static_cast<unsigned>((rows + kMaxBackwardWarps - 1) / kMaxBackwardWarps);
    const unsigned column_blocks = static_cast<unsigned>((d + 31) / 32);
    const int items = d <= per_item ? 1 : d <= 2 * per_item ? 2 : 3;
    auto kernel = items == 1   ? layer_norm_backward_few_rows<T, V, 1>
                  : items == 2 ? layer_norm_backward_few_rows<T, V, 2>
                               : layer_norm_backward_few_rows<T, V, 3>;
    // dx's column sums: the row blocks' partial rows (row_blocks, D), in S, then their sum.
    Tensor partial_ds = x_sum ? empty({static_cast<int64_t>(row_blocks), d}, TensorOptions(mean.dtype(), x.device()))
                              : Tensor();
    const size_t shared = x_sum ? kMaxBackwardWarps * static_cast<size_t>(32 * V * items) * sizeof(S) : 0;
    launch_dependent(kernel, row_blocks + column_blocks, few_block, shared, stream, pg, px, pw, pm, pr, pp, pdx,
                     grad_weight.defined() ? device_ptr<T>(grad_weight) : nullptr,
                     grad_bias.defined() ? device_ptr<T>(grad_bias) : nullptr,
                     x_sum ? device_ptr<S>(partial_ds) : nullptr, rows, d, row_blocks);
    check_launch("layer_norm_backward (few rows)");
    if (x_sum) {
      Partials only_dx;  // the weight's and bias's sums are written above
      only_dx.ds = partial_ds;
      reduce_partials(only_dx, /*dx_only=*/true);
    }
    return;
  }

  // Few rows in 16-byte vectors (fewer than kSplitWarpsPerSm rows an SM): rows split over warps.
  const int64_t warps_per_row = (d / V + 31) / 32;
  if (vectorised && warps_per_row >= 2 && warps_per_row <= 8 && rows < kSplitWarpsPerSm * multiprocessors(device)) {
    auto kernel = warps_per_row == 2   ? layer_norm_backward_split_rows<T, V, 2>
                  : warps_per_row == 3 ? layer_norm_backward_split_rows<T, V, 3>
                  : warps_per_row == 4 ? layer_norm_backward_split_rows<T, V, 4>
                  : warps_per_row <= 6 ? layer_norm_backward_split_rows<T, V, 6>
                                       : layer_norm_backward_split_rows<T, V, 8>;
    const int W = warps_per_row <= 4 ? static_cast<int>(warps_per_row) : warps_per_row <= 6 ? 6 : 8;
    const int R = split_backward_rows(W);
    const size_t column_sums_bytes = columns ? static_cast<size_t>(R) * sums * 32 * W * V * sizeof(S) : 0;
    const size_t shared = split_row_sums(W) * sizeof(S) + column_sums_bytes;
    allow_dynamic_shared_memory(kernel, device, shared);  // up to 72 KiB in 16 bits, with dx's sums
    const unsigned grid =
        static_cast<unsigned>(std::min<int64_t>((rows + R - 1) / R, static_cast<int64_t>(multiprocessors(device))));
    const Partials partials = make_partials(grid);  // (grid, D) each
    launch_dependent(kernel, grid, dim3(32 * W, R), shared, stream, pg, px, pw, pm, pr, pp, pdx,
                     partials.ptr(partials.dw), partials.ptr(partials.db), partials.ptr(partials.ds), rows, d);
    check_launch("layer_norm_backward (split rows)");
    if (columns) reduce_partials(partials);
    return;
  }

  // Short rows: one kernel for dx and each block's partial column sums, with as many blocks as
  // fit on the GPU at once (each warp then takes several rows, and there are fewer partial rows).
  if (vectorised && d <= 3 * per_item) {  // up to 768 in 16 bits
    const int items = d <= per_item ? 1 : d <= 2 * per_item ? 2 : 3;
    auto kernel = items == 1   ? layer_norm_backward_short_rows<T, V, 1>
                  : items == 2 ? layer_norm_backward_short_rows<T, V, 2>
                               : layer_norm_backward_short_rows<T, V, 3>;
    const dim3 block(32, kMaxBackwardWarps);
    static_assert(kMaxBackwardWarps * 2 * 32 * V * 3 * sizeof(S) <= kSharedBudget,
                  "the short-row backward's two sums fit in shared memory without opting in");
    const size_t shared = columns ? kMaxBackwardWarps * sums * static_cast<size_t>(32 * V * items) * sizeof(S) : 0;
    allow_dynamic_shared_memory(kernel, device, shared);  // with dx's sums 72 KiB: two blocks still fit on an SM
    const int64_t wanted = (rows + kMaxBackwardWarps - 1) / kMaxBackwardWarps;
    const unsigned grid = static_cast<unsigned>(
        std::min<int64_t>(wanted, static_cast<int64_t>(kShortRowBlocksPerSm) * multiprocessors(device)));
    const Partials partials = make_partials(grid);  // (grid, D) each
    launch_dependent(kernel, grid, block, shared, stream, pg, px, pw, pm, pr, pp, pdx, partials.ptr(partials.dw),
                     partials.ptr(partials.db), partials.ptr(partials.ds), rows, d);
    check_launch("layer_norm_backward");
    if (columns) reduce_partials(partials);
    return;
  }

  // Longer rows, or rows not in 16-byte vectors: one warp per row, the column sums in each warp's
  // shared slice (sums * D values) where up to 8 warps' slices fit, else in a second pass.
  const size_t slice = sums * static_cast<size_t>(d) * sizeof(S);
  int warps = kMaxBackwardWarps;
  while (columns && warps > 1 && warps * slice > kSharedBudget) warps /= 2;
  const bool in_shared = columns && warps * slice <= kSharedBudget;
  const int64_t wanted = (rows + warps - 1) / warps;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(wanted, 4LL * multiprocessors(device)));
  const int64_t parts = !columns ? 0 : in_shared ? grid : std::min<int64_t>((rows + 63) / 64, 1024);
  const Partials partials = make_partials(parts);  // (parts, D) each
  S* pdw = partials.ptr(partials.dw);
  S* pdb = partials.ptr(partials.db);
  S* pds = partials.ptr(partials.ds);

  const dim3 block(32, warps);
  const size_t shared = in_shared ? warps * slice : 0;
  S* shared_dw = in_shared ? pdw : nullptr;
  S* shared_db = in_shared ? pdb : nullptr;
  S* shared_ds = in_shared ? pds : nullptr;
  if (vectorised) {
    launch_dependent(layer_norm_backward_rows<T, V>, grid, block, shared, stream, pg, px, pw, pm, pr, pp, pdx,
                     shared_dw, shared_db, shared_ds, rows, d);
  } else {
    launch_dependent(layer_norm_backward_rows<T, 1>, grid, block, shared, stream, pg, px, pw, pm, pr, pp, pdx,
                     shared_dw, shared_db, shared_ds, rows, d);
  }
  check_launch("layer_norm_backward");
  if (!columns) return;
  if (!in_shared) {
    const int64_t per_chunk = (rows + parts - 1) / parts;
    const dim3 column_grid(static_cast<unsigned>((d + 31) / 32), static_cast<unsigned>(parts));
    launch_dependent(layer_norm_column_partials<T>, column_grid, dim3(32, kColumnRows), 0, stream, pg, px, pdx, pm, pr,
                     pdw, pdb, pds, rows, d, per_chunk);
    check_launch("layer_norm_backward (column sums)");
  }
  reduce_partials(partials);
}
}  // namespace

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                        const Tensor& mean, const Tensor& rstd, double eps) {
  dispatch_floating(x.dtype(), "layer_norm", "cuda", [&](auto tag) {
    forward_typed<device_t<decltype(tag)>>(x, Tensor(), Tensor(), weight, bias, Tensor(), out, mean, rstd, eps);
  });
}

void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& residual_bias, const Tensor& weight,
                            const Tensor& bias, const Tensor& sum, const Tensor& out, const Tensor& mean,
                            const Tensor& rstd, double eps) {
  dispatch_floating(x.dtype(), "add_layer_norm", "cuda", [&](auto tag) {
    forward_typed<device_t<decltype(tag)>>(x, residual, residual_bias, weight, bias, sum, out, mean, rstd, eps);
  });
}

void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                         const Tensor& rstd, const Tensor& pending, const Tensor& grad_x, const Tensor& grad_weight,
                         const Tensor& grad_bias, const Tensor& grad_x_column_sum) {
  dispatch_floating(x.dtype(), "layer_norm_backward", "cuda", [&](auto tag) {
    backward_typed<device_t<decltype(tag)>>(grad_out, x, weight, mean, rstd, pending, grad_x, grad_weight, grad_bias,
                                            grad_x_column_sum);
  });
}

}  // namespace tandem::cuda
