// Elementwise ops against std:: math computed here in double, on fresh random inputs: every
// UnaryOp and BinaryOp, NumPy broadcasting, non-contiguous operands, the float dtypes with
// per-dtype tolerances, integer dtypes, comparisons, where and masked_fill.
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::all_close;

// Tolerances relative to the largest expected magnitude (all_close's rtol) plus an absolute floor:
// f64 and f32 compute in their own precision; f16 and bf16 compute in f32 and round the result
// once, so their error is half an ulp of the output (2^-11 and 2^-8) plus the f32 error.
struct Tolerance {
  DType dtype;
  double rtol;
  double atol;
};
const Tolerance kFloatTolerances[] = {
    {DType::f64, 1e-12, 1e-12}, {DType::f32, 1e-5, 1e-6}, {DType::f16, 2e-3, 1e-3}, {DType::bf16, 1e-2, 8e-3}};

constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluCubic = 0.044715;

double gelu_erf_ref(double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) { return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + kGeluCubic * x * x * x))); }
double gelu_erf_grad_ref(double x) {
  constexpr double kSqrt2Pi = 2.5066282746310002;
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / kSqrt2Pi;
}
double gelu_tanh_grad_ref(double x) {
  double u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
}

std::vector<double> map_values(const std::vector<double>& x, const std::function<double(double)>& f) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = f(x[i]);
  return out;
}

// Flat index into `in_shape` (row-major) of the element that broadcasting maps to out_index.
int64_t broadcast_source(const std::vector<int64_t>& out_index, const Shape& out_shape, const Shape& in_shape) {
  int64_t lead = static_cast<int64_t>(out_shape.size() - in_shape.size());
  int64_t f = 0;
  for (size_t d = 0; d < in_shape.size(); ++d) {
    int64_t i = in_shape[d] == 1 ? 0 : out_index[lead + d];
    f = f * in_shape[d] + i;
  }
  return f;
}

// Expected values of f(a, b) broadcast to out_shape, from the operands' row-major values.
std::vector<double> broadcast_ref(const Tensor& a, const Tensor& b, const Shape& out_shape,
                                  const std::function<double(double, double)>& f) {
  std::vector<double> va = a.to_double_vector(), vb = b.to_double_vector();
  std::vector<double> out;
  std::vector<int64_t> index(out_shape.size(), 0);
  for (int64_t n = 0; n < shape_numel(out_shape); ++n) {
    out.push_back(
        f(va[broadcast_source(index, out_shape, a.shape())], vb[broadcast_source(index, out_shape, b.shape())]));
    for (int64_t d = static_cast<int64_t>(out_shape.size()) - 1; d >= 0 && ++index[d] == out_shape[d]; --d)
      index[d] = 0;
  }
  return out;
}

struct Domain {
  double low, high;
};

struct UnaryCase {
  const char* name;
  Domain domain;  // where the inputs are drawn
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
};

