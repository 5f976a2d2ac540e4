// GPU kernel benchmark: tandem's elementwise, cast, softmax, matmul and convolution kernels next
// to the ceilings measured in the same run (device-to-device copy bandwidth). Prints one JSON
// object per line; bench/compare_kernels.py puts them beside PyTorch's figures.
//
// Convolutions: besides the ResNet-18 totals, one line per shape and direction
// ("conv_s{index}_{fwd|bwd_data|bwd_filter}", "_benchmark" appended in benchmark mode) with three
// figures: "ms" (median of per-call events, as for the totals), "gpu_ms" (device time alone: the
// stream is held until all repetitions are queued, so host gaps do not count) and "host_ms" (host
// time to issue one call). ms well above gpu_ms means the host cannot keep the GPU busy.
// Attention: GPT-2's causal self-attention (B 8, H 12, T 1024, D 64; q, k and v as views of the
// packed (B, T, 3, H, D) projection), forward and forward + backward, in f32 under TF32
// ("attention_*_tf32"), f32 under "highest" (3xTF32), bf16 on the kernels the build routes it to
// (cuDNN's with its frontend; TANDEM_ATTENTION changes that) and bf16 on tandem's own flash
// kernels ("attention_*_bf16_flash") and on cuDNN's ("attention_*_bf16_cudnn") where it has both.
// GPT-2's row kernels at B 8, T 1024 in bf16 ("gpt2_*"): layer norm of x + residual (+ the
// residual's bias) forward, plain layer norm's forward (what a residual add elsewhere would leave
// it), its backward with the gradient from the residual stream added and the
// weight's, bias's and residual bias's gradients summed, and cross-entropy over 50257 classes
// writing its gradient, beside a device-to-device copy of the logits (the bytes cross-entropy
// moves: its ceiling); GB/s counts each tensor read or written once.
// Usage: gpu_kernels [--conv-only | --attention-only | --gpt2-rows-only]. TANDEM_CUDNN_LOG=1
// prints cuDNN's choices (core/cuda/cudnn_conv.cpp).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "gpu_timer.h"
#include "tandem/core/backend.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"
#include "tandem/tandem.h"

using namespace tandem;

namespace {
const Device kGpu("cuda:0");

void emit(const std::string& name, double ms, double bytes, double flops, const std::string& extra = "") {
  std::printf("{\"framework\": \"tandem\", \"name\": \"%s\", \"ms\": %.5f", name.c_str(), ms);
  if (bytes > 0) std::printf(", \"gbps\": %.1f", bytes / ms / 1e6);
  if (flops > 0) std::printf(", \"tflops\": %.1f", flops / ms / 1e9);
  std::printf("%s}\n", extra.c_str());
  std::fflush(stdout);
}

// Holds a stream until the host opens it (or 2 s pass), so that work queued behind it runs back
// to back however slowly the host queued it.
struct Gate {
  std::atomic<bool> open{false};
  std::atomic<bool> timed_out{false};
};

void CUDART_CB hold_stream(void* arg) {
  auto* gate = static_cast<Gate*>(arg);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!gate->open.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() > deadline) {
      gate->timed_out = true;
      return;
    }
    std::this_thread::yield();
  }
}

struct CallTimes {
  double ms = 0;       // median of per-call events
  double gpu_ms = -1;  // device time per call with the stream held while queuing; -1: the gate timed out
  double host_ms = 0;  // host time to queue one call
};

CallTimes time_call(const std::function<void()>& fn, int reps = 20) {
  CallTimes t;
  t.ms = bench::median_ms(fn, 3, reps);
  cudaStream_t stream = cuda::current_stream(0);
  cudaEvent_t start, stop;
  TANDEM_CUDA_CHECK(cudaEventCreate(&start));
  TANDEM_CUDA_CHECK(cudaEventCreate(&stop));
  Gate gate;
  TANDEM_CUDA_CHECK(cudaLaunchHostFunc(stream, hold_stream, &gate));
  TANDEM_CUDA_CHECK(cudaEventRecord(start, stream));
  auto t0 = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < reps; ++i) fn();
  } catch (...) {
    gate.open.store(true, std::memory_order_release);  // the gate must not outlive its host function
    cudaStreamSynchronize(stream);
    throw;
  }
  auto t1 = std::chrono::steady_clock::now();
  TANDEM_CUDA_CHECK(cudaEventRecord(stop, stream));
  gate.open.store(true, std::memory_order_release);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  float ms = 0;
  TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  t.host_ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / reps;
  if (!gate.timed_out) t.gpu_ms = static_cast<double>(ms) / reps;
  return t;
}

struct ConvShape {
  int64_t n, c, h, w, k, r, stride, pad;
};

