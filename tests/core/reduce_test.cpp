// Reductions, softmax and cross-entropy against naive loops written here.
#include <cmath>
#include <functional>
#include <limits>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/random.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::all_close;

// The input values grouped by output element: group g holds, in row-major order over the reduced
// dims, every input element that reduces into output element g (outputs in row-major order).
std::vector<std::vector<double>> reduction_groups(const Tensor& x, std::vector<int64_t> dims) {
  const Shape& shape = x.shape();
  int64_t nd = x.dim();
  for (int64_t& d : dims) d = d < 0 ? d + nd : d;
  if (dims.empty()) {
    for (int64_t d = 0; d < nd; ++d) dims.push_back(d);
  }
  auto reduced = [&](int64_t d) { return std::find(dims.begin(), dims.end(), d) != dims.end(); };
  int64_t groups = 1;
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced(d)) groups *= shape[d];
  }
  std::vector<std::vector<double>> out(static_cast<size_t>(groups));
  std::vector<double> values = x.to_double_vector();
  std::vector<int64_t> index(static_cast<size_t>(nd), 0);
  for (double v : values) {
    int64_t g = 0;
    for (int64_t d = 0; d < nd; ++d) {
      if (!reduced(d)) g = g * shape[d] + index[d];
    }
    out[g].push_back(v);
    for (int64_t d = nd - 1; d >= 0 && ++index[d] == shape[d]; --d) index[d] = 0;
  }
  return out;
}

std::vector<double> naive(const Tensor& x, const std::vector<int64_t>& dims,
                          const std::function<double(const std::vector<double>&)>& f) {
  std::vector<double> out;
  for (const auto& g : reduction_groups(x, dims)) out.push_back(f(g));
  return out;
}

double naive_sum(const std::vector<double>& g) {
  double s = 0;
  for (double v : g) s += v;
  return s;
}
double naive_mean(const std::vector<double>& g) { return naive_sum(g) / static_cast<double>(g.size()); }
double naive_max(const std::vector<double>& g) {
  double m = g[0];
  for (double v : g) {
    if (std::isnan(v)) return v;
    m = std::max(m, v);
  }
  return std::isnan(g[0]) ? g[0] : m;
}
double naive_min(const std::vector<double>& g) {
  double m = g[0];
  for (double v : g) {
    if (std::isnan(v)) return v;
    m = std::min(m, v);
  }
  return std::isnan(g[0]) ? g[0] : m;
}
// Index of the first maximum (a NaN counts as the maximum).
double naive_argmax(const std::vector<double>& g) {
  size_t best = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i])) return static_cast<double>(i);
    if (g[i] > g[best]) best = i;
  }
  return static_cast<double>(best);
}
double naive_argmin(const std::vector<double>& g) {
  size_t best = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i])) return static_cast<double>(i);
    if (g[i] < g[best]) best = i;
  }
  return static_cast<double>(best);
}
std::function<double(const std::vector<double>&)> naive_var(int64_t correction) {
  return [correction](const std::vector<double>& g) {
    double m = naive_mean(g), s = 0;
    for (double v : g) s += (v - m) * (v - m);
    return s / static_cast<double>(static_cast<int64_t>(g.size()) - correction);
  };
}

