// Layer functions built from other differentiable ops (their gradients follow from those).
#include "tandem/autograd/ops.h"
#include "tandem/core/random.h"

namespace tandem {

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  int64_t k = static_cast<int64_t>(normalized_shape.size());
  TANDEM_CHECK_AS(ValueError, k >= 1 && k <= x.dim(), "layer_norm: normalized_shape ", shape_str(normalized_shape),
                  " does not fit input ", shape_str(x.shape()));
  Shape tail(x.shape().end() - k, x.shape().end());
  TANDEM_CHECK_AS(ValueError, tail == normalized_shape, "layer_norm: input ", shape_str(x.shape()),
                  " does not end in normalized_shape ", shape_str(normalized_shape));
  std::vector<int64_t> dims;
  for (int64_t d = x.dim() - k; d < x.dim(); ++d) dims.push_back(d);
  Tensor centered = sub(x, mean(x, dims, true));
  Tensor var = mean(mul(centered, centered), dims, true);
  Tensor y = mul(centered, rsqrt(add(var, eps)));
  if (weight.defined()) y = mul(y, weight);
  if (bias.defined()) y = add(y, bias);
  return y;
}

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  TANDEM_CHECK_AS(ValueError, weight.dim() == 2, "embedding: weight must be (V, D), got shape ", shape_str(weight.shape()));
  TANDEM_CHECK_AS(TypeError, indices.dtype() == DType::i64 || indices.dtype() == DType::i32,
                  "embedding: indices must be i64 or i32, got ", indices.dtype());
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.shape()[1]);
  return reshape(index_select(weight, 0, reshape(indices, {-1})), out_shape);
}

Tensor dropout(const Tensor& x, double p, bool training, Generator* generator) {
  TANDEM_CHECK_AS(ValueError, p >= 0.0 && p < 1.0, "dropout: p must be in [0, 1), got ", p);
  if (!training || p == 0.0) return x;
  Tensor keep = bernoulli(x.shape(), 1.0 - p, x.options(), generator);
  return mul(x, mul(keep, 1.0 / (1.0 - p)));
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  TANDEM_CHECK_AS(ValueError, input.shape() == target.shape(), "mse_loss: input ", shape_str(input.shape()),
                  " and target ", shape_str(target.shape()), " must have the same shape");
  Tensor diff = sub(input, target);
  Tensor squared = mul(diff, diff);
  switch (reduction) {
    case Reduction::mean: return mean(squared);
    case Reduction::sum: return sum(squared);
    case Reduction::none: return squared;
  }
  return squared;
}

}  // namespace tandem
