// tandem's sm_90 products (core/cuda/gemm_sm90.h) alone, every variant, on GPT-2 B8's MLP shapes
// in bf16: the 768 -> 3072 layer's forward (plain, with its bias, and with its bias and GELU
// storing the pre-activation) and the input gradient of the 3072 -> 768 layer (plain, through
// GELU's backward, and that with the column sums of c_fc's bias gradient), all (8192, 3072) =
// (8192, 768) @ (768, 3072). Each variant back to back on fresh random inputs, median of per-call
// events, us and TFLOPS; the slack of the epilogue shows as the gap to the plain product of the
// same variant.
//
// Usage: gemm_sm90_variants [--only PROBLEM:VARIANT [--calls N]]: --only runs one product N
// times (default 20) and nothing else, for a profiler's single kernel.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpu_timer.h"
#include "tandem/core/cuda/gemm_sm90.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda/runtime.h"
#include "tandem/tandem.h"

using namespace tandem;
namespace sm90 = tandem::cuda::sm90;

namespace {
const Device kGpu("cuda:0");
constexpr int64_t kRows = 8192, kWide = 3072, kNarrow = 768;  // GPT-2 B8: tokens, MLP width, model width

struct Operands {
  TensorOptions bf16 = TensorOptions(DType::bf16, kGpu);
  Tensor x = randn({kRows, kNarrow}, bf16);             // (m, k): layer norm's output, c_fc's input
  Tensor w_fc = randn({kWide, kNarrow}, bf16);          // (n, k): c_fc's weight, (out, in)
  Tensor bias = randn({kWide}, bf16);                   // (n,)
  Tensor grad = randn({kRows, kNarrow}, bf16);          // (m, k): c_proj's output gradient
  Tensor w_proj = randn({kNarrow, kWide}, bf16);        // (k, n): c_proj's weight, (out, in)
  Tensor out = empty({kRows, kWide}, bf16);             // (m, n): D
  Tensor pre = randn({kRows, kWide}, bf16);             // (m, n): aux, the pre-activation
  Tensor partials = empty({kRows / 64, kWide}, TensorOptions(DType::f32, kGpu));  // (tiles of m, n)
};

struct Named {
  const char* name;
  sm90::Problem problem;
};

std::vector<Named> problems(Operands& o) {
  sm90::Problem forward;
  forward.m = kRows, forward.n = kWide, forward.k = kNarrow;
  forward.a = o.x.data_ptr(), forward.lda = kNarrow;
  forward.b = o.w_fc.data_ptr(), forward.ldb = kNarrow, forward.b_transposed = true;
  forward.d = o.out.data_ptr(), forward.ldd = kWide;
  sm90::Problem forward_bias = forward;
  forward_bias.epilogue = sm90::Epilogue::bias, forward_bias.bias = o.bias.data_ptr();
  sm90::Problem forward_gelu = forward;
  forward_gelu.epilogue = sm90::Epilogue::bias_gelu_aux;
  forward_gelu.bias = o.bias.data_ptr(), forward_gelu.aux = o.pre.data_ptr();

  sm90::Problem input_gradient;
  input_gradient.m = kRows, input_gradient.n = kWide, input_gradient.k = kNarrow;
  input_gradient.a = o.grad.data_ptr(), input_gradient.lda = kNarrow;
  input_gradient.b = o.w_proj.data_ptr(), input_gradient.ldb = kWide;
  input_gradient.d = o.out.data_ptr(), input_gradient.ldd = kWide;
  sm90::Problem dgelu = input_gradient;
  dgelu.epilogue = sm90::Epilogue::dgelu_aux, dgelu.aux = o.pre.data_ptr();
  sm90::Problem dgelu_partials = dgelu;
  dgelu_partials.epilogue = sm90::Epilogue::dgelu_aux_bias_partials;
  dgelu_partials.bias_partials = static_cast<float*>(o.partials.data_ptr());
  return {{"forward", forward},
          {"forward_bias", forward_bias},
          {"forward_bias_gelu_aux", forward_gelu},
          {"input_gradient", input_gradient},
          {"input_gradient_dgelu_aux", dgelu},
          {"input_gradient_dgelu_aux_bias_partials", dgelu_partials}};
}

void launch(const sm90::Problem& p, int variant) {
  TANDEM_CHECK(sm90::run(p, variant, 0, cuda::current_stream(0)), "variant ", variant, " refused the problem");
}

// What --only asked for: one problem by name, one variant, some calls.
struct OnlyRequest {
  std::string problem;
  int variant = 0;
  int calls = 20;
};

// Parses "--only PROBLEM:VARIANT [--calls N]" from argv[1] on; exits with a message naming what was
// expected when the arguments are anything else.
OnlyRequest parse_only(int argc, char** argv) {
  const std::string spec = argc >= 3 ? argv[2] : "";
  const size_t colon = spec.find(':');
  char* end = nullptr;
  const long variant = colon == std::string::npos ? -1 : std::strtol(spec.c_str() + colon + 1, &end, 10);
  const bool calls_given = argc == 5 && std::strcmp(argv[3], "--calls") == 0;
  const int calls = calls_given ? std::atoi(argv[4]) : 20;
  if (colon == 0 || variant < 0 || variant >= sm90::kVariants || end == nullptr || *end != '\0' || calls <= 0 ||
      (argc != 3 && !calls_given)) {
    std::fprintf(stderr,
                 "gemm_sm90_variants: --only takes PROBLEM:VARIANT with VARIANT 0 to %d, then optionally --calls N "
                 "with N > 0; got:",
                 sm90::kVariants - 1);
    for (int i = 1; i < argc; ++i) std::fprintf(stderr, " %s", argv[i]);
    std::fprintf(stderr, "\n");
    std::exit(2);
  }
  return {spec.substr(0, colon), static_cast<int>(variant), calls};
}
}  // namespace

