// How much of a memory-bound optimizer update can hide behind compute-bound matrix products when
// the two run at once on one GPU: the question behind updating parameters during backward.
//
// The products are the MLP workload's backward for three 4096 x 4096 layers at batch 1024 (for
// each layer the input gradient, 4096 x 1024 x 4096, and the weight gradient, 4096 x 4096 x
// 1024; bf16 in, f32 accumulation, cuBLASLt's first heuristic algorithm). The update is a stand-in
// for AdamW with f32 master weights over those layers' 50.3M parameters: it moves the same 28 bytes
// per parameter (reads the f32 master, both f32 moments and the bf16 gradient; writes the master,
// the moments and the bf16 weight). Timed, median of 20 after warm-up:
//
// - each alone on the whole GPU, one after the other, and both at once on two streams;
// - the SMs split: the products told to plan for (SMs - k) SMs (cuBLASLt's SM_COUNT_TARGET), the
//   update on k SMs (k blocks of 1024 threads, each holding enough shared memory that an SM takes
//   only one of them);
// - the SMs partitioned with green contexts: the products on one partition, the update on another.
//
//   build/bench/update_beside_matmul
#include <cublasLt.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <vector>

#include "gpu_timer.h"
#include "tandem/core/cuda/cublaslt.h"
#include "tandem/core/cuda/runtime.h"

namespace {

namespace lt = tandem::cuda::lt;
using bf16 = __nv_bfloat16;

#define BENCH_CU_CHECK(call)                                                                \
  do {                                                                                      \
    const CUresult result_ = (call);                                                        \
    TANDEM_CHECK(result_ == CUDA_SUCCESS, #call, " failed with driver error ", result_);    \
  } while (0)

constexpr int kLayers = 3;
constexpr int64_t kWidth = 4096, kBatch = 1024;
constexpr int64_t kParams = kLayers * kWidth * kWidth;  // 50.3M
constexpr int kFatThreads = 1024;
constexpr int kFatSharedBytes = 150 * 1024;  // more than half an SM's shared memory: one block per SM

// Values in [-0.1, 0.1) from a hash of the index: varied inputs, not a buffer of zeros.
__global__ void fill_bf16(bf16* p, int64_t n, unsigned seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i * 2654435761u) ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.0f - 0.5f) * 0.2f);
  }
}

__global__ void fill_f32(float* p, int64_t n, float value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p[i] = value;
  }
}

// AdamW's arithmetic and memory traffic, four elements per thread and iteration.
__global__ void adamw_stand_in(float4* master, float4* m, float4* v,  // (n4,) each
                               const uint2* grad, uint2* weight,      // (n4,) of 4 bf16 each
                               int64_t n4) {
  const float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, decay = 0.01f;
  const float correction1 = 1.0f / (1.0f - beta1), correction2 = 1.0f / (1.0f - beta2);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 p4 = master[i], m4 = m[i], v4 = v[i];
    uint2 g4 = grad[i], w4;
    const bf16* g = reinterpret_cast<const bf16*>(&g4);
    bf16* w = reinterpret_cast<bf16*>(&w4);
    float* p = &p4.x;
    float* mm = &m4.x;
    float* vv = &v4.x;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float gk = __bfloat162float(g[k]);
      mm[k] = beta1 * mm[k] + (1 - beta1) * gk;
      vv[k] = beta2 * vv[k] + (1 - beta2) * gk * gk;
      p[k] = p[k] * (1 - lr * decay) - lr * (mm[k] * correction1) / (sqrtf(vv[k] * correction2) + eps);
      w[k] = __float2bfloat16(p[k]);
    }
    master[i] = p4;
    m[i] = m4;
    v[i] = v4;
    weight[i] = w4;
  }
}

struct UpdateBuffers {
  float* master;  // (kParams,)
  float* m;       // (kParams,)
  float* v;       // (kParams,)
  bf16* grad;     // (kParams,)
  bf16* weight;   // (kParams,)
};

void launch_update(const UpdateBuffers& b, int blocks, int threads, int shared_bytes, cudaStream_t stream) {
  adamw_stand_in<<<blocks, threads, shared_bytes, stream>>>(
      reinterpret_cast<float4*>(b.master), reinterpret_cast<float4*>(b.m), reinterpret_cast<float4*>(b.v),
      reinterpret_cast<const uint2*>(b.grad), reinterpret_cast<uint2*>(b.weight), kParams / 4);
  TANDEM_CUDA_CHECK(cudaGetLastError());
}

