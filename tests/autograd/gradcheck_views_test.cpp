// Finite-difference gradient checks of the shape ops and views, on fresh random f64 inputs,
// contiguous and not, alone and chained.
#include "gradcheck_util.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;
using testing::random_transposed_leaf;

// A (2, 3, 4) leaf laid out as (3, 2, 4) in memory: dims 0 and 1 are swapped, the last is dense.
Tensor swapped_leaf() {
  Tensor x = views::permute(testing::random_tensor({3, 2, 4}), {1, 0, 2});
  x.requires_grad_();
  return x;
}

TEST(GradcheckViews, Reshape) {
  auto x = random_leaf({2, 3, 4});
  EXPECT_GRADCHECK([](const Inputs& v) { return reshape(v[0], {6, 4}); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return reshape(v[0], {4, -1}); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return reshape(v[0], {24}); }, (Inputs{x}));
  auto s = random_leaf({});
  EXPECT_GRADCHECK([](const Inputs& v) { return reshape(v[0], {1, 1}); }, (Inputs{s}));
}

TEST(GradcheckViews, ReshapeOfNonContiguousInputs) {
  auto xt = random_transposed_leaf({2, 3, 4});
  ASSERT_FALSE(xt.is_contiguous());
  // Merging the swapped dims needs a copy; splitting the outer dim does not.
  EXPECT_GRADCHECK([](const Inputs& v) { return reshape(v[0], {2, 12}); }, (Inputs{xt}));
  EXPECT_GRADCHECK([](const Inputs& v) { return reshape(v[0], {-1}); }, (Inputs{xt}));
  EXPECT_GRADCHECK([](const Inputs& v) { return reshape(v[0], {2, 1, 3, 4}); }, (Inputs{xt}));
  auto xs = swapped_leaf();
  EXPECT_GRADCHECK([](const Inputs& v) { return reshape(v[0], {6, 4}); }, (Inputs{xs}));
  EXPECT_GRADCHECK([](const Inputs& v) { return reshape(v[0], {2, 3, 2, 2}); }, (Inputs{xs}));
}

TEST(GradcheckViews, View) {
  auto x = random_leaf({2, 3, 4});
  EXPECT_GRADCHECK([](const Inputs& v) { return view(v[0], {2, 12}); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return view(v[0], {-1, 2, 3}); }, (Inputs{x}));
  auto xs = swapped_leaf();
  ASSERT_FALSE(xs.is_contiguous());
  EXPECT_GRADCHECK([](const Inputs& v) { return view(v[0], {2, 3, 2, 2}); }, (Inputs{xs}));
  EXPECT_GRADCHECK([](const Inputs& v) { return view(v[0], {1, 2, 3, 4, 1}); }, (Inputs{xs}));
  EXPECT_THROW(view(xs, {6, 4}), ValueError);
}

TEST(GradcheckViews, Flatten) {
  auto x = random_leaf({2, 3, 2, 2});
  EXPECT_GRADCHECK([](const Inputs& v) { return flatten(v[0]); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return flatten(v[0], 1); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return flatten(v[0], 1, -2); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return flatten(v[0], -2, -1); }, (Inputs{x}));
  auto xt = random_transposed_leaf({2, 3, 4});
  EXPECT_GRADCHECK([](const Inputs& v) { return flatten(v[0], 1); }, (Inputs{xt}));
  EXPECT_GRADCHECK([](const Inputs& v) { return flatten(v[0], 0, 1); }, (Inputs{xt}));
}

TEST(GradcheckViews, TransposePermuteT) {
  for (const Tensor& x : {random_leaf({2, 3, 4}), random_transposed_leaf({2, 3, 4})}) {
    SCOPED_TRACE(x.is_contiguous() ? "contiguous" : "non-contiguous");
    EXPECT_GRADCHECK([](const Inputs& v) { return transpose(v[0], 0, 2); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return transpose(v[0], -1, -2); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return transpose(v[0], 1, 1); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return permute(v[0], {2, 0, 1}); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return permute(v[0], {1, 2, 0}); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return permute(v[0], {-1, 0, -2}); }, (Inputs{x}));
    // A view's gradient must follow the output's layout: add a non-symmetric term after the view.
    Tensor w = testing::random_tensor({4, 2, 3});
    EXPECT_GRADCHECK([w](const Inputs& v) { return mul(permute(v[0], {2, 0, 1}), w); }, (Inputs{x}));
  }
  for (const Tensor& m : {random_leaf({3, 5}), random_transposed_leaf({3, 5})}) {
    EXPECT_GRADCHECK([](const Inputs& v) { return t(v[0]); }, (Inputs{m}));
    EXPECT_GRADCHECK([](const Inputs& v) { return t(t(v[0])); }, (Inputs{m}));
  }
}