std::vector<UnaryCase> unary_cases() {
  using T = const Tensor&;
  return {
      {"neg", {-3, 3}, [](T x) { return neg(x); }, [](double x) { return -x; }},
      {"operator-", {-3, 3}, [](T x) { return -x; }, [](double x) { return -x; }},
      {"abs", {-3, 3}, [](T x) { return abs(x); }, [](double x) { return std::fabs(x); }},
      {"exp", {-3, 3}, [](T x) { return exp(x); }, [](double x) { return std::exp(x); }},
      {"log", {0.05, 5}, [](T x) { return log(x); }, [](double x) { return std::log(x); }},
      {"sqrt", {0.05, 5}, [](T x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }},
      {"rsqrt", {0.2, 5}, [](T x) { return rsqrt(x); }, [](double x) { return 1.0 / std::sqrt(x); }},
      {"tanh", {-3, 3}, [](T x) { return tanh(x); }, [](double x) { return std::tanh(x); }},
      {"sigmoid", {-6, 6}, [](T x) { return sigmoid(x); }, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }},
      {"relu", {-3, 3}, [](T x) { return relu(x); }, [](double x) { return x > 0 ? x : 0.0; }},
      {"gelu", {-4, 4}, [](T x) { return gelu(x); }, gelu_erf_ref},
      {"gelu_tanh", {-4, 4}, [](T x) { return gelu(x, GeluApproximate::tanh); }, gelu_tanh_ref},
      {"sign",
       {-3, 3},
       [](T x) { return kernels::unary(UnaryOp::sign, x); },
       [](double x) { return static_cast<double>((x > 0) - (x < 0)); }},
      {"pow 2", {-3, 3}, [](T x) { return pow(x, 2.0); }, [](double x) { return x * x; }},
      {"pow 3", {-2, 2}, [](T x) { return pow(x, 3.0); }, [](double x) { return x * x * x; }},
      {"pow 0.5", {0.05, 4}, [](T x) { return pow(x, 0.5); }, [](double x) { return std::sqrt(x); }},
      {"pow -1.5", {0.5, 4}, [](T x) { return pow(x, -1.5); }, [](double x) { return std::pow(x, -1.5); }},
      {"clamp",
       {-2, 2},
       [](T x) { return clamp(x, -0.5, 0.7); },
       [](double x) { return std::min(std::max(x, -0.5), 0.7); }},
      {"sin", {-4, 4}, [](T x) { return sin(x); }, [](double x) { return std::sin(x); }},
      {"cos", {-4, 4}, [](T x) { return cos(x); }, [](double x) { return std::cos(x); }},
      {"silu", {-6, 6}, [](T x) { return silu(x); }, [](double x) { return x / (1.0 + std::exp(-x)); }},
      {"softplus", {-6, 6}, [](T x) { return softplus(x); }, [](double x) { return std::log1p(std::exp(x)); }},
      // beta 2, threshold 3: x above 1.5 passes through unchanged.
      {"softplus beta threshold",
       {-3, 3},
       [](T x) { return softplus(x, 2.0, 3.0); },
       [](double x) { return 2.0 * x > 3.0 ? x : std::log1p(std::exp(2.0 * x)) / 2.0; }},
      {"clamp min only", {-2, 2}, [](T x) { return clamp(x, -0.5, std::nullopt); },
       [](double x) { return std::max(x, -0.5); }},
      {"clamp max only", {-2, 2}, [](T x) { return clamp(x, std::nullopt, 0.7); },
       [](double x) { return std::min(x, 0.7); }},
      {"scale", {-3, 3}, [](T x) { return mul(x, -2.5); }, [](double x) { return -2.5 * x; }},
      {"div scalar", {-3, 3}, [](T x) { return div(x, 4.0); }, [](double x) { return x / 4.0; }},
      {"add scalar", {-3, 3}, [](T x) { return x + 1.25; }, [](double x) { return x + 1.25; }},
      {"scalar minus", {-3, 3}, [](T x) { return 1.5 - x; }, [](double x) { return 1.5 - x; }},
      {"scalar over", {0.5, 3}, [](T x) { return 3.0 / x; }, [](double x) { return 3.0 / x; }},
  };
}

TEST(Unary, EveryOpMatchesStdMathInEveryFloatDType) {
  for (const Tolerance& tol : kFloatTolerances) {
    for (const UnaryCase& c : unary_cases()) {
      Tensor x = testing::random_uniform({7, 9}, c.domain.low, c.domain.high, tol.dtype);
      Tensor y = c.op(x);
      EXPECT_EQ(y.dtype(), tol.dtype) << c.name;
      EXPECT_EQ(y.shape(), x.shape()) << c.name;
      EXPECT_TRUE(all_close(y, map_values(x.to_double_vector(), c.ref), tol.rtol, tol.atol))
          << c.name << " in " << tol.dtype;
    }
  }
}

TEST(Unary, NonContiguousInputs) {
  for (const Tolerance& tol : kFloatTolerances) {
    for (const UnaryCase& c : unary_cases()) {
      Tensor base = testing::random_uniform({9, 12}, c.domain.low, c.domain.high, tol.dtype);
      for (Tensor x : {views::transpose(base, 0, 1), slice(base, 1, 1, 12, 3),
                       views::expand(views::narrow(base, 0, 2, 1), {4, 12})}) {
        ASSERT_FALSE(x.is_contiguous());
        Tensor y = c.op(x);
        EXPECT_TRUE(y.is_contiguous());
        EXPECT_TRUE(all_close(y, map_values(x.to_double_vector(), c.ref), tol.rtol, tol.atol))
            << c.name << " in " << tol.dtype << " on shape " << shape_str(x.shape());
      }
    }
  }
}

