// Batch norm on the CPU in both layouts and fused: channels-last tensors give the same bits as
// NCHW ones (output, statistics, gradients) and keep their layout; batch norm with the residual
// add and ReLU fused gives the same bits as the three separate ops, forward and backward.
#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::all_close;

// The same values as t (N, C, H, W), in channels-last memory.
Tensor as_channels_last(const Tensor& t) {
  return views::permute(kernels::contiguous(views::permute(t, {0, 2, 3, 1})), {0, 3, 1, 2});
}

bool has_channels_last_strides(const Tensor& t) {
  const Shape& s = t.shape();
  return t.strides() == Strides{s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]};
}

::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) { return all_close(a, b, 0.0, 0.0); }

struct Inputs {
  Tensor x, residual, weight, bias, running_mean, running_var, grad;
};

Inputs draw(const Shape& shape, DType dtype) {
  const DType stat = dtype == DType::f64 ? DType::f64 : DType::f32;
  const int64_t c = shape[1];
  Inputs in;
  in.x = kernels::to_dtype(testing::random_uniform(shape, -1.5, 2.5), dtype);
  in.residual = kernels::to_dtype(testing::random_uniform(shape, -1.0, 1.0), dtype);
  in.grad = kernels::to_dtype(testing::random_uniform(shape, -1.0, 1.0), dtype);
  in.weight = testing::random_uniform({c}, 0.5, 1.5, stat);
  in.bias = testing::random_uniform({c}, -0.5, 0.5, stat);
  in.running_mean = testing::random_uniform({c}, -0.5, 0.5, stat);
  in.running_var = testing::random_uniform({c}, 0.5, 2.0, stat);
  return in;
}

struct BatchNormRun {
  kernels::BatchNormForward forward;
  kernels::BatchNormBackward backward;
  Tensor running_mean, running_var;
};

// Forward (and in training, given a gradient, the backward) with fresh copies of the running
// statistics.
BatchNormRun run(const Inputs& in, const Tensor& x, const Tensor& residual, const Tensor& grad, bool training,
                 bool relu) {
  BatchNormRun r;
  r.running_mean = kernels::clone(in.running_mean);
  r.running_var = kernels::clone(in.running_var);
  r.forward =
      kernels::batch_norm(x, in.weight, in.bias, r.running_mean, r.running_var, training, 0.1, 1e-5, residual, relu);
  if (training && grad.defined()) {
    r.backward = kernels::batch_norm_backward(grad, x, in.weight, r.forward.save_mean, r.forward.save_invstd,
                                              relu ? r.forward.out : Tensor(), residual.defined());
  }
  return r;
}

TEST(BatchNormLayout, ChannelsLastGivesTheBitsOfNchw) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16}) {
    for (const Shape& shape : {Shape{3, 5, 4, 3}, Shape{4, 20, 6, 6}}) {
      for (bool training : {true, false}) {
        for (int fused = 0; fused < 3; ++fused) {  // plain, ReLU, residual + ReLU
          SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " " << shape_str(shape) << " training=" << training
                                            << " fused=" << fused);
          Inputs in = draw(shape, dtype);
          const bool relu = fused > 0;
          Tensor residual = fused == 2 ? in.residual : Tensor();
          BatchNormRun nchw = run(in, in.x, residual, in.grad, training, relu);
          BatchNormRun nhwc =
              run(in, as_channels_last(in.x), residual.defined() ? as_channels_last(residual) : Tensor(),
                  as_channels_last(in.grad), training, relu);
          EXPECT_TRUE(has_channels_last_strides(nhwc.forward.out));
          EXPECT_TRUE(same_bits(nhwc.forward.out, nchw.forward.out)) << "output";
          EXPECT_TRUE(same_bits(nhwc.running_mean, nchw.running_mean)) << "running mean";
          EXPECT_TRUE(same_bits(nhwc.running_var, nchw.running_var)) << "running variance";
          if (!training) continue;
          EXPECT_TRUE(same_bits(nhwc.forward.save_mean, nchw.forward.save_mean)) << "batch mean";
          EXPECT_TRUE(same_bits(nhwc.forward.save_invstd, nchw.forward.save_invstd)) << "batch invstd";
          EXPECT_TRUE(has_channels_last_strides(nhwc.backward.grad_input));
          EXPECT_TRUE(same_bits(nhwc.backward.grad_input, nchw.backward.grad_input)) << "input gradient";
          EXPECT_TRUE(same_bits(nhwc.backward.grad_weight, nchw.backward.grad_weight)) << "weight gradient";
          EXPECT_TRUE(same_bits(nhwc.backward.grad_bias, nchw.backward.grad_bias)) << "bias gradient";
          if (residual.defined()) {
            EXPECT_TRUE(same_bits(nhwc.backward.grad_residual, nchw.backward.grad_residual)) << "residual gradient";
          }
        }
      }
    }
  }
}