int main(int argc, char** argv) {
  const bool only = argc >= 2 && std::strcmp(argv[1], "--only") == 0;
  const OnlyRequest request = only ? parse_only(argc, argv) : OnlyRequest{};
  if (!cuda::is_available() || !cuda::cutlass_gemm_built() || !sm90::available(0)) {
    std::printf("gemm_sm90_variants: needs tandem's sm_90 kernels and an sm_90 GPU\n");
    return 77;
  }
  Operands operands;
  const std::vector<Named> all = problems(operands);
  if (only) {
    for (const Named& n : all) {
      if (request.problem != n.name) continue;
      for (int i = 0; i < request.calls; ++i) launch(n.problem, request.variant);
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(cuda::current_stream(0)));
      return 0;
    }
    std::fprintf(stderr, "gemm_sm90_variants: no problem named %s; problems:", request.problem.c_str());
    for (const Named& n : all) std::fprintf(stderr, " %s", n.name);
    std::fprintf(stderr, "\n");
    return 2;
  }
  const double flops = 2.0 * kRows * kWide * kNarrow;
  std::printf("%-40s", "us (TFLOPS) by variant");
  for (int v = 0; v < sm90::kVariants; ++v) std::printf(" %7d", v);
  std::printf("\n");
  for (const Named& n : all) {
    std::vector<double> ms(sm90::kVariants);
    for (int v = 0; v < sm90::kVariants; ++v) ms[v] = bench::median_ms([&] { launch(n.problem, v); }, 5, 50);
    std::printf("%-40s", n.name);
    for (double t : ms) std::printf(" %7.1f", t * 1e3);
    std::printf("\n%-40s", "");
    for (double t : ms) std::printf(" %7.0f", flops / t / 1e9);
    std::printf("\n");
  }
  for (int v = 0; v < sm90::kVariants; ++v) std::printf("variant %2d: %s\n", v, sm90::variant_name(v).c_str());
  return 0;
}
