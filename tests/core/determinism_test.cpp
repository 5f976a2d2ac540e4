// Deterministic mode: the process-wide flag, its environment variable, the error of an op without
// a deterministic path, and the CPU accumulating kernels giving the same bits run to run.
#include <random>

#include "support/test_util.h"
#include "tandem/core/determinism.h"
#include "tandem/core/index.h"

namespace tandem {
namespace {

TEST(Determinism, FlagTurnsOnAndOff) {
  DeterministicAlgorithmsGuard restore(are_deterministic_algorithms_enabled());
  use_deterministic_algorithms(true);
  EXPECT_TRUE(are_deterministic_algorithms_enabled());
  use_deterministic_algorithms(false);
  EXPECT_FALSE(are_deterministic_algorithms_enabled());
}

TEST(Determinism, GuardRestoresThePreviousMode) {
  DeterministicAlgorithmsGuard outer(false);
  {
    DeterministicAlgorithmsGuard inner(true);
    EXPECT_TRUE(are_deterministic_algorithms_enabled());
  }
  EXPECT_FALSE(are_deterministic_algorithms_enabled());
}

TEST(Determinism, EnvironmentValues) {
  for (const char* on : {"1", "true", "TRUE", "on", "yes"}) EXPECT_TRUE(detail::parse_deterministic_env(on)) << on;
  for (const char* off : {"", "0", "false", "Off", "no"}) EXPECT_FALSE(detail::parse_deterministic_env(off)) << off;
  EXPECT_FALSE(detail::parse_deterministic_env(nullptr));
  EXPECT_TRUE(testing::throws_with<ValueError>([] { detail::parse_deterministic_env("sometimes"); },
                                               {"TANDEM_DETERMINISTIC=sometimes", "expected 1, true"}));
}

TEST(Determinism, OpWithoutDeterministicPathRaisesOnlyWhenOn) {
  DeterministicAlgorithmsGuard on(true);
  EXPECT_TRUE(testing::throws_with<NotImplementedError>(
      [] { alert_not_deterministic("example_op"); },
      {"example_op has no deterministic implementation", "use_deterministic_algorithms(false)",
       "TANDEM_DETERMINISTIC"}));
  use_deterministic_algorithms(false);
  EXPECT_NO_THROW(alert_not_deterministic("example_op"));
}

using testing::same_bits;

// Many repeated rows: the CPU kernels add in source order, so two runs agree bit for bit.
TEST(Determinism, CpuIndexAddAndScatterAddRepeatBits) {
  DeterministicAlgorithmsGuard on(true);
  std::mt19937_64 gen(testing::next_seed());
  std::uniform_int_distribution<int64_t> row(0, 9);
  std::vector<int64_t> rows(2000), scatter_rows(3 * 400 * 5);
  for (int64_t& r : rows) r = row(gen);
  for (int64_t& r : scatter_rows) r = row(gen);
  Tensor src = testing::random_tensor({3, 2000, 4}, DType::f32);
  Tensor index = from_vector(rows);
  Tensor a = kernels::index_add({3, 10, 4}, 1, index, src), b = kernels::index_add({3, 10, 4}, 1, index, src);
  EXPECT_TRUE(same_bits(a, b));
  Tensor scatter_src = testing::random_tensor({3, 400, 5}, DType::f32);
  Tensor scatter_index = from_vector(scatter_rows, {3, 400, 5});
  Tensor c = kernels::scatter_add({3, 10, 5}, 1, scatter_index, scatter_src);
  Tensor d = kernels::scatter_add({3, 10, 5}, 1, scatter_index, scatter_src);
  EXPECT_TRUE(same_bits(c, d));
}

}  // namespace
}  // namespace tandem
