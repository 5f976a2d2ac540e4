// The device-neutral side of elementwise ops: names, dtype rules, broadcasting, output
// allocation and routing to the backend of the inputs' device.
#include "tandem/core/elementwise.h"

#include "tandem/core/backend.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/views.h"

namespace tandem {

const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::neg: return "neg";
    case UnaryOp::abs: return "abs";
    case UnaryOp::exp: return "exp";
    case UnaryOp::log: return "log";
    case UnaryOp::sqrt: return "sqrt";
    case UnaryOp::rsqrt: return "rsqrt";
    case UnaryOp::tanh: return "tanh";
    case UnaryOp::sigmoid: return "sigmoid";
    case UnaryOp::relu: return "relu";
    case UnaryOp::gelu_tanh: return "gelu(tanh)";
    case UnaryOp::gelu_erf: return "gelu(erf)";
    case UnaryOp::sign: return "sign";
    case UnaryOp::pow_scalar: return "pow";
    case UnaryOp::clamp: return "clamp";
    case UnaryOp::scale: return "scale";
    case UnaryOp::logical_not: return "logical_not";
  }
  return "unary";
}

const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add: return "add";
    case BinaryOp::sub: return "sub";
    case BinaryOp::mul: return "mul";
    case BinaryOp::div: return "div";
    case BinaryOp::pow: return "pow";
    case BinaryOp::maximum: return "maximum";
    case BinaryOp::minimum: return "minimum";
    case BinaryOp::eq: return "eq";
    case BinaryOp::ne: return "ne";
    case BinaryOp::lt: return "lt";
    case BinaryOp::le: return "le";
    case BinaryOp::gt: return "gt";
    case BinaryOp::ge: return "ge";
    case BinaryOp::relu_backward: return "relu_backward";
    case BinaryOp::gelu_tanh_backward: return "gelu_tanh_backward";
    case BinaryOp::gelu_erf_backward: return "gelu_erf_backward";
  }
  return "binary";
}


bool is_comparison(BinaryOp op) {
  return op == BinaryOp::eq || op == BinaryOp::ne || op == BinaryOp::lt || op == BinaryOp::le ||
         op == BinaryOp::gt || op == BinaryOp::ge;
}

bool is_floating_only(UnaryOp op) {
  switch (op) {
    case UnaryOp::exp:
    case UnaryOp::log:
    case UnaryOp::sqrt:
    case UnaryOp::rsqrt:
    case UnaryOp::tanh:
    case UnaryOp::sigmoid:
    case UnaryOp::gelu_tanh:
    case UnaryOp::gelu_erf:
    case UnaryOp::pow_scalar: return true;
    default: return false;
  }
}

bool is_floating_only(BinaryOp op) {
  return op == BinaryOp::div || op == BinaryOp::pow || op == BinaryOp::relu_backward ||
         op == BinaryOp::gelu_tanh_backward || op == BinaryOp::gelu_erf_backward;
}

namespace kernels {

Tensor unary(UnaryOp op, const Tensor& x, double alpha, double beta) {
  DType out_dtype = op == UnaryOp::logical_not ? DType::boolean : x.dtype();
  Tensor out = empty(x.shape(), TensorOptions(out_dtype, x.device()));
  TANDEM_ROUTE(x.device(), unary, op, x, out, alpha, beta);
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  check_same_device(name, a, b);
  check_same_dtype(name, a, b);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType out_dtype = is_comparison(op) ? DType::boolean : a.dtype();
  Tensor out = empty(shape, TensorOptions(out_dtype, a.device()));
  TANDEM_ROUTE(a.device(), binary, op, views::expand(a, shape), views::expand(b, shape), out);
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same_device("where", cond, a);
  check_same_device("where", a, b);
  check_same_dtype("where", a, b);
  TANDEM_CHECK_AS(TypeError, cond.dtype() == DType::boolean, "where: the condition must be bool, got ", cond.dtype());
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = empty(shape, a.options());
  TANDEM_ROUTE(a.device(), where, views::expand(cond, shape), views::expand(a, shape), views::expand(b, shape), out);
  return out;
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  check_same_device("add_", dst, src);
  check_same_dtype("add_", dst, src);
  Tensor s = views::expand(src, dst.shape());
  if (dst.is_contiguous()) {
    TANDEM_ROUTE(dst.device(), add_inplace, dst, s, alpha);
    return;
  }
  Tensor tmp = contiguous(dst);
  TANDEM_ROUTE(dst.device(), add_inplace, tmp, s, alpha);
  copy_(dst, tmp);
}

void mul_(const Tensor& dst, double value) {
  Tensor scaled = unary(UnaryOp::scale, dst, value);
  copy_(dst, scaled);
}

}  // namespace kernels
}  // namespace tandem
