// The device-neutral side of elementwise ops: names, dtype rules, broadcasting, output
// allocation and routing to the backend of the inputs' device.
#include "tandem/core/elementwise.h"

#include "tandem/core/backend.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/views.h"

namespace tandem {

const char* unary_op_name(UnaryOp op) {
  switch (op) {
#define TANDEM_NAME(o, name, ...) \
  case UnaryOp::o: return name;
    TANDEM_UNARY_OPS(TANDEM_NAME)
#undef TANDEM_NAME
    case UnaryOp::logical_not: return "logical_not";
  }
  return "unary";
}

const char* binary_op_name(BinaryOp op) {
  switch (op) {
#define TANDEM_NAME(o, name, ...) \
  case BinaryOp::o: return name;
    TANDEM_BINARY_OPS(TANDEM_NAME)
#undef TANDEM_NAME
  }
  return "binary";
}

bool is_comparison(BinaryOp op) {
  switch (op) {
#define TANDEM_DOMAIN(o, name, domain, ...) \
  case BinaryOp::o: return elementwise::Domain::domain == elementwise::Domain::comparison;
    TANDEM_BINARY_OPS(TANDEM_DOMAIN)
#undef TANDEM_DOMAIN
  }
  return false;
}

bool is_floating_only(UnaryOp op) {
  switch (op) {
#define TANDEM_DOMAIN(o, name, domain, ...) \
  case UnaryOp::o: return elementwise::Domain::domain == elementwise::Domain::floating;
    TANDEM_UNARY_OPS(TANDEM_DOMAIN)
#undef TANDEM_DOMAIN
    case UnaryOp::logical_not: return false;
  }
  return false;
}

bool is_floating_only(BinaryOp op) {
  switch (op) {
#define TANDEM_DOMAIN(o, name, domain, ...) \
  case BinaryOp::o: return elementwise::Domain::domain == elementwise::Domain::floating;
    TANDEM_BINARY_OPS(TANDEM_DOMAIN)
#undef TANDEM_DOMAIN
  }
  return false;
}

namespace kernels {

namespace {
// PyTorch's rule for an elementwise output's layout: channels-last when the inputs of the
// output's shape (those not broadcast) are all channels-last, so activations stay in that layout
// from op to op; row-major otherwise.
MemoryFormat output_format(const Shape& shape, std::initializer_list<const Tensor*> inputs) {
  bool any = false;
  for (const Tensor* t : inputs) {
    if (t->shape() != shape) continue;
    if (t->suggest_memory_format() != MemoryFormat::channels_last) return MemoryFormat::contiguous;
    any = true;
  }
  return any ? MemoryFormat::channels_last : MemoryFormat::contiguous;
}
}  // namespace

Tensor unary(UnaryOp op, const Tensor& x, double alpha, double beta) {
  if (op == UnaryOp::pow_scalar && alpha == 2.0) op = UnaryOp::square;  // a multiply, not std::pow
  DType out_dtype = op == UnaryOp::logical_not ? DType::boolean : x.dtype();
  Tensor out = empty(x.shape(), TensorOptions(out_dtype, x.device()), x.suggest_memory_format());
  TANDEM_ROUTE(x.device(), unary, op, x, out, alpha, beta);
  return out;
}

Tensor unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, double alpha, double beta) {
  if (op == UnaryOp::pow_scalar && alpha == 2.0) op = UnaryOp::square;
  const char* name = unary_op_name(op);
  check_same_device(name, grad, x);
  check_same_dtype(name, grad, x);
  check_floating(name, x);
  TANDEM_CHECK_AS(ValueError, op != UnaryOp::logical_not, "unary_backward: logical_not has no gradient");
  TANDEM_CHECK_AS(ValueError, grad.shape() == x.shape(), name, " backward: the gradient's shape ",
                  shape_str(grad.shape()), " differs from the input's ", shape_str(x.shape()));
  Tensor out = empty(x.shape(), x.options(), output_format(x.shape(), {&grad, &x}));
  TANDEM_ROUTE(x.device(), unary_backward, op, grad, x, out, alpha, beta);
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_op_name(op);
  check_same_device(name, a, b);
  check_same_dtype(name, a, b);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType out_dtype = is_comparison(op) ? DType::boolean : a.dtype();
  Tensor out = empty(shape, TensorOptions(out_dtype, a.device()), output_format(shape, {&a, &b}));
  TANDEM_ROUTE(a.device(), binary, op, views::expand(a, shape), views::expand(b, shape), out);
  return out;
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_same_device("where", cond, a);
  check_same_device("where", a, b);
  check_same_dtype("where", a, b);
  TANDEM_CHECK_AS(TypeError, cond.dtype() == DType::boolean, "where: the condition must be bool, got ", cond.dtype());
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  Tensor out = empty(shape, a.options(), output_format(shape, {&cond, &a, &b}));
  TANDEM_ROUTE(a.device(), where, views::expand(cond, shape), views::expand(a, shape), views::expand(b, shape), out);
  return out;
}

void add_(const Tensor& dst, const Tensor& src, double alpha) {
  check_same_device("add_", dst, src);
  check_same_dtype("add_", dst, src);
  Tensor s = views::expand(src, dst.shape());
  if (layout_is_dense(dst.shape(), dst.strides())) {  // any dense layout: no element written twice
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

Tensor scale_unless_one(const Tensor& x, const Tensor& g, bool in_place) {
  check_floating("scale_unless_one", x);
  check_same_device("scale_unless_one", x, g);
  const DType stat = is_half(x.dtype()) ? DType::f32 : x.dtype();
  TANDEM_CHECK_AS(ValueError, g.dim() == 0 && g.dtype() == stat, "scale_unless_one: g must be a 0-dim ", stat,
                  " tensor for ", x.dtype(), " x, got shape ", shape_str(g.shape()), ", ", g.dtype());
  TANDEM_CHECK_AS(ValueError, x.is_contiguous(), "scale_unless_one: x must be contiguous, got strides ",
                  shape_str(x.strides()));
  Tensor out = in_place ? x : empty(x.shape(), x.options());
  TANDEM_ROUTE(x.device(), scale_unless_one, x, g, out);
  return out;
}

}  // namespace kernels
}  // namespace tandem
