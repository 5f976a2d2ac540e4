#pragma once
// The functions every device backend implements, declared once for both: core/cpu/ implements
// namespace cpu, core/cuda/ (or the no-CUDA stubs in core/no_cuda/) implements namespace cuda.
// Callers are the device-neutral kernels in core/<family>.cpp, which check arguments and allocate
// outputs first: backends receive outputs of the right shape and dtype on the right device.
#include <cstddef>
#include <cstdint>

#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"

namespace tandem {

#define TANDEM_BACKEND_KERNELS                                                                                         \
  /* x is already expanded to out's shape; out is contiguous */                                                        \
  void unary(UnaryOp op, const Tensor& x, const Tensor& out, double alpha, double beta);                               \
  /* out = grad * op'(x), all of one shape and floating dtype; out contiguous */                                       \
  void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& out, double alpha, double beta);  \
  /* a, b are expanded to out's shape; out is contiguous */                                                            \
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out);                                       \
  void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out);                                 \
  /* any strides, dtypes may differ, same shape and device */                                                          \
  void copy(const Tensor& src, const Tensor& dst);                                                                     \
  /* srcs[i] into dsts[i] for every i, byte for byte: each pair dense with the same strides and dtype, all on one     \
     device */                                                                                                         \
  void copy_each(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts);                                   \
  void fill(const Tensor& dst, double value);                                                                          \
  /* out (n,) contiguous: out[i] = start + i * step, computed in f64, converted to out's dtype */                      \
  void arange(const Tensor& out, double start, double step);                                                           \
  /* x (outer, reduced, inner) contiguous; out (outer, inner) contiguous */                                            \
  void reduce(ReduceOp op, const Tensor& x, const Tensor& out);                                                        \
  /* x contiguous, its data 8-byte aligned; out (1,) i64 gets the wrapping sum over x's 8-byte                         \
     words (the last zero-padded) of hashing::mix(word, index) (core/content_hash.h) */                                \
  void content_hash(const Tensor& x, const Tensor& out);                                                               \
  /* x, out (outer, n, inner) contiguous; softmax along the middle dim */                                              \
  void softmax(const Tensor& x, const Tensor& out, bool log);                                                          \
  void softmax_backward(const Tensor& grad, const Tensor& y, const Tensor& out, bool log);                             \
  /* logits (N, C) contiguous, target (N,) i64; losses, lse (N,) */                                                    \
  void cross_entropy_forward(const Tensor& logits, const Tensor& target, const Tensor& losses, const Tensor& lse,      \
                             int64_t ignore_index, double smoothing);                                                  \
  void cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& lse, const Tensor& row_grad,   \
                              const Tensor& out, int64_t ignore_index, double smoothing);                              \
  /* the forward's losses and, for an upstream gradient of 1, grad (N, C) = (softmax - y) / count                      \
     (count a 0-dim tensor of losses' dtype, or undefined for 1); grad is contiguous like logits */                    \
  void cross_entropy_with_grad(const Tensor& logits, const Tensor& target, const Tensor& count, const Tensor& losses,  \
                               const Tensor& grad, int64_t ignore_index, double smoothing);                            \
  /* input, target, grad contiguous, one shape and floating dtype, not empty; loss () of that                          \
     dtype: the mean (or sum) of (input - target)^2, grad its gradient for an upstream 1 */                            \
  void squared_error_with_grad(const Tensor& input, const Tensor& target, bool mean, const Tensor& loss,               \
                               const Tensor& grad);                                                                    \
  /* out = g * x for a 0-dim g, which stays on the device: where g is 1 and out is x, nothing is                       \
     written; x and out contiguous, one shape and floating dtype; g of x's statistics dtype */                         \
  void scale_unless_one(const Tensor& x, const Tensor& g, const Tensor& out);                                          \
  /* a (B, M, K), b (B, K, N) with any strides (batch stride 0 when broadcast); out (B, M, N) */                       \
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out);                                                    \
  /* x, out (outer, n, inner) contiguous; index (k,) i64 contiguous; out (outer, k, inner) */                          \
  void index_select(const Tensor& x, const Tensor& index, const Tensor& out);                                          \
  /* out (outer, n, inner) += src (outer, k, inner) at rows index (k,); in_order: each row's */                        \
  /* sources added in source order whatever the deterministic mode (the CPU always does) */                            \
  void index_add(const Tensor& out, const Tensor& index, const Tensor& src, bool in_order);                            \
  /* x (outer, n, inner), index/out (outer, k, inner), all contiguous, index i64 */                                    \
  void gather(const Tensor& x, const Tensor& index, const Tensor& out);                                                \
  void scatter_add(const Tensor& out, const Tensor& index, const Tensor& src);                                         \
  void random(const Tensor& out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2);               \
  /* dst += alpha * src, same shape, dst contiguous */                                                                 \
  void add_inplace(const Tensor& dst, const Tensor& src, double alpha);                                                \
  /* NCHW, all contiguous; x (N, C, H, W), w (K, C/g, R, S), out (N, K, P, Q) */                                       \
  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& out, const Conv2dParams& p);                     \
  void conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_x, const Conv2dParams& p);    \
  void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w, const Conv2dParams& p);   \
  /* x (N, C, H, W), out (N, C, P, Q), contiguous */                                                                   \
  void pool2d_forward(const Tensor& x, const Tensor& out, const Pool2dParams& p);                                      \
  void pool2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& out, const Tensor& grad_x,               \
                       const Pool2dParams& p);                                                                         \
  /* batch norm: every (N, C, H, W) operand either contiguous or all channels-last (strides     */                     \
  /* (H*W*C, 1, W*C, C)), as x is; per-channel (C,) tensors in the statistics dtype. residual    */                    \
  /* (maybe undefined) and relu: out = relu(round(bn(x)) + residual). relu_out (maybe undefined): */                   \
  /* grad_out is masked where relu_out <= 0 first, and grad_residual (maybe undefined) gets it */                      \
  void batch_norm_forward_training(const Tensor& x, const Tensor& weight, const Tensor& bias,                          \
                                   const Tensor& running_mean, const Tensor& running_var, const Tensor& residual,      \
                                   bool relu, const Tensor& out, const Tensor& save_mean, const Tensor& save_invstd,   \
                                   double momentum, double eps);                                                       \
  void batch_norm_forward_inference(const Tensor& x, const Tensor& weight, const Tensor& bias,                         \
                                    const Tensor& running_mean, const Tensor& running_var, const Tensor& residual,     \
                                    bool relu, const Tensor& out, double eps);                                         \
  void batch_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& save_mean,     \
                           const Tensor& save_invstd, const Tensor& relu_out, const Tensor& grad_x,                    \
                           const Tensor& grad_weight, const Tensor& grad_bias, const Tensor& grad_residual);           \
  /* layer norm over the last dim: x, out, grad_out, grad_x (rows, D) contiguous; weight, bias, */                     \
  /* grad_weight, grad_bias (D,) contiguous or undefined; mean, rstd (rows,) in the stats dtype; */                    \
  /* pending (rows, D) contiguous or undefined: a gradient added into grad_x; grad_x_column_sum */                     \
  /* (D,) contiguous or undefined: grad_x (as rounded) summed over its rows */                                         \
  void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,                \
                          const Tensor& mean, const Tensor& rstd, double eps);                                         \
  void layer_norm_backward(const Tensor& grad_out, const Tensor& x, const Tensor& weight, const Tensor& mean,          \
                           const Tensor& rstd, const Tensor& pending, const Tensor& grad_x, const Tensor& grad_weight, \
                           const Tensor& grad_bias, const Tensor& grad_x_column_sum);                                  \
  /* fused optimizer steps (see UpdateTensors): params, grads, states and masters contiguous, */                       \
  /* params of one float dtype on one device, masters either empty or one (maybe undefined) each */                    \
  void sgd_step(const UpdateTensors& t, const SgdHyper& h);                                                            \
  void adamw_step(const UpdateTensors& t, const AdamWHyper& h);                                                        \
  /* compact master weights (core/master_halves.h), all contiguous and of one shape: param and */                      \
  /* low_halves bf16, master f32 */                                                                                    \
  void join_master_halves(const Tensor& param, const Tensor& low_halves, const Tensor& master);                        \
  void split_master(const Tensor& master, const Tensor& param, const Tensor& low_halves);                              \
  /* grads contiguous, of one float dtype on one device; inv_scale may be undefined */                                 \
  void non_finite_check_and_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf,                        \
                                     const Tensor& inv_scale);                                                         \
  void update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth,        \
                     double backoff, int64_t growth_interval);