Shape expected_shape(const Shape& shape, std::vector<int64_t> dims, bool keepdim) {
  int64_t nd = static_cast<int64_t>(shape.size());
  for (int64_t& d : dims) d = d < 0 ? d + nd : d;
  Shape out;
  for (int64_t d = 0; d < nd; ++d) {
    bool r = dims.empty() || std::find(dims.begin(), dims.end(), d) != dims.end();
    if (!r)
      out.push_back(shape[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

const std::vector<std::vector<int64_t>> kDimSets = {{},     {0},    {1},      {3},       {-1},
                                                    {0, 2}, {1, 3}, {-1, -3}, {0, 1, 3}, {2, 1}};

TEST(Reduce, SumAndMeanOverDimSets) {
  Tensor x = testing::random_tensor({3, 4, 5, 2});
  for (const auto& dims : kDimSets) {
    for (bool keepdim : {false, true}) {
      Tensor s = sum(x, dims, keepdim), m = mean(x, dims, keepdim);
      EXPECT_EQ(s.shape(), expected_shape(x.shape(), dims, keepdim)) << shape_str(dims);
      EXPECT_EQ(m.shape(), s.shape());
      EXPECT_TRUE(all_close(s, naive(x, dims, naive_sum), 1e-12, 1e-12)) << "sum over " << shape_str(dims);
      EXPECT_TRUE(all_close(m, naive(x, dims, naive_mean), 1e-12, 1e-12)) << "mean over " << shape_str(dims);
    }
  }
}

// sum_to (a broadcast operand's gradient): sums over the leading dims and the dims the target
// has as 1, and over nothing where those dims have size 1 (then the result is a view of grad).
TEST(Reduce, SumToSumsBroadcastDimsAndViewsSizeOneOnes) {
  Tensor grad = testing::random_tensor({3, 4, 5, 2});
  Tensor summed = kernels::sum_to(grad, {4, 1, 2});
  EXPECT_EQ(summed.shape(), (Shape{4, 1, 2}));
  EXPECT_TRUE(all_close(summed, views::reshape(sum(grad, {0, 2}, false), {4, 1, 2}), 1e-12, 1e-12));

  Tensor single = testing::random_tensor({1, 5, 1, 3});  // only size-1 dims to sum over
  Tensor viewed = kernels::sum_to(single, {5, 1, 3});
  EXPECT_EQ(viewed.shape(), (Shape{5, 1, 3}));
  EXPECT_EQ(viewed.data_ptr(), single.data_ptr()) << "no sum, a view";
  EXPECT_EQ(viewed.to_double_vector(), single.to_double_vector());
  EXPECT_EQ(kernels::sum_to(single, {1, 5, 1, 3}).data_ptr(), single.data_ptr());
}

TEST(Reduce, AmaxAndAminOverDimSets) {
  Tensor x = testing::random_tensor({3, 4, 5, 2});
  for (const auto& dims : kDimSets) {
    for (bool keepdim : {false, true}) {
      Tensor hi = amax(x, dims, keepdim), lo = amin(x, dims, keepdim);
      EXPECT_EQ(hi.shape(), expected_shape(x.shape(), dims, keepdim));
      EXPECT_EQ(hi.to_double_vector(), naive(x, dims, naive_max)) << "amax over " << shape_str(dims);
      EXPECT_EQ(lo.to_double_vector(), naive(x, dims, naive_min)) << "amin over " << shape_str(dims);
    }
  }
}

TEST(Reduce, VarWithAndWithoutCorrection) {
  Tensor x = testing::random_tensor({4, 3, 6});
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {-1}, {0, 2}}) {
    for (int64_t correction : {0, 1}) {
      for (bool keepdim : {false, true}) {
        Tensor v = var(x, dims, correction, keepdim);
        EXPECT_EQ(v.shape(), expected_shape(x.shape(), dims, keepdim));
        EXPECT_TRUE(all_close(v, naive(x, dims, naive_var(correction)), 1e-12, 1e-12))
            << "var over " << shape_str(dims) << " correction " << correction;
      }
    }
  }
  EXPECT_TRUE(all_close(var(x), naive(x, {}, naive_var(1)), 1e-12, 1e-12));  // Bessel's correction by default
}

TEST(Reduce, NonContiguousInputs) {
  Tensor base = testing::random_tensor({5, 6, 4});
  for (Tensor x : {views::permute(base, {2, 0, 1}), slice(base, 1, 0, 6, 2),
                   views::expand(views::narrow(base, 0, 1, 1), {3, 6, 4})}) {
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {2}, {0, 2}, {-1, 0}}) {
      EXPECT_TRUE(all_close(sum(x, dims), naive(x, dims, naive_sum), 1e-12, 1e-12)) << shape_str(dims);
      EXPECT_EQ(amax(x, dims).to_double_vector(), naive(x, dims, naive_max)) << shape_str(dims);
    }
  }
}

