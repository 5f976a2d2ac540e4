// The fused CUDA layer norm against the CPU's, forward and all three gradients, on fresh random
// inputs: GPT-2's width (the vectorised, register-resident path), an odd width (the scalar
// path), a width past the shared-memory budget of the backward (the column-sum path), at most
// 128 rows (the backward's one-launch path for few rows) and just past that, rows split over 2,
// 3, 4, 6 and 8 warps (fewer rows than 16 an SM), thousands of rows (several per warp in the
// short-row backward), and the optional weight and bias left out.
#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

struct LayerNormCase {
  DType dtype;
  int64_t rows, d;
  bool with_weight, with_bias;
  bool second_use = false;  // x used again after the norm: its gradient folded into the backward
};

Tensor rounded(const Shape& shape, double low, double high, DType dtype) {
  return to(to(testing::random_uniform(shape, low, high, DType::f32), dtype), DType::f64);
}

Tensor on_gpu(const Tensor& t, DType dtype) { return to(to(t, dtype), Device("cuda")).requires_grad_(); }
Tensor on_cpu(const Tensor& t) { return to(to(t, Device("cpu")), DType::f64); }

void check_case(const LayerNormCase& c) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " rows=" << c.rows << " D=" << c.d
                                    << (c.with_weight ? " weight" : "") << (c.with_bias ? " bias" : "")
                                    << (c.second_use ? " second use" : ""));
  // Inputs rounded to the test dtype first, so both sides see the same numbers; a non-zero mean
  // per row, as activations have.
  Tensor x = add(rounded({c.rows, c.d}, -2.0, 2.0, c.dtype), rounded({c.rows, 1}, -1.0, 1.0, c.dtype));
  x = to(to(x, c.dtype), DType::f64);
  Tensor w = c.with_weight ? rounded({c.d}, 0.5, 1.5, c.dtype) : Tensor();
  Tensor b = c.with_bias ? rounded({c.d}, -1.0, 1.0, c.dtype) : Tensor();
  Tensor direction = rounded({c.rows, c.d}, -1.0, 1.0, c.dtype);
  Tensor direction2 = rounded({c.rows, c.d}, -1.0, 1.0, c.dtype);  // the second use's gradient

  Tensor xr = x.detach().requires_grad_();
  Tensor wr = w.defined() ? w.detach().requires_grad_() : Tensor();
  Tensor br = b.defined() ? b.detach().requires_grad_() : Tensor();
  Tensor ref = layer_norm(xr, {c.d}, wr, br, 1e-5);
  Tensor ref_loss = sum(mul(ref, direction));
  if (c.second_use) ref_loss = add(ref_loss, sum(mul(xr, direction2)));
  ref_loss.backward();

  Tensor xg = on_gpu(x, c.dtype);
  Tensor wg = w.defined() ? on_gpu(w, c.dtype) : Tensor();
  Tensor bg = b.defined() ? on_gpu(b, c.dtype) : Tensor();
  Tensor got = layer_norm(xg, {c.d}, wg, bg, 1e-5);
  ASSERT_TRUE(got.device().is_cuda());
  ASSERT_EQ(got.dtype(), c.dtype);
  Tensor loss = sum(mul(to(got, DType::f32), to(to(direction, DType::f32), Device("cuda"))));
  if (c.second_use) loss = add(loss, sum(mul(to(xg, DType::f32), to(to(direction2, DType::f32), Device("cuda")))));
  loss.backward();

  const double tol = c.dtype == DType::bf16 ? 1.6e-2 : c.dtype == DType::f16 ? 2e-3 : 2e-5;
  EXPECT_TRUE(testing::all_close(on_cpu(got), ref, tol, tol)) << "output";
  EXPECT_TRUE(testing::all_close(on_cpu(xg.grad()), xr.grad(), 2 * tol, 2 * tol)) << "gradient of x";
  // The parameter gradients sum over every row: allow for the rounding of a long sum.
  const double sum_tol = c.dtype == DType::bf16 ? 2e-2 : c.dtype == DType::f16 ? 4e-3 : 1e-4;
  if (w.defined())
    EXPECT_TRUE(testing::all_close(on_cpu(wg.grad()), wr.grad(), sum_tol, sum_tol)) << "gradient of weight";
  if (b.defined())
    EXPECT_TRUE(testing::all_close(on_cpu(bg.grad()), br.grad(), sum_tol, sum_tol)) << "gradient of bias";
}

