#pragma once
// Pieces shared by tandem's 16-bit (bf16, f16) flash-attention kernels
// (flash_attention_half_forward.cu, flash_attention_half_backward.cu): asynchronous tile loads
// into shared memory (cp.async), fragment loads (ldmatrix) and warp-level products on the tensor
// cores (mma.sync m16n8k16, 16-bit operands, f32 accumulators).
//
// Fragments of one m16n8k16 mma (g = lane / 4, t = lane % 4; each register holds two 16-bit
// values, the lower column in the low half):
//   A (16 x 16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16 x 8, k x n):      b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16 x 8, f32):        c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// Two neighbouring C tiles (columns 8j and 8j + 8) are, rounded to 16 bits and paired, exactly
// the A fragment of the 16 columns they cover, so the probabilities (and dS) go from one product
// into the next in registers. B comes from a row-major tile with ldmatrix: without .trans when the
// tile's rows are B's columns (K for q k^T), with .trans when its rows are B's rows (V for P v).
//
// Shared-memory tiles have a pitch of kD + 8 elements: 16 bytes of padding make the eight 16-byte
// rows of every ldmatrix matrix fall in different banks (kD / 8 + 1 is odd for kD = 32, 64, 128).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "tandem/core/cuda/flash_attention.cuh"

namespace tandem::cuda::flash16 {

using flash::kThreads;
using flash::kTileRows;  // rows (queries or keys) a block owns, 16 per warp
using flash::ParamsOf;
using flash::Strided;

template <int kD>
constexpr int pitch() {
  return kD + 8;
}

// ---- asynchronous copies into shared memory ----
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes from global to shared memory, or 16 zero bytes where !valid (src is not read then).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}

// 4 bytes, or zeros where !valid.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// Before a kernel uses streamed tile j of `tiles`: starts loading tile j + 1 into the other buffer
// (load(j + 1)), waits for tile j, and makes it visible to the whole block.
template <typename Load>
__device__ __forceinline__ void prefetch_next_and_wait(int j, int tiles, Load load) {
  if (j + 1 < tiles) {
    load(j + 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
}

// Starts loading rows [row0, row0 + rows) of one (b, h) slice of x (T, D) into tile (rows, pitch):
// rows past T and columns past D become zeros (D % 8 == 0, rows 16-byte aligned).
template <int kD, typename T>
__device__ __forceinline__ void load_tile_async(T* tile, const Strided<T>& x, int b, int h, int row0, int rows,
                                                int t_len, int d) {
  constexpr int kVectors = kD / 8;
  for (int i = threadIdx.x; i < rows * kVectors; i += kThreads) {
    const int r = i / kVectors, c = 8 * (i % kVectors);
    const bool valid = row0 + r < t_len && c < d;
    cp_async_16(tile + r * pitch<kD>() + c, valid ? x.row(b, h, row0 + r) + c : x.data, valid);
  }
}

// Starts loading values [i0, i0 + n) of one (b, h) row of a (B, H, T) f32 array (lse, delta)
// into shared memory; values past T become zeros.
__device__ __forceinline__ void load_row_async(float* dst, const float* src, int64_t bh, int t_len, int i0, int n) {
  for (int i = threadIdx.x; i < n; i += kThreads) {
    const bool valid = i0 + i < t_len;
    cp_async_4(dst + i, valid ? src + bh * t_len + i0 + i : src, valid);
  }
}

// ---- fragments and products ----
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(p)));
}

// c += a * b for one 16 x 8 x 16 step.
template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two f32 values rounded to T (nearest) and packed, lo in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// acc (16 x 8*kN8) += A (16 x kK) * B (kK x 8*kN8) for one warp, where
//   A = rows [row0, row0 + 16) of a shared tile `a` (rows, kPitch), columns [0, kK);
//   B[k][n] = b[n][k]: b is a shared tile (8*kN8, kPitch) whose rows are B's columns.
template <typename T, int kN8, int kK, int kPitch>
__device__ __forceinline__ void mma_rows_by_transposed(float (&acc)[kN8][4], const T* a, int row0, const T* b) {
  static_assert(kN8 % 2 == 0 && kK % 16 == 0, "tiles of 16 columns and 16 rows");
  const int lane = threadIdx.x & 31, matrix = lane >> 3, r = lane & 7;
#pragma unroll
  for (int k0 = 0; k0 < kK; k0 += 16) {
    uint32_t af[4];  // matrices: rows +0/+8 of columns k0, then of columns k0 + 8
    ldmatrix_x4(af, a + (row0 + r + 8 * (matrix & 1)) * kPitch + k0 + 8 * (matrix >> 1));
#pragma unroll
    for (int n = 0; n < kN8; n += 2) {
      uint32_t bf[4];  // matrices: b rows 8n.. at columns k0, k0 + 8, then rows 8n + 8.. at both
      ldmatrix_x4(bf, b + (8 * n + r + 8 * (matrix >> 1)) * kPitch + k0 + 8 * (matrix & 1));
      mma<T>(acc[n], af, bf[0], bf[1]);
      mma<T>(acc[n + 1], af, bf[2], bf[3]);
    }
  }
}

// acc (16 x 8*kN8) += P (16 x 8*kK8) * B (8*kK8 x 8*kN8) for one warp, where
//   P is an f32 accumulator of this warp (C layout), rounded to T here;
//   B[k][n] = b[k][n]: b is a shared tile (8*kK8, kPitch) whose rows are the sum index.
template <typename T, int kN8, int kK8, int kPitch>
__device__ __forceinline__ void mma_acc_by_rows(float (&acc)[kN8][4], const float (&p)[kK8][4], const T* b) {
  static_assert(kN8 % 2 == 0 && kK8 % 2 == 0, "tiles of 16 columns and 16 rows");
  const int lane = threadIdx.x & 31, matrix = lane >> 3, r = lane & 7;
#pragma unroll
  for (int j = 0; j < kK8; j += 2) {
    const uint32_t af[4] = {pack<T>(p[j][0], p[j][1]), pack<T>(p[j][2], p[j][3]), pack<T>(p[j + 1][0], p[j + 1][1]),
                            pack<T>(p[j + 1][2], p[j + 1][3])};
#pragma unroll
    for (int n = 0; n < kN8; n += 2) {
      uint32_t bf[4];  // matrices (transposed): b rows 8j.. and 8j + 8.. of columns 8n, then of 8n + 8
      ldmatrix_x4_trans(bf, b + (8 * j + r + 8 * (matrix & 1)) * kPitch + 8 * n + 8 * (matrix >> 1));
      mma<T>(acc[n], af, bf[0], bf[1]);
      mma<T>(acc[n + 1], af, bf[2], bf[3]);
    }
  }
}

// Writes rows g + 8i (i = 0, 1) of a warp's (16, 8*kN8) f32 accumulator, times scale[i], to
// rows[i] (nullptr: past the sequence) as T, columns below d.
template <typename T, int kN8>
__device__ __forceinline__ void store_rows(const float (&acc)[kN8][4], T* const (&rows)[2], const float (&scale)[2],
                                           int d) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (rows[i] == nullptr) continue;
#pragma unroll
    for (int n = 0; n < kN8; ++n) {
      const int col = 8 * n + 2 * t;
      if (col < d) *reinterpret_cast<uint32_t*>(rows[i] + col) = pack<T>(acc[n][2 * i] * scale[i], acc[n][2 * i + 1] * scale[i]);
    }
  }
}

}  // namespace tandem::cuda::flash16
