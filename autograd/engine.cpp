// The backward engine: counts how many gradients each node waits for, then runs nodes whose
// gradients are complete, latest-created first (so backward mirrors forward in reverse, and the
// gradients of the last layers reach their leaves first: what lets DDP start communicating early).
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "tandem/autograd/grad_mode.h"
#include "tandem/autograd/node.h"
#include "tandem/autograd/side_stream.h"
#include "tandem/core/column_sum_batch.h"
#include "tandem/core/kernels.h"

namespace tandem::autograd {

namespace {
// Callbacks queued during the backward running on this thread; null outside a backward.
thread_local std::vector<std::function<void()>>* pending_callbacks = nullptr;
// Whether the backward running on this thread releases nodes as they finish.
thread_local bool releasing_saved = false;
// Whether the node running on this thread gives its first input its last gradient.
thread_local bool first_input_final = false;
// Whether the node running on this thread is the root's, handed the 1 that backward() implied.
thread_local bool implicit_one = false;

struct LaterFirst {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

std::unordered_map<Node*, int> count_dependencies(const std::shared_ptr<Node>& root) {
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen{root.get()};
  std::vector<Node*> stack{root.get()};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const auto& next : node->next) {
      if (!next) continue;
      ++deps[next.get()];
      if (seen.insert(next.get()).second) stack.push_back(next.get());
    }
  }
  return deps;
}

void check_gradient(const Node& node, size_t i, const Tensor& grad) {
  TANDEM_CHECK(grad.shape() == node.input_shapes[i] && grad.dtype() == node.input_dtypes[i] &&
                   grad.device() == node.input_devices[i],
               "backward of ", node.name(), " returned a gradient with shape ", shape_str(grad.shape()), ", ",
               grad.dtype(), " on ", grad.device(), " for input ", i, " with shape ", shape_str(node.input_shapes[i]),
               ", ", node.input_dtypes[i], " on ", node.input_devices[i]);
}
// The gradient gathered so far for node's first input, when the node can add it in its own kernel
// and that input's node is not also one of its other inputs' (whose gradients the engine adds
// after); undefined otherwise. It is moved out of its slot, so that a node holding the only
// reference may add into it in place; the node's result for input 0 takes the slot back.
Tensor take_pending_to_fold(const Node& node, std::unordered_map<Node*, Tensor>& buffers) {
  if (!node.folds_pending() || node.next.empty() || !node.next[0]) return Tensor();
  for (size_t i = 1; i < node.next.size(); ++i) {
    if (node.next[i] == node.next[0]) return Tensor();
  }
  auto it = buffers.find(node.next[0].get());
  return it != buffers.end() ? std::move(it->second) : Tensor();
}
}  // namespace