TEST(Reduce, HalfAndSinglePrecisionAccumulateWide) {
  // The CPU accumulates in double and rounds once: the error is half an ulp of the result.
  for (auto [d, tol] : {std::pair{DType::f32, 1e-6}, std::pair{DType::f16, 1e-3}, std::pair{DType::bf16, 8e-3}}) {
    Tensor x = testing::random_uniform({64, 33}, 0.0, 1.0, d);  // positive: no cancellation
    for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{}, {0}, {1}}) {
      Tensor s = sum(x, dims), m = mean(x, dims);
      EXPECT_EQ(s.dtype(), d);
      EXPECT_TRUE(all_close(s, naive(x, dims, naive_sum), tol, 0)) << "sum in " << d << " over " << shape_str(dims);
      EXPECT_TRUE(all_close(m, naive(x, dims, naive_mean), tol, 0)) << "mean in " << d << " over " << shape_str(dims);
      EXPECT_EQ(amax(x, dims).to_double_vector(), naive(x, dims, naive_max)) << d;
    }
  }
}

TEST(Reduce, IntegerSumsAreExact) {
  Generator gen(testing::next_seed());
  for (DType d : {DType::i32, DType::i64, DType::u8}) {
    // Sums keep the dtype: u8 values stay below 37 so that seven of them fit in 255.
    Tensor x = randint(0, d == DType::u8 ? 37 : 50, {6, 7}, d, &gen);
    EXPECT_EQ(sum(x, {1}).to_double_vector(), naive(x, {1}, naive_sum)) << d;
    EXPECT_EQ(sum(x, {1}).dtype(), d);
    EXPECT_EQ(amax(x, {0}).to_double_vector(), naive(x, {0}, naive_max)) << d;
    EXPECT_EQ(amin(x).to_double_vector(), naive(x, {}, naive_min)) << d;
    EXPECT_EQ(argmax(x, 1).to_double_vector(), naive(x, {1}, naive_argmax)) << d;
  }
  EXPECT_TRUE(testing::throws_with<TypeError>([] { mean(arange(4)); }, {"mean", "floating-point", "i64"}));
}

TEST(Reduce, ZeroDimAndEmptyTensors) {
  double v = testing::random_tensor({1}).item();
  Tensor s = scalar_tensor(v, DType::f64);
  EXPECT_EQ(sum(s).dim(), 0);
  EXPECT_EQ(sum(s).item(), v);
  EXPECT_EQ(sum(s, {0}).item(), v);
  EXPECT_EQ(amax(s, {-1}).item(), v);
  EXPECT_EQ(argmax(s).item(), 0);
  Tensor e = empty({3, 0});
  EXPECT_EQ(sum(e, {1}).to_double_vector(), std::vector<double>(3, 0.0));
  EXPECT_EQ(sum(e).item(), 0.0);
  for (double m : mean(e, {1}).to_double_vector()) EXPECT_TRUE(std::isnan(m));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { amax(e); }, {"max", "empty", "[3, 0]"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { argmax(e, 1); }, {"argmax"}));
  // Over the non-empty dim an empty tensor reduces to an empty result, as in PyTorch.
  EXPECT_EQ(amax(e, {0}).shape(), (Shape{0}));
  EXPECT_EQ(argmax(e, 0).shape(), (Shape{0}));
}

TEST(Reduce, BadDims) {
  Tensor x = testing::random_tensor({2, 3});
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { sum(x, {2}); }, {"sum", "dim 2", "2 dims", "-2 to 1"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { sum(x, {1, -1}); }, {"sum", "twice"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        kernels::reduce(ReduceOp::argmax, x, {0, 1}, false);
      },
      {"argmax", "one dim"}));
}

