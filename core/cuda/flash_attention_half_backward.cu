// 16-bit (bf16, f16) flash attention, backward, in three launches and without atomics (so the
// gradients are the same bits on every run), as the f32 backward (flash_attention_backward.cu):
//   1. delta = rowsum(dO * O) per query, in f32;
//   2. dQ: a block owns 64 queries and streams keys and values, recomputing the probabilities
//      P = exp(scale * q k^T - lse) from the forward's log-sum-exp, dS = P * (dO v^T - delta),
//      dQ = scale * dS k;
//   3. dK, dV: a block owns 64 keys and streams queries, dO, lse and delta:
//      dV = P^T dO, dK = scale * dS^T q.
// Streamed tiles are double-buffered (cp.async); products on the tensor cores with f32
// accumulators (flash_attention_half.cuh); P and dS are rounded to the 16-bit type as operands
// of the next product, as in FlashAttention. The gradients are written in (B, T, H, D) memory
// like cuDNN's.
#include <cmath>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/common.cuh"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/flash_attention_half.cuh"

namespace tandem::cuda {

namespace {

using namespace flash16;

// Rows streamed per tile: 64, or 32 where kD = 128 (the dK and dV accumulators take 128
// registers per thread there).
template <int kD>
constexpr int streamed_rows() {
  return kD <= 64 ? 64 : 32;
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) attention_half_grad_q_kernel(ParamsOf<T> p, int q_tiles) {
  dependent_kernel_begin();
  constexpr int kP = pitch<kD>(), kC = streamed_rows<kD>();
  extern __shared__ float4 shared_memory[];
  T* sq = reinterpret_cast<T*>(shared_memory);  // (64, kP) this block's queries
  T* sdo = sq + kTileRows * kP;                  // (64, kP) their output gradients
  T* sk = sdo + kTileRows * kP;                  // (2, kC, kP) keys, double-buffered
  T* sv = sk + 2 * kC * kP;                      // (2, kC, kP) values, double-buffered

  const int batch_heads = gridDim.x / q_tiles;
  const int bh = blockIdx.x % batch_heads, tile = q_tiles - 1 - blockIdx.x / batch_heads;
  const int b = bh / p.heads, h = bh % p.heads, q0 = tile * kTileRows;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  const int row0 = 16 * warp;
  const int k_end = p.causal ? min(p.tk, q0 + kTileRows) : p.tk;
  const int key_tiles = (k_end + kC - 1) / kC;

  auto load_keys = [=](int j) {  // key tile j into buffer j % 2
    load_tile_async<kD>(sk + (j & 1) * kC * kP, p.k, b, h, j * kC, kC, p.tk, p.d);
    load_tile_async<kD>(sv + (j & 1) * kC * kP, p.v, b, h, j * kC, kC, p.tk, p.d);
  };
  load_tile_async<kD>(sq, p.q, b, h, q0, kTileRows, p.tq, p.d);
  load_tile_async<kD>(sdo, p.grad_out, b, h, q0, kTileRows, p.tq, p.d);
  load_keys(0);
  cp_async_commit();
  float lse2[2], delta[2];  // rows g and g + 8: log-sum-exp in base 2, and delta
  flash::load_row_statistics(p, bh, q0 + row0, lse2, delta);

  float dq[kD / 8][4] = {};  // (16, kD)
  for (int j = 0; j < key_tiles; ++j) {
    const int k0 = j * kC;
    prefetch_next_and_wait(j, key_tiles, load_keys);
    const T* keys = sk + (j & 1) * kC * kP;    // (kC, kP)
    const T* values = sv + (j & 1) * kC * kP;  // (kC, kP)
    if (!p.causal || k0 <= q0 + row0 + 15) {
      float s[kC / 8][4] = {};   // (16, kC) scores, then dS
      float dp[kC / 8][4] = {};  // (16, kC) dO v^T
      mma_rows_by_transposed<T, kC / 8, kD, kP>(s, sq, row0, keys);
      mma_rows_by_transposed<T, kC / 8, kD, kP>(dp, sdo, row0, values);
      flash::score_gradients(s, dp, lse2, delta, p, k0, q0 + row0);
      mma_acc_by_rows<T, kD / 8, kC / 8, kP>(dq, s, keys);
    }
    __syncthreads();
  }

  T* rows[2];
  const float scale[2] = {p.scale, p.scale};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int query = q0 + row0 + g + 8 * i;
    rows[i] = query < p.tq ? p.grad_q.row(b, h, query) : nullptr;
  }
  store_rows<T, kD / 8>(dq, rows, scale, p.d);
}

template <typename T, int kD>
__global__ void __launch_bounds__(kThreads) attention_half_grad_kv_kernel(ParamsOf<T> p, int k_tiles) {
  dependent_kernel_begin();
  constexpr int kP = pitch<kD>(), kC = streamed_rows<kD>();
  extern __shared__ float4 shared_memory[];
  T* sk = reinterpret_cast<T*>(shared_memory);  // (64, kP) this block's keys
  T* sv = sk + kTileRows * kP;                   // (64, kP) their values
  T* sq = sv + kTileRows * kP;                   // (2, kC, kP) queries, double-buffered
  T* sdo = sq + 2 * kC * kP;                     // (2, kC, kP) their output gradients
  float* slse = reinterpret_cast<float*>(sdo + 2 * kC * kP);  // (2, kC) their log-sum-exp
  float* sdelta = slse + 2 * kC;                              // (2, kC) their delta

  // Causal blocks with more queries to visit (the first key tiles) start first.
  const int batch_heads = gridDim.x / k_tiles;
  const int bh = blockIdx.x % batch_heads, tile = blockIdx.x / batch_heads;
  const int b = bh / p.heads, h = bh % p.heads, k0 = tile * kTileRows;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
  const int row0 = 16 * warp;
  const int q_begin = p.causal ? k0 : 0;  // earlier queries see none of these keys
  const int query_tiles = (p.tq - q_begin + kC - 1) / kC;

  auto load_queries = [=](int j) {  // query tile j into buffer j % 2
    const int buffer = j & 1, q0 = q_begin + j * kC;
    load_tile_async<kD>(sq + buffer * kC * kP, p.q, b, h, q0, kC, p.tq, p.d);
    load_tile_async<kD>(sdo + buffer * kC * kP, p.grad_out, b, h, q0, kC, p.tq, p.d);
    load_row_async(slse + buffer * kC, p.lse, bh, p.tq, q0, kC);
    load_row_async(sdelta + buffer * kC, p.delta, bh, p.tq, q0, kC);
  };
  load_tile_async<kD>(sk, p.k, b, h, k0, kTileRows, p.tk, p.d);
  load_tile_async<kD>(sv, p.v, b, h, k0, kTileRows, p.tk, p.d);
  load_queries(0);
  cp_async_commit();

  float dk[kD / 8][4] = {};  // (16, kD)
  float dv[kD / 8][4] = {};  // (16, kD)
  for (int j = 0; j < query_tiles; ++j) {
    const int q0 = q_begin + j * kC;
    prefetch_next_and_wait(j, query_tiles, load_queries);
    const T* queries = sq + (j & 1) * kC * kP;  // (kC, kP)
    const T* grads = sdo + (j & 1) * kC * kP;   // (kC, kP)
    const float* lse = slse + (j & 1) * kC;     // (kC,)
    const float* delta = sdelta + (j & 1) * kC;  // (kC,)
    if (!p.causal || q0 + kC - 1 >= k0 + row0) {  // else every query of the tile is before this warp's keys
      float st[kC / 8][4] = {};   // (16 keys, kC queries) scores, then P^T, then dS^T
      float dpt[kC / 8][4] = {};  // (16, kC) v dO^T
      mma_rows_by_transposed<T, kC / 8, kD, kP>(st, sk, row0, queries);
      flash::transposed_probabilities(st, lse, p, q0, k0 + row0);
      mma_acc_by_rows<T, kD / 8, kC / 8, kP>(dv, st, grads);
      mma_rows_by_transposed<T, kC / 8, kD, kP>(dpt, sv, row0, grads);
#pragma unroll
      for (int n = 0; n < kC / 8; ++n) {
#pragma unroll
        for (int r = 0; r < 4; ++r) st[n][r] *= dpt[n][r] - delta[8 * n + 2 * t + (r & 1)];
      }
      mma_acc_by_rows<T, kD / 8, kC / 8, kP>(dk, st, queries);
    }
    __syncthreads();
  }

  T* dk_rows[2];
  T* dv_rows[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int key = k0 + row0 + g + 8 * i;
    dk_rows[i] = key < p.tk ? p.grad_k.row(b, h, key) : nullptr;
    dv_rows[i] = key < p.tk ? p.grad_v.row(b, h, key) : nullptr;
  }
  const float scale[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
  store_rows<T, kD / 8>(dk, dk_rows, scale, p.d);
  store_rows<T, kD / 8>(dv, dv_rows, one, p.d);
}

template <typename T, int kD>
void launch_backward(const ParamsOf<T>& p, int batch_heads, cudaStream_t stream) {
  constexpr int kC = streamed_rows<kD>();
  const size_t tiles_shared = static_cast<size_t>(2 * kTileRows + 4 * kC) * pitch<kD>() * sizeof(T);
  const size_t kv_shared = tiles_shared + 4 * kC * sizeof(float);
  static const bool configured = [&] {
    flash::allow_shared(attention_half_grad_q_kernel<T, kD>, tiles_shared);
    flash::allow_shared(attention_half_grad_kv_kernel<T, kD>, kv_shared);
    return true;
  }();
  (void)configured;
  flash::launch_backward_passes(p, batch_heads, stream, attention_half_grad_q_kernel<T, kD>, tiles_shared,
                                attention_half_grad_kv_kernel<T, kD>, kv_shared, "flash_attention_half_backward");
}

template <typename T>
void launch_backward_for(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                         const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                         bool causal, double scale) {
  const Shape& s = q.shape();
  Tensor delta = empty({s[0], s[1], s[2]}, TensorOptions(DType::f32, q.device()));  // (B, H, Tq)
  ParamsOf<T> p = flash::make_params<T>(q, k, v, causal, scale);
  p.out = flash::strided<T>(out);
  p.grad_out = flash::strided<T>(grad_out);
  p.grad_q = flash::strided<T>(grad_q);
  p.grad_k = flash::strided<T>(grad_k);
  p.grad_v = flash::strided<T>(grad_v);
  p.lse = device_ptr<float>(lse);
  p.delta = device_ptr<float>(delta);
  cudaStream_t stream = stream_of(q);
  flash::launch_delta(p, s[0] * s[1] * s[2], stream);
  const int batch_heads = static_cast<int>(s[0] * s[1]);
  if (p.d <= 32) launch_backward<T, 32>(p, batch_heads, stream);
  else if (p.d <= 64) launch_backward<T, 64>(p, batch_heads, stream);
  else launch_backward<T, 128>(p, batch_heads, stream);
}

}  // namespace

void flash_attention_half_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                                   const Tensor& grad_v, bool causal, double scale) {
  NvtxRange range("flash_attention_half_backward");
  DeviceGuard guard(q.device().index);
  if (q.dtype() == DType::bf16) launch_backward_for<__nv_bfloat16>(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v, causal, scale);
  else launch_backward_for<__half>(grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v, causal, scale);
}

}  // namespace tandem::cuda
