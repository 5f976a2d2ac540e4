// Reductions, softmax and cross-entropy, with their gradients.
#include "tandem/autograd/grad_mode.h"
#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {

using autograd::record;
using autograd::record_loss;
using autograd::saved;

namespace {
// Broadcasts a reduced gradient back over the input's shape: (kept dims) -> input shape.
Tensor expand_reduced(const Tensor& g, const Shape& input_shape, const std::vector<int64_t>& dims) {
  Shape keep = reduced_shape(input_shape, dims, /*keepdim=*/true);
  return views::expand(views::reshape(g, keep), input_shape);
}

int64_t count_reduced(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[d];
  return n;
}

// amax/amin: the gradient is shared evenly among the elements equal to the extreme.
Tensor extreme(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim, ReduceOp op) {
  const char* name = op == ReduceOp::max ? "amax" : "amin";
  std::vector<int64_t> dims = reduction_dims(dims_in, x.dim(), name);
  Tensor out = kernels::reduce(op, x, dims, keepdim);
  return record(out, name, {x}, [sx = saved(x), so = saved(out), dims](const Tensor& g) -> std::vector<Tensor> {
    Tensor hit = kernels::to_dtype(kernels::binary(BinaryOp::eq, sx, expand_reduced(so, sx.shape(), dims)), sx.dtype());
    Tensor count = expand_reduced(kernels::reduce(ReduceOp::sum, hit, dims, true), sx.shape(), dims);
    return {div(mul(expand_reduced(g, sx.shape(), dims), hit), count)};
  });
}

ValuesIndices extreme_along(const Tensor& x, int64_t dim, bool keepdim, bool is_max) {
  int64_t d = wrap_dim(dim, x.dim(), is_max ? "max" : "min");
  Tensor indices = kernels::reduce(is_max ? ReduceOp::argmax : ReduceOp::argmin, x, {d}, true);
  Tensor values = kernels::gather(x, d, indices);
  if (!keepdim && x.dim() > 0) {
    indices = views::squeeze(indices, d);
    values = views::squeeze(values, d);
  }
  values = record(values, is_max ? "max" : "min", {x},
                  [shape = x.shape(), idx = views::reshape(indices, reduced_shape(x.shape(), {d}, true)), d](
                      const Tensor& g) -> std::vector<Tensor> {
                    return {kernels::scatter_add(shape, d, idx, views::reshape(g, idx.shape()))};
                  });
  return {values, indices};
}
}  // namespace

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  std::vector<int64_t> dims = reduction_dims(dims_in, x.dim(), "sum");
  Tensor out = kernels::reduce(ReduceOp::sum, x, dims, keepdim);
  return record(out, "sum", {x}, [shape = x.shape(), dims](const Tensor& g) -> std::vector<Tensor> {
    return {expand_reduced(g, shape, dims)};
  });
}

Tensor mean(const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  std::vector<int64_t> dims = reduction_dims(dims_in, x.dim(), "mean");
  Tensor out = kernels::reduce(ReduceOp::mean, x, dims, keepdim);
  return record(out, "mean", {x}, [shape = x.shape(), dims](const Tensor& g) -> std::vector<Tensor> {
    double n = static_cast<double>(count_reduced(shape, dims));
    return {expand_reduced(mul(g, 1.0 / n), shape, dims)};
  });
}

Tensor amax(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme(x, dims, keepdim, ReduceOp::max);
}
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return extreme(x, dims, keepdim, ReduceOp::min);
}

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) { return extreme_along(x, dim, keepdim, true); }
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) { return extreme_along(x, dim, keepdim, false); }

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) { return kernels::reduce(ReduceOp::argmax, x, {dim}, keepdim); }
Tensor argmax(const Tensor& x) { return kernels::reduce(ReduceOp::argmax, x, {}, false); }
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim) { return kernels::reduce(ReduceOp::argmin, x, {dim}, keepdim); }

Tensor var(const Tensor& x, const std::vector<int64_t>& dims_in, int64_t correction, bool keepdim) {
  std::vector<int64_t> dims = reduction_dims(dims_in, x.dim(), "var");
  int64_t n = count_reduced(x.shape(), dims);
  TANDEM_CHECK_AS(ValueError, correction >= 0, "var: correction must be >= 0, got ", correction);
  Tensor centered = sub(x, mean(x, dims, true));
  // Composite: its gradient follows from sub, mean, mul and sum.
  return div(sum(mul(centered, centered), dims, keepdim), static_cast<double>(n - correction));
}

