// Channels-last memory format: strides, the layout checks, conversions, and outputs that keep
// their inputs' layout (elementwise ops, convolution, pooling, batch norm) with the same values
// as the row-major path, on fresh random inputs.
#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::all_close;
using testing::random_tensor;

constexpr MemoryFormat kCL = MemoryFormat::channels_last;

Tensor random_cl(const Shape& shape, DType dtype = DType::f64) {
  return kernels::contiguous(random_tensor(shape, dtype), kCL);
}

// Same values, same shape: compared as row-major vectors (exact).
::testing::AssertionResult same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return ::testing::AssertionFailure() << "shapes differ";
  if (a.to_double_vector() != b.to_double_vector()) return ::testing::AssertionFailure() << "values differ";
  return ::testing::AssertionSuccess();
}

TEST(MemoryFormat, ChannelsLastStridesAndChecks) {
  Tensor t = empty({2, 3, 4, 5}, DType::f32, kCL);
  EXPECT_EQ(t.strides(), (Strides{60, 1, 15, 3}));
  EXPECT_TRUE(t.is_contiguous(kCL));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_FALSE(t.is_contiguous(MemoryFormat::contiguous));
  EXPECT_EQ(t.suggest_memory_format(), kCL);
  Tensor r = empty({2, 3, 4, 5});
  EXPECT_FALSE(r.is_contiguous(kCL));
  EXPECT_EQ(r.suggest_memory_format(), MemoryFormat::contiguous);
  // Both layouts at once (one channel): counts as row-major.
  Tensor one = empty({2, 1, 4, 5}, DType::f32, kCL);
  EXPECT_TRUE(one.is_contiguous() && one.is_contiguous(kCL));
  EXPECT_EQ(one.suggest_memory_format(), MemoryFormat::contiguous);
  // Not 4-D: never channels-last.
  EXPECT_FALSE(empty({3, 4}).is_contiguous(kCL));
  EXPECT_TRUE(
      testing::throws_with<ValueError>([] { empty({3, 4}, DType::f32, kCL); }, {"channels_last", "4-D", "[3, 4]"}));
  EXPECT_STREQ(memory_format_name(kCL), "channels_last");
}

TEST(MemoryFormat, ContiguousInAFormatCopiesOnlyWhenNeeded) {
  Tensor x = random_tensor({2, 3, 4, 5});
  Tensor cl = kernels::contiguous(x, kCL);
  EXPECT_TRUE(cl.is_contiguous(kCL));
  EXPECT_FALSE(cl.storage().is_same(x.storage()));
  EXPECT_TRUE(same_values(cl, x));
  EXPECT_TRUE(kernels::contiguous(cl, kCL).is_same(cl));
  Tensor back = kernels::contiguous(cl, MemoryFormat::contiguous);
  EXPECT_TRUE(back.is_contiguous());
  EXPECT_TRUE(same_values(back, x));
  // A 1x1 weight is both: the view gets channels-last's exact strides, without a copy.
  Tensor w = random_tensor({8, 4, 1, 1});
  Tensor wv = kernels::contiguous(w, kCL);
  EXPECT_TRUE(wv.storage().is_same(w.storage()));
  EXPECT_EQ(wv.strides(), (Strides{4, 1, 4, 4}));
  EXPECT_TRUE(kernels::clone(x, kCL).is_contiguous(kCL));
}

TEST(MemoryFormat, ConversionsAndLikeFactoriesKeepTheFormat) {
  Tensor x = random_cl({2, 3, 4, 5}, DType::f32);
  Tensor h = kernels::to_dtype(x, DType::bf16);
  EXPECT_TRUE(h.is_contiguous(kCL));
  EXPECT_TRUE(all_close(h, x, 1e-2, 1e-2));
  EXPECT_TRUE(empty_like(x).is_contiguous(kCL));
  Tensor z = zeros_like(x);
  EXPECT_TRUE(z.is_contiguous(kCL));
  EXPECT_TRUE(all_close(z, zeros({2, 3, 4, 5})));
  EXPECT_TRUE(full_like(x, 2.5).is_contiguous(kCL));
  EXPECT_TRUE(zeros({2, 3, 4, 5}, DType::f32, kCL).is_contiguous(kCL));
}

