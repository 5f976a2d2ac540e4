// f32 flash attention, backward, in three launches and without atomics (so the gradients are the
// same bits on every run):
//   1. delta = rowsum(dO * O) per query (the softmax backward's correction term);
//   2. dQ: a block owns 64 queries and streams keys and values, recomputing the probabilities
//      P = exp(scale * q k^T - lse) from the forward's log-sum-exp, dS = P * (dO v^T - delta),
//      dQ = scale * dS k;
//   3. dK, dV: a block owns 64 keys and streams queries, dO, lse and delta:
//      dV = P^T dO, dK = scale * dS^T q.
// The scores are computed twice (in 2 and 3); in exchange neither pass needs atomics or a
// transpose through shared memory. Precision as in the forward (flash_attention.cuh).
#include <cmath>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/flash_attention.cuh"

namespace tandem::cuda {

namespace {

using namespace flash;

constexpr float kLog2e = 1.4426950408889634f;

// delta[row] = sum_d grad_out[row, d] * out[row, d]; one warp per (b, h, query) row.
__global__ void attention_delta_kernel(Params p, int64_t rows) {
  dependent_kernel_begin();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int bh = static_cast<int>(row / p.tq), query = static_cast<int>(row % p.tq);
  const int b = bh / p.heads, h = bh % p.heads;
  const float* dy = p.grad_out.row(b, h, query);  // (D,)
  const float* y = p.out.row(b, h, query);        // (D,)
  float sum = 0.f;
  for (int c = 4 * (threadIdx.x & 31); c < p.d; c += 128) {
    const float4 a = *reinterpret_cast<const float4*>(dy + c), o = *reinterpret_cast<const float4*>(y + c);
    sum += a.x * o.x + a.y * o.y + a.z * o.z + a.w * o.w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((threadIdx.x & 31) == 0) p.delta[row] = sum;
}

template <int kD, bool kExact>
__global__ void __launch_bounds__(kThreads) attention_grad_q_kernel(Params p, int q_tiles) {
  dependent_kernel_begin();
  constexpr int kP = pitch<kD>(), kC = inner_cols<kD>();
  extern __shared__ float4 shared_memory[];
  float* sq = reinterpret_cast<float*>(shared_memory);  // (64, kP) this block's queries
  float* sdo = sq + kTileRows * kP;                      // (64, kP) their output gradients
  float* sk = sdo + kTileRows * kP;                      // (kC, kP) keys of the current tile
  float* sv = sk + kC * kP;                              // (kC, kP) values of the current tile

  const int batch_heads = gridDim.x / q_tiles;
  const int bh = blockIdx.x % batch_heads, tile = q_tiles - 1 - blockIdx.x / batch_heads;
  const int b = bh / p.heads, h = bh % p.heads, q0 = tile * kTileRows;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int row0 = 16 * warp;
  load_tile<kD>(sq, p.q, b, h, q0, kTileRows, p.tq, p.d);
  load_tile<kD>(sdo, p.grad_out, b, h, q0, kTileRows, p.tq, p.d);
  float lse2[2], delta[2];  // rows g and g + 8: log-sum-exp in base 2, and delta
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int query = q0 + row0 + g + 8 * i;
    const int64_t at = static_cast<int64_t>(bh) * p.tq + query;
    lse2[i] = query < p.tq ? p.lse[at] * kLog2e : 0.f;
    delta[i] = query < p.tq ? p.delta[at] : 0.f;
  }

  float dq[kD / 8][4] = {};  // (16, kD)
  const int k_end = p.causal ? min(p.tk, q0 + kTileRows) : p.tk;
  for (int k0 = 0; k0 < k_end; k0 += kC) {
    __syncthreads();
    load_tile<kD>(sk, p.k, b, h, k0, kC, p.tk, p.d);
    load_tile<kD>(sv, p.v, b, h, k0, kC, p.tk, p.d);
    __syncthreads();
    if (p.causal && k0 > q0 + row0 + 15) continue;

    float s[kC / 8][4] = {};   // (16, kC) scores, then dS
    float dp[kC / 8][4] = {};  // (16, kC) dO v^T
    mma_rows_by_transposed<kExact, kC / 8, kD, kP>(s, sq, row0, sk, 0);
    mma_rows_by_transposed<kExact, kC / 8, kD, kP>(dp, sdo, row0, sv, 0);
#pragma unroll
    for (int n = 0; n < kC / 8; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = k0 + 8 * n + 2 * t + (r & 1), query = q0 + row0 + g + 8 * (r >> 1);
        const bool hidden = key >= p.tk || (p.causal && key > query);
        const float prob = hidden ? 0.f : exp2f(s[n][r] * p.scale_log2 - lse2[r >> 1]);
        s[n][r] = prob * (dp[n][r] - delta[r >> 1]);
      }
    }
    mma_acc_by_interleaved<kExact, kD / 8, kC / 8, kP>(dq, s, sk, 0);
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int query = q0 + row0 + g + 8 * i;
    if (query >= p.tq) continue;
    float* row = p.grad_q.row(b, h, query);  // (D,)
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      const int col = 8 * n + 2 * t;
      if (col < p.d) *reinterpret_cast<float2*>(row + col) = make_float2(dq[n][2 * i] * p.scale, dq[n][2 * i + 1] * p.scale);
    }
  }
}