TEST(MaxAlongDim, ValuesAndIndices) {
  Tensor x = testing::random_tensor({4, 5, 3});
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    for (bool keepdim : {false, true}) {
      ValuesIndices mx = max(x, dim, keepdim), mn = min(x, dim, keepdim);
      Shape shape = expected_shape(x.shape(), {dim}, keepdim);
      EXPECT_EQ(mx.values.shape(), shape);
      EXPECT_EQ(mx.indices.shape(), shape);
      EXPECT_EQ(mx.indices.dtype(), DType::i64);
      EXPECT_EQ(mx.values.to_double_vector(), naive(x, {dim}, naive_max)) << "dim " << dim;
      EXPECT_EQ(mx.indices.to_double_vector(), naive(x, {dim}, naive_argmax)) << "dim " << dim;
      EXPECT_EQ(mn.values.to_double_vector(), naive(x, {dim}, naive_min)) << "dim " << dim;
      EXPECT_EQ(mn.indices.to_double_vector(), naive(x, {dim}, naive_argmin)) << "dim " << dim;
      EXPECT_EQ(argmax(x, dim, keepdim).to_double_vector(), naive(x, {dim}, naive_argmax));
      EXPECT_EQ(argmin(x, dim, keepdim).shape(), shape);
      EXPECT_EQ(argmin(x, dim, keepdim).to_double_vector(), naive(x, {dim}, naive_argmin));
    }
  }
}

TEST(MaxAlongDim, TiesPickTheFirstIndex) {
  Generator gen(testing::next_seed());
  Tensor x = to(randint(0, 3, {6, 8}, DType::i64, &gen), DType::f32);  // three values: many ties
  for (int64_t dim : {0, 1}) {
    EXPECT_EQ(argmax(x, dim).to_double_vector(), naive(x, {dim}, naive_argmax));
    EXPECT_EQ(argmin(x, dim).to_double_vector(), naive(x, {dim}, naive_argmin));
    EXPECT_EQ(max(x, dim).indices.to_double_vector(), naive(x, {dim}, naive_argmax));
  }
}

TEST(MaxAlongDim, FlatArgmaxIndexesTheFlattenedTensor) {
  Tensor x = views::transpose(testing::random_tensor({5, 7}), 0, 1);
  std::vector<double> v = x.to_double_vector();
  Tensor a = argmax(x);
  EXPECT_EQ(a.dim(), 0);
  EXPECT_EQ(a.item(), naive_argmax(v));
  EXPECT_EQ(kernels::reduce(ReduceOp::argmin, x, {}, false).item(), naive_argmin(v));
  EXPECT_EQ(kernels::reduce(ReduceOp::argmax, x, {}, true).shape(), (Shape{1, 1}));
}

TEST(MaxAlongDim, NaNPropagates) {
  double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = testing::random_tensor({3, 6});
  std::vector<double> v = x.to_double_vector();
  v[0 * 6 + 4] = nan;  // row 0: a NaN in the middle
  v[1 * 6 + 0] = nan;  // row 1: a NaN first
  v[1 * 6 + 5] = nan;  //        and another one last
  x = from_vector(v, {3, 6}, DType::f64);
  ValuesIndices mx = max(x, 1), mn = min(x, 1);
  std::vector<double> values = mx.values.to_double_vector(), indices = mx.indices.to_double_vector();
  EXPECT_TRUE(std::isnan(values[0]));
  EXPECT_TRUE(std::isnan(values[1]));
  EXPECT_FALSE(std::isnan(values[2]));
  EXPECT_EQ(indices, naive(x, {1}, naive_argmax));
  EXPECT_EQ(indices[0], 4);
  EXPECT_EQ(indices[1], 0);
  EXPECT_TRUE(std::isnan(mn.values.to_double_vector()[0]));
  EXPECT_EQ(mn.indices.to_double_vector()[0], 4);
  std::vector<double> hi = amax(x, {1}).to_double_vector(), lo = amin(x, {1}).to_double_vector();
  EXPECT_TRUE(std::isnan(hi[0]) && std::isnan(hi[1]) && !std::isnan(hi[2]));
  EXPECT_TRUE(std::isnan(lo[0]) && std::isnan(lo[1]) && !std::isnan(lo[2]));
  EXPECT_TRUE(std::isnan(amax(x).item()));
  // Column 4 holds one NaN: along dim 0 only that column is NaN.
  std::vector<double> col = amax(x, {0}).to_double_vector();
  for (int64_t j = 0; j < 6; ++j) EXPECT_EQ(std::isnan(col[j]), j == 0 || j == 4 || j == 5) << j;
}

