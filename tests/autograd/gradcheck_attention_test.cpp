// scaled_dot_product_attention on the CPU: its forward against attention written out with loops,
// and finite-difference gradient checks (causal and not, Tq != Tk, strided views of packed q/k/v).
#include <cmath>
#include <vector>

#include "gradcheck_util.h"
#include "tandem/core/cuda_api.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;

// out[b,h,i,:] = sum_j softmax_j(scale q_i . k_j) v_j, keys j > i masked when causal; f64 loops.
std::vector<double> attention_by_loops(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  const Shape& s = q.shape();
  int64_t B = s[0], H = s[1], Tq = s[2], D = s[3], Tk = k.shape()[2];
  Tensor qc = contiguous(to(q, DType::f64)), kc = contiguous(to(k, DType::f64)), vc = contiguous(to(v, DType::f64));
  const double *Q = qc.data<double>(), *K = kc.data<double>(), *V = vc.data<double>();
  std::vector<double> out(static_cast<size_t>(B * H * Tq * D), 0.0);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    for (int64_t i = 0; i < Tq; ++i) {
      int64_t visible = causal ? i + 1 : Tk;
      std::vector<double> p(static_cast<size_t>(visible));
      double top = -INFINITY, total = 0.0;
      for (int64_t j = 0; j < visible; ++j) {
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += Q[(bh * Tq + i) * D + d] * K[(bh * Tk + j) * D + d];
        p[j] = dot * scale;
        top = std::max(top, p[j]);
      }
      for (double& x : p) total += (x = std::exp(x - top));
      for (int64_t j = 0; j < visible; ++j)
        for (int64_t d = 0; d < D; ++d) out[(bh * Tq + i) * D + d] += p[j] / total * V[(bh * Tk + j) * D + d];
    }
  }
  return out;
}

TEST(Attention, ForwardMatchesLoops) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Tensor q = testing::random_tensor({2, 3, 5, 4}), k = testing::random_tensor({2, 3, 5, 4}),
           v = testing::random_tensor({2, 3, 5, 4});
    Tensor out = scaled_dot_product_attention(q, k, v, causal);
    EXPECT_EQ(out.shape(), (Shape{2, 3, 5, 4}));
    EXPECT_TRUE(testing::all_close(out, attention_by_loops(q, k, v, causal, 0.5), 1e-12, 1e-12));
  }
  // More keys than queries, an explicit scale, f32.
  Tensor q = testing::random_tensor({1, 2, 3, 8}, DType::f32), k = testing::random_tensor({1, 2, 6, 8}, DType::f32),
         v = testing::random_tensor({1, 2, 6, 8}, DType::f32);
  Tensor out = scaled_dot_product_attention(q, k, v, false, 0.3);
  EXPECT_TRUE(testing::all_close(out, attention_by_loops(q, k, v, false, 0.3), 1e-5, 1e-6));
}

TEST(GradcheckAttention, FullAndCausal) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    auto q = random_leaf({2, 2, 4, 3}), k = random_leaf({2, 2, 4, 3}), v = random_leaf({2, 2, 4, 3});
    EXPECT_GRADCHECK([causal](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2], causal); },
                     (Inputs{q, k, v}));
  }
}

TEST(GradcheckAttention, MoreKeysThanQueriesAndScale) {
  auto q = random_leaf({1, 2, 3, 4}), k = random_leaf({1, 2, 5, 4}), v = random_leaf({1, 2, 5, 4});
  EXPECT_GRADCHECK([](const Inputs& x) { return scaled_dot_product_attention(x[0], x[1], x[2], false, 0.7); },
                   (Inputs{q, k, v}));
}

// q, k and v as strided views of one packed (B, T, 3, H, D) projection, as a GPT block makes them.
TEST(GradcheckAttention, ViewsOfAPackedProjection) {
  auto qkv = random_leaf({2, 4, 3 * 2 * 3});  // (B, T, 3 * H * D) with H = 2, D = 3
  EXPECT_GRADCHECK(
      [](const Inputs& x) {
        Tensor packed = view(x[0], {2, 4, 3, 2, 3});
        auto head = [&](int64_t i) { return permute(squeeze(narrow(packed, 2, i, 1), 2), {0, 2, 1, 3}); };
        Tensor y = scaled_dot_product_attention(head(0), head(1), head(2), true);  // (B, H, T, D)
        return reshape(transpose(y, 1, 2), {2, 4, 6});
      },
      (Inputs{qkv}));
}

TEST(GradcheckAttention, PackedQkv) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    auto qkv = random_leaf({2, 4, 3 * 2 * 3});  // (B, T, 3 C) with H = 2, D = 3
    EXPECT_GRADCHECK([causal](const Inputs& x) { return packed_qkv_attention(x[0], 2, causal); }, (Inputs{qkv}));
  }
}

// packed_qkv_attention is the split, attend and merge of the test above, value for value.
TEST(Attention, PackedQkvEqualsSplitAttendMerge) {
  Tensor qkv = testing::random_tensor({2, 5, 3 * 4 * 2});  // H = 4, D = 2
  Tensor packed = view(qkv, {2, 5, 3, 4, 2});
  auto head = [&](int64_t i) { return permute(squeeze(narrow(packed, 2, i, 1), 2), {0, 2, 1, 3}); };
  Tensor split = reshape(transpose(scaled_dot_product_attention(head(0), head(1), head(2), true, 0.4), 1, 2), {2, 5, 8});
  EXPECT_TRUE(testing::all_close(packed_qkv_attention(qkv, 4, true, 0.4), split, 0, 0));
}

TEST(Attention, PackedQkvRejectsBadShapes) {
  Tensor qkv = testing::random_tensor({2, 5, 24});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { packed_qkv_attention(qkv, 5); }, {"(B, T, 3 C)", "n_head = 5"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { packed_qkv_attention(view(qkv, {10, 24}), 2); },
                                               {"packed_qkv_attention", "[10, 24]"}));
}

TEST(Attention, RejectsMismatchedShapes) {
  Tensor q = testing::random_tensor({1, 2, 3, 4}), k = testing::random_tensor({1, 2, 5, 4});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { scaled_dot_product_attention(q, k, k, true); },
                                               {"is_causal", "Tq = 3", "Tk = 5"}));
  Tensor bad = testing::random_tensor({1, 3, 5, 4});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { scaled_dot_product_attention(q, bad, bad); },
                                               {"batch, heads and head dim"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { scaled_dot_product_attention(view(q, {2, 3, 4}), k, k); },
                                               {"(B, H, T, D)"}));
}

}  // namespace
}  // namespace tandem
