#include "tandem/models/gpt2.h"

#include <cmath>
#include <tuple>

#include "tandem/autograd/grad_mode.h"
#include "tandem/core/random.h"

namespace tandem::models {

namespace {
// Overwrites a parameter's values in place (the handle, and so every holder of it, is kept).
void init_normal(const Tensor& p, double std) {
  NoGradGuard no_grad;
  kernels::copy_(p, normal(p.shape(), 0.0, std, p.options()));
}
void init_zeros(const Tensor& p) {
  NoGradGuard no_grad;
  kernels::copy_(p, zeros(p.shape(), p.options()));
}
// nanoGPT's initialisation of a linear layer: N(0, std) weight, zero bias.
std::shared_ptr<nn::Linear> make_linear(int64_t in, int64_t out, double std, TensorOptions options,
                                        Activation activation = Activation::none) {
  auto linear = std::make_shared<nn::Linear>(in, out, activation, true, options);
  init_normal(linear->weight, std);
  init_zeros(linear->bias);
  return linear;
}
constexpr double kInitStd = 0.02;
double residual_std(const GPT2Config& config) { return kInitStd / std::sqrt(2.0 * config.n_layer); }
}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPT2Config& config, TensorOptions options) : n_head(config.n_head) {
  TANDEM_CHECK_AS(ValueError, config.n_head > 0 && config.n_embd % config.n_head == 0,
                  "GPT2: n_embd ", config.n_embd, " must be a multiple of n_head ", config.n_head);
  c_attn = register_module("c_attn", make_linear(config.n_embd, 3 * config.n_embd, kInitStd, options));
  c_proj = register_module("c_proj", make_linear(config.n_embd, config.n_embd, residual_std(config), options));
}

Tensor CausalSelfAttention::attend(const Tensor& x) {
  TANDEM_CHECK_AS(ValueError, x.dim() == 3, "CausalSelfAttention: input ", shape_str(x.shape()),
                  " should be (B, T, C)");
  Tensor qkv = (*c_attn)(x);                                       // (B, T, 3 C): q, k, v side by side
  return packed_qkv_attention(qkv, n_head, /*is_causal=*/true);  // (B, T, C), heads merged
}

Tensor CausalSelfAttention::forward(const Tensor& x) { return (*c_proj)(attend(x)); }

std::pair<Tensor, Tensor> CausalSelfAttention::forward_add_norm(const Tensor& x, const Tensor& residual,
                                                                nn::LayerNorm& ln) {
  return linear_add_layer_norm(attend(x), c_proj->weight, c_proj->bias, residual, ln.normalized_shape, ln.weight,
                               ln.bias, ln.eps);
}

GPT2MLP::GPT2MLP(const GPT2Config& config, TensorOptions options) {
  // GELU (tanh) runs in c_fc's matmul epilogue on CUDA.
  c_fc = register_module("c_fc", make_linear(config.n_embd, 4 * config.n_embd, kInitStd, options, Activation::gelu_tanh));
  c_proj = register_module("c_proj", make_linear(4 * config.n_embd, config.n_embd, residual_std(config), options));
}

Tensor GPT2MLP::forward(const Tensor& x) {
  // (B, T, C) -> gelu_tanh(x W_fc^T + b_fc) (B, T, 4 C) -> (B, T, C), as one op so that GELU's
  // backward runs in a matmul's epilogue on CUDA.
  return gelu_mlp(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias);
}

std::pair<Tensor, Tensor> GPT2MLP::forward_add_norm(const Tensor& x, const Tensor& residual, nn::LayerNorm& ln) {
  return gelu_mlp_add_layer_norm(x, c_fc->weight, c_fc->bias, c_proj->weight, c_proj->bias, residual,
                                 ln.normalized_shape, ln.weight, ln.bias, ln.eps);
}

GPT2Block::GPT2Block(const GPT2Config& config, TensorOptions options) {
  ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(Shape{config.n_embd}, 1e-5, options));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(config, options));
  ln_2 = register_module("ln_2", std::make_shared<nn::LayerNorm>(Shape{config.n_embd}, 1e-5, options));
  mlp = register_module("mlp", std::make_shared<GPT2MLP>(config, options));
}

