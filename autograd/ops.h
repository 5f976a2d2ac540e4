#pragma once
// The differentiable op API. Each op computes its forward through core kernels and, when an input
// requires grad, records its backward (autograd/ops/*.cpp keep the two side by side).
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "tandem/core/kernels.h"
#include "tandem/core/tensor.h"

namespace tandem {

class Generator;

// ---- elementwise (NumPy broadcasting; operands share dtype and device) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor maximum(const Tensor& a, const Tensor& b);  // ties split the gradient evenly
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& x, double exponent);
Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
enum class GeluApproximate { none, tanh };  // none: the exact erf form (PyTorch's default)
Tensor gelu(const Tensor& x, GeluApproximate approximate = GeluApproximate::none);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor silu(const Tensor& x);  // x * sigmoid(x)
// log(1 + exp(beta x)) / beta, and x where beta x > threshold (torch.nn.functional.softplus).
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
// Into [min, max]; either bound may be left out (std::nullopt), as in torch.clamp. The gradient is
// 1 inside the bounds (boundaries included) and 0 outside.
Tensor clamp(const Tensor& x, double min, double max);
Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max);
Tensor clamp_min(const Tensor& x, double min);
Tensor clamp_max(const Tensor& x, double max);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& x);

// Comparisons give bool tensors and carry no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor logical_not(const Tensor& x);

// cond ? a : b (cond is bool; all three broadcast).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// The lower (tril) or upper (triu) triangle of the last two dims, the rest zeroed: element (i, j)
// is kept where j - i <= diagonal (tril) or j - i >= diagonal (triu), as torch.tril / torch.triu.
Tensor tril(const Tensor& x, int64_t diagonal = 0);
Tensor triu(const Tensor& x, int64_t diagonal = 0);

// ---- reductions (empty dims: all of them) ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Largest / smallest values over dims; ties share the gradient evenly.
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
struct ValuesIndices {
  Tensor values;   // differentiable
  Tensor indices;  // i64
};
// Largest / smallest value along one dim and where it is (the first, on ties).
ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim = false);
ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x);  // over all elements, as a flat index
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), like torch.var.
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);

Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

enum class Reduction { mean, sum, none };
struct CrossEntropyOptions {
  Reduction reduction = Reduction::mean;
  int64_t ignore_index = -100;  // rows with this target add nothing (and are not counted in the mean)
  double label_smoothing = 0.0;
};
// Log-softmax and negative log-likelihood in one op: logits (N, C), target (N,) class indices.
// Half-precision logits give an f32 loss.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& options = {});

// ---- matrix product (NumPy matmul: 1-D operands promoted, batch dims broadcast) ----
Tensor matmul(const Tensor& a, const Tensor& b);
// A linear layer as one op: activation(x @ weight^T + bias) for x (..., in), weight (out, in),
// bias (out,) or undefined; the result is (..., out). Activation::gelu_tanh is GELU's tanh form.
// On CUDA the bias and the GELU run in cuBLASLt's epilogue (and the bias gradient comes out of
// the weight gradient's matmul); on the CPU they are composed.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              Activation activation = Activation::none);
// The transformer's MLP as one op: linear(gelu_tanh(linear(x, fc_weight, fc_bias)), proj_weight,
// proj_bias) for x (..., C), fc_weight (H, C), proj_weight (C', H). The same values as the two
// linear ops; one node, so that on CUDA GELU's backward runs in the epilogue of the matmul that
// makes its input gradient (cuBLASLt's DGELU, or tandem's sm_90 kernel) instead of as a pass of its
// own.
Tensor gelu_mlp(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias, const Tensor& proj_weight,
                const Tensor& proj_bias);
// Any number of linear layers with GELU (tanh) between them, as one op (the two-layer form above
// is this with two): layer i is linear(h_i, weights[i], biases[i]), followed by gelu_tanh except
// for the last; weights[i] (N_i, K_i) with K_0 = C and K_i = N_{i-1}; biases[i] (N_i,) or an
// undefined Tensor. The same values as the linear ops in a row, and each GELU's backward where
// the op above puts it.
Tensor gelu_mlp(const Tensor& x, const std::vector<Tensor>& weights, const std::vector<Tensor>& biases);

// ---- shape and views ----
Tensor reshape(const Tensor& x, const Shape& shape);  // a view when possible, else a copy
Tensor view(const Tensor& x, const Shape& shape);     // always a view; throws when impossible
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<int64_t>& order);
Tensor t(const Tensor& x);  // transpose of a 2-D tensor
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
// Elements start, start+step, ... below end along dim (negative start/end count from the end).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor squeeze(const Tensor& x, int64_t dim);
Tensor squeeze(const Tensor& x);
Tensor unsqueeze(const Tensor& x, int64_t dim);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor contiguous(const Tensor& x);
// x laid out in `format` (x itself when it already is, else a copy); the gradient goes back in
// x's own layout. to(x, format) is the same op, PyTorch's x.to(memory_format=...).
Tensor contiguous(const Tensor& x, MemoryFormat format);
Tensor to(const Tensor& x, MemoryFormat format);
Tensor clone(const Tensor& x);
Tensor to(const Tensor& x, DType dtype);
Tensor to(const Tensor& x, Device device);