namespace cpu {
TANDEM_BACKEND_KERNELS
}  // namespace cpu

namespace cuda {
TANDEM_BACKEND_KERNELS

// Device memory and copies, implemented by core/cuda/ (or throwing "built without CUDA").
// Allocations come from the caching allocator on the device's current stream.
void* device_allocate(size_t nbytes, int device);
void device_free(void* ptr, int device);
void copy_host_to_device(void* dst, const void* src, size_t nbytes, int device);
void copy_device_to_host(void* dst, const void* src, size_t nbytes, int device);
void copy_device_to_device(void* dst, int dst_device, const void* src, int src_device, size_t nbytes);
// A random fill inside a CUDA graph capture: like random(), with the seed and the first counter read
// from base (2,) u64 on the device, which every replay sets (core/cuda_graph.h); counters
// base[1] + offset + i.
void random_from_base(const Tensor& out, RandomKind kind, const uint64_t* base, uint64_t offset, double p1, double p2);
// Page-locked host memory: uploads from it are truly asynchronous.
void* pinned_allocate(size_t nbytes);
void pinned_free(void* ptr);

// Layer norm of x + residual (core/cuda/layer_norm.cu): one kernel writes sum = x + (residual +
// residual_bias) (each add rounded to the dtype, as the add kernels would) and out =
// layer_norm(sum). x, residual, sum, out (rows, D) contiguous; residual_bias (D,) contiguous or
// undefined; the rest as layer_norm_forward.
void add_layer_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& residual_bias, const Tensor& weight,
                            const Tensor& bias, const Tensor& sum, const Tensor& out, const Tensor& mean,
                            const Tensor& rstd, double eps);