TEST(LayerNormParity, MatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (DType dtype : {DType::f32, DType::bf16}) {
    check_case({dtype, 64, 768, true, true});  // GPT-2's width: 16-byte loads, row in registers
    check_case({dtype, 37, 100, true, true});  // not a multiple of 8: scalar loads in bf16
    check_case({dtype, 20, 101, true, true});  // odd: scalar loads in every dtype
    check_case({dtype, 5, 3000, true, true});  // wider than the registers hold: the streamed path
    check_case({dtype, 9, 8192, true, true});  // wider than the backward's shared slices: column sums
    check_case({dtype, 33, 768, false, false});
    check_case({dtype, 33, 100, true, false});
    check_case({dtype, 33, 768, false, true});
    check_case({dtype, 64, 768, true, true, true});
    check_case({dtype, 37, 100, true, true, true});
    check_case({dtype, 5, 3000, true, false, true});
    check_case({dtype, 9, 8192, true, true, true});
    check_case({dtype, 128, 768, true, true});         // the most rows the few-rows backward takes (16 bits)
    check_case({dtype, 129, 768, true, true, true});   // one more: partial rows, then their sum
    check_case({dtype, 100, 384, true, false, true});  // few rows in f32 too (384 fits its registers)
    check_case({dtype, 128, 256, false, true});
    // Rows split over warps (fewer than 16 rows an SM): 2 to 8 warps a row, a last warp not
    // full (640), and more rows than the backward's blocks take at once (2000 on 132 SMs).
    check_case({dtype, 300, 512, true, true});
    check_case({dtype, 200, 1024, true, false, true});
    check_case({dtype, 150, 640, false, true});
    check_case({dtype, 257, 1536, true, true, true});
    check_case({dtype, 90, 2048, true, true});
    check_case({dtype, 2000, 768, true, true, true});
    // Many rows: every warp of the short-row backward takes several rows, and the blocks' partial
    // sums are added by the second kernel. One, two and three 16-byte vectors per lane.
    check_case({dtype, 6000, 768, true, true, true});
    check_case({dtype, 4500, 512, true, false});
    check_case({dtype, 3001, 200, false, true, true});
  }
  check_case({DType::f16, 64, 768, true, true});
  check_case({DType::f16, 64, 768, true, true, true});
  check_case({DType::f16, 128, 768, true, false, true});
  check_case({DType::f16, 5000, 768, true, true, true});
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

TEST(LayerNormParity, ParameterGradientsAreTheSameEveryRun) {
  TANDEM_REQUIRE_CUDA();
  for (int64_t rows : {4096, 1024, 128}) {  // short rows, rows split over warps, the few-rows path
    SCOPED_TRACE(::testing::Message() << "rows=" << rows);
    Tensor x = to(testing::random_tensor({rows, 768}, DType::f32), DType::bf16);
    Tensor g = to(testing::random_tensor({rows, 768}, DType::f32), DType::bf16);
    Tensor w = to(testing::random_uniform({768}, 0.5, 1.5, DType::f32), DType::bf16);
    x = to(x, Device("cuda"));
    g = to(g, Device("cuda"));
    w = to(w, Device("cuda"));
    kernels::LayerNormForward f = kernels::layer_norm_forward(x, w, Tensor(), 1e-5);
    kernels::LayerNormGrads first = kernels::layer_norm_backward(g, x, w, f.mean, f.rstd, true);
    kernels::LayerNormGrads second = kernels::layer_norm_backward(g, x, w, f.mean, f.rstd, true);
    EXPECT_TRUE(testing::all_close(on_cpu(first.weight), on_cpu(second.weight), 0, 0));
    EXPECT_TRUE(testing::all_close(on_cpu(first.bias), on_cpu(second.bias), 0, 0));
  }
}

// The backward's column sums of dx (add_layer_norm's residual-bias gradient): the same dx bits as
// without them, the sums equal to dx's own rows added in f64, and the same bits every run. Few
// rows (the one-launch path, its row blocks' partial sums then added), rows split over warps,
// many rows in 16-byte vectors, rows in shared slices, rows too wide for them (summed again from
// dx), scalar rows.
TEST(LayerNormParity, ColumnSumsOfTheInputGradient) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  struct Case {
    DType dtype;
    int64_t rows, d;
  };
  for (const Case& c : {Case{DType::bf16, 64, 768}, Case{DType::f32, 100, 384}, Case{DType::f16, 128, 256},
                        Case{DType::bf16, 5000, 768}, Case{DType::f16, 3001, 512}, Case{DType::f32, 700, 384},
                        Case{DType::f32, 300, 1024}, Case{DType::bf16, 40, 9000}, Case{DType::f32, 33, 101},
                        Case{DType::f64, 50, 96}, Case{DType::bf16, 1500, 768}, Case{DType::bf16, 333, 2048}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << " rows=" << c.rows << " D=" << c.d);
    auto fresh = [&](double low, double high) {
      return to(to(testing::random_uniform({c.rows, c.d}, low, high, DType::f64), c.dtype), Device("cuda"));
    };
    Tensor x = fresh(-2.0, 2.0), g = fresh(-1.0, 1.0), pending = fresh(-0.5, 0.5);
    Tensor w = to(to(testing::random_uniform({c.d}, 0.5, 1.5, DType::f64), c.dtype), Device("cuda"));
    kernels::LayerNormForward f = kernels::layer_norm_forward(x, w, Tensor(), 1e-5);
    kernels::LayerNormGrads plain = kernels::layer_norm_backward(g, x, w, f.mean, f.rstd, true, pending);
    kernels::LayerNormGrads summed = kernels::layer_norm_backward(g, x, w, f.mean, f.rstd, true, pending, true);
    kernels::LayerNormGrads again = kernels::layer_norm_backward(g, x, w, f.mean, f.rstd, true, pending, true);
    ASSERT_TRUE(summed.x_column_sum.defined());
    EXPECT_EQ(summed.x_column_sum.shape(), (Shape{c.d}));
    EXPECT_EQ(summed.x_column_sum.dtype(), c.dtype);
    EXPECT_TRUE(testing::all_close(on_cpu(summed.x), on_cpu(plain.x), 0, 0)) << "dx";
    const double tol = c.dtype == DType::bf16 ? 1e-2 : c.dtype == DType::f16 ? 2e-3 : 1e-5;
    EXPECT_TRUE(testing::all_close(on_cpu(summed.weight), on_cpu(plain.weight), tol, tol)) << "weight";
    EXPECT_TRUE(testing::all_close(on_cpu(summed.bias), on_cpu(plain.bias), tol, tol)) << "bias";
    Tensor expected = sum(on_cpu(summed.x), {0});  // (D,) in f64
    EXPECT_TRUE(testing::all_close(on_cpu(summed.x_column_sum), expected, tol, tol)) << "dx's column sums";
    EXPECT_TRUE(testing::all_close(on_cpu(again.x_column_sum), on_cpu(summed.x_column_sum), 0, 0)) << "run to run";
  }
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

}  // namespace
}  // namespace tandem