// Softmax along `dim` of a contiguous tensor by the textbook formula, in double.
std::vector<double> naive_softmax(const Tensor& x, int64_t dim, bool log) {
  Shape shape = x.shape();
  int64_t d = dim < 0 ? dim + x.dim() : dim;
  int64_t outer = 1, n = shape[d], inner = 1;
  for (int64_t i = 0; i < d; ++i) outer *= shape[i];
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= shape[i];
  std::vector<double> v = x.to_double_vector(), out(v.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      double total = 0;
      for (int64_t r = 0; r < n; ++r) total += std::exp(v[(o * n + r) * inner + i]);
      for (int64_t r = 0; r < n; ++r) {
        double e = v[(o * n + r) * inner + i];
        out[(o * n + r) * inner + i] = log ? e - std::log(total) : std::exp(e) / total;
      }
    }
  }
  return out;
}

TEST(Softmax, AlongEachDimMatchesTheFormula) {
  for (auto [d, tol] : {std::pair{DType::f64, 1e-12}, std::pair{DType::f32, 1e-6}, std::pair{DType::f16, 2e-3},
                        std::pair{DType::bf16, 1e-2}}) {
    Tensor x = testing::random_uniform({3, 4, 5}, -4, 4, d);
    for (int64_t dim : {0, 1, 2, -1, -2}) {
      Tensor y = softmax(x, dim);
      EXPECT_EQ(y.dtype(), d);
      EXPECT_EQ(y.shape(), x.shape());
      EXPECT_TRUE(all_close(y, naive_softmax(x, dim, false), tol, tol)) << "softmax dim " << dim << " in " << d;
      EXPECT_TRUE(all_close(log_softmax(x, dim), naive_softmax(x, dim, true), tol, tol))
          << "log_softmax dim " << dim << " in " << d;
      EXPECT_TRUE(
          all_close(sum(to(y, DType::f64), {dim}), std::vector<double>(x.numel() / x.size(dim), 1.0), 0, tol * 4));
    }
  }
}

