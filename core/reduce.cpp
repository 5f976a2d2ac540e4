// The device-neutral side of reductions: dims, output shapes, the (outer, reduced, inner) layout
// the backends reduce over.
#include "tandem/core/reduce.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "tandem/core/backend.h"
#include "tandem/core/content_hash.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/copy.h"
#include "tandem/core/views.h"

namespace tandem {

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

namespace kernels {

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

SquaredErrorWithGrad squared_error_with_grad(const Tensor& input, const Tensor& target, bool mean) {
  check_floating("mse_loss", input);
  check_same_device("mse_loss", input, target);
  TANDEM_CHECK_AS(ValueError, input.shape() == target.shape(), "mse_loss: input ", shape_str(input.shape()),
                  " and target ", shape_str(target.shape()), " must have the same shape");
  TANDEM_CHECK_AS(TypeError, input.dtype() == target.dtype(), "mse_loss: input is ", input.dtype(),
                  " but target is ", target.dtype(), "; they must have the same dtype");
  const DType loss_dtype = is_half(input.dtype()) ? DType::f32 : input.dtype();  // the compute type
  SquaredErrorWithGrad result{empty({}, TensorOptions(loss_dtype, input.device())),
                              empty(input.shape(), input.options())};  // (), like input
  if (input.numel() == 0) {  // as the composed mean and sum give: NaN and 0
    fill_(result.loss, mean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    return result;
  }
  TANDEM_ROUTE(input.device(), squared_error_with_grad, contiguous(input), contiguous(target), mean, result.loss,
               result.grad);
  return result;
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  int64_t lead = grad.dim() - static_cast<int64_t>(shape.size());
  TANDEM_CHECK_AS(ValueError, lead >= 0, "sum_to: cannot sum shape ", shape_str(grad.shape()), " down to ",
                  shape_str(shape));
  // Dims of size 1 need no sum (a batch of one broadcast over, GPT-2's positional embedding at
  // B 1): when every dim summed over has size 1 the result is a view of grad.
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < grad.dim(); ++d) {
    if (grad.shape()[d] != 1 && (d < lead || shape[d - lead] == 1)) dims.push_back(d);
  }
  Tensor summed = dims.empty() ? grad : reduce(ReduceOp::sum, grad, dims, true);
  return views::reshape(summed, shape);
}

std::vector<uint64_t> content_hashes(const std::vector<Tensor>& tensors) {
  std::vector<uint64_t> digests(tensors.size());
  std::vector<Device> devices;                  // the tensors' devices, in first-seen order
  std::vector<std::vector<size_t>> members;     // members[d]: indices of the tensors on devices[d]
  for (size_t i = 0; i < tensors.size(); ++i) {
    size_t d = std::find(devices.begin(), devices.end(), tensors[i].device()) - devices.begin();
    if (d == devices.size()) {
      devices.push_back(tensors[i].device());
      members.emplace_back();
    }
    members[d].push_back(i);
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    const int64_t k = static_cast<int64_t>(members[d].size());
    Tensor slots = empty({k}, TensorOptions(DType::i64, devices[d]));  // (k,) one digest per tensor
    fill_(slots, 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const Tensor& t = tensors[members[d][j]];
      Tensor words = contiguous(t);
      // The kernel reads 8-byte words: a view that starts mid-word is read from a copy.
      if (reinterpret_cast<uintptr_t>(words.data_ptr()) % 8 != 0) words = clone(t);
      TANDEM_ROUTE(devices[d], content_hash, words, views::narrow(slots, 0, j, 1));
    }
    const std::vector<int64_t> sums = to_device(slots, Device()).to_vector<int64_t>();
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = members[d][j];
      digests[i] = hashing::mix(static_cast<uint64_t>(sums[j]), tensors[i].nbytes());  // the length too
    }
  }
  return digests;
}

}  // namespace kernels
}  // namespace tandem
