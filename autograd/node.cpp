#include "tandem/autograd/node.h"

#include <atomic>

#include "tandem/autograd/grad_mode.h"
#include "tandem/core/kernels.h"

namespace tandem::autograd {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}

Node::Node() : sequence_nr_(next_sequence_nr++) {}

std::vector<Tensor> Node::apply_folding(Tensor, const Tensor&) {
  TANDEM_CHECK(false, "backward: ", name(), " cannot fold a pending gradient");
  return {};
}

void FunctionNode::check_not_released() const {
  TANDEM_CHECK(backward_ != nullptr || folding_backward_ != nullptr, "backward: tried to go through ", name_,
               " a second time, but the saved tensors of the graph were freed after the first backward; "
               "pass retain_graph=true to the first backward() to go through it again");
}

std::vector<Tensor> FunctionNode::apply(Tensor grad_output) {
  check_not_released();
  return backward_ ? backward_(grad_output) : folding_backward_(grad_output, Tensor());
}

std::vector<Tensor> FunctionNode::apply_folding(Tensor grad_output, const Tensor& pending) {
  check_not_released();
  if (!folding_backward_) return Node::apply_folding(std::move(grad_output), pending);  // the error
  return folding_backward_(grad_output, pending);
}

std::vector<Tensor> AccumulateGrad::apply(Tensor grad) {
  AutogradMeta& m = meta(leaf_);
  if (!m.grad.defined()) {
    // Take the incoming buffer when nothing else refers to it; otherwise copy, so that later
    // in-place accumulation never writes into another tensor's memory. .grad takes the leaf's
    // memory format (a channels-last weight gets a channels-last gradient).
    const MemoryFormat format = leaf_.suggest_memory_format();
    m.grad = sole_owner(grad, format) ? grad : kernels::clone(grad, format);
  } else {
    kernels::add_(m.grad, grad);  // in place: the .grad buffer may be a view DDP watches
  }
  for (auto& hook : m.post_accumulate_hooks) hook(leaf_);
  return {};
}

bool sole_owner(const Tensor& t, MemoryFormat format) {
  return t.use_count() == 1 && t.storage().use_count() == 1 && t.is_contiguous(format) && t.offset() == 0 &&
         t.autograd_meta() == nullptr;
}

AutogradMeta& meta(const Tensor& t) {
  auto& m = t.autograd_meta();
  if (!m) m = std::make_shared<AutogradMeta>();
  return *m;
}

std::shared_ptr<Node> gradient_edge(const Tensor& t) {
  auto& m = t.autograd_meta();
  if (!m || !m->requires_grad) return nullptr;
  if (m->grad_fn) return m->grad_fn;
  std::shared_ptr<Node> acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    m->grad_accumulator = acc;
  }
  return acc;
}

namespace {
template <typename Fn>
Tensor record_node(Tensor out, const char* name, const std::vector<Tensor>& inputs, Fn backward) {
  if (!GradMode::is_enabled()) return out;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return out;
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  for (const Tensor& t : inputs) {
    node->next.push_back(t.defined() ? gradient_edge(t) : nullptr);
    node->input_shapes.push_back(t.defined() ? t.shape() : Shape{});
    node->input_dtypes.push_back(t.defined() ? t.dtype() : DType::f32);
    node->input_devices.push_back(t.defined() ? t.device() : Device());
  }
  // `out` may share its metadata with an input (an op that returned its input): give it its own.
  if (out.autograd_meta() != nullptr) out = out.as_strided(out.shape(), out.strides(), out.offset());
  AutogradMeta& m = meta(out);
  m.requires_grad = true;
  m.grad_fn = std::move(node);
  return out;
}
}  // namespace

Tensor record(Tensor out, const char* name, const std::vector<Tensor>& inputs, BackwardFn backward) {
  return record_node(std::move(out), name, inputs, std::move(backward));
}

Tensor record(Tensor out, const char* name, const std::vector<Tensor>& inputs, FoldingBackwardFn backward) {
  return record_node(std::move(out), name, inputs, std::move(backward));
}

}  // namespace tandem::autograd
