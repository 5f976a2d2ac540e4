// The device-neutral side of the linear layer: argument checks, then cuBLASLt with its bias and
// GELU epilogues on CUDA, or matmul + add + gelu composed from plain kernels (the CPU, f64, and
// problems cuBLASLt has no fused algorithm for).
#include <algorithm>
#include <cstdint>

#include "tandem/core/backend.h"
#include "tandem/core/copy.h"
#include "tandem/core/elementwise.h"
#include "tandem/core/linear.h"
#include "tandem/core/matmul.h"
#include "tandem/core/reduce.h"
#include "tandem/core/views.h"

namespace tandem::kernels {

namespace {
void check_linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TANDEM_CHECK_AS(ValueError, weight.dim() == 2, "linear: weight must be (out, in), got shape ",
                  shape_str(weight.shape()));
  TANDEM_CHECK_AS(ValueError, x.dim() >= 1 && x.shape().back() == weight.shape()[1], "linear: input ",
                  shape_str(x.shape()), " must end in in_features ", weight.shape()[1], " of weight ",
                  shape_str(weight.shape()));
  TANDEM_CHECK_AS(TypeError, is_floating(x.dtype()),
                  "linear: expected a floating-point input (f32, f64, f16, bf16), got ", x.dtype());
  TANDEM_CHECK_AS(TypeError, weight.dtype() == x.dtype(), "linear: weight has dtype ", weight.dtype(),
                  " but the input has ", x.dtype(), "; convert one with .to(dtype)");
  TANDEM_CHECK_AS(DeviceError, weight.device() == x.device(), "linear: weight is on ", weight.device(),
                  " but the input is on ", x.device());
  if (!bias.defined()) return;
  TANDEM_CHECK_AS(ValueError, bias.dim() == 1 && bias.shape()[0] == weight.shape()[0], "linear: bias must be (",
                  weight.shape()[0], ",) for weight ", shape_str(weight.shape()), ", got shape ",
                  shape_str(bias.shape()));
  TANDEM_CHECK_AS(TypeError, bias.dtype() == x.dtype(), "linear: bias has dtype ", bias.dtype(), " but the input has ",
                  x.dtype());
  TANDEM_CHECK_AS(DeviceError, bias.device() == x.device(), "linear: bias is on ", bias.device(),
                  " but the input is on ", x.device());
}

// x (..., K) as a contiguous (M, K) matrix.
Tensor as_matrix(const Tensor& x) {
  const Shape leading(x.shape().begin(), x.shape().end() - 1);
  return contiguous(views::reshape(x, {shape_numel(leading), x.shape().back()}));
}

// t's shape with its last dim set to n: (..., N) for an input (..., K), and back.
Shape output_shape(const Tensor& t, int64_t n) {
  Shape s = t.shape();
  s.back() = n;
  return s;
}

// cuBLASLt's epilogues take f32, f16 and bf16 (f64 is composed), and the GELU pre-activation
// buffer needs a leading dimension divisible by 8.
bool fused_on_cuda(const Tensor& x, int64_t n, Activation act) {
  return x.device().is_cuda() && x.dtype() != DType::f64 && (act == Activation::none || n % 8 == 0);
}
}  // namespace

LinearForward linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                             const Tensor& residual) {
  check_linear(x, weight, bias);
  const int64_t n = weight.shape()[0], k = weight.shape()[1];
  const Shape out_shape = output_shape(x, n);
  if (residual.defined()) {
    TANDEM_CHECK_AS(ValueError, act == Activation::none,
                    "linear: a residual is added only to a layer without an activation");
    TANDEM_CHECK_AS(ValueError, residual.shape() == out_shape, "linear: residual ", shape_str(residual.shape()),
                    " must have the output's shape ", shape_str(out_shape));
    TANDEM_CHECK_AS(TypeError, residual.dtype() == x.dtype(), "linear: residual has dtype ", residual.dtype(),
                    " but the input has ", x.dtype());
    TANDEM_CHECK_AS(DeviceError, residual.device() == x.device(), "linear: residual is on ", residual.device(),
                    " but the input is on ", x.device());
  }
  Tensor x2 = as_matrix(x);  // (M, K)
  const int64_t m = x2.shape()[0];
  LinearForward result;
  if (fused_on_cuda(x, n, act) && m > 0 && k > 0 && n > 0) {
    Tensor out = empty({m, n}, x.options());                                       // (M, N)
    Tensor pre = act == Activation::none ? Tensor() : empty({m, n}, x.options());  // (M, N)
    Tensor b = bias.defined() ? contiguous(bias) : bias;
    Tensor r = residual.defined() ? as_matrix(residual) : residual;  // (M, N)
    if (cuda::linear_forward(x2, contiguous(weight), b, out, pre, act, r)) {
      result.out = views::reshape(out, out_shape);
      if (pre.defined()) result.pre = views::reshape(pre, out_shape);
      return result;
    }
  }
  Tensor y = matmul(x2, views::transpose(weight, 0, 1));  // (M, N)
  if (bias.defined()) y = binary(BinaryOp::add, y, bias);
  if (residual.defined()) y = binary(BinaryOp::add, as_matrix(residual), y);
  if (act == Activation::gelu_tanh) {
    result.pre = views::reshape(y, out_shape);
    y = unary(UnaryOp::gelu_tanh, y);
  }
  result.out = views::reshape(y, out_shape);
  return result;
}

