// Tensor's differentiable methods (declared in core/tensor.h): each is the free function of
// autograd/ops.h of the same name, so x.sum({1}) and sum(x, {1}) are one op. Qualified calls,
// since inside a member the member's own name would be found first.
#include "tandem/autograd/ops.h"
#include "tandem/core/tensor.h"

namespace tandem {

Tensor Tensor::to(Device device) const { return ::tandem::to(*this, device); }
Tensor Tensor::to(DType dtype) const { return ::tandem::to(*this, dtype); }
Tensor Tensor::reshape(const Shape& shape) const { return ::tandem::reshape(*this, shape); }
Tensor Tensor::view(const Shape& shape) const { return ::tandem::view(*this, shape); }
Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const { return ::tandem::flatten(*this, start_dim, end_dim); }
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const { return ::tandem::transpose(*this, dim0, dim1); }
Tensor Tensor::permute(const std::vector<int64_t>& order) const { return ::tandem::permute(*this, order); }
Tensor Tensor::t() const { return ::tandem::t(*this); }
Tensor Tensor::unsqueeze(int64_t dim) const { return ::tandem::unsqueeze(*this, dim); }
Tensor Tensor::squeeze() const { return ::tandem::squeeze(*this); }
Tensor Tensor::squeeze(int64_t dim) const { return ::tandem::squeeze(*this, dim); }
Tensor Tensor::expand(const Shape& shape) const { return ::tandem::expand(*this, shape); }
Tensor Tensor::narrow(int64_t dim, int64_t start, int64_t length) const {
  return ::tandem::narrow(*this, dim, start, length);
}
Tensor Tensor::contiguous() const { return ::tandem::contiguous(*this); }
Tensor Tensor::contiguous(MemoryFormat format) const { return ::tandem::contiguous(*this, format); }
Tensor Tensor::to(MemoryFormat format) const { return ::tandem::to(*this, format); }
Tensor Tensor::clone() const { return ::tandem::clone(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const { return ::tandem::sum(*this, dims, keepdim); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return ::tandem::mean(*this, dims, keepdim);
}
Tensor Tensor::max() const { return ::tandem::amax(*this); }
Tensor Tensor::min() const { return ::tandem::amin(*this); }
Tensor Tensor::argmax() const { return ::tandem::argmax(*this); }
Tensor Tensor::matmul(const Tensor& other) const { return ::tandem::matmul(*this, other); }
Tensor Tensor::pow(double exponent) const { return ::tandem::pow(*this, exponent); }
Tensor Tensor::pow(const Tensor& exponent) const { return ::tandem::pow(*this, exponent); }
Tensor Tensor::exp() const { return ::tandem::exp(*this); }
Tensor Tensor::log() const { return ::tandem::log(*this); }
Tensor Tensor::sqrt() const { return ::tandem::sqrt(*this); }
Tensor Tensor::abs() const { return ::tandem::abs(*this); }
Tensor Tensor::neg() const { return ::tandem::neg(*this); }
Tensor Tensor::sin() const { return ::tandem::sin(*this); }
Tensor Tensor::cos() const { return ::tandem::cos(*this); }
Tensor Tensor::tanh() const { return ::tandem::tanh(*this); }
Tensor Tensor::sigmoid() const { return ::tandem::sigmoid(*this); }
Tensor Tensor::relu() const { return ::tandem::relu(*this); }
Tensor Tensor::softmax(int64_t dim) const { return ::tandem::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return ::tandem::log_softmax(*this, dim); }
Tensor Tensor::clamp(double min, double max) const { return ::tandem::clamp(*this, min, max); }
Tensor Tensor::masked_fill(const Tensor& mask, double value) const { return ::tandem::masked_fill(*this, mask, value); }
Tensor Tensor::tril(int64_t diagonal) const { return ::tandem::tril(*this, diagonal); }
Tensor Tensor::triu(int64_t diagonal) const { return ::tandem::triu(*this, diagonal); }

}  // namespace tandem
