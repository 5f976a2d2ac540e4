#pragma once
// Seeded, counter-based random numbers (Philox4x32-10). A Generator is a (seed, offset) pair:
// each draw of n numbers uses counters offset .. offset+n-1 and then advances the offset, so a
// seed gives the same numbers on every platform and device, and saving (seed, offset) in a
// checkpoint resumes the exact stream.
#include <cstdint>

#include "tandem/core/tensor.h"

namespace tandem {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  void manual_seed(uint64_t seed) {
    seed_ = seed;
    offset_ = 0;
  }
  void set_state(uint64_t seed, uint64_t offset) {
    seed_ = seed;
    offset_ = offset;
  }
  // Reserves n counters and returns the first.
  uint64_t advance(uint64_t n) {
    uint64_t first = offset_;
    offset_ += n;
    return first;
  }

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The process-wide generator used when none is passed (seed 0 until manual_seed).
Generator& default_generator();
void manual_seed(uint64_t seed);

// Uniform in [low, high).
Tensor uniform(const Shape& shape, double low, double high, TensorOptions options = {}, Generator* gen = nullptr);
Tensor rand(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);  // [0, 1)
Tensor normal(const Shape& shape, double mean, double std, TensorOptions options = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions options = {}, Generator* gen = nullptr);
// 1 with probability p, else 0.
Tensor bernoulli(const Shape& shape, double p, TensorOptions options = {}, Generator* gen = nullptr);
// Integers uniform in [low, high), i64 unless options say otherwise.
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options = DType::i64,
               Generator* gen = nullptr);
// A random permutation of 0..n-1 (i64, on the cpu).
Tensor randperm(int64_t n, Generator* gen = nullptr);

}  // namespace tandem
