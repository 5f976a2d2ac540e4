// Deterministic mode on the GPU: the ordered twins of index_add and scatter_add (the atomic
// kernels' replacements) give the same bits on two runs over inputs with many repeated rows, and
// the CPU backend's result (same order of additions: bit for bit in f32/f64, within a rounding
// step in f16/bf16, whose conversions may round differently).
#include <functional>

#include "support/test_util.h"
#include "tandem/core/determinism.h"
#include "tandem/core/index.h"

namespace tandem {
namespace {

using testing::random_indices;
using testing::same_bits;

// Runs `op` on the CPU and twice on the GPU, in deterministic mode: the GPU runs agree bit for
// bit, and match the CPU (bit for bit in f32/f64).
void check_ordered(DType dtype, const Tensor& index, const Tensor& src,
                   const std::function<Tensor(const Tensor&, const Tensor&)>& op) {
  DeterministicAlgorithmsGuard on(true);
  const Device gpu("cuda:0"), cpu("cpu");
  Tensor cpu_result = op(index, src);
  Tensor a = op(index.to(gpu), src.to(gpu)).to(cpu);
  Tensor b = op(index.to(gpu), src.to(gpu)).to(cpu);
  EXPECT_TRUE(same_bits(a, b)) << dtype_name(dtype);
  if (dtype == DType::f32 || dtype == DType::f64) {
    EXPECT_TRUE(same_bits(a, cpu_result)) << dtype_name(dtype);
  } else {
    EXPECT_TRUE(testing::all_close(a.to(DType::f64), cpu_result.to(DType::f64).to_vector<double>(), 2e-2, 2e-2))
        << dtype_name(dtype);
  }
}

class DeterministicIndex : public ::testing::TestWithParam<DType> {};

TEST_P(DeterministicIndex, IndexAddRepeatsBitsAndMatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  // 4000 entries over 50 rows (80 per row on average), negative indices among them.
  Tensor index = random_indices(4000, -50, 50, {4000});
  Tensor src = testing::random_tensor({3, 4000, 7}, DType::f64).to(GetParam());  // (3, 4000, 7)
  check_ordered(GetParam(), index, src,
                [](const Tensor& i, const Tensor& s) { return kernels::index_add({3, 50, 7}, 1, i, s); });
}

// Rows of 64 elements: the row kernel (one warp per row, 16-byte vectors).
TEST_P(DeterministicIndex, IndexAddOfWholeRowsRepeatsBitsAndMatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  Tensor index = random_indices(3000, -50, 50, {3000});
  Tensor src = testing::random_tensor({2, 3000, 64}, DType::f64).to(GetParam());  // (2, 3000, 64)
  check_ordered(GetParam(), index, src, [](const Tensor& i, const Tensor& s) {
    return kernels::index_add({2, 50, 64}, 1, i, s);
  });
}

TEST_P(DeterministicIndex, ScatterAddRepeatsBitsAndMatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  Tensor index = random_indices(4 * 600 * 5, 0, 20, {4, 600, 5});  // (4, 600, 5) into 20 rows
  Tensor src = testing::random_tensor({4, 600, 5}, DType::f64).to(GetParam());
  check_ordered(GetParam(), index, src,
                [](const Tensor& i, const Tensor& s) { return kernels::scatter_add({4, 20, 5}, 1, i, s); });
}

// The embedding's backward (index_select's gradient is index_add) at GPT-2's shape: 50257 rows,
// 8192 tokens, half of them one padding token.
TEST(DeterministicIndexEmbedding, GradientRepeatsBits) {
  TANDEM_REQUIRE_CUDA();
  DeterministicAlgorithmsGuard on(true);
  const Device gpu("cuda:0");
  std::vector<int64_t> tokens = random_indices(8192, 0, 50257, {8192}).to_vector<int64_t>();
  for (size_t i = 0; i < tokens.size(); i += 2) tokens[i] = 50256;
  Tensor index = from_vector(tokens).to(gpu);
  Tensor grad = testing::random_tensor({1, 8192, 768}, DType::f32).to(gpu);  // (1, tokens, dim)
  Tensor a = kernels::index_add({1, 50257, 768}, 1, index, grad);
  Tensor b = kernels::index_add({1, 50257, 768}, 1, index, grad);
  EXPECT_TRUE(same_bits(a.to(Device("cpu")), b.to(Device("cpu"))));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DeterministicIndex, ::testing::Values(DType::f32, DType::f64, DType::f16, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace tandem
