// Batch-norm kernel benchmark: ResNet-18's batch norms (batch 256, CIFAR) in bf16, NCHW and
// channels-last, training forward and backward, plain and fused with the residual add and ReLU
// (batch_norm_act's kernels), beside the device-to-device copy bandwidth measured in the same
// run. One JSON object per line; "gbps" counts the bytes each pass must move (forward: reads x
// twice, the residual once, writes the output; backward: reads grad, x and the saved output twice,
// writes the input gradient and the residual's).
// Usage: batch_norm_kernels [--dtype bf16|f16|f32]
#include <cstdio>
#include <cstring>
#include <string>

#include "gpu_timer.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/kernels.h"
#include "tandem/tandem.h"

using namespace tandem;

namespace {
const Device kGpu("cuda:0");

void emit(const std::string& name, double ms, double bytes) {
  std::printf("{\"framework\": \"tandem\", \"name\": \"%s\", \"ms\": %.5f, \"gbps\": %.1f}\n", name.c_str(), ms,
              bytes / ms / 1e6);
  std::fflush(stdout);
}

// (N, C, H, W) values in channels-last memory.
Tensor channels_last(const Tensor& t) { return permute(contiguous(permute(t, {0, 2, 3, 1})), {0, 3, 1, 2}); }

void bench_shape(const Shape& shape, DType dtype, bool nhwc, bool fused) {
  const int64_t c = shape[1];
  const TensorOptions act(dtype, kGpu), stat(DType::f32, kGpu);
  auto draw = [&] {
    Tensor t = kernels::to_dtype(randn(shape, TensorOptions(DType::f32, kGpu)), dtype);
    return nhwc ? channels_last(t) : t;
  };
  Tensor x = draw(), grad = draw(), residual = fused ? draw() : Tensor();
  Tensor w = ones({c}, stat), b = zeros({c}, stat), rm = zeros({c}, stat), rv = ones({c}, stat);
  kernels::BatchNormForward f = kernels::batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, residual, fused);
  const double bytes = static_cast<double>(x.nbytes());
  const std::string name = std::string("batch_norm") + (fused ? "_act" : "") + (nhwc ? "_nhwc_" : "_nchw_") +
                           dtype_name(dtype) + "_" + std::to_string(shape[0]) + "x" + std::to_string(c) + "x" +
                           std::to_string(shape[2]) + "x" + std::to_string(shape[3]);
  emit(name + "_fwd", bench::median_ms([&] { kernels::batch_norm(x, w, b, rm, rv, true, 0.1, 1e-5, residual, fused); }),
       bytes * (3 + (fused ? 1 : 0)));
  emit(name + "_bwd", bench::median_ms([&] {
         kernels::batch_norm_backward(grad, x, w, f.save_mean, f.save_invstd, fused ? f.out : Tensor(), fused);
       }),
       bytes * (fused ? 8 : 5));
}
}  // namespace

int main(int argc, char** argv) {
  if (!cuda::is_available()) {
    std::fprintf(stderr, "batch_norm_kernels: no CUDA device\n");
    return 1;
  }
  DType dtype = DType::bf16;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--dtype") == 0 && i + 1 < argc) {
      dtype = dtype_from_name(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: batch_norm_kernels [--dtype bf16|f16|f32]\n");
      return 2;
    }
  }
  const int64_t n = int64_t(1) << 26;  // 64 Mi f32 elements: far beyond L2
  Tensor a = randn({n}, TensorOptions(DType::f32, kGpu)), dst = empty({n}, TensorOptions(DType::f32, kGpu));
  emit("copy_d2d_f32", bench::median_ms([&] {
         TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), a.data_ptr(), a.nbytes(), cudaMemcpyDeviceToDevice,
                                           cuda::current_stream(0)));
       }),
       2.0 * a.nbytes());
  a = dst = Tensor();
  for (const Shape& shape :
       {Shape{256, 64, 32, 32}, Shape{256, 128, 16, 16}, Shape{256, 256, 8, 8}, Shape{256, 512, 4, 4}}) {
    for (bool nhwc : {false, true}) {
      for (bool fused : {false, true}) bench_shape(shape, dtype, nhwc, fused);
    }
  }
  return 0;
}
