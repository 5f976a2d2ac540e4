// The residual add fused into CUDA layer norm (add_layer_norm) against the CPU in f64, both
// outputs and every gradient, on fresh random inputs in f32, bf16 and f16: GPT-2's width (16-byte
// loads, row in registers), an odd width (scalar loads) and a width past the registers (the
// streamed path, which re-reads the sum it wrote); with and without a residual bias (its gradient
// summed in layer norm's backward kernel). And on the GPU, the same bits as the adds then
// layer_norm.
#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

Tensor rounded(const Shape& shape, double low, double high, DType dtype) {
  return to(to(testing::random_uniform(shape, low, high, DType::f32), dtype), DType::f64);
}
Tensor on_gpu(const Tensor& t, DType dtype) { return to(to(t, dtype), Device("cuda")).requires_grad_(); }
Tensor on_cpu(const Tensor& t) { return to(to(t, Device("cpu")), DType::f64); }

// t's values rounded to dtype, with t's gradient (1).
Tensor round_values(const Tensor& t, DType dtype) { return add(t, sub(to(to(t, dtype), DType::f64), t).detach()); }

void check_case(DType dtype, int64_t rows, int64_t d, bool with_residual_bias) {
  SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " rows=" << rows << " D=" << d
                                    << (with_residual_bias ? " residual bias" : ""));
  Tensor x = rounded({2, rows, d}, -2.0, 2.0, dtype), residual = rounded({2, rows, d}, -1.0, 1.0, dtype);
  Tensor w = rounded({d}, 0.5, 1.5, dtype), b = rounded({d}, -1.0, 1.0, dtype);
  Tensor rb = rounded({d}, -0.5, 0.5, dtype);
  Tensor dir_sum = rounded({2, rows, d}, -1.0, 1.0, dtype), dir_norm = rounded({2, rows, d}, -1.0, 1.0, dtype);

  std::vector<Tensor> cpu{x.detach().requires_grad_(), residual.detach().requires_grad_(), w.detach().requires_grad_(),
                          b.detach().requires_grad_()};
  if (with_residual_bias) cpu.push_back(rb.detach().requires_grad_());
  // The reference: each add rounded to the dtype (as the GPU's are), then layer norm, in f64.
  Tensor branch = with_residual_bias ? round_values(add(cpu[1], cpu[4]), dtype) : cpu[1];
  Tensor s_ref = add(cpu[0], branch);
  Tensor s_rounded = round_values(s_ref, dtype);
  Tensor n_ref = layer_norm(s_rounded, {d}, cpu[2], cpu[3], 1e-5);
  add(sum(mul(s_ref, dir_sum)), sum(mul(n_ref, dir_norm))).backward();

  std::vector<Tensor> gpu{on_gpu(x, dtype), on_gpu(residual, dtype), on_gpu(w, dtype), on_gpu(b, dtype)};
  if (with_residual_bias) gpu.push_back(on_gpu(rb, dtype));
  auto [s, n] = add_layer_norm(gpu[0], gpu[1], {d}, gpu[2], gpu[3], 1e-5,
                               with_residual_bias ? gpu[4] : Tensor());
  ASSERT_TRUE(n.device().is_cuda());
  auto as_f32 = [](const Tensor& t) { return to(to(t, DType::f32), Device("cuda")); };
  add(sum(mul(to(s, DType::f32), as_f32(dir_sum))), sum(mul(to(n, DType::f32), as_f32(dir_norm)))).backward();

  const double tol = dtype == DType::bf16 ? 1.6e-2 : dtype == DType::f16 ? 2e-3 : 2e-5;
  const double sum_tol = dtype == DType::bf16 ? 2e-2 : dtype == DType::f16 ? 4e-3 : 1e-4;
  EXPECT_TRUE(testing::all_close(on_cpu(s), s_rounded, 0.0, 0.0)) << "sum";
  EXPECT_TRUE(testing::all_close(on_cpu(n), n_ref, tol, tol)) << "normalised";
  const char* names[] = {"x", "residual", "weight", "bias", "residual bias"};
  for (size_t i = 0; i < cpu.size(); ++i) {
    // The residual bias's gradient sums the sum's gradient, itself rounded, over every row.
    const double t = i < 2 ? 2 * tol : i < 4 ? sum_tol : 2 * sum_tol;
    EXPECT_TRUE(testing::all_close(on_cpu(gpu[i].grad()), cpu[i].grad(), t, t)) << "gradient of " << names[i];
  }
}

TEST(AddLayerNormParity, MatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (bool with_residual_bias : {false, true}) {
      check_case(dtype, 32, 768, with_residual_bias);  // GPT-2's width
      check_case(dtype, 17, 101, with_residual_bias);  // odd: scalar loads
      check_case(dtype, 5, 3000, with_residual_bias);  // wider than the registers hold: streamed
    }
    check_case(dtype, 700, 768, true);  // many rows: the short-row backward's partial column sums
  }
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

// One kernel gives the bits of those it replaces: the adds' sum and layer_norm of it.
TEST(AddLayerNormParity, SameBitsAsAddThenLayerNormOnTheGpu) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t d : {768, 101, 3000}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " D=" << d);
      Tensor x = to(to(testing::random_tensor({3, 9, d}), dtype), Device("cuda"));
      Tensor residual = to(to(testing::random_tensor({3, 9, d}), dtype), Device("cuda"));
      Tensor w = to(to(testing::random_tensor({d}), dtype), Device("cuda"));
      Tensor b = to(to(testing::random_tensor({d}), dtype), Device("cuda"));
      auto [s, n] = add_layer_norm(x, residual, {d}, w, b, 1e-5);
      Tensor s2 = add(x, residual);
      EXPECT_TRUE(testing::all_close(on_cpu(s), on_cpu(s2), 0.0, 0.0)) << "sum";
      EXPECT_TRUE(testing::all_close(on_cpu(n), on_cpu(layer_norm(s2, {d}, w, b, 1e-5)), 0.0, 0.0)) << "normalised";
      Tensor rb = to(to(testing::random_tensor({d}), dtype), Device("cuda"));
      auto [sb, nb] = add_layer_norm(x, residual, {d}, w, b, 1e-5, rb);
      Tensor sb2 = add(x, add(residual, rb));
      EXPECT_TRUE(testing::all_close(on_cpu(sb), on_cpu(sb2), 0.0, 0.0)) << "sum with the residual bias";
      EXPECT_TRUE(testing::all_close(on_cpu(nb), on_cpu(layer_norm(sb2, {d}, w, b, 1e-5)), 0.0, 0.0))
          << "normalised with the residual bias";
    }
  }
}

}  // namespace
}  // namespace tandem