// One product D (rows x cols) = A (rows x k) * op(B), bf16, column-major as cuBLASLt sees it,
// with the library's descriptor wrappers and cuBLASLt's first heuristic algorithm.
struct Product {
  Product(int64_t rows, int64_t cols, int64_t k, bool transpose_b, int sm_target)
      : desc(lt::types_for(tandem::DType::bf16), false, transpose_b),
        a(CUDA_R_16BF, rows, k, rows, 1, 0),
        b(CUDA_R_16BF, transpose_b ? cols : k, transpose_b ? k : cols, transpose_b ? cols : k, 1, 0),
        d(CUDA_R_16BF, rows, cols, rows, 1, 0) {
    if (sm_target > 0) {
      TANDEM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.get(), CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                         &sm_target, sizeof sm_target));
    }
    cublasLtMatmulPreference_t preference;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const size_t workspace_bytes = lt::kWorkspaceBytes;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace_bytes, sizeof workspace_bytes));
    cublasLtMatmulHeuristicResult_t result = {};
    int found = 0;
    TANDEM_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt::handle(0), desc.get(), a.get(), b.get(), d.get(), d.get(),
                                                       preference, 1, &result, &found));
    TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(preference));
    TANDEM_CHECK(found == 1, "cuBLASLt has no algorithm for ", rows, " x ", cols, " x ", k);
    algo = result.algo;
  }
  lt::MatmulDesc desc;
  lt::Layout a, b, d;
  cublasLtMatmulAlgo_t algo;
};

struct Products {
  void* workspace;  // (lt::kWorkspaceBytes,)
  bf16* a;          // (kWidth * kWidth,)
  bf16* b;          // (kWidth * kWidth,)
  bf16* d;          // (kWidth * kWidth,)

  // The backward's products, planned for sm_target SMs (0: the whole GPU).
  std::vector<std::unique_ptr<Product>> plan(int sm_target) const {
    std::vector<std::unique_ptr<Product>> products;
    for (int layer = 0; layer < kLayers; ++layer) {
      products.push_back(std::make_unique<Product>(kWidth, kBatch, kWidth, false, sm_target));  // input gradient
      products.push_back(std::make_unique<Product>(kWidth, kWidth, kBatch, true, sm_target));   // weight gradient
    }
    return products;
  }

  void run(const std::vector<std::unique_ptr<Product>>& products, cudaStream_t stream) const {
    const float alpha = 1, beta = 0;
    for (const auto& p : products) {
      TANDEM_CUBLAS_CHECK(cublasLtMatmul(lt::handle(0), p->desc.get(), &alpha, a, p->a.get(), b, p->b.get(), &beta,
                                         d, p->d.get(), d, p->d.get(), &p->algo, workspace, lt::kWorkspaceBytes,
                                         stream));
    }
  }
};

// Runs `products` on `product_stream` and `update` on `update_stream` at once, both after the
// main stream's work so far; the main stream then waits for both.
void run_beside(cudaStream_t main, cudaStream_t product_stream, cudaStream_t update_stream,
                const std::function<void(cudaStream_t)>& products, const std::function<void(cudaStream_t)>& update) {
  static cudaEvent_t start = nullptr, products_done = nullptr, update_done = nullptr;
  if (start == nullptr) {
    for (cudaEvent_t* e : {&start, &products_done, &update_done}) {
      TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
  }
  TANDEM_CUDA_CHECK(cudaEventRecord(start, main));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(product_stream, start));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(update_stream, start));
  products(product_stream);
  update(update_stream);
  TANDEM_CUDA_CHECK(cudaEventRecord(products_done, product_stream));
  TANDEM_CUDA_CHECK(cudaEventRecord(update_done, update_stream));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(main, products_done));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(main, update_done));
}

}  // namespace

