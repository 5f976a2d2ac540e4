// The device-neutral side of fused attention: argument checks, output layouts, and routing:
// f32 to tandem's own flash-attention kernels, bf16/f16 to cuDNN's fused flash attention or to
// tandem's 16-bit flash kernels (cuda::attention_kernels, TANDEM_ATTENTION).
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tandem/core/backend.h"
#include "tandem/core/attention.h"
#include "tandem/core/copy.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/views.h"

namespace tandem::cuda {

namespace {
// -1: not decided yet (TANDEM_ATTENTION is read on first use); else an AttentionKernels value.
std::atomic<int> attention_choice{-1};

AttentionKernels parse_attention_env(const char* value) {
  if (value == nullptr) return AttentionKernels::automatic;
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v.empty() || v == "auto" || v == "automatic") return AttentionKernels::automatic;
  if (v == "flash") return AttentionKernels::flash;
  if (v == "cudnn") return AttentionKernels::cudnn;
  TANDEM_THROW(ValueError, "TANDEM_ATTENTION=", value, ": expected auto, flash or cudnn");
}
}  // namespace

void set_attention_kernels(AttentionKernels kernels) { attention_choice.store(static_cast<int>(kernels)); }

AttentionKernels attention_kernels() {
  int choice = attention_choice.load();
  if (choice < 0) {
    int expected = -1;  // a concurrent set_attention_kernels() wins over the environment
    attention_choice.compare_exchange_strong(expected,
                                             static_cast<int>(parse_attention_env(std::getenv("TANDEM_ATTENTION"))));
    choice = attention_choice.load();
  }
  return static_cast<AttentionKernels>(choice);
}

}  // namespace tandem::cuda

namespace tandem::kernels {

namespace {

void check_attention_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  TANDEM_CHECK_AS(ValueError, q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
                  "attention: q, k and v must be (B, H, T, D), got shapes ", shape_str(q.shape()), ", ",
                  shape_str(k.shape()), " and ", shape_str(v.shape()));
  TANDEM_CHECK_AS(ValueError, k.shape() == v.shape(), "attention: k ", shape_str(k.shape()), " and v ",
                  shape_str(v.shape()), " must have the same shape");
  TANDEM_CHECK_AS(ValueError, q.shape()[0] == k.shape()[0] && q.shape()[1] == k.shape()[1] && q.shape()[3] == k.shape()[3],
                  "attention: q ", shape_str(q.shape()), " and k ", shape_str(k.shape()),
                  " must agree in batch, heads and head dim");
  TANDEM_CHECK_AS(TypeError, q.dtype() == k.dtype() && q.dtype() == v.dtype(), "attention: q, k and v must share a dtype, got ",
                  q.dtype(), ", ", k.dtype(), " and ", v.dtype());
  TANDEM_CHECK_AS(DeviceError, q.device() == k.device() && q.device() == v.device(),
                  "attention: q, k and v must be on one device, got ", q.device(), ", ", k.device(), " and ", v.device());
}

// An empty (B, H, T, D) tensor whose memory is laid out (B, T, H, D).
Tensor empty_bthd(const Shape& bhtd, TensorOptions options) {
  Tensor t = empty({bhtd[0], bhtd[2], bhtd[1], bhtd[3]}, options);
  return views::permute(t, {0, 2, 1, 3});
}

// Whether the kernels can address x (B, H, T, D) in place: last stride 1, 16-byte aligned rows.
bool fused_addressable(const Tensor& x) {
  const int64_t per_16_bytes = 16 / static_cast<int64_t>(dtype_size(x.dtype()));
  bool ok = x.stride(3) == 1 && reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 == 0;
  for (int64_t d = 0; d < 3 && ok; ++d) ok = x.stride(d) % per_16_bytes == 0;
  return ok;
}

// x itself when the kernels can read it in place, else a contiguous copy.
Tensor fused_layout(const Tensor& x) { return fused_addressable(x) ? x : contiguous(x); }

// Which kernels run bf16/f16 q, k, v (f32 always runs on tandem's own): cuDNN's where the build
// has them, unless tandem's are asked for (cuda::attention_kernels).
bool use_cudnn(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!is_half(q.dtype())) return false;
  const cuda::AttentionKernels choice = cuda::attention_kernels();
  const bool cudnn_built = cuda::fused_attention_supported(q, k, v);
  if (choice == cuda::AttentionKernels::flash) return false;
  TANDEM_CHECK_AS(DeviceError, cudnn_built || choice != cuda::AttentionKernels::cudnn,
                  "fused attention: cuDNN's kernels were asked for (TANDEM_ATTENTION=cudnn or "
                  "set_attention_kernels(cudnn)) for q ", shape_str(q.shape()), " ", q.dtype(),
                  ", but tandem was built without cuDNN's frontend headers (scripts/install-deps.sh fetches them); "
                  "expected TANDEM_ATTENTION=auto or flash in this build");
  return cudnn_built;
}

