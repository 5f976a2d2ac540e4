#pragma once
// A parallel loop for the CPU backend: OpenMP when the library is built with it, a plain loop
// otherwise. The body must not throw (an exception cannot leave an OpenMP region): read
// pointers and check arguments before the loop.
#include <cstdint>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace tandem::cpu {

inline int64_t max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// Below this much work (about one multiply-add or element visit per unit), a parallel region costs
// more than it saves, and far more when the cores are busy: a barrier waits for a descheduled thread.
constexpr int64_t kParallelGrain = 32768;

// fn(i) for i in [0, n), in parallel when there are several items and n * cost_per_item reaches
// the grain. Nested inside it, Eigen's GEMM runs on one thread.
template <typename Fn>
void parallel_for(int64_t n, int64_t cost_per_item, Fn&& fn) {
#ifdef _OPENMP
  const bool parallel = n > 1 && n * cost_per_item >= kParallelGrain;
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t i = 0; i < n; ++i) fn(i);
}

}  // namespace tandem::cpu
