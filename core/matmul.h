#pragma once
// Matrix product (device-neutral side). Backends: core/cpu/matmul.cpp, core/cuda/matmul.cpp.
#include "tandem/core/tensor.h"

namespace tandem::kernels {

// Matrix product with NumPy matmul semantics: 1-D operands are promoted, batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);

}  // namespace tandem::kernels
