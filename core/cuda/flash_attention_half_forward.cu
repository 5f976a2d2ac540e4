// 16-bit (bf16, f16) flash attention, forward: out = softmax(scale * q k^T [+ causal mask]) v
// without the (Tq x Tk) matrix in memory, on the tensor cores (flash_attention_half.cuh). A block
// owns 128 queries of one (batch, head), four warps of 32 (64 queries, warps of 16, at head dim
// 128, for registers); keys and values stream through shared memory 64 at a time, the next tile loading (cp.async) while the current one is used. Scores,
// the online softmax's statistics and the output accumulate in f32; the probabilities are rounded
// to the 16-bit type for the P v product, as in FlashAttention. Writes the output and each
// query's f32 log-sum-exp, the same quantity as the f32 kernels and cuDNN's "stats", so either
// backward can follow either forward.
#include <cmath>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/flash_attention_half.cuh"

namespace tandem::cuda {

namespace {

using namespace flash16;

constexpr int kKeyCols = 64;  // keys per streamed tile

// 16-row tiles each warp owns: 2 (a block of 128 queries, each key tile read from shared memory
// for twice as many queries) where registers allow, 1 (64 queries) at head dim 128.
template <int kD>
constexpr int warp_row_tiles() {
  return kD <= 64 ? 2 : 1;
}

template <int kD>
constexpr int query_rows() {
  return 16 * flash::kWarps * warp_row_tiles<kD>();
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) attention_half_forward_kernel(ParamsOf<T> p, int q_tiles) {
  dependent_kernel_begin();
  constexpr int kP = pitch<kD>(), kC = kKeyCols, kM = warp_row_tiles<kD>(), kRows = query_rows<kD>();
  extern __shared__ float4 shared_memory[];
  T* sq = reinterpret_cast<T*>(shared_memory);  // (kRows, kP) this block's queries
  T* sk = sq + kRows * kP;                       // (2, kC, kP) keys, double-buffered
  T* sv = sk + 2 * kC * kP;                      // (2, kC, kP) values, double-buffered

  // Causal blocks with more keys to visit (the last query tiles) start first.
  const int batch_heads = gridDim.x / q_tiles;
  const int bh = blockIdx.x % batch_heads, tile = q_tiles - 1 - blockIdx.x / batch_heads;
  const int b = bh / p.heads, h = bh % p.heads, q0 = tile * kRows;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int warp_row0 = 16 * kM * warp;  // this warp's tile i has rows warp_row0 + 16i + g and + 8
  const int k_end = p.causal ? min(p.tk, q0 + kRows) : p.tk;  // later keys are masked for all
  const int key_tiles = (k_end + kC - 1) / kC;

  auto load_keys = [=](int j) {  // key tile j into buffer j % 2
    load_tile_async<kD>(sk + (j & 1) * kC * kP, p.k, b, h, j * kC, kC, p.tk, p.d);
    load_tile_async<kD>(sv + (j & 1) * kC * kP, p.v, b, h, j * kC, kC, p.tk, p.d);
  };
  load_tile_async<kD>(sq, p.q, b, h, q0, kRows, p.tq, p.d);
  load_keys(0);
  cp_async_commit();

  float o[kM][kD / 8][4] = {};  // (16, kD) unnormalised output rows of each tile
  float m[kM][2];               // running max of each tile's rows g and g + 8 (base-2 scores)
  float l[kM][2] = {};          // this thread's share of their running sums
#pragma unroll
  for (int i = 0; i < kM; ++i) m[i][0] = m[i][1] = -INFINITY;
  for (int j = 0; j < key_tiles; ++j) {
    const int k0 = j * kC;
    prefetch_next_and_wait(j, key_tiles, load_keys);  // the next tile loads while this one is used
    const T* keys = sk + (j & 1) * kC * kP;    // (kC, kP)
    const T* values = sv + (j & 1) * kC * kP;  // (kC, kP)
#pragma unroll
    for (int i = 0; i < kM; ++i) {
      const int row0 = warp_row0 + 16 * i;
      if (p.causal && k0 > q0 + row0 + 15) continue;  // every key of the tile is after these queries
      float s[kC / 8][4] = {};                         // (16, kC) scores, then probabilities
      mma_rows_by_transposed<T, kC / 8, kD, kP>(s, sq, row0, keys);
      float alpha[2];
      flash::online_softmax_step<kC / 8>(s, m[i], l[i], alpha, p, k0, q0 + row0);
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) o[i][n][r] *= alpha[r >> 1];
      }
      mma_acc_by_rows<T, kD / 8, kC / 8, kP>(o[i], s, values);
    }
    __syncthreads();  // every warp is done with this buffer before it is loaded again
  }

#pragma unroll
  for (int i = 0; i < kM; ++i) {
    flash::finish_row_sums(l[i]);
    T* rows[2];
    float inv[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int query = q0 + warp_row0 + 16 * i + g + 8 * half;
      rows[half] = query < p.tq ? p.out.row(b, h, query) : nullptr;
      inv[half] = 1.f / l[i][half];
      if (t == 0 && query < p.tq) {
        p.lse[static_cast<int64_t>(bh) * p.tq + query] = (m[i][half] + log2f(l[i][half])) * 0.69314718056f;
      }
    }
    store_rows<T, kD / 8>(o[i], rows, inv, p.d);
  }
}

template <typename T, int kD>
void launch_forward(const ParamsOf<T>& p, int batch_heads, cudaStream_t stream) {
  constexpr int kRows = query_rows<kD>();
  const size_t shared = static_cast<size_t>(kRows + 4 * kKeyCols) * pitch<kD>() * sizeof(T);
  static const bool configured = (flash::allow_shared(attention_half_forward_kernel<T, kD>, shared), true);
  (void)configured;
  const int q_tiles = (p.tq + kRows - 1) / kRows;
  launch_dependent(attention_half_forward_kernel<T, kD>, q_tiles * batch_heads, kThreads, shared, stream, p, q_tiles);
}

template <typename T>
void launch_forward_for(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        bool causal, double scale) {
  ParamsOf<T> p = flash::make_params<T>(q, k, v, causal, scale);
  p.out = flash::strided<T>(out);
  p.lse = device_ptr<float>(lse);
  const int batch_heads = static_cast<int>(q.shape()[0] * q.shape()[1]);
  cudaStream_t stream = stream_of(q);
  if (p.d <= 32) launch_forward<T, 32>(p, batch_heads, stream);
  else if (p.d <= 64) launch_forward<T, 64>(p, batch_heads, stream);
  else launch_forward<T, 128>(p, batch_heads, stream);
}

}  // namespace

void flash_attention_half_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, bool causal, double scale) {
  NvtxRange range("flash_attention_half_forward");
  DeviceGuard guard(q.device().index);
  if (q.dtype() == DType::bf16) launch_forward_for<__nv_bfloat16>(q, k, v, out, lse, causal, scale);
  else launch_forward_for<__half>(q, k, v, out, lse, causal, scale);
  check_launch("flash_attention_half_forward");
}

}  // namespace tandem::cuda