// The distinct convolutions of ResNet-18 for 3x32x32 inputs (3x3 stem, no max-pool), batch 256.
const ConvShape kResNet18[] = {
    {256, 3, 32, 32, 64, 3, 1, 1},    {256, 64, 32, 32, 64, 3, 1, 1},   {256, 64, 32, 32, 128, 3, 2, 1},
    {256, 128, 16, 16, 128, 3, 1, 1}, {256, 64, 32, 32, 128, 1, 2, 0},  {256, 128, 16, 16, 256, 3, 2, 1},
    {256, 256, 8, 8, 256, 3, 1, 1},   {256, 128, 16, 16, 256, 1, 2, 0}, {256, 256, 8, 8, 512, 3, 2, 1},
    {256, 512, 4, 4, 512, 3, 1, 1},   {256, 256, 8, 8, 512, 1, 2, 0},
};
// How often each of those shapes occurs in one ResNet-18 forward pass.
const int kResNet18Count[] = {1, 4, 1, 3, 1, 1, 3, 1, 1, 3, 1};
}  // namespace

void resnet18_convs();

void gpt2_row_kernels() {
  const int64_t rows = 8 * 1024, d = 768, classes = 50257;
  const TensorOptions bf16(DType::bf16, kGpu), f32(DType::f32, kGpu);
  const double row_bytes = static_cast<double>(rows) * d * 2;  // one (rows, D) bf16 tensor
  auto gpu_ms = [](const CallTimes& t) { return ", \"gpu_ms\": " + std::to_string(t.gpu_ms); };

  Tensor x = randn({rows, d}, bf16), residual = randn({rows, d}, bf16);       // (rows, D)
  Tensor residual_bias = randn({d}, bf16), weight = randn({d}, bf16), bias = randn({d}, bf16);  // (D,)
  Tensor sum = empty({rows, d}, bf16), out = empty({rows, d}, bf16);          // (rows, D)
  Tensor mean = empty({rows}, f32), rstd = empty({rows}, f32);                // (rows,)
  CallTimes fwd = time_call([&] {
    cuda::add_layer_norm_forward(x, residual, residual_bias, weight, bias, sum, out, mean, rstd, 1e-5);
  });
  emit("gpt2_add_layer_norm_fwd_bf16", fwd.ms, 4 * row_bytes, 0, gpu_ms(fwd));
  CallTimes plain = time_call([&] { cuda::layer_norm_forward(x, weight, bias, out, mean, rstd, 1e-5); });
  emit("gpt2_layer_norm_fwd_bf16", plain.ms, 2 * row_bytes, 0, gpu_ms(plain));

  Tensor grad_out = randn({rows, d}, bf16), pending = randn({rows, d}, bf16);  // (rows, D)
  Tensor grad_x = empty({rows, d}, bf16);                                     // (rows, D)
  Tensor grad_weight = empty({d}, bf16), grad_bias = empty({d}, bf16), grad_x_sum = empty({d}, bf16);  // (D,)
  CallTimes bwd = time_call([&] {
    cuda::layer_norm_backward(grad_out, sum, weight, mean, rstd, pending, grad_x, grad_weight, grad_bias, grad_x_sum);
  });
  emit("gpt2_layer_norm_bwd_bf16", bwd.ms, 4 * row_bytes, 0, gpu_ms(bwd));
  x = residual = sum = out = grad_out = pending = grad_x = Tensor();

  Tensor logits = randn({rows, classes}, bf16);                       // (rows, C)
  Tensor target = randint(0, classes, {rows}, TensorOptions(DType::i64, kGpu));  // (rows,)
  Tensor count = full({}, static_cast<double>(rows), f32);            // the mean's divisor
  Tensor losses = empty({rows}, f32), grad = empty({rows, classes}, bf16);
  emit("gpt2_logits_copy_bf16", bench::median_ms([&] {
         TANDEM_CUDA_CHECK(cudaMemcpyAsync(grad.data_ptr(), logits.data_ptr(), logits.nbytes(), cudaMemcpyDeviceToDevice,
                                           cuda::current_stream(0)));
       }), 2.0 * rows * classes * 2, 0);
  CallTimes loss = time_call([&] { cuda::cross_entropy_with_grad(logits, target, count, losses, grad, -100, 0.0); });
  emit("gpt2_cross_entropy_with_grad_bf16", loss.ms, 2.0 * rows * classes * 2, 0, gpu_ms(loss));
}