int main() {
  using tandem::bench::median_ms;
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop;
  TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  cudaStream_t main_stream = tandem::cuda::current_stream(0);

  Products products;
  TANDEM_CUDA_CHECK(cudaMalloc(&products.workspace, lt::kWorkspaceBytes));
  for (bf16** p : {&products.a, &products.b, &products.d}) TANDEM_CUDA_CHECK(cudaMalloc(p, kWidth * kWidth * 2));
  fill_bf16<<<1024, 256, 0, main_stream>>>(products.a, kWidth * kWidth, 1);
  fill_bf16<<<1024, 256, 0, main_stream>>>(products.b, kWidth * kWidth, 2);
  UpdateBuffers update;
  for (float** p : {&update.master, &update.m, &update.v}) TANDEM_CUDA_CHECK(cudaMalloc(p, kParams * 4));
  for (bf16** p : {&update.grad, &update.weight}) TANDEM_CUDA_CHECK(cudaMalloc(p, kParams * 2));
  fill_f32<<<1024, 256, 0, main_stream>>>(update.master, kParams, 0.5f);
  fill_f32<<<1024, 256, 0, main_stream>>>(update.m, kParams, 0.01f);
  fill_f32<<<1024, 256, 0, main_stream>>>(update.v, kParams, 0.001f);
  fill_bf16<<<1024, 256, 0, main_stream>>>(update.grad, kParams, 3);
  tandem::cuda::allow_dynamic_shared_memory(adamw_stand_in, 0, kFatSharedBytes);
  cudaStream_t side_a, side_b;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_a, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_b, cudaStreamNonBlocking));

  const auto whole = products.plan(0);
  const int whole_blocks = sms * 8;  // 256 threads each
  const double flops = kLayers * 2 * 2.0 * kWidth * kWidth * kBatch;
  const double update_bytes = 28.0 * kParams;
  const double products_ms = median_ms([&] { products.run(whole, main_stream); });
  const double update_ms = median_ms([&] { launch_update(update, whole_blocks, 256, 0, main_stream); });
  const double sequential_ms = median_ms([&] {
    products.run(whole, main_stream);
    launch_update(update, whole_blocks, 256, 0, main_stream);
  });
  const double together_ms = median_ms([&] {
    run_beside(
        main_stream, side_a, side_b, [&](cudaStream_t s) { products.run(whole, s); },
        [&](cudaStream_t s) { launch_update(update, whole_blocks, 256, 0, s); });
  });
  std::printf("%s, %d SMs. Products %.3f ms (%.0f TFLOPS), update %.3f ms (%.2f TB/s): one after the other %.3f ms, "
              "at once on two streams %.3f ms\n",
              prop.name, sms, products_ms, flops / products_ms / 1e9, update_ms, update_bytes / update_ms / 1e9,
              sequential_ms, together_ms);

  std::printf("\n%-30s %4s %13s %11s %9s %9s\n", "split", "k", "products ms", "update ms", "at once", "saved");
  for (int k : {16, 24, 32, 40, 48, 64}) {
    const auto planned = products.plan(sms - k);
    auto fat_update = [&](cudaStream_t s) { launch_update(update, k, kFatThreads, kFatSharedBytes, s); };
    const double p_ms = median_ms([&] { products.run(planned, main_stream); });
    const double u_ms = median_ms([&] { fat_update(main_stream); });
    const double both_ms = median_ms([&] {
      run_beside(main_stream, side_a, side_b, [&](cudaStream_t s) { products.run(planned, s); }, fat_update);
    });
    std::printf("%-30s %4d %13.3f %11.3f %9.3f %9.3f\n", "SM target + one block per SM", k, p_ms, u_ms, both_ms,
                sequential_ms - both_ms);
  }

  // Green contexts: disjoint SM partitions, each with its own stream.
  BENCH_CU_CHECK(cuInit(0));
  CUdevice device;
  BENCH_CU_CHECK(cuDeviceGet(&device, 0));
  CUdevResource all_sms;
  BENCH_CU_CHECK(cuDeviceGetDevResource(device, &all_sms, CU_DEV_RESOURCE_TYPE_SM));
  for (int k : {16, 24, 32, 40, 48, 64}) {
    CUdevResource update_sms, product_sms;
    unsigned groups = 1;
    BENCH_CU_CHECK(cuDevSmResourceSplitByCount(&update_sms, &groups, &all_sms, &product_sms, 0, k));
    TANDEM_CHECK(groups == 1, "no partition of ", k, " SMs");
    CUdevResourceDesc update_desc, product_desc;
    BENCH_CU_CHECK(cuDevResourceGenerateDesc(&update_desc, &update_sms, 1));
    BENCH_CU_CHECK(cuDevResourceGenerateDesc(&product_desc, &product_sms, 1));
    CUgreenCtx update_ctx, product_ctx;
    BENCH_CU_CHECK(cuGreenCtxCreate(&update_ctx, update_desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
    BENCH_CU_CHECK(cuGreenCtxCreate(&product_ctx, product_desc, device, CU_GREEN_CTX_DEFAULT_STREAM));
    CUstream update_stream, product_stream;
    BENCH_CU_CHECK(cuGreenCtxStreamCreate(&update_stream, update_ctx, CU_STREAM_NON_BLOCKING, 0));
    BENCH_CU_CHECK(cuGreenCtxStreamCreate(&product_stream, product_ctx, CU_STREAM_NON_BLOCKING, 0));
    const int update_count = static_cast<int>(update_sms.sm.smCount);
    const auto planned = products.plan(static_cast<int>(product_sms.sm.smCount));
    auto partitioned_update = [&](cudaStream_t s) { launch_update(update, update_count * 8, 256, 0, s); };
    auto partitioned_products = [&](cudaStream_t s) { products.run(planned, s); };
    const double p_ms = median_ms([&] {
      run_beside(main_stream, product_stream, update_stream, partitioned_products, [](cudaStream_t) {});
    });
    const double u_ms = median_ms([&] {
      run_beside(main_stream, product_stream, update_stream, [](cudaStream_t) {}, partitioned_update);
    });
    const double both_ms = median_ms(
        [&] { run_beside(main_stream, product_stream, update_stream, partitioned_products, partitioned_update); });
    std::printf("%-30s %4d %13.3f %11.3f %9.3f %9.3f\n", "green contexts", update_count, p_ms, u_ms, both_ms,
                sequential_ms - both_ms);
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    BENCH_CU_CHECK(cuStreamDestroy(update_stream));
    BENCH_CU_CHECK(cuStreamDestroy(product_stream));
    BENCH_CU_CHECK(cuGreenCtxDestroy(update_ctx));
    BENCH_CU_CHECK(cuGreenCtxDestroy(product_ctx));
  }
  return 0;
}
