#include "tandem/core/shape.h"

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t step = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = step;
    step *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    TANDEM_CHECK_AS(ValueError, da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ",
                    shape_str(b), " do not broadcast: sizes ", da, " and ", db, " differ at dim ", i,
                    " of the result (each must match or be 1)");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t lo = ndim == 0 ? -1 : -ndim;
  int64_t hi = ndim == 0 ? 0 : ndim - 1;
  TANDEM_CHECK_AS(IndexError, dim >= lo && dim <= hi, op, ": dim ", dim, " is out of range for a tensor of ",
                  ndim, " dims (expected ", lo, " to ", hi, ")");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

std::vector<int64_t> reduction_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t d = 0; d < ndim; ++d) out.push_back(d);
    return out;
  }
  for (int64_t d : dims) out.push_back(ndim == 0 ? (wrap_dim(d, ndim, op), 0) : wrap_dim(d, ndim, op));
  std::sort(out.begin(), out.end());
  TANDEM_CHECK_AS(ValueError, std::adjacent_find(out.begin(), out.end()) == out.end(), op,
                  ": a dim appears twice in the reduction dims");
  if (ndim == 0) out.clear();
  return out;
}

Shape reduced_shape(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!reduced) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

CollapsedDims collapse_dims(const Shape& shape, const std::vector<Strides>& strides) {
  CollapsedDims out;
  out.strides.resize(strides.size());
  // Visit dims in the last operand's memory order (largest stride first; stable, so a row-major
  // last operand keeps the logical order): a channels-last output then runs as one dense loop.
  std::vector<size_t> order;  // the dims of size other than 1, which are all a loop visits
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] != 1) order.push_back(d);
  }
  if (!strides.empty()) {
    const Strides& last = strides.back();
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return last[a] > last[b]; });
  }
  for (size_t d : order) {
    bool merge = !out.sizes.empty();
    for (size_t k = 0; k < strides.size() && merge; ++k) merge = out.strides[k].back() == strides[k][d] * shape[d];
    if (merge) {
      out.sizes.back() *= shape[d];
      for (size_t k = 0; k < strides.size(); ++k) out.strides[k].back() = strides[k][d];
    } else {
      out.sizes.push_back(shape[d]);
      for (size_t k = 0; k < strides.size(); ++k) out.strides[k].push_back(strides[k][d]);
    }
  }
  if (out.sizes.empty()) {  // a single element
    out.sizes.push_back(1);
    for (auto& s : out.strides) s.push_back(0);
  }
  return out;
}

}  // namespace tandem
