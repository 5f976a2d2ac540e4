#pragma once
// tandem's Hopper (sm_90) matrix products on CUTLASS's TMA and warp-specialised kernels, for the
// 16-bit (bf16, f16) products of linear layers and 2-D matmuls, f32 accumulation. Beside
// cuBLASLt, not instead of it: the timed choice (cublaslt_plan.h) runs both on the problem and
// keeps the faster. What these kernels add is programmatic dependent launch: each is launched
// while the kernel before it in the stream is still finishing, and waits on the device for it
// (griddepcontrol), where a cuBLASLt kernel starts only 1-2 us after the previous kernel has
// ended. In an eager step of many products that gap adds up (the MLP's 14 products lost about
// 21 us of its 0.96 ms to it on an H200).
//
// Built only where CUTLASS's headers were found (scripts/install-deps.sh puts them in
// .deps/cutlass); elsewhere available() is false and every product runs on cuBLASLt.
#include <cstdint>
#include <string>

#include <cuda_runtime.h>

#include "tandem/core/dtype.h"

namespace tandem::cuda::sm90 {

// What the kernel does after the product: nothing, + bias (n,) broadcast down the rows,
// + bias + c with c (m, n) read (a layer whose output joins a residual stream: D is the sum),
// pre = acc + bias stored to aux and D = gelu_tanh(pre) (the linear layer's GELU forward), or
// D = gelu_tanh'(aux) * acc with aux (m, n) read (GELU's backward: the input gradient of the layer
// after a GELU times the derivative at the pre-activation that the forward stored), and that with
// the column sums of D as stored, one partial row per tile of rows (the bias gradient of the layer
// that made aux, which sum_partial_rows finishes: bias_partial_rows).
enum class Epilogue { none, bias, bias_residual, bias_gelu_aux, dgelu_aux, dgelu_aux_bias_partials };

// D (m, n) row-major with leading dimension ldd = A (m, k) @ B (k, n). A is stored row-major
// (m, k) with leading dimension lda, or, when a_transposed, as its transpose (k, m) row-major;
// B likewise as (k, n), or as (n, k) when b_transposed. aux and c (m, n) share D's leading
// dimension.
struct Problem {
  DType dtype = DType::bf16;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  bool a_transposed = false;
  const void* b = nullptr;
  int64_t ldb = 0;
  bool b_transposed = false;
  void* d = nullptr;
  int64_t ldd = 0;
  Epilogue epilogue = Epilogue::none;
  const void* bias = nullptr;
  const void* c = nullptr;  // bias_residual: the residual (m, n) added to the product
  void* aux = nullptr;
  // dgelu_aux_bias_partials: (max_bias_partial_rows(m), n) f32, of which the variant that runs
  // writes the first bias_partial_rows(variant, m): row i holds the column sums of D's rows in its
  // i-th tile of rows.
  float* bias_partials = nullptr;
};

// Kernel configurations (tile, cluster, schedule): 0 = 128 x 256 tiles, two consumer warp groups
// sharing each, clusters of 2 along m (large products); 1 = 128 x 128 tiles, two warp groups
// taking turns on the tensor cores, clusters of 2 along m, stored in 64 x 64 pieces; 2 = 64 x 128
// tiles, the same schedule, one block per cluster (products of few tiles). Each also takes a
// raster order and swizzle width: kVariants launch variants in all.
constexpr int kConfigs = 3;
constexpr int kVariants = kConfigs * 4;
std::string variant_name(int variant);

// Whether this build has the kernels and `device` is an sm_90 GPU.
bool available(int device);

// Whether a kernel exists for p: 16-bit, m, n, k > 0, the operand layouts of a linear layer's
// forward (A as stored, B transposed), input gradient (both as stored) or weight gradient (A
// transposed), the bias epilogues (bias_residual with c given) only on the forward's and the
// dgelu ones only on the input gradient's (with bias partials: n a multiple of 256), and 16-byte
// aligned pointers and leading dimensions (TMA's rule).
bool supported(const Problem& p);

// The rows of D in one tile of `variant`, the partial rows dgelu_aux_bias_partials writes in it (one
// per tile of rows), and the most any variant writes. Their row length is n: the epilogue needs n a multiple of 256,
// every variant's tile width (supported() says so).
inline int64_t bias_partial_tile_rows(int variant) { return variant / 4 == 2 ? 64 : 128; }  // the configs below
inline int64_t bias_partial_rows(int variant, int64_t m) {
  return (m + bias_partial_tile_rows(variant) - 1) / bias_partial_tile_rows(variant);
}
inline int64_t max_bias_partial_rows(int64_t m) { return (m + 63) / 64; }

// A variant for p without timing: config by the number of tiles, default raster order.
int default_variant(const Problem& p, int device);

// Launches p with `variant` on `stream` (as launch_as_dependent says). False where CUTLASS refuses
// the problem for that variant (nothing ran).
bool run(const Problem& p, int variant, int device, cudaStream_t stream);

// Whether the products launch as dependent launches: where the device allows (dependent_launch.cuh),
// except inside a graph capture. There they take an ordinary edge: a replayed step has no launch
// gaps for a dependent launch to hide, and as dependent launches these kernels made replayed steps
// slower (the MLP's on an H200: docs/performance-notes.md, "tandem's CUTLASS kernels on sm_90").
bool launch_as_dependent(int device);

}  // namespace tandem::cuda::sm90
