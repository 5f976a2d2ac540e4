// tandem's 16-bit flash-attention kernels (bf16, f16), forced with set_attention_kernels(flash):
// against the CPU's explicit attention in f64 (output, log-sum-exp, gradients of the packed q/k/v)
// on fresh random inputs, the same bits on every run, and next to cuDNN's kernels where the build
// has them.
#include <cmath>
#include <cstdio>

#include "support/test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

// Sets which kernels run 16-bit attention for the scope.
class AttentionKernelsScope {
 public:
  explicit AttentionKernelsScope(cuda::AttentionKernels k) : previous_(cuda::attention_kernels()) {
    cuda::set_attention_kernels(k);
  }
  ~AttentionKernelsScope() { cuda::set_attention_kernels(previous_); }

 private:
  cuda::AttentionKernels previous_;
};

// Heads of a packed (B, T, 3C) projection, each (B, H, T, D): strided views, as GPT-2 hands them over.
std::vector<Tensor> split_packed(const Tensor& packed, int64_t heads) {
  const int64_t b = packed.shape()[0], t = packed.shape()[1], d = packed.shape()[2] / (3 * heads);
  Tensor x = view(packed, {b, t, 3, heads, d});
  std::vector<Tensor> out;
  for (int64_t i = 0; i < 3; ++i) out.push_back(permute(squeeze(narrow(x, 2, i, 1), 2), {0, 2, 1, 3}));
  return out;
}

// Log-sum-exp of each query's scaled, masked scores: (B, H, Tq, 1), f64 on the CPU.
Tensor reference_lse(const Tensor& q, const Tensor& k, bool causal, double scale) {
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), scale);  // (B, H, Tq, Tk)
  if (causal) {
    const int64_t t = q.shape()[2];
    Tensor future = triu(ones({t, t}, TensorOptions(DType::boolean)), 1);  // (T, T) keys after the query
    scores = masked_fill(scores, future, -INFINITY);
  }
  Tensor top = amax(scores, {-1}, true);
  return add(top, log(sum(exp(sub(scores, top)), {-1}, true)));
}

struct Case {
  DType dtype;
  bool causal;
  int64_t batch, heads, tokens, head_dim;
};

double tolerance(DType dtype) { return dtype == DType::bf16 ? 2e-2 : 4e-3; }

void check_case(const Case& c) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dtype) << (c.causal ? " causal" : " full") << " B=" << c.batch
                                  << " H=" << c.heads << " T=" << c.tokens << " D=" << c.head_dim);
  const int64_t width = c.heads * c.head_dim;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  // Inputs rounded to the test dtype first, so both sides see the same numbers.
  Tensor packed_cpu = to(to(testing::random_tensor({c.batch, c.tokens, 3 * width}, DType::f32), c.dtype), DType::f64);
  Tensor weight_cpu = to(to(testing::random_tensor({c.batch, c.heads, c.tokens, c.head_dim}, DType::f32), c.dtype),
                         DType::f64);

  Tensor packed_gpu = to(to(packed_cpu, c.dtype), Device("cuda")).requires_grad_();
  std::vector<Tensor> h = split_packed(packed_gpu, c.heads);
  ASSERT_TRUE(kernels::fused_attention_available(h[0], h[1], h[2]));
  Tensor out_gpu = scaled_dot_product_attention(h[0], h[1], h[2], c.causal);
  sum(mul(to(out_gpu, DType::f32), to(to(weight_cpu, DType::f32), Device("cuda")))).backward();
  kernels::AttentionForward forward =
      kernels::fused_attention_forward(h[0].detach(), h[1].detach(), h[2].detach(), c.causal, scale);

  Tensor packed_ref = packed_cpu.detach().requires_grad_();
  std::vector<Tensor> r = split_packed(packed_ref, c.heads);
  Tensor out_ref = scaled_dot_product_attention(r[0], r[1], r[2], c.causal);
  sum(mul(out_ref, weight_cpu)).backward();
  Tensor lse_ref = reference_lse(r[0].detach(), r[1].detach(), c.causal, scale);

  const double rtol = tolerance(c.dtype);
  EXPECT_TRUE(testing::all_close(to(to(out_gpu, Device("cpu")), DType::f64), out_ref, rtol, rtol * 0.1)) << "output";
  EXPECT_TRUE(testing::all_close(to(to(forward.out, Device("cpu")), DType::f64), out_ref, rtol, rtol * 0.1))
      << "output of the forward alone";
  EXPECT_TRUE(testing::all_close(to(to(forward.lse, Device("cpu")), DType::f64), lse_ref, 1e-3, 1e-3))
      << "log-sum-exp";
  EXPECT_TRUE(testing::all_close(to(to(packed_gpu.grad(), Device("cpu")), DType::f64), packed_ref.grad(), rtol * 2,
                                 rtol * 0.2))
      << "gradient of the packed q/k/v";
}

