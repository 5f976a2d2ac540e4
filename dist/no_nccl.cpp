// The NCCL backend of a build without NCCL: init() makes no GPU group, and World::group_for says why.
#include "tandem/dist/internal.h"

namespace tandem::dist::internal {

bool nccl_is_built() { return false; }

std::shared_ptr<ProcessGroup> make_nccl_group(ProcessGroup&, int, const NcclSettings&) {
  TANDEM_THROW(DeviceError, "dist: tandem was built without NCCL, so cuda tensors cannot be communicated "
                            "(reconfigure with -DTANDEM_WITH_CUDA=ON -DTANDEM_WITH_NCCL=ON; NCCL_ROOT points at NCCL)");
}

void nccl_shutdown_group(ProcessGroup&) {}

}  // namespace tandem::dist::internal
