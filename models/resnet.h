#pragma once
// ResNet-18 for 32x32 images (the CIFAR variant): a 3x3 stride-1 stem without max-pooling, four
// stages of two BasicBlocks (64, 128, 256, 512 channels; stride 2 and a 1x1 convolution + batch
// norm shortcut where a stage starts smaller), global average pooling and a linear classifier.
// Convolutions have no bias; every convolution is followed by batch norm, fused with the ReLU (and
// the block's shortcut add) after it (nn::BatchNorm2d::forward_relu). PyTorch's default
// initialisations (those of nn::Conv2d, nn::BatchNorm2d and nn::Linear).
//
// Parameter and buffer names match torchvision's ResNet and bench/reference/train_step.py's
// model: conv1.weight, bn1.*, layer<s>.<b>.conv1.weight, layer<s>.<b>.bn1.*, ...,
// layer<s>.0.downsample.0.weight (conv), layer<s>.0.downsample.1.* (batch norm), fc.{weight,bias}.
#include <memory>

#include "tandem/layers/layers.h"
#include "tandem/layers/module.h"

namespace tandem::models {

// relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), both convolutions 3x3.
class BasicBlock : public nn::Module {
 public:
  BasicBlock(int64_t in_channels, int64_t channels, int64_t stride, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;  // (N, C_in, H, W) -> (N, C, H / stride, W / stride)
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Sequential> downsample;  // 1x1 conv + batch norm, or null (identity)

 protected:
  std::string type_name() const override { return "BasicBlock"; }
};

class ResNet18 : public nn::Module {
 public:
  // memory_format channels_last lays the convolution weights out channels-last (Module::to), so
  // that with channels-last images (x.to(MemoryFormat::channels_last)) every activation stays
  // channels-last through the network and the convolutions run cuDNN's NHWC kernels.
  explicit ResNet18(int64_t num_classes = 10, TensorOptions options = {},
                    MemoryFormat memory_format = MemoryFormat::contiguous);
  Tensor forward(const Tensor& x) override;  // (N, 3, H, W) images -> (N, num_classes) logits
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;  // two BasicBlocks each
  std::shared_ptr<nn::Linear> fc;

 protected:
  std::string type_name() const override { return "ResNet18"; }
};

}  // namespace tandem::models
