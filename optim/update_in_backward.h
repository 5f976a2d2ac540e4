#pragma once
// An optimizer's update run during backward: each parameter is updated as soon as its gradient is
// final, while the rest of backward still computes, instead of in one step() after it (PyTorch's
// "optimizer step fused into backward", done there with post-accumulate-grad hooks).
//
//   optim::AdamW opt(model->parameters(), options);
//   optim::UpdateInBackward update(opt);
//   for (...) {
//     opt.zero_grad();
//     loss = cross_entropy(model->forward(x), y);
//     loss.backward();  // updates every parameter with a gradient; no opt.step()
//   }
//
// Each parameter's post-accumulate-grad hook marks it ready; once the ready parameters hold at
// least `min_elements_per_update` elements they are updated together (Optimizer::step_some, one
// fused launch). On a GPU the update runs on a side stream (cuda::side_stream) after an event on
// the compute stream, so it overlaps the backward kernels that follow; when backward ends, the
// parameters not yet updated (those whose gradient came last, or that kept a zeroed gradient and
// got none this time) are updated and the compute stream waits for the side stream, so whatever
// runs next (the next forward) sees the new values. Inside a CUDA graph capture the side stream
// joins the capture the same way, so a captured step keeps the overlap.
//
// The result is the same, bit for bit, as loss.backward(); opt.step(): the fused updates treat
// every element on its own, and a parameter's gradient is final when its hook runs (the backward
// engine accumulates every contribution before it reaches the parameter). What cannot work with
// it, because it needs every gradient before any update: gradient clipping by the global norm,
// GradScaler (its inf check spans all gradients), accumulating gradients over several backward
// passes, and DistributedDataParallel (the update would use the gradients before their
// all-reduce). While an UpdateInBackward is attached, opt.step() raises, so a loop left unchanged
// cannot update twice. Attach it before the first backward; it detaches when destroyed.
#include <cstdint>
#include <memory>

#include "tandem/optim/optimizer.h"

namespace tandem::optim {

struct UpdateInBackwardOptions {
  // Ready parameters are updated together once they hold this many elements (a GPT-2 block has
  // about 7M): fewer, larger launches, while the update still starts early in backward.
  int64_t min_elements_per_update = int64_t{1} << 22;
};

class UpdateInBackward {
 public:
  // Registers a post-accumulate-grad hook on every parameter of `optimizer` (all on one device),
  // which must outlive this object.
  explicit UpdateInBackward(Optimizer& optimizer, UpdateInBackwardOptions options = {});
  ~UpdateInBackward();
  UpdateInBackward(const UpdateInBackward&) = delete;
  UpdateInBackward& operator=(const UpdateInBackward&) = delete;

  // Updates (fused launches) issued by the last backward pass.
  int64_t updates_last_backward() const;

  struct State;

 private:
  std::shared_ptr<State> state_;  // shared with the hooks, which outlive this object
};

}  // namespace tandem::optim
