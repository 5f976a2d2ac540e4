#include "tandem/core/random.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tandem/core/cuda_graph.h"
#include "tandem/core/kernels.h"
#include "tandem/core/philox.h"
#include "tandem/core/views.h"

namespace tandem {

Generator& default_generator() {
  static Generator generator(0);
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

namespace {
Tensor draw(const Shape& shape, RandomKind kind, double p1, double p2, TensorOptions options, Generator* gen) {
  Generator& g = gen != nullptr ? *gen : default_generator();
  Tensor out = empty(shape, options);
  if (options.device.is_cuda() && cuda::is_capturing()) {
    // Inside a graph capture the counters come from the device, so each replay draws new numbers.
    cuda::CapturedDraw d = cuda::capture_random_draw(g, static_cast<uint64_t>(out.numel()), options.device.index);
    kernels::random_from_base_(out, kind, d.base, d.relative_offset, p1, p2);
    return out;
  }
  uint64_t offset = g.advance(static_cast<uint64_t>(out.numel()));
  kernels::random_(out, kind, g.seed(), offset, p1, p2);
  return out;
}
}  // namespace

Tensor uniform(const Shape& shape, double low, double high, TensorOptions options, Generator* gen) {
  TANDEM_CHECK_AS(ValueError, low <= high, "uniform: low ", low, " must not exceed high ", high);
  return draw(shape, RandomKind::uniform, low, high, options, gen);
}

Tensor rand(const Shape& shape, TensorOptions options, Generator* gen) { return uniform(shape, 0.0, 1.0, options, gen); }

Tensor normal(const Shape& shape, double mean, double std, TensorOptions options, Generator* gen) {
  TANDEM_CHECK_AS(ValueError, std >= 0.0, "normal: std must be >= 0, got ", std);
  return draw(shape, RandomKind::normal, mean, std, options, gen);
}

Tensor randn(const Shape& shape, TensorOptions options, Generator* gen) { return normal(shape, 0.0, 1.0, options, gen); }

Tensor bernoulli(const Shape& shape, double p, TensorOptions options, Generator* gen) {
  TANDEM_CHECK_AS(ValueError, p >= 0.0 && p <= 1.0, "bernoulli: p must be in [0, 1], got ", p);
  return draw(shape, RandomKind::bernoulli, p, 0.0, options, gen);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions options, Generator* gen) {
  TANDEM_CHECK_AS(ValueError, low < high, "randint: low ", low, " must be below high ", high);
  Tensor u = draw(shape, RandomKind::uniform, 0.0, 1.0, TensorOptions(DType::f64), gen);
  std::vector<double> values = u.to_double_vector();
  std::vector<int64_t> ints(values.size());
  double span = static_cast<double>(high - low);
  for (size_t i = 0; i < values.size(); ++i) {
    ints[i] = low + std::min(static_cast<int64_t>(std::floor(values[i] * span)), high - low - 1);
  }
  return views::reshape(from_vector(ints, {static_cast<int64_t>(ints.size())}, options), shape);
}

Tensor randperm(int64_t n, Generator* gen) {
  TANDEM_CHECK_AS(ValueError, n >= 0, "randperm: n must be >= 0, got ", n);
  Generator& g = gen != nullptr ? *gen : default_generator();
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  uint64_t offset = g.advance(static_cast<uint64_t>(n));
  // Fisher-Yates with one Philox draw per position.
  for (int64_t i = n - 1; i > 0; --i) {
    double u = philox::uniform(g.seed(), offset + static_cast<uint64_t>(i));
    auto j = static_cast<int64_t>(u * static_cast<double>(i + 1));
    std::swap(perm[i], perm[std::min(j, i)]);
  }
  return from_vector(perm, n == 0 ? Shape{0} : Shape{n});
}

}  // namespace tandem
