#include "tandem/core/views.h"

#include <algorithm>
#include <optional>
#include <string>

#include "tandem/core/kernels.h"

namespace tandem::views {

Tensor expand(const Tensor& x, const Shape& shape) {
  TANDEM_CHECK_AS(ValueError, shape.size() >= x.shape().size(), "expand: cannot expand shape ",
                  shape_str(x.shape()), " to fewer dims ", shape_str(shape));
  size_t lead = shape.size() - x.shape().size();
  Strides strides(shape.size(), 0);
  for (size_t i = 0; i < x.shape().size(); ++i) {
    int64_t from = x.shape()[i];
    int64_t to = shape[lead + i];
    TANDEM_CHECK_AS(ValueError, from == to || from == 1, "expand: shape ", shape_str(x.shape()),
                    " cannot be expanded to ", shape_str(shape), ": size ", from, " at dim ", i,
                    " must equal ", to, " or be 1");
    strides[lead + i] = from == to ? x.strides()[i] : 0;
  }
  if (shape == x.shape()) return x;
  return x.as_strided(shape, strides, x.offset());
}

namespace {
// infer_shape, with the input's shape (when known) named in the errors.
Shape resolve_shape(const Shape& shape, int64_t numel, const Shape* from, const char* op) {
  std::string tensor = from != nullptr ? detail::concat("the tensor of shape ", shape_str(*from)) : "the tensor";
  Shape out = shape;
  int64_t known = 1;
  int infer_at = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      TANDEM_CHECK_AS(ValueError, infer_at < 0, op, ": only one size may be -1 in ", shape_str(shape));
      infer_at = static_cast<int>(i);
    } else {
      TANDEM_CHECK_AS(ValueError, out[i] >= 0, op, ": invalid size ", out[i], " in ", shape_str(shape));
      known *= out[i];
    }
  }
  if (infer_at >= 0) {
    TANDEM_CHECK_AS(ValueError, known != 0 && numel % known == 0, op, ": cannot infer the -1 in ",
                    shape_str(shape), " for ", tensor, " (", numel, " elements)");
    out[infer_at] = numel / known;
    known *= out[infer_at];
  }
  TANDEM_CHECK_AS(ValueError, known == numel, op, ": shape ", shape_str(shape), " has ", known, " elements but ",
                  tensor, " has ", numel);
  return out;
}
}  // namespace

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  return resolve_shape(shape, numel, nullptr, op);
}

namespace {
// Strides that give `shape` the same element order over x's layout, if any exist. Walks x's dims
// in chunks that are contiguous among themselves and matches the new dims against each chunk.
std::optional<Strides> view_strides(const Shape& old_shape, const Strides& old_strides, const Shape& shape) {
  Strides strides(shape.size(), 0);
  if (shape_numel(old_shape) == 0) return contiguous_strides(shape);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    // A chunk ends where the next-outer dim does not continue this one's stride.
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return strides;
}
}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  Shape resolved = resolve_shape(shape, x.numel(), &x.shape(), "view");
  if (x.is_contiguous()) return x.as_strided(resolved, contiguous_strides(resolved), x.offset());
  std::optional<Strides> strides = view_strides(x.shape(), x.strides(), resolved);
  TANDEM_CHECK_AS(ValueError, strides.has_value(), "view: a tensor of shape ", shape_str(x.shape()),
                  " with strides ", shape_str(x.strides()), " cannot be viewed as ", shape_str(resolved),
                  " without a copy (use reshape, or contiguous() first)");
  return x.as_strided(resolved, *strides, x.offset());
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape resolved = resolve_shape(shape, x.numel(), &x.shape(), "reshape");
  if (x.is_contiguous()) return x.as_strided(resolved, contiguous_strides(resolved), x.offset());
  std::optional<Strides> strides = view_strides(x.shape(), x.strides(), resolved);
  if (strides) return x.as_strided(resolved, *strides, x.offset());
  Tensor c = kernels::contiguous(x);
  return c.as_strided(resolved, contiguous_strides(resolved), c.offset());
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& order) {
  int64_t n = x.dim();
  TANDEM_CHECK_AS(ValueError, static_cast<int64_t>(order.size()) == n, "permute: order has ", order.size(),
                  " dims but the tensor has ", n, " (shape ", shape_str(x.shape()), ")");
  Shape shape(n);
  Strides strides(n);
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim(order[i], n, "permute");
    TANDEM_CHECK_AS(ValueError, !seen[d], "permute: dim ", d, " appears twice in the order");
    seen[d] = true;
    shape[i] = x.shape()[d];
    strides[i] = x.strides()[d];
  }
  return x.as_strided(shape, strides, x.offset());
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  int64_t n = x.dim();
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  if (n == 0) return x;
  std::swap(order[wrap_dim(dim0, n, "transpose")], order[wrap_dim(dim1, n, "transpose")]);
  return permute(x, order);
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  TANDEM_CHECK_AS(IndexError, x.dim() > 0, "narrow: cannot be applied to a 0-dim tensor");
  int64_t d = wrap_dim(dim, x.dim(), "narrow");
  int64_t size = x.shape()[d];
  if (start < 0) start += size;
  TANDEM_CHECK_AS(IndexError, start >= 0 && length >= 0 && start + length <= size, "narrow: elements [", start,
                  ", ", start + length, ") are out of range for dim ", d, " of size ", size, " (shape ",
                  shape_str(x.shape()), ")");
  Shape shape = x.shape();
  shape[d] = length;
  return x.as_strided(shape, x.strides(), x.offset() + start * x.strides()[d]);
}

Tensor squeeze(const Tensor& x, int64_t dim) {
  int64_t d = wrap_dim(dim, x.dim(), "squeeze");
  if (x.dim() == 0) return x;  // dim 0 or -1 of a 0-dim tensor: nothing to remove, as in PyTorch
  TANDEM_CHECK_AS(ValueError, x.shape()[d] == 1, "squeeze: dim ", d, " has size ", x.shape()[d],
                  ", expected 1 (shape ", shape_str(x.shape()), ")");
  Shape shape = x.shape();
  Strides strides = x.strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  return x.as_strided(shape, strides, x.offset());
}

Tensor squeeze_all(const Tensor& x) {
  Shape shape;
  Strides strides;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (x.shape()[d] == 1) continue;
    shape.push_back(x.shape()[d]);
    strides.push_back(x.strides()[d]);
  }
  return x.as_strided(shape, strides, x.offset());
}

Tensor unsqueeze(const Tensor& x, int64_t dim) {
  int64_t n = x.dim();
  int64_t d = wrap_dim(dim, n + 1, "unsqueeze");
  Shape shape = x.shape();
  Strides strides = x.strides();
  int64_t stride = d < n ? shape[d] * strides[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  return x.as_strided(shape, strides, x.offset());
}

Tensor view_in_format(const Tensor& flat, const Shape& shape, MemoryFormat format) {
  TANDEM_CHECK_AS(ValueError, flat.is_contiguous() && flat.numel() == shape_numel(shape), "view_in_format: a ",
                  "contiguous tensor of ", shape_numel(shape), " elements is needed for shape ", shape_str(shape),
                  ", got shape ", shape_str(flat.shape()), " with strides ", shape_str(flat.strides()));
  return flat.as_strided(shape, memory_format_strides(shape, format), flat.offset());
}

}  // namespace tandem::views
