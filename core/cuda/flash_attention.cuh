#pragma once
// Pieces shared by tandem's f32 flash-attention kernels (flash_attention_forward.cu and
// flash_attention_backward.cu): tile loads into shared memory and warp-level matrix products on
// the tensor cores (mma.sync m16n8k8 with TF32 operands). The addressing (Strided, ParamsOf) and
// the online-softmax step are also used by the 16-bit kernels (flash_attention_half.cuh).
//
// Precision. Under MatmulPrecision::high each operand is rounded to TF32 (10 mantissa bits), as
// cuBLASLt does for f32 matrix products in that mode. Under "highest" every operand x is split
// into big = tf32(x) and small = tf32(x - big), and a*b is accumulated as
// a_small*b_big + a_big*b_small + a_big*b_big ("3xTF32"): about f32's accuracy, three times the work.
//
// Fragments of one mma (g = lane / 4, t = lane % 4; PTX's layout for .tf32 m16n8k8):
//   A (16 x 8, row-major): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]
//   B (8 x 8, k x n):      b0 = B[t][g], b1 = B[t+4][g]
//   C (16 x 8):            c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// A product's sum index k may be visited in any order as long as A and B agree. The kernels use
// that to feed an accumulator (C layout) straight back in as an A operand: k-step j's "column t"
// is column 8j+2t of the accumulator and "column t+4" is 8j+2t+1, so a = {c0, c2, c1, c3}, and
// B's rows are read in the same order (the "interleaved" B below). No shuffles, no shared memory.
#include <cuda_runtime.h>

#include <cstdint>

#include "tandem/core/cuda/check.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/tensor.h"

namespace tandem::cuda::flash {

constexpr int kWarps = 4;             // warps per block, each owning 16 rows of the block's tile
constexpr int kThreads = 32 * kWarps;
constexpr int kTileRows = 16 * kWarps;  // rows (queries or keys) a block owns

// Shared-memory row pitch of a (rows, kD) tile: 4 floats of padding make every fragment read
// below hit 32 different banks.
template <int kD>
constexpr int pitch() {
  return kD + 4;
}

// Columns of the inner tile that a block streams through: 64, or 32 where kD = 128 (registers).
template <int kD>
constexpr int inner_cols() {
  return kD <= 64 ? 64 : 32;
}

// Everything a kernel needs to address one (B, H, T, D) operand of element type T: element
// strides of b, h and t (d's is 1).
template <typename T = float>
struct Strided {
  T* data;
  int64_t sb, sh, st;
  __device__ __forceinline__ T* row(int b, int h, int t) const { return data + b * sb + h * sh + t * st; }
};

// Loads rows [row0, row0 + rows) of one (b, h) slice of x (T, D) into tile (rows, pitch):
// 16-byte loads (D % 4 == 0, rows 16-byte aligned); rows past T and columns past D become zeros.
template <int kD>
__device__ __forceinline__ void load_tile(float* tile, const Strided<float>& x, int b, int h, int row0, int rows, int t_len,
                                          int d) {
  constexpr int kVectors = kD / 4;
  for (int i = threadIdx.x; i < rows * kVectors; i += kThreads) {
    const int r = i / kVectors, c = 4 * (i % kVectors);
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row0 + r < t_len && c < d) v = *reinterpret_cast<const float4*>(x.row(b, h, row0 + r) + c);
    *reinterpret_cast<float4*>(tile + r * pitch<kD>() + c) = v;
  }
}

