// Finite-difference gradient checks of the joining and indexing ops, on fresh random f64 inputs,
// with repeated indices so that gradients accumulate.
#include "gradcheck_util.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;
using testing::random_transposed_leaf;

Tensor indices(const std::vector<int64_t>& values, const Shape& shape = {}) { return from_vector(values, shape); }

TEST(GradcheckIndex, Cat) {
  auto a = random_leaf({2, 3}), b = random_leaf({3, 3}), c = random_transposed_leaf({1, 3});
  EXPECT_GRADCHECK([](const Inputs& v) { return cat({v[0], v[1]}, 0); }, (Inputs{a, b}));
  EXPECT_GRADCHECK([](const Inputs& v) { return cat({v[0], v[1], v[2]}, 0); }, (Inputs{a, b, c}));
  EXPECT_GRADCHECK([](const Inputs& v) { return cat({v[0], v[1], v[0]}, -2); }, (Inputs{a, c}));
  auto d = random_leaf({3, 2}), e = random_transposed_leaf({3, 4}), f = random_leaf({3, 1});
  EXPECT_GRADCHECK([](const Inputs& v) { return cat({v[0], v[1]}, 1); }, (Inputs{d, e}));
  EXPECT_GRADCHECK([](const Inputs& v) { return cat({v[0], v[1], v[2]}, -1); }, (Inputs{d, e, f}));
  // Only some inputs require grad.
  Tensor constant = testing::random_tensor({3, 2});
  EXPECT_GRADCHECK([constant](const Inputs& v) { return cat({constant, v[0], constant}, 1); }, (Inputs{e}));
  auto g = random_leaf({2, 2, 3}), h = random_transposed_leaf({2, 1, 3});
  EXPECT_GRADCHECK([](const Inputs& v) { return cat({v[0], v[1]}, 1); }, (Inputs{g, h}));
}

TEST(GradcheckIndex, Stack) {
  auto a = random_leaf({2, 3}), b = random_transposed_leaf({2, 3}), c = random_leaf({2, 3});
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    EXPECT_GRADCHECK([dim](const Inputs& v) { return stack({v[0], v[1]}, dim); }, (Inputs{a, b}));
    EXPECT_GRADCHECK([dim](const Inputs& v) { return stack({v[0], v[1], v[2]}, dim); }, (Inputs{a, b, c}));
  }
  EXPECT_GRADCHECK([](const Inputs& v) { return stack({v[0], v[0]}, 1); }, (Inputs{a}));
}

TEST(GradcheckIndex, IndexSelect) {
  for (const Tensor& x : {random_leaf({4, 5}), random_transposed_leaf({4, 5})}) {
    SCOPED_TRACE(x.is_contiguous() ? "contiguous" : "non-contiguous");
    Tensor rows = indices({3, 0, 3, 1, 3});
    Tensor cols = indices({4, 4, 0, -1, 2, 2});
    EXPECT_GRADCHECK([rows](const Inputs& v) { return index_select(v[0], 0, rows); }, (Inputs{x}));
    EXPECT_GRADCHECK([cols](const Inputs& v) { return index_select(v[0], 1, cols); }, (Inputs{x}));
    EXPECT_GRADCHECK([cols](const Inputs& v) { return index_select(v[0], -1, to(cols, DType::i32)); }, (Inputs{x}));
  }
  auto x3 = random_leaf({2, 3, 4});
  Tensor mid = indices({2, 2, 1, 2});
  EXPECT_GRADCHECK([mid](const Inputs& v) { return index_select(v[0], 1, mid); }, (Inputs{x3}));
}

TEST(GradcheckIndex, IndexSelectAccumulatesRepeatedRows) {
  Tensor x = random_leaf({3, 2});
  index_select(x, 0, indices({2, 0, 2, 2})).backward(ones({4, 2}, DType::f64));
  EXPECT_TRUE(testing::all_close(x.grad(), {1, 1, 0, 0, 3, 3}));
}

