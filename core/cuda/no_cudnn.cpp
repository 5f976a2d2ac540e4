// The cuDNN-backed CUDA kernels of a build with CUDA but without cuDNN: each raises a DeviceError
// that says how to get them.
#include "tandem/core/backend.h"

namespace tandem::cuda {

namespace {
[[noreturn]] void no_cudnn(const char* what) {
  TANDEM_THROW(DeviceError, what, " on cuda needs cuDNN: tandem was built without it (reconfigure with "
               "-DTANDEM_WITH_CUDNN=ON and CUDNN_ROOT pointing at cuDNN 9)");
}
}  // namespace

void set_cudnn_benchmark(bool) {}
void conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { no_cudnn("conv2d"); }
void conv2d_backward_input(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { no_cudnn("conv2d"); }
void conv2d_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { no_cudnn("conv2d"); }
void pool2d_forward(const Tensor&, const Tensor&, const Pool2dParams&) { no_cudnn("pool2d"); }
void pool2d_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Pool2dParams&) {
  no_cudnn("pool2d");
}
}  // namespace tandem::cuda
