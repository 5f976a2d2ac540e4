// Batch norm on CUDA in both layouts (NCHW and channels-last), plain and with the residual add and
// ReLU fused, against the CPU in f64 on the same inputs, in f32, bf16 and f16, on fresh random
// inputs: training forward (output, batch and running statistics), evaluation forward, and the
// backward (input, weight, bias and residual gradients, the ReLU mask taken from one shared
// output so both sides mask the same elements). Channel counts not a multiple of 8 (scalar loads)
// and ResNet-18's shapes (16-byte loads, a channel's sums over many blocks). On the GPU, the fused
// op gives the bits of batch_norm, add and relu, and two runs give the same bits.
#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::all_close;

// t (N, C, H, W) with channels-last strides, wherever it lives.
Tensor as_channels_last(const Tensor& t) {
  return views::permute(kernels::contiguous(views::permute(t, {0, 2, 3, 1})), {0, 3, 1, 2});
}

// A copy of t on `device` (and in `dtype`) with t's layout: NCHW or channels-last.
Tensor moved(const Tensor& t, Device device, DType dtype, bool channels_last) {
  Tensor c = kernels::to_dtype(kernels::to_device(kernels::contiguous(t), device), dtype);
  return channels_last ? as_channels_last(c) : c;
}

bool has_channels_last_strides(const Tensor& t) {
  const Shape& s = t.shape();
  return t.strides() == Strides{s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]};
}

Tensor host64(const Tensor& t) { return kernels::to_dtype(kernels::to_device(t, Device()), DType::f64); }

double tolerance(DType dtype) { return dtype == DType::bf16 ? 1.6e-2 : dtype == DType::f16 ? 2e-3 : 2e-5; }

struct Variant {
  bool channels_last, residual, relu;
};

std::string describe(DType dtype, const Shape& shape, const Variant& v) {
  return std::string(dtype_name(dtype)) + " " + shape_str(shape) + (v.channels_last ? " channels-last" : " NCHW") +
         (v.residual ? " +residual" : "") + (v.relu ? " +relu" : "");
}

// Drawn once in f64 and rounded to dtype, so that the CPU reference sees the GPU's values.
struct Drawn {
  Tensor x, residual, grad;                        // (N, C, H, W)
  Tensor weight, bias, running_mean, running_var;  // (C,) f32
};

Drawn draw(const Shape& shape, DType dtype) {
  auto rounded = [dtype](const Shape& s, double lo, double hi) {
    return kernels::to_dtype(kernels::to_dtype(testing::random_uniform(s, lo, hi), dtype), DType::f64);
  };
  const int64_t c = shape[1];
  Drawn d;
  d.x = rounded(shape, -1.0, 3.0);  // mean away from zero
  d.residual = rounded(shape, -1.0, 1.0);
  d.grad = rounded(shape, -1.0, 1.0);
  d.weight = testing::random_uniform({c}, 0.5, 1.5, DType::f32);
  d.bias = testing::random_uniform({c}, -0.5, 0.5, DType::f32);
  d.running_mean = testing::random_uniform({c}, -0.5, 0.5, DType::f32);
  d.running_var = testing::random_uniform({c}, 0.5, 2.0, DType::f32);
  return d;
}

Tensor stat_on(const Tensor& t, Device device, DType stat) {
  return kernels::to_dtype(kernels::to_device(t, device), stat);
}