TEST(GradcheckViews, Narrow) {
  for (const Tensor& x : {random_leaf({3, 5}), random_transposed_leaf({3, 5})}) {
    SCOPED_TRACE(x.is_contiguous() ? "contiguous" : "non-contiguous");
    EXPECT_GRADCHECK([](const Inputs& v) { return narrow(v[0], 1, 1, 3); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return narrow(v[0], 0, 2, 1); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return narrow(v[0], -1, -2, 2); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return narrow(v[0], 0, 0, 3); }, (Inputs{x}));
  }
}

TEST(GradcheckViews, NarrowValues) {
  Tensor x = from_vector(std::vector<double>{0, 1, 2, 3, 4, 5}, {6}, DType::f64);
  EXPECT_TRUE(testing::all_close(narrow(x, 0, -4, 3), {2, 3, 4}));
  EXPECT_TRUE(testing::all_close(narrow(x, 0, 1, 2), {1, 2}));
}

TEST(GradcheckViews, Slice) {
  for (const Tensor& x : {random_leaf({4, 7}), random_transposed_leaf({4, 7})}) {
    SCOPED_TRACE(x.is_contiguous() ? "contiguous" : "non-contiguous");
    EXPECT_GRADCHECK([](const Inputs& v) { return slice(v[0], 1, 0, 7, 2); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return slice(v[0], 1, 1, 6, 3); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return slice(v[0], 1, -5, 100, 2); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return slice(v[0], 0, -3, -1, 1); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return slice(v[0], -2, 1, 4, 2); }, (Inputs{x}));
    EXPECT_GRADCHECK([](const Inputs& v) { return slice(v[0], -1, -7, 7, 4); }, (Inputs{x}));
    // Two strided slices of the same tensor: the gradients overlap in one buffer.
    EXPECT_GRADCHECK([](const Inputs& v) { return add(slice(v[0], 1, 0, 6, 3), slice(v[0], 1, 1, 7, 3)); },
                     (Inputs{x}));
  }
}

TEST(GradcheckViews, SliceValues) {
  Tensor x = from_vector(std::vector<double>{0, 1, 2, 3, 4, 5, 6}, {7}, DType::f64);
  EXPECT_TRUE(testing::all_close(slice(x, 0, -5, 100, 2), {2, 4, 6}));
  EXPECT_TRUE(testing::all_close(slice(x, 0, 1, -1, 3), {1, 4}));
  EXPECT_TRUE(testing::all_close(slice(x, 0, -100, 3), {0, 1, 2}));
  EXPECT_EQ(slice(x, 0, 5, 2).numel(), 0);
}

TEST(GradcheckViews, EmptySlicesGetAnEmptyGradient) {
  auto x = random_leaf({2, 3});
  // An empty piece beside a non-empty one: its backward must add nothing (and not throw).
  EXPECT_GRADCHECK([](const Inputs& v) { return cat({narrow(v[0], 0, 1, 0), slice(v[0], 0, 1, 2)}, 0); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return cat({slice(v[0], 1, 2, 1, 2), v[0]}, 1); }, (Inputs{x}));
  Tensor y = random_leaf({2, 3});
  Tensor w = testing::random_tensor({2, 3});
  add(sum(narrow(y, 1, 3, 0)), sum(mul(y, w))).backward();
  EXPECT_TRUE(testing::all_close(y.grad(), w));
}

TEST(GradcheckViews, SqueezeUnsqueeze) {
  auto x = random_leaf({2, 1, 3});
  EXPECT_GRADCHECK([](const Inputs& v) { return squeeze(v[0], 1); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return squeeze(v[0], -2); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return squeeze(v[0]); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return unsqueeze(v[0], 0); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return unsqueeze(v[0], -1); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return unsqueeze(v[0], 2); }, (Inputs{x}));
  auto xt = random_transposed_leaf({3, 1, 4});
  EXPECT_GRADCHECK([](const Inputs& v) { return squeeze(unsqueeze(v[0], 1), 1); }, (Inputs{xt}));
  EXPECT_GRADCHECK([](const Inputs& v) { return unsqueeze(squeeze(v[0]), -1); }, (Inputs{xt}));
}

TEST(GradcheckViews, Expand) {
  auto c = random_leaf({3, 1});
  EXPECT_GRADCHECK([](const Inputs& v) { return expand(v[0], {3, 4}); }, (Inputs{c}));
  EXPECT_GRADCHECK([](const Inputs& v) { return expand(v[0], {-1, 4}); }, (Inputs{c}));
  EXPECT_GRADCHECK([](const Inputs& v) { return expand(v[0], {2, 3, 4}); }, (Inputs{c}));
  EXPECT_GRADCHECK([](const Inputs& v) { return expand(v[0], {2, 1, -1, 5}); }, (Inputs{c}));
  EXPECT_GRADCHECK([](const Inputs& v) { return expand(v[0], {3, 1}); }, (Inputs{c}));  // no-op
  auto r = random_leaf({4});
  EXPECT_GRADCHECK([](const Inputs& v) { return expand(v[0], {3, -1}); }, (Inputs{r}));
  auto s = random_leaf({});
  EXPECT_GRADCHECK([](const Inputs& v) { return expand(v[0], {2, 3}); }, (Inputs{s}));
  auto xt = random_transposed_leaf({1, 3, 2});
  EXPECT_GRADCHECK([](const Inputs& v) { return expand(v[0], {4, -1, 3, 2}); }, (Inputs{xt}));
  EXPECT_THROW(expand(c, {-1, 3, 4}), ValueError);
}