LinearActivationGrads linear_backward_activation(const Tensor& grad_out, const Tensor& pre, Activation act,
                                                 bool need_bias) {
  TANDEM_CHECK_AS(ValueError, act == Activation::none || (pre.defined() && pre.shape() == grad_out.shape()),
                  "linear_backward: the activation's gradient needs the pre-activation shaped ",
                  shape_str(grad_out.shape()));
  LinearActivationGrads result;
  result.grad = as_matrix(grad_out);  // (M, N)
  if (act == Activation::gelu_tanh) {
    if (need_bias && grad_out.device().is_cuda()) {
      // GELU's backward and the bias gradient (d pre's column sums) in one pass; the weight's
      // product then needs no bias-gradient epilogue.
      const int64_t n = result.grad.shape()[1];
      Tensor d_pre = empty(result.grad.shape(), result.grad.options());  // (M, N)
      result.bias = empty({n}, result.grad.options());                   // (N,)
      cuda::gelu_backward_column_sums(result.grad, as_matrix(pre), d_pre, result.bias);
      result.grad = d_pre;
    } else {
      result.grad = unary_backward(UnaryOp::gelu_tanh, result.grad, as_matrix(pre));  // d pre (M, N)
    }
  } else if (need_bias && grad_out.device().is_cuda()) {
    // The bias gradient the same way, from the gradient as it is: the weight's product then needs
    // no bias-gradient epilogue either.
    result.bias = empty({result.grad.shape()[1]}, result.grad.options());  // (N,)
    cuda::column_sums(result.grad, result.bias);
  }
  return result;
}

Tensor linear_backward_input(const Tensor& grad, const Tensor& weight, const Shape& x_shape) {
  return views::reshape(matmul(grad, weight), x_shape);  // (M, N) @ (N, K)
}

LinearGrads linear_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& weight, bool need_weight,
                                   bool need_bias) {
  const int64_t n = weight.shape()[0];
  LinearGrads grads;
  if (need_weight) {
    Tensor x2 = as_matrix(x);  // (M, K)
    if (fused_on_cuda(grad, n, Activation::none) && grad.numel() > 0 && x2.numel() > 0) {
      Tensor gw = empty(weight.shape(), weight.options());              // (N, K)
      Tensor gb = need_bias ? empty({n}, weight.options()) : Tensor();  // (N,)
      if (cuda::linear_backward_weight(grad, x2, gw, gb)) {
        grads.weight = gw;
        if (need_bias) grads.bias = gb;
        return grads;
      }
    }
    grads.weight = matmul(views::transpose(grad, 0, 1), x2);  // (N, M) @ (M, K)
  }
  if (need_bias) grads.bias = reduce(ReduceOp::sum, grad, {0}, false);  // (N,)
  return grads;
}