TEST(Unary, ZeroDimAndEmptyInputs) {
  double v = testing::random_uniform({1}, 0.1, 2.0).item();
  Tensor y = exp(scalar_tensor(v, DType::f64));
  EXPECT_EQ(y.dim(), 0);
  EXPECT_NEAR(y.item(), std::exp(v), 1e-12);
  EXPECT_EQ(exp(empty({0, 3})).shape(), (Shape{0, 3}));
}

TEST(Unary, LogicalNotGivesBool) {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    Tensor x = to(testing::random_uniform({5, 6}, -3, 3), d);
    Tensor mask = gt(testing::random_tensor({5, 6}), 0.0);
    x = where(mask, x, 0.0);  // about half the elements exactly zero
    Tensor y = logical_not(x);
    EXPECT_EQ(y.dtype(), DType::boolean);
    EXPECT_EQ(y.to_double_vector(), map_values(x.to_double_vector(), [](double v) { return v == 0 ? 1.0 : 0.0; })) << d;
  }
  Tensor b = gt(testing::random_tensor({8}), 0.0);
  EXPECT_EQ(logical_not(b).to_double_vector(), map_values(b.to_double_vector(), [](double v) { return 1.0 - v; }));
}

TEST(Unary, FloatOnlyOpsRejectIntegers) {
  Tensor i = arange(4);
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { exp(i); }, {"exp", "i64", "cpu", "f32, f64, f16, bf16"}));
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { sqrt(to(i, DType::u8)); }, {"sqrt", "u8"}));
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { neg(to(i, DType::boolean)); }, {"neg", "bool"}));
}

// kernels::unary_backward of op with its operands broadcast together, as a binary op.
std::function<Tensor(const Tensor&, const Tensor&)> backward_of(UnaryOp op, double alpha = 0.0, double beta = 0.0) {
  return [=](const Tensor& g, const Tensor& x) {
    Shape s = broadcast_shapes(g.shape(), x.shape(), "test");
    return kernels::unary_backward(op, views::expand(g, s), views::expand(x, s), alpha, beta);
  };
}

struct BinaryCase {
  const char* name;
  Domain a, b;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
};

std::vector<BinaryCase> binary_cases() {
  using T = const Tensor&;
  const Domain any = {-3, 3};
  return {
      {"add", any, any, [](T a, T b) { return add(a, b); }, [](double a, double b) { return a + b; }},
      {"sub", any, any, [](T a, T b) { return a - b; }, [](double a, double b) { return a - b; }},
      {"mul", any, any, [](T a, T b) { return a * b; }, [](double a, double b) { return a * b; }},
      {"div", any, {0.5, 3}, [](T a, T b) { return a / b; }, [](double a, double b) { return a / b; }},
      {"pow", {0.2, 3}, {-2, 2}, [](T a, T b) { return pow(a, b); }, [](double a, double b) { return std::pow(a, b); }},
      {"maximum", any, any, [](T a, T b) { return maximum(a, b); }, [](double a, double b) { return std::max(a, b); }},
      {"minimum", any, any, [](T a, T b) { return minimum(a, b); }, [](double a, double b) { return std::min(a, b); }},
      // The gradient kernels of the unary table (grad, x) -> grad * f'(x), broadcast here.
      {"relu backward", any, any, backward_of(UnaryOp::relu), [](double g, double x) { return x > 0 ? g : 0.0; }},
      {"gelu_tanh backward", any, {-4, 4}, backward_of(UnaryOp::gelu_tanh),
       [](double g, double x) { return g * gelu_tanh_grad_ref(x); }},
      {"gelu_erf backward", any, {-4, 4}, backward_of(UnaryOp::gelu_erf),
       [](double g, double x) { return g * gelu_erf_grad_ref(x); }},
      {"sin backward", any, any, backward_of(UnaryOp::sin), [](double g, double x) { return g * std::cos(x); }},
      {"cos backward", any, any, backward_of(UnaryOp::cos), [](double g, double x) { return -g * std::sin(x); }},
      {"silu backward", any, {-6, 6}, backward_of(UnaryOp::silu),
       [](double g, double x) {
         double s = 1.0 / (1.0 + std::exp(-x));
         return g * s * (1.0 + x * (1.0 - s));
       }},
      {"softplus backward", any, {-6, 6}, backward_of(UnaryOp::softplus, 2.0, 5.0),
       [](double g, double x) { return 2.0 * x > 5.0 ? g : g / (1.0 + std::exp(-2.0 * x)); }},
      {"clamp backward", any, any, backward_of(UnaryOp::clamp, -0.5, 0.75),
       [](double g, double x) { return x >= -0.5 && x <= 0.75 ? g : 0.0; }},
  };
}

