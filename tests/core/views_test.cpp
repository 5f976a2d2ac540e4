// Views: reshape/view, permute/transpose, narrow/slice, squeeze/unsqueeze, expand and contiguous
// copies. Every view is checked element by element against an index formula over the base data.
#include <numeric>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::all_close;

// Row-major flat index of `index` in `shape`.
int64_t flat(const Shape& shape, const std::vector<int64_t>& index) {
  int64_t f = 0;
  for (size_t d = 0; d < shape.size(); ++d) f = f * shape[d] + index[d];
  return f;
}

// Calls fn(index) for every multi-index of shape, in row-major order.
template <typename Fn>
void for_each_index(const Shape& shape, Fn fn) {
  std::vector<int64_t> index(shape.size(), 0);
  if (shape_numel(shape) == 0) return;
  while (true) {
    fn(index);
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    while (d >= 0 && ++index[d] == shape[d]) index[d--] = 0;
    if (d < 0) return;
  }
}

TEST(View, ContiguousTensorViewsShareStorage) {
  Tensor x = testing::random_tensor({2, 3, 4});
  Tensor v = views::view(x, {6, 4});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_EQ(v.strides(), (Strides{4, 1}));
  EXPECT_TRUE(v.storage().is_same(x.storage()));
  EXPECT_EQ(v.to_double_vector(), x.to_double_vector());
  EXPECT_EQ(views::view(x, {24}).shape(), (Shape{24}));
  EXPECT_EQ(views::view(x, {1, 24, 1}).shape(), (Shape{1, 24, 1}));
}

TEST(View, InfersOneMinusOne) {
  Tensor x = testing::random_tensor({2, 3, 4});
  EXPECT_EQ(views::view(x, {-1}).shape(), (Shape{24}));
  EXPECT_EQ(views::view(x, {4, -1}).shape(), (Shape{4, 6}));
  EXPECT_EQ(views::reshape(x, {-1, 2, 2}).shape(), (Shape{6, 2, 2}));
  EXPECT_EQ(views::infer_shape({3, -1}, 0, "view"), (Shape{3, 0}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { views::view(x, {-1, -1}); }, {"view", "only one size may be -1"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { views::view(x, {5, -1}); }, {"view", "cannot infer", "[5, -1]"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { views::view(x, {-2, 12}); }, {"view", "invalid size -2"}));
}

TEST(View, OfATransposedTensorWhereExpressible) {
  // base (6, 4) contiguous; x = base^T is (4, 6) with strides (1, 4).
  Tensor base = testing::random_tensor({6, 4});
  std::vector<double> b = base.to_double_vector();
  Tensor x = views::transpose(base, 0, 1);
  // Splitting the stride-4 dim: x[i, j*3 + k] = base[j*3 + k, i].
  Tensor v = views::view(x, {4, 2, 3});
  EXPECT_TRUE(v.storage().is_same(base.storage()));
  EXPECT_EQ(v.strides(), (Strides{1, 12, 4}));
  std::vector<double> got = v.to_double_vector();
  for_each_index(v.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(got[flat(v.shape(), i)], b[(i[1] * 3 + i[2]) * 4 + i[0]]);
  });
  // Splitting the stride-1 dim: x[i*2 + j, k] = base[k, i*2 + j].
  Tensor w = views::view(x, {2, 2, 6});
  EXPECT_EQ(w.strides(), (Strides{2, 1, 4}));
  got = w.to_double_vector();
  for_each_index(w.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(got[flat(w.shape(), i)], b[i[2] * 4 + i[0] * 2 + i[1]]);
  });
  // Adding and removing size-1 dims is always expressible.
  EXPECT_EQ(views::view(x, {4, 1, 6, 1}).to_double_vector(), x.to_double_vector());
}

TEST(View, OfANarrowedTensorWhereExpressible) {
  Tensor base = testing::random_tensor({4, 6});
  std::vector<double> b = base.to_double_vector();
  Tensor x = views::narrow(base, 1, 1, 3);  // (4, 3) with strides (6, 1), offset 1
  EXPECT_FALSE(x.is_contiguous());
  Tensor v = views::view(x, {2, 2, 3});
  EXPECT_EQ(v.strides(), (Strides{12, 6, 1}));
  EXPECT_EQ(v.offset(), 1);
  std::vector<double> got = v.to_double_vector();
  for_each_index(v.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(got[flat(v.shape(), i)], b[(i[0] * 2 + i[1]) * 6 + 1 + i[2]]);
  });
}

