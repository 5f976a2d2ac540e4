// Convolution, pooling and batch norm kernels against direct loops in double, written out here
// from the definitions (torch.nn.functional's semantics), and lower precisions against f64.
#include <cmath>
#include <limits>
#include <tuple>

#include "support/test_util.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::random_uniform;

Conv2dParams conv_params(int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                         int64_t dilation_w, int64_t groups) {
  Conv2dParams p;
  p.stride_h = stride_h;
  p.stride_w = stride_w;
  p.pad_h = pad_h;
  p.pad_w = pad_w;
  p.dilation_h = dilation_h;
  p.dilation_w = dilation_w;
  p.groups = groups;
  return p;
}

Pool2dParams pool_params(PoolMode mode, int64_t kernel_h, int64_t kernel_w, int64_t stride_h, int64_t stride_w,
                         int64_t pad_h, int64_t pad_w, bool count_include_pad = true) {
  Pool2dParams p;
  p.mode = mode;
  p.kernel_h = kernel_h;
  p.kernel_w = kernel_w;
  p.stride_h = stride_h;
  p.stride_w = stride_w;
  p.pad_h = pad_h;
  p.pad_w = pad_w;
  p.count_include_pad = count_include_pad;
  return p;
}

// ---- direct convolution: out[b, k, p, q] = sum over (c, i, j) of x[b, c, ih, iw] * w[k, c, i, j] ----
struct ConvReference {
  Shape out_shape;
  std::vector<double> out;     // (N, K, P, Q)
  std::vector<double> grad_x;  // (N, C, H, W), for the gradient g
  std::vector<double> grad_w;  // (K, C / groups, R, S)
};

ConvReference direct_conv(const Tensor& x_t, const Tensor& w_t, const Conv2dParams& p, const Tensor& g_t = Tensor()) {
  const int64_t n = x_t.shape()[0], c = x_t.shape()[1], h = x_t.shape()[2], w = x_t.shape()[3];
  const int64_t k = w_t.shape()[0], cg = w_t.shape()[1], r = w_t.shape()[2], s = w_t.shape()[3];
  const int64_t kg = k / p.groups;
  const int64_t ph = (h + 2 * p.pad_h - p.dilation_h * (r - 1) - 1) / p.stride_h + 1;
  const int64_t pw = (w + 2 * p.pad_w - p.dilation_w * (s - 1) - 1) / p.stride_w + 1;
  std::vector<double> x = x_t.to_double_vector(), wt = w_t.to_double_vector();
  std::vector<double> g = g_t.defined() ? g_t.to_double_vector() : std::vector<double>();
  ConvReference ref;
  ref.out_shape = {n, k, ph, pw};
  ref.out.assign(static_cast<size_t>(n * k * ph * pw), 0.0);
  ref.grad_x.assign(x.size(), 0.0);
  ref.grad_w.assign(wt.size(), 0.0);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t oc = 0; oc < k; ++oc) {
      const int64_t grp = oc / kg;
      for (int64_t op = 0; op < ph; ++op) {
        for (int64_t oq = 0; oq < pw; ++oq) {
          const int64_t o = ((b * k + oc) * ph + op) * pw + oq;
          for (int64_t ic = 0; ic < cg; ++ic) {
            for (int64_t i = 0; i < r; ++i) {
              for (int64_t j = 0; j < s; ++j) {
                const int64_t ih = op * p.stride_h - p.pad_h + i * p.dilation_h;
                const int64_t iw = oq * p.stride_w - p.pad_w + j * p.dilation_w;
                if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
                const int64_t xi = ((b * c + grp * cg + ic) * h + ih) * w + iw;
                const int64_t wi = ((oc * cg + ic) * r + i) * s + j;
                ref.out[o] += x[xi] * wt[wi];
                if (!g.empty()) {
                  ref.grad_x[xi] += g[o] * wt[wi];
                  ref.grad_w[wi] += g[o] * x[xi];
                }
              }
            }
          }
        }
      }
    }
  }
  return ref;
}

struct ConvCase {
  Shape x, w;
  Conv2dParams p;
};

