// dist::init() and the World it describes.
#include <cstdlib>

#include "dist/dist_test_util.h"

namespace tandem::dist {
namespace {

using ::tandem::testing::throws_with;

TEST(WorldTest, InitIsIdempotent) {
  ASSERT_TRUE(is_initialized());
  const World& w = world();
  EXPECT_EQ(&init(), &w);
  EXPECT_EQ(&init(InitOptions{5, false}), &w);  // later options change nothing
  EXPECT_EQ(init().cpu_group, w.cpu_group);
}

TEST(WorldTest, RanksMatchTheLauncher) {
  const World& w = world();
  EXPECT_GE(w.rank, 0);
  EXPECT_LT(w.rank, w.size);
  EXPECT_GE(w.local_rank, 0);
  EXPECT_LT(w.local_rank, w.local_size);
  EXPECT_LE(w.local_size, w.size);
  if (const char* rank = std::getenv("OMPI_COMM_WORLD_RANK")) EXPECT_EQ(w.rank, std::atoi(rank));
  if (const char* size = std::getenv("OMPI_COMM_WORLD_SIZE")) EXPECT_EQ(w.size, std::atoi(size));
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) EXPECT_EQ(w.local_rank, std::atoi(local));
  EXPECT_EQ(w.cpu_group->rank(), w.rank);
  EXPECT_EQ(w.cpu_group->size(), w.size);
}

TEST(WorldTest, EveryRankCounts) {
  const World& w = world();
  Tensor one = ones({1}, DType::i64);
  w.cpu_group->all_reduce(one, ReduceOp::sum)->wait();
  EXPECT_EQ(one.item<int64_t>(), w.size);
  Tensor rank = full({1}, w.rank, DType::i64);
  w.cpu_group->all_reduce(rank, ReduceOp::max)->wait();
  EXPECT_EQ(rank.item<int64_t>(), w.size - 1);
}

TEST(WorldTest, GroupsFollowTheDevice) {
  const World& w = world();
  EXPECT_EQ(w.cpu_group->backend(), "mpi");
  EXPECT_EQ(&w.group_for(Device()), w.cpu_group.get());
  if (!::tandem::testing::cuda_available()) {
    EXPECT_TRUE(w.device.is_cpu());
    EXPECT_EQ(w.gpu_group, nullptr);
    EXPECT_TRUE(throws_with<DeviceError>([&] { w.group_for(Device(DeviceType::cuda, 0)); }, {"cuda:0", "cpu"}));
    return;
  }
  ASSERT_TRUE(w.device.is_cuda());
  EXPECT_EQ(w.device.index, w.local_rank % cuda::device_count());
  Device other(DeviceType::cuda, w.device.index + 1);
  EXPECT_TRUE(throws_with<DeviceError>([&] { w.group_for(other); }, {"bound to", w.device.str()}));
  if (w.gpu_group != nullptr) {
    EXPECT_EQ(w.gpu_group->backend(), "nccl");
    EXPECT_EQ(w.gpu_group->rank(), w.rank);
    EXPECT_EQ(w.gpu_group->size(), w.size);
    EXPECT_EQ(&w.group_for(w.device), w.gpu_group.get());
  } else {
    EXPECT_TRUE(throws_with<DeviceError>([&] { w.group_for(w.device); }, {"no NCCL process group"}));
  }
}

}  // namespace
}  // namespace tandem::dist
