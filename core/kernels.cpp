#include "tandem/core/kernels.h"

#include <algorithm>
#include <numeric>

#include "tandem/core/backend.h"
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

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::mean: return "mean";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
    case ReduceOp::argmax: return "argmax";
    case ReduceOp::argmin: return "argmin";
  }
  return "reduce";
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

// Calls the backend of `device` (the same function name exists in cpu:: and cuda::).
#define TANDEM_ROUTE(device, fn, ...) \
  ((device).is_cpu() ? cpu::fn(__VA_ARGS__) : cuda::fn(__VA_ARGS__))

namespace kernels {

namespace {
void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  TANDEM_CHECK_AS(DeviceError, a.device() == b.device(), op, ": tensors are on different devices, ", a.device(),
                  " and ", b.device(), " (move one with .to(device))");
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  TANDEM_CHECK_AS(TypeError, a.dtype() == b.dtype(), op, ": dtypes differ, ", a.dtype(), " (shape ",
                  shape_str(a.shape()), ") and ", b.dtype(), " (shape ", shape_str(b.shape()),
                  "); convert one with .to(dtype)");
}

void check_floating(const char* op, const Tensor& x) {
  TANDEM_CHECK_AS(TypeError, is_floating(x.dtype()), op, ": expected a floating-point tensor (f32, f64, f16, bf16), got ",
                  x.dtype());
}

Tensor index_as_i64(const char* op, const Tensor& index, Device device) {
  TANDEM_CHECK_AS(TypeError, index.dtype() == DType::i64 || index.dtype() == DType::i32, op,
                  ": index must be i64 or i32, got ", index.dtype());
  TANDEM_CHECK_AS(DeviceError, index.device() == device, op, ": index is on ", index.device(),
                  " but the tensor is on ", device);
  return contiguous(to_dtype(index, DType::i64));
}

// (outer, n, inner) view of a contiguous x around dim d.
Shape three_dims(const Shape& shape, int64_t d, int64_t middle) {
  int64_t outer = 1;
  int64_t inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) inner *= shape[i];
  return {outer, middle, inner};
}

Tensor as_three_dims(const Tensor& contiguous_x, int64_t d) {
  Shape s = three_dims(contiguous_x.shape(), d, contiguous_x.dim() == 0 ? 1 : contiguous_x.shape()[d]);
  return contiguous_x.as_strided(s, contiguous_strides(s), contiguous_x.offset());
}
}  // namespace

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

Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims_in, bool keepdim) {
  const char* name = reduce_op_name(op);
  bool arg = op == ReduceOp::argmax || op == ReduceOp::argmin;
  if (op == ReduceOp::mean) check_floating(name, x);
  TANDEM_CHECK_AS(ValueError, !arg || dims_in.size() <= 1, name, ": takes one dim or none, got ", dims_in.size());
  std::vector<int64_t> dims = reduction_dims(dims_in, x.dim(), name);
  bool flatten = arg && dims_in.empty();  // argmax over all elements indexes the flattened tensor
  Shape out_shape = flatten ? (keepdim ? Shape(x.dim(), 1) : Shape{}) : reduced_shape(x.shape(), dims, keepdim);
  TANDEM_CHECK_AS(ValueError, !flatten || x.numel() > 0, name, ": cannot reduce an empty tensor (shape ",
                  shape_str(x.shape()), ")");
  for (int64_t d : dims) {
    TANDEM_CHECK_AS(ValueError, x.shape()[d] > 0 || op == ReduceOp::sum || op == ReduceOp::mean, name,
                    ": cannot reduce over dim ", d, " of size 0 (an empty tensor of shape ", shape_str(x.shape()),
                    "): the result would have no value");
  }

  // Bring the tensor to (outer, reduced, inner): free when the reduced dims are adjacent in a
  // contiguous tensor, otherwise one permuting copy that moves them last.
  Tensor src = contiguous(x);
  bool adjacent = !dims.empty() && dims.back() - dims.front() + 1 == static_cast<int64_t>(dims.size());
  Shape three;
  if (flatten || dims.empty()) {
    three = {1, flatten ? x.numel() : 1, dims.empty() && !flatten ? x.numel() : 1};
  } else if (adjacent) {
    int64_t outer = 1, red = 1, inner = 1;
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (d < dims.front()) outer *= x.shape()[d];
      else if (d <= dims.back()) red *= x.shape()[d];
      else inner *= x.shape()[d];
    }
    three = {outer, red, inner};
  } else {
    std::vector<int64_t> order;
    int64_t outer = 1, red = 1;
    for (int64_t d = 0; d < x.dim(); ++d) {
      if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
        order.push_back(d);
        outer *= x.shape()[d];
      }
    }
    for (int64_t d : dims) {
      order.push_back(d);
      red *= x.shape()[d];
    }
    src = contiguous(views::permute(x, order));
    three = {outer, red, 1};
  }
  Tensor src3 = src.as_strided(three, contiguous_strides(three), src.offset());
  DType out_dtype = arg ? DType::i64 : x.dtype();
  Tensor out = empty(out_shape, TensorOptions(out_dtype, x.device()));
  Tensor out2 = out.as_strided({three[0], three[2]}, contiguous_strides({three[0], three[2]}), 0);
  TANDEM_ROUTE(x.device(), reduce, op, src3, out2);
  return out;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  TANDEM_CHECK_AS(ValueError, lead >= 0, "sum_to: cannot sum shape ", shape_str(grad.shape()), " down to ",
                  shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && grad.shape()[d] != 1)) dims.push_back(d);
  }
  Tensor summed = dims.empty() ? grad : reduce(ReduceOp::sum, grad, dims, true);
  return views::reshape(summed, shape);
}

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

CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                          double label_smoothing) {
  check_floating("cross_entropy", logits);
  TANDEM_CHECK_AS(ValueError, logits.dim() == 2, "cross_entropy: logits must be (N, C), got shape ",
                  shape_str(logits.shape()));
  TANDEM_CHECK_AS(ValueError, target.dim() == 1 && target.shape()[0] == logits.shape()[0],
                  "cross_entropy: target must be (N,) = (", logits.shape()[0], ",) for logits ",
                  shape_str(logits.shape()), ", got shape ", shape_str(target.shape()));
  TANDEM_CHECK_AS(ValueError, label_smoothing >= 0.0 && label_smoothing <= 1.0,
                  "cross_entropy: label_smoothing must be in [0, 1], got ", label_smoothing);
  Tensor t = index_as_i64("cross_entropy", target, logits.device());
  int64_t n = logits.shape()[0];
  DType stat = is_half(logits.dtype()) ? DType::f32 : logits.dtype();
  CrossEntropyForward result{empty({n}, TensorOptions(stat, logits.device())),
                             empty({n}, TensorOptions(stat, logits.device()))};
  TANDEM_ROUTE(logits.device(), cross_entropy_forward, contiguous(logits), t, result.losses, result.lse, ignore_index,
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

namespace {
// Flattens the batch dims (all but the last two) of x into one, as a view when the layout
// allows and through a contiguous copy otherwise: (b1..bn, R, C) -> (B, R, C).
Tensor flatten_batch(const Tensor& x) {
  int64_t nb = x.dim() - 2;
  int64_t batch = 1;
  for (int64_t d = 0; d < nb; ++d) batch *= x.shape()[d];
  Shape s = {batch, x.shape()[nb], x.shape()[nb + 1]};
  // Collapsible when every batch stride is 0 (pure broadcast) or each continues the next
  // non-trivial one. Size-1 dims are skipped: their stride can be anything (0 after a broadcast).
  bool all_zero = true;
  bool chained = true;
  int64_t inner_batch = -1;  // innermost batch dim of size > 1
  for (int64_t d = 0; d < nb; ++d) {
    all_zero = all_zero && (x.strides()[d] == 0 || x.shape()[d] == 1);
    if (x.shape()[d] == 1) continue;
    if (inner_batch >= 0 && x.strides()[inner_batch] != x.strides()[d] * x.shape()[d]) chained = false;
    inner_batch = d;
  }
  if (nb == 0 || inner_batch < 0) return x.as_strided(s, {0, x.strides()[nb], x.strides()[nb + 1]}, x.offset());
  if (all_zero) return x.as_strided(s, {0, x.strides()[nb], x.strides()[nb + 1]}, x.offset());
  if (chained) return x.as_strided(s, {x.strides()[inner_batch], x.strides()[nb], x.strides()[nb + 1]}, x.offset());
  Tensor c = contiguous(x);
  return c.as_strided(s, contiguous_strides(s), c.offset());
}
}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check_same_device("matmul", a_in, b_in);
  check_same_dtype("matmul", a_in, b_in);
  check_floating("matmul", a_in);
  TANDEM_CHECK_AS(ValueError, a_in.dim() >= 1 && b_in.dim() >= 1, "matmul: operands must have at least 1 dim, got ",
                  shape_str(a_in.shape()), " @ ", shape_str(b_in.shape()));
  Tensor a = a_in.dim() == 1 ? views::unsqueeze(a_in, 0) : a_in;  // (K) -> (1, K)
  Tensor b = b_in.dim() == 1 ? views::unsqueeze(b_in, 1) : b_in;  // (K) -> (K, 1)
  int64_t m = a.shape()[a.dim() - 2], k = a.shape()[a.dim() - 1];
  int64_t k2 = b.shape()[b.dim() - 2], n = b.shape()[b.dim() - 1];
  TANDEM_CHECK_AS(ValueError, k == k2, "matmul: ", shape_str(a_in.shape()), " @ ", shape_str(b_in.shape()),
                  ": inner sizes ", k, " and ", k2, " differ");
  Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  Shape batch = broadcast_shapes(a_batch, b_batch, "matmul");
  Shape a_full = batch, b_full = batch, out_shape = batch;
  a_full.insert(a_full.end(), {m, k});
  b_full.insert(b_full.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  Tensor out = empty(out_shape, a.options());
  Shape out3 = {shape_numel(batch), m, n};
  TANDEM_ROUTE(a.device(), matmul, flatten_batch(views::expand(a, a_full)), flatten_batch(views::expand(b, b_full)),
               out.as_strided(out3, contiguous_strides(out3), 0));
  if (a_in.dim() == 1) out = views::squeeze(out, -2);
  if (b_in.dim() == 1) out = views::squeeze(out, -1);
  return out;
}

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

Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  int64_t d = wrap_dim(dim, static_cast<int64_t>(shape.size()), "index_add");
  Tensor idx = index_as_i64("index_add", index, src.device());
  Tensor out = zeros(shape, src.options());
  Tensor s = contiguous(src);
  TANDEM_ROUTE(src.device(), index_add, as_three_dims(out, d), idx, as_three_dims(s, d));
  return out;
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

namespace {
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;  // floor: C++ division would round a negative span up to 0
}

void check_nchw(const char* op, const Tensor& x) {
  check_floating(op, x);
  TANDEM_CHECK_AS(ValueError, x.dim() == 4, op, ": expected an (N, C, H, W) tensor, got shape ", shape_str(x.shape()));
}

// Statistics and affine parameters of batch norm are f32 for 16-bit inputs.
DType stats_dtype(DType dtype) { return is_half(dtype) ? DType::f32 : dtype; }
}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dParams& p) {
  check_nchw("conv2d", x);
  check_same_device("conv2d", x, weight);
  check_same_dtype("conv2d", x, weight);
  TANDEM_CHECK_AS(ValueError, weight.dim() == 4, "conv2d: weight must be (K, C / groups, R, S), got shape ",
                  shape_str(weight.shape()));
  TANDEM_CHECK_AS(ValueError, p.groups >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 &&
                  p.dilation_w >= 1 && p.pad_h >= 0 && p.pad_w >= 0,
                  "conv2d: stride, dilation and groups must be >= 1 and padding >= 0");
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const int64_t k = weight.shape()[0], r = weight.shape()[2], s = weight.shape()[3];
  TANDEM_CHECK_AS(ValueError, c % p.groups == 0 && k % p.groups == 0 && weight.shape()[1] * p.groups == c,
                  "conv2d: input ", shape_str(x.shape()), " has ", c, " channels but weight ", shape_str(weight.shape()),
                  " with groups=", p.groups, " expects ", weight.shape()[1] * p.groups);
  const int64_t out_h = conv_output_size(h, r, p.stride_h, p.pad_h, p.dilation_h);
  const int64_t out_w = conv_output_size(w, s, p.stride_w, p.pad_w, p.dilation_w);
  TANDEM_CHECK_AS(ValueError, out_h > 0 && out_w > 0, "conv2d: input ", shape_str(x.shape()), " is smaller than the ",
                  r, "x", s, " kernel (with padding ", p.pad_h, "x", p.pad_w, " and dilation ", p.dilation_h, "x",
                  p.dilation_w, ")");
  Tensor out = empty({n, k, out_h, out_w}, x.options());
  if (out.numel() == 0) return out;
  TANDEM_ROUTE(x.device(), conv2d_forward, contiguous(x), contiguous(weight), out, p);
  return out;
}

Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dParams& p) {
  Tensor grad_x = empty(input_shape, grad_out.options());
  TANDEM_ROUTE(grad_out.device(), conv2d_backward_input, contiguous(grad_out), contiguous(weight), grad_x, p);
  return grad_x;
}

Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dParams& p) {
  Tensor grad_w = empty(weight_shape, grad_out.options());
  TANDEM_ROUTE(grad_out.device(), conv2d_backward_weight, contiguous(grad_out), contiguous(x), grad_w, p);
  return grad_w;
}

