// Binding the process to its GPU, in a build with CUDA.
#include <cuda_runtime.h>

#include "tandem/core/cuda/check.h"
#include "tandem/dist/internal.h"

namespace tandem::dist::internal {

void bind_device(int device) { TANDEM_CUDA_CHECK(cudaSetDevice(device)); }

}  // namespace tandem::dist::internal