TEST(View, ThatNeedsACopyIsAClearError) {
  Tensor x = views::transpose(testing::random_tensor({6, 4}), 0, 1);
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] { views::view(x, {24}); }, {"view", "[4, 6]", "strides [1, 4]", "[24]", "without a copy", "reshape"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { views::view(x, {3, 8}); }, {"view", "[3, 8]"}));
  Tensor e = views::expand(testing::random_tensor({3}), {2, 3});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { views::view(e, {6}); }, {"view", "without a copy"}));
  // The autograd op says the same.
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { view(x, {24}); }, {"view", "without a copy"}));
}

TEST(Reshape, CopiesOnlyWhenNoViewExists) {
  Tensor base = testing::random_tensor({6, 4});
  Tensor x = views::transpose(base, 0, 1);
  Tensor viewed = views::reshape(x, {4, 2, 3});
  EXPECT_TRUE(viewed.storage().is_same(base.storage()));
  Tensor copied = views::reshape(x, {24});
  EXPECT_FALSE(copied.storage().is_same(base.storage()));
  EXPECT_TRUE(copied.is_contiguous());
  std::vector<double> b = base.to_double_vector(), got = copied.to_double_vector();
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(got[i * 6 + j], b[j * 4 + i]);
  }
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        views::reshape(x, {5, 5});
      },
      {"reshape", "[5, 5]", "25 elements", "24"}));
}

TEST(Reshape, ZeroElementTensors) {
  Tensor x = empty({0, 4});
  EXPECT_EQ(views::reshape(x, {2, 0, 3}).shape(), (Shape{2, 0, 3}));
  EXPECT_EQ(views::view(views::transpose(x, 0, 1), {0}).numel(), 0);
}

TEST(Flatten, MergesARangeOfDims) {
  Tensor x = testing::random_tensor({2, 3, 4, 5});
  EXPECT_EQ(flatten(x).shape(), (Shape{120}));
  EXPECT_EQ(flatten(x, 1, 2).shape(), (Shape{2, 12, 5}));
  EXPECT_EQ(flatten(x, -2).shape(), (Shape{2, 3, 20}));
  EXPECT_EQ(flatten(x, 1, 2).to_double_vector(), x.to_double_vector());
  EXPECT_EQ(flatten(scalar_tensor(1.0)).shape(), (Shape{1}));
}

TEST(Permute, MatchesTheIndexFormula) {
  Tensor x = testing::random_tensor({2, 3, 4, 5});
  std::vector<double> b = x.to_double_vector();
  std::vector<int64_t> order = {2, 0, 3, 1};
  Tensor p = views::permute(x, order);
  EXPECT_EQ(p.shape(), (Shape{4, 2, 5, 3}));
  EXPECT_EQ(p.strides(), (Strides{5, 60, 1, 20}));
  EXPECT_TRUE(p.storage().is_same(x.storage()));
  std::vector<double> got = p.to_double_vector();
  for_each_index(p.shape(), [&](const std::vector<int64_t>& i) {
    // p[i0, i1, i2, i3] = x[i1, i3, i0, i2]
    EXPECT_EQ(got[flat(p.shape(), i)], b[flat(x.shape(), {i[1], i[3], i[0], i[2]})]);
  });
  // Negative dims in the order, and the autograd op agrees.
  EXPECT_EQ(views::permute(x, {-2, 0, -1, 1}).strides(), p.strides());
  EXPECT_EQ(permute(x, order).to_double_vector(), got);
}

TEST(Permute, RejectsBadOrders) {
  Tensor x = testing::random_tensor({2, 3, 4});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { views::permute(x, {0, 1}); }, {"permute", "2 dims", "[2, 3, 4]"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { views::permute(x, {0, 1, 1}); }, {"permute", "twice"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { views::permute(x, {0, 1, 3}); }, {"permute", "dim 3"}));
}

TEST(Transpose, SwapsTwoDims) {
  Tensor x = testing::random_tensor({3, 4, 5});
  std::vector<double> b = x.to_double_vector();
  Tensor t = views::transpose(x, 0, -1);
  EXPECT_EQ(t.shape(), (Shape{5, 4, 3}));
  EXPECT_FALSE(t.is_contiguous());
  std::vector<double> got = t.to_double_vector();
  for_each_index(t.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(got[flat(t.shape(), i)], b[flat(x.shape(), {i[2], i[1], i[0]})]);
  });
  Tensor m = testing::random_tensor({3, 7});
  EXPECT_EQ(tandem::t(m).to_double_vector(), views::transpose(m, 1, 0).to_double_vector());
  EXPECT_TRUE(views::transpose(views::transpose(x, 0, 2), 2, 0).is_contiguous());
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { tandem::t(x); }, {"t:", "2-D", "[3, 4, 5]"}));
}