void attention_kernels() {
  const int64_t b = 8, h = 12, t = 1024, d = 64;
  const double fwd_flops = 2.0 * b * h * t * t * d;  // two (T x T x D) products, half of them masked
  Tensor packed = randn({b, t, 3, h, d}, TensorOptions(DType::f32, kGpu));      // (B, T, 3, H, D)
  Tensor grad = randn({b, h, t, d}, TensorOptions(DType::f32, kGpu));           // (B, H, T, D)
  struct Precision {
    const char* name;
    DType dtype;
    cuda::MatmulPrecision matmul;
    cuda::AttentionKernels kernels;
  };
  const cuda::AttentionKernels routed = cuda::attention_kernels();
  std::vector<Precision> precisions{{"tf32", DType::f32, cuda::MatmulPrecision::high, routed},
                                    {"f32", DType::f32, cuda::MatmulPrecision::highest, routed},
                                    {"bf16", DType::bf16, cuda::MatmulPrecision::highest, routed}};
  if (cuda::cudnn_attention_built()) {  // both kernel sets in this build: each alone too
    precisions.push_back({"bf16_flash", DType::bf16, cuda::MatmulPrecision::highest, cuda::AttentionKernels::flash});
    precisions.push_back({"bf16_cudnn", DType::bf16, cuda::MatmulPrecision::highest, cuda::AttentionKernels::cudnn});
  }
  for (const Precision& p : precisions) {
    cuda::set_matmul_precision(p.matmul);
    cuda::set_attention_kernels(p.kernels);
    Tensor x = kernels::to_dtype(packed, p.dtype), g = kernels::to_dtype(grad, p.dtype);
    std::vector<Tensor> qkv;
    for (int64_t i = 0; i < 3; ++i) qkv.push_back(permute(squeeze(narrow(x, 2, i, 1), 2), {0, 2, 1, 3}));
    auto forward = [&] { return kernels::fused_attention_forward(qkv[0], qkv[1], qkv[2], true, 0.125); };
    emit(std::string("attention_gpt2_fwd_") + p.name, bench::median_ms([&] { forward(); }), 0, fwd_flops);
    emit(std::string("attention_gpt2_fwdbwd_") + p.name, bench::median_ms([&] {
           kernels::AttentionForward f = forward();
           kernels::fused_attention_backward(g, qkv[0], qkv[1], qkv[2], f, true, 0.125);
         }),
         0, 3.5 * fwd_flops);
  }
  cuda::set_matmul_precision(cuda::MatmulPrecision::highest);
  cuda::set_attention_kernels(routed);
}

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::fprintf(stderr, "gpu_kernels: no CUDA device\n");
    return 1;
  }
  bool conv_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--conv-only") == 0) {
      conv_only = true;
    } else if (std::strcmp(argv[i], "--attention-only") == 0) {
      attention_kernels();
      return 0;
    } else if (std::strcmp(argv[i], "--gpt2-rows-only") == 0) {
      gpt2_row_kernels();
      return 0;
    } else {
      std::fprintf(stderr, "usage: gpu_kernels [--conv-only | --attention-only | --gpt2-rows-only]\n");
      return 2;
    }
  }
  if (conv_only) {
    resnet18_convs();
    return 0;
  }
  const int64_t n = int64_t(1) << 28;  // 256 Mi elements: 1 GiB in f32, far beyond L2
  Tensor a = randn({n}, TensorOptions(DType::f32, kGpu));
  Tensor b = randn({n}, TensorOptions(DType::f32, kGpu));
  Tensor copy_dst = empty({n}, TensorOptions(DType::f32, kGpu));
  double bytes_f32 = static_cast<double>(n) * 4;

  emit("copy_d2d_f32", bench::median_ms([&] {
         TANDEM_CUDA_CHECK(cudaMemcpyAsync(copy_dst.data_ptr(), a.data_ptr(), a.nbytes(), cudaMemcpyDeviceToDevice,
                                           cuda::current_stream(0)));
       }), 2 * bytes_f32, 0);
  emit("add_f32", bench::median_ms([&] { kernels::binary(BinaryOp::add, a, b); }), 3 * bytes_f32, 0);
  Tensor a16 = kernels::to_dtype(a, DType::bf16), b16 = kernels::to_dtype(b, DType::bf16);
  emit("add_bf16", bench::median_ms([&] { kernels::binary(BinaryOp::add, a16, b16); }), 3 * bytes_f32 / 2, 0);
  emit("cast_f32_bf16", bench::median_ms([&] { kernels::to_dtype(a, DType::bf16); }), bytes_f32 * 1.5, 0);
  emit("gelu_bf16", bench::median_ms([&] { kernels::unary(UnaryOp::gelu_tanh, a16); }), bytes_f32, 0);
  a16 = b16 = Tensor();
  b = copy_dst = Tensor();

  // Softmax over rows of 4096: (65536, 4096), 1 GiB in f32.
  Tensor rows = reshape(a, {65536, 4096});
  emit("softmax_rows4096_f32", bench::median_ms([&] { kernels::softmax(rows, -1, false); }), 2 * bytes_f32, 0);
  Tensor rows16 = kernels::to_dtype(rows, DType::bf16);
  emit("softmax_rows4096_bf16", bench::median_ms([&] { kernels::softmax(rows16, -1, false); }), bytes_f32, 0);
  rows = rows16 = a = Tensor();

  // Matrix products 8192^3.
  const int64_t m = 8192;
  double flops = 2.0 * m * m * m;
  Tensor x = randn({m, m}, TensorOptions(DType::f32, kGpu)), y = randn({m, m}, TensorOptions(DType::f32, kGpu));
  cuda::set_matmul_precision(cuda::MatmulPrecision::high);
  emit("matmul8192_tf32", bench::median_ms([&] { kernels::matmul(x, y); }, 3, 10), 0, flops);
  cuda::set_matmul_precision(cuda::MatmulPrecision::highest);
  Tensor x16 = kernels::to_dtype(x, DType::bf16), y16 = kernels::to_dtype(y, DType::bf16);
  emit("matmul8192_bf16", bench::median_ms([&] { kernels::matmul(x16, y16); }, 3, 20), 0, flops);
  x = y = x16 = y16 = Tensor();

  attention_kernels();
  gpt2_row_kernels();
  resnet18_convs();
  return 0;
}

