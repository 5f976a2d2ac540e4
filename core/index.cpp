// The device-neutral side of indexing and joining: index_select, index_add, gather,
// scatter_add, cat.
#include "tandem/core/index.h"

#include "tandem/core/backend.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/copy.h"
#include "tandem/core/views.h"

namespace tandem::kernels {

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  TANDEM_CHECK_AS(ValueError, index.dim() == 1, "index_select: index must be 1-D, got shape ", shape_str(index.shape()));
  TANDEM_CHECK_AS(ValueError, x.dim() > 0 || index.numel() == 1, "index_select: a 0-dim tensor takes exactly one index, got ",
                  index.numel());
  int64_t d = wrap_dim(dim, x.dim(), "index_select");
  Tensor idx = index_as_i64("index_select", index, x.device());
  Shape out_shape = x.shape();
  if (x.dim() == 0) out_shape = {};
  else out_shape[d] = idx.numel();
  Tensor out = empty(out_shape, x.options());
  Tensor xc = contiguous(x);
  TANDEM_ROUTE(x.device(), index_select, as_three_dims(xc, d), idx,
               out.as_strided(three_dims(out_shape, d, idx.numel()), contiguous_strides(three_dims(out_shape, d, idx.numel())), 0));
  return out;
}

namespace {
void index_add_into(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, bool in_order) {
  TANDEM_CHECK_AS(ValueError, out.is_contiguous() && out.dtype() == src.dtype() && out.device() == src.device(),
                  "index_add_: out must be contiguous and of src's dtype and device, got ", out.dtype(), " on ",
                  out.device(), out.is_contiguous() ? "" : " (not contiguous)", " for ", src.dtype(), " on ",
                  src.device());
  int64_t d = wrap_dim(dim, out.dim(), "index_add");
  Tensor idx = index_as_i64("index_add", index, src.device());
  Tensor s = contiguous(src);
  TANDEM_ROUTE(src.device(), index_add, as_three_dims(out, d), idx, as_three_dims(s, d), in_order);
}
}  // namespace

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  Tensor out = zeros(shape, src.options());
  index_add_into(out, dim, index, src, /*in_order=*/false);  // into zeros: atomics unless deterministic mode
  return out;
}

void index_add_(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) {
  index_add_into(out, dim, index, src, /*in_order=*/true);
}

namespace {
void check_gather_shapes(const char* op, const Shape& x_shape, int64_t d, const Tensor& index) {
  TANDEM_CHECK_AS(ValueError, index.dim() == static_cast<int64_t>(x_shape.size()), op, ": index has ", index.dim(),
                  " dims but the tensor has ", x_shape.size(), " (shapes ", shape_str(index.shape()), " and ",
                  shape_str(x_shape), ")");
  for (int64_t i = 0; i < index.dim(); ++i) {
    TANDEM_CHECK_AS(ValueError, i == d || index.shape()[i] == x_shape[i], op, ": index shape ",
                    shape_str(index.shape()), " must match the tensor's ", shape_str(x_shape), " except at dim ", d);
  }
}
}  // namespace

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  int64_t d = wrap_dim(dim, x.dim(), "gather");
  check_gather_shapes("gather", x.shape(), d, index);
  Tensor idx = index_as_i64("gather", index, x.device());
  Tensor out = empty(index.shape(), x.options());
  TANDEM_ROUTE(x.device(), gather, as_three_dims(contiguous(x), d), as_three_dims(idx, d), as_three_dims(out, d));
  return out;
}

Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  int64_t d = wrap_dim(dim, static_cast<int64_t>(shape.size()), "scatter_add");
  check_gather_shapes("scatter_add", shape, d, index);
  TANDEM_CHECK_AS(ValueError, src.shape() == index.shape(), "scatter_add: src shape ", shape_str(src.shape()),
                  " must equal the index shape ", shape_str(index.shape()));
  Tensor idx = index_as_i64("scatter_add", index, src.device());
  Tensor out = zeros(shape, src.options());
  TANDEM_ROUTE(src.device(), scatter_add, as_three_dims(out, d), as_three_dims(idx, d),
               as_three_dims(contiguous(src), d));
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  TANDEM_CHECK_AS(ValueError, !tensors.empty(), "cat: expected at least one tensor");
  const Tensor& first = tensors[0];
  TANDEM_CHECK_AS(ValueError, first.dim() > 0, "cat: cannot concatenate 0-dim tensors (unsqueeze them or use stack)");
  int64_t d = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    check_same_device("cat", first, t);
    check_same_dtype("cat", first, t);
    TANDEM_CHECK_AS(ValueError, t.dim() == first.dim(), "cat: tensor ", i, " has shape ", shape_str(t.shape()),
                    " but tensor 0 has ", shape_str(first.shape()), " (same number of dims expected)");
    for (int64_t j = 0; j < t.dim(); ++j) {
      TANDEM_CHECK_AS(ValueError, j == d || t.shape()[j] == first.shape()[j], "cat: tensor ", i, " has shape ",
                      shape_str(t.shape()), " but tensor 0 has ", shape_str(first.shape()),
                      "; sizes must match except in dim ", d);
    }
    shape[d] += t.shape()[d];
  }
  Tensor out = empty(shape, first.options());
  int64_t start = 0;
  for (const Tensor& t : tensors) {
    copy_(views::narrow(out, d, start, t.shape()[d]), t);
    start += t.shape()[d];
  }
  return out;
}

}  // namespace tandem::kernels