Tensor pool2d(const Tensor& x, const Pool2dParams& p) {
  const char* name = p.mode == PoolMode::max ? "max_pool2d" : "avg_pool2d";
  check_nchw(name, x);
  TANDEM_CHECK_AS(ValueError, p.kernel_h >= 1 && p.kernel_w >= 1 && p.stride_h >= 1 && p.stride_w >= 1, name,
                  ": kernel and stride must be >= 1");
  TANDEM_CHECK_AS(ValueError, p.pad_h >= 0 && 2 * p.pad_h <= p.kernel_h && p.pad_w >= 0 && 2 * p.pad_w <= p.kernel_w,
                  name, ": padding must be at most half the kernel, got padding ", p.pad_h, "x", p.pad_w,
                  " for kernel ", p.kernel_h, "x", p.kernel_w);
  const int64_t out_h = conv_output_size(x.shape()[2], p.kernel_h, p.stride_h, p.pad_h, 1);
  const int64_t out_w = conv_output_size(x.shape()[3], p.kernel_w, p.stride_w, p.pad_w, 1);
  TANDEM_CHECK_AS(ValueError, out_h > 0 && out_w > 0, name, ": input ", shape_str(x.shape()), " is smaller than the ",
                  p.kernel_h, "x", p.kernel_w, " window");
  Tensor out = empty({x.shape()[0], x.shape()[1], out_h, out_w}, x.options());
  if (out.numel() == 0) return out;
  TANDEM_ROUTE(x.device(), pool2d_forward, contiguous(x), out, p);
  return out;
}