TEST(AttentionHalfFlash, MatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  AttentionKernelsScope scope(cuda::AttentionKernels::flash);
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (bool causal : {true, false}) {
      for (int64_t head_dim : {64, 128}) {
        for (int64_t tokens : {1, 17, 64, 128}) check_case({dtype, causal, 2, 3, tokens, head_dim});
        check_case({dtype, causal, 1, 2, 1000, head_dim});  // GPT-2's length, no multiple of a tile
      }
      check_case({dtype, causal, 2, 2, 77, 40});  // a head dim padded to 64
      check_case({dtype, causal, 1, 3, 50, 8});   // the narrowest head, padded to 32
    }
  }
}

// The backward recomputes rather than adding with atomics: the same inputs give the same bits.
TEST(AttentionHalfFlash, GradientsAreDeterministic) {
  TANDEM_REQUIRE_CUDA();
  AttentionKernelsScope scope(cuda::AttentionKernels::flash);
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor packed = to(to(testing::random_tensor({2, 300, 3 * 4 * 64}, DType::f32), dtype), Device("cuda"));
    Tensor direction = to(to(testing::random_tensor({2, 4, 300, 64}, DType::f32), dtype), Device("cuda"));
    std::vector<Tensor> outs, grads;
    for (int run = 0; run < 2; ++run) {
      Tensor x = packed.detach().requires_grad_();
      std::vector<Tensor> h = split_packed(x, 4);
      Tensor out = scaled_dot_product_attention(h[0], h[1], h[2], true);
      sum(mul(to(out, DType::f32), to(direction, DType::f32))).backward();
      outs.push_back(to(out, Device("cpu")));
      grads.push_back(to(x.grad(), Device("cpu")));
    }
    EXPECT_TRUE(testing::all_close(outs[0], outs[1], 0, 0)) << "output";
    EXPECT_TRUE(testing::all_close(grads[0], grads[1], 0, 0)) << "gradient";
  }
}

// Where the build has cuDNN's fused attention, both kernels give the same results within 16-bit
// tolerance, and either backward accepts the other forward's log-sum-exp.
TEST(AttentionHalfFlash, AgreesWithCudnn) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (bool causal : {true, false}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << (causal ? " causal" : " full"));
      Tensor packed = to(to(testing::random_tensor({2, 200, 3 * 3 * 64}, DType::f32), dtype), Device("cuda"));
      Tensor grad = to(to(testing::random_tensor({2, 3, 200, 64}, DType::f32), dtype), Device("cuda"));
      std::vector<Tensor> h = split_packed(packed, 3);
      if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "built without cuDNN's frontend";
      kernels::AttentionForward f[2];
      kernels::AttentionGrads g[2];
      const cuda::AttentionKernels which[2] = {cuda::AttentionKernels::flash, cuda::AttentionKernels::cudnn};
      for (int i = 0; i < 2; ++i) {
        AttentionKernelsScope scope(which[i]);
        f[i] = kernels::fused_attention_forward(h[0], h[1], h[2], causal, 0.125);
        g[i] = kernels::fused_attention_backward(grad, h[0], h[1], h[2], f[i], causal, 0.125);
      }
      const double rtol = tolerance(dtype);
      auto close = [&](const Tensor& a, const Tensor& b, double tol) {
        return testing::all_close(to(to(a, Device("cpu")), DType::f64), to(to(b, Device("cpu")), DType::f64), tol,
                                  tol * 0.1);
      };
      EXPECT_TRUE(close(f[0].out, f[1].out, rtol)) << "output";
      EXPECT_TRUE(close(f[0].lse, f[1].lse, 1e-3)) << "log-sum-exp";
      EXPECT_TRUE(close(g[0].q, g[1].q, 2 * rtol)) << "dq";
      EXPECT_TRUE(close(g[0].k, g[1].k, 2 * rtol)) << "dk";
      EXPECT_TRUE(close(g[0].v, g[1].v, 2 * rtol)) << "dv";
      // tandem's backward from cuDNN's forward.
      AttentionKernelsScope scope(cuda::AttentionKernels::flash);
      kernels::AttentionGrads mixed = kernels::fused_attention_backward(grad, h[0], h[1], h[2], f[1], causal, 0.125);
      EXPECT_TRUE(close(mixed.q, g[1].q, 2 * rtol)) << "dq from cuDNN's forward";
      EXPECT_TRUE(close(mixed.v, g[1].v, 2 * rtol)) << "dv from cuDNN's forward";
    }
  }
}

// Asking for cuDNN's kernels in a build without them is an error that says so.
TEST(AttentionHalfFlash, CudnnAskedForWithoutFrontendIsAnError) {
  TANDEM_REQUIRE_CUDA();
  Tensor q = to(to(testing::random_tensor({1, 2, 16, 64}, DType::f32), DType::bf16), Device("cuda"));
  if (cuda::cudnn_attention_built()) GTEST_SKIP() << "built with cuDNN's frontend";
  AttentionKernelsScope scope(cuda::AttentionKernels::cudnn);
  EXPECT_THROW(kernels::fused_attention_forward(q, q, q, true, 0.125), DeviceError);
}

}  // namespace
}  // namespace tandem
