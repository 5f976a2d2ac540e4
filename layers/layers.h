#pragma once
// The standard layers, with PyTorch's default initialisations (drawn from the default generator,
// so manual_seed makes a model reproducible), and the losses as modules.
#include <memory>
#include <utility>
#include <vector>

#include "tandem/layers/module.h"

namespace tandem::nn {

// y = activation(x W^T + b); W (out, in), b (out,), both U(-1/sqrt(in), 1/sqrt(in)). One fused
// op (see linear() in autograd/ops.h): on CUDA the bias and a GELU run in the matmul's epilogue.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, TensorOptions options = {});
  Linear(int64_t in_features, int64_t out_features, Activation activation, bool bias = true, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  // x W^T without the bias (activation none only), for a caller that adds the bias itself in a
  // fused op, as add_layer_norm's residual_bias does.
  Tensor forward_without_bias(const Tensor& x);
  Tensor weight, bias;  // (out, in), (out,) or undefined
  Activation activation = Activation::none;

 protected:
  std::string type_name() const override { return "Linear"; }
};

// Linear layers widths[0] -> widths[1] -> ... -> widths.back() with GELU (tanh) after every layer
// but the last, as one op (gelu_mlp in autograd/ops.h: on CUDA each GELU's backward can run in the
// epilogue of the product that makes its input gradient, which separate Linear modules cannot
// do). Layer i is a Linear named as PyTorch's nn.Sequential(Linear, GELU, Linear, ...) names it,
// "2i" ("0", "2", "4", ...), so its parameters exchange with such a model by name.
class GeluMlp : public Module {
 public:
  explicit GeluMlp(const std::vector<int64_t>& widths, bool bias = true, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;  // (..., widths[0]) -> (..., widths.back())
  std::vector<std::shared_ptr<Linear>> layers;

 protected:
  std::string type_name() const override { return "GeluMlp"; }
};

struct Conv2dOptions {
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
  bool bias = true;
};

// Weight (out, in / groups, k, k) and bias (out,), U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dOptions conv = {},
         TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  Conv2dParams params;

 protected:
  std::string type_name() const override { return "Conv2d"; }
};

// Per-channel normalisation of (N, C, H, W); running statistics are buffers. Parameters and
// statistics stay f32 when the model is converted to a 16-bit dtype.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  // relu(forward(x) + residual) (residual optional) as one op, batch_norm_act: a ResNet block's
  // batch norm, shortcut add and ReLU in one pass each way on CUDA.
  Tensor forward_relu(const Tensor& x, const Tensor& residual = Tensor());
  using Module::to;
  void to(DType dtype) override { Module::to(is_half(dtype) ? DType::f32 : dtype); }
  Tensor weight, bias, running_mean, running_var;  // (C,) each
  Tensor num_batches_tracked;                       // () i64, as PyTorch saves it
  double eps, momentum;

 protected:
  std::string type_name() const override { return "BatchNorm2d"; }

 private:
  Tensor forward_with(const Tensor& x, const Tensor& residual, bool relu);
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, TensorOptions options = {});
  // Over the last dim, of size normalized_size: nn::LayerNorm(64) as in PyTorch.
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-5, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;
  // {x + residual, forward(x + residual)}, the residual add fused into the norm (add_layer_norm);
  // with residual_bias, x + (residual + residual_bias): the bias of the linear layer that made
  // residual (see Linear::forward_without_bias), added and differentiated here.
  std::pair<Tensor, Tensor> forward_with_residual(const Tensor& x, const Tensor& residual,
                                                  const Tensor& residual_bias = Tensor());
  Tensor weight, bias;  // normalized_shape each
  Shape normalized_shape;
  double eps;

 protected:
  std::string type_name() const override { return "LayerNorm"; }
};

// Rows of a (num, dim) table, N(0, 1) initialised; forward takes integer indices.
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, TensorOptions options = {});
  Tensor forward(const Tensor& indices) override;
  Tensor weight;  // (num, dim)

 protected:
  std::string type_name() const override { return "Embedding"; }
};

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5) : p(p) {}
  Tensor forward(const Tensor& x) override { return dropout(x, p, is_training()); }
  double p;

 protected:
  std::string type_name() const override { return "Dropout"; }
};

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = -1, int64_t padding = 0)
      : kernel(kernel), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& x) override { return max_pool2d(x, kernel, stride, padding); }
  int64_t kernel, stride, padding;

 protected:
  std::string type_name() const override { return "MaxPool2d"; }
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel, int64_t stride = -1, int64_t padding = 0)
      : kernel(kernel), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, kernel, stride, padding); }
  int64_t kernel, stride, padding;

 protected:
  std::string type_name() const override { return "AvgPool2d"; }
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(int64_t out_h, int64_t out_w) : out_h(out_h), out_w(out_w) {}
  Tensor forward(const Tensor& x) override { return adaptive_avg_pool2d(x, out_h, out_w); }
  int64_t out_h, out_w;

 protected:
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
};

// Flattens dims start..end into one (default: all but the batch dim).
class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override { return flatten(x, start_dim, end_dim); }
  int64_t start_dim, end_dim;

 protected:
  std::string type_name() const override { return "Flatten"; }
};

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }

 protected:
  std::string type_name() const override { return "ReLU"; }
};

class GELU : public Module {
 public:
  explicit GELU(GeluApproximate approximate = GeluApproximate::none) : approximate(approximate) {}
  Tensor forward(const Tensor& x) override { return gelu(x, approximate); }
  GeluApproximate approximate;

 protected:
  std::string type_name() const override { return "GELU"; }
};

class SiLU : public Module {
 public:
  Tensor forward(const Tensor& x) override { return silu(x); }

 protected:
  std::string type_name() const override { return "SiLU"; }
};

class Softplus : public Module {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0) : beta(beta), threshold(threshold) {}
  Tensor forward(const Tensor& x) override { return softplus(x, beta, threshold); }
  double beta, threshold;

 protected:
  std::string type_name() const override { return "Softplus"; }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override { return tanh(x); }

 protected:
  std::string type_name() const override { return "Tanh"; }
};

// Runs its modules in order; they are registered as "0", "1", ...
class Sequential : public Module {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  void push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return modules_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const { return modules_.at(i); }

 protected:
  std::string type_name() const override { return "Sequential"; }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

// ---- losses ----
class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(CrossEntropyOptions options = {}) : options(options) {}
  Tensor operator()(const Tensor& logits, const Tensor& target) const { return cross_entropy(logits, target, options); }
  CrossEntropyOptions options;
};

class MSELoss {
 public:
  explicit MSELoss(Reduction reduction = Reduction::mean) : reduction(reduction) {}
  Tensor operator()(const Tensor& input, const Tensor& target) const { return mse_loss(input, target, reduction); }
  Reduction reduction;
};

}  // namespace tandem::nn