TEST(MemoryFormat, ElementwiseOutputsFollowChannelsLastInputs) {
  Tensor a = random_cl({2, 3, 4, 5}), b = random_cl({2, 3, 4, 5});
  Tensor ar = kernels::contiguous(a), br = kernels::contiguous(b);
  Tensor u = kernels::unary(UnaryOp::relu, a);
  EXPECT_TRUE(u.is_contiguous(kCL));
  EXPECT_TRUE(same_values(u, kernels::unary(UnaryOp::relu, ar)));
  Tensor s = kernels::binary(BinaryOp::add, a, b);
  EXPECT_TRUE(s.is_contiguous(kCL));
  EXPECT_TRUE(same_values(s, kernels::binary(BinaryOp::add, ar, br)));
  // A broadcast per-channel operand does not vote: the output stays channels-last.
  Tensor scale = views::reshape(random_tensor({3}), {1, 3, 1, 1});
  Tensor m = kernels::binary(BinaryOp::mul, a, scale);
  EXPECT_TRUE(m.is_contiguous(kCL));
  EXPECT_TRUE(same_values(m, kernels::binary(BinaryOp::mul, ar, scale)));
  Tensor c = kernels::binary(BinaryOp::mul, scalar_tensor(3.0, DType::f64), a);
  EXPECT_TRUE(c.is_contiguous(kCL));
  // Mixed layouts of the output's shape: row-major, as before.
  EXPECT_TRUE(kernels::binary(BinaryOp::add, a, br).is_contiguous());
  Tensor cond = kernels::binary(BinaryOp::gt, a, b);
  EXPECT_TRUE(cond.is_contiguous(kCL));
  Tensor w = kernels::where(cond, a, b);
  EXPECT_TRUE(w.is_contiguous(kCL));
  EXPECT_TRUE(same_values(w, kernels::where(kernels::contiguous(cond), ar, br)));
  Tensor g = random_cl({2, 3, 4, 5});
  Tensor gb = kernels::unary_backward(UnaryOp::tanh, g, a);
  EXPECT_TRUE(gb.is_contiguous(kCL));
  EXPECT_TRUE(same_values(gb, kernels::unary_backward(UnaryOp::tanh, kernels::contiguous(g), ar)));
  // In place into a channels-last tensor.
  Tensor acc = kernels::clone(a, kCL);
  kernels::add_(acc, b, 2.0);
  EXPECT_TRUE(acc.is_contiguous(kCL));
  Tensor expected = kernels::binary(BinaryOp::add, ar, kernels::unary(UnaryOp::scale, br, 2.0));
  EXPECT_TRUE(all_close(acc, expected, 1e-15, 1e-15));
}

TEST(MemoryFormat, CollapseDimsWalksTheLastOperandInMemoryOrder) {
  const Shape shape{2, 3, 4, 5};
  const Strides cl = memory_format_strides(shape, kCL);
  CollapsedDims c = collapse_dims(shape, {cl, cl});
  EXPECT_EQ(c.sizes, (Shape{120}));  // one dense run
  EXPECT_EQ(c.strides[0], (Strides{1}));
  // A row-major last operand keeps the logical order.
  CollapsedDims r = collapse_dims(shape, {cl, contiguous_strides(shape)});
  EXPECT_EQ(r.strides[1].back(), 1);
}

Conv2dParams conv_params(int64_t stride, int64_t pad) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  return p;
}

