// Matrix products against a naive triple loop in double, with NumPy matmul semantics: 1-D
// operands promoted, batch dims broadcast, any operand layout.
#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::all_close;

struct Expected {
  Shape shape;
  std::vector<double> values;
};

// NumPy's matmul, written out: promote 1-D operands, broadcast the batch dims, loop.
Expected naive_matmul(const Tensor& a_in, const Tensor& b_in) {
  Shape sa = a_in.shape(), sb = b_in.shape();
  if (a_in.dim() == 1) sa.insert(sa.begin(), 1);
  if (b_in.dim() == 1) sb.push_back(1);
  int64_t m = sa[sa.size() - 2], k = sa.back(), n = sb.back();
  EXPECT_EQ(sb[sb.size() - 2], k);
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  size_t nb = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), nb - ba.size(), 1);
  bb.insert(bb.begin(), nb - bb.size(), 1);
  Shape batch(nb);
  for (size_t d = 0; d < nb; ++d) batch[d] = std::max(ba[d], bb[d]);
  std::vector<double> va = a_in.to_double_vector(), vb = b_in.to_double_vector();
  Expected out;
  std::vector<int64_t> index(nb, 0);
  for (int64_t p = 0; p < shape_numel(batch); ++p) {
    int64_t ia = 0, ib = 0;
    for (size_t d = 0; d < nb; ++d) {
      ia = ia * ba[d] + (ba[d] == 1 ? 0 : index[d]);
      ib = ib * bb[d] + (bb[d] == 1 ? 0 : index[d]);
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t l = 0; l < k; ++l) acc += va[(ia * m + i) * k + l] * vb[(ib * k + l) * n + j];
        out.values.push_back(acc);
      }
    }
    for (int64_t d = static_cast<int64_t>(nb) - 1; d >= 0 && ++index[d] == batch[d]; --d) index[d] = 0;
  }
  out.shape = batch;
  if (a_in.dim() > 1) out.shape.push_back(m);
  if (b_in.dim() > 1) out.shape.push_back(n);
  return out;
}

::testing::AssertionResult matches_naive(const Tensor& a, const Tensor& b, double rtol = 1e-12, double atol = 1e-12) {
  Tensor c = matmul(a, b);
  Expected e = naive_matmul(a, b);
  if (c.shape() != e.shape) {
    return ::testing::AssertionFailure() << "shape " << shape_str(c.shape()) << ", expected " << shape_str(e.shape);
  }
  if (c.dtype() != a.dtype()) return ::testing::AssertionFailure() << "dtype " << c.dtype();
  return all_close(c, e.values, rtol, atol);
}

TEST(Matmul, TwoDimensional) {
  EXPECT_TRUE(matches_naive(testing::random_tensor({5, 7}), testing::random_tensor({7, 3})));
  EXPECT_TRUE(matches_naive(testing::random_tensor({1, 9}), testing::random_tensor({9, 1})));
  EXPECT_TRUE(matches_naive(testing::random_tensor({33, 17}), testing::random_tensor({17, 65})));
  EXPECT_TRUE(kernels::matmul(testing::random_tensor({2, 2}), testing::random_tensor({2, 4})).is_contiguous());
}

TEST(Matmul, TransposedAndStridedOperands) {
  Tensor a = testing::random_tensor({7, 5}), b = testing::random_tensor({3, 7});
  Tensor at = views::transpose(a, 0, 1), bt = views::transpose(b, 0, 1);  // (5, 7), (7, 3): column-major
  EXPECT_TRUE(matches_naive(at, bt));
  EXPECT_TRUE(matches_naive(at, testing::random_tensor({7, 4})));
  EXPECT_TRUE(matches_naive(testing::random_tensor({2, 7}), bt));
  // Every other column or row: neither row- nor column-major with unit stride.
  Tensor wide = testing::random_tensor({5, 14}), tall = testing::random_tensor({14, 3});
  EXPECT_TRUE(matches_naive(slice(wide, 1, 0, 14, 2), slice(tall, 0, 1, 14, 2)));
  // A narrowed block of a larger matrix: row-major with a row stride larger than its width.
  Tensor big = testing::random_tensor({10, 12});
  EXPECT_TRUE(matches_naive(views::narrow(views::narrow(big, 0, 2, 4), 1, 3, 6), big.as_strided({6, 5}, {12, 1}, 1)));
  // Expanded operands (stride 0 inside the matrix).
  Tensor row = testing::random_tensor({1, 6}), col = testing::random_tensor({6, 1});
  EXPECT_TRUE(matches_naive(views::expand(row, {4, 6}), views::expand(col, {6, 3})));
}