Tensor softmax(const Tensor& x, int64_t dim) {
  Tensor out = kernels::softmax(x, dim, false);
  return record(out, "softmax", {x}, [so = saved(out), dim](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::softmax_backward(g, so, dim, false)};
  });
}

Tensor log_softmax(const Tensor& x, int64_t dim) {
  Tensor out = kernels::softmax(x, dim, true);
  return record(out, "log_softmax", {x}, [so = saved(out), dim](const Tensor& g) -> std::vector<Tensor> {
    return {kernels::softmax_backward(g, so, dim, true)};
  });
}

namespace {
// The mean's divisor: rows whose target is not ignore_index, as a 0-dim tensor of the losses'
// dtype (it stays on the device).
Tensor counted_rows(const Tensor& target, int64_t ignore_index, DType dtype) {
  Tensor valid = kernels::binary(BinaryOp::ne, target, scalar_tensor(static_cast<double>(ignore_index), target.options()));
  return kernels::reduce(ReduceOp::sum, kernels::to_dtype(valid, dtype), {}, false);
}

Tensor reduce_losses(const Tensor& losses, const Tensor& count, Reduction reduction) {
  switch (reduction) {
    case Reduction::none: return losses;
    case Reduction::sum: return kernels::reduce(ReduceOp::sum, losses, {}, false);
    case Reduction::mean: return kernels::binary(BinaryOp::div, kernels::reduce(ReduceOp::sum, losses, {}, false), count);
  }
  return losses;
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options) {
  const DType stat = is_half(logits.dtype()) ? DType::f32 : logits.dtype();
  Tensor count;  // rows that count towards the mean, as a 0-dim tensor (stays on the device)
  if (options.reduction == Reduction::mean) count = counted_rows(target, options.ignore_index, stat);
  // A scalar loss that will be differentiated gets its gradient from the forward's own pass over
  // the logits (for an upstream gradient of 1; backward scales it only if that is not 1): the
  // logits are read once, not again in backward, and are not kept. Not for f16, whose range
  // cannot hold (softmax - y) / N before the loss scale multiplies it.
  const bool with_grad = options.reduction != Reduction::none && logits.dtype() != DType::f16 &&
                         GradMode::is_enabled() && logits.requires_grad();
  if (with_grad) {
    kernels::CrossEntropyWithGrad f =
        kernels::cross_entropy_with_grad(logits, target, count, options.ignore_index, options.label_smoothing);
    return record_loss(reduce_losses(f.losses, count, options.reduction), "cross_entropy", {logits},
                       [grad = f.grad](const Tensor& g) -> std::vector<Tensor> {
                         // Without retain_graph this node's buffer is handed on (scaled in place if g is
                         // not 1, and without a kernel when g is backward()'s implied 1); with it, a second
                         // backward must find the buffer unchanged.
                         const bool releasing = autograd::backward_releases_saved();
                         if (releasing && autograd::gradient_is_implicit_one()) return {grad};
                         return {kernels::scale_unless_one(grad, g, releasing)};
                       });
  }
  kernels::CrossEntropyForward f =
      kernels::cross_entropy_forward(logits, target, options.ignore_index, options.label_smoothing);
  int64_t n = logits.dim() > 0 ? logits.shape()[0] : 0;
  return record(reduce_losses(f.losses, count, options.reduction), "cross_entropy", {logits},
                [sx = saved(logits), t = saved(target), lse = f.lse, count, n, options](const Tensor& g) -> std::vector<Tensor> {
                  Tensor row_grad;  // (N,): d(out)/d(loss_i) times g
                  switch (options.reduction) {
                    case Reduction::none: row_grad = g; break;
                    case Reduction::sum: row_grad = views::expand(g, {n}); break;
                    case Reduction::mean: row_grad = views::expand(kernels::binary(BinaryOp::div, g, count), {n}); break;
                  }
                  return {kernels::cross_entropy_backward(sx, t, lse, row_grad, options.ignore_index,
                                                          options.label_smoothing)};
                });
}

}  // namespace tandem
