#pragma once
// Device-neutral kernels: the non-differentiable compute layer under autograd. Each function
// checks its arguments, allocates the output, and hands contiguous or strided views to the
// backend of the inputs' device (core/cpu/ or core/cuda/, see core/backend.h).
#include <cmath>
#include <cstdint>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem {

enum class UnaryOp {
  neg, abs, exp, log, sqrt, rsqrt, tanh, sigmoid, relu, gelu_tanh, gelu_erf, sign,
  pow_scalar,  // x ^ alpha
  clamp,       // min(max(x, alpha), beta)
  scale,       // x * alpha
  logical_not,
};

enum class BinaryOp {
  add, sub, mul, div, pow, maximum, minimum,
  eq, ne, lt, le, gt, ge,      // produce bool
  relu_backward,               // a * (b > 0): a is the incoming gradient, b the input
  gelu_tanh_backward,          // a * gelu_tanh'(b)
  gelu_erf_backward,           // a * gelu_erf'(b)
};

enum class ReduceOp { sum, mean, max, min, argmax, argmin };

enum class RandomKind { uniform, normal, bernoulli };

// The activation a fused linear layer applies to x @ W^T + b (gelu_tanh: GELU's tanh form).
enum class Activation { none, gelu_tanh };

// 2-D convolution over NCHW tensors, as in torch.nn.functional.conv2d.
struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
};

enum class PoolMode { max, average };
// 2-D pooling over NCHW tensors, as in torch.nn.functional.max_pool2d / avg_pool2d.
struct Pool2dParams {
  PoolMode mode = PoolMode::max;
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // average pooling: divide by the full window, padding included
};

// One SGD step, PyTorch's rule: g = grad + weight_decay * p; with momentum, buf = g on the first
// step and buf = momentum * buf + (1 - dampening) * g after it; g = nesterov ? g + momentum * buf
// : buf; p -= lr * g.
struct SgdHyper {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool first_step = false;  // the momentum buffers hold nothing yet: they are set to g, not read
};

// One AdamW step, PyTorch's rule: p *= 1 - lr * weight_decay; m = beta1 m + (1 - beta1) g;
// v = beta2 v + (1 - beta2) g^2; p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), where
// bc1 = 1 - beta1^t and bc2 = 1 - beta2^t for the parameter's step t (its step count + 1).
struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

// The tensors of one fused optimizer update, one entry per parameter in every list.
// - grads: the parameter's dtype and shape.
// - states: [role][parameter], contiguous, in optimizer_state_dtype(): SGD's momentum buffers
//   (one role, or none when the momentum is 0), AdamW's exp_avg and exp_avg_sq.
// - steps (AdamW): 0-dim f32 step counts, read on the device (the bias corrections use count + 1)
//   and incremented by the update, so a skipped step leaves them as they were.
// - masters: empty, or f32 master weights (undefined where a parameter has none). With one, the
//   update reads and writes the master in f32 and stores it rounded into the parameter.
// - found_inf, inv_scale (GradScaler): 0-dim f32 tensors on the parameters' device, or
//   undefined. When *found_inf != 0 the update changes nothing, decided on the device; otherwise
//   every gradient is multiplied by *inv_scale as it is read.
struct UpdateTensors {
  std::vector<Tensor> params, grads;
  std::vector<std::vector<Tensor>> states;
  std::vector<Tensor> steps;
  std::vector<Tensor> masters;
  Tensor found_inf, inv_scale;
};

// The dtype of optimizer state (momentum, moments): f32 for 16-bit parameters, else theirs.
inline DType optimizer_state_dtype(DType param) { return is_half(param) ? DType::f32 : param; }

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);
const char* reduce_op_name(ReduceOp op);
bool is_comparison(BinaryOp op);
// Ops defined only for floating-point dtypes (exp, div, the activation gradients, ...).
bool is_floating_only(UnaryOp op);
bool is_floating_only(BinaryOp op);

namespace kernels {

Tensor unary(UnaryOp op, const Tensor& x, double alpha = 0.0, double beta = 0.0);
// Broadcasts a and b (NumPy rules); both must share dtype and device.
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// cond (bool) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// Reduces `dims` (empty: all); argmax/argmin take exactly one dim (or none: over the flattened
// tensor) and return i64.
Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
// Sums a broadcast gradient back down to `shape` (the inverse of expanding shape to grad's).
Tensor sum_to(const Tensor& grad, const Shape& shape);

Tensor softmax(const Tensor& x, int64_t dim, bool log);
// Gradient of softmax (log=false) or log_softmax (log=true) from its output y.
Tensor softmax_backward(const Tensor& grad, const Tensor& y, int64_t dim, bool log);

// Cross-entropy of logits (N, C) against class indices (N,) (i64 or i32). Returns per-row losses
// (N,) (0 where the target is ignore_index) and per-row log-sum-exp (N,) (f32 for half logits).
struct CrossEntropyForward {
  Tensor losses;  // (N,)
  Tensor lse;     // (N,)
};
CrossEntropyForward cross_entropy_forward(const Tensor& logits, const Tensor& target, int64_t ignore_index,
                                          double label_smoothing);
// d(sum_i w_i * loss_i)/d logits, with per-row weights `row_grad` (N,).
Tensor cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse,
                              const Tensor& row_grad, int64_t ignore_index, double label_smoothing);

