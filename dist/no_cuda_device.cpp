// Binding the process to a GPU, in a build without CUDA (init() never asks: it sees no devices).
#include "tandem/dist/internal.h"

namespace tandem::dist::internal {

void bind_device(int device) {
  TANDEM_THROW(DeviceError, "dist: cannot bind to cuda:", device,
               ": tandem was built without CUDA (reconfigure with -DTANDEM_WITH_CUDA=ON on a machine with nvcc)");
}

}  // namespace tandem::dist::internal
