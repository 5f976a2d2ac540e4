#include "tandem/optim/update_in_backward.h"

#include <unordered_set>
#include <vector>

#include "tandem/autograd/node.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/error.h"

namespace tandem::optim {

struct UpdateInBackward::State {
  Optimizer* optimizer = nullptr;  // null once detached: the hooks stay registered and do nothing
  UpdateInBackwardOptions options;
  Device device;
  // This backward pass: parameters (by data) whose gradient is final but not yet used, their
  // element count, and those already updated.
  std::vector<const void*> ready;
  int64_t ready_elements = 0;
  std::unordered_set<const void*> updated;
  bool in_backward = false;
  bool side_stream_used = false;  // the compute stream must wait for the side stream at the end
  int64_t updates = 0;
  // GPU only: the compute stream's point each update starts after, and the side stream's point
  // the compute stream goes on after once backward ends.
  std::unique_ptr<cuda::Event> fork, join;

  // Updates the parameters `include` accepts (those with gradients): on the side stream, after the
  // compute stream's work so far, on a GPU; at once on the CPU.
  void update(const std::function<bool(const Tensor&)>& include) {
    ++updates;
    if (!device.is_cuda()) {
      optimizer->step_some(include);
      return;
    }
    cuda::DeviceGuard device_guard(device.index);
    cuda::StreamHandle side = cuda::side_stream(device.index);
    fork->record(device.index);
    fork->wait_on(side);
    {
      cuda::StreamGuard stream_guard(device.index, side);
      optimizer->step_some(include);
    }
    side_stream_used = true;
  }

  void update_ready() {
    if (ready.empty()) return;
    std::unordered_set<const void*> batch(ready.begin(), ready.end());
    update([&](const Tensor& p) { return batch.count(p.data_ptr()) != 0; });
    updated.insert(ready.begin(), ready.end());
    ready.clear();
    ready_elements = 0;
  }

  void on_gradient(const Tensor& param) {
    if (optimizer == nullptr) return;
    try {
      if (!in_backward) start_backward();
      ready.push_back(param.data_ptr());
      ready_elements += param.numel();
      if (ready_elements >= options.min_elements_per_update) update_ready();
    } catch (...) {
      in_backward = false;  // the engine drops the queued finish() with the failed backward
      throw;
    }
  }

  void start_backward() {
    in_backward = true;
    ready.clear();
    ready_elements = 0;
    updated.clear();
    updates = 0;
    side_stream_used = false;
    autograd::queue_callback([this] { finish_backward(); });
  }

  // After the backward pass, in one launch: the ready parameters not yet updated and those with a
  // gradient no hook reported (a zeroed gradient that got nothing this pass: step() updates it too);
  // then the compute stream waits for the side stream.
  void finish_backward() {
    if (optimizer == nullptr) return;
    in_backward = false;
    ready.clear();
    ready_elements = 0;
    bool left = false;
    for (const Tensor& p : optimizer->params()) {
      if (p.grad().defined() && updated.count(p.data_ptr()) == 0) left = true;
    }
    if (left) update([&](const Tensor& p) { return updated.count(p.data_ptr()) == 0; });
    if (side_stream_used) {
      cuda::DeviceGuard device_guard(device.index);
      join->record_on(cuda::side_stream(device.index));
      join->wait(device.index);
      side_stream_used = false;
    }
  }
};

UpdateInBackward::UpdateInBackward(Optimizer& optimizer, UpdateInBackwardOptions options)
    : state_(std::make_shared<State>()) {
  TANDEM_CHECK_AS(ValueError, options.min_elements_per_update >= 1,
                  "UpdateInBackward: min_elements_per_update must be >= 1, got ", options.min_elements_per_update);
  TANDEM_CHECK_AS(ValueError, optimizer.updated_in_backward_ == 0, "UpdateInBackward: ", optimizer.name(),
                  " already has an UpdateInBackward attached");
  std::vector<Tensor> params = optimizer.params();
  TANDEM_CHECK_AS(ValueError, !params.empty(), "UpdateInBackward: ", optimizer.name(), " has no parameters");
  for (const Tensor& p : params) {
    TANDEM_CHECK_AS(DeviceError, p.device() == params[0].device(), "UpdateInBackward: the parameters must be on one "
                    "device, but ", optimizer.name(), " has parameters on ", params[0].device(), " and on ", p.device());
  }
  state_->optimizer = &optimizer;
  state_->options = options;
  state_->device = params[0].device();
  if (state_->device.is_cuda()) {
    state_->fork = std::make_unique<cuda::Event>();
    state_->join = std::make_unique<cuda::Event>();
  }
  for (const Tensor& p : params) {
    Tensor handle = p;  // the hook is registered on the parameter's autograd meta
    handle.register_post_accumulate_grad_hook(
        [state = state_](const Tensor& param) { state->on_gradient(param); });
  }
  ++optimizer.updated_in_backward_;
}

UpdateInBackward::~UpdateInBackward() {
  if (state_->optimizer != nullptr) --state_->optimizer->updated_in_backward_;
  state_->optimizer = nullptr;
}

int64_t UpdateInBackward::updates_last_backward() const { return state_->updates; }

}  // namespace tandem::optim