void check_case(DType dtype, const Shape& shape, const Variant& v, bool training) {
  SCOPED_TRACE(describe(dtype, shape, v) + (training ? " training" : " eval"));
  const Device gpu("cuda:0"), cpu;
  const Drawn d = draw(shape, dtype);
  // The GPU side in dtype, the CPU reference in f64 with f64 statistics.
  Tensor xg = moved(d.x, gpu, dtype, v.channels_last), xc = moved(d.x, cpu, DType::f64, v.channels_last);
  Tensor rg = v.residual ? moved(d.residual, gpu, dtype, v.channels_last) : Tensor();
  Tensor rc = v.residual ? moved(d.residual, cpu, DType::f64, v.channels_last) : Tensor();
  Tensor wg = stat_on(d.weight, gpu, DType::f32), bg = stat_on(d.bias, gpu, DType::f32);
  Tensor wc = stat_on(d.weight, cpu, DType::f64), bc = stat_on(d.bias, cpu, DType::f64);
  Tensor rmg = stat_on(d.running_mean, gpu, DType::f32), rvg = stat_on(d.running_var, gpu, DType::f32);
  Tensor rmc = stat_on(d.running_mean, cpu, DType::f64), rvc = stat_on(d.running_var, cpu, DType::f64);

  kernels::BatchNormForward fg = kernels::batch_norm(xg, wg, bg, rmg, rvg, training, 0.1, 1e-5, rg, v.relu);
  kernels::BatchNormForward fc = kernels::batch_norm(xc, wc, bc, rmc, rvc, training, 0.1, 1e-5, rc, v.relu);
  const double tol = tolerance(dtype);
  EXPECT_EQ(has_channels_last_strides(fg.out), v.channels_last);
  EXPECT_TRUE(all_close(host64(fg.out), fc.out, 2 * tol, 2 * tol)) << "output";
  EXPECT_TRUE(all_close(host64(rmg), rmc, 1e-5, 1e-5)) << "running mean";
  EXPECT_TRUE(all_close(host64(rvg), rvc, 1e-5, 1e-5)) << "running variance";
  if (!training) return;
  EXPECT_TRUE(all_close(host64(fg.save_mean), fc.save_mean, 1e-5, 1e-5)) << "batch mean";
  EXPECT_TRUE(all_close(host64(fg.save_invstd), fc.save_invstd, 1e-5, 1e-5)) << "batch invstd";

  // The backward on identical inputs: the GPU's statistics and output (its ReLU mask) on both sides.
  Tensor gg = moved(d.grad, gpu, dtype, v.channels_last), gc = moved(d.grad, cpu, DType::f64, v.channels_last);
  Tensor mean_c = host64(fg.save_mean), invstd_c = host64(fg.save_invstd);
  Tensor yg = v.relu ? fg.out : Tensor();
  Tensor yc = v.relu ? moved(host64(fg.out), cpu, DType::f64, v.channels_last) : Tensor();
  kernels::BatchNormBackward bg_ =
      kernels::batch_norm_backward(gg, xg, wg, fg.save_mean, fg.save_invstd, yg, v.residual);
  kernels::BatchNormBackward bc_ = kernels::batch_norm_backward(gc, xc, wc, mean_c, invstd_c, yc, v.residual);
  EXPECT_EQ(has_channels_last_strides(bg_.grad_input), v.channels_last);
  EXPECT_TRUE(all_close(host64(bg_.grad_input), bc_.grad_input, 4 * tol, 4 * tol)) << "input gradient";
  EXPECT_TRUE(all_close(host64(bg_.grad_weight), bc_.grad_weight, 1e-4, 1e-4)) << "weight gradient";
  EXPECT_TRUE(all_close(host64(bg_.grad_bias), bc_.grad_bias, 1e-4, 1e-4)) << "bias gradient";
  if (v.residual) {
    EXPECT_TRUE(all_close(host64(bg_.grad_residual), bc_.grad_residual, 0.0, 0.0)) << "residual gradient";
  }
}

const Variant kVariants[] = {{false, false, false}, {true, false, false}, {false, false, true}, {true, false, true},
                             {false, true, true},   {true, true, true},   {true, true, false}};

TEST(BatchNormActParity, SmallAndOddChannelsMatchCpu) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (const Shape& shape : {Shape{4, 3, 5, 5}, Shape{8, 20, 6, 6}, Shape{2, 64, 3, 3}, Shape{16, 40, 8, 8}}) {
      for (const Variant& v : kVariants) {
        for (bool training : {true, false}) check_case(dtype, shape, v, training);
      }
    }
  }
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

// ResNet-18's batch norms at batch 256 (CIFAR): a channel's statistics over up to 262144 values.
TEST(BatchNormActParity, ResNetShapesMatchCpu) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (DType dtype : {DType::bf16, DType::f32, DType::f16}) {
    for (const Shape& shape :
         {Shape{256, 64, 32, 32}, Shape{256, 128, 16, 16}, Shape{256, 256, 8, 8}, Shape{256, 512, 4, 4}}) {
      for (const Variant& v : {Variant{true, true, true}, Variant{true, false, true}, Variant{false, true, true}}) {
        check_case(dtype, shape, v, true);
      }
    }
  }
  check_case(DType::bf16, {256, 64, 32, 32}, Variant{true, true, true}, false);
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