std::vector<ConvCase> conv_cases() {
  return {
      {{2, 3, 7, 6}, {4, 3, 3, 3}, conv_params(1, 1, 0, 0, 1, 1, 1)},
      {{2, 4, 9, 8}, {6, 2, 3, 2}, conv_params(2, 1, 1, 2, 2, 1, 2)},  // every parameter at once
      {{1, 3, 6, 6}, {3, 1, 3, 3}, conv_params(2, 2, 1, 1, 1, 1, 3)},  // depthwise
      {{3, 4, 5, 5}, {5, 4, 1, 1}, conv_params(1, 1, 0, 0, 1, 1, 1)},  // 1x1: no unfolding
      {{2, 4, 4, 3}, {6, 2, 1, 1}, conv_params(1, 1, 0, 0, 1, 1, 2)},  // grouped 1x1
      {{2, 2, 8, 7}, {3, 2, 2, 2}, conv_params(3, 3, 0, 1, 1, 1, 1)},  // stride past the kernel skips inputs
      {{2, 2, 5, 5}, {2, 2, 3, 3}, conv_params(1, 1, 2, 2, 2, 2, 1)},  // windows mostly padding
  };
}

TEST(Conv2d, MatchesDirectLoops) {
  for (const ConvCase& cs : conv_cases()) {
    SCOPED_TRACE("x " + shape_str(cs.x) + " w " + shape_str(cs.w) + " groups " + std::to_string(cs.p.groups));
    Tensor x = random_tensor(cs.x), w = random_tensor(cs.w);
    Tensor out = kernels::conv2d(x, w, cs.p);
    Tensor g = random_tensor(out.shape());
    ConvReference ref = direct_conv(x, w, cs.p, g);
    ASSERT_EQ(out.shape(), ref.out_shape);
    EXPECT_TRUE(all_close(out, ref.out, 1e-12, 1e-12));
    EXPECT_TRUE(all_close(kernels::conv2d_backward_input(g, w, x.shape(), cs.p), ref.grad_x, 1e-12, 1e-12));
    EXPECT_TRUE(all_close(kernels::conv2d_backward_weight(g, x, w.shape(), cs.p), ref.grad_w, 1e-12, 1e-12));
  }
}