// One f32 value as a TF32 bit pattern, rounded to nearest.
__device__ __forceinline__ uint32_t tf32_bits(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// A fragment value in the precision the kernel runs in: big alone, or big and the rest.
template <bool kExact>
struct Split {
  uint32_t big, small;
  Split() = default;
  __device__ __forceinline__ explicit Split(float x) {
    big = tf32_bits(x);
    small = kExact ? tf32_bits(x - __uint_as_float(big)) : 0u;
  }
};

__device__ __forceinline__ void mma_tf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c += a * b for one 16 x 8 x 8 step, in the kernel's precision.
template <bool kExact>
__device__ __forceinline__ void mma(float (&c)[4], const Split<kExact> (&a)[4], const Split<kExact> (&b)[2]) {
  if constexpr (kExact) {
    mma_tf32(c, a[0].small, a[1].small, a[2].small, a[3].small, b[0].big, b[1].big);
    mma_tf32(c, a[0].big, a[1].big, a[2].big, a[3].big, b[0].small, b[1].small);
  }
  mma_tf32(c, a[0].big, a[1].big, a[2].big, a[3].big, b[0].big, b[1].big);
}

// acc (16 x 8*kN) += A (16 x kK) * B (kK x 8*kN) for one warp, where
//   A = rows [row0, row0 + 16) of a shared tile `a` (rows, pitch), columns [0, kK);
//   B[k][n] = b[n0 + n][k]: b is a shared tile whose rows are B's columns (K^T, Q^T, V^T, dO^T).
template <bool kExact, int kN, int kK, int kPitch>
__device__ __forceinline__ void mma_rows_by_transposed(float (&acc)[kN][4], const float* a, int row0, const float* b,
                                                       int n0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int k0 = 0; k0 < kK; k0 += 8) {
    const float* ar = a + (row0 + g) * kPitch + k0 + t;
    const Split<kExact> af[4] = {Split<kExact>(ar[0]), Split<kExact>(ar[8 * kPitch]), Split<kExact>(ar[4]),
                                 Split<kExact>(ar[8 * kPitch + 4])};
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const float* br = b + (n0 + 8 * n + g) * kPitch + k0 + t;
      const Split<kExact> bf[2] = {Split<kExact>(br[0]), Split<kExact>(br[4])};
      mma<kExact>(acc[n], af, bf);
    }
  }
}

// acc (16 x 8*kN) += P (16 x 8*kK8) * B (8*kK8 x 8*kN) for one warp, where
//   P is an accumulator of this warp (C layout), fed back in as described at the top;
//   B[k][n] = b[k0 + k][n], read in P's interleaved k order: b is a shared tile (rows, pitch)
//   whose rows are the sum index (keys for P*V, queries for P^T*dO).
// acc collects one such product per tile over a whole sequence. The tensor cores do not round
// each mma's sum to nearest (it is truncated), so a chain of hundreds of mmas into acc drifts:
// GPT-2's first-step gradients (1024 keys, 3xTF32) differed from PyTorch's by 4.1e-5 that way.
// Each tile's product is summed into a fresh partial instead and added to acc with ordinary
// (round-to-nearest) f32 adds, which brought that to 4.8e-6, as close as f32 products get.
template <bool kExact, int kN, int kK8, int kPitch>
__device__ __forceinline__ void mma_acc_by_interleaved(float (&acc)[kN][4], const float (&p)[kK8][4], const float* b,
                                                       int k0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  Split<kExact> af[kK8][4];
#pragma unroll
  for (int j = 0; j < kK8; ++j) {
    af[j][0] = Split<kExact>(p[j][0]);
    af[j][1] = Split<kExact>(p[j][2]);
    af[j][2] = Split<kExact>(p[j][1]);
    af[j][3] = Split<kExact>(p[j][3]);
  }
#pragma unroll
  for (int n = 0; n < kN; ++n) {
    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < kK8; ++j) {
      const float* br = b + (k0 + 8 * j + 2 * t) * kPitch + 8 * n + g;
      const Split<kExact> bf[2] = {Split<kExact>(br[0]), Split<kExact>(br[kPitch])};
      mma<kExact>(part, af[j], bf);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[n][r] += part[r];
  }
}

// Kernel arguments shared by the passes, for operands of element type T.
template <typename T>
struct ParamsOf {
  Strided<T> q, k, v, out, grad_out, grad_q, grad_k, grad_v;
  float* lse;    // (B, H, Tq) contiguous: natural-log sum of exp of the scaled, masked scores
  float* delta;  // (B, H, Tq) contiguous (backward): rowsum(dO * O)
  int heads, tq, tk, d;
  bool causal;
  float scale;       // multiplies q . k
  float scale_log2;  // scale * log2(e): scores in base 2 for exp2f
};
using Params = ParamsOf<float>;

