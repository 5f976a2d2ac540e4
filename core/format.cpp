// Printing tensors for debugging: shape, dtype, device, then the values, elided when large.
#include <cmath>
#include <iomanip>
#include <sstream>

#include "tandem/core/tensor.h"

namespace tandem {

namespace {
constexpr int64_t kEdgeItems = 3;      // values shown at each end of an elided dim
constexpr int64_t kElideAbove = 1000;  // tensors with more elements are elided

void print_value(std::ostream& out, double v, DType dtype) {
  if (dtype == DType::boolean) out << (v != 0 ? "true" : "false");
  else if (!is_floating(dtype)) out << static_cast<int64_t>(v);
  else {
    std::ostringstream text;  // keeps the caller's stream settings untouched
    text << std::setprecision(6) << v;
    out << text.str();
  }
}

void print_dim(std::ostream& out, const std::vector<double>& values, const Shape& shape, const Strides& strides,
               size_t dim, int64_t base, bool elide, DType dtype, int indent) {
  if (dim == shape.size()) {
    print_value(out, values[static_cast<size_t>(base)], dtype);
    return;
  }
  out << "[";
  int64_t n = shape[dim];
  for (int64_t i = 0; i < n; ++i) {
    if (elide && n > 2 * kEdgeItems && i == kEdgeItems) {
      out << "...";
      i = n - kEdgeItems - 1;
      out << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
      continue;
    }
    print_dim(out, values, shape, strides, dim + 1, base + i * strides[dim], elide, dtype, indent + 1);
    if (i + 1 < n) out << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  out << "]";
}
}  // namespace

std::ostream& operator<<(std::ostream& out, const Tensor& t) {
  if (!t.defined()) return out << "Tensor(undefined)";
  out << "Tensor(shape=" << shape_str(t.shape()) << ", dtype=" << t.dtype() << ", device=" << t.device();
  if (t.requires_grad()) out << ", requires_grad";
  out << ")\n";
  std::vector<double> values = t.to_double_vector();
  print_dim(out, values, t.shape(), contiguous_strides(t.shape()), 0, 0, t.numel() > kElideAbove, t.dtype(), 0);
  return out;
}

}  // namespace tandem
