// f32 flash attention, forward: out = softmax(scale * q k^T [+ causal mask]) v without the
// (Tq x Tk) matrix in memory. A block owns 64 queries of one (batch, head), four warps of 16; it
// streams the keys and values through shared memory a tile at a time, keeping each query's running
// maximum and sum (the online softmax), and writes the output and each query's log-sum-exp, which
// the backward uses to recompute the probabilities. Matrix products on the tensor cores in TF32
// or, under MatmulPrecision::highest, in 3xTF32 (flash_attention.cuh).
#include <cmath>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/flash_attention.cuh"

namespace tandem::cuda {

namespace {

using namespace flash;

template <int kD, bool kExact>
__global__ void __launch_bounds__(kThreads) attention_forward_kernel(Params p, int q_tiles) {
  dependent_kernel_begin();
  constexpr int kP = pitch<kD>(), kC = inner_cols<kD>();
  extern __shared__ float4 shared_memory[];
  float* sq = reinterpret_cast<float*>(shared_memory);  // (64, kP) this block's queries
  float* sk = sq + kTileRows * kP;                       // (kC, kP) keys of the current tile
  float* sv = sk + kC * kP;                              // (kC, kP) values of the current tile

  // Causal blocks with more keys to visit (the last query tiles) start first.
  const int batch_heads = gridDim.x / q_tiles;
  const int bh = blockIdx.x % batch_heads, tile = q_tiles - 1 - blockIdx.x / batch_heads;
  const int b = bh / p.heads, h = bh % p.heads, q0 = tile * kTileRows;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int row0 = 16 * warp;  // this warp's rows in the tile: row0 + g and row0 + g + 8
  load_tile<kD>(sq, p.q, b, h, q0, kTileRows, p.tq, p.d);

  float o[kD / 8][4] = {};                    // (16, kD) unnormalised output rows
  float m[2] = {-INFINITY, -INFINITY};        // running max of rows g and g + 8 (base-2 scores)
  float l[2] = {0.f, 0.f};                    // this thread's share of their running sums
  const int k_end = p.causal ? min(p.tk, q0 + kTileRows) : p.tk;
  for (int k0 = 0; k0 < k_end; k0 += kC) {
    __syncthreads();  // every warp is done with the previous tile
    load_tile<kD>(sk, p.k, b, h, k0, kC, p.tk, p.d);
    load_tile<kD>(sv, p.v, b, h, k0, kC, p.tk, p.d);
    __syncthreads();
    if (p.causal && k0 > q0 + row0 + 15) continue;  // every key of the tile is after this warp's queries

    float s[kC / 8][4] = {};  // (16, kC) scores
    mma_rows_by_transposed<kExact, kC / 8, kD, kP>(s, sq, row0, sk, 0);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kC / 8; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int key = k0 + 8 * n + 2 * t + (r & 1), query = q0 + row0 + g + 8 * (r >> 1);
        float x = s[n][r] * p.scale_log2;
        if (key >= p.tk || (p.causal && key > query)) x = -INFINITY;
        s[n][r] = x;
        tile_max[r >> 1] = fmaxf(tile_max[r >> 1], x);
      }
    }
    float alpha[2], base[2];
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
    for (int n = 0; n < kC / 8; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        s[n][r] = exp2f(s[n][r] - base[r >> 1]);  // probabilities, unnormalised
        l[r >> 1] += s[n][r];
      }
    }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
      for (int r = 0; r < 4; ++r) o[n][r] *= alpha[r >> 1];
    }
    mma_acc_by_interleaved<kExact, kD / 8, kC / 8, kP>(o, s, sv, 0);
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const int query = q0 + row0 + g + 8 * i;
    if (query >= p.tq) continue;
    const float inv = 1.f / l[i];
    float* out_row = p.out.row(b, h, query);  // (D,)
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      const int col = 8 * n + 2 * t;
      if (col < p.d) *reinterpret_cast<float2*>(out_row + col) = make_float2(o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
    if (t == 0) p.lse[(static_cast<int64_t>(bh)) * p.tq + query] = (m[i] + log2f(l[i])) * 0.69314718056f;
  }
}

template <int kD, bool kExact>
void launch_forward(const Params& p, int batch_heads, cudaStream_t stream) {
  constexpr int kC = inner_cols<kD>();
  const size_t shared = static_cast<size_t>(kTileRows + 2 * kC) * pitch<kD>() * sizeof(float);
  static const bool configured = (allow_shared(attention_forward_kernel<kD, kExact>, shared), true);
  (void)configured;
  const int q_tiles = (p.tq + kTileRows - 1) / kTileRows;
  launch_dependent(attention_forward_kernel<kD, kExact>, q_tiles * batch_heads, kThreads, shared, stream, p, q_tiles);
}

template <bool kExact>
void launch_forward_for(const Params& p, int batch_heads, cudaStream_t stream) {
  if (p.d <= 32) launch_forward<32, kExact>(p, batch_heads, stream);
  else if (p.d <= 64) launch_forward<64, kExact>(p, batch_heads, stream);
  else launch_forward<128, kExact>(p, batch_heads, stream);
}

}  // namespace

bool flash_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t d = q.shape()[3];
  return q.dtype() == DType::f32 && k.dtype() == DType::f32 && v.dtype() == DType::f32 && d % 4 == 0 && d <= 128 &&
         q.shape()[2] > 0 && k.shape()[2] > 0;
}

void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             bool causal, double scale) {
  NvtxRange range("flash_attention_forward");
  const int device = q.device().index;
  DeviceGuard guard(device);
  Params p = make_params(q, k, v, causal, scale);
  p.out = strided(out);
  p.lse = device_ptr<float>(lse);
  const int batch_heads = static_cast<int>(q.shape()[0] * q.shape()[1]);
  if (matmul_precision() == MatmulPrecision::high) launch_forward_for<false>(p, batch_heads, stream_of(q));
  else launch_forward_for<true>(p, batch_heads, stream_of(q));
  check_launch("flash_attention_forward");
}

}  // namespace tandem::cuda