TEST(GradcheckViews, ExpandNoOpKeepsTheLeafALeaf) {
  auto c = random_leaf({3, 1});
  Tensor e = expand(c, {3, 1});
  EXPECT_TRUE(c.is_leaf());
  EXPECT_FALSE(e.is_leaf());
  sum(mul(e, 2.0)).backward();
  EXPECT_TRUE(testing::all_close(c.grad(), {2.0, 2.0, 2.0}));
}

TEST(GradcheckViews, ContiguousAndClone) {
  auto x = random_leaf({3, 4});
  auto xt = random_transposed_leaf({3, 4});
  for (const Tensor& in : {x, xt}) {
    SCOPED_TRACE(in.is_contiguous() ? "contiguous" : "non-contiguous");
    EXPECT_GRADCHECK([](const Inputs& v) { return contiguous(v[0]); }, (Inputs{in}));
    EXPECT_GRADCHECK([](const Inputs& v) { return clone(v[0]); }, (Inputs{in}));
    EXPECT_GRADCHECK([](const Inputs& v) { return mul(clone(v[0]), v[0]); }, (Inputs{in}));
  }
  EXPECT_TRUE(contiguous(xt).is_contiguous());
  EXPECT_NE(clone(x).data_ptr(), x.data_ptr());
}

TEST(GradcheckViews, ToDtypeRoundTripBackward) {
  // f64 -> f32 -> f64 rounds the values, so finite differences in f64 would see the rounding;
  // check instead that the gradient comes back in f64 with the right values.
  Tensor x = random_leaf({3, 4});
  Tensor w = testing::random_tensor({3, 4});
  Tensor y = to(x, DType::f32);
  ASSERT_EQ(y.dtype(), DType::f32);
  Tensor z = to(y, DType::f64);
  ASSERT_EQ(z.dtype(), DType::f64);
  EXPECT_TRUE(testing::all_close(z, x, 1e-6, 1e-6));
  sum(mul(z, w)).backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(x.grad().dtype(), DType::f64);
  EXPECT_EQ(x.grad().shape(), x.shape());
  // The gradient passes through f32: w rounded to f32, no worse.
  EXPECT_TRUE(testing::all_close(x.grad(), to(to(w, DType::f32), DType::f64), 0.0, 0.0));
  EXPECT_TRUE(testing::all_close(x.grad(), w, 1e-6, 1e-7));

  // A gradient that starts in f32 (w32 is exact in f32) arrives exactly.
  Tensor xt = random_transposed_leaf({3, 4});
  Tensor w32 = to(testing::random_tensor({3, 4}), DType::f32);
  sum(mul(to(xt, DType::f32), w32)).backward();
  EXPECT_EQ(xt.grad().dtype(), DType::f64);
  EXPECT_TRUE(testing::all_close(xt.grad(), to(w32, DType::f64), 0.0, 0.0));

  // Same dtype: the identity, gradient and all.
  EXPECT_GRADCHECK([](const Inputs& v) { return to(v[0], DType::f64); }, (Inputs{x}));
}

TEST(GradcheckViews, ChainsOfViews) {
  for (const Tensor& x : {random_leaf({2, 3, 4}), random_transposed_leaf({2, 3, 4})}) {
    SCOPED_TRACE(x.is_contiguous() ? "contiguous" : "non-contiguous");
    EXPECT_GRADCHECK(
        [](const Inputs& v) {
          return narrow(reshape(permute(v[0], {2, 0, 1}), {4, 6}), 1, 1, 4);
        },
        (Inputs{x}));
    EXPECT_GRADCHECK(
        [](const Inputs& v) {
          Tensor s = slice(transpose(v[0], 0, 2), 0, 1, 4, 2);  // (2, 3, 2)
          return expand(unsqueeze(flatten(s, 1), 0), {3, -1, -1});
        },
        (Inputs{x}));
    EXPECT_GRADCHECK(
        [](const Inputs& v) {
          Tensor a = view(contiguous(permute(v[0], {1, 0, 2})), {3, 8});
          return mul(squeeze(narrow(t(a), 0, 2, 1)), narrow(a, 1, 5, 3));
        },
        (Inputs{x}));
  }
}

}  // namespace
}  // namespace tandem
