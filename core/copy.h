#pragma once
// Copies (with casts, across devices), fills, dtype and device conversion, random fills
// (device-neutral side). Backends: core/cpu/elementwise.cpp, core/cuda/elementwise.cu, memcpy.cpp.
#include <cstdint>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem {

enum class RandomKind { uniform, normal, bernoulli };

namespace kernels {

// Copies src into dst elementwise (same shape; casts dtype; any strides; any devices).
void copy_(const Tensor& dst, const Tensor& src);
// copy_(dsts[i], srcs[i]) for every i. Pairs dense in one layout, of one dtype and on one device go
// together: on CUDA one launch for up to 32 of them (a bucket's gradients moving into it), in
// place of a copy each.
void copy_each_(const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs);
void fill_(const Tensor& dst, double value);
Tensor contiguous(const Tensor& x);  // x itself if already contiguous
Tensor clone(const Tensor& x);       // always a fresh contiguous copy
// x laid out in `format`: x itself if it already is, else a copy. For an x that is dense in
// `format` only up to the strides of size-1 dims, the result is a view with the exact strides
// of `format` (cuDNN reads the layout from the strides).
Tensor contiguous(const Tensor& x, MemoryFormat format);
Tensor clone(const Tensor& x, MemoryFormat format);  // always a fresh copy, laid out in `format`
Tensor to_dtype(const Tensor& x, DType dtype);    // x itself if already that dtype
Tensor to_device(const Tensor& x, Device device);  // x itself if already there

// Fills `out` (contiguous) from the counter-based generator: element i draws from counter
// offset + i under key seed, so every device produces the same numbers.
void random_(const Tensor& out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2);
// The same inside a CUDA graph capture (out on the GPU): seed and first counter from `base` on the
// device, (2,) u64 that every replay sets (core/cuda_graph.h), plus `offset`.
void random_from_base_(const Tensor& out, RandomKind kind, const uint64_t* base, uint64_t offset, double p1, double p2);

}  // namespace kernels
}  // namespace tandem