TEST(Matmul, Batched) {
  EXPECT_TRUE(matches_naive(testing::random_tensor({3, 4, 5}), testing::random_tensor({3, 5, 2})));
  EXPECT_TRUE(matches_naive(testing::random_tensor({2, 3, 4, 5}), testing::random_tensor({2, 3, 5, 6})));
  // Transposed matrices inside a batch.
  Tensor a = views::transpose(testing::random_tensor({3, 5, 4}), 1, 2);
  Tensor b = views::transpose(testing::random_tensor({3, 2, 5}), -1, -2);
  EXPECT_TRUE(matches_naive(a, b));
  // Batch dims in a permuted order (not collapsible into one stride).
  Tensor p = views::permute(testing::random_tensor({4, 3, 2, 5}), {1, 0, 2, 3});  // (3, 4, 2, 5)
  EXPECT_TRUE(matches_naive(p, testing::random_tensor({3, 4, 5, 2})));
}

TEST(Matmul, BroadcastBatchDims) {
  EXPECT_TRUE(matches_naive(testing::random_tensor({2, 1, 3, 4}), testing::random_tensor({5, 4, 2})));
  EXPECT_EQ(matmul(testing::random_tensor({2, 1, 3, 4}), testing::random_tensor({5, 4, 2})).shape(),
            (Shape{2, 5, 3, 2}));
  EXPECT_TRUE(matches_naive(testing::random_tensor({4, 5}), testing::random_tensor({3, 5, 2})));
  EXPECT_TRUE(matches_naive(testing::random_tensor({3, 4, 5}), testing::random_tensor({5, 2})));
  EXPECT_TRUE(matches_naive(testing::random_tensor({3, 1, 4, 5}), testing::random_tensor({1, 2, 5, 3})));
  EXPECT_TRUE(matches_naive(testing::random_tensor({1, 1, 2, 3}), testing::random_tensor({1, 3, 4})));
  // An operand that is itself an expanded view along the batch dims.
  Tensor shared = views::expand(testing::random_tensor({1, 4, 3}), {6, 4, 3});
  EXPECT_TRUE(matches_naive(testing::random_tensor({6, 2, 4}), shared));
}

// Batch dims of size 1 carry any stride: collapsing the batch must compare each dim of size > 1
// with the next one of size > 1, never with the size-1 dim between them.
TEST(Matmul, BatchWithASizeOneDimOfUnusualStride) {
  // Slicing dim 1 of (3, 5, 4, 2, 3) with step 5 keeps one element whose stride (5 * 24) equals
  // dim 0's: the batch dims (3, 1, 4) do not collapse into one stride.
  Tensor base = testing::random_tensor({3, 5, 4, 2, 3});
  Tensor a = slice(base, 1, 0, 5, 5);
  ASSERT_EQ(a.shape(), (Shape{3, 1, 4, 2, 3}));
  EXPECT_TRUE(matches_naive(a, testing::random_tensor({3, 1, 4, 3, 2})));
  EXPECT_TRUE(matches_naive(a, testing::random_tensor({3, 2})));
}