// Matrix product with NumPy matmul semantics: 1-D operands are promoted, batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
// out (shaped like x's input) gets zeros plus src rows added at index along dim.
Tensor index_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
Tensor scatter_add(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim);

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

// ---- layer norm (core/layer_norm.cpp) ----
// Normalises each row over x's last dim D (biased variance), then scales by weight and shifts by
// bias, both (D,) in x's dtype or undefined. mean and rstd are (rows,) with rows = numel / D, in
// f32 (f64 for f64 x); rstd = 1 / sqrt(var + eps).
struct LayerNormForward {
  Tensor out;   // like x
  Tensor mean;  // (rows,)
  Tensor rstd;  // (rows,)
};
LayerNormForward layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps);
struct LayerNormGrads {
  Tensor x;       // like x
  Tensor weight;  // (D,), undefined when weight is
  Tensor bias;    // (D,), undefined unless with_bias
};
LayerNormGrads layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,
                                   const Tensor& rstd, bool with_bias);

// ---- linear layer (core/linear.cpp): out = act(x @ weight^T + bias) ----
// x (..., K), weight (N, K), bias (N,) or undefined. On CUDA, cuBLASLt adds the bias and applies
// the activation in the matmul's epilogue; elsewhere matmul, add and gelu are composed.
struct LinearForward {
  Tensor out;  // (..., N)
  Tensor pre;  // (..., N): the pre-activation x @ W^T + b when act != none, else undefined
};
LinearForward linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act);
struct LinearGrads {
  Tensor x;       // like x, when asked for
  Tensor weight;  // (N, K), when asked for
  Tensor bias;    // (N,), when asked for
};
// pre is LinearForward::pre (needed when act != none); x is needed only for the weight's gradient.
LinearGrads linear_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& pre,
                            Activation act, bool need_x, bool need_weight, bool need_bias);

// ---- convolution, pooling, batch norm (NCHW) ----
// x (N, C, H, W), weight (K, C / groups, R, S) -> (N, K, P, Q). No bias: add it by broadcasting.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Conv2dParams& params);
Tensor conv2d_backward_input(const Tensor& grad_out, const Tensor& weight, const Shape& input_shape,
                             const Conv2dParams& params);
Tensor conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Shape& weight_shape,
                              const Conv2dParams& params);
Tensor pool2d(const Tensor& x, const Pool2dParams& params);
Tensor pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Pool2dParams& params);

// Batch norm over (N, H, W) per channel of x (N, C, H, W). weight, bias, running stats: (C,) in
// f32 (f64 for f64 inputs). In training the batch statistics normalise and update the running
// ones (running = (1 - momentum) * running + momentum * batch, with the unbiased variance).
struct BatchNormForward {
  Tensor out;         // like x
  Tensor save_mean;   // (C,) batch mean (training) or empty
  Tensor save_invstd; // (C,) 1 / sqrt(batch var + eps) (training) or empty
};
BatchNormForward batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, bool training, double momentum, double eps);
struct BatchNormBackward {
  Tensor grad_input, grad_weight, grad_bias;
};
BatchNormBackward batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight,
                                      const Tensor& save_mean, const Tensor& save_invstd);

// Copies src into dst elementwise (same shape; casts dtype; any strides; any devices).
void copy_(const Tensor& dst, const Tensor& src);
void fill_(const Tensor& dst, double value);
Tensor contiguous(const Tensor& x);  // x itself if already contiguous
Tensor clone(const Tensor& x);       // always a fresh contiguous copy
Tensor to_dtype(const Tensor& x, DType dtype);    // x itself if already that dtype
Tensor to_device(const Tensor& x, Device device);  // x itself if already there

// Fills `out` (contiguous) from the counter-based generator: element i draws from counter
// offset + i under key seed, so every device produces the same numbers.
void random_(const Tensor& out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2);

// In-place updates used by optimizers and gradient accumulation (no autograd).
void add_(const Tensor& dst, const Tensor& src, double alpha = 1.0);  // dst += alpha * src
void mul_(const Tensor& dst, double value);                            // dst *= value

// Fused optimizer updates over lists of tensors, in place (see SgdHyper, AdamWHyper,
// UpdateTensors). Parameters may have different dtypes and devices (one fused update per device
// and dtype) and any layout.
void sgd_step(const UpdateTensors& t, const SgdHyper& h);
void adamw_step(const UpdateTensors& t, const AdamWHyper& h);

// GradScaler's kernels. non_finite_check_and_unscale_ sets found_inf (0-dim f32) to 1 when any
// element of `grads` is inf or NaN (it never clears it), and multiplies every gradient in place by
// inv_scale (0-dim f32) unless inv_scale is undefined. update_scale_ applies PyTorch's dynamic
// loss scaling rule on the device: after an overflow scale *= backoff and growth_tracker = 0;
// otherwise growth_tracker += 1, and at growth_interval the scale is multiplied by growth (if
// that stays finite) and the tracker restarts. scale and found_inf are 0-dim f32, growth_tracker
// 0-dim i32, all on one device.
void non_finite_check_and_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& inv_scale);
void update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth,
                   double backoff, int64_t growth_interval);

}  // namespace kernels
}  // namespace tandem
