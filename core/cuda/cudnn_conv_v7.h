#pragma once
// cuDNN's v7 convolution API (algorithm lists and the descriptor API): what cudnn_conv.cpp falls
// back to for a shape the graph API cannot run, and the types both share.
#include <memory>
#include <string>

#include "tandem/core/cuda/cudnn_common.h"

namespace tandem::cuda::cudnn {

// The three convolution directions differ only in which cuDNN functions they call.
enum class Direction { forward, backward_data, backward_filter };
const char* direction_name(Direction dir);  // "fwd", "bwd_data", "bwd_filter"

// The tensors of one call: x input (N, C, H, W), w filter, y output (N, K, P, Q); which of them
// is written depends on the direction.
struct ConvTensors {
  const Tensor& x;
  const Tensor& w;
  const Tensor& y;
};

// A workspace of `bytes` on like's device, from the caching allocator.
Tensor workspace_for(size_t bytes, const Tensor& like);  // (bytes,) u8

// One shape and direction through the v7 API, chosen by PyTorch's v7 rule: cuDNN's results in its
// order (heuristics, or measured times in benchmark mode), each run with the math type cuDNN
// returned for it; one whose workspace cannot be had gives way to the next.
class V7Conv {
 public:
  V7Conv(Direction dir, cudnnHandle_t h, const ConvTensors& t, const Conv2dParams& p, bool benchmark,
         bool deterministic);
  void run(cudnnHandle_t h, const ConvTensors& t) const;
  std::string str() const;  // the algorithm, math type and workspace, for logs

 private:
  Direction dir_;
  TensorDesc x_, y_;
  FilterDesc w_;
  ConvDesc conv_;
  int algo_ = -1;
  size_t workspace_ = 0;
  cudnnMathType_t math_ = CUDNN_DEFAULT_MATH;
  size_t candidates_ = 0;
};

}  // namespace tandem::cuda::cudnn
