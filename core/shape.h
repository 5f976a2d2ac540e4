#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

using Shape = std::vector<int64_t>;    // sizes of each dim
using Strides = std::vector<int64_t>;  // elements to step per dim

std::string shape_str(const Shape& shape);  // "[2, 3]"
int64_t shape_numel(const Shape& shape);
Strides contiguous_strides(const Shape& shape);  // row-major

// NumPy broadcasting of two shapes; `op` names the caller in the error on incompatible shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Wraps a possibly negative dim into [0, ndim); throws IndexError naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// Sorted, wrapped, de-duplicated reduction dims; empty `dims` means every dim.
std::vector<int64_t> reduction_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);

// The shape left after reducing `dims` (sorted, wrapped), keeping them as size 1 if keepdim.
Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim);

// The layout of several same-shaped operands with size-1 dims dropped, the rest ordered by the
// last operand's strides (largest first; row-major order when the last operand is row-major), and
// adjacent dims merged wherever every operand steps through them contiguously. Loops over the
// merged dims visit the same elements with fewer, longer inner runs, in the last operand's memory
// order: elementwise loops pass their output last. Never returns zero dims.
struct CollapsedDims {
  Shape sizes;                   // merged sizes, outermost first
  std::vector<Strides> strides;  // per operand, in elements, per merged dim
};
CollapsedDims collapse_dims(const Shape& shape, const std::vector<Strides>& strides);

}  // namespace tandem
