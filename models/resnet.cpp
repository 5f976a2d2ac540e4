#include "tandem/models/resnet.h"

namespace tandem::models {

namespace {
std::shared_ptr<nn::Conv2d> conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, TensorOptions options) {
  nn::Conv2dOptions conv;
  conv.stride = stride;
  conv.padding = kernel / 2;
  conv.bias = false;
  return std::make_shared<nn::Conv2d>(in, out, kernel, conv, options);
}

std::shared_ptr<nn::Sequential> stage(int64_t in, int64_t out, int64_t stride, TensorOptions options) {
  auto blocks = std::make_shared<nn::Sequential>();
  blocks->push_back(std::make_shared<BasicBlock>(in, out, stride, options));
  blocks->push_back(std::make_shared<BasicBlock>(out, out, 1, options));
  return blocks;
}
}  // namespace

BasicBlock::BasicBlock(int64_t in_channels, int64_t channels, int64_t stride, TensorOptions options) {
  conv1 = register_module("conv1", conv(in_channels, channels, 3, stride, options));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(channels, 1e-5, 0.1, options));
  conv2 = register_module("conv2", conv(channels, channels, 3, 1, options));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(channels, 1e-5, 0.1, options));
  if (stride != 1 || in_channels != channels) {
    downsample = register_module("downsample", std::make_shared<nn::Sequential>());
    downsample->push_back(conv(in_channels, channels, 1, stride, options));
    downsample->push_back(std::make_shared<nn::BatchNorm2d>(channels, 1e-5, 0.1, options));
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor y = bn1->forward_relu((*conv1)(x));                  // (N, C, H', W')
  Tensor shortcut = downsample ? downsample->forward(x) : x;  // (N, C, H', W')
  return bn2->forward_relu((*conv2)(y), shortcut);            // relu(bn2(conv2(y)) + shortcut)
}

ResNet18::ResNet18(int64_t num_classes, TensorOptions options, MemoryFormat memory_format) {
  TANDEM_CHECK_AS(ValueError, num_classes > 0, "ResNet18: num_classes must be positive, got ", num_classes);
  conv1 = register_module("conv1", conv(3, 64, 3, 1, options));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(64, 1e-5, 0.1, options));
  layer1 = register_module("layer1", stage(64, 64, 1, options));
  layer2 = register_module("layer2", stage(64, 128, 2, options));
  layer3 = register_module("layer3", stage(128, 256, 2, options));
  layer4 = register_module("layer4", stage(256, 512, 2, options));
  fc = register_module("fc", std::make_shared<nn::Linear>(512, num_classes, true, options));
  if (memory_format != MemoryFormat::contiguous) to(memory_format);
}

Tensor ResNet18::forward(const Tensor& x) {
  TANDEM_CHECK_AS(ValueError, x.dim() == 4 && x.size(1) == 3, "ResNet18: input ", shape_str(x.shape()),
                  " should be (N, 3, H, W) images");
  Tensor y = bn1->forward_relu((*conv1)(x));  // (N, 64, H, W)
  y = layer1->forward(y);                // (N, 64, H, W)
  y = layer2->forward(y);                // (N, 128, H / 2, W / 2)
  y = layer3->forward(y);                // (N, 256, H / 4, W / 4)
  y = layer4->forward(y);                // (N, 512, H / 8, W / 8)
  y = flatten(adaptive_avg_pool2d(y, 1, 1), 1);  // (N, 512)
  return (*fc)(y);                               // (N, num_classes)
}

}  // namespace tandem::models