TEST(Binary, EveryOpMatchesStdMathInEveryFloatDType) {
  for (const Tolerance& tol : kFloatTolerances) {
    for (const BinaryCase& c : binary_cases()) {
      Tensor a = testing::random_uniform({6, 11}, c.a.low, c.a.high, tol.dtype);
      Tensor b = testing::random_uniform({6, 11}, c.b.low, c.b.high, tol.dtype);
      Tensor y = c.op(a, b);
      EXPECT_EQ(y.dtype(), tol.dtype);
      EXPECT_TRUE(all_close(y, broadcast_ref(a, b, y.shape(), c.ref), tol.rtol, tol.atol))
          << c.name << " in " << tol.dtype;
    }
  }
}

TEST(Binary, NumPyBroadcasting) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{2, 3, 1}, {4}}, {{1, 3}, {2, 1}}, {{5, 1, 4}, {1, 3, 1}}, {{3}, {2, 3}},    {{}, {2, 3}},
      {{2, 3}, {}},     {{}, {}},         {{2, 1, 3}, {4, 1}},    {{1}, {3, 1, 2}}, {{0, 3}, {1, 3}}};
  const std::vector<Shape> expected = {{2, 3, 4}, {2, 3}, {5, 3, 4}, {2, 3},    {2, 3},
                                       {2, 3},    {},     {2, 4, 3}, {3, 1, 2}, {0, 3}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (const BinaryCase& c : binary_cases()) {
      Tensor a = testing::random_uniform(shapes[i].first, c.a.low, c.a.high);
      Tensor b = testing::random_uniform(shapes[i].second, c.b.low, c.b.high);
      Tensor y = c.op(a, b);
      EXPECT_EQ(y.shape(), expected[i]) << c.name << " " << shape_str(a.shape()) << " and " << shape_str(b.shape());
      EXPECT_TRUE(all_close(y, broadcast_ref(a, b, expected[i], c.ref), 1e-12, 1e-12))
          << c.name << " " << shape_str(a.shape()) << " and " << shape_str(b.shape());
    }
  }
}

TEST(Binary, BroadcastingInHalfPrecision) {
  for (DType d : {DType::f16, DType::bf16, DType::f32}) {
    Tensor a = testing::random_tensor({4, 1, 3}, d), b = testing::random_tensor({5, 1}, d);
    Tensor y = a * b + b;
    auto ref = [](double x, double z) { return x * z; };
    std::vector<double> prod = broadcast_ref(a, b, {4, 5, 3}, ref);
    // The sum is computed from the product rounded to d; compare with a tolerance of a few ulps.
    std::vector<double> expected = broadcast_ref(to(from_vector(prod, {4, 5, 3}, DType::f64), d), b, {4, 5, 3},
                                                 [](double p, double z) { return p + z; });
    double tol = d == DType::bf16 ? 2e-2 : d == DType::f16 ? 3e-3 : 1e-6;
    EXPECT_TRUE(all_close(y, expected, tol, tol)) << d;
  }
}

TEST(Binary, NonContiguousOperands) {
  Tensor base_a = testing::random_tensor({8, 6}), base_b = testing::random_tensor({6, 16});
  Tensor a = views::transpose(base_a, 0, 1);  // (6, 8), strides (1, 6)
  Tensor b = slice(base_b, 1, 0, 16, 2);      // (6, 8), strides (16, 2)
  for (const BinaryCase& c : binary_cases()) {
    if (std::string(c.name) == "pow") continue;  // needs a positive base
    Tensor y = c.op(a, b);
    EXPECT_TRUE(all_close(y, broadcast_ref(a, b, {6, 8}, c.ref), 1e-12, 1e-12)) << c.name;
  }
  // Both broadcast and strided: a row of a transposed tensor against a sliced column.
  Tensor row = views::narrow(a, 0, 3, 1);                           // (1, 8)
  Tensor col = views::narrow(slice(base_b, 1, 1, 16, 5), 1, 2, 1);  // (6, 1)
  Tensor y = row - col;
  EXPECT_EQ(y.shape(), (Shape{6, 8}));
  EXPECT_TRUE(all_close(y, broadcast_ref(row, col, {6, 8}, [](double p, double q) { return p - q; }), 1e-12, 1e-12));
}

