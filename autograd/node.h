#pragma once
// The backward graph. Every differentiable op that sees an input requiring grad records one Node
// for its (single) output: its backward function and an edge to each input's own node (the
// input's grad_fn, or the AccumulateGrad of a leaf). Ops with several results (max with indices)
// give only the differentiable one a node.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::autograd {

class Node;

// What autograd keeps per tensor, created when a tensor first takes part in autograd.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;                                  // leaves only: the accumulated gradient
  std::shared_ptr<Node> grad_fn;                // non-leaves: the node that computes this tensor's gradient
  std::weak_ptr<Node> grad_accumulator;         // leaves: the node that accumulates into grad (made lazily)
  std::vector<std::function<void(const Tensor&)>> post_accumulate_hooks;  // leaves: run after accumulation
  // Leaves: run after accumulation too, but without first finishing the column sums still waiting in
  // the backward's batch (core/column_sum_batch.h): for a hook that only notes that the gradient is
  // in .grad and reads it later, after finish_gradient_sums (DDP, which reads a bucket's gradients
  // when it launches the bucket). post_accumulate_hooks make every waiting sum launch first.
  std::vector<std::function<void(const Tensor&)>> gradient_ready_hooks;
};

class Node {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients for each input (an undefined tensor where there is none) from the output's gradient.
  virtual std::vector<Tensor> apply(Tensor grad_output) = 0;
  // Whether the node can take `pending`, the gradient gathered so far for its first input's node,
  // and return it already added into its own gradient for that input, in the kernel that computes
  // it (layer norm's backward does). The engine then skips its add: one kernel and one pass over
  // the gradient fewer where a tensor has two uses, as the residual stream of a transformer has.
  virtual bool folds_pending() const { return false; }
  // apply, with `pending` (defined) added into the returned gradient for input 0.
  virtual std::vector<Tensor> apply_folding(Tensor grad_output, const Tensor& pending);
  virtual std::string name() const = 0;
  // Whether the node may be handed a gradient still being made beside backward (side_stream.h),
  // or one whose column sum still waits (core/column_sum_batch.h), without the engine joining or
  // launching it first: its backward only re-views the gradient, or (a leaf's accumulation) orders
  // its own work after it.
  virtual bool takes_gradients_beside() const { return false; }
  // Frees what the backward saved; called after the node ran unless the graph is retained.
  virtual void release() {}
  // Whether the node, as the root of a backward that implied the 1 and releases the graph, never
  // reads that 1 (see gradient_is_implicit_one): backward then hands it an undefined gradient
  // instead of launching a kernel to make the 1 (record_loss).
  virtual bool ignores_implied_one() const { return false; }

  // Nodes of the inputs, in input order; null for inputs that need no gradient.
  std::vector<std::shared_ptr<Node>> next;
  // Shapes, dtypes and devices of the inputs, to check each returned gradient against.
  std::vector<Shape> input_shapes;
  std::vector<DType> input_dtypes;
  std::vector<Device> input_devices;
  // Creation order: the engine runs later nodes first, so backward mirrors forward in reverse.
  uint64_t sequence_nr() const { return sequence_nr_; }

 private:
  uint64_t sequence_nr_;
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;
// A backward that adds `pending` (when defined) into its gradient for input 0; see folds_pending.
using FoldingBackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output, const Tensor& pending)>;

// A node whose backward is a function (usually a lambda beside the op's forward).
class FunctionNode : public Node {
 public:
  FunctionNode(std::string name, BackwardFn backward) : name_(std::move(name)), backward_(std::move(backward)) {}
  FunctionNode(std::string name, FoldingBackwardFn backward)
      : name_(std::move(name)), folding_backward_(std::move(backward)) {}
  // For record_view: a backward that launches nothing on the gradient.
  void set_views_gradient_only() { views_gradient_only_ = true; }
  bool takes_gradients_beside() const override { return views_gradient_only_; }
  // For record_loss: a backward that does not read the implied 1.
  void set_ignores_implied_one() { ignores_implied_one_ = true; }
  bool ignores_implied_one() const override { return ignores_implied_one_; }
  std::vector<Tensor> apply(Tensor grad_output) override;
  bool folds_pending() const override { return folding_backward_ != nullptr; }
  std::vector<Tensor> apply_folding(Tensor grad_output, const Tensor& pending) override;
  std::string name() const override { return name_; }
  void release() override {
    backward_ = nullptr;
    folding_backward_ = nullptr;
  }