TEST(Softmax, NonContiguousInputAndLargeLogits) {
  Tensor x = views::transpose(mul(testing::random_tensor({6, 4}), 200.0), 0, 1);  // logits of size ~ hundreds
  for (int64_t dim : {0, 1}) {
    Tensor c = kernels::contiguous(x);
    // Shift by the max for the reference: exp of ~600 would overflow the naive formula.
    std::vector<double> shifted = sub(c, amax(c, {dim}, true)).to_double_vector();
    Tensor s = from_vector(shifted, c.shape(), DType::f64);
    EXPECT_TRUE(all_close(softmax(x, dim), naive_softmax(s, dim, false), 1e-12, 1e-12)) << dim;
    EXPECT_TRUE(all_close(log_softmax(x, dim), naive_softmax(s, dim, true), 1e-12, 1e-9)) << dim;
    for (double v : softmax(x, dim).to_double_vector()) EXPECT_FALSE(std::isnan(v));
  }
  EXPECT_TRUE(testing::throws_with<TypeError>([] { softmax(arange(4), 0); }, {"softmax", "floating-point", "i64"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { log_softmax(x, 2); }, {"log_softmax", "dim 2"}));
}

// Cross-entropy by the textbook formula: per-row loss with label smoothing, reduced like PyTorch.
std::vector<double> naive_cross_entropy_rows(const Tensor& logits, const std::vector<int64_t>& target,
                                             int64_t ignore_index, double eps) {
  int64_t n = logits.size(0), c = logits.size(1);
  std::vector<double> x = logits.to_double_vector(), losses(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    if (target[i] == ignore_index) continue;
    double total = 0;
    for (int64_t j = 0; j < c; ++j) total += std::exp(x[i * c + j]);
    double loss = 0;
    for (int64_t j = 0; j < c; ++j) {
      double weight = (j == target[i] ? 1.0 - eps : 0.0) + eps / static_cast<double>(c);
      loss -= weight * (x[i * c + j] - std::log(total));
    }
    losses[i] = loss;
  }
  return losses;
}

TEST(CrossEntropy, MatchesTheFormulaForEveryReduction) {
  const int64_t n = 9, c = 6;
  for (int64_t ignore_index : {-100, 2}) {
    for (double eps : {0.0, 0.1, 0.35}) {
      Tensor logits = testing::random_tensor({n, c});
      Generator gen(testing::next_seed());
      std::vector<int64_t> t = randint(0, c, {n}, DType::i64, &gen).to_vector<int64_t>();
      t[3] = ignore_index;  // at least one ignored row
      Tensor target = from_vector(t);
      std::vector<double> rows = naive_cross_entropy_rows(logits, t, ignore_index, eps);
      int64_t counted = 0;
      double total = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (t[i] != ignore_index) {
          ++counted;
          total += rows[i];
        }
      }
      CrossEntropyOptions options;
      options.ignore_index = ignore_index;
      options.label_smoothing = eps;
      options.reduction = Reduction::none;
      Tensor none = cross_entropy(logits, target, options);
      EXPECT_EQ(none.shape(), (Shape{n}));
      EXPECT_TRUE(all_close(none, rows, 1e-12, 1e-12)) << "ignore " << ignore_index << " eps " << eps;
      options.reduction = Reduction::sum;
      Tensor s = cross_entropy(logits, target, options);
      EXPECT_EQ(s.dim(), 0);
      EXPECT_NEAR(s.item(), total, 1e-12 * n);
      options.reduction = Reduction::mean;
      EXPECT_NEAR(cross_entropy(logits, target, options).item(), total / static_cast<double>(counted), 1e-12);
    }
  }
}

TEST(CrossEntropy, Int32TargetsAndHalfLogits) {
  const int64_t n = 12, c = 5;
  Generator gen(testing::next_seed());
  std::vector<int64_t> t = randint(0, c, {n}, DType::i64, &gen).to_vector<int64_t>();
  Tensor target32 = to(from_vector(t), DType::i32);
  Tensor logits = testing::random_tensor({n, c});
  std::vector<double> rows = naive_cross_entropy_rows(logits, t, -100, 0.0);
  double mean_loss = 0;
  for (double r : rows) mean_loss += r / n;
  EXPECT_NEAR(cross_entropy(logits, target32).item(), mean_loss, 1e-12);
  for (auto [d, tol] : {std::pair{DType::f32, 1e-6}, std::pair{DType::f16, 1e-6}, std::pair{DType::bf16, 1e-6}}) {
    Tensor l = to(logits, d);
    // Reference from the logits as rounded to d: the loss itself is computed in double and stored as f32.
    std::vector<double> r = naive_cross_entropy_rows(l, t, -100, 0.0);
    double m = 0;
    for (double v : r) m += v / n;
    Tensor loss = cross_entropy(l, target32);
    EXPECT_EQ(loss.dtype(), DType::f32) << d;
    EXPECT_NEAR(loss.item(), m, tol * std::max(1.0, std::fabs(m))) << d;
  }
}

