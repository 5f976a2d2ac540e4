#include "tandem/train/graphed_step.h"

#include <utility>

#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"

namespace tandem::train {

GraphedStep::GraphedStep(std::vector<Tensor> static_inputs, StepFn step, GraphedStepOptions options)
    : static_inputs_(std::move(static_inputs)), step_(std::move(step)), options_(options) {
  TANDEM_CHECK_AS(ValueError, static_cast<bool>(step_), "GraphedStep: no step function given");
  TANDEM_CHECK_AS(ValueError, !static_inputs_.empty(), "GraphedStep: no static inputs given");
  TANDEM_CHECK_AS(ValueError, options_.warmup_steps >= 1, "GraphedStep: warmup_steps is ", options_.warmup_steps,
                  "; at least one eager step must come before the capture");
  for (size_t i = 0; i < static_inputs_.size(); ++i) {
    const Tensor& t = static_inputs_[i];
    TANDEM_CHECK_AS(ValueError, t.defined(), "GraphedStep: static input ", i, " is undefined");
    TANDEM_CHECK_AS(DeviceError, t.device().is_cuda(), "GraphedStep: CUDA graphs capture GPU work, but static input ",
                    i, " is on ", t.device(), " (train on the CPU without a graph)");
    TANDEM_CHECK_AS(DeviceError, t.device() == static_inputs_[0].device(), "GraphedStep: static input ", i, " is on ",
                    t.device(), " and input 0 on ", static_inputs_[0].device(), "; one device per graph");
  }
  device_ = static_inputs_[0].device().index;
}

bool GraphedStep::fits(const std::vector<Tensor>& inputs) const {
  if (inputs.size() != static_inputs_.size()) return false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || inputs[i].shape() != static_inputs_[i].shape() ||
        inputs[i].dtype() != static_inputs_[i].dtype()) {
      return false;
    }
  }
  return true;
}

void GraphedStep::check_inputs(const std::vector<Tensor>& inputs) const {
  TANDEM_CHECK_AS(ValueError, inputs.size() == static_inputs_.size(), "GraphedStep: got ", inputs.size(),
                  " inputs, the graph takes ", static_inputs_.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& in = inputs[i];
    const Tensor& s = static_inputs_[i];
    TANDEM_CHECK_AS(ValueError, in.defined(), "GraphedStep: input ", i, " is undefined");
    TANDEM_CHECK_AS(ValueError, in.shape() == s.shape(), "GraphedStep: input ", i, " has shape ", shape_str(in.shape()),
                    " but the captured step takes ", shape_str(s.shape()),
                    ": a graph replays fixed shapes (run a different shape with run_eagerly, or pad it)");
    TANDEM_CHECK_AS(TypeError, in.dtype() == s.dtype(), "GraphedStep: input ", i, " is ", in.dtype(),
                    " but the captured step takes ", s.dtype());
  }
}

void GraphedStep::run(const std::vector<Tensor>& inputs) {
  check_inputs(inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].is_same(static_inputs_[i])) kernels::copy_(static_inputs_[i], inputs[i]);
  }
  if (graph_.captured()) {
    graph_.replay();
  } else if (steps_ < options_.warmup_steps) {
    step_(static_inputs_);
  } else {
    capture();
    graph_.replay();  // the capture ran nothing: this is the step
  }
  ++steps_;
}

void GraphedStep::run_eagerly(const std::vector<Tensor>& inputs) {
  step_(inputs);
  ++steps_;
}

void GraphedStep::capture() {
  // Nothing of the warm-up may still be running or pending when the capture records its own work.
  cuda::synchronize(device_);
  cuda::GraphCapture capture(graph_, device_);
  step_(static_inputs_);
  capture.end();
}

}  // namespace tandem::train
