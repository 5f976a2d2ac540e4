// The CUDA caching allocator and streams (GPU only; skipped without one).
#include "support/test_util.h"
#include "tandem/core/cuda_api.h"

namespace tandem {
namespace {

TEST(CudaAllocator, ReusesFreedBlocksWithoutNewDeviceAllocations) {
  TANDEM_REQUIRE_CUDA();
  cuda::synchronize();
  { Tensor warm = empty({1 << 20}, TensorOptions(DType::f32, Device("cuda:0"))); }
  uint64_t before = cuda::memory_stats().num_device_allocs;
  for (int i = 0; i < 100; ++i) {
    Tensor t = empty({1 << 20}, TensorOptions(DType::f32, Device("cuda:0")));  // 4 MiB
  }
  EXPECT_EQ(cuda::memory_stats().num_device_allocs, before);
}

TEST(CudaAllocator, TracksAllocatedReservedAndPeak) {
  TANDEM_REQUIRE_CUDA();
  cuda::synchronize();
  cuda::reset_peak_memory_stats();
  size_t base = cuda::memory_allocated();
  {
    Tensor a = empty({3 << 20}, TensorOptions(DType::f32, Device("cuda:0")));  // 12 MiB
    EXPECT_GE(cuda::memory_allocated(), base + (12u << 20));
    EXPECT_GE(cuda::memory_reserved(), cuda::memory_allocated());
  }
  EXPECT_EQ(cuda::memory_allocated(), base);
  EXPECT_GE(cuda::max_memory_allocated(), base + (12u << 20));
  size_t reserved = cuda::memory_reserved();
  cuda::empty_cache();
  EXPECT_LT(cuda::memory_reserved(), reserved);  // the 12 MiB block's segment went back
}

TEST(CudaAllocator, AReusedLargeBlockCountsOnlyWhatWasAskedFor) {
  TANDEM_REQUIRE_CUDA();
  cuda::synchronize();
  const TensorOptions f32_gpu(DType::f32, Device("cuda:0"));
  // Two 8 MiB blocks side by side in one 20 MiB segment; the first freed stays an 8 MiB block.
  Tensor first = empty({2 << 20}, f32_gpu);
  Tensor second = empty({2 << 20}, f32_gpu);
  first = Tensor();
  const uint64_t device_allocs = cuda::memory_stats().num_device_allocs;
  const size_t base = cuda::memory_allocated();
  {
    // 7.5 MiB, most likely from that 8 MiB block: its last 0.5 MiB is split off, not counted.
    Tensor smaller = empty({(15 << 20) / 8}, f32_gpu);
    EXPECT_EQ(cuda::memory_allocated(), base + (15u << 19));
  }
  EXPECT_EQ(cuda::memory_allocated(), base);
  // The rest merged back: 8 MiB again without a new device allocation.
  Tensor again = empty({2 << 20}, f32_gpu);
  EXPECT_EQ(cuda::memory_stats().num_device_allocs, device_allocs);
}

TEST(CudaAllocator, SmallBlocksSplitAndMergeBack) {
  TANDEM_REQUIRE_CUDA();
  std::vector<Tensor> blocks;
  for (int i = 0; i < 50; ++i) blocks.push_back(empty({1000 + i * 37}, TensorOptions(DType::f32, Device("cuda:0"))));
  for (size_t i = 0; i < blocks.size(); i += 2) blocks[i] = Tensor();
  for (size_t i = 1; i < blocks.size(); i += 2) blocks[i] = Tensor();
  // After everything is free, a request for the whole segment can be served from the cache.
  uint64_t before = cuda::memory_stats().num_device_allocs;
  Tensor whole = empty({(1 << 20) / 4}, TensorOptions(DType::f32, Device("cuda:0")));
  EXPECT_EQ(cuda::memory_stats().num_device_allocs, before);
}

TEST(CudaAllocator, OutOfMemoryIsAClearErrorAndTheNextAllocationWorks) {
  TANDEM_REQUIRE_CUDA();
  Tensor keep = testing::random_tensor({1000}, TensorOptions(DType::f32, Device("cuda:0")));
  EXPECT_TRUE(testing::throws_with<OutOfMemoryError>(
      [] { empty({int64_t(1) << 40}, TensorOptions(DType::f32, Device("cuda:0"))); },  // 4 TiB
      {"out of memory", "cuda:0", "4096 GiB", "reserved", "peak"}));
  Tensor after = testing::random_tensor({1000}, TensorOptions(DType::f32, Device("cuda:0")));
  EXPECT_TRUE(testing::all_close(to(add(after, keep), Device()), add(to(after, Device()), to(keep, Device()))));
  EXPECT_GE(cuda::memory_stats().num_ooms, 1u);
}

TEST(CudaAllocator, WorkOnTandemsStreamIsVisibleAfterSynchronize) {
  TANDEM_REQUIRE_CUDA();
  // Work queued on tandem's stream completes in order and is visible after synchronize.
  Tensor x = testing::random_tensor({1 << 16}, TensorOptions(DType::f32, Device("cuda:0")));
  Tensor y = exp(x);
  cuda::synchronize();
  EXPECT_TRUE(testing::all_close(to(y, Device()), exp(to(x, Device())), 1e-6, 1e-6));
}

}  // namespace
}  // namespace tandem
