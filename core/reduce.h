#pragma once
// Reductions (device-neutral side). Backends: core/cpu/reduce.cpp, core/cuda/reduce.cu.
#include <cstdint>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem {

enum class ReduceOp { sum, mean, max, min, argmax, argmin };

const char* reduce_op_name(ReduceOp op);

namespace kernels {

// Reduces `dims` (empty: all); argmax/argmin take exactly one dim (or none: over the flattened
// tensor) and return i64.
Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
// Sums a broadcast gradient back down to `shape` (the inverse of expanding shape to grad's).
Tensor sum_to(const Tensor& grad, const Shape& shape);

// The mean (or sum) of (input - target)^2 over every element and, from the same pass, its
// gradient with respect to input for an upstream gradient of 1: grad = 2 * (unit * (input -
// target)), unit = 1 / numel for the mean (rounded to the compute type) and 1 for the sum, in the
// compute type (f32 for 16-bit inputs) and rounded once to input's dtype. These are the bits the
// composed ops' backward gives (for 16-bit inputs: the ops on inputs converted to f32, then the
// conversion's backward). The loss is in the compute type. input and target: one shape, floating
// dtype and device.
struct SquaredErrorWithGrad {
  Tensor loss;  // (), f32 for 16-bit inputs, else input's dtype
  Tensor grad;  // input's shape and dtype, contiguous
};
SquaredErrorWithGrad squared_error_with_grad(const Tensor& input, const Tensor& target, bool mean);

// A 64-bit digest of each tensor's bytes (in its contiguous layout), computed on the device the
// tensor lives on and read back once per device: equal bytes give equal digests on every device,
// so ranks compare parameters without copying them to the host (core/content_hash.h).
std::vector<uint64_t> content_hashes(const std::vector<Tensor>& tensors);

}  // namespace kernels
}  // namespace tandem
