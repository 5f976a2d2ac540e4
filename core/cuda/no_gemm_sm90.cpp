// gemm_sm90.h in a build without CUTLASS's headers: no problem has a kernel, so every 16-bit
// product runs on cuBLASLt.
#include "tandem/core/cuda/gemm_sm90.h"

namespace tandem::cuda::sm90 {

std::string variant_name(int) { return "CUTLASS sm90 (not built)"; }
bool available(int) { return false; }
bool supported(const Problem&) { return false; }
int default_variant(const Problem&, int) { return 0; }
bool run(const Problem&, int, int, cudaStream_t) { return false; }

}  // namespace tandem::cuda::sm90

namespace tandem::cuda {
bool cutlass_gemm_built() { return false; }
}  // namespace tandem::cuda
