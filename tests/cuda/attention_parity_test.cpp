// cuDNN's fused attention against the CPU's explicit attention, forward and all three gradients,
// on fresh random inputs: GPT-2's head size, causal and not, q/k/v as strided views of one packed
// projection (the layout a GPT block hands over), f16 and bf16.
#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

struct AttentionCase {
  DType dtype;
  bool causal;
  int64_t batch, heads, tokens, head_dim;
};

// Heads of a packed (B, T, 3, H, D) tensor, each (B, H, T, D).
std::vector<Tensor> split_heads(const Tensor& packed) {
  std::vector<Tensor> heads;
  for (int64_t i = 0; i < 3; ++i) heads.push_back(permute(squeeze(narrow(packed, 2, i, 1), 2), {0, 2, 1, 3}));
  return heads;
}

void check_case(const AttentionCase& c) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << (c.causal ? " causal" : " full") << " B=" << c.batch
                                  << " H=" << c.heads << " T=" << c.tokens << " D=" << c.head_dim);
  Shape packed_shape{c.batch, c.tokens, 3, c.heads, c.head_dim};
  Shape out_shape{c.batch, c.heads, c.tokens, c.head_dim};
  // Inputs rounded to the test dtype first, so both sides see the same numbers.
  Tensor packed_cpu = to(to(testing::random_tensor(packed_shape, DType::f32), c.dtype), DType::f32);
  Tensor weight_cpu = to(to(testing::random_tensor(out_shape, DType::f32), c.dtype), DType::f32);

  Tensor packed_gpu = to(to(packed_cpu, c.dtype), Device("cuda")).requires_grad_();
  std::vector<Tensor> h = split_heads(packed_gpu);
  ASSERT_TRUE(kernels::fused_attention_available(h[0], h[1], h[2]));
  Tensor out_gpu = scaled_dot_product_attention(h[0], h[1], h[2], c.causal);
  sum(mul(to(out_gpu, DType::f32), to(weight_cpu, Device("cuda")))).backward();

  Tensor packed_ref = to(packed_cpu, DType::f64).requires_grad_();
  std::vector<Tensor> r = split_heads(packed_ref);
  Tensor out_ref = scaled_dot_product_attention(r[0], r[1], r[2], c.causal);
  sum(mul(out_ref, to(weight_cpu, DType::f64))).backward();

  double rtol = c.dtype == DType::bf16 ? 2e-2 : 4e-3;
  EXPECT_TRUE(testing::all_close(to(to(out_gpu, Device("cpu")), DType::f64), out_ref, rtol, rtol * 0.1)) << "output";
  EXPECT_TRUE(testing::all_close(to(to(packed_gpu.grad(), Device("cpu")), DType::f64), packed_ref.grad(), rtol * 2,
                                 rtol * 0.2))
      << "gradient of the packed q/k/v";
}

TEST(AttentionParity, FusedMatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (bool causal : {true, false}) check_case({dtype, causal, 2, 3, 128, 64});
  }
  check_case({DType::bf16, true, 1, 2, 200, 32});  // a length that is no multiple of the tile
}

TEST(AttentionParity, F32TakesTheExplicitPathOnCuda) {
  TANDEM_REQUIRE_CUDA();
  Tensor q = to(testing::random_tensor({1, 2, 16, 8}, DType::f32), Device("cuda"));
  EXPECT_FALSE(kernels::fused_attention_available(q, q, q));
  Tensor out = scaled_dot_product_attention(q, q, q, true);
  Tensor ref = scaled_dot_product_attention(to(q, Device("cpu")), to(q, Device("cpu")), to(q, Device("cpu")), true);
  EXPECT_TRUE(testing::all_close(to(out, Device("cpu")), ref, 1e-5, 1e-6));
}

}  // namespace
}  // namespace tandem