// cuBLASLt matmuls with epilogues (core/cuda/linear.cpp), all operands contiguous, in one dtype.
// Each returns false, having written nothing, when cuBLASLt offers no algorithm for the problem
// (the caller then composes the result from plain kernels).
// out (M, N) = act(x (M, K) @ weight (N, K)^T + bias (N,)); bias may be undefined; pre (M, N)
// receives x @ W^T + b when act != none (N % 8 == 0 then), and is undefined otherwise. With a
// residual (M, N) (act none only), out = residual + x @ W^T + bias, added in the product's epilogue
// in f32 and rounded once; residual must not overlap out.
bool linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& pre,
                    Activation act, const Tensor& residual = Tensor());
// grad_weight (N, K) = grad (M, N)^T @ x (M, K); grad_bias (N,) = the column sums of grad, or undefined.
bool linear_backward_weight(const Tensor& grad, const Tensor& x, const Tensor& grad_weight, const Tensor& grad_bias);
// grad_pre (M, K) = gelu_tanh'(pre (M, K)) * (grad (M, N) @ weight (N, K)): the input gradient of a
// linear layer whose input was gelu_tanh(pre), GELU's backward in the matmul's DGELU epilogue
// (K % 8 == 0). Given grad_bias (K,), where the product runs on tandem's sm_90 kernel (timed faster
// than cuBLASLt's DGELU; K a multiple of 256) that kernel also sums grad_pre's columns into it (the
// bias gradient of pre's layer) and *bias_summed says so; elsewhere grad_bias is left alone.
bool linear_backward_input_gelu(const Tensor& grad, const Tensor& weight, const Tensor& pre, const Tensor& grad_pre,
                                const Tensor& grad_bias = Tensor(), bool* bias_summed = nullptr);
// grad_pre (M, N) = gelu_tanh'(pre (M, N)) * grad (M, N), as unary_backward computes it, and
// column_sum (N,) = grad_pre's column sums (the bias gradient of the linear layer that made pre),
// in one pass (core/cuda/bias_gradient.cu). All contiguous, in one floating dtype.
void gelu_backward_column_sums(const Tensor& grad, const Tensor& pre, const Tensor& grad_pre, const Tensor& column_sum);
// column_sum (N,) = grad (M, N)'s column sums (the bias gradient of a linear layer without an
// activation), the same way (core/cuda/bias_gradient.cu). Contiguous, in one floating dtype.
void column_sums(const Tensor& grad, const Tensor& column_sum);
// column_sum (N,) in its floating dtype = the column sums of partial (parts, N) f32, the partial rows
// a kernel wrote, added in row order (core/cuda/partial_rows.cuh; inside backward, with the pass's
// other column sums). Both contiguous.
void add_partial_rows(const Tensor& partial, const Tensor& column_sum);

// cuDNN's fused flash attention (core/cuda/cudnn_attention.cpp; where tandem was built without
// cuDNN's frontend headers, fused_attention_supported says false and the passes throw).
// q (B, H, Tq, D), k and v (B, H, Tk, D), out and grads (B, H, Tq|Tk, D): any strides with the last
// one 1; lse (B, H, Tq, 1) f32 contiguous, the log-sum-exp of each query's scores.
bool fused_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v);
void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             bool causal, double scale);
void fused_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, bool causal, double scale);

// tandem's own flash attention. Whether its kernels take q, k and v: f32 with head dims D <= 128,
// D % 4 == 0, or bf16/f16 with D <= 128, D % 8 == 0; 16-byte aligned rows either way.
bool flash_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v);
// f32 (core/cuda/flash_attention_{forward,backward}.cu): TF32 tensor cores under
// MatmulPrecision::high, 3xTF32 (about f32's accuracy) under highest. Same arguments as above.
void flash_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             bool causal, double scale);
void flash_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, bool causal, double scale);
// bf16/f16 (core/cuda/flash_attention_half_{forward,backward}.cu): 16-bit tensor cores with f32
// accumulation; the same arguments and log-sum-exp as cuDNN's, so the passes mix.
void flash_attention_half_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, bool causal, double scale);
void flash_attention_half_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const Tensor& out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                                   const Tensor& grad_v, bool causal, double scale);
}  // namespace cuda

#undef TANDEM_BACKEND_KERNELS

}  // namespace tandem
