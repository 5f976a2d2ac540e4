// Scaled dot-product attention: a fused flash-attention kernel where one applies (CUDA: cuDNN's or
// tandem's own for bf16/f16, tandem's own for f32; core/attention.cpp routes), otherwise composed from matmul, masking and softmax, whose
// gradients follow from theirs.
#include <cmath>
#include <limits>

#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/views.h"

namespace tandem {

using autograd::record;
using autograd::saved;

namespace {

// (Tq, Tk) bool: true where key j lies after query i (j > i), the entries a causal mask hides.
Tensor causal_mask(int64_t tq, int64_t tk, Device device) {
  TensorOptions index_options(DType::f32, device);
  Tensor rows = reshape(arange(0.0, static_cast<double>(tq), 1.0, index_options), {tq, 1});
  Tensor cols = reshape(arange(0.0, static_cast<double>(tk), 1.0, index_options), {1, tk});
  return gt(cols, rows);
}

Tensor explicit_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal, double scale) {
  Tensor scores = mul(matmul(q, transpose(k, -2, -1)), scale);  // (B, H, Tq, Tk)
  if (is_causal) {
    scores = masked_fill(scores, causal_mask(q.shape()[2], k.shape()[2], q.device()),
                         -std::numeric_limits<double>::infinity());
  }
  return matmul(softmax(scores, -1), v);
}

double default_scale(const Tensor& q, double scale) {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.shape()[3]));
}

// q, k and v of a packed (B, T, 3 C) projection as (B, H, T, D) views, without autograd.
std::vector<Tensor> packed_heads(const Tensor& qkv, int64_t heads) {
  const int64_t B = qkv.shape()[0], T = qkv.shape()[1], C = qkv.shape()[2] / 3;
  Tensor split = views::permute(views::reshape(qkv, {B, T, 3, heads, C / heads}), {2, 0, 3, 1, 4});  // (3, B, H, T, D)
  std::vector<Tensor> out;
  for (int64_t i = 0; i < 3; ++i) out.push_back(views::squeeze(views::narrow(split, 0, i, 1), 0));
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal, double scale) {
  bool fused = kernels::fused_attention_available(q, k, v);  // also checks the shapes
  TANDEM_CHECK_AS(ValueError, !is_causal || q.shape()[2] == k.shape()[2],
                  "scaled_dot_product_attention: is_causal needs as many queries as keys, got Tq = ", q.shape()[2],
                  " and Tk = ", k.shape()[2]);
  double s = default_scale(q, scale);
  if (!fused) return explicit_attention(q, k, v, is_causal, s);

  kernels::AttentionForward f = kernels::fused_attention_forward(q, k, v, is_causal, s);
  // The backward keeps a detached alias of the output (keeping `out` itself would be a cycle).
  kernels::AttentionForward kept{saved(f.out), f.lse};
  return record(f.out, "scaled_dot_product_attention", {q, k, v},
                [q = saved(q), k = saved(k), v = saved(v), kept, is_causal, s](const Tensor& g) -> std::vector<Tensor> {
                  kernels::AttentionGrads grads = kernels::fused_attention_backward(g, q, k, v, kept, is_causal, s);
                  return {grads.q, grads.k, grads.v};
                });
}

Tensor packed_qkv_attention(const Tensor& qkv, int64_t n_head, bool is_causal, double scale) {
  TANDEM_CHECK_AS(ValueError, qkv.dim() == 3 && n_head > 0 && qkv.shape()[2] % (3 * n_head) == 0,
                  "packed_qkv_attention: qkv ", shape_str(qkv.shape()), " should be (B, T, 3 C) with C a multiple of ",
                  "n_head = ", n_head);
  const int64_t B = qkv.shape()[0], T = qkv.shape()[1], C = qkv.shape()[2] / 3;
  std::vector<Tensor> h = packed_heads(qkv, n_head);  // q, k, v: (B, H, T, D) views
  if (!kernels::fused_attention_available(h[0], h[1], h[2])) {
    // Composed from differentiable views and ops: the gradient of qkv follows from theirs.
    Tensor split = permute(reshape(qkv, {B, T, 3, n_head, C / n_head}), {2, 0, 3, 1, 4});  // (3, B, H, T, D)
    std::vector<Tensor> qkv_heads;
    for (int64_t i = 0; i < 3; ++i) qkv_heads.push_back(squeeze(narrow(split, 0, i, 1), 0));
    Tensor y = scaled_dot_product_attention(qkv_heads[0], qkv_heads[1], qkv_heads[2], is_causal, scale);
    return reshape(transpose(y, 1, 2), {B, T, C});
  }
  const double s = default_scale(h[0], scale);
  kernels::AttentionForward f = kernels::fused_attention_forward(h[0], h[1], h[2], is_causal, s);
  // f.out is (B, H, T, D) over (B, T, H, D) memory: the merged heads are a view.
  Tensor merged = views::view(views::transpose(f.out, 1, 2), {B, T, C});  // (B, T, C)
  kernels::AttentionForward kept{saved(f.out), f.lse};
  return record(merged, "packed_qkv_attention", {qkv},
                [qkv = saved(qkv), kept, n_head, is_causal, s, B, T, C](const Tensor& g) -> std::vector<Tensor> {
                  // The three gradients go straight into their thirds of one (B, T, 3 C) buffer.
                  Tensor grad = empty({B, T, 3 * C}, qkv.options());
                  std::vector<Tensor> h = packed_heads(qkv, n_head), gh = packed_heads(grad, n_head);
                  Tensor g_heads = views::transpose(views::reshape(g, {B, T, n_head, C / n_head}), 1, 2);  // (B, H, T, D)
                  kernels::fused_attention_backward_into(g_heads, h[0], h[1], h[2], kept, is_causal, s,
                                                         {gh[0], gh[1], gh[2]});
                  return {grad};
                });
}

}  // namespace tandem