// Enough work per call for the samples (and the weight gradient's partial sums) to be split
// across threads where OpenMP is on.
TEST(Conv2d, LargerShapesMatchDirectLoops) {
  Tensor x = random_tensor({5, 8, 14, 14}), w = random_tensor({8, 4, 3, 3});
  Conv2dParams p = conv_params(1, 1, 1, 1, 1, 1, 2);
  Tensor out = kernels::conv2d(x, w, p);
  Tensor g = random_tensor(out.shape());
  ConvReference ref = direct_conv(x, w, p, g);
  EXPECT_TRUE(all_close(out, ref.out, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(kernels::conv2d_backward_input(g, w, x.shape(), p), ref.grad_x, 1e-12, 1e-12));
  EXPECT_TRUE(all_close(kernels::conv2d_backward_weight(g, x, w.shape(), p), ref.grad_w, 1e-12, 1e-12));
}

TEST(Conv2d, NonContiguousOperands) {
  Tensor x = kernels::contiguous(random_tensor({2, 3, 6, 5}));
  Tensor xt = transpose(random_tensor({2, 3, 5, 6}), 2, 3);  // (2, 3, 6, 5), strided
  Tensor w = transpose(random_tensor({4, 3, 2, 3}), 2, 3);   // (4, 3, 3, 2), strided
  ASSERT_FALSE(xt.is_contiguous());
  Conv2dParams p = conv_params(1, 2, 1, 0, 1, 1, 1);
  EXPECT_TRUE(all_close(kernels::conv2d(xt, w, p), direct_conv(xt, w, p).out, 1e-12, 1e-12));
}

TEST(Conv2d, LowerPrecisionsMatchFloat64) {
  for (const ConvCase& cs : conv_cases()) {
    SCOPED_TRACE("x " + shape_str(cs.x) + " w " + shape_str(cs.w));
    Tensor x = random_tensor(cs.x), w = random_tensor(cs.w);
    Tensor g = random_tensor(kernels::conv2d(x, w, cs.p).shape());
    for (auto [dtype, rtol] :
         {std::pair{DType::f32, 1e-5}, std::pair{DType::f16, 4e-3}, std::pair{DType::bf16, 2e-2}}) {
      SCOPED_TRACE(dtype_name(dtype));
      // The f64 reference takes the rounded operands, so only the arithmetic's precision shows.
      Tensor xl = kernels::to_dtype(x, dtype), wl = kernels::to_dtype(w, dtype), gl = kernels::to_dtype(g, dtype);
      Tensor xr = kernels::to_dtype(xl, DType::f64), wr = kernels::to_dtype(wl, DType::f64);
      Tensor gr = kernels::to_dtype(gl, DType::f64);
      Tensor out = kernels::conv2d(xl, wl, cs.p);
      EXPECT_EQ(out.dtype(), dtype);
      EXPECT_TRUE(all_close(out, kernels::conv2d(xr, wr, cs.p), rtol, 0.0));
      EXPECT_TRUE(all_close(kernels::conv2d_backward_input(gl, wl, x.shape(), cs.p),
                            kernels::conv2d_backward_input(gr, wr, x.shape(), cs.p), rtol, 0.0));
      EXPECT_TRUE(all_close(kernels::conv2d_backward_weight(gl, xl, w.shape(), cs.p),
                            kernels::conv2d_backward_weight(gr, xr, w.shape(), cs.p), rtol, 0.0));
    }
  }
}

TEST(Conv2d, ChannelMismatchIsAClearError) {
  Tensor x = random_tensor({1, 3, 5, 5});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { kernels::conv2d(x, random_tensor({2, 4, 3, 3}), {}); },
                                               {"conv2d", "[1, 3, 5, 5]", "3 channels", "expects 4"}));
  Conv2dParams grouped = conv_params(1, 1, 0, 0, 1, 1, 2);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { kernels::conv2d(x, random_tensor({2, 3, 3, 3}), grouped); },
                                               {"conv2d", "3 channels", "groups=2"}));
  EXPECT_TRUE(testing::throws_with<TypeError>(
      [&] { kernels::conv2d(x, random_tensor({2, 3, 3, 3}, DType::f32), {}); }, {"conv2d", "dtypes differ"}));
}