TEST(Binary, MaximumAndMinimumPropagateNaN) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor a = testing::random_tensor({4});
  std::vector<double> va = a.to_double_vector();
  Tensor b = from_vector(std::vector<double>{nan, va[1] - 1.0, nan, va[3] + 1.0}, {}, DType::f64);
  Tensor a_nan = from_vector(std::vector<double>{va[0], nan, va[2], va[3]}, {}, DType::f64);
  std::vector<double> mx = maximum(a_nan, b).to_double_vector(), mn = minimum(a_nan, b).to_double_vector();
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]) && std::isnan(mx[2]));
  EXPECT_TRUE(std::isnan(mn[0]) && std::isnan(mn[1]) && std::isnan(mn[2]));
  EXPECT_EQ(mx[3], va[3] + 1.0);
  EXPECT_EQ(mn[3], va[3]);
}

TEST(Binary, DivAndPowRejectIntegers) {
  Tensor i = arange(4);
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { div(i, i); }, {"div", "i64"}));
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { pow(i, i); }, {"pow", "i64"}));
  Tensor b = gt(testing::random_tensor({3}), 0.0);
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { add(b, b); }, {"add", "bool"}));
}

// Random integers in [low, high) as dtype d.
Tensor random_ints(const Shape& shape, int64_t low, int64_t high, DType d) {
  Generator gen(testing::next_seed());
  return randint(low, high, shape, d, &gen);
}

TEST(IntegerOps, SignedArithmeticIsExact) {
  for (DType d : {DType::i32, DType::i64}) {
    Tensor a = random_ints({5, 7}, -1000, 1000, d), b = random_ints({7}, -1000, 1000, d);
    auto check = [&](const Tensor& y, const std::function<double(double, double)>& f, const char* name) {
      EXPECT_EQ(y.dtype(), d) << name;
      EXPECT_EQ(y.to_double_vector(), broadcast_ref(a, b, {5, 7}, f)) << name << " in " << d;
    };
    check(
        add(a, b), [](double x, double y) { return x + y; }, "add");
    check(
        sub(a, b), [](double x, double y) { return x - y; }, "sub");
    check(
        mul(a, b), [](double x, double y) { return x * y; }, "mul");
    check(
        maximum(a, b), [](double x, double y) { return std::max(x, y); }, "maximum");
    check(
        minimum(a, b), [](double x, double y) { return std::min(x, y); }, "minimum");
    EXPECT_EQ(neg(a).to_double_vector(), map_values(a.to_double_vector(), [](double v) { return -v; }));
    EXPECT_EQ(abs(a).to_double_vector(), map_values(a.to_double_vector(), [](double v) { return std::fabs(v); }));
    EXPECT_EQ(relu(a).to_double_vector(), map_values(a.to_double_vector(), [](double v) { return v > 0 ? v : 0; }));
    EXPECT_EQ(kernels::unary(UnaryOp::sign, a).to_double_vector(),
              map_values(a.to_double_vector(), [](double v) { return static_cast<double>((v > 0) - (v < 0)); }));
    EXPECT_EQ(mul(a, 3.0).to_double_vector(), map_values(a.to_double_vector(), [](double v) { return 3 * v; }));
  }
}

TEST(IntegerOps, LargeInt64ValuesStayExact) {
  int64_t big = (int64_t{1} << 53) + 1;  // not representable in double
  Tensor a = from_vector(std::vector<int64_t>{big, -big});
  Tensor b = random_ints({2}, 1, 100, DType::i64);
  Tensor y = add(a, b);
  std::vector<int64_t> vb = {b.data<int64_t>()[0], b.data<int64_t>()[1]};
  EXPECT_EQ(y.data<int64_t>()[0], big + vb[0]);
  EXPECT_EQ(y.data<int64_t>()[1], -big + vb[1]);
}