// A channels-last input with an NCHW residual and gradient: the output keeps the input's layout.
TEST(BatchNormLayout, MixedLayoutsFollowTheInput) {
  Inputs in = draw({2, 6, 3, 5}, DType::f32);
  BatchNormRun nchw = run(in, in.x, in.residual, in.grad, true, true);
  BatchNormRun mixed = run(in, as_channels_last(in.x), in.residual, in.grad, true, true);
  EXPECT_TRUE(has_channels_last_strides(mixed.forward.out));
  EXPECT_TRUE(same_bits(mixed.forward.out, nchw.forward.out));
  EXPECT_TRUE(same_bits(mixed.backward.grad_input, nchw.backward.grad_input));
  EXPECT_TRUE(same_bits(mixed.backward.grad_residual, nchw.backward.grad_residual));
}

// relu(batch_norm(x) + residual) fused equals batch_norm, add and relu run one after the other;
// its backward equals relu's backward, then batch norm's, the residual taking relu's gradient.
TEST(BatchNormLayout, FusedResidualReluGivesTheBitsOfSeparateOps) {
  for (DType dtype : {DType::f64, DType::f32, DType::bf16, DType::f16}) {
    for (bool channels_last : {false, true}) {
      for (bool training : {true, false}) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(dtype) << " channels_last=" << channels_last << " training=" << training);
        Inputs in = draw({4, 7, 5, 3}, dtype);
        auto layout = [&](const Tensor& t) { return channels_last ? as_channels_last(t) : t; };
        const Tensor x = layout(in.x), residual = layout(in.residual), grad = layout(in.grad);
        BatchNormRun fused = run(in, x, residual, grad, training, true);
        BatchNormRun plain = run(in, x, Tensor(), Tensor(), training, false);  // forward only
        Tensor sum = kernels::binary(BinaryOp::add, plain.forward.out, residual);
        Tensor expected = kernels::unary(UnaryOp::relu, sum);
        EXPECT_TRUE(same_bits(fused.forward.out, expected)) << "output";
        EXPECT_TRUE(same_bits(fused.running_mean, plain.running_mean));
        EXPECT_TRUE(same_bits(fused.running_var, plain.running_var));
        if (!training) continue;
        Tensor masked = kernels::unary_backward(UnaryOp::relu, grad, sum);
        kernels::BatchNormBackward b =
            kernels::batch_norm_backward(masked, x, in.weight, plain.forward.save_mean, plain.forward.save_invstd);
        EXPECT_TRUE(same_bits(fused.backward.grad_input, b.grad_input)) << "input gradient";
        EXPECT_TRUE(same_bits(fused.backward.grad_weight, b.grad_weight)) << "weight gradient";
        EXPECT_TRUE(same_bits(fused.backward.grad_bias, b.grad_bias)) << "bias gradient";
        EXPECT_TRUE(same_bits(fused.backward.grad_residual, masked)) << "residual gradient";
      }
    }
  }
}

// An empty batch in evaluation gives an empty output in the input's layout.
TEST(BatchNormLayout, EmptyBatchInEvaluation) {
  Inputs in = draw({1, 4, 2, 3}, DType::f32);
  Tensor x = as_channels_last(testing::random_uniform({0, 4, 2, 3}, -1.0, 1.0, DType::f32));
  kernels::BatchNormForward f =
      kernels::batch_norm(x, in.weight, in.bias, in.running_mean, in.running_var, false, 0.1, 1e-5, Tensor(), true);
  EXPECT_EQ(f.out.shape(), (Shape{0, 4, 2, 3}));
}

TEST(BatchNormLayout, ResidualErrorsNameTheMismatch) {
  Inputs in = draw({2, 3, 4, 4}, DType::f32);
  Tensor wrong_shape = testing::random_uniform({2, 3, 4, 5}, -1.0, 1.0, DType::f32);
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        kernels::batch_norm(in.x, in.weight, in.bias, in.running_mean, in.running_var, true, 0.1, 1e-5, wrong_shape,
                            true);
      },
      {"batch_norm", "residual", "[2, 3, 4, 5]", "[2, 3, 4, 4]"}));
  Tensor wrong_dtype = testing::random_uniform({2, 3, 4, 4}, -1.0, 1.0, DType::f64);
  EXPECT_TRUE(testing::throws_with<TypeError>(
      [&] {
        kernels::batch_norm(in.x, in.weight, in.bias, in.running_mean, in.running_var, true, 0.1, 1e-5, wrong_dtype,
                            true);
      },
      {"batch_norm", "residual", "f32", "f64"}));
}

}  // namespace
}  // namespace tandem
