// gradcheck must catch a wrong backward, or every other gradcheck test could pass vacuously.
#include "gradcheck_util.h"
#include "tandem/autograd/node.h"

namespace tandem {
namespace {

using autograd::record;
using autograd::saved;
using testing::Inputs;

// a * b elementwise, as one recorded op whose backward scales the gradient of input `wrong_input`
// by `factor` (1: correct) at the elements where `wrong_mask` is true (undefined: everywhere).
Tensor product(const Tensor& a, const Tensor& b, int wrong_input, double factor, const Tensor& wrong_mask = Tensor()) {
  Tensor out = mul(a.detach(), b.detach());
  return record(
      out, "product", {a, b},
      [sa = saved(a), sb = saved(b), wrong_input, factor, wrong_mask](const Tensor& g) -> std::vector<Tensor> {
        std::vector<Tensor> grads = {mul(g, sb), mul(g, sa)};
        Tensor& w = grads[wrong_input];
        w = wrong_mask.defined() ? where(wrong_mask, mul(w, factor), w) : mul(w, factor);
        return grads;
      });
}

Tensor away_from_zero_leaf(const Shape& shape) { return testing::random_uniform(shape, 0.5, 2.0).requires_grad_(); }

TEST(GradcheckSelf, PassesTheCorrectBackward) {
  auto a = away_from_zero_leaf({2, 3}), b = away_from_zero_leaf({2, 3});
  EXPECT_GRADCHECK([](const Inputs& v) { return product(v[0], v[1], 0, 1.0); }, (Inputs{a, b}));
  EXPECT_GRADCHECK([](const Inputs& v) { return sum(product(v[0], v[1], 1, 1.0)); }, (Inputs{a, b}));
}

TEST(GradcheckSelf, CatchesADoubledGradient) {
  auto a = away_from_zero_leaf({2, 3}), b = away_from_zero_leaf({2, 3});
  // Scalar output: the projection is 1, so element 0 is already off by |b[0]| >= 0.5.
  GradcheckResult r = gradcheck([](const Inputs& v) { return sum(product(v[0], v[1], 0, 2.0)); }, {a, b});
  EXPECT_FALSE(r.ok);
  EXPECT_FALSE(static_cast<bool>(r));
  EXPECT_NE(r.message.find("input 0"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("element 0"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("analytic"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("numeric"), std::string::npos) << r.message;
}

TEST(GradcheckSelf, NamesTheWrongInputAndElement) {
  auto a = away_from_zero_leaf({2, 3}), b = away_from_zero_leaf({2, 3});
  // Only input 1 is wrong, and only at element 4 (row 1, column 1).
  Tensor mask = gt(from_vector(std::vector<double>{0, 0, 0, 0, 1, 0}, {2, 3}), 0.5);
  GradcheckResult r = gradcheck([mask](const Inputs& v) { return sum(product(v[0], v[1], 1, 2.0, mask)); }, {a, b});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("input 1"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("element 4"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("[2, 3]"), std::string::npos) << r.message;
}

TEST(GradcheckSelf, CatchesAWrongGradientOfANonScalarOutput) {
  // Non-scalar output: checked through a random projection, which a doubled gradient cannot match.
  auto a = away_from_zero_leaf({3, 2}), b = away_from_zero_leaf({3, 2});
  GradcheckResult r = gradcheck([](const Inputs& v) { return product(v[0], v[1], 0, 2.0); }, {a, b});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("input 0"), std::string::npos) << r.message;
}

TEST(GradcheckSelf, CatchesAMissingGradient) {
  // A backward that returns nothing for an input the output depends on.
  auto x = away_from_zero_leaf({4});
  auto fn = [](const Inputs& v) {
    Tensor out = mul(v[0].detach(), 3.0);
    return sum(record(out, "silent", {v[0]}, [](const Tensor&) -> std::vector<Tensor> { return {Tensor()}; }));
  };
  GradcheckResult r = gradcheck(fn, {x});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("input 0"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("element 0"), std::string::npos) << r.message;
}

TEST(GradcheckSelf, CatchesAGradientInTheWrongLayout) {
  // The classic view bug: the gradient of a transpose returned untransposed (same shape when square).
  auto x = testing::random_leaf({3, 3});
  auto fn = [](const Inputs& v) {
    Tensor out = contiguous(transpose(v[0].detach(), 0, 1));
    return record(out, "bad_transpose", {v[0]}, [](const Tensor& g) -> std::vector<Tensor> { return {g}; });
  };
  GradcheckResult r = gradcheck(fn, {x});
  EXPECT_FALSE(r.ok) << "a transposed gradient went unnoticed";
}

TEST(GradcheckSelf, RejectsInputsItCannotCheck) {
  auto f = [](const Inputs& v) { return sum(v[0]); };
  Tensor no_grad = testing::random_tensor({3});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { gradcheck(f, {no_grad}); }, {"input 0", "require grad"}));
  Tensor f32 = testing::random_tensor({3}, DType::f32).requires_grad_();
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { gradcheck(f, {f32}); }, {"input 0", "f64"}));
  // A non-leaf never gets .grad: it would read as a wrong (zero) gradient.
  Tensor leaf = testing::random_leaf({3});
  Tensor non_leaf = mul(leaf, 2.0);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { gradcheck(f, {leaf, non_leaf}); }, {"input 1", "leaf"}));
  // Overlapping elements (stride 0) cannot be perturbed one at a time.
  Tensor expanded = expand(testing::random_tensor({3, 1}), {3, 4}).detach().requires_grad_();
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { gradcheck(f, {expanded}); }, {"input 0", "stride 0"}));
}

}  // namespace
}  // namespace tandem
