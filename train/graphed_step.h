#pragma once
// A whole training step as one CUDA graph (core/cuda_graph.h): run eagerly for a few warm-up
// steps, captured once, then replayed, so that the host issues one launch per step instead of a few
// hundred kernels and collectives.
//
//   Tensor x = empty({B, 784}, cuda), y = empty({B}, TensorOptions(DType::i64, cuda));  // static inputs
//   Tensor loss;
//   train::GraphedStep step({x, y}, [&](const std::vector<Tensor>& in) {
//     opt.zero_grad();
//     loss = cross_entropy(model->forward(in[0]), in[1]);
//     loss.backward();
//     opt.step();
//   });
//   for (auto& batch : loader) step.run({batch.inputs, batch.targets});  // loss holds the newest value
//
// `step` must do the same device work every time it runs: no host reads of device values
// (`item()`), no CPU tensors, no shape changes (the capture raises a GraphCaptureError naming the
// call). What the host changes between steps is seen by replays only where tandem reads it from the
// device: the optimizers' lr (so schedules work), random draws (dropout), GradScaler's scale and
// skip decisions, AdamW's step counts. Every collective the step launches must be waited for inside
// it (DDP does; with ZeRO, call wait_for_parameters() at its end), since a capture ends only once
// every stream it used has joined back.
// The step's collectives are watched in every replay as in eager steps: each replay issues them
// again (collectives_issued() grows by the step's collectives per replay) and the group's timeout
// applies to each, so a rank that hangs during a replay fails the group with the collective named.
#include <cstdint>
#include <functional>
#include <vector>

#include "tandem/core/cuda_graph.h"
#include "tandem/core/tensor.h"

namespace tandem::train {

struct GraphedStepOptions {
  // Eager steps before the capture: they create what is made once (optimizer state, library
  // plans, DDP's buckets) so that the capture records only the steady state.
  int warmup_steps = 3;
};

class GraphedStep {
 public:
  using StepFn = std::function<void(const std::vector<Tensor>& inputs)>;
  // `static_inputs`: cuda tensors on one device that every run copies its inputs into and that
  // `step` is called with.
  GraphedStep(std::vector<Tensor> static_inputs, StepFn step, GraphedStepOptions options = {});

  // Copies `inputs` (the static inputs' shapes and dtypes, any device) into the static inputs and
  // runs one step: eagerly during warm-up, then captured and replayed at once, then replayed.
  void run(const std::vector<Tensor>& inputs);
  // One step eagerly on `inputs` of any shape (a last, smaller batch of an epoch), outside the graph.
  void run_eagerly(const std::vector<Tensor>& inputs);
  // Whether `inputs` can go through run(): the static inputs' count, shapes and dtypes.
  bool fits(const std::vector<Tensor>& inputs) const;

  bool captured() const { return graph_.captured(); }
  int64_t steps() const { return steps_; }  // every run, eager or replayed
  const cuda::Graph& graph() const { return graph_; }
  const std::vector<Tensor>& static_inputs() const { return static_inputs_; }

 private:
  void check_inputs(const std::vector<Tensor>& inputs) const;
  void capture();

  std::vector<Tensor> static_inputs_;
  StepFn step_;
  GraphedStepOptions options_;
  int device_ = 0;
  int64_t steps_ = 0;
  cuda::Graph graph_;
};

}  // namespace tandem::train
