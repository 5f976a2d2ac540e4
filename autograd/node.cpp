#include "tandem/autograd/node.h"

#include <atomic>

#include "tandem/autograd/grad_mode.h"
#include "tandem/autograd/side_stream.h"
#include "tandem/core/column_sum_batch.h"
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

namespace {
void accumulate(AutogradMeta& m, const Tensor& leaf, const Tensor& grad) {
  if (!m.grad.defined()) {
    // Take the incoming buffer when nothing else refers to it; otherwise copy, so that later
    // in-place accumulation never writes into another tensor's memory. .grad takes the leaf's
    // memory format (a channels-last weight gets a channels-last gradient).
    const MemoryFormat format = leaf.suggest_memory_format();
    m.grad = sole_owner(grad, format) ? grad : kernels::clone(grad, format);
  } else {
    kernels::add_(m.grad, grad);  // in place: the .grad buffer may be a view DDP watches
  }
}

void run_ready_hooks(const Tensor& leaf) {
  for (auto& hook : meta(leaf).gradient_ready_hooks) hook(leaf);
}

void run_hooks(const Tensor& leaf) {
  for (auto& hook : meta(leaf).post_accumulate_hooks) hook(leaf);
  run_ready_hooks(leaf);
}
}  // namespace

std::vector<Tensor> AccumulateGrad::apply(Tensor grad) {
  AutogradMeta& m = meta(leaf_);
  if (ColumnSumBatch* sums = current_column_sum_batch(); sums != nullptr && !sums->empty()) {
    // A gradient whose column sum waits in the batch becomes .grad as it is, still waiting, when
    // nothing reads it now: no .grad to add into, no copy to make, no hook but the gradient-ready
    // ones (which read it later, after finish_gradient_sums).
    const bool hooks_read = !m.post_accumulate_hooks.empty();
    const bool read_now = m.grad.defined() || hooks_read || !sole_owner(grad, leaf_.suggest_memory_format());
    if (!read_now && sums->waits_for(grad)) {
      m.grad = grad;
      run_ready_hooks(leaf_);
      return {};
    }
    // Hooks read .grad and may read other leaves': every sum first.
    if (hooks_read) sums->flush();
    sums->flush_for(grad);
    sums->flush_for(m.grad);
  }
  detail::SideWork* side = detail::current_side_work();
  const uint64_t item = side != nullptr ? side->item_of(grad) : 0;
  if (item == 0) {
    if (side != nullptr) side->join_for(m.grad);  // .grad may still be being added into beside backward
    accumulate(m, leaf_, grad);
    run_hooks(leaf_);
    return {};
  }
  // The gradient is still being made on the side stream: accumulate there too (after it, and after
  // the compute stream's work so far), and run the hooks once that is joined.
  uint64_t done = item;
  if (m.grad.defined() || !sole_owner(grad, leaf_.suggest_memory_format())) {
    done = side->launch(
        grad.device().index, {grad, m.grad}, [&] { accumulate(m, leaf_, grad); }, /*counted=*/false);
  } else {
    m.grad = grad;  // no kernel: .grad is pending on the gradient's own item
  }
  side->mark(m.grad, done);
  if (!m.post_accumulate_hooks.empty() || !m.gradient_ready_hooks.empty()) {
    side->defer(done, [leaf = leaf_] { run_hooks(leaf); });
  }
  return {};
}

void register_gradient_ready_hook(const Tensor& leaf, std::function<void(const Tensor&)> hook) {
  TANDEM_CHECK_AS(ValueError, leaf.is_leaf() && leaf.requires_grad(),
                  "register_gradient_ready_hook: only leaf tensors that require grad accumulate gradients");
  meta(leaf).gradient_ready_hooks.push_back(std::move(hook));
}

void finish_gradient_sums(const std::vector<Tensor>& grads) {
  ColumnSumBatch* sums = current_column_sum_batch();
  if (sums == nullptr || sums->empty()) return;
  for (const Tensor& g : grads) {
    if (g.defined() && sums->waits_for(g)) {
      sums->flush();
      return;
    }
  }
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

bool gradient_reaches_leaf(const Tensor& t) {
  std::shared_ptr<Node> node = gradient_edge(t);
  while (node && !dynamic_cast<AccumulateGrad*>(node.get())) {
    if (!node->takes_gradients_beside() || node->next.size() != 1) return false;  // not a view
    node = node->next[0];
  }
  return node != nullptr;
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

Tensor record_loss(Tensor out, const char* name, const std::vector<Tensor>& inputs, BackwardFn backward) {
  Tensor result = record_node(std::move(out), name, inputs, std::move(backward));
  if (result.autograd_meta() != nullptr && result.autograd_meta()->grad_fn) {
    static_cast<FunctionNode&>(*result.autograd_meta()->grad_fn).set_ignores_implied_one();
  }
  return result;
}

Tensor record_view(Tensor out, const char* name, const std::vector<Tensor>& inputs, BackwardFn backward) {
  Tensor result = record_node(std::move(out), name, inputs, std::move(backward));
  if (result.autograd_meta() != nullptr && result.autograd_meta()->grad_fn) {
    static_cast<FunctionNode&>(*result.autograd_meta()->grad_fn).set_views_gradient_only();
  }
  return result;
}

}  // namespace tandem::autograd
