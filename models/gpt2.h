#pragma once
// GPT-2 (the 124M configuration by default), as nanoGPT defines it: token and position
// embeddings, pre-LayerNorm blocks of causal self-attention and a GELU (tanh) MLP, a final
// LayerNorm and an output head tied to the token embedding (logits = x wte^T, one parameter).
// Initialisation as nanoGPT: N(0, 0.02) for linear and embedding weights, N(0, 0.02 / sqrt(2 L))
// for the residual projections (c_proj), zero biases, LayerNorm eps 1e-5.
//
// Parameter names match bench/reference/train_step.py's PyTorch model, so state dicts move
// between the two as safetensors without a mapping: wte.weight, wpe.weight,
// h.<i>.ln_1.{weight,bias}, h.<i>.attn.c_attn.{weight,bias}, h.<i>.attn.c_proj.{weight,bias},
// h.<i>.ln_2.{weight,bias}, h.<i>.mlp.c_fc.{weight,bias}, h.<i>.mlp.c_proj.{weight,bias},
// ln_f.{weight,bias}.
#include <memory>

#include "tandem/layers/layers.h"
#include "tandem/layers/module.h"

namespace tandem::models {

struct GPT2Config {
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_embd = 768;
  int64_t vocab_size = 50304;  // GPT-2's 50257 padded to a multiple of 64
  int64_t block_size = 1024;   // longest sequence (positions in wpe)
};

// Multi-head causal self-attention: one projection to q, k, v (c_attn), attention, c_proj.
class CausalSelfAttention : public nn::Module {
 public:
  CausalSelfAttention(const GPT2Config& config, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  // {residual + forward(x), ln(that)}, the residual add in c_proj's epilogue on CUDA
  // (linear_add_layer_norm): x, residual (B, T, C) -> two (B, T, C).
  std::pair<Tensor, Tensor> forward_add_norm(const Tensor& x, const Tensor& residual, nn::LayerNorm& ln);
  std::shared_ptr<nn::Linear> c_attn;        // C -> 3 C
  std::shared_ptr<nn::Linear> c_proj;        // C -> C
  int64_t n_head;

 protected:
  std::string type_name() const override { return "CausalSelfAttention"; }

 private:
  Tensor attend(const Tensor& x);  // (B, T, C) -> the heads' outputs, merged, before c_proj: (B, T, C)
};

// C -> 4 C, GELU (tanh), 4 C -> C.
class GPT2MLP : public nn::Module {
 public:
  GPT2MLP(const GPT2Config& config, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  // {residual + forward(x), ln(that)}, the residual add in c_proj's epilogue on CUDA
  // (gelu_mlp_add_layer_norm): x, residual (B, T, C) -> two (B, T, C).
  std::pair<Tensor, Tensor> forward_add_norm(const Tensor& x, const Tensor& residual, nn::LayerNorm& ln);
  std::shared_ptr<nn::Linear> c_fc, c_proj;

 protected:
  std::string type_name() const override { return "GPT2MLP"; }
};

// x + attn(ln_1(x)), then + mlp(ln_2(.)).
class GPT2Block : public nn::Module {
 public:
  GPT2Block(const GPT2Config& config, TensorOptions options = {});
  Tensor forward(const Tensor& x) override;  // (B, T, C) -> (B, T, C)
  // The same block inside GPT2::forward: x and ln_1(x) in, {out, next_ln(out)} out, each residual
  // add and the bias of the c_proj before it in that c_proj's epilogue, and the bias's gradient
  // from the layer norm's backward kernel after it (linear_add_layer_norm).
  std::pair<Tensor, Tensor> forward_residual(const Tensor& x, const Tensor& x_normed, nn::LayerNorm& next_ln);
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<GPT2MLP> mlp;

 protected:
  std::string type_name() const override { return "GPT2Block"; }
};

class GPT2 : public nn::Module {
 public:
  explicit GPT2(const GPT2Config& config = {}, TensorOptions options = {});
  // idx (B, T) integer token ids, T <= block_size -> logits (B, T, vocab_size).
  Tensor forward(const Tensor& idx) override;
  // Mean cross-entropy of logits (B, T, V) against targets (B, T) token ids; f32 for any dtype.
  static Tensor loss(const Tensor& logits, const Tensor& targets);

  GPT2Config config;
  std::shared_ptr<nn::Embedding> wte;  // (V, C), also the output head
  std::shared_ptr<nn::Embedding> wpe;  // (block_size, C)
  std::shared_ptr<nn::Sequential> h;   // n_layer GPT2Blocks, named h.0, h.1, ...
  std::shared_ptr<nn::LayerNorm> ln_f;

 protected:
  std::string type_name() const override { return "GPT2"; }
};

}  // namespace tandem::models
