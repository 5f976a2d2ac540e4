#pragma once
// Shared helpers for tandem's tests: fresh random inputs, closeness checks, GPU skips, and
// checks on error messages.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tandem/core/backend.h"
#include "tandem/tandem.h"

namespace tandem::testing {

// A fresh seed per call (different every call within a run, reproducible across runs).
uint64_t next_seed();

// Normal(0, 1) values of the given shape; fresh numbers on every call.
Tensor random_tensor(const Shape& shape, TensorOptions options = DType::f64);
// Uniform values in [low, high); fresh numbers on every call.
Tensor random_uniform(const Shape& shape, double low, double high, TensorOptions options = DType::f64);
// Uniform values in [low, high) that `dtype` holds exactly (drawn in f32, rounded to dtype), as
// f64 on the CPU: a CPU reference in f64 and a GPU run in dtype then start from the same numbers.
Tensor random_exact_in(const Shape& shape, double low, double high, DType dtype);
// t converted to dtype on the GPU; and any tensor back as f64 on the CPU, for comparing.
Tensor on_gpu_as(const Tensor& t, DType dtype);
Tensor on_cpu_f64(const Tensor& t);
// A leaf that requires grad, for gradient checks (f64, cpu).
Tensor random_leaf(const Shape& shape);
// A non-contiguous leaf with the given shape: the transpose of a contiguous tensor, so its last
// two dims are swapped in memory. Needs at least 2 dims.
Tensor random_transposed_leaf(const Shape& shape);

// max |a - b| <= atol + rtol * max |b|, elementwise over the same shape; NaN never passes.
::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double rtol = 1e-6, double atol = 1e-8);
::testing::AssertionResult all_close(const Tensor& a, const std::vector<double>& expected, double rtol = 1e-6,
                                     double atol = 1e-8);

// Whether two CPU tensors have the same dtype, shape and element bytes (any strides).
bool same_bits(const Tensor& a, const Tensor& b);
// Whether two tensors on any device are both defined with the same dtype, shape and element
// bytes; the failure says which is missing or the largest difference.
::testing::AssertionResult bits_match(const Tensor& a, const Tensor& b);

// GPU allocations filled with NaN (0xFF bytes) for the scope, so that a read before a write shows;
// the device is synchronized before it ends.
class PoisonedAllocations {
 public:
  PoisonedAllocations();
  ~PoisonedAllocations();
  PoisonedAllocations(const PoisonedAllocations&) = delete;
  PoisonedAllocations& operator=(const PoisonedAllocations&) = delete;
};

// `count` i64 indices drawn from [low, high) on the CPU, of `shape` ((count,) when empty);
// negative ones count from the end. Fresh values on every call.
Tensor random_indices(int64_t count, int64_t low, int64_t high, const Shape& shape = {});

// True when a CUDA build sees at least one GPU.
bool cuda_available();

// A fresh directory under the test temp dir, unique to this process and call (mkdtemp), removed
// with its files at the end of the scope. Tests of one binary run in several processes at once
// (ranks, and CTest entries of one executable), so a fixed name would be shared between them.
class ScratchDirectory {
 public:
  ScratchDirectory();
  ~ScratchDirectory();
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs fn and checks it throws E whose what() contains every one of `parts`.
template <typename E>
::testing::AssertionResult throws_with(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const E& e) {
    std::string what = e.what();
    for (const std::string& p : parts) {
      if (what.find(p) == std::string::npos) {
        return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << p << "\"";
      }
    }
    return ::testing::AssertionSuccess();
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "threw a different exception: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

}  // namespace tandem::testing

// Skips the current test with a reason unless a GPU is visible to a CUDA build.
#define TANDEM_REQUIRE_CUDA()                                                                   \
  do {                                                                                          \
    if (!::tandem::testing::cuda_available()) {                                                 \
      GTEST_SKIP() << (::tandem::cuda::is_built() ? "no CUDA device visible"                    \
                                                  : "tandem was built without CUDA");           \
    }                                                                                           \
  } while (0)