template <int kD, bool kExact>
__global__ void __launch_bounds__(kThreads) attention_grad_kv_kernel(Params p, int k_tiles) {
  dependent_kernel_begin();
  constexpr int kP = pitch<kD>(), kC = inner_cols<kD>();
  extern __shared__ float4 shared_memory[];
  float* sk = reinterpret_cast<float*>(shared_memory);  // (64, kP) this block's keys
  float* sv = sk + kTileRows * kP;                       // (64, kP) their values
  float* sq = sv + kTileRows * kP;                       // (kC, kP) queries of the current tile
  float* sdo = sq + kC * kP;                             // (kC, kP) their output gradients
  float* slse = sdo + kC * kP;                           // (kC,) their log-sum-exp, base 2
  float* sdelta = slse + kC;                             // (kC,) their delta

  // Causal blocks with more queries to visit (the first key tiles) start first.
  const int batch_heads = gridDim.x / k_tiles;
  const int bh = blockIdx.x % batch_heads, tile = blockIdx.x / batch_heads;
  const int b = bh / p.heads, h = bh % p.heads, k0 = tile * kTileRows;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int row0 = 16 * warp;
  load_tile<kD>(sk, p.k, b, h, k0, kTileRows, p.tk, p.d);
  load_tile<kD>(sv, p.v, b, h, k0, kTileRows, p.tk, p.d);

  float dk[kD / 8][4] = {};  // (16, kD)
  float dv[kD / 8][4] = {};  // (16, kD)
  for (int q0 = p.causal ? k0 : 0; q0 < p.tq; q0 += kC) {
    __syncthreads();
    load_tile<kD>(sq, p.q, b, h, q0, kC, p.tq, p.d);
    load_tile<kD>(sdo, p.grad_out, b, h, q0, kC, p.tq, p.d);
    for (int i = threadIdx.x; i < kC; i += kThreads) {
      const int64_t at = static_cast<int64_t>(bh) * p.tq + q0 + i;
      slse[i] = q0 + i < p.tq ? p.lse[at] * kLog2e : 0.f;
      sdelta[i] = q0 + i < p.tq ? p.delta[at] : 0.f;
    }
    __syncthreads();
    if (p.causal && q0 + kC - 1 < k0 + row0) continue;  // every query of the tile is before this warp's keys

    float st[kC / 8][4] = {};   // (16 keys, kC queries) scores, then P^T, then dS^T
    float dpt[kC / 8][4] = {};  // (16, kC) v dO^T
    mma_rows_by_transposed<kExact, kC / 8, kD, kP>(st, sk, row0, sq, 0);
#pragma unroll
    for (int n = 0; n < kC / 8; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int col = 8 * n + 2 * t + (r & 1);
        const int query = q0 + col, key = k0 + row0 + g + 8 * (r >> 1);
        const bool hidden = query >= p.tq || (p.causal && key > query);
        st[n][r] = hidden ? 0.f : exp2f(st[n][r] * p.scale_log2 - slse[col]);
      }
    }
    mma_acc_by_interleaved<kExact, kD / 8, kC / 8, kP>(dv, st, sdo, 0);
    mma_rows_by_transposed<kExact, kC / 8, kD, kP>(dpt, sv, row0, sdo, 0);
#pragma unroll
    for (int n = 0; n < kC / 8; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) st[n][r] *= dpt[n][r] - sdelta[8 * n + 2 * t + (r & 1)];
    }
    mma_acc_by_interleaved<kExact, kD / 8, kC / 8, kP>(dk, st, sq, 0);
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = k0 + row0 + g + 8 * i;
    if (key >= p.tk) continue;
    float* dk_row = p.grad_k.row(b, h, key);  // (D,)
    float* dv_row = p.grad_v.row(b, h, key);  // (D,)
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      const int col = 8 * n + 2 * t;
      if (col >= p.d) continue;
      *reinterpret_cast<float2*>(dk_row + col) = make_float2(dk[n][2 * i] * p.scale, dk[n][2 * i + 1] * p.scale);
      *reinterpret_cast<float2*>(dv_row + col) = make_float2(dv[n][2 * i], dv[n][2 * i + 1]);
    }
  }
}