// One step of the online softmax for a warp's 16 query rows (g and g + 8) against kN8 * 8 keys
// from k0: s (C layout) holds q . k and becomes the unnormalised probabilities exp2(x - m), with
// keys past tk or (causal) after the query masked; m (running max, base-2 scores) and l (this
// thread's share of the running sums) are updated, and alpha is what earlier partial sums and
// outputs must be multiplied by.
template <int kN8, typename T>
__device__ __forceinline__ void online_softmax_step(float (&s)[kN8][4], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                                    const ParamsOf<T>& p, int k0, int query0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kN8; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = k0 + 8 * n + 2 * t + (r & 1), query = query0 + g + 8 * (r >> 1);
      float x = s[n][r] * p.scale_log2;
      if (key >= p.tk || (p.causal && key > query)) x = -INFINITY;
      s[n][r] = x;
      tile_max[r >> 1] = fmaxf(tile_max[r >> 1], x);
    }
  }
  float base[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 1));
    tile_max[i] = fmaxf(tile_max[i], __shfl_xor_sync(0xffffffffu, tile_max[i], 2));
    const float m_new = fmaxf(m[i], tile_max[i]);
    base[i] = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet stays at zero
    alpha[i] = exp2f(m[i] - base[i]);
    m[i] = m_new;
    l[i] *= alpha[i];
  }
#pragma unroll
  for (int n = 0; n < kN8; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      s[n][r] = exp2f(s[n][r] - base[r >> 1]);  // probabilities, unnormalised
      l[r >> 1] += s[n][r];
    }
  }
}

// The row sums of the online softmax, completed across the 4 threads that share each row.
__device__ __forceinline__ void finish_row_sums(float (&l)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
  }
}

constexpr float kLog2e = 1.4426950408889634f;

// The backward's statistics of a warp's query rows query0 + g and query0 + g + 8: log-sum-exp in
// base 2 and delta, zeros past the sequence.
template <typename T>
__device__ __forceinline__ void load_row_statistics(const ParamsOf<T>& p, int bh, int query0, float (&lse2)[2],
                                                    float (&delta)[2]) {
  const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int query = query0 + g + 8 * i;
    const int64_t at = static_cast<int64_t>(bh) * p.tq + query;
    lse2[i] = query < p.tq ? p.lse[at] * kLog2e : 0.f;
    delta[i] = query < p.tq ? p.delta[at] : 0.f;
  }
}

// The dQ pass's softmax backward for a warp's query rows query0 + g and query0 + g + 8 against
// kN8 * 8 keys from k0: s (C layout) holds q . k and becomes dS = P * (dp - delta), with P
// recomputed from the base-2 log-sum-exp and masked keys (past tk or, causal, after the query) 0.
template <int kN8, typename T>
__device__ __forceinline__ void score_gradients(float (&s)[kN8][4], const float (&dp)[kN8][4], const float (&lse2)[2],
                                                const float (&delta)[2], const ParamsOf<T>& p, int k0, int query0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < kN8; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int key = k0 + 8 * n + 2 * t + (r & 1), query = query0 + g + 8 * (r >> 1);
      const bool hidden = key >= p.tk || (p.causal && key > query);
      const float prob = hidden ? 0.f : exp2f(s[n][r] * p.scale_log2 - lse2[r >> 1]);
      s[n][r] = prob * (dp[n][r] - delta[r >> 1]);
    }
  }
}

