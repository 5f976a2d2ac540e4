#pragma once
// Indexing and joining (device-neutral side). Backends: core/cpu/index.cpp, core/cuda/index.cu.
#include <cstdint>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::kernels {

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out (shaped like x's input) gets zeros plus src rows added at index along dim.
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);
// The same rows added into out itself (contiguous, of src's dtype and device), in place, each
// row's sources in source order (on CUDA the sorted path, whatever the deterministic mode: float
// atomics into a non-zero row would round differently run to run even for two sources).
void index_add_(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);

}  // namespace tandem::kernels
