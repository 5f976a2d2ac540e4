#include "tandem/autograd/gradcheck.h"

#include <cmath>
#include <sstream>

#include "tandem/autograd/grad_mode.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/random.h"

namespace tandem {

namespace {
// Address of the element with row-major index `flat` in a strided f64 tensor.
double* element(const Tensor& t, int64_t flat) {
  int64_t offset = 0;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    int64_t size = t.shape()[d];
    offset += (flat % size) * t.strides()[d];
    flat /= size;
  }
  return static_cast<double*>(t.storage().data()) + t.offset() + offset;
}
}  // namespace

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    TANDEM_CHECK_AS(ValueError, inputs[i].dtype() == DType::f64 && inputs[i].device().is_cpu(),
                    "gradcheck: input ", i, " must be an f64 cpu tensor, got ", inputs[i].dtype(), " on ", inputs[i].device());
    TANDEM_CHECK_AS(ValueError, inputs[i].requires_grad(), "gradcheck: input ", i, " must require grad");
    // Only leaves get .grad; a non-leaf would read as a zero analytic gradient and fail misleadingly.
    TANDEM_CHECK_AS(ValueError, inputs[i].is_leaf(), "gradcheck: input ", i,
                    " must be a leaf, not the result of an op (pass x.detach().requires_grad_())");
    // Perturbing one element of an overlapping layout (an expanded input) would move several at once.
    for (int64_t d = 0; d < inputs[i].dim(); ++d) {
      TANDEM_CHECK_AS(ValueError, inputs[i].strides()[d] != 0 || inputs[i].shape()[d] <= 1, "gradcheck: input ", i,
                      " (shape ", shape_str(inputs[i].shape()), ") has stride 0 at dim ", d,
                      "; its elements overlap, so pass a contiguous copy");
    }
  }
  Tensor probe = fn(inputs);
  Generator gen(options.seed);
  Tensor w = probe.numel() == 1 ? ones(probe.shape(), DType::f64) : randn(probe.shape(), DType::f64, &gen);
  auto loss_of = [&](const Tensor& out) { return sum(mul(out, w)); };

  for (const Tensor& x : inputs) x.set_grad(Tensor());
  loss_of(fn(inputs)).backward();

  NoGradGuard no_grad;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    Tensor analytic = x.grad();
    std::vector<double> a = analytic.defined() ? analytic.to_double_vector() : std::vector<double>(x.numel(), 0.0);
    for (int64_t k = 0; k < x.numel(); ++k) {
      double* p = element(x, k);
      double saved_value = *p;
      *p = saved_value + options.eps;
      double plus = loss_of(fn(inputs)).item();
      *p = saved_value - options.eps;
      double minus = loss_of(fn(inputs)).item();
      *p = saved_value;
      double numeric = (plus - minus) / (2 * options.eps);
      if (!(std::abs(a[k] - numeric) <= options.atol + options.rtol * std::abs(numeric))) {
        std::ostringstream msg;
        msg << "gradcheck: input " << i << " (shape " << shape_str(x.shape()) << "), element " << k << ": analytic "
            << a[k] << " vs numeric " << numeric;
        return {false, msg.str()};
      }
    }
  }
  return {};
}

}  // namespace tandem