// On the GPU the fused op gives the bits of batch_norm, add and relu run one after the other, and
// its backward those of relu's backward then batch norm's.
TEST(BatchNormActParity, FusedGivesTheBitsOfSeparateOpsOnTheGpu) {
  TANDEM_REQUIRE_CUDA();
  const Device gpu("cuda:0");
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (bool channels_last : {false, true}) {
      for (const Shape& shape : {Shape{8, 20, 6, 6}, Shape{64, 128, 16, 16}}) {
        SCOPED_TRACE(describe(dtype, shape, Variant{channels_last, true, true}));
        const Drawn d = draw(shape, dtype);
        Tensor x = moved(d.x, gpu, dtype, channels_last), r = moved(d.residual, gpu, dtype, channels_last);
        Tensor g = moved(d.grad, gpu, dtype, channels_last);
        Tensor w = stat_on(d.weight, gpu, DType::f32), b = stat_on(d.bias, gpu, DType::f32);
        Tensor rm1 = stat_on(d.running_mean, gpu, DType::f32), rv1 = stat_on(d.running_var, gpu, DType::f32);
        Tensor rm2 = kernels::clone(rm1), rv2 = kernels::clone(rv1);
        kernels::BatchNormForward fused = kernels::batch_norm(x, w, b, rm1, rv1, true, 0.1, 1e-5, r, true);
        kernels::BatchNormForward plain = kernels::batch_norm(x, w, b, rm2, rv2, true, 0.1, 1e-5);
        Tensor sum = kernels::binary(BinaryOp::add, plain.out, r);
        EXPECT_TRUE(all_close(host64(fused.out), host64(kernels::unary(UnaryOp::relu, sum)), 0.0, 0.0)) << "output";
        kernels::BatchNormBackward fb =
            kernels::batch_norm_backward(g, x, w, fused.save_mean, fused.save_invstd, fused.out, true);
        Tensor masked = kernels::unary_backward(UnaryOp::relu, g, sum);
        kernels::BatchNormBackward pb = kernels::batch_norm_backward(masked, x, w, plain.save_mean, plain.save_invstd);
        EXPECT_TRUE(all_close(host64(fb.grad_input), host64(pb.grad_input), 0.0, 0.0)) << "input gradient";
        EXPECT_TRUE(all_close(host64(fb.grad_weight), host64(pb.grad_weight), 0.0, 0.0)) << "weight gradient";
        EXPECT_TRUE(all_close(host64(fb.grad_bias), host64(pb.grad_bias), 0.0, 0.0)) << "bias gradient";
        EXPECT_TRUE(all_close(host64(fb.grad_residual), host64(masked), 0.0, 0.0)) << "residual gradient";
      }
    }
  }
}

// Two runs on the same inputs give the same bits: the partial sums are added in a fixed order.
TEST(BatchNormActParity, ChannelsLastIsDeterministic) {
  TANDEM_REQUIRE_CUDA();
  const Device gpu("cuda:0");
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Drawn d = draw({256, 64, 32, 32}, dtype);
    Tensor x = moved(d.x, gpu, dtype, true), r = moved(d.residual, gpu, dtype, true);
    Tensor g = moved(d.grad, gpu, dtype, true);
    Tensor w = stat_on(d.weight, gpu, DType::f32), b = stat_on(d.bias, gpu, DType::f32);
    std::vector<std::vector<Tensor>> runs;
    for (int k = 0; k < 2; ++k) {
      Tensor rm = stat_on(d.running_mean, gpu, DType::f32), rv = stat_on(d.running_var, gpu, DType::f32);
      kernels::BatchNormForward f = kernels::batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, r, true);
      kernels::BatchNormBackward bw = kernels::batch_norm_backward(g, x, w, f.save_mean, f.save_invstd, f.out, true);
      runs.push_back(
          {f.out, f.save_mean, f.save_invstd, rm, rv, bw.grad_input, bw.grad_weight, bw.grad_bias, bw.grad_residual});
    }
    for (size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_TRUE(all_close(host64(runs[0][i]), host64(runs[1][i]), 0.0, 0.0)) << "result " << i;
    }
  }
}

}  // namespace
}  // namespace tandem