LinearGrads linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& pre,
                            Activation act, bool need_x, bool need_weight, bool need_bias) {
  const int64_t n = weight.shape()[0];
  TANDEM_CHECK_AS(ValueError, grad_out.dim() >= 1 && grad_out.shape().back() == n, "linear_backward: grad_out ",
                  shape_str(grad_out.shape()), " must end in out_features ", n);
  TANDEM_CHECK_AS(ValueError, !need_weight || (x.defined() && x.shape() == output_shape(grad_out, weight.shape()[1])),
                  "linear_backward: the weight's gradient needs the input, shaped ",
                  shape_str(output_shape(grad_out, weight.shape()[1])));
  LinearActivationGrads a = linear_backward_activation(grad_out, pre, act, need_bias);
  Tensor gx = need_x ? linear_backward_input(a.grad, weight, output_shape(grad_out, weight.shape()[1])) : Tensor();
  LinearGrads grads = linear_backward_weight(a.grad, x, weight, need_weight, need_bias && !a.bias.defined());
  grads.x = gx;
  if (a.bias.defined()) grads.bias = a.bias;
  return grads;
}

bool weight_gradient_first(const Tensor& grad_out, const Tensor& weight) {
  if (!grad_out.device().is_cuda()) return false;
  const int64_t weight_gradient_bytes = weight.numel() * static_cast<int64_t>(dtype_size(grad_out.dtype()));
  return 4 * weight_gradient_bytes >= cuda::l2_cache_bytes(grad_out.device().index);
}

bool input_gelu_in_epilogue(const Tensor& grad_out, const Tensor& weight) {
  const int64_t n = weight.shape()[0], k = weight.shape()[1];
  const int64_t m = grad_out.numel() / std::max<int64_t>(n, 1);
  // 16-bit only: with DGELU in f32 GPT-2's TF32 step was 3% slower, in bf16 0.5% faster (one
  // H200, 2026-11-24). And only from kDgeluMinRows rows, or from kDgeluMinRowsLongSum rows where
  // the product sums over at least kDgeluLongSum (n): cuBLASLt runs DGELU on an older kernel that
  // is slow on few rows, where a plain matmul and GELU's backward take less time (so did tandem's
  // sm_90 kernel at GPT-2 B1 T1024's 1024 rows, a sum over 768: docs/performance-notes.md, "tandem's
  // CUTLASS kernels on sm_90"); over a sum of 4096 (the MLP benchmark's 1024 rows) the epilogue's extra
  // time is a smaller share of the product's, and less than GELU's pass with its gaps.
  constexpr int64_t kDgeluMinRows = 4096, kDgeluMinRowsLongSum = 1024, kDgeluLongSum = 4096;
  const bool half = grad_out.dtype() == DType::bf16 || grad_out.dtype() == DType::f16;
  const bool enough_rows = m >= kDgeluMinRows || (m >= kDgeluMinRowsLongSum && n >= kDgeluLongSum);
  return half && enough_rows && fused_on_cuda(grad_out, k, Activation::gelu_tanh) && n > 0;
}

LinearActivationGrads linear_backward_input_gelu(const Tensor& grad_out, const Tensor& weight, const Tensor& pre,
                                                 bool need_bias) {
  const int64_t n = weight.shape()[0], k = weight.shape()[1];
  TANDEM_CHECK_AS(ValueError, grad_out.dim() >= 1 && grad_out.shape().back() == n,
                  "linear_backward_input_gelu: grad_out ", shape_str(grad_out.shape()), " must end in out_features ",
                  n);
  TANDEM_CHECK_AS(ValueError, pre.defined() && pre.shape() == output_shape(grad_out, k),
                  "linear_backward_input_gelu: the pre-activation must be shaped ",
                  shape_str(output_shape(grad_out, k)));
  Tensor g = as_matrix(grad_out);  // (M, N)
  const int64_t m = g.shape()[0];
  LinearActivationGrads result;
  if (input_gelu_in_epilogue(grad_out, weight)) {
    Tensor d_pre = empty({m, k}, g.options());                     // (M, K)
    Tensor bias = need_bias ? empty({k}, g.options()) : Tensor();  // (K,)
    bool bias_summed = false;
    if (cuda::linear_backward_input_gelu(g, contiguous(weight), as_matrix(pre), d_pre, bias, &bias_summed)) {
      result.grad = views::reshape(d_pre, pre.shape());
      if (bias_summed) result.bias = bias;
      return result;
    }
  }
  Tensor d_pre = unary_backward(UnaryOp::gelu_tanh, matmul(g, weight), as_matrix(pre));  // (M, N) @ (N, K)
  result.grad = views::reshape(d_pre, pre.shape());
  return result;
}

}  // namespace tandem::kernels