Tensor GPT2Block::forward(const Tensor& x) {
  auto [y, y_normed] = ln_2->forward_with_residual(x, (*attn)((*ln_1)(x)));  // (B, T, C) each
  return add(y, (*mlp)(y_normed));                                             // (B, T, C)
}

std::pair<Tensor, Tensor> GPT2Block::forward_residual(const Tensor& x, const Tensor& x_normed, nn::LayerNorm& next_ln) {
  auto [y, y_normed] = attn->forward_add_norm(x_normed, x, *ln_2);  // (B, T, C) each
  return mlp->forward_add_norm(y_normed, y, next_ln);                // (B, T, C) each
}

GPT2::GPT2(const GPT2Config& cfg, TensorOptions options) : config(cfg) {
  TANDEM_CHECK_AS(ValueError, config.n_layer > 0 && config.vocab_size > 0 && config.block_size > 0,
                  "GPT2: n_layer, vocab_size and block_size must be positive, got ", config.n_layer, ", ",
                  config.vocab_size, ", ", config.block_size);
  wte = register_module("wte", std::make_shared<nn::Embedding>(config.vocab_size, config.n_embd, options));
  wpe = register_module("wpe", std::make_shared<nn::Embedding>(config.block_size, config.n_embd, options));
  init_normal(wte->weight, kInitStd);
  init_normal(wpe->weight, kInitStd);
  h = register_module("h", std::make_shared<nn::Sequential>());
  for (int64_t i = 0; i < config.n_layer; ++i) h->push_back(std::make_shared<GPT2Block>(config, options));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(Shape{config.n_embd}, 1e-5, options));
}

Tensor GPT2::forward(const Tensor& idx) {
  TANDEM_CHECK_AS(ValueError, idx.dim() == 2 && !is_floating(idx.dtype()), "GPT2: input ", shape_str(idx.shape()),
                  " ", dtype_name(idx.dtype()), " should be (B, T) integer token ids");
  const int64_t B = idx.size(0), T = idx.size(1), C = config.n_embd;
  TANDEM_CHECK_AS(ValueError, T <= config.block_size, "GPT2: sequence of ", T, " tokens, longer than block_size ",
                  config.block_size);
  Tensor pos = arange(T, TensorOptions(DType::i64, idx.device()));  // (T,)
  Tensor x = add((*wte)(idx), (*wpe)(pos));                          // (B, T, C)
  // The residual stream and its normalised copy travel together, so that every residual add runs
  // in the epilogue of the c_proj before it, and the layer norm that follows it (the next block's
  // ln_1, or ln_f after the last block) reads only the sum.
  auto block = [&](size_t i) { return std::static_pointer_cast<GPT2Block>((*h)[i]); };
  Tensor normed = (*block(0)->ln_1)(x);  // (B, T, C)
  for (size_t i = 0; i < h->size(); ++i) {
    nn::LayerNorm& next_ln = i + 1 < h->size() ? *block(i + 1)->ln_1 : *ln_f;
    std::tie(x, normed) = block(i)->forward_residual(x, normed, next_ln);
  }
  x = normed;  // ln_f of the residual stream: (B, T, C)
  // The output head is the token embedding: logits = x wte^T, on the transposed view.
  Tensor logits = matmul(reshape(x, {B * T, C}), t(wte->weight));  // (B T, V)
  return view(logits, {B, T, config.vocab_size});                  // (B, T, V)
}

Tensor GPT2::loss(const Tensor& logits, const Tensor& targets) {
  TANDEM_CHECK_AS(ValueError, logits.dim() == 3 && targets.shape() == Shape({logits.size(0), logits.size(1)}),
                  "GPT2::loss: logits ", shape_str(logits.shape()), " and targets ", shape_str(targets.shape()),
                  " should be (B, T, V) and (B, T)");
  const int64_t rows = logits.size(0) * logits.size(1);
  return cross_entropy(view(logits, {rows, logits.size(2)}), reshape(targets, {rows}));  // () f32
}

}  // namespace tandem::models
