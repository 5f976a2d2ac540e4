#pragma once
// Fused attention (device-neutral side, core/attention.cpp).
#include "tandem/core/tensor.h"

namespace tandem::kernels {

// ---- fused attention (core/attention.cpp), CUDA only: cuDNN's flash attention for bf16/f16,
// tandem's own flash-attention kernels for f32 ----
// q (B, H, Tq, D), k and v (B, H, Tk, D) with any strides. Whether the fused path takes them
// (otherwise scaled_dot_product_attention computes the attention matrix explicitly).
bool fused_attention_available(const Tensor& q, const Tensor& k, const Tensor& v);
struct AttentionForward {
  Tensor out;  // (B, H, Tq, D), a view of (B, Tq, H, D) memory, so merging the heads is free
  Tensor lse;  // (B, H, Tq, 1) f32: log-sum-exp of each query's scaled, masked scores
};
AttentionForward fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale);
struct AttentionGrads {
  Tensor q, k, v;  // shaped like the inputs, in (B, T, H, D) memory
};
AttentionGrads fused_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionForward& forward, bool causal, double scale);
// The same into given tensors shaped like q, k and v (e.g. views into one packed gradient): written
// in place where their last stride is 1 and their rows 16-byte aligned, else copied there.
void fused_attention_backward_into(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionForward& forward, bool causal, double scale,
                                   const AttentionGrads& grads);

}  // namespace tandem::kernels