namespace {
std::string conv_fields(const ConvShape& s, int count, const CallTimes& t) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                ", \"shape\": \"%lldx%lldx%lldx%lld k%lld r%lld s%lld p%lld\", \"count\": %d, \"gpu_ms\": %.5f, "
                "\"host_ms\": %.5f",
                static_cast<long long>(s.n), static_cast<long long>(s.c), static_cast<long long>(s.h),
                static_cast<long long>(s.w), static_cast<long long>(s.k), static_cast<long long>(s.r),
                static_cast<long long>(s.stride), static_cast<long long>(s.pad), count, t.gpu_ms, t.host_ms);
  return buf;
}
}  // namespace

// ResNet-18's convolutions, forward + backward (input and weight gradients), bf16, weighted by how
// often each shape occurs in the network; and each shape and direction on its own.
void resnet18_convs() {
  for (bool benchmark : {false, true}) {
    cuda::set_cudnn_benchmark(benchmark);
    const std::string suffix = benchmark ? "_benchmark" : "";
    double total = 0, total_flops = 0;
    for (size_t i = 0; i < sizeof(kResNet18) / sizeof(kResNet18[0]); ++i) {
      const ConvShape& s = kResNet18[i];
      Conv2dParams p;
      p.stride_h = p.stride_w = s.stride;
      p.pad_h = p.pad_w = s.pad;
      Tensor in = randn({s.n, s.c, s.h, s.w}, TensorOptions(DType::bf16, kGpu));
      Tensor w = randn({s.k, s.c, s.r, s.r}, TensorOptions(DType::bf16, kGpu));
      Tensor out = kernels::conv2d(in, w, p);
      Tensor g = randn(out.shape(), TensorOptions(DType::bf16, kGpu));
      double ms = bench::median_ms([&] {
        kernels::conv2d(in, w, p);
        kernels::conv2d_backward_input(g, w, in.shape(), p);
        kernels::conv2d_backward_weight(g, in, w.shape(), p);
      });
      total += ms * kResNet18Count[i];
      const double flops = 2.0 * out.numel() * s.c * s.r * s.r;  // one direction
      total_flops += 3.0 * flops * kResNet18Count[i];
      const std::string base = "conv_s" + std::to_string(i) + "_";
      CallTimes fwd = time_call([&] { kernels::conv2d(in, w, p); });
      emit(base + "fwd" + suffix, fwd.ms, 0, flops, conv_fields(s, kResNet18Count[i], fwd));
      CallTimes bwd_data = time_call([&] { kernels::conv2d_backward_input(g, w, in.shape(), p); });
      emit(base + "bwd_data" + suffix, bwd_data.ms, 0, flops, conv_fields(s, kResNet18Count[i], bwd_data));
      CallTimes bwd_filter = time_call([&] { kernels::conv2d_backward_weight(g, in, w.shape(), p); });
      emit(base + "bwd_filter" + suffix, bwd_filter.ms, 0, flops, conv_fields(s, kResNet18Count[i], bwd_filter));
    }
    emit("resnet18_convs_fwd_bwd_bf16" + suffix, total, 0, total_flops);
  }
  cuda::set_cudnn_benchmark(false);
}