TEST(Narrow, SelectsARangeAlongADim) {
  Tensor x = testing::random_tensor({4, 5, 6});
  std::vector<double> b = x.to_double_vector();
  Tensor n = views::narrow(x, 1, 2, 3);
  EXPECT_EQ(n.shape(), (Shape{4, 3, 6}));
  EXPECT_EQ(n.offset(), 12);
  EXPECT_TRUE(n.storage().is_same(x.storage()));
  std::vector<double> got = n.to_double_vector();
  for_each_index(n.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(got[flat(n.shape(), i)], b[flat(x.shape(), {i[0], i[1] + 2, i[2]})]);
  });
  // Negative start and dim count from the end; narrowing a narrowed view composes offsets.
  EXPECT_EQ(views::narrow(x, -1, -2, 2).to_double_vector(), views::narrow(x, 2, 4, 2).to_double_vector());
  Tensor nn = views::narrow(views::narrow(x, 0, 1, 3), 0, 1, 2);
  EXPECT_EQ(nn.to_double_vector(), views::narrow(x, 0, 2, 2).to_double_vector());
  EXPECT_EQ(views::narrow(x, 2, 6, 0).numel(), 0);
  EXPECT_EQ(narrow(x, 1, 2, 3).to_double_vector(), got);
}

TEST(Narrow, OutOfRangeIsAnIndexError) {
  Tensor x = testing::random_tensor({4, 5});
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { views::narrow(x, 1, 3, 3); },
                                               {"narrow", "[3, 6)", "dim 1 of size 5", "[4, 5]"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { views::narrow(x, 0, -6, 1); }, {"narrow", "size 4"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { views::narrow(x, 2, 0, 1); }, {"narrow", "dim 2"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { narrow(x, 0, 2, 5); }, {"narrow", "size 4"}));
}

TEST(Narrow, ZeroDimTensorIsAnIndexError) {
  Tensor s = scalar_tensor(2.0);
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { views::narrow(s, 0, 0, 1); }, {"narrow", "0-dim"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { narrow(s, 0, 0, 1); }, {"narrow", "0-dim"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { slice(s, 0, 0, 1); }, {"slice", "0-dim"}));
}

TEST(Slice, WithAStep) {
  Tensor x = testing::random_tensor({3, 10});
  std::vector<double> b = x.to_double_vector();
  Tensor s = slice(x, 1, 1, 8, 3);  // columns 1, 4, 7
  EXPECT_EQ(s.shape(), (Shape{3, 3}));
  EXPECT_EQ(s.strides(), (Strides{10, 3}));
  EXPECT_TRUE(s.storage().is_same(x.storage()));
  std::vector<double> got = s.to_double_vector();
  for_each_index(s.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(got[flat(s.shape(), i)], b[i[0] * 10 + 1 + 3 * i[1]]);
  });
  EXPECT_EQ(slice(x, 1, -3, 10).shape(), (Shape{3, 3}));    // negative start
  EXPECT_EQ(slice(x, 1, 0, -1, 2).shape(), (Shape{3, 5}));  // columns 0, 2, 4, 6, 8
  EXPECT_EQ(slice(x, 0, 5, 100).numel(), 0);                // clamped to an empty range
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { slice(x, 1, 0, 5, 0); }, {"slice", "step", "positive"}));
}

TEST(Squeeze, RemovesSizeOneDims) {
  Tensor x = testing::random_tensor({1, 3, 1, 4});
  Tensor s = views::squeeze(x, 2);
  EXPECT_EQ(s.shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(s.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(views::squeeze(x, -4).shape(), (Shape{3, 1, 4}));
  EXPECT_EQ(views::squeeze_all(x).shape(), (Shape{3, 4}));
  EXPECT_EQ(squeeze(x).shape(), (Shape{3, 4}));
  EXPECT_EQ(views::squeeze_all(x).to_double_vector(), x.to_double_vector());
  EXPECT_TRUE(views::squeeze_all(x).storage().is_same(x.storage()));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { views::squeeze(x, 1); },
                                               {"squeeze", "dim 1 has size 3", "expected 1", "[1, 3, 1, 4]"}));
  EXPECT_EQ(views::squeeze_all(testing::random_tensor({1, 1})).dim(), 0);
}

TEST(Squeeze, ZeroDimTensorIsReturnedUnchanged) {
  Tensor s = scalar_tensor(2.0);
  EXPECT_EQ(views::squeeze(s, 0).dim(), 0);
  EXPECT_EQ(views::squeeze(s, -1).item(), 2.0);
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { views::squeeze(s, 1); }, {"squeeze", "dim 1"}));
}