 private:
  void check_not_released() const;

  std::string name_;
  BackwardFn backward_;                 // one of the two is set; both null once released
  FoldingBackwardFn folding_backward_;
  bool views_gradient_only_ = false;
  bool ignores_implied_one_ = false;
};

// The node at a leaf: adds the incoming gradient into leaf.grad, then runs the leaf's hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf) : leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(Tensor grad_output) override;
  std::string name() const override { return "AccumulateGrad"; }
  bool takes_gradients_beside() const override { return true; }

 private:
  Tensor leaf_;
};

// The meta of t, created if missing.
AutogradMeta& meta(const Tensor& t);
// The node a gradient for t flows into: its grad_fn, its accumulator if it is a leaf that
// requires grad, or null.
std::shared_ptr<Node> gradient_edge(const Tensor& t);

// Whether t's gradient reaches a leaf's accumulation with nothing but views in between (a weight,
// or its transpose): what backward may compute beside the other nodes (side_stream.h).
bool gradient_reaches_leaf(const Tensor& t);

// Records `backward` as the grad_fn of `out` when grad mode is on and any input requires grad;
// returns out. The backward receives d(loss)/d(out) and returns one gradient per input.
// Tensors the backward needs should be captured through saved() so the graph holds no cycles.
Tensor record(Tensor out, const char* name, const std::vector<Tensor>& inputs, BackwardFn backward);
// The same for a backward that can fold the pending gradient of its first input (see
// Node::folds_pending).
Tensor record(Tensor out, const char* name, const std::vector<Tensor>& inputs, FoldingBackwardFn backward);
// The same for a view op whose backward only views its gradient again (transpose, permute): no
// kernel reads the gradient, so the engine hands it one still being made beside backward.
Tensor record_view(Tensor out, const char* name, const std::vector<Tensor>& inputs, BackwardFn backward);
// The same for a scalar loss whose backward returns the gradient its forward made, without
// reading the gradient it is handed, when that is backward()'s implied 1 and the graph is released
// (it checks gradient_is_implicit_one() and backward_releases_saved()): the engine then passes an
// undefined gradient rather than make the 1.
Tensor record_loss(Tensor out, const char* name, const std::vector<Tensor>& inputs, BackwardFn backward);
// A tensor to capture in a backward function: same data, no autograd history.
inline Tensor saved(const Tensor& t) { return t.detach(); }

// Whether the caller's reference is the only one to t and its storage, t is dense in `format`
// from the storage's start and has no autograd history: then writing into t in place cannot
// change any other tensor (how a gradient buffer the engine hands over may be reused).
bool sole_owner(const Tensor& t, MemoryFormat format = MemoryFormat::contiguous);

// Adds a gradient-ready hook (AutogradMeta::gradient_ready_hooks) to a leaf that requires grad.
void register_gradient_ready_hook(const Tensor& leaf, std::function<void(const Tensor&)> hook);
// Finishes the column sums still waiting in the running backward's batch when any of `grads` waits
// for one (nothing outside a backward or when none does): what a gradient-ready hook's owner calls
// before it reads the gradients.
void finish_gradient_sums(const std::vector<Tensor>& grads);

// Runs backward from `root` with d(root)/d(root) = `gradient`.
void run_backward(const Tensor& root, const Tensor& gradient, bool retain_graph);

// Whether the backward running on this thread releases each node's saved tensors once the node
// has run (retain_graph off): then a node's backward may hand out, or write into, a buffer it
// saved, since no later backward through the node can read it. False outside a backward.
bool backward_releases_saved();

// Inside a node's backward: whether the gradient the node was handed is the 1 that backward()
// implied for a scalar root, handed to the root's own node. A loss node that computed its input's
// gradient for an upstream 1 in its forward may then hand that on without multiplying by it.
bool gradient_is_implicit_one();

// Inside a node's backward: whether the gradient the node returns for its first input (with the
// pending gradient it was handed, if any) is all that this input will receive in this backward
// pass, no other use of it being left to run. A node may then derive from that gradient what would
// otherwise need it complete: layer norm sums it per column for add_layer_norm's residual bias.
// False outside a backward.
bool first_input_gradient_is_final();

// Queues fn to run once the backward pass in progress (on this thread) has finished: what DDP
// uses to wait for its last buckets. Only valid from inside a backward (e.g. from a hook).
void queue_callback(std::function<void()> fn);

}  // namespace tandem::autograd