Tensor pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Pool2dParams& p) {
  Tensor grad_x = empty(x.shape(), x.options());
  TANDEM_ROUTE(x.device(), pool2d_backward, contiguous(grad_out), contiguous(x), contiguous(out), grad_x, p);
  return grad_x;
}

BatchNormForward batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, bool training, double momentum, double eps) {
  check_nchw("batch_norm", x);
  const int64_t c = x.shape()[1];
  DType stat = stats_dtype(x.dtype());
  for (const Tensor* t : {&weight, &bias, &running_mean, &running_var}) {
    TANDEM_CHECK_AS(ValueError, t->dim() == 1 && t->shape()[0] == c, "batch_norm: weight, bias and running statistics must be (",
                    c, ",) for input ", shape_str(x.shape()), ", got shape ", shape_str(t->shape()));
    TANDEM_CHECK_AS(TypeError, t->dtype() == stat, "batch_norm: weight, bias and running statistics must be ", stat,
                    " for ", x.dtype(), " input, got ", t->dtype());
    check_same_device("batch_norm", x, *t);
    TANDEM_CHECK_AS(ValueError, t->is_contiguous(), "batch_norm: per-channel tensors must be contiguous");
  }
  if (training) {
    TANDEM_CHECK_AS(ValueError, x.numel() / c > 1, "batch_norm: training needs more than one value per channel, got input ",
                    shape_str(x.shape()));
  }
  BatchNormForward result;
  result.out = empty(x.shape(), x.options());
  Tensor xc = contiguous(x);
  if (training) {
    result.save_mean = empty({c}, TensorOptions(stat, x.device()));
    result.save_invstd = empty({c}, TensorOptions(stat, x.device()));
    TANDEM_ROUTE(x.device(), batch_norm_forward_training, xc, weight, bias, running_mean, running_var, result.out,
                 result.save_mean, result.save_invstd, momentum, eps);
  } else {
    TANDEM_ROUTE(x.device(), batch_norm_forward_inference, xc, weight, bias, running_mean, running_var, result.out, eps);
  }
  return result;
}

