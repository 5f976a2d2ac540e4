#pragma once
// cuBLASLt's algorithm choice, shared by matmul.cpp and linear.cpp: one heuristic query (cuBLASLt's
// first result, limited by the workspace and the operands' alignments) and a cache of its answers
// per problem, so each shape, layout and alignment is asked about once.
#include <functional>
#include <map>
#include <mutex>

#include "tandem/core/cuda/cublaslt.h"

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
};

// cuBLASLt's first algorithm for D = op(A) @ op(B) (C = D in place) as desc and the layouts
// describe, with kWorkspaceBytes of workspace.
Heuristic query_heuristic(int device, const MatmulDesc& desc, const Layout& a, const Layout& b, const Layout& d,
                          const Alignments& alignments);

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
