// The autograd accessors of Tensor (declared in core/tensor.h, defined here so core stays free of
// autograd).
#include "tandem/autograd/node.h"

namespace tandem {

bool Tensor::requires_grad() const {
  const auto& m = autograd_meta();
  return m != nullptr && m->requires_grad;
}

Tensor& Tensor::requires_grad_(bool requires) {
  auto& m = autograd::meta(*this);
  TANDEM_CHECK_AS(ValueError, m.grad_fn == nullptr, "requires_grad_: only leaf tensors can change requires_grad; "
                  "this one was computed by ", m.grad_fn->name(), " (use detach() for a new leaf)");
  TANDEM_CHECK_AS(TypeError, !requires || is_floating(dtype()),
                  "requires_grad_: only floating-point tensors can require grad, got ", dtype());
  m.requires_grad = requires;
  return *this;
}

bool Tensor::is_leaf() const {
  const auto& m = autograd_meta();
  return m == nullptr || m->grad_fn == nullptr;
}

Tensor Tensor::grad() const {
  const auto& m = autograd_meta();
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    TANDEM_CHECK_AS(ValueError, grad.shape() == shape() && grad.dtype() == dtype() && grad.device() == device(),
                    "set_grad: the gradient is ", shape_str(grad.shape()), " ", grad.dtype(), " on ", grad.device(),
                    " but the tensor is ", shape_str(shape()), " ", dtype(), " on ", device());
  }
  autograd::meta(*this).grad = grad;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::run_backward(*this, gradient, retain_graph);
}

Tensor Tensor::detach() const { return as_strided(shape(), strides(), offset()); }

void Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) {
  TANDEM_CHECK_AS(ValueError, is_leaf() && requires_grad(),
                  "register_post_accumulate_grad_hook: only leaf tensors that require grad accumulate gradients");
  autograd::meta(*this).post_accumulate_hooks.push_back(std::move(hook));
}

}  // namespace tandem
