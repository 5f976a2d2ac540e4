#include "tandem/layers/layers.h"

#include <cmath>

#include "tandem/core/random.h"

namespace tandem::nn {

namespace {
// U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's kaiming_uniform_(a=sqrt(5)) for weights, and its
// bias initialisation, which reduce to the same bound.
Tensor fan_in_uniform(const Shape& shape, int64_t fan_in, TensorOptions options) {
  double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  return uniform(shape, -bound, bound, options);
}

// Parameters of normalisation layers stay f32 when the model goes to a 16-bit dtype.
TensorOptions stats_options(TensorOptions options) {
  return TensorOptions(is_half(options.dtype) ? DType::f32 : options.dtype, options.device);
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool with_bias, TensorOptions options)
    : Linear(in_features, out_features, Activation::none, with_bias, options) {}

Linear::Linear(int64_t in_features, int64_t out_features, Activation activation, bool with_bias, TensorOptions options)
    : activation(activation) {
  weight = register_parameter("weight", fan_in_uniform({out_features, in_features}, in_features, options));
  if (with_bias) bias = register_parameter("bias", fan_in_uniform({out_features}, in_features, options));
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias, activation); }

Tensor Linear::forward_without_bias(const Tensor& x) {
  TANDEM_CHECK_AS(ValueError, activation == Activation::none,
                  "Linear::forward_without_bias: the layer has an activation, which must follow its bias");
  return linear(x, weight, Tensor(), Activation::none);
}

GeluMlp::GeluMlp(const std::vector<int64_t>& widths, bool with_bias, TensorOptions options) {
  TANDEM_CHECK_AS(ValueError, widths.size() >= 2, "GeluMlp: needs at least two widths (in, out), got ", widths.size());
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const Activation act = i + 2 < widths.size() ? Activation::gelu_tanh : Activation::none;
    layers.push_back(register_module(std::to_string(2 * i),
                                     std::make_shared<Linear>(widths[i], widths[i + 1], act, with_bias, options)));
  }
}

Tensor GeluMlp::forward(const Tensor& x) {
  std::vector<Tensor> weights, biases;  // layer i's (widths[i + 1], widths[i]) and (widths[i + 1],)
  for (const auto& layer : layers) {
    weights.push_back(layer->weight);
    biases.push_back(layer->bias);
  }
  return gelu_mlp(x, weights, biases);
}

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dOptions conv,
               TensorOptions options) {
  TANDEM_CHECK_AS(ValueError, conv.groups >= 1 && in_channels % conv.groups == 0 && out_channels % conv.groups == 0,
                  "Conv2d: channels ", in_channels, " -> ", out_channels, " do not divide into ", conv.groups, " groups");
  params.stride_h = params.stride_w = conv.stride;
  params.pad_h = params.pad_w = conv.padding;
  params.dilation_h = params.dilation_w = conv.dilation;
  params.groups = conv.groups;
  int64_t fan_in = in_channels / conv.groups * kernel_size * kernel_size;
  weight = register_parameter(
      "weight", fan_in_uniform({out_channels, in_channels / conv.groups, kernel_size, kernel_size}, fan_in, options));
  if (conv.bias) bias = register_parameter("bias", fan_in_uniform({out_channels}, fan_in, options));
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, params); }

BatchNorm2d::BatchNorm2d(int64_t channels, double eps, double momentum, TensorOptions options)
    : eps(eps), momentum(momentum) {
  TensorOptions stats = stats_options(options);
  weight = register_parameter("weight", ones({channels}, stats));
  bias = register_parameter("bias", zeros({channels}, stats));
  running_mean = register_buffer("running_mean", zeros({channels}, stats));
  running_var = register_buffer("running_var", ones({channels}, stats));
  num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, TensorOptions(DType::i64, options.device)));
}

Tensor BatchNorm2d::forward(const Tensor& x) { return forward_with(x, Tensor(), false); }

Tensor BatchNorm2d::forward_relu(const Tensor& x, const Tensor& residual) { return forward_with(x, residual, true); }

Tensor BatchNorm2d::forward_with(const Tensor& x, const Tensor& residual, bool relu) {
  if (is_training()) kernels::add_(num_batches_tracked, ones({}, num_batches_tracked.options()));
  if (!residual.defined() && !relu) {
    return batch_norm(x, weight, bias, running_mean, running_var, is_training(), momentum, eps);
  }
  return batch_norm_act(x, weight, bias, running_mean, running_var, is_training(), momentum, eps, residual, relu);
}

LayerNorm::LayerNorm(Shape shape, double eps, TensorOptions options) : normalized_shape(std::move(shape)), eps(eps) {
  weight = register_parameter("weight", ones(normalized_shape, options));
  bias = register_parameter("bias", zeros(normalized_shape, options));
}

LayerNorm::LayerNorm(int64_t normalized_size, double eps, TensorOptions options)
    : LayerNorm(Shape{normalized_size}, eps, options) {}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

std::pair<Tensor, Tensor> LayerNorm::forward_with_residual(const Tensor& x, const Tensor& residual,
                                                           const Tensor& residual_bias) {
  return add_layer_norm(x, residual, normalized_shape, weight, bias, eps, residual_bias);
}

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, TensorOptions options) {
  weight = register_parameter("weight", randn({num_embeddings, embedding_dim}, options));
}

Tensor Embedding::forward(const Tensor& indices) { return embedding(indices, weight); }

Sequential::Sequential(std::vector<std::shared_ptr<Module>> modules) {
  for (auto& m : modules) push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<Module> module) {
  TANDEM_CHECK_AS(ValueError, module != nullptr, "Sequential: null module at position ", modules_.size());
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : modules_) y = m->forward(y);
  return y;
}

}  // namespace tandem::nn