BatchNormBackward batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                      const Tensor& save_mean, const Tensor& save_invstd) {
  BatchNormBackward result{empty(x.shape(), x.options()), empty(weight.shape(), weight.options()),
                           empty(weight.shape(), weight.options())};
  TANDEM_ROUTE(x.device(), batch_norm_backward, contiguous(grad_out), contiguous(x), weight, save_mean, save_invstd,
               result.grad_input, result.grad_weight, result.grad_bias);
  return result;
}

void copy_(const Tensor& dst, const Tensor& src) {
  Tensor s = views::expand(src, dst.shape());
  if (dst.numel() == 0) return;
  if (s.device() == dst.device()) {
    TANDEM_ROUTE(dst.device(), copy, s, dst);
    return;
  }
  // Across devices: make a contiguous copy on the source device, move its bytes, then lay them
  // out (and cast) on the destination device.
  Tensor packed = contiguous(s);
  Tensor staged = empty(packed.shape(), TensorOptions(packed.dtype(), dst.device()));
  if (src.device().is_cpu()) {
    cuda::copy_host_to_device(staged.data_ptr(), packed.data_ptr(), packed.nbytes(), dst.device().index);
  } else if (dst.device().is_cpu()) {
    cuda::copy_device_to_host(staged.data_ptr(), packed.data_ptr(), packed.nbytes(), src.device().index);
  } else {
    cuda::copy_device_to_device(staged.data_ptr(), dst.device().index, packed.data_ptr(), src.device().index,
                                packed.nbytes());
  }
  TANDEM_ROUTE(dst.device(), copy, staged, dst);
}

void fill_(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  TANDEM_ROUTE(dst.device(), fill, dst, value);
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }

Tensor clone(const Tensor& x) {
  Tensor out = empty(x.shape(), x.options());
  copy_(out, x);
  return out;
}

Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = empty(x.shape(), TensorOptions(dtype, x.device()));
  copy_(out, x);
  return out;
}

Tensor to_device(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  Tensor out = empty(x.shape(), TensorOptions(x.dtype(), device));
  copy_(out, x);
  return out;
}

