// Joining and indexing ops with their gradients.
#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {

using autograd::record;
using autograd::saved;

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Tensor out = kernels::cat(tensors, dim);
  int64_t d = wrap_dim(dim, out.dim(), "cat");
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors) sizes.push_back(t.shape()[d]);
  return record(out, "cat", tensors, [sizes, d](const Tensor& g) -> std::vector<Tensor> {
    std::vector<Tensor> grads;
    int64_t start = 0;
    for (int64_t size : sizes) {
      grads.push_back(views::narrow(g, d, start, size));
      start += size;
    }
    return grads;
  });
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  TANDEM_CHECK_AS(ValueError, !tensors.empty(), "stack: expected at least one tensor");
  int64_t d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TANDEM_CHECK_AS(ValueError, tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " has shape ",
                    shape_str(tensors[i].shape()), " but tensor 0 has ", shape_str(tensors[0].shape()),
                    " (all must match)");
    expanded.push_back(unsqueeze(tensors[i], d));
  }
  return cat(expanded, d);
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = kernels::index_select(x, dim, index);
  int64_t d = wrap_dim(dim, x.dim(), "index_select");
  // The gradient is x's shape with g's rows added at index. Where x's other uses already gave one
  // (the tied output head of a language model gives its embedding table's), the rows go into that
  // one, in place when nothing else holds it: no zero table and no add over the whole table.
  return record(out, "index_select", {x},
                [shape = x.shape(), d, idx = saved(index)](const Tensor& g, const Tensor& pending) -> std::vector<Tensor> {
                  if (!pending.defined()) return {kernels::index_add(shape, d, idx, g)};
                  Tensor sum = autograd::sole_owner(pending) ? pending : kernels::clone(pending);
                  kernels::index_add_(sum, d, idx, g);
                  return {sum};
                });
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  Tensor out = kernels::gather(x, dim, index);
  int64_t d = wrap_dim(dim, x.dim(), "gather");
  return record(out, "gather", {x}, [shape = x.shape(), d, idx = saved(index)](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::scatter_add(shape, d, idx, g)};
  });
}

}  // namespace tandem