TEST(IntegerOps, UnsignedBytesWrapAround) {
  Tensor a = random_ints({4, 6}, 0, 256, DType::u8), b = random_ints({4, 6}, 0, 256, DType::u8);
  auto wrap = [](double v) { return static_cast<double>(static_cast<uint8_t>(static_cast<int64_t>(v) & 0xFF)); };
  EXPECT_EQ(add(a, b).to_double_vector(), broadcast_ref(a, b, {4, 6}, [&](double x, double y) { return wrap(x + y); }));
  EXPECT_EQ(sub(a, b).to_double_vector(), broadcast_ref(a, b, {4, 6}, [&](double x, double y) { return wrap(x - y); }));
  EXPECT_EQ(mul(a, b).to_double_vector(), broadcast_ref(a, b, {4, 6}, [&](double x, double y) { return wrap(x * y); }));
  EXPECT_EQ(neg(a).to_double_vector(), map_values(a.to_double_vector(), [&](double v) { return wrap(-v); }));
  EXPECT_EQ(abs(a).to_double_vector(), a.to_double_vector());
  EXPECT_EQ(add(a, b).dtype(), DType::u8);
}

struct ComparisonCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<bool(double, double)> ref;
};

std::vector<ComparisonCase> comparison_cases() {
  return {
      {"eq", [](const Tensor& a, const Tensor& b) { return eq(a, b); }, [](double a, double b) { return a == b; }},
      {"ne", [](const Tensor& a, const Tensor& b) { return ne(a, b); }, [](double a, double b) { return a != b; }},
      {"lt", [](const Tensor& a, const Tensor& b) { return lt(a, b); }, [](double a, double b) { return a < b; }},
      {"le", [](const Tensor& a, const Tensor& b) { return le(a, b); }, [](double a, double b) { return a <= b; }},
      {"gt", [](const Tensor& a, const Tensor& b) { return gt(a, b); }, [](double a, double b) { return a > b; }},
      {"ge", [](const Tensor& a, const Tensor& b) { return ge(a, b); }, [](double a, double b) { return a >= b; }},
  };
}

TEST(Comparison, ProduceBoolInEveryDTypeWithTies) {
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    Tensor a = to(random_ints({6, 5}, 0, 10, DType::i64), d);
    Tensor b = to(random_ints({5}, 0, 10, DType::i64), d);  // small ranges: many ties
    if (is_floating(d)) {
      a = a + testing::random_uniform({6, 5}, 0, 0.5, d) * to(gt(testing::random_tensor({6, 5}), 0.0), d);
    }
    for (const ComparisonCase& c : comparison_cases()) {
      Tensor y = c.op(a, b);
      EXPECT_EQ(y.dtype(), DType::boolean) << c.name;
      EXPECT_EQ(y.shape(), (Shape{6, 5}));
      EXPECT_EQ(y.to_double_vector(),
                broadcast_ref(a, b, {6, 5}, [&](double x, double z) { return c.ref(x, z) ? 1.0 : 0.0; }))
          << c.name << " in " << d;
    }
  }
}

TEST(Comparison, BoolOperandsAndScalars) {
  Tensor p = gt(testing::random_tensor({10}), 0.0), q = gt(testing::random_tensor({10}), 0.0);
  EXPECT_EQ(eq(p, q).to_double_vector(),
            broadcast_ref(p, q, {10}, [](double x, double y) { return x == y ? 1.0 : 0.0; }));
  EXPECT_EQ(lt(p, q).to_double_vector(),
            broadcast_ref(p, q, {10}, [](double x, double y) { return x < y ? 1.0 : 0.0; }));
  Tensor x = testing::random_tensor({3, 4});
  double threshold = x.to_double_vector()[5];  // one exact tie
  auto ref = [&](const std::function<bool(double)>& f) {
    return map_values(x.to_double_vector(), [&](double v) { return f(v) ? 1.0 : 0.0; });
  };
  EXPECT_EQ(gt(x, threshold).to_double_vector(), ref([&](double v) { return v > threshold; }));
  EXPECT_EQ(lt(x, threshold).to_double_vector(), ref([&](double v) { return v < threshold; }));
  EXPECT_EQ(eq(x, threshold).to_double_vector(), ref([&](double v) { return v == threshold; }));
}