TEST(Conv2d, InputSmallerThanKernelIsAClearError) {
  auto conv = [](const Shape& x, const Shape& w, const Conv2dParams& p) {
    return [=] { kernels::conv2d(random_tensor(x), random_tensor(w), p); };
  };
  EXPECT_TRUE(testing::throws_with<ValueError>(conv({1, 2, 2, 4}, {1, 2, 3, 3}, {}),
                                               {"conv2d", "[1, 2, 2, 4]", "smaller than the 3x3 kernel"}));
  // A stride must not round a negative span up to one output row.
  EXPECT_TRUE(testing::throws_with<ValueError>(conv({1, 1, 2, 5}, {1, 1, 3, 3}, conv_params(2, 2, 0, 0, 1, 1, 1)),
                                               {"conv2d", "smaller than the 3x3 kernel"}));
  // Dilation widens the kernel past the input.
  EXPECT_TRUE(testing::throws_with<ValueError>(conv({1, 1, 4, 4}, {1, 1, 2, 2}, conv_params(1, 1, 0, 0, 4, 1, 1)),
                                               {"conv2d", "smaller than", "dilation 4x1"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [] { kernels::pool2d(random_tensor({1, 1, 1, 3}), pool_params(PoolMode::max, 2, 2, 2, 2, 0, 0)); },
      {"max_pool2d", "[1, 1, 1, 3]", "smaller than the 2x2 window"}));
}

// ---- direct pooling ----
struct PoolReference {
  Shape out_shape;
  std::vector<double> out, grad_x;
};

PoolReference direct_pool(const Tensor& x_t, const Pool2dParams& p, const Tensor& g_t = Tensor()) {
  const int64_t n = x_t.shape()[0], c = x_t.shape()[1], h = x_t.shape()[2], w = x_t.shape()[3];
  const int64_t ph = (h + 2 * p.pad_h - p.kernel_h) / p.stride_h + 1;
  const int64_t pw = (w + 2 * p.pad_w - p.kernel_w) / p.stride_w + 1;
  std::vector<double> x = x_t.to_double_vector();
  std::vector<double> g = g_t.defined() ? g_t.to_double_vector() : std::vector<double>();
  PoolReference ref;
  ref.out_shape = {n, c, ph, pw};
  ref.grad_x.assign(x.size(), 0.0);
  for (int64_t plane = 0; plane < n * c; ++plane) {
    for (int64_t op = 0; op < ph; ++op) {
      for (int64_t oq = 0; oq < pw; ++oq) {
        double best = -std::numeric_limits<double>::infinity(), sum = 0.0;
        int64_t arg = -1, inside = 0;
        for (int64_t i = 0; i < p.kernel_h; ++i) {
          for (int64_t j = 0; j < p.kernel_w; ++j) {
            const int64_t ih = op * p.stride_h - p.pad_h + i, iw = oq * p.stride_w - p.pad_w + j;
            if (ih < 0 || ih >= h || iw < 0 || iw >= w) continue;
            const int64_t xi = (plane * h + ih) * w + iw;
            if (arg < 0 || x[xi] > best) {
              best = x[xi];
              arg = xi;
            }
            sum += x[xi];
            ++inside;
          }
        }
        // Without ceil mode no window reaches past the padding, so the padded window is the kernel.
        const double divisor = p.count_include_pad ? static_cast<double>(p.kernel_h * p.kernel_w) : inside;
        const double gv = g.empty() ? 0.0 : g[(plane * ph + op) * pw + oq];
        if (p.mode == PoolMode::max) {
          ref.out.push_back(best);
          ref.grad_x[arg] += gv;
        } else {
          ref.out.push_back(sum / divisor);
          for (int64_t i = 0; i < p.kernel_h; ++i) {
            for (int64_t j = 0; j < p.kernel_w; ++j) {
              const int64_t ih = op * p.stride_h - p.pad_h + i, iw = oq * p.stride_w - p.pad_w + j;
              if (ih >= 0 && ih < h && iw >= 0 && iw < w) ref.grad_x[(plane * h + ih) * w + iw] += gv / divisor;
            }
          }
        }
      }
    }
  }
  return ref;
}

std::vector<Pool2dParams> pool_cases(PoolMode mode, bool count_include_pad) {
  return {
      pool_params(mode, 2, 2, 2, 2, 0, 0, count_include_pad),
      pool_params(mode, 3, 3, 2, 2, 1, 1, count_include_pad),
      pool_params(mode, 3, 2, 1, 2, 1, 0, count_include_pad),  // rectangular, overlapping rows
      pool_params(mode, 3, 3, 1, 1, 1, 1, count_include_pad),
  };
}

void expect_pool_matches(const Pool2dParams& p, const Shape& shape) {
  SCOPED_TRACE("kernel " + std::to_string(p.kernel_h) + "x" + std::to_string(p.kernel_w) + " stride " +
               std::to_string(p.stride_h) + "x" + std::to_string(p.stride_w) + " padding " + std::to_string(p.pad_h) +
               "x" + std::to_string(p.pad_w) + " count_include_pad " + std::to_string(p.count_include_pad));
  Tensor x = random_tensor(shape);
  Tensor out = kernels::pool2d(x, p);
  Tensor g = random_tensor(out.shape());
  PoolReference ref = direct_pool(x, p, g);
  ASSERT_EQ(out.shape(), ref.out_shape);
  EXPECT_TRUE(all_close(out, ref.out, 1e-14, 0.0));
  EXPECT_TRUE(all_close(kernels::pool2d_backward(g, x, out, p), ref.grad_x, 1e-14, 1e-15));
}

TEST(Pool2d, MaxMatchesDirectLoops) {
  for (const Pool2dParams& p : pool_cases(PoolMode::max, true)) expect_pool_matches(p, {2, 3, 7, 6});
}

TEST(Pool2d, AverageMatchesDirectLoops) {
  for (bool include : {true, false}) {
    for (const Pool2dParams& p : pool_cases(PoolMode::average, include)) expect_pool_matches(p, {2, 3, 7, 6});
  }
}

TEST(Pool2d, LargerShapesMatchDirectLoops) {
  expect_pool_matches(pool_params(PoolMode::max, 3, 3, 2, 2, 1, 1), {4, 8, 32, 32});
  expect_pool_matches(pool_params(PoolMode::average, 3, 3, 2, 2, 1, 1, false), {4, 8, 32, 32});
}

TEST(Pool2d, MaxTiesGoToTheFirstAndPaddingNeverWins) {
  // A negative constant: every window ties, and a padded zero would beat it if padding counted.
  const double value = -random_uniform({1}, 0.5, 2.0).item();
  Tensor x = full({1, 2, 5, 5}, value, DType::f64);
  Pool2dParams p = pool_params(PoolMode::max, 3, 3, 2, 2, 1, 1);
  Tensor out = kernels::pool2d(x, p);
  EXPECT_TRUE(all_close(out, full(out.shape(), value, DType::f64), 0.0, 0.0));
  Tensor g = random_uniform(out.shape(), 0.5, 1.5);
  Tensor grad = kernels::pool2d_backward(g, x, out, p);
  EXPECT_TRUE(all_close(grad, direct_pool(x, p, g).grad_x, 1e-14, 0.0));
  // Along the first row, windows cover columns [-1, 1], [1, 3], [3, 5]: each sends its gradient to
  // its first column inside the input, (0, 0), (0, 1) and (0, 3).
  std::vector<double> gv = g.to_double_vector(), grad_v = grad.to_double_vector();
  EXPECT_EQ(grad_v[0], gv[0]);
  EXPECT_EQ(grad_v[1], gv[1]);
  EXPECT_EQ(grad_v[2], 0.0);
  EXPECT_EQ(grad_v[3], gv[2]);
}

TEST(Pool2d, LowerPrecisionsMatchFloat64) {
  Tensor x = random_tensor({2, 3, 7, 6});
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor xl = kernels::to_dtype(x, dtype), xr = kernels::to_dtype(xl, DType::f64);
    for (PoolMode mode : {PoolMode::max, PoolMode::average}) {
      Pool2dParams p = pool_params(mode, 3, 3, 2, 2, 1, 1, false);
      Tensor out = kernels::pool2d(xl, p);
      EXPECT_EQ(out.dtype(), dtype);
      // The max only selects, so it is exact; averages and the gradients of overlapping windows round once.
      const double rtol = dtype == DType::f32 ? 1e-6 : (dtype == DType::f16 ? 2e-3 : 1e-2);
      EXPECT_TRUE(all_close(out, kernels::pool2d(xr, p), mode == PoolMode::max ? 0.0 : rtol, 0.0));
      Tensor g = kernels::to_dtype(random_tensor(out.shape()), dtype);
      EXPECT_TRUE(all_close(kernels::pool2d_backward(g, xl, out, p),
                            kernels::pool2d_backward(kernels::to_dtype(g, DType::f64), xr, kernels::pool2d(xr, p), p),
                            rtol, 0.0));
    }
  }
}

