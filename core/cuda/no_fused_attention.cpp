// cuDNN's fused attention in a CUDA build without cuDNN or without cuDNN's frontend headers: never
// supported, so bf16/f16 attention runs on tandem's own flash kernels (core/attention.cpp).
#include "tandem/core/backend.h"
#include "tandem/core/cuda_api.h"

namespace tandem::cuda {

bool cudnn_attention_built() { return false; }

bool fused_attention_supported(const Tensor&, const Tensor&, const Tensor&) { return false; }

void fused_attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double) {
  TANDEM_THROW(DeviceError, "fused attention needs cuDNN and its frontend headers: tandem was built without them "
               "(scripts/install-deps.sh fetches the headers; see README)");
}

void fused_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double) {
  TANDEM_THROW(DeviceError, "fused attention needs cuDNN and its frontend headers: tandem was built without them "
               "(scripts/install-deps.sh fetches the headers; see README)");
}

}  // namespace tandem::cuda
