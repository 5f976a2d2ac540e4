// gemm_sm90.h's host side: which problems have a kernel, the untimed choice of variant, and the
// dispatch to the generated files (one per kind, epilogue and type).
#include "tandem/core/cuda/gemm_sm90.h"

#include <atomic>
#include <cstdint>

#include "tandem/core/cuda/runtime.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/error.h"

namespace tandem::cuda::sm90 {

// The generated files' entry points (gemm_sm90_instance.cu.in).
bool launch_forward_none_bf16(const Problem&, int, int, cudaStream_t);
bool launch_forward_bias_bf16(const Problem&, int, int, cudaStream_t);
bool launch_forward_bias_residual_bf16(const Problem&, int, int, cudaStream_t);
bool launch_forward_bias_gelu_aux_bf16(const Problem&, int, int, cudaStream_t);
bool launch_input_gradient_none_bf16(const Problem&, int, int, cudaStream_t);
bool launch_input_gradient_dgelu_aux_bf16(const Problem&, int, int, cudaStream_t);
bool launch_input_gradient_dgelu_aux_bias_partials_bf16(const Problem&, int, int, cudaStream_t);
bool launch_weight_gradient_none_bf16(const Problem&, int, int, cudaStream_t);
bool launch_forward_none_f16(const Problem&, int, int, cudaStream_t);
bool launch_forward_bias_f16(const Problem&, int, int, cudaStream_t);
bool launch_forward_bias_residual_f16(const Problem&, int, int, cudaStream_t);
bool launch_forward_bias_gelu_aux_f16(const Problem&, int, int, cudaStream_t);
bool launch_input_gradient_none_f16(const Problem&, int, int, cudaStream_t);
bool launch_input_gradient_dgelu_aux_f16(const Problem&, int, int, cudaStream_t);
bool launch_input_gradient_dgelu_aux_bias_partials_f16(const Problem&, int, int, cudaStream_t);
bool launch_weight_gradient_none_f16(const Problem&, int, int, cudaStream_t);

namespace {
constexpr int kMaxDevices = 64;

int sm_count(int device) {
  int count = 0;
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  return count > 0 ? count : 1;
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::string variant_name(int variant) {
  static const char* configs[kConfigs] = {"128x256 tiles, cooperative, clusters 2x1",
                                          "128x128 tiles, ping-pong, clusters 2x1, epilogue 64x64",
                                          "64x128 tiles, ping-pong"};
  return detail::concat("CUTLASS sm90 ", configs[variant / 4], ", raster along ", (variant / 2) % 2 == 0 ? "n" : "m",
                        ", swizzle ", variant % 2 == 0 ? 1 : 4);
}

bool available(int device) {
  static std::atomic<int> known[kMaxDevices];  // per device: 0 not asked yet, 1 sm_90, 2 other
  if (device < 0 || device >= kMaxDevices) return false;
  if (known[device] == 0) {
    int major = 0, minor = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    known[device] = major == 9 && minor == 0 ? 1 : 2;  // the kernels are built for sm_90a only
  }
  return known[device] == 1;
}

bool supported(const Problem& p) {
  if (p.dtype != DType::bf16 && p.dtype != DType::f16) return false;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) return false;
  const bool forward = !p.a_transposed && p.b_transposed;
  const bool input_gradient = !p.a_transposed && !p.b_transposed;
  const bool weight_gradient = p.a_transposed && !p.b_transposed;
  if (!(forward || input_gradient || weight_gradient)) return false;
  const bool with_residual = p.epilogue == Epilogue::bias_residual;
  const bool with_bias = p.epilogue == Epilogue::bias || with_residual || p.epilogue == Epilogue::bias_gelu_aux;
  if (with_bias && (!forward || p.bias == nullptr || !aligned(p.bias))) return false;
  if (with_residual && (p.c == nullptr || !aligned(p.c))) return false;
  const bool dgelu = p.epilogue == Epilogue::dgelu_aux || p.epilogue == Epilogue::dgelu_aux_bias_partials;
  if (dgelu && !input_gradient) return false;
  const bool with_aux = p.epilogue == Epilogue::bias_gelu_aux || dgelu;
  if (with_aux && (p.aux == nullptr || !aligned(p.aux))) return false;
  if (p.epilogue == Epilogue::dgelu_aux_bias_partials &&
      (p.bias_partials == nullptr || !aligned(p.bias_partials) || p.n % 256 != 0)) {
    return false;
  }
  if (!aligned(p.a) || !aligned(p.b) || !aligned(p.d)) return false;
  // Contiguous extents and leading dimensions in whole 16-byte units (TMA), leading dimensions
  // covering their rows.
  const int64_t a_row = p.a_transposed ? p.m : p.k, b_row = p.b_transposed ? p.k : p.n;
  for (int64_t v : {a_row, b_row, p.n, p.lda, p.ldb, p.ldd}) {
    if (v % 8 != 0) return false;
  }
  return p.lda >= a_row && p.ldb >= b_row && p.ldd >= p.n;
}

bool launch_as_dependent(int device) { return dependent_launch_enabled(device) && !is_capturing(); }

int default_variant(const Problem& p, int device) {
  const int64_t sms = sm_count(device);
  if (ceil_div(p.m, 128) * ceil_div(p.n, 256) >= sms) return 0;
  if (ceil_div(p.m, 128) * ceil_div(p.n, 128) >= sms) return 4;
  return 8;
}

bool run(const Problem& p, int variant, int device, cudaStream_t stream) {
  if (!supported(p) || variant < 0 || variant >= kVariants) return false;
  const bool bf16 = p.dtype == DType::bf16;
  if (p.a_transposed) {
    return (bf16 ? launch_weight_gradient_none_bf16 : launch_weight_gradient_none_f16)(p, variant, device, stream);
  }
  if (!p.b_transposed) {
    if (p.epilogue == Epilogue::dgelu_aux) {
      auto launch = bf16 ? launch_input_gradient_dgelu_aux_bf16 : launch_input_gradient_dgelu_aux_f16;
      return launch(p, variant, device, stream);
    }
    if (p.epilogue == Epilogue::dgelu_aux_bias_partials) {
      auto launch =
          bf16 ? launch_input_gradient_dgelu_aux_bias_partials_bf16 : launch_input_gradient_dgelu_aux_bias_partials_f16;
      return launch(p, variant, device, stream);
    }
    return (bf16 ? launch_input_gradient_none_bf16 : launch_input_gradient_none_f16)(p, variant, device, stream);
  }
  switch (p.epilogue) {
    case Epilogue::none: return (bf16 ? launch_forward_none_bf16 : launch_forward_none_f16)(p, variant, device, stream);
    case Epilogue::bias: return (bf16 ? launch_forward_bias_bf16 : launch_forward_bias_f16)(p, variant, device, stream);
    case Epilogue::bias_residual:
      return (bf16 ? launch_forward_bias_residual_bf16 : launch_forward_bias_residual_f16)(p, variant, device, stream);
    case Epilogue::bias_gelu_aux:
      return (bf16 ? launch_forward_bias_gelu_aux_bf16 : launch_forward_bias_gelu_aux_f16)(p, variant, device, stream);
    case Epilogue::dgelu_aux:
    case Epilogue::dgelu_aux_bias_partials: return false;  // the input gradient's only (supported() says so)
  }
  return false;
}

}  // namespace tandem::cuda::sm90

namespace tandem::cuda {
bool cutlass_gemm_built() { return true; }
}  // namespace tandem::cuda
