// The device-neutral side of softmax, log-softmax and the fused cross-entropy.
#include "tandem/core/softmax.h"

#include "tandem/core/backend.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/copy.h"

namespace tandem::kernels {

Tensor softmax(const Tensor& x, int64_t dim, bool log) {
  check_floating(log ? "log_softmax" : "softmax", x);
  int64_t d = wrap_dim(dim, x.dim(), log ? "log_softmax" : "softmax");
  Tensor src = as_three_dims(contiguous(x), d);
  Tensor out = empty(x.shape(), x.options());
  TANDEM_ROUTE(x.device(), softmax, src, as_three_dims(out, d), log);
  return out;
}

Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log) {
  int64_t d = wrap_dim(dim, y.dim(), "softmax_backward");
  Tensor out = empty(y.shape(), y.options());
  TANDEM_ROUTE(y.device(), softmax_backward, as_three_dims(contiguous(grad), d), as_three_dims(contiguous(y), d),
               as_three_dims(out, d), log);
  return out;
}

namespace {
void check_cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing) {
  check_floating("cross_entropy", logits);
  TANDEM_CHECK_AS(ValueError, logits.dim() == 2, "cross_entropy: logits must be (N, C), got shape ",
                  shape_str(logits.shape()));
  TANDEM_CHECK_AS(ValueError, target.dim() == 1 && target.shape()[0] == logits.shape()[0],
                  "cross_entropy: target must be (N,) = (", logits.shape()[0], ",) for logits ",
                  shape_str(logits.shape()), ", got shape ", shape_str(target.shape()));
  TANDEM_CHECK_AS(ValueError, label_smoothing >= 0.0 && label_smoothing <= 1.0,
                  "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
}

// The dtype of the losses, lse and count: f32 for half logits.
TensorOptions statistics_options(const Tensor& logits) {
  return TensorOptions(is_half(logits.dtype()) ? DType::f32 : logits.dtype(), logits.device());
}
}  // namespace

CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                          double label_smoothing) {
  check_cross_entropy(logits, target, label_smoothing);
  Tensor t = index_as_i64("cross_entropy", target, logits.device());
  int64_t n = logits.shape()[0];
  CrossEntropyForward result{empty({n}, statistics_options(logits)), empty({n}, statistics_options(logits))};
  TANDEM_ROUTE(logits.device(), cross_entropy_forward, contiguous(logits), t, result.losses, result.lse, ignore_index,
               label_smoothing);
  return result;
}

CrossEntropyWithGrad cross_entropy_with_grad(const Tensor& logits, const Tensor& target, const Tensor& count,
                                             int64_t ignore_index, double label_smoothing) {
  check_cross_entropy(logits, target, label_smoothing);
  const TensorOptions stat = statistics_options(logits);
  TANDEM_CHECK(!count.defined() || (count.dim() == 0 && count.dtype() == stat.dtype && count.device() == logits.device()),
               "cross_entropy_with_grad: count must be a 0-dim ", stat.dtype, " tensor on ", logits.device());
  Tensor t = index_as_i64("cross_entropy", target, logits.device());
  Tensor x = contiguous(logits);
  CrossEntropyWithGrad result{empty({logits.shape()[0]}, stat), empty(logits.shape(), logits.options())};
  TANDEM_ROUTE(logits.device(), cross_entropy_with_grad, x, t, count, result.losses, result.grad, ignore_index,
               label_smoothing);
  return result;
}

Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& row_grad,
                              int64_t ignore_index, double label_smoothing) {
  Tensor t = index_as_i64("cross_entropy_backward", target, logits.device());
  Tensor out = empty(logits.shape(), logits.options());
  TANDEM_ROUTE(logits.device(), cross_entropy_backward, contiguous(logits), t, contiguous(lse),
               contiguous(to_dtype(row_grad, lse.dtype())), out, ignore_index, label_smoothing);
  return out;
}

}  // namespace tandem::kernels