TEST(Where, SelectsWithBroadcasting) {
  for (DType d : {DType::f64, DType::f32, DType::f16, DType::i64, DType::boolean}) {
    Tensor cond = gt(testing::random_tensor({4, 1, 5}), 0.0);
    Tensor a = to(testing::random_uniform({3, 1}, -9, 9), d);
    Tensor b = to(testing::random_uniform({4, 3, 5}, -9, 9), d);
    Tensor y = where(cond, a, b);
    EXPECT_EQ(y.shape(), (Shape{4, 3, 5}));
    EXPECT_EQ(y.dtype(), d);
    std::vector<double> vc = cond.to_double_vector(), va = a.to_double_vector(), vb = b.to_double_vector();
    std::vector<double> got = y.to_double_vector();
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < 3; ++j) {
        for (int64_t k = 0; k < 5; ++k) {
          double expected = vc[i * 5 + k] != 0 ? va[j] : vb[(i * 3 + j) * 5 + k];
          EXPECT_EQ(got[(i * 3 + j) * 5 + k], expected) << d;
        }
      }
    }
  }
}

TEST(Where, ScalarOtherAndNonContiguousCondition) {
  Tensor x = testing::random_tensor({5, 4});
  Tensor cond = views::transpose(gt(testing::random_tensor({4, 5}), 0.0), 0, 1);
  double fill = testing::random_tensor({1}).item();
  Tensor y = where(cond, x, fill);
  std::vector<double> vc = cond.to_double_vector(), vx = x.to_double_vector(), got = y.to_double_vector();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], vc[i] != 0 ? vx[i] : fill);
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { where(x, x, x); }, {"where", "condition must be bool", "f64"}));
}

TEST(MaskedFill, FillsWhereTheMaskIsTrue) {
  Tensor x = testing::random_tensor({3, 4});
  Tensor mask = gt(testing::random_tensor({4}), 0.0);  // broadcast over rows
  double value = testing::random_tensor({1}).item();
  Tensor y = masked_fill(x, mask, value);
  EXPECT_EQ(y.shape(), x.shape());
  std::vector<double> vm = mask.to_double_vector(), vx = x.to_double_vector(), got = y.to_double_vector();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(got[i * 4 + j], vm[j] != 0 ? value : vx[i * 4 + j]);
  }
  Tensor masked_out = masked_fill(x, gt(x, 0.0), -std::numeric_limits<double>::infinity());
  for (double v : masked_out.to_double_vector()) EXPECT_TRUE(v <= 0);
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        masked_fill(x, gt(testing::random_tensor({2, 3, 4}), 0.0), 0.0);
      },
      {"masked_fill", "[2, 3, 4]", "[3, 4]"}));
}

TEST(InPlace, AddAndMulUpdateTheDestination) {
  Tensor dst = testing::random_tensor({4, 3});
  Tensor src = testing::random_tensor({3});
  std::vector<double> before = dst.to_double_vector();
  kernels::add_(dst, src, -0.5);
  EXPECT_TRUE(all_close(dst,
                        broadcast_ref(from_vector(before, {4, 3}, DType::f64), src, {4, 3},
                                      [](double d, double s) { return d - 0.5 * s; }),
                        1e-12, 1e-12));
  // Into a non-contiguous destination: only the viewed elements change.
  Tensor base = testing::random_tensor({3, 4});
  std::vector<double> b = base.to_double_vector();
  Tensor col = views::narrow(base, 1, 1, 1);
  Tensor delta = testing::random_tensor({3, 1});
  kernels::add_(col, delta, 2.0);
  std::vector<double> got = base.to_double_vector(), vd = delta.to_double_vector();
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) EXPECT_NEAR(got[i * 4 + j], b[i * 4 + j] + (j == 1 ? 2.0 * vd[i] : 0.0), 1e-12);
  }
  double s = testing::random_uniform({1}, 0.5, 2.0).item();
  Tensor m = testing::random_tensor({5});
  std::vector<double> mv = m.to_double_vector();
  kernels::mul_(m, s);
  EXPECT_TRUE(all_close(m, map_values(mv, [&](double v) { return v * s; }), 1e-12, 1e-12));
}

}  // namespace
}  // namespace tandem