void run_backward(const Tensor& root, const Tensor& gradient_in, bool retain_graph) {
  TANDEM_CHECK_AS(ValueError, root.requires_grad(), "backward: the tensor (shape ", shape_str(root.shape()),
                  ") does not require grad: none of the inputs it was computed from has requires_grad set, "
                  "or it was computed under NoGradGuard");
  Tensor gradient = gradient_in;
  const bool implied = !gradient.defined();
  std::shared_ptr<Node> root_node = gradient_edge(root);
  if (implied) {
    TANDEM_CHECK_AS(ValueError, root.numel() == 1, "backward: a gradient can be implied only for a scalar output, "
                    "but the tensor has shape ", shape_str(root.shape()), "; pass backward(gradient)");
    // A loss node that never reads the implied 1 (record_loss) is handed none: no kernel to make it.
    if (retain_graph || !root_node->ignores_implied_one()) gradient = ones(root.shape(), root.options());
  } else {
    TANDEM_CHECK_AS(ValueError, gradient.shape() == root.shape(), "backward: the gradient has shape ",
                    shape_str(gradient.shape()), " but the tensor has shape ", shape_str(root.shape()));
    TANDEM_CHECK_AS(TypeError, gradient.dtype() == root.dtype() && gradient.device() == root.device(),
                    "backward: the gradient is ", gradient.dtype(), " on ", gradient.device(), " but the tensor is ",
                    root.dtype(), " on ", root.device());
  }

  NoGradGuard no_grad;  // the backward computation itself is not recorded
  std::vector<std::function<void()>> callbacks;
  std::vector<std::function<void()>>* outer_callbacks = pending_callbacks;
  pending_callbacks = &callbacks;
  struct Restore {
    std::vector<std::function<void()>>* outer;
    bool outer_releasing;
    bool outer_first_input_final;
    bool outer_implicit_one;
    ~Restore() {
      pending_callbacks = outer;
      releasing_saved = outer_releasing;
      first_input_final = outer_first_input_final;
      implicit_one = outer_implicit_one;
    }
  } restore{outer_callbacks, releasing_saved, first_input_final, implicit_one};
  releasing_saved = !retain_graph;
  detail::SideWork side;  // weight gradients made beside the nodes (side_stream.h)
  detail::SideWorkScope side_scope(&side);
  ColumnSumBatch sums;  // gradients' column sums launched together (column_sum_batch.h)
  ColumnSumBatchScope sums_scope(column_sums_batched() ? &sums : nullptr);
  std::unordered_map<Node*, int> deps = count_dependencies(root_node);
  std::unordered_map<Node*, Tensor> buffers{{root_node.get(), gradient.defined() ? gradient.detach() : Tensor()}};
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, LaterFirst> ready;
  ready.push(root_node);

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    auto it = buffers.find(node.get());
    Tensor grad = std::move(it->second);
    buffers.erase(it);
    Tensor pending = take_pending_to_fold(*node, buffers);
    if (!node->takes_gradients_beside()) {  // its kernels read them on the compute stream
      sums.flush_for(grad);
      sums.flush_for(pending);
      side.join_for(grad);
      side.join_for(pending);
    }
    // Final when no other producer is still to run for the first input's node and no gradient
    // waits in its slot that this node did not fold (a folded one left the slot empty).
    Node* first = node->next.empty() ? nullptr : node->next[0].get();
    if (first != nullptr) {
      auto slot = buffers.find(first);
      first_input_final = deps[first] == 1 && (slot == buffers.end() || !slot->second.defined());
    } else {
      first_input_final = false;
    }
    implicit_one = implied && node == root_node;  // the root's node runs first, before anything can change it
    std::vector<Tensor> grads =
        pending.defined() ? node->apply_folding(std::move(grad), pending) : node->apply(std::move(grad));
    implicit_one = false;
    if (!retain_graph) node->release();
    for (size_t i = 0; i < node->next.size(); ++i) {
      const std::shared_ptr<Node>& next = node->next[i];
      if (!next) continue;
      if (i < grads.size() && grads[i].defined()) {
        check_gradient(*node, i, grads[i]);
        Tensor& slot = buffers[next.get()];
        if (i == 0 && pending.defined()) slot = grads[0];  // already holds the pending gradient
        else if (!slot.defined())
          slot = grads[i];
        else {
          sums.flush_for(slot);
          sums.flush_for(grads[i]);
          side.join_for(slot);
          side.join_for(grads[i]);
          slot = kernels::binary(BinaryOp::add, slot, grads[i]);
        }
      } else {
        TANDEM_CHECK(i != 0 || !pending.defined(), "backward of ", node->name(),
                     " took a pending gradient for input 0 but returned none");
      }
      if (--deps[next.get()] == 0) {
        if (buffers.count(next.get())) {
          ready.push(next);
        } else {
          // No gradient arrived (all producers returned none): the branch contributes nothing,
          // but its own inputs still wait on it, so release them the same way.
          std::vector<std::shared_ptr<Node>> silent{next};
          while (!silent.empty()) {
            std::shared_ptr<Node> s = silent.back();
            silent.pop_back();
            if (!retain_graph) s->release();
            for (const auto& n : s->next) {
              if (n && --deps[n.get()] == 0) {
                if (buffers.count(n.get())) ready.push(n);
                else silent.push_back(n);
              }
            }
          }
        }
      }
    }
  }
  sums.flush();     // on the streams the sums' kernels ran on, before the side work is joined
  side.join_all();  // every gradient ready on the compute stream, every leaf's hooks run
  // Callbacks may queue more callbacks; run until none are left.
  for (size_t i = 0; i < callbacks.size(); ++i) {
    std::function<void()> fn = std::move(callbacks[i]);
    fn();
  }
}

bool backward_releases_saved() { return releasing_saved; }

bool first_input_gradient_is_final() { return first_input_final; }

bool gradient_is_implicit_one() { return implicit_one; }

void queue_callback(std::function<void()> fn) {
  TANDEM_CHECK(pending_callbacks != nullptr, "queue_callback: no backward pass is running on this thread");
  pending_callbacks->push_back(std::move(fn));
}

}  // namespace tandem::autograd