// ---- batch norm ----
struct ChannelStats {
  std::vector<double> mean, biased_var, unbiased_var;
};

ChannelStats channel_stats(const Tensor& x_t) {
  const int64_t n = x_t.shape()[0], c = x_t.shape()[1], hw = x_t.shape()[2] * x_t.shape()[3];
  std::vector<double> x = x_t.to_double_vector();
  ChannelStats s;
  for (int64_t ch = 0; ch < c; ++ch) {
    double sum = 0.0, squares = 0.0;
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t i = 0; i < hw; ++i) sum += x[(b * c + ch) * hw + i];
    }
    const double m = static_cast<double>(n * hw), mean = sum / m;
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t i = 0; i < hw; ++i) squares += std::pow(x[(b * c + ch) * hw + i] - mean, 2);
    }
    s.mean.push_back(mean);
    s.biased_var.push_back(squares / m);
    s.unbiased_var.push_back(squares / (m - 1));
  }
  return s;
}

// (x - mean) / sqrt(var + eps) * weight + bias, per channel.
std::vector<double> normalise(const Tensor& x_t, const std::vector<double>& mean, const std::vector<double>& var,
                              const Tensor& weight, const Tensor& bias, double eps) {
  const int64_t c = x_t.shape()[1], hw = x_t.shape()[2] * x_t.shape()[3];
  std::vector<double> x = x_t.to_double_vector(), w = weight.to_double_vector(), b = bias.to_double_vector();
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t ch = (static_cast<int64_t>(i) / hw) % c;
    x[i] = (x[i] - mean[ch]) / std::sqrt(var[ch] + eps) * w[ch] + b[ch];
  }
  return x;
}