template <int kD, bool kExact>
void launch_backward(const Params& p, int batch_heads, cudaStream_t stream) {
  constexpr int kC = inner_cols<kD>();
  const size_t q_shared = static_cast<size_t>(2 * kTileRows + 2 * kC) * pitch<kD>() * sizeof(float);
  const size_t kv_shared = q_shared + 2 * kC * sizeof(float);
  static const bool configured = [&] {
    allow_shared(attention_grad_q_kernel<kD, kExact>, q_shared);
    allow_shared(attention_grad_kv_kernel<kD, kExact>, kv_shared);
    return true;
  }();
  (void)configured;
  const int q_tiles = (p.tq + kTileRows - 1) / kTileRows, k_tiles = (p.tk + kTileRows - 1) / kTileRows;
  launch_dependent(attention_grad_q_kernel<kD, kExact>, q_tiles * batch_heads, kThreads, q_shared, stream, p, q_tiles);
  check_launch("flash_attention_backward (dq)");
  launch_dependent(attention_grad_kv_kernel<kD, kExact>, k_tiles * batch_heads, kThreads, kv_shared, stream, p,
                   k_tiles);
  check_launch("flash_attention_backward (dk, dv)");
}

template <bool kExact>
void launch_backward_for(const Params& p, int batch_heads, cudaStream_t stream) {
  if (p.d <= 32) launch_backward<32, kExact>(p, batch_heads, stream);
  else if (p.d <= 64) launch_backward<64, kExact>(p, batch_heads, stream);
  else launch_backward<128, kExact>(p, batch_heads, stream);
}

}  // namespace

void flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, bool causal, double scale) {
  NvtxRange range("flash_attention_backward");
  const int device = q.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = stream_of(q);
  const Shape& s = q.shape();
  Tensor delta = empty({s[0], s[1], s[2]}, TensorOptions(DType::f32, q.device()));  // (B, H, Tq)
  Params p = make_params(q, k, v, causal, scale);
  p.out = strided(out);
  p.grad_out = strided(grad_out);
  p.grad_q = strided(grad_q);
  p.grad_k = strided(grad_k);
  p.grad_v = strided(grad_v);
  p.lse = device_ptr<float>(lse);
  p.delta = device_ptr<float>(delta);

  const int64_t rows = s[0] * s[1] * s[2];
  constexpr int kRowsPerBlock = 8;
  void (*delta_kernel)(Params, int64_t) = attention_delta_kernel;  // the f32 one, not the 16-bit template
  launch_dependent(delta_kernel, static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock), 32 * kRowsPerBlock,
                   0, stream, p, rows);
  check_launch("flash_attention_backward (delta)");
  const int batch_heads = static_cast<int>(s[0] * s[1]);
  if (matmul_precision() == MatmulPrecision::high) launch_backward_for<false>(p, batch_heads, stream);
  else launch_backward_for<true>(p, batch_heads, stream);
}

}  // namespace tandem::cuda
