#pragma once
// Module: the base of every layer and model. It registers parameters, buffers and submodules in
// declaration order under stable dotted names ("blocks.3.attn.qkv.weight"), switches between
// training and evaluation, and moves everything to a device or dtype in place: a layer keeps its
// parameters as Tensor members, and because Tensor is a handle, moving rewrites the shared data
// (Tensor::set_data) so the members, the optimizer and DDP all see the moved tensors.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/autograd/ops.h"
#include "tandem/core/tensor.h"

namespace tandem::nn {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation of single-input modules; modules with other signatures define their own.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Parameters (require grad) and buffers (state saved with the model, no grad), this module's
  // and its submodules', depth-first in registration order.
  NamedTensors named_parameters() const;
  NamedTensors named_buffers() const;
  std::vector<Tensor> parameters() const;
  std::vector<Tensor> buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  int64_t num_parameters() const;  // total elements

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves parameters and buffers in place. to(dtype) converts floating tensors only.
  void to(Device device);
  virtual void to(DType dtype);
  // Lays out every 4-D parameter and buffer (and gradient) in `format`, in place, as PyTorch's
  // model.to(memory_format=torch.channels_last) does: channels-last convolution weights make the
  // convolutions run channels-last. Other tensors are left as they are.
  void to(MemoryFormat format);
  // Drops (set_to_none) or zeroes every parameter's gradient.
  void zero_grad(bool set_to_none = true);

  // Parameters then buffers, by dotted name.
  NamedTensors state_dict() const;
  // Copies values into the existing tensors (keeping device and dtype). Strict: every name must
  // be present on both sides with the same shape; mismatches are errors naming the tensor.
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true);

 protected:
  Tensor register_parameter(const std::string& name, Tensor value);
  Tensor register_buffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    check_name(name);
    children_.emplace_back(name, module);
    return module;
  }
  virtual std::string type_name() const { return "Module"; }

 private:
  void check_name(const std::string& name) const;
  void collect(const std::string& prefix, bool parameters, NamedTensors& out) const;

  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace tandem::nn
