// The squared-error loss whose forward also writes the gradient (a differentiated scalar loss), on
// the GPU: the gradient has the CPU's bits (both compute 2 * (unit * (input - target)) in the same
// type and round once), the loss matches it to rounding, in every dtype but f16 (which keeps the
// composed ops), for sizes with and without a tail past the 16-byte vectors and for unaligned views;
// the loss of 16-bit operands is f32.
#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

Tensor on_gpu(const Tensor& t) { return to(t, Device("cuda")); }
Tensor on_cpu_f64(const Tensor& t) { return to(to(t, Device("cpu")), DType::f64); }

// The loss is f32 for bf16 inputs (autocast's rule), summed in another order than the CPU's.
double loss_tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 1e-5; }

TEST(SquaredErrorWithGrad, MatchesTheCpu) {
  TANDEM_REQUIRE_CUDA();
  const std::vector<Shape> shapes = {{1024, 1024}, {1000, 1003}, {3, 7}, {1}};
  for (DType dtype : {DType::f32, DType::bf16, DType::f64}) {
    for (const Shape& shape : shapes) {
      for (bool offset : {false, true}) {  // a view one element in: no 16-byte loads
        for (Reduction reduction : {Reduction::mean, Reduction::sum}) {
          SCOPED_TRACE(shape_str(shape) + " " + dtype_name(dtype) + (offset ? " unaligned" : "") +
                       (reduction == Reduction::mean ? " mean" : " sum"));
          const int64_t n = shape_numel(shape);
          Tensor input_all = to(testing::random_uniform({n + 1}, -3.0, 3.0), dtype);
          Tensor target_all = to(testing::random_uniform({n + 1}, -3.0, 3.0), dtype);
          const int64_t start = offset ? 1 : 0;
          Tensor input = views::reshape(views::narrow(input_all, 0, start, n), shape);
          Tensor target = views::reshape(views::narrow(target_all, 0, start, n), shape);

          Tensor cpu = input.detach().requires_grad_();
          Tensor cpu_loss = mse_loss(cpu, target, reduction);
          cpu_loss.backward();

          Tensor gpu_all = on_gpu(input_all);
          Tensor gpu = views::reshape(views::narrow(gpu_all, 0, start, n), shape).detach().requires_grad_();
          Tensor gpu_target = on_gpu(target);
          Tensor loss = mse_loss(gpu, gpu_target, reduction);
          loss.backward();
          const double tol = loss_tolerance(dtype);
          EXPECT_EQ(loss.dtype(), dtype == DType::bf16 ? DType::f32 : dtype);
          EXPECT_TRUE(testing::all_close(on_cpu_f64(loss), on_cpu_f64(cpu_loss), tol, tol)) << "loss";
          EXPECT_TRUE(testing::all_close(on_cpu_f64(gpu.grad()), on_cpu_f64(cpu.grad()), 0, 0)) << "gradient";
          {
            NoGradGuard no_grad;  // no gradient to prepare: the composed ops, the same loss to rounding
            EXPECT_TRUE(testing::all_close(on_cpu_f64(mse_loss(gpu, gpu_target, reduction)), on_cpu_f64(loss), tol,
                                           tol))
                << "loss without grad";
          }
          // An upstream gradient of 2.5 scales the saved gradient once, in the compute type.
          const DType stat = dtype == DType::f64 ? DType::f64 : DType::f32;
          Tensor expected = to(mul(to(gpu.grad(), stat), 2.5), dtype);
          gpu.set_grad(Tensor());
          mul(mse_loss(gpu, gpu_target, reduction), 2.5).backward();
          EXPECT_TRUE(testing::all_close(on_cpu_f64(gpu.grad()), on_cpu_f64(expected), 0, 0)) << "scaled";
        }
      }
    }
  }
}

// 16-bit operands on the GPU: an f32 loss, and the gradient's bits those of the ops on operands
// converted to f32 first (bf16 through the fused kernel, f16 through the composed ops).
TEST(SquaredErrorWithGrad, SixteenBitOperandsAreTakenInF32) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (Reduction reduction : {Reduction::mean, Reduction::sum}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (reduction == Reduction::mean ? " mean" : " sum"));
      Tensor input = on_gpu(to(testing::random_uniform({1024, 1024}, -3.0, 3.0), dtype)).requires_grad_();
      Tensor target = on_gpu(to(testing::random_uniform({1024, 1024}, -3.0, 3.0), dtype));
      Tensor loss = mse_loss(input, target, reduction);
      EXPECT_EQ(loss.dtype(), DType::f32);
      loss.backward();
      Tensor grad = input.grad();
      input.set_grad(Tensor());
      Tensor converted = mse_loss(to(input, DType::f32), to(target, DType::f32), reduction);
      converted.backward();
      EXPECT_EQ(input.grad().dtype(), dtype);
      EXPECT_TRUE(testing::all_close(on_cpu_f64(grad), on_cpu_f64(input.grad()), 0, 0)) << "gradient";
      EXPECT_TRUE(testing::all_close(on_cpu_f64(loss), on_cpu_f64(converted), 1e-5, 1e-5)) << "loss";
    }
  }
}

// The same inputs give the same bits run after run (a fixed order of the partial sums).
TEST(SquaredErrorWithGrad, IsReproducible) {
  TANDEM_REQUIRE_CUDA();
  Tensor input = on_gpu(testing::random_uniform({4096, 257}, -1.0, 1.0));
  Tensor target = on_gpu(testing::random_uniform({4096, 257}, -1.0, 1.0));
  kernels::SquaredErrorWithGrad first = kernels::squared_error_with_grad(input, target, true);
  for (int run = 0; run < 3; ++run) {
    kernels::SquaredErrorWithGrad again = kernels::squared_error_with_grad(input, target, true);
    EXPECT_TRUE(testing::all_close(on_cpu_f64(again.loss), on_cpu_f64(first.loss), 0, 0));
    EXPECT_TRUE(testing::all_close(on_cpu_f64(again.grad), on_cpu_f64(first.grad), 0, 0));
  }
}

}  // namespace
}  // namespace tandem