// The dK/dV pass's probabilities for a warp's key rows key0 + g and key0 + g + 8 against kN8 * 8
// queries from q0: st (C layout) holds k . q and becomes P^T = exp(scale k . q - lse[query]), with
// lse (kN8 * 8,) the queries' natural log-sum-exp and masked queries (past tq or, causal, before
// the key) 0.
template <int kN8, typename T>
__device__ __forceinline__ void transposed_probabilities(float (&st)[kN8][4], const float* lse, const ParamsOf<T>& p,
                                                         int q0, int key0) {
  const int g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
  for (int n = 0; n < kN8; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int col = 8 * n + 2 * t + (r & 1);
      const int query = q0 + col, key = key0 + g + 8 * (r >> 1);
      const bool hidden = query >= p.tq || (p.causal && key > query);
      st[n][r] = hidden ? 0.f : exp2f(st[n][r] * p.scale_log2 - lse[col] * kLog2e);
    }
  }
}

// The backward's first pass: delta[row] = sum_d grad_out[row, d] * out[row, d] in f32 (the
// softmax backward's correction term); one warp per (b, h, query) row, 16-byte loads.
template <typename T>
__global__ void attention_delta_kernel(ParamsOf<T> p, int64_t rows) {
  dependent_kernel_begin();
  constexpr int kPerLoad = 16 / static_cast<int>(sizeof(T));
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int bh = static_cast<int>(row / p.tq), query = static_cast<int>(row % p.tq);
  const int b = bh / p.heads, h = bh % p.heads;
  const T* dy = p.grad_out.row(b, h, query);  // (D,)
  const T* y = p.out.row(b, h, query);        // (D,)
  float sum = 0.f;
  for (int c = kPerLoad * (threadIdx.x & 31); c < p.d; c += 32 * kPerLoad) {
    const uint4 dy16 = *reinterpret_cast<const uint4*>(dy + c), y16 = *reinterpret_cast<const uint4*>(y + c);
    const T* dyv = reinterpret_cast<const T*>(&dy16);
    const T* yv = reinterpret_cast<const T*>(&y16);
#pragma unroll
    for (int i = 0; i < kPerLoad; ++i) sum += to_acc(dyv[i]) * to_acc(yv[i]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) p.delta[row] = sum;
}

template <typename T>
void launch_delta(const ParamsOf<T>& p, int64_t rows, cudaStream_t stream) {
  constexpr int kRowsPerBlock = 8;
  launch_dependent(attention_delta_kernel<T>, static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                   32 * kRowsPerBlock, 0, stream, p, rows);
  check_launch("flash attention backward (delta)");
}

// Launches the backward's dQ pass (a block per kTileRows queries of each (batch, head)) and its
// dK/dV pass (a block per kTileRows keys), with the shared memory each was allowed.
template <typename T, typename QKernel, typename KvKernel>
void launch_backward_passes(const ParamsOf<T>& p, int batch_heads, cudaStream_t stream, QKernel q_kernel,
                            size_t q_shared, KvKernel kv_kernel, size_t kv_shared, const char* name) {
  const int q_tiles = (p.tq + kTileRows - 1) / kTileRows, k_tiles = (p.tk + kTileRows - 1) / kTileRows;
  launch_dependent(q_kernel, q_tiles * batch_heads, kThreads, q_shared, stream, p, q_tiles);
  check_launch(name);
  launch_dependent(kv_kernel, k_tiles * batch_heads, kThreads, kv_shared, stream, p, k_tiles);
  check_launch(name);
}

// Host side: a (B, H, T, D) tensor with last stride 1 as the kernels address it.
template <typename T = float>
inline Strided<T> strided(const Tensor& x) {
  return {static_cast<T*>(x.data_ptr()), x.stride(0), x.stride(1), x.stride(2)};
}

// Lets `kernel` use `bytes` of dynamic shared memory (more than the default 48 KiB).
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  TANDEM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

template <typename T = float>
inline ParamsOf<T> make_params(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  ParamsOf<T> p{};
  p.q = strided<T>(q);
  p.k = strided<T>(k);
  p.v = strided<T>(v);
  p.heads = static_cast<int>(q.shape()[1]);
  p.tq = static_cast<int>(q.shape()[2]);
  p.tk = static_cast<int>(k.shape()[2]);
  p.d = static_cast<int>(q.shape()[3]);
  p.causal = causal;
  p.scale = static_cast<float>(scale);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  return p;
}

}  // namespace tandem::cuda::flash