void run_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, bool causal,
                 double scale) {
  if (use_cudnn(q, k, v)) cuda::fused_attention_forward(q, k, v, out, lse, causal, scale);
  else if (is_half(q.dtype())) cuda::flash_attention_half_forward(q, k, v, out, lse, causal, scale);
  else cuda::flash_attention_forward(q, k, v, out, lse, causal, scale);
}

}  // namespace

bool fused_attention_available(const Tensor& q, const Tensor& k, const Tensor& v) {
  check_attention_inputs(q, k, v);
  return q.device().is_cuda() && (cuda::fused_attention_supported(q, k, v) || cuda::flash_attention_supported(q, k, v));
}

AttentionForward fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double scale) {
  TANDEM_CHECK_AS(ValueError, fused_attention_available(q, k, v), "fused attention: no fused kernel for q ",
                  shape_str(q.shape()), " ", q.dtype(), " on ", q.device(),
                  " (expected cuda; bf16 or f16 with a head dim that is a multiple of 8, or f32 with one that is a "
                  "multiple of 4; at most 128)");
  TANDEM_CHECK_AS(ValueError, !causal || q.shape()[2] == k.shape()[2], "fused attention: a causal mask needs Tq == Tk, got ",
                  q.shape()[2], " and ", k.shape()[2]);
  const Shape& s = q.shape();
  AttentionForward f{empty_bthd(s, q.options()), empty({s[0], s[1], s[2], 1}, TensorOptions(DType::f32, q.device()))};
  run_forward(fused_layout(q), fused_layout(k), fused_layout(v), f.out, f.lse, causal, scale);
  return f;
}

AttentionGrads fused_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                        const AttentionForward& forward, bool causal, double scale) {
  AttentionGrads grads{empty_bthd(q.shape(), q.options()), empty_bthd(k.shape(), k.options()),
                       empty_bthd(v.shape(), v.options())};
  fused_attention_backward_into(grad_out, q, k, v, forward, causal, scale, grads);
  return grads;
}

void fused_attention_backward_into(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                   const AttentionForward& forward, bool causal, double scale,
                                   const AttentionGrads& grads) {
  TANDEM_CHECK_AS(ValueError, grad_out.shape() == q.shape(), "fused attention backward: grad_out ",
                  shape_str(grad_out.shape()), " must have q's shape ", shape_str(q.shape()));
  const Tensor* inputs[] = {&q, &k, &v};
  const Tensor* outputs[] = {&grads.q, &grads.k, &grads.v};
  bool in_place = true;
  for (int i = 0; i < 3; ++i) {
    const Tensor& out = *outputs[i];
    TANDEM_CHECK_AS(ValueError, out.shape() == inputs[i]->shape() && out.dtype() == q.dtype() && out.device() == q.device(),
                    "fused attention backward: gradient of ", "qkv"[i], " ", shape_str(out.shape()), " ", out.dtype(),
                    " on ", out.device(), " must be shaped like its input ", shape_str(inputs[i]->shape()), ", in ",
                    q.dtype(), " on ", q.device());
    in_place = in_place && fused_addressable(out);
  }
  if (!in_place) {  // computed into fresh tensors, then copied where they belong
    AttentionGrads fresh = fused_attention_backward(grad_out, q, k, v, forward, causal, scale);
    copy_(grads.q, fresh.q);
    copy_(grads.k, fresh.k);
    copy_(grads.v, fresh.v);
    return;
  }
  Tensor g = fused_layout(to_dtype(grad_out, q.dtype()));
  auto backward = use_cudnn(q, k, v)        ? cuda::fused_attention_backward
                  : is_half(q.dtype()) ? cuda::flash_attention_half_backward
                                       : cuda::flash_attention_backward;
  backward(g, fused_layout(q), fused_layout(k), fused_layout(v), forward.out, forward.lse, grads.q, grads.k, grads.v,
           causal, scale);
}

}  // namespace tandem::kernels