TEST(CrossEntropy, GradientIsSoftmaxMinusSmoothedTarget) {
  const int64_t n = 7, c = 4;
  double eps = 0.2;
  Tensor logits = testing::random_tensor({n, c}).requires_grad_();
  Generator gen(testing::next_seed());
  std::vector<int64_t> t = randint(0, c, {n}, DType::i64, &gen).to_vector<int64_t>();
  t[0] = -100;
  CrossEntropyOptions options;
  options.label_smoothing = eps;
  cross_entropy(logits, from_vector(t), options).backward();
  std::vector<double> p = naive_softmax(logits.detach(), 1, false), expected(p.size(), 0.0);
  for (int64_t i = 1; i < n; ++i) {
    for (int64_t j = 0; j < c; ++j) {
      double y = (j == t[i] ? 1.0 - eps : 0.0) + eps / c;
      expected[i * c + j] = (p[i * c + j] - y) / (n - 1);
    }
  }
  EXPECT_TRUE(all_close(logits.grad(), expected, 1e-12, 1e-12));
}

TEST(CrossEntropy, BadInputs) {
  Tensor logits = testing::random_tensor({3, 4});
  EXPECT_TRUE(testing::throws_with<IndexError>(
      [&] {
        cross_entropy(logits, from_vector(std::vector<int64_t>{0, 4, 1}));
      },
      {"cross_entropy", "target 4", "row 1", "4 classes", "0 to 3"}));
  EXPECT_TRUE(testing::throws_with<IndexError>(
      [&] {
        cross_entropy(logits, from_vector(std::vector<int64_t>{0, -1, 1}));
      },
      {"cross_entropy", "target -1"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        cross_entropy(logits, from_vector(std::vector<int64_t>{0, 1}));
      },
      {"cross_entropy", "(N,) = (3,)", "[2]"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        cross_entropy(testing::random_tensor({3}), from_vector(std::vector<int64_t>{0, 1, 2}));
      },
      {"cross_entropy", "(N, C)", "[3]"}));
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { cross_entropy(logits, testing::random_tensor({3})); },
                                              {"cross_entropy", "i64 or i32", "f64"}));
  CrossEntropyOptions options;
  options.label_smoothing = 1.5;
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        cross_entropy(logits, from_vector(std::vector<int64_t>{0, 1, 2}), options);
      },
      {"label_smoothing", "1.5"}));
}

// content_hashes: a digest of the bytes, whatever the layout they are read from, that changes
// when one bit does.
TEST(ContentHash, EqualBytesGiveEqualDigestsAndOneBitChangesIt) {
  manual_seed(31);
  Tensor a = randn({37, 5});                                       // (37, 5) f32: 740 bytes
  Tensor b = kernels::to_dtype(randn({7, 3}), DType::bf16);        // (7, 3) bf16: 42 bytes, a partial last word
  Tensor c = randint(0, 256, {13}, DType::u8);                     // (13,) u8
  Tensor t = views::transpose(randn({6, 9}), 0, 1);                       // (9, 6) strided view
  Tensor mid = views::narrow(randint(0, 256, {40}, DType::u8), 0, 3, 29);  // starts mid-word
  std::vector<uint64_t> first = kernels::content_hashes({a, b, c, t, mid});
  std::vector<uint64_t> again =
      kernels::content_hashes({kernels::clone(a), kernels::clone(b), kernels::clone(c), kernels::contiguous(t),
                               kernels::clone(mid)});
  EXPECT_EQ(first, again);
  for (size_t i = 0; i < first.size(); ++i) {
    for (size_t j = i + 1; j < first.size(); ++j) EXPECT_NE(first[i], first[j]) << i << " " << j;
  }
  // Flip the lowest bit of one element (the last, in the partial word, for b).
  Tensor a2 = kernels::clone(a);
  static_cast<uint32_t*>(a2.data_ptr())[123] ^= 1u;
  Tensor b2 = kernels::clone(b);
  static_cast<uint16_t*>(b2.data_ptr())[20] ^= 1u;
  std::vector<uint64_t> flipped = kernels::content_hashes({a2, b2});
  EXPECT_NE(flipped[0], first[0]);
  EXPECT_NE(flipped[1], first[1]);
  EXPECT_TRUE(kernels::content_hashes({}).empty());
}

}  // namespace
}  // namespace tandem
