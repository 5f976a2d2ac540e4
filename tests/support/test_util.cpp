#include "support/test_util.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "tandem/core/backend.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/views.h"

namespace tandem::testing {

uint64_t next_seed() {
  // Seeded once from the clock so every run draws new inputs; printed so a failure can be replayed
  // by setting TANDEM_TEST_SEED.
  static std::atomic<uint64_t> counter = [] {
    const char* env = std::getenv("TANDEM_TEST_SEED");
    uint64_t base = env != nullptr ? std::strtoull(env, nullptr, 10)
                                   : static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    std::printf("[tandem] test seed %llu (set TANDEM_TEST_SEED to replay)\n", static_cast<unsigned long long>(base));
    return base;
  }();
  return counter++;
}

Tensor random_tensor(const Shape& shape, TensorOptions options) {
  Generator gen(next_seed());
  return randn(shape, options, &gen);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  Tensor ca = kernels::contiguous(a), cb = kernels::contiguous(b);
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), static_cast<size_t>(ca.numel()) * ca.element_size()) == 0;
}

::testing::AssertionResult bits_match(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return ::testing::AssertionFailure() << "a tensor is missing";
  Tensor ca = to(a, Device("cpu")), cb = to(b, Device("cpu"));
  if (ca.shape() != cb.shape() || ca.dtype() != cb.dtype()) return ::testing::AssertionFailure() << "shapes differ";
  if (!same_bits(ca, cb)) {
    return ::testing::AssertionFailure() << "bits differ; max |a - b| = "
                                         << amax(abs(sub(to(ca, DType::f64), to(cb, DType::f64)))).item<double>();
  }
  return ::testing::AssertionSuccess();
}

PoisonedAllocations::PoisonedAllocations() { cuda::set_poison_allocations(true); }
PoisonedAllocations::~PoisonedAllocations() {
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

Tensor random_indices(int64_t count, int64_t low, int64_t high, const Shape& shape) {
  std::mt19937_64 gen(next_seed());
  std::uniform_int_distribution<int64_t> pick(low, high - 1);
  std::vector<int64_t> values(static_cast<size_t>(count));
  for (int64_t& v : values) v = pick(gen);
  return from_vector(values, shape.empty() ? Shape{count} : shape);
}

Tensor random_uniform(const Shape& shape, double low, double high, TensorOptions options) {
  Generator gen(next_seed());
  return uniform(shape, low, high, options, &gen);
}

Tensor random_exact_in(const Shape& shape, double low, double high, DType dtype) {
  return to(to(random_uniform(shape, low, high, DType::f32), dtype), DType::f64);
}

Tensor on_gpu_as(const Tensor& t, DType dtype) { return to(to(t, dtype), Device("cuda")); }

Tensor on_cpu_f64(const Tensor& t) { return to(to(t, Device("cpu")), DType::f64); }

Tensor random_leaf(const Shape& shape) { return random_tensor(shape).requires_grad_(); }

Tensor random_transposed_leaf(const Shape& shape) {
  Shape swapped = shape;
  std::swap(swapped[swapped.size() - 1], swapped[swapped.size() - 2]);
  Tensor base = random_tensor(swapped);
  Tensor t = views::transpose(base, -1, -2);
  t.requires_grad_();
  return t;
}

::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) {
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  }
  return all_close(a, b.to_double_vector(), rtol, atol);
}

::testing::AssertionResult all_close(const Tensor& a, const std::vector<double>& expected, double rtol, double atol) {
  std::vector<double> got = a.to_double_vector();
  if (got.size() != expected.size()) {
    return ::testing::AssertionFailure() << got.size() << " values vs " << expected.size() << " expected";
  }
  double scale = 0.0;
  for (double v : expected) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < got.size(); ++i) {
    double diff = std::abs(got[i] - expected[i]);
    if (!(diff <= atol + rtol * scale)) {
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs expected " << expected[i]
                                           << " (|diff| " << diff << ", allowed " << atol + rtol * scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

bool cuda_available() { return cuda::is_built() && cuda::device_count() > 0; }

ScratchDirectory::ScratchDirectory() {
  std::string pattern = ::testing::TempDir() + "tandem_XXXXXX";
  TANDEM_CHECK(::mkdtemp(pattern.data()) != nullptr, "mkdtemp failed for ", pattern);
  path_ = pattern;
}

ScratchDirectory::~ScratchDirectory() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

}  // namespace tandem::testing