void random_(const Tensor& out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2) {
  check_floating("random", out);
  TANDEM_CHECK_AS(ValueError, out.is_contiguous(), "random: the output must be contiguous");
  if (out.numel() == 0) return;
  TANDEM_ROUTE(out.device(), random, out, kind, seed, offset, p1, p2);
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

namespace {
// The tensors of one fused optimizer update that share a device and a parameter dtype, all
// contiguous: a parameter in another layout is updated through a copy written back after.
struct UpdateGroup {
  UpdateTensors tensors;
  std::vector<std::pair<Tensor, Tensor>> write_back;  // (parameter, its contiguous working copy)
};

void check_scalar_f32(const char* op, const char* what, const Tensor& t, const Tensor& p) {
  TANDEM_CHECK_AS(TypeError, t.dtype() == DType::f32 && t.dim() == 0, op, ": ", what,
                  " must be a 0-dim f32 tensor, got ", t.dtype(), " of shape ", shape_str(t.shape()));
  check_same_device(op, p, t);
}

// Checks the lists of a fused optimizer update and splits them by device and dtype.
std::vector<UpdateGroup> group_update(const char* op, const UpdateTensors& t, size_t roles, bool with_steps) {
  const size_t n = t.params.size();
  TANDEM_CHECK_AS(ValueError, t.grads.size() == n, op, ": ", n, " parameters but ", t.grads.size(), " gradients");
  TANDEM_CHECK_AS(ValueError, t.states.size() == roles, op, ": expected ", roles, " state lists, got ",
                  t.states.size());
  for (const std::vector<Tensor>& role : t.states) {
    TANDEM_CHECK_AS(ValueError, role.size() == n, op, ": ", n, " parameters but ", role.size(),
                    " state tensors in one of the state lists");
  }
  TANDEM_CHECK_AS(ValueError, !with_steps || t.steps.size() == n, op, ": ", n, " parameters but ", t.steps.size(),
                  " step counts");
  TANDEM_CHECK_AS(ValueError, t.masters.empty() || t.masters.size() == n, op, ": ", n, " parameters but ",
                  t.masters.size(), " master weights (give none or one per parameter)");
  TANDEM_CHECK_AS(ValueError, t.found_inf.defined() || !t.inv_scale.defined(), op,
                  ": inv_scale given without found_inf");
  std::vector<UpdateGroup> groups;
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = t.params[i];
    const Tensor& g = t.grads[i];
    check_floating(op, p);
    check_same_device(op, p, g);
    check_same_dtype(op, p, g);
    TANDEM_CHECK_AS(ValueError, g.shape() == p.shape(), op, ": gradient ", i, " has shape ", shape_str(g.shape()),
                    " but its parameter has shape ", shape_str(p.shape()));
    const DType state_dtype = optimizer_state_dtype(p.dtype());
    for (const std::vector<Tensor>& role : t.states) {
      const Tensor& s = role[i];
      check_same_device(op, p, s);
      TANDEM_CHECK_AS(TypeError, s.dtype() == state_dtype, op, ": state tensor ", i, " is ", s.dtype(), " but a ",
                      p.dtype(), " parameter keeps its state in ", state_dtype);
      TANDEM_CHECK_AS(ValueError, s.shape() == p.shape(), op, ": state tensor ", i, " has shape ",
                      shape_str(s.shape()), " but its parameter has shape ", shape_str(p.shape()));
      TANDEM_CHECK_AS(ValueError, s.is_contiguous(), op, ": state tensor ", i, " must be contiguous");
    }
    if (with_steps) check_scalar_f32(op, "a step count", t.steps[i], p);
    Tensor master = t.masters.empty() ? Tensor() : t.masters[i];
    if (master.defined()) {
      check_same_device(op, p, master);
      TANDEM_CHECK_AS(TypeError, master.dtype() == DType::f32 && is_half(p.dtype()), op, ": master weight ", i,
                      " is ", master.dtype(), " for a ", p.dtype(), " parameter; master weights are f32, for f16 "
                      "and bf16 parameters");
      TANDEM_CHECK_AS(ValueError, master.shape() == p.shape() && master.is_contiguous(), op, ": master weight ", i,
                      " must be contiguous and of its parameter's shape ", shape_str(p.shape()));
    }
    if (t.found_inf.defined()) check_scalar_f32(op, "found_inf", t.found_inf, p);
    if (t.inv_scale.defined()) check_scalar_f32(op, "inv_scale", t.inv_scale, p);
    if (p.numel() == 0) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const UpdateGroup& u) {
      return u.tensors.params[0].device() == p.device() && u.tensors.params[0].dtype() == p.dtype();
    });
    if (it == groups.end()) {
      UpdateGroup fresh;
      fresh.tensors.states.resize(roles);
      fresh.tensors.found_inf = t.found_inf;
      fresh.tensors.inv_scale = t.inv_scale;
      groups.push_back(std::move(fresh));
      it = groups.end() - 1;
    }
    UpdateTensors& out = it->tensors;
    Tensor work = contiguous(p);
    if (!work.is_same(p)) it->write_back.emplace_back(p, work);
    out.params.push_back(work);
    out.grads.push_back(contiguous(g));
    for (size_t k = 0; k < roles; ++k) out.states[k].push_back(t.states[k][i]);
    if (with_steps) out.steps.push_back(t.steps[i]);
    out.masters.push_back(master);
  }
  for (UpdateGroup& g : groups) {
    const auto& m = g.tensors.masters;
    if (std::none_of(m.begin(), m.end(), [](const Tensor& x) { return x.defined(); })) g.tensors.masters.clear();
  }
  return groups;
}

