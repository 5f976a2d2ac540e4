#pragma once
// cuBLASLt's algorithm choice, shared by matmul.cpp and linear.cpp: one heuristic query (cuBLASLt's
// first result, limited by the workspace and the operands' alignments; for the products that
// set_matmul_tuning times, the fastest of its first kTunedCandidates without a workspace and of
// its first kTunedCandidates with one, timed on the problem's own operands) and a cache of its
// answers per problem, so each shape, layout and alignment is asked about once. Each product then
// gets the workspace its algorithm needs, not kWorkspaceBytes.
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/core/cuda/cublaslt.h"
#include "tandem/core/cuda/gemm_sm90.h"

namespace tandem::cuda::lt {

// Bytes that cuBLASLt may assume its A, B and C/D pointers are aligned to.
struct Alignments {
  int a, b, d;
};

// The heuristic's answer: the query's status, and whether it offered an algorithm.
struct Heuristic {
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace_bytes = 0;  // what algo needs (cuBLASLt's answer), at most kWorkspaceBytes
  int sm90_variant = -1;       // >= 0: gemm_sm90.h's kernel in this variant runs instead of algo
};

// Runs the problem once with the given algorithm and workspace on the current stream (beta 0, so
// running it again writes the same outputs).
using Launch = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&, void* workspace, size_t workspace_bytes)>;

constexpr int kTunedCandidates = 8;

// The algorithm for D = op(A) @ op(B) (C = D in place) as desc and the layouts describe, with at
// most kWorkspaceBytes of workspace: cuBLASLt's first, or where set_matmul_tuning times a product
// of `flops` (2 x batch x m x n x k; outside deterministic mode and graph capture) the fastest of
// the candidates (those without a workspace first; one that needs a workspace is charged for the
// memset cuBLASLt issues before it), each run through `launch`. `what` names the problem in
// TANDEM_MATMUL_LOG's lines.
//
// `sm90_problem` (or null) is the same problem for gemm_sm90.h. Where cuda::gemm_kernels() allows
// and the problem has a kernel there, its variants are timed the same way and the fastest replaces
// cuBLASLt's choice where at least 2% faster (as charged above); untimed, they run only when
// gemm_kernels() is `cutlass` (in sm90::default_variant). `sm90_saves` (or empty) runs once the
// pass that gemm_sm90.h's kernel makes unnecessary (its epilogue does that work, cuBLASLt's does
// not); it is timed the same way and charged to cuBLASLt's candidates in that comparison.
Heuristic query_heuristic(int device, const MatmulDesc& desc, const Layout& a, const Layout& b, const Layout& d,
                          const Alignments& alignments, double flops, const Launch& launch, const std::string& what,
                          const sm90::Problem* sm90_problem = nullptr,
                          const std::function<bool()>& sm90_saves = nullptr);

// A candidate that needs a workspace is charged this on top of its timed median: the eager cost of
// the memset cuBLASLt issues before it (about 2.6 us on an H200 with the launch gaps around it),
// which event timings of the product do not show.
constexpr double kWorkspaceChargeMs = 2.5e-3;

// One timed candidate: its median ms (negative where cuBLASLt refused to run it) and the
// workspace it needs.
struct TimedCandidate {
  double ms;
  size_t workspace_bytes;
};

// The index of the candidate to keep, or -1 when none ran: going in order, a candidate replaces the
// best so far only when, with kWorkspaceChargeMs added where it needs a workspace, it is at least
// 2% faster (near ties keep the order, so that timing noise changes the choice less often).
int choose_timed_candidate(const std::vector<TimedCandidate>& candidates);

// Runs the problem with h's algorithm and a workspace of the size it needs, taken from the caching
// allocator for this call (none when it needs none). A fixed kWorkspaceBytes would add 32 MiB to
// the peak memory of any step whose peak falls on a product, for algorithms that mostly use none.
cublasStatus_t launch_with_workspace(const Heuristic& h, const Launch& launch, Device device);

// Runs the problem as h says: gemm_sm90.h's kernel where h chose one (sm90_problem is then the problem),
// else cuBLASLt's algorithm as launch_with_workspace does. CUBLAS_STATUS_NOT_SUPPORTED where
// neither has one. `ran_sm90` (or null) says whether gemm_sm90.h's kernel ran (in h.sm90_variant).
cublasStatus_t run_choice(const Heuristic& h, const Launch& launch, Device device, const sm90::Problem* sm90_problem,
                          bool* ran_sm90 = nullptr);

// Heuristic answers per problem key; thread-safe.
template <typename Key>
class PlanCache {
 public:
  // The cached answer for key, asking `query` the first time.
  Heuristic find(const Key& key, const std::function<Heuristic()>& query) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(key);
    if (it == plans_.end()) it = plans_.emplace(key, query()).first;
    return it->second;
  }
  // Remembers that the problem has no usable algorithm (cuBLASLt refused the cached one).
  void mark_unusable(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    plans_[key].found = false;
  }

 private:
  std::mutex mutex_;
  std::map<Key, Heuristic> plans_;
};

}  // namespace tandem::cuda::lt