struct BatchNormInputs {
  Tensor x, weight, bias, running_mean, running_var;
};

BatchNormInputs batch_norm_inputs(const Shape& shape, DType dtype) {
  DType stat = dtype == DType::f64 ? DType::f64 : DType::f32;
  const int64_t c = shape[1];
  BatchNormInputs in;
  // Channels with an offset and a spread, so that both statistics matter.
  in.x = kernels::to_dtype(add(mul(random_tensor(shape), 1.7), 0.6), dtype);
  in.weight = random_uniform({c}, 0.5, 1.5, stat);
  in.bias = random_tensor({c}, stat);
  in.running_mean = random_tensor({c}, stat);
  in.running_var = random_uniform({c}, 0.5, 2.0, stat);
  return in;
}

TEST(BatchNorm, TrainingStatisticsAndRunningUpdate) {
  for (auto [dtype, shape, rtol] : {std::tuple{DType::f64, Shape{3, 4, 5, 2}, 1e-12},
                                    std::tuple{DType::f32, Shape{3, 4, 5, 2}, 1e-5},
                                    std::tuple{DType::f64, Shape{4, 8, 16, 16}, 1e-12}}) {  // large enough for threads
    SCOPED_TRACE(dtype_name(dtype) + (" " + shape_str(shape)));
    BatchNormInputs in = batch_norm_inputs(shape, dtype);
    std::vector<double> old_mean = in.running_mean.to_double_vector(), old_var = in.running_var.to_double_vector();
    const double momentum = 0.3, eps = 1e-3;
    kernels::BatchNormForward f =
        kernels::batch_norm(in.x, in.weight, in.bias, in.running_mean, in.running_var, true, momentum, eps);
    ChannelStats s = channel_stats(in.x);
    std::vector<double> invstd, new_mean, new_var;
    for (size_t ch = 0; ch < s.mean.size(); ++ch) {
      invstd.push_back(1.0 / std::sqrt(s.biased_var[ch] + eps));
      new_mean.push_back((1 - momentum) * old_mean[ch] + momentum * s.mean[ch]);
      new_var.push_back((1 - momentum) * old_var[ch] + momentum * s.unbiased_var[ch]);
    }
    EXPECT_EQ(f.save_mean.dtype(), in.weight.dtype());
    EXPECT_TRUE(all_close(f.save_mean, s.mean, rtol, 0.0));
    EXPECT_TRUE(all_close(f.save_invstd, invstd, rtol, 0.0));
    EXPECT_TRUE(all_close(in.running_mean, new_mean, rtol, 0.0));
    EXPECT_TRUE(all_close(in.running_var, new_var, rtol, 0.0));
    EXPECT_TRUE(all_close(f.out, normalise(in.x, s.mean, s.biased_var, in.weight, in.bias, eps), rtol, 0.0));
  }
}