void finish_update(const UpdateGroup& group) {
  for (const auto& [param, work] : group.write_back) copy_(param, work);
}
}  // namespace

void sgd_step(const UpdateTensors& t, const SgdHyper& h) {
  const bool momentum = h.momentum != 0.0;
  TANDEM_CHECK_AS(ValueError, momentum || t.states.empty(), "sgd_step: momentum buffers given but the momentum is 0");
  TANDEM_CHECK_AS(ValueError, !h.nesterov || (h.momentum > 0.0 && h.dampening == 0.0),
                  "sgd_step: Nesterov momentum requires a momentum > 0 and zero dampening, got momentum ",
                  h.momentum, " and dampening ", h.dampening);
  for (const UpdateGroup& g : group_update("sgd_step", t, momentum ? 1 : 0, false)) {
    TANDEM_ROUTE(g.tensors.params[0].device(), sgd_step, g.tensors, h);
    finish_update(g);
  }
}

void adamw_step(const UpdateTensors& t, const AdamWHyper& h) {
  for (const UpdateGroup& g : group_update("adamw_step", t, 2, true)) {
    TANDEM_ROUTE(g.tensors.params[0].device(), adamw_step, g.tensors, h);
    finish_update(g);
  }
}

void non_finite_check_and_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& inv_scale) {
  const char* op = "non_finite_check_and_unscale_";
  // Grouped by device and dtype; gradients in another layout go through a contiguous copy.
  std::vector<std::vector<Tensor>> groups;
  std::vector<std::pair<Tensor, Tensor>> write_back;
  for (const Tensor& g : grads) {
    check_floating(op, g);
    check_scalar_f32(op, "found_inf", found_inf, g);
    if (inv_scale.defined()) check_scalar_f32(op, "inv_scale", inv_scale, g);
    if (g.numel() == 0) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const std::vector<Tensor>& u) {
      return u[0].device() == g.device() && u[0].dtype() == g.dtype();
    });
    if (it == groups.end()) it = groups.insert(groups.end(), std::vector<Tensor>());
    Tensor work = contiguous(g);
    if (!work.is_same(g) && inv_scale.defined()) write_back.emplace_back(g, work);
    it->push_back(work);
  }
  for (const std::vector<Tensor>& group : groups) {
    TANDEM_ROUTE(group[0].device(), non_finite_check_and_unscale_, group, found_inf, inv_scale);
  }
  for (const auto& [grad, work] : write_back) copy_(grad, work);
}

void update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth,
                   double backoff, int64_t growth_interval) {
  const char* op = "update_scale_";
  check_scalar_f32(op, "scale", scale, scale);
  check_scalar_f32(op, "found_inf", found_inf, scale);
  TANDEM_CHECK_AS(TypeError, growth_tracker.dtype() == DType::i32 && growth_tracker.dim() == 0, op,
                  ": growth_tracker must be a 0-dim i32 tensor, got ", growth_tracker.dtype());
  check_same_device(op, scale, growth_tracker);
  TANDEM_CHECK_AS(ValueError, growth > 1.0 && backoff > 0.0 && backoff < 1.0 && growth_interval >= 1, op,
                  ": expected growth > 1, 0 < backoff < 1 and growth_interval >= 1, got ", growth, ", ", backoff,
                  " and ", growth_interval);
  TANDEM_ROUTE(scale.device(), update_scale_, scale, growth_tracker, found_inf, growth, backoff, growth_interval);
}

}  // namespace kernels
}  // namespace tandem
