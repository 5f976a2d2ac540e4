#pragma once
// The two Fashion-MNIST models: an MLP 784-256-128-10 and a CNN of two convolution blocks
// (conv 3x3, batch norm, ReLU, 2x2 max-pool) and two linear layers.
#include <memory>
#include <string>

#include "tandem/tandem.h"

namespace fashion {

inline std::shared_ptr<tandem::nn::Sequential> make_mlp(tandem::TensorOptions o) {
  using namespace tandem::nn;
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Flatten>(), std::make_shared<Linear>(784, 256, true, o), std::make_shared<ReLU>(),
      std::make_shared<Linear>(256, 128, true, o), std::make_shared<ReLU>(), std::make_shared<Linear>(128, 10, true, o)});
}

inline std::shared_ptr<tandem::nn::Sequential> make_cnn(tandem::TensorOptions o) {
  using namespace tandem::nn;
  Conv2dOptions same{1, 1, 1, 1, false};  // stride 1, padding 1, no bias (batch norm follows)
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(1, 32, 3, same, o), std::make_shared<BatchNorm2d>(32, 1e-5, 0.1, o),
      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),                       // (N, 32, 14, 14)
      std::make_shared<Conv2d>(32, 64, 3, same, o), std::make_shared<BatchNorm2d>(64, 1e-5, 0.1, o),
      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),                       // (N, 64, 7, 7)
      std::make_shared<Flatten>(), std::make_shared<Linear>(64 * 7 * 7, 128, true, o), std::make_shared<ReLU>(),
      std::make_shared<Dropout>(0.25), std::make_shared<Linear>(128, 10, true, o)});
}

inline std::shared_ptr<tandem::nn::Sequential> make_model(const std::string& name, tandem::TensorOptions o) {
  if (name == "mlp") return make_mlp(o);
  if (name == "cnn") return make_cnn(o);
  TANDEM_THROW(ValueError, "unknown model '", name, "': expected mlp or cnn");
}

}  // namespace fashion
