// GPU kernel benchmark: tandem's elementwise, cast, softmax, matmul and convolution kernels next
// to the ceilings measured in the same run (device-to-device copy bandwidth). Prints one JSON
// object per line; bench/compare_kernels.py puts them beside PyTorch's figures.
#include <cstdio>
#include <string>

#include "gpu_timer.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"
#include "tandem/tandem.h"

using namespace tandem;

namespace {
const Device kGpu("cuda:0");

void emit(const std::string& name, double ms, double bytes, double flops) {
  std::printf("{\"framework\": \"tandem\", \"name\": \"%s\", \"ms\": %.5f", name.c_str(), ms);
  if (bytes > 0) std::printf(", \"gbps\": %.1f", bytes / ms / 1e6);
  if (flops > 0) std::printf(", \"tflops\": %.1f", flops / ms / 1e9);
  std::printf("}\n");
  std::fflush(stdout);
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

int main() {
  if (!cuda::is_available()) {
    std::fprintf(stderr, "gpu_kernels: no CUDA device\n");
    return 1;
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

  // ResNet-18's convolutions, forward + backward (input and weight gradients), bf16, weighted by
  // how often each shape occurs in the network.
  for (bool benchmark : {false, true}) {
    cuda::set_cudnn_benchmark(benchmark);
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
      total_flops += 3.0 * 2.0 * out.numel() * s.c * s.r * s.r * kResNet18Count[i];
    }
    emit(benchmark ? "resnet18_convs_fwd_bwd_bf16_benchmark" : "resnet18_convs_fwd_bwd_bf16", total, 0, total_flops);
  }
  cuda::set_cudnn_benchmark(false);
  return 0;
}
