#pragma once
// Views: new layouts over the same storage, no copies and no autograd. The differentiable ops
// in autograd/ wrap these; kernels use them directly.
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::views {

// Broadcasts x to `shape` (NumPy rules) with stride 0 on the expanded dims.
Tensor expand(const Tensor& x, const Shape& shape);
// Same elements in a new shape; one size may be -1 (inferred). Throws when the layout cannot be
// expressed without a copy (use reshape, which copies then).
Tensor view(const Tensor& x, const Shape& shape);
// Like view, but copies into a contiguous tensor when no view exists.
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor permute(const Tensor& x, const std::vector<int64_t>& order);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
// Elements start..start+length-1 along dim.
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor squeeze(const Tensor& x, int64_t dim);  // only that dim, which must have size 1
Tensor squeeze_all(const Tensor& x);           // every size-1 dim
Tensor unsqueeze(const Tensor& x, int64_t dim);
// A contiguous run of shape_numel(shape) elements viewed as `shape` laid out in `format` (how a
// flat buffer holds a tensor in its own memory format, e.g. a channels-last gradient in a bucket).
Tensor view_in_format(const Tensor& flat, const Shape& shape, MemoryFormat format);

// Resolves a -1 in `shape` against numel; checks the element counts agree.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op);

}  // namespace tandem::views