TEST(Matmul, OneDimensionalOperands) {
  Tensor v = testing::random_tensor({4});
  EXPECT_TRUE(matches_naive(v, testing::random_tensor({4, 3})));     // (4) @ (4, 3) -> (3)
  EXPECT_TRUE(matches_naive(testing::random_tensor({2, 3, 4}), v));  // (2, 3, 4) @ (4) -> (2, 3)
  EXPECT_TRUE(matches_naive(v, testing::random_tensor({2, 4, 3})));  // (4) @ (2, 4, 3) -> (2, 3)
  EXPECT_TRUE(matches_naive(testing::random_tensor({5, 4}), v));     // (5, 4) @ (4) -> (5)
  Tensor dot = matmul(v, testing::random_tensor({4}));
  EXPECT_EQ(dot.dim(), 0);
  EXPECT_TRUE(matches_naive(v, testing::random_tensor({4})));
  EXPECT_TRUE(matches_naive(slice(testing::random_tensor({8}), 0, 0, 8, 2), testing::random_tensor({4, 2})));
  EXPECT_EQ(matmul(v, testing::random_tensor({2, 4, 3})).shape(), (Shape{2, 3}));
  EXPECT_EQ(matmul(testing::random_tensor({2, 3, 4}), v).shape(), (Shape{2, 3}));
}

TEST(Matmul, FloatDTypesWithTolerances) {
  // f32 computes in f32; f16/bf16 compute in f32 and round the result once to half an ulp (2^-11,
  // 2^-8 relative). The reference uses the inputs as rounded to the dtype.
  for (auto [d, tol] : {std::pair{DType::f32, 1e-5}, std::pair{DType::f16, 2e-3}, std::pair{DType::bf16, 1e-2}}) {
    Tensor a = testing::random_tensor({3, 6, 16}, d), b = testing::random_tensor({16, 5}, d);
    EXPECT_TRUE(matches_naive(a, b, tol, tol)) << d;
    EXPECT_TRUE(matches_naive(views::transpose(b, 0, 1), views::transpose(a, 1, 2), tol, tol)) << d;
    EXPECT_TRUE(matches_naive(testing::random_tensor({16}, d), b, tol, tol)) << d;
    EXPECT_EQ(matmul(a, b).dtype(), d);
  }
}

TEST(Matmul, EmptyInnerDimGivesZeros) {
  Tensor c = matmul(empty({3, 0}, DType::f64), empty({0, 4}, DType::f64));
  EXPECT_EQ(c.shape(), (Shape{3, 4}));
  EXPECT_EQ(c.to_double_vector(), std::vector<double>(12, 0.0));
  for (DType d : {DType::f32, DType::f16, DType::bf16}) {
    Tensor cb = matmul(empty({2, 3, 0}, d), empty({2, 0, 5}, d));
    EXPECT_EQ(cb.shape(), (Shape{2, 3, 5}));
    EXPECT_EQ(cb.to_double_vector(), std::vector<double>(30, 0.0)) << d;
  }
  EXPECT_EQ(matmul(empty({0, 3}, DType::f64), testing::random_tensor({3, 4})).shape(), (Shape{0, 4}));
  EXPECT_EQ(matmul(empty({0}), empty({0})).item(), 0.0);
}

TEST(Matmul, BadOperands) {
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [] {
        matmul(testing::random_tensor({2, 3}), testing::random_tensor({4, 5}));
      },
      {"matmul: [2, 3] @ [4, 5]: inner sizes 3 and 4 differ"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([] { matmul(testing::random_tensor({3}), testing::random_tensor({4})); },
                                               {"matmul", "[3] @ [4]", "inner sizes 3 and 4"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [] {
        matmul(testing::random_tensor({2, 2, 3}), testing::random_tensor({3, 3, 4}));
      },
      {"matmul", "[2] and [3]", "do not broadcast"}));
  EXPECT_TRUE(
      testing::throws_with<ValueError>([] { matmul(scalar_tensor(1.0, DType::f64), testing::random_tensor({3})); },
                                       {"matmul", "at least 1 dim", "[] @ [3]"}));
  EXPECT_TRUE(
      testing::throws_with<TypeError>([] { matmul(arange(4), arange(4)); }, {"matmul", "floating-point", "i64"}));
  EXPECT_TRUE(testing::throws_with<TypeError>(
      [] {
        matmul(testing::random_tensor({2, 3}, DType::f32), testing::random_tensor({3, 2}, DType::f64));
      },
      {"matmul", "f32", "f64", "[2, 3]", "[3, 2]"}));
}

}  // namespace
}  // namespace tandem
