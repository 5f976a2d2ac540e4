// Scaled dot-product attention: cuDNN's fused flash attention where it applies (CUDA, bf16/f16),
// otherwise composed from matmul, masking and softmax, whose gradients follow from theirs.
#include <cmath>
#include <limits>

#include "tandem/autograd/node.h"
#include "tandem/autograd/ops.h"

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

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal, double scale) {
  bool fused = kernels::fused_attention_available(q, k, v);  // also checks the shapes
  TANDEM_CHECK_AS(ValueError, !is_causal || q.shape()[2] == k.shape()[2],
                  "scaled_dot_product_attention: is_causal needs as many queries as keys, got Tq = ", q.shape()[2],
                  " and Tk = ", k.shape()[2]);
  double s = scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(q.shape()[3]));
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

}  // namespace tandem