TEST(BatchNorm, InferenceUsesRunningStatistics) {
  for (auto [dtype, rtol] : {std::pair{DType::f64, 1e-12}, std::pair{DType::f32, 1e-5}}) {
    SCOPED_TRACE(dtype_name(dtype));
    BatchNormInputs in = batch_norm_inputs({2, 3, 4, 3}, dtype);
    std::vector<double> mean = in.running_mean.to_double_vector(), var = in.running_var.to_double_vector();
    kernels::BatchNormForward f =
        kernels::batch_norm(in.x, in.weight, in.bias, in.running_mean, in.running_var, false, 0.1, 1e-5);
    EXPECT_FALSE(f.save_mean.defined());
    EXPECT_TRUE(all_close(f.out, normalise(in.x, mean, var, in.weight, in.bias, 1e-5), rtol, 0.0));
    EXPECT_TRUE(all_close(in.running_mean, mean, 0.0, 0.0));
    EXPECT_TRUE(all_close(in.running_var, var, 0.0, 0.0));
  }
}

TEST(BatchNorm, HalfInputsUseFloatStatistics) {
  for (DType dtype : {DType::f16, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    BatchNormInputs in = batch_norm_inputs({2, 3, 4, 4}, dtype);
    EXPECT_EQ(in.weight.dtype(), DType::f32);
    kernels::BatchNormForward f =
        kernels::batch_norm(in.x, in.weight, in.bias, in.running_mean, in.running_var, true, 0.1, 1e-5);
    EXPECT_EQ(f.out.dtype(), dtype);
    EXPECT_EQ(f.save_invstd.dtype(), DType::f32);
    ChannelStats s = channel_stats(in.x);  // of the rounded input
    EXPECT_TRUE(all_close(f.save_mean, s.mean, 1e-6, 0.0));
    EXPECT_TRUE(all_close(f.out, normalise(in.x, s.mean, s.biased_var, in.weight, in.bias, 1e-5), 1e-2, 0.0));
  }
}

TEST(BatchNorm, BackwardInFloat32MatchesFloat64) {
  BatchNormInputs in = batch_norm_inputs({4, 3, 3, 2}, DType::f64);
  kernels::BatchNormForward f =
      kernels::batch_norm(in.x, in.weight, in.bias, in.running_mean, in.running_var, true, 0.1, 1e-5);
  Tensor g = random_tensor(in.x.shape());
  kernels::BatchNormBackward b64 = kernels::batch_norm_backward(g, in.x, in.weight, f.save_mean, f.save_invstd);
  auto f32 = [](const Tensor& t) { return kernels::to_dtype(t, DType::f32); };
  kernels::BatchNormBackward b32 = kernels::batch_norm_backward(f32(g), f32(in.x), f32(in.weight), f32(f.save_mean),
                                                                f32(f.save_invstd));
  EXPECT_TRUE(all_close(b32.grad_input, b64.grad_input, 1e-4, 0.0));
  EXPECT_TRUE(all_close(b32.grad_weight, b64.grad_weight, 1e-5, 0.0));
  EXPECT_TRUE(all_close(b32.grad_bias, b64.grad_bias, 1e-5, 0.0));
  // The gradient of the bias is the sum over (N, H, W); the input's gradient sums to zero per channel.
  EXPECT_TRUE(all_close(b64.grad_bias, kernels::reduce(ReduceOp::sum, g, {0, 2, 3}, false), 1e-12, 0.0));
  EXPECT_TRUE(all_close(kernels::reduce(ReduceOp::sum, b64.grad_input, {0, 2, 3}, false), {0.0, 0.0, 0.0}, 0.0, 1e-12));
}

TEST(BatchNorm, ArgumentErrors) {
  BatchNormInputs in = batch_norm_inputs({1, 3, 1, 1}, DType::f64);
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] { kernels::batch_norm(in.x, in.weight, in.bias, in.running_mean, in.running_var, true, 0.1, 1e-5); },
      {"batch_norm", "more than one value per channel", "[1, 3, 1, 1]"}));
  Tensor x = random_tensor({2, 4, 2, 2});
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] { kernels::batch_norm(x, in.weight, in.bias, in.running_mean, in.running_var, true, 0.1, 1e-5); },
      {"batch_norm", "(4,)", "[3]"}));
}

}  // namespace
}  // namespace tandem
