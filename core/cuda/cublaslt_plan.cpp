#include "tandem/core/cuda/cublaslt_plan.h"

namespace tandem::cuda::lt {

Heuristic query_heuristic(int device, const MatmulDesc& desc, const Layout& a, const Layout& b, const Layout& d,
                          const Alignments& alignments) {
  cublasLtMatmulPreference_t pref = nullptr;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  size_t workspace = kWorkspaceBytes;
  uint32_t al_a = static_cast<uint32_t>(alignments.a), al_b = static_cast<uint32_t>(alignments.b),
           al_d = static_cast<uint32_t>(alignments.d);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  Heuristic h;
  h.status = cublasLtMatmulAlgoGetHeuristic(handle(device), desc.get(), a.get(), b.get(), d.get(), d.get(), pref, 1,
                                            &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  h.found = h.status == CUBLAS_STATUS_SUCCESS && found > 0;
  h.algo = result.algo;
  return h;
}

}  // namespace tandem::cuda::lt