// On the CPU a channels-last convolution runs the NCHW kernel on row-major copies: the same bits.
TEST(MemoryFormat, ConvolutionInChannelsLastGivesTheNchwResultsInChannelsLast) {
  for (const Conv2dParams& p : {conv_params(1, 1), conv_params(2, 1), conv_params(1, 0)}) {
    Tensor x = random_tensor({2, 4, 7, 6}), w = random_tensor({5, 4, 3, 3});
    Tensor xc = kernels::contiguous(x, kCL), wc = kernels::contiguous(w, kCL);
    Tensor y = kernels::conv2d(x, w, p);
    Tensor y_cl = kernels::conv2d(xc, wc, p);
    EXPECT_TRUE(y_cl.is_contiguous(kCL));
    EXPECT_TRUE(same_values(y_cl, y));
    // Either operand channels-last makes the convolution channels-last, as in PyTorch.
    EXPECT_TRUE(kernels::conv2d(xc, w, p).is_contiguous(kCL));
    EXPECT_TRUE(kernels::conv2d(x, wc, p).is_contiguous(kCL));
    Tensor g = random_tensor(y.shape());
    Tensor gc = kernels::contiguous(g, kCL);
    Tensor dx = kernels::conv2d_backward_input(gc, wc, x.shape(), p);
    EXPECT_TRUE(dx.is_contiguous(kCL));
    EXPECT_TRUE(same_values(dx, kernels::conv2d_backward_input(g, w, x.shape(), p)));
    Tensor dw = kernels::conv2d_backward_weight(gc, xc, w.shape(), p);
    EXPECT_TRUE(dw.is_contiguous(kCL));
    EXPECT_TRUE(same_values(dw, kernels::conv2d_backward_weight(g, x, w.shape(), p)));
  }
}

TEST(MemoryFormat, PoolingAndBatchNormKeepChannelsLast) {
  Tensor x = random_tensor({2, 3, 6, 6});
  Tensor xc = kernels::contiguous(x, kCL);
  for (PoolMode mode : {PoolMode::max, PoolMode::average}) {
    Pool2dParams p;
    p.mode = mode;
    p.kernel_h = p.kernel_w = 3;
    p.stride_h = p.stride_w = 2;
    p.pad_h = p.pad_w = 1;
    Tensor y = kernels::pool2d(x, p), y_cl = kernels::pool2d(xc, p);
    EXPECT_TRUE(y_cl.is_contiguous(kCL));
    EXPECT_TRUE(same_values(y_cl, y));
    Tensor g = random_tensor(y.shape());
    Tensor dx = kernels::pool2d_backward(kernels::contiguous(g, kCL), xc, y_cl, p);
    EXPECT_TRUE(dx.is_contiguous(kCL));
    EXPECT_TRUE(same_values(dx, kernels::pool2d_backward(g, x, y, p)));
  }
  Tensor weight = random_tensor({3}), bias = random_tensor({3});
  Tensor rm = zeros({3}, DType::f64), rv = ones({3}, DType::f64);
  Tensor rm_cl = zeros({3}, DType::f64), rv_cl = ones({3}, DType::f64);
  kernels::BatchNormForward f = kernels::batch_norm(x, weight, bias, rm, rv, true, 0.1, 1e-5);
  kernels::BatchNormForward f_cl = kernels::batch_norm(xc, weight, bias, rm_cl, rv_cl, true, 0.1, 1e-5);
  EXPECT_TRUE(f_cl.out.is_contiguous(kCL));
  EXPECT_TRUE(same_values(f_cl.out, f.out));
  EXPECT_TRUE(same_values(rm_cl, rm));
  EXPECT_TRUE(same_values(rv_cl, rv));
  Tensor g = random_tensor(x.shape());
  kernels::BatchNormBackward b = kernels::batch_norm_backward(g, x, weight, f.save_mean, f.save_invstd);
  kernels::BatchNormBackward b_cl =
      kernels::batch_norm_backward(kernels::contiguous(g, kCL), xc, weight, f_cl.save_mean, f_cl.save_invstd);
  EXPECT_TRUE(b_cl.grad_input.is_contiguous(kCL));
  EXPECT_TRUE(same_values(b_cl.grad_input, b.grad_input));
  EXPECT_TRUE(same_values(b_cl.grad_weight, b.grad_weight));
  EXPECT_TRUE(same_values(b_cl.grad_bias, b.grad_bias));
}

}  // namespace
}  // namespace tandem
