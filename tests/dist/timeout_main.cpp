// A collective that one rank never joins: the ranks that did join raise from wait()/synchronize()
// once the timeout (2 s here) passes, with a message naming the rank, the operation and its size,
// and every later call on the group raises too. Runs under mpirun with two ranks; it has its own
// executable because it leaves its groups failed.
#include <mpi.h>

#include <chrono>

#include "dist/dist_test_util.h"

namespace tandem::dist {
namespace {

using ::tandem::testing::throws_with;

constexpr int kLateRank = 1;  // the rank that skips the collective

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(TimeoutTest, MpiCollectiveThatARankSkipsTimesOut) {
  const World& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs two ranks";
  ProcessGroup& group = *w.cpu_group;
  Tensor x = randn({1000}, DType::f32);  // 4000 bytes
  if (w.rank != kLateRank) {
    auto start = std::chrono::steady_clock::now();
    std::shared_ptr<Work> work = group.all_reduce(x);
    std::string rank = "rank " + std::to_string(w.rank);
    EXPECT_TRUE(throws_with<BackendError>([&] { work->wait(); },
                                          {rank, "mpi all_reduce", "4000 bytes", "timed out after", "timeout 2.00 s",
                                           "another rank probably died"}));
    double waited = seconds_since(start);
    EXPECT_GE(waited, 1.9);
    EXPECT_LT(waited, 10.0);
    EXPECT_TRUE(work->is_completed());
    EXPECT_EQ(work->elapsed_ms(), -1.0);
    EXPECT_TRUE(throws_with<BackendError>([&] { work->synchronize(); }, {rank, "timed out"}));
    EXPECT_TRUE(throws_with<BackendError>([&] { group.broadcast(x); },
                                          {rank, "mpi broadcast", "refused", "failed earlier", "timed out"}));
    EXPECT_TRUE(throws_with<BackendError>([&] { group.barrier(); }, {"refused"}));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (w.rank == kLateRank) {
    // Joining the collective late lets the others' abandoned requests complete (dist::finalize
    // drains them), so that every rank can still end cleanly.
    group.all_reduce(x)->wait();
  }
}

TEST(TimeoutTest, NcclCollectiveThatARankSkipsTimesOutAndIsAborted) {
  TANDEM_REQUIRE_NCCL();
  const World& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs two ranks";
  ProcessGroup& group = *w.gpu_group;
  Tensor x = kernels::to_device(randn({1000}, DType::f32), w.device);
  group.all_reduce(x)->synchronize();  // every rank: NCCL connects its peers on first use
  if (w.rank != kLateRank) {
    auto start = std::chrono::steady_clock::now();
    std::shared_ptr<Work> work = group.all_reduce(x);
    work->wait();  // orders the compute stream after it, without blocking or raising
    std::string rank = "rank " + std::to_string(w.rank);
    EXPECT_TRUE(throws_with<BackendError>(
        [&] { work->synchronize(); }, {rank, "nccl all_reduce", "4000 bytes", "timed out after", "timeout 2.00 s"}));
    double waited = seconds_since(start);
    EXPECT_GE(waited, 1.9);
    EXPECT_LT(waited, 15.0);
    EXPECT_TRUE(throws_with<BackendError>([&] { work->wait(); }, {rank, "timed out"}));
    EXPECT_TRUE(throws_with<BackendError>([&] { group.all_reduce(x); }, {rank, "refused", "failed earlier"}));
    // The aborted kernel has ended, so the compute stream that waited on it goes on.
    EXPECT_NO_THROW(x.to_double_vector());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (w.rank == kLateRank) {
    group.abort("the test skipped a collective on purpose");
    EXPECT_TRUE(throws_with<BackendError>([&] { group.all_reduce(x); }, {"refused", "aborted", "on purpose"}));
  }
}

}  // namespace
}  // namespace tandem::dist

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tandem::dist::InitOptions options;
  options.timeout_seconds = 2;
  tandem::dist::init(options);
  int status = RUN_ALL_TESTS();
  tandem::dist::finalize();
  return status;
}
