#pragma once
// The cross-rank parameter-divergence check that DistributedDataParallel runs every
// DdpOptions::check_parameters_every steps: each rank hashes the bits of every parameter on the
// parameter's own device (kernels::content_hashes: one small kernel per parameter, one read-back
// of 8 bytes per parameter), the ranks all-gather the hashes (one small host-side collective over MPI), and when one differs, that
// parameter's values travel once more so the error can name the largest difference:
//   "parameters differ between ranks at step 12: the first that differs is 'fc1.weight' ([64, 32]
//    f32): rank 1 differs from rank 0 by up to 0.25 (at element 17); ranks 1 differ"
// Raised as a BackendError on every rank.
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::dist {

// Compares every rank's parameters (same names, same order everywhere); `step` goes into the error.
// Needs dist::init(); a world of one always agrees.
void check_parameters_agree(const std::vector<std::string>& names, const std::vector<Tensor>& parameters,
                            int64_t step, double timeout_seconds);

}  // namespace tandem::dist