// A table used again after the lookup, as a language model's tied output head uses its embedding:
// the rows' gradient is added into the gradient the later use gave (in place where the engine
// hands over the only reference).
TEST(GradcheckIndex, IndexSelectFoldsIntoATiedUse) {
  auto table = random_leaf({6, 3}), h = random_leaf({3, 3});
  Tensor rows = indices({4, 0, 4, 5});
  EXPECT_GRADCHECK(
      [rows](const Inputs& v) {
        Tensor looked_up = index_select(v[0], 0, rows);      // (4, 3)
        return matmul(matmul(looked_up, v[1]), t(v[0]));     // (4, 6): the table again, transposed
      },
      (Inputs{table, h}));
}

// The later use's backward hands the same gradient tensor to two inputs, and the other input's
// node (exp, created before the lookup) runs after the lookup's, so that tensor still waits in its
// slot: the rows must go into a copy, leaving the other input's gradient as it was.
TEST(GradcheckIndex, IndexSelectLeavesASharedGradientAlone) {
  Tensor table = random_leaf({5, 2}), base = random_leaf({5, 2});
  Tensor other = exp(base);                                        // (5, 2)
  Tensor looked_up = index_select(table, 0, indices({1, 1, 3}));  // (3, 2)
  Tensor both = add(table, other);                                 // backward: {g, g}
  Tensor c = testing::random_tensor({5, 2});
  Tensor looked_up_sum = sum(looked_up);
  Tensor both_sum = sum(mul(both, c));
  add(looked_up_sum, both_sum).backward();
  EXPECT_TRUE(testing::all_close(base.grad(), mul(c, exp(base.detach()))));
  Tensor picked = from_vector(std::vector<double>{0, 0, 2, 2, 0, 0, 1, 1, 0, 0}, {5, 2}, DType::f64);  // rows 1, 1 and 3
  EXPECT_TRUE(testing::all_close(table.grad(), add(c, picked)));
}

TEST(GradcheckIndex, Gather) {
  for (const Tensor& x : {random_leaf({3, 4}), random_transposed_leaf({3, 4})}) {
    SCOPED_TRACE(x.is_contiguous() ? "contiguous" : "non-contiguous");
    // Along dim 0: index (k, 4) picks rows per column; along dim 1: index (3, k) picks columns per row.
    Tensor along0 = indices({2, 0, 0, 1, 2, 2, 1, 1, 0, 2, 2, 0, 1, 1, 1, 2, 0, 0, 0, 2}, {5, 4});
    Tensor along1 = indices({3, 3, 0, 1, 1, 2, 2, 2, 0, 0, 3, 1, 1, 1, 1}, {3, 5});
    EXPECT_GRADCHECK([along0](const Inputs& v) { return gather(v[0], 0, along0); }, (Inputs{x}));
    EXPECT_GRADCHECK([along1](const Inputs& v) { return gather(v[0], 1, along1); }, (Inputs{x}));
    EXPECT_GRADCHECK([along1](const Inputs& v) { return gather(v[0], -1, along1); }, (Inputs{x}));
    Tensor fewer = indices({1, 1, 2, 0}, {1, 4});
    EXPECT_GRADCHECK([fewer](const Inputs& v) { return gather(v[0], 0, fewer); }, (Inputs{x}));
  }
  auto x3 = random_leaf({2, 3, 2});
  Tensor idx3 = indices({2, 2, 0, 1, 1, 1, 0, 0}, {2, 2, 2});
  EXPECT_GRADCHECK([idx3](const Inputs& v) { return gather(v[0], 1, idx3); }, (Inputs{x3}));
}

TEST(GradcheckIndex, GatherAccumulatesRepeatedPositions) {
  Tensor x = random_leaf({2, 3});
  Tensor idx = indices({1, 1, 1, 0, 2, 0}, {2, 3});
  gather(x, 1, idx).backward(from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}, DType::f64));
  EXPECT_TRUE(testing::all_close(x.grad(), {0, 6, 0, 10, 0, 5}));
}

}  // namespace
}  // namespace tandem
