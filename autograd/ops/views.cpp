// Shape ops and views with their gradients. A view's backward reshapes, permutes or pads the
// gradient back into the input's layout.
#include <numeric>

#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {

using autograd::record;
using autograd::record_view;

namespace {
Tensor reshape_backward_node(const Tensor& x, Tensor out, const char* name) {
  return record(std::move(out), name, {x}, [shape = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {views::reshape(g, shape)};
  });
}
}  // namespace

Tensor reshape(const Tensor& x, const Shape& shape) { return reshape_backward_node(x, views::reshape(x, shape), "reshape"); }
Tensor view(const Tensor& x, const Shape& shape) { return reshape_backward_node(x, views::view(x, shape), "view"); }

Tensor flatten(const Tensor& x, int64_t start_dim, int64_t end_dim) {
  if (x.dim() == 0) return reshape(x, {1});
  int64_t s = wrap_dim(start_dim, x.dim(), "flatten"), e = wrap_dim(end_dim, x.dim(), "flatten");
  TANDEM_CHECK_AS(ValueError, s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape shape(x.shape().begin(), x.shape().begin() + s);
  int64_t merged = 1;
  for (int64_t d = s; d <= e; ++d) merged *= x.shape()[d];
  shape.push_back(merged);
  shape.insert(shape.end(), x.shape().begin() + e + 1, x.shape().end());
  return reshape(x, shape);
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& order) {
  Tensor out = views::permute(x, order);
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[wrap_dim(order[i], x.dim(), "permute")] = static_cast<int64_t>(i);
  return record_view(out, "permute", {x},
                     [inverse](const Tensor& g) -> std::vector<Tensor> { return {views::permute(g, inverse)}; });
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  Tensor out = views::transpose(x, dim0, dim1);
  return record_view(out, "transpose", {x}, [dim0, dim1](const Tensor& g) -> std::vector<Tensor> {
    return {views::transpose(g, dim0, dim1)};
  });
}

Tensor t(const Tensor& x) {
  TANDEM_CHECK_AS(ValueError, x.dim() == 2, "t: expected a 2-D tensor, got shape ", shape_str(x.shape()),
                  " (use transpose or permute)");
  return transpose(x, 0, 1);
}

Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step) {
  TANDEM_CHECK_AS(IndexError, x.dim() > 0, "slice: cannot be applied to a 0-dim tensor");
  int64_t d = wrap_dim(dim, x.dim(), "slice");
  int64_t size = x.shape()[d];
  TANDEM_CHECK_AS(ValueError, step > 0, "slice: step must be positive, got ", step);
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  int64_t length = (end - start + step - 1) / step;
  Shape shape = x.shape();
  Strides strides = x.strides();
  shape[d] = length;
  strides[d] *= step;
  Tensor out = x.as_strided(shape, strides, x.offset() + start * x.strides()[d]);
  return record(out, "slice", {x}, [input = x.shape(), d, start, step, length](const Tensor& g) -> std::vector<Tensor> {
    // Zeros everywhere but the sliced positions, which receive g.
    Tensor grad = zeros(input, g.options());
    // The span from the first to the last picked element (none for an empty slice).
    Tensor target = views::narrow(grad, d, start, length > 0 ? (length - 1) * step + 1 : 0);
    Strides s = target.strides();
    Shape sh = target.shape();
    s[d] *= step;
    sh[d] = length;
    kernels::copy_(target.as_strided(sh, s, target.offset()), g);
    return {grad};
  });
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  int64_t d = wrap_dim(dim, x.dim(), "narrow");
  views::narrow(x, d, start, length);  // validates the range with narrow's own message
  if (start < 0) start += x.shape()[d];
  return slice(x, d, start, start + length, 1);
}

Tensor squeeze(const Tensor& x, int64_t dim) { return reshape_backward_node(x, views::squeeze(x, dim), "squeeze"); }
Tensor squeeze(const Tensor& x) { return reshape_backward_node(x, views::squeeze_all(x), "squeeze"); }
Tensor unsqueeze(const Tensor& x, int64_t dim) { return reshape_backward_node(x, views::unsqueeze(x, dim), "unsqueeze"); }

Tensor expand(const Tensor& x, const Shape& shape) {
  // -1 keeps the input's size at that dim, as in PyTorch.
  Shape resolved = shape;
  int64_t lead = static_cast<int64_t>(shape.size()) - x.dim();
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    if (shape[i] == -1) {
      TANDEM_CHECK_AS(ValueError, i >= lead, "expand: -1 is not allowed for the new leading dim ", i);
      resolved[i] = x.shape()[i - lead];
    }
  }
  Tensor out = views::expand(x, resolved);
  return record(out, "expand", {x}, [input = x.shape()](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::sum_to(g, input)};
  });
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  return clone(x);
}

Tensor contiguous(const Tensor& x, MemoryFormat format) {
  if (x.is_contiguous(format)) return x;
  return record(kernels::clone(x, format), "contiguous", {x},
                [input_format = x.suggest_memory_format()](const Tensor& g) -> std::vector<Tensor> {
                  return {kernels::contiguous(g, input_format)};
                });
}

Tensor to(const Tensor& x, MemoryFormat format) { return contiguous(x, format); }

Tensor clone(const Tensor& x) {
  return record(kernels::clone(x), "clone", {x}, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
}

Tensor to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return record(kernels::to_dtype(x, dtype), "to", {x}, [from = x.dtype()](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::to_dtype(g, from)};
  });
}

Tensor to(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  return record(kernels::to_device(x, device), "to", {x}, [from = x.device()](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::to_device(g, from)};
  });
}

}  // namespace tandem