TEST(Unsqueeze, InsertsASizeOneDim) {
  Tensor x = testing::random_tensor({3, 4});
  EXPECT_EQ(views::unsqueeze(x, 0).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(views::unsqueeze(x, 1).shape(), (Shape{3, 1, 4}));
  EXPECT_EQ(views::unsqueeze(x, 2).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(views::unsqueeze(x, -1).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(views::unsqueeze(x, -3).shape(), (Shape{1, 3, 4}));
  EXPECT_TRUE(views::unsqueeze(x, 1).is_contiguous());
  EXPECT_EQ(views::unsqueeze(x, 1).to_double_vector(), x.to_double_vector());
  Tensor t = views::unsqueeze(views::transpose(x, 0, 1), 1);  // (4, 1, 3)
  EXPECT_EQ(t.to_double_vector(), views::transpose(x, 0, 1).to_double_vector());
  EXPECT_EQ(views::unsqueeze(scalar_tensor(1.0), 0).shape(), (Shape{1}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { views::unsqueeze(x, 3); }, {"unsqueeze", "dim 3"}));
}

TEST(Expand, UsesStrideZero) {
  Tensor x = testing::random_tensor({3, 1});
  std::vector<double> b = x.to_double_vector();
  Tensor e = views::expand(x, {2, 3, 4});
  EXPECT_EQ(e.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Strides{0, 1, 0}));
  EXPECT_TRUE(e.storage().is_same(x.storage()));
  EXPECT_FALSE(e.is_contiguous());
  std::vector<double> got = e.to_double_vector();
  for_each_index(e.shape(), [&](const std::vector<int64_t>& i) { EXPECT_EQ(got[flat(e.shape(), i)], b[i[1]]); });
  EXPECT_TRUE(views::expand(x, {3, 1}).is_same(x));
  // A 0-dim tensor expands to anything.
  double v = testing::random_tensor({1}).item();
  Tensor s = views::expand(scalar_tensor(v, DType::f64), {2, 2});
  EXPECT_EQ(s.strides(), (Strides{0, 0}));
  EXPECT_EQ(s.to_double_vector(), std::vector<double>(4, v));
  // The autograd op accepts -1 for "keep this size".
  EXPECT_EQ(expand(x, {2, -1, 5}).shape(), (Shape{2, 3, 5}));
}

TEST(Expand, RejectsIncompatibleShapes) {
  Tensor x = testing::random_tensor({3, 2});
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        views::expand(x, {3, 4});
      },
      {"expand", "[3, 2]", "[3, 4]", "size 2 at dim 1", "equal 4 or be 1"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { views::expand(x, {6}); }, {"expand", "fewer dims"}));
}

TEST(Contiguous, CopiesOnlyNonContiguousTensors) {
  Tensor x = testing::random_tensor({3, 4});
  EXPECT_TRUE(kernels::contiguous(x).is_same(x));
  EXPECT_TRUE(contiguous(x).is_same(x));
  for (Tensor v : {views::transpose(x, 0, 1), views::narrow(x, 1, 1, 2), slice(x, 1, 0, 4, 2),
                   views::expand(views::narrow(x, 0, 1, 1), {5, 4})}) {
    Tensor c = kernels::contiguous(v);
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_FALSE(c.storage().is_same(x.storage()));
    EXPECT_EQ(c.shape(), v.shape());
    EXPECT_EQ(c.strides(), contiguous_strides(v.shape()));
    EXPECT_EQ(c.to_double_vector(), v.to_double_vector());
  }
  // Values of a transposed copy by the index formula.
  std::vector<double> b = x.to_double_vector();
  Tensor c = kernels::contiguous(views::transpose(x, 0, 1));
  const double* p = c.data<double>();
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(p[i * 3 + j], b[j * 4 + i]);
  }
}

TEST(Contiguous, OfADeeplyStridedView) {
  // A permuted, sliced and expanded view of 5 dims; the copy must follow the logical order.
  Tensor base = testing::random_tensor({4, 1, 6, 5});
  std::vector<double> b = base.to_double_vector();
  Tensor v = views::permute(slice(base, 2, 1, 6, 2), {3, 0, 2, 1});  // (5, 4, 3, 1)
  v = views::expand(views::unsqueeze(v, 1), {5, 2, 4, 3, 7});
  std::vector<double> got = kernels::contiguous(v).to_double_vector();
  for_each_index(v.shape(), [&](const std::vector<int64_t>& i) {
    EXPECT_EQ(got[flat(v.shape(), i)], b[flat(base.shape(), {i[2], 0, 1 + 2 * i[3], i[0]})]);
  });
}

}  // namespace
}  // namespace tandem