// ---- convolution, pooling, normalisation (NCHW, as in torch.nn.functional) ----
// x (N, C, H, W), weight (K, C / groups, R, S), optional bias (K,).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dParams& params = {});
// stride < 0 means stride = kernel.
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0);
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride = -1, int64_t padding = 0,
                  bool count_include_pad = true);
// Average over windows that tile (H, W) into (out_h, out_w); H and W must divide evenly.
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);
// Normalises each channel of x (N, C, H, W), NCHW or channels-last (the output keeps x's layout).
// In training, uses and returns the batch statistics and updates running_mean / running_var in
// place (momentum as in PyTorch); in evaluation, uses the running statistics. weight, bias and
// running stats are (C,) in f32 (f64 for f64 input).
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);
// relu(batch_norm(x) + residual) as one op: the values of batch_norm, add and relu one after the
// other (residual optional, x's shape and dtype; relu optional). One node: its backward masks the
// gradient by the output (ReLU's backward), gives the residual that gradient and runs batch norm's
// backward; on CUDA one pass each way beyond the statistics. x may be channels-last (as batch_norm).
Tensor batch_norm_act(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                      const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5,
                      const Tensor& residual = Tensor(), bool relu = true);

// ---- other layers' functions ----
// Normalises over the last normalized_shape.size() dims (biased variance), then scales and
// shifts by weight and bias (shaped normalized_shape; either may be undefined).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps = 1e-5);
// The residual stream's add and the layer norm after it, as a transformer block has them:
// returns {x + residual, layer_norm(x + residual)}, the same values as add and layer_norm. On
// CUDA one kernel reads x and residual once and writes both (one add kernel fewer per layer norm).
// residual_bias (shaped normalized_shape), when given, is the bias of the linear layer that made
// residual, left out of that layer's matmul (Megatron's skip_bias_add): the sum is then
// x + (residual + residual_bias), and the bias's gradient, the sum's gradient summed over rows,
// comes out of layer norm's backward kernel instead of a bias-gradient kernel of the linear's.
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                                         const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                                         const Tensor& residual_bias = Tensor());
// A linear layer whose output joins the residual stream, and the layer norm after it: returns
// {sum, layer_norm(sum)} with sum = residual + x @ weight^T + bias, the values and gradients of
// add_layer_norm(linear(x, weight), residual, normalized_shape, norm_weight, norm_bias, eps, bias).
// On CUDA the add runs in the product's epilogue (residual and bias added in f32 and rounded
// once), so the layer's output is never stored apart from the sum and layer norm reads one tensor
// instead of two.
std::pair<Tensor, Tensor> linear_add_layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                const Tensor& residual, const Shape& normalized_shape,
                                                const Tensor& norm_weight, const Tensor& norm_bias,
                                                double eps = 1e-5);
// The same after the transformer's MLP: sum = residual + gelu_mlp(x, fc_weight, fc_bias,
// proj_weight, proj_bias), the add in the last product's epilogue on CUDA.
std::pair<Tensor, Tensor> gelu_mlp_add_layer_norm(const Tensor& x, const Tensor& fc_weight, const Tensor& fc_bias,
                                                  const Tensor& proj_weight, const Tensor& proj_bias,
                                                  const Tensor& residual, const Shape& normalized_shape,
                                                  const Tensor& norm_weight, const Tensor& norm_bias,
                                                  double eps = 1e-5);
// Rows of weight (V, D) picked by integer indices of any shape: result (..., D).
Tensor embedding(const Tensor& indices, const Tensor& weight);
// Zeroes each element with probability p and scales the rest by 1 / (1 - p) when training;
// the identity otherwise. Draws from `generator` (the default generator when null).
Tensor dropout(const Tensor& x, double p, bool training, Generator* generator = nullptr);
// Mean (or sum, or each) of (input - target)^2. 16-bit operands are computed in f32 and the result
// is f32, as torch.autocast runs mse_loss; the gradient comes back in input's dtype.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);

// Attention over q (B, H, Tq, D), k and v (B, H, Tk, D), any strides: softmax(q k^T * scale
// [+ causal mask]) v, shaped (B, H, Tq, D). scale 0 means 1 / sqrt(D). With is_causal, query i
// sees keys 0..i (Tq == Tk). On CUDA, bf16 and f16 run cuDNN's fused flash attention and f32 runs
// tandem's own (TF32 or 3xTF32 tensor cores, per the matmul precision); no T x T matrix is stored.
// f64, unsupported head dims and the CPU compute the attention matrix explicitly.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool is_causal = false,
                                    double scale = 0.0);
// Attention over a transformer block's packed projection: qkv (B, T, 3 C) holds q, k and v side by
// side, each C = n_head * D wide (GPT-2's c_attn output); returns (B, T, C), the heads merged. The
// same as splitting qkv into three (B, H, T, D) views, scaled_dot_product_attention, and merging,
// but on the fused paths the gradient of qkv is written in place, in one buffer, rather than
// assembled from three zero-padded gradients of the views.
Tensor packed_qkv_attention(const Tensor& qkv, int64_t n_head, bool is_causal = false, double scale = 0.0);

// ---- joining and indexing ----
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

}  // namespace tandem
