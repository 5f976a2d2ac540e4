// Every collective of both process groups against results each rank computes itself: rank r's
// input is drawn from (a fresh seed shared by all ranks, r), so every rank can regenerate every
// other rank's data. GPU cases run on the NCCL group and skip where there is none.
#include <chrono>
#include <thread>

#include "dist/dist_test_util.h"
#include "tandem/core/views.h"

namespace tandem::dist {
namespace {

using ::tandem::testing::all_close;
using ::tandem::testing::throws_with;
using testing::all_inputs;
using testing::device_label;
using testing::device_of;
using testing::group_of;
using testing::launches_alone;
using testing::rank_input;
using testing::reduce_all;
using testing::rtol_for;
using testing::shared_seed;

// A fresh size per case, so that odd counts and several NCCL chunkings come up.
int64_t size_from(uint64_t seed) { return 1 + static_cast<int64_t>(seed % 5000); }

// ---- reductions: all_reduce and reduce_scatter, dtype x op x device ----

using ReduceParam = std::tuple<DType, ReduceOp, bool>;

class ReduceTest : public ::testing::TestWithParam<ReduceParam> {
 protected:
  void SetUp() override {
    if (std::get<2>(GetParam())) TANDEM_REQUIRE_NCCL();
  }
};

TEST_P(ReduceTest, AllReduce) {
  auto [dtype, op, gpu] = GetParam();
  const World& w = world();
  uint64_t seed = shared_seed();
  Shape shape{size_from(seed)};
  Tensor x = kernels::to_device(rank_input(seed, w.rank, shape, dtype), device_of(gpu));
  std::shared_ptr<Work> work = group_of(gpu).all_reduce(x, op);
  work->wait();
  std::vector<double> expected = reduce_all(all_inputs(seed, w.size, shape, dtype), op, dtype);
  EXPECT_TRUE(all_close(x, expected, rtol_for(dtype), 0.0));
  EXPECT_TRUE(work->is_completed() || gpu);  // a GPU wait() only orders the caller's stream
  work->synchronize();
  EXPECT_TRUE(work->is_completed());
  // MPI times on the host; NCCL only inside TimedCollectives (the test below), and a group of one
  // that launches nothing reports 0.
  if (!gpu) EXPECT_GE(work->elapsed_ms(), 0.0);
}

TEST_P(ReduceTest, ReduceScatter) {
  auto [dtype, op, gpu] = GetParam();
  const World& w = world();
  uint64_t seed = shared_seed();
  int64_t n = size_from(seed);
  Shape shape{w.size * n};
  Tensor input = kernels::to_device(rank_input(seed, w.rank, shape, dtype), device_of(gpu));
  Tensor output = kernels::to_device(full({n}, 7, dtype), device_of(gpu));
  group_of(gpu).reduce_scatter(output, input, op)->wait();
  std::vector<double> all = reduce_all(all_inputs(seed, w.size, shape, dtype), op, dtype);
  std::vector<double> expected(all.begin() + w.rank * n, all.begin() + (w.rank + 1) * n);
  EXPECT_TRUE(all_close(output, expected, rtol_for(dtype), 0.0));
}

std::string reduce_name(const ::testing::TestParamInfo<ReduceParam>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" + reduce_op_name(std::get<1>(info.param)) + "_" +
         device_label(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Cpu, ReduceTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f64, DType::i64, DType::f16,
                                                              DType::bf16),
                                            ::testing::Values(ReduceOp::sum, ReduceOp::avg, ReduceOp::max,
                                                              ReduceOp::min),
                                            ::testing::Values(false)),
                         reduce_name);
INSTANTIATE_TEST_SUITE_P(Gpu, ReduceTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f64, DType::i64, DType::f16,
                                                              DType::bf16),
                                            ::testing::Values(ReduceOp::sum, ReduceOp::avg, ReduceOp::max,
                                                              ReduceOp::min),
                                            ::testing::Values(true)),
                         reduce_name);

// ---- data movement: broadcast and all_gather, dtype x device ----

using MoveParam = std::tuple<DType, bool>;

class MoveTest : public ::testing::TestWithParam<MoveParam> {
 protected:
  void SetUp() override {
    if (std::get<1>(GetParam())) TANDEM_REQUIRE_NCCL();
  }
};

TEST_P(MoveTest, BroadcastFromRankOne) {
  auto [dtype, gpu] = GetParam();
  const World& w = world();
  int root = w.size > 1 ? 1 : 0;
  uint64_t seed = shared_seed();
  Shape shape{size_from(seed)};
  Tensor x = kernels::to_device(rank_input(seed, w.rank, shape, dtype), device_of(gpu));
  group_of(gpu).broadcast(x, root)->wait();
  EXPECT_TRUE(all_close(x, rank_input(seed, root, shape, dtype), 0.0, 0.0));
}

TEST_P(MoveTest, AllGather) {
  auto [dtype, gpu] = GetParam();
  const World& w = world();
  uint64_t seed = shared_seed();
  int64_t n = size_from(seed);
  Tensor input = kernels::to_device(rank_input(seed, w.rank, {n}, dtype), device_of(gpu));
  Tensor output = kernels::to_device(zeros({w.size * n}, dtype), device_of(gpu));
  group_of(gpu).all_gather(output, input)->wait();
  std::vector<double> expected;
  for (const auto& values : all_inputs(seed, w.size, {n}, dtype)) {
    expected.insert(expected.end(), values.begin(), values.end());
  }
  EXPECT_TRUE(all_close(output, expected, 0.0, 0.0));
}

TEST_P(MoveTest, AllGatherInPlace) {
  auto [dtype, gpu] = GetParam();
  const World& w = world();
  uint64_t seed = shared_seed();
  int64_t n = size_from(seed);
  Tensor output = kernels::to_device(zeros({w.size * n}, dtype), device_of(gpu));
  Tensor mine = views::narrow(output, 0, w.rank * n, n);
  kernels::copy_(mine, rank_input(seed, w.rank, {n}, dtype));
  group_of(gpu).all_gather(output, mine)->wait();
  std::vector<double> expected;
  for (const auto& values : all_inputs(seed, w.size, {n}, dtype)) {
    expected.insert(expected.end(), values.begin(), values.end());
  }
  EXPECT_TRUE(all_close(output, expected, 0.0, 0.0));
}

std::string move_name(const ::testing::TestParamInfo<MoveParam>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + "_" + device_label(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(All, MoveTest,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f64, DType::i64, DType::f16,
                                                              DType::bf16, DType::u8, DType::boolean),
                                            ::testing::Values(false, true)),
                         move_name);

// ---- the rest, on both devices ----

class GroupTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) TANDEM_REQUIRE_NCCL();
  }
};

TEST_P(GroupTest, GroupedAllReduce) {
  bool gpu = GetParam();
  const World& w = world();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
    uint64_t seed = shared_seed();
    std::vector<DType> dtypes{DType::f32, DType::f64, DType::i64};
    std::vector<Shape> shapes{{size_from(seed)}, {3, 1 + static_cast<int64_t>(seed % 97)}, {1}};
    std::vector<Tensor> tensors;
    for (size_t i = 0; i < dtypes.size(); ++i) {
      tensors.push_back(kernels::to_device(rank_input(seed + i, w.rank, shapes[i], dtypes[i]), device_of(gpu)));
    }
    group_of(gpu).all_reduce(tensors, op)->wait();
    for (size_t i = 0; i < dtypes.size(); ++i) {
      std::vector<double> expected = reduce_all(all_inputs(seed + i, w.size, shapes[i], dtypes[i]), op, dtypes[i]);
      EXPECT_TRUE(all_close(tensors[i], expected, rtol_for(dtypes[i]), 0.0))
          << "tensor " << i << ", " << reduce_op_name(op);
    }
  }
}

TEST_P(GroupTest, ReduceScatterInPlace) {
  bool gpu = GetParam();
  const World& w = world();
  uint64_t seed = shared_seed();
  int64_t n = size_from(seed);
  Shape shape{w.size * n};
  Tensor input = kernels::to_device(rank_input(seed, w.rank, shape, DType::f32), device_of(gpu));
  Tensor mine = views::narrow(input, 0, w.rank * n, n);
  group_of(gpu).reduce_scatter(mine, input, ReduceOp::sum)->wait();
  std::vector<double> all = reduce_all(all_inputs(seed, w.size, shape, DType::f32), ReduceOp::sum, DType::f32);
  std::vector<double> expected(all.begin() + w.rank * n, all.begin() + (w.rank + 1) * n);
  EXPECT_TRUE(all_close(mine, expected, rtol_for(DType::f32), 0.0));
}

TEST_P(GroupTest, SeveralInFlightCompleteInOrder) {
  bool gpu = GetParam();
  const World& w = world();
  uint64_t seed = shared_seed();
  std::vector<Tensor> xs;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(kernels::to_device(rank_input(seed + i, w.rank, {257 * (i + 1)}, DType::f32), device_of(gpu)));
    works.push_back(group_of(gpu).all_reduce(xs.back(), ReduceOp::sum));
  }
  for (int i = 7; i >= 0; --i) works[i]->synchronize();  // waiting out of order is fine
  for (int i = 0; i < 8; ++i) {
    std::vector<double> expected =
        reduce_all(all_inputs(seed + i, w.size, {257 * (i + 1)}, DType::f32), ReduceOp::sum, DType::f32);
    EXPECT_TRUE(all_close(xs[i], expected, rtol_for(DType::f32), 0.0)) << "collective " << i;
  }
}

TEST_P(GroupTest, WorkKeepsTensorsAliveUntilCompletion) {
  bool gpu = GetParam();
  const World& w = world();
  uint64_t seed = shared_seed();
  Tensor x = kernels::to_device(rank_input(seed, w.rank, {4096}, DType::f32), device_of(gpu));
  long before = x.use_count();
  // The other ranks join late, so rank 0's collective cannot have completed when it looks.
  if (w.rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::shared_ptr<Work> work = group_of(gpu).all_reduce(x, ReduceOp::avg);
  if (w.rank == 0 && w.size > 1) {
    EXPECT_FALSE(work->is_completed());
    EXPECT_GT(x.use_count(), before);
  }
  work->synchronize();
  EXPECT_EQ(x.use_count(), before);  // released once complete
  std::vector<double> expected = reduce_all(all_inputs(seed, w.size, {4096}, DType::f32), ReduceOp::avg, DType::f32);
  EXPECT_TRUE(all_close(x, expected, rtol_for(DType::f32), 0.0));
}

TEST_P(GroupTest, BarrierWaitsForTheSlowestRank) {
  bool gpu = GetParam();
  const World& w = world();
  ProcessGroup& group = group_of(gpu);
  group.barrier();  // line up first
  auto start = std::chrono::steady_clock::now();
  if (w.rank == w.size - 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  group.barrier();
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (w.size > 1) EXPECT_GT(waited, 0.2) << "rank " << w.rank << " left the barrier before the last rank came";
}

TEST_P(GroupTest, ArgumentErrorsAreClear) {
  bool gpu = GetParam();
  const World& w = world();
  ProcessGroup& group = group_of(gpu);
  std::string name = group.backend();
  Tensor m = kernels::to_device(randn({4, 6}), device_of(gpu));
  Tensor t = views::transpose(m, 0, 1);
  EXPECT_TRUE(throws_with<ValueError>([&] { group.all_reduce(t); }, {name, "all_reduce", "not contiguous"}));
  Tensor x = kernels::to_device(randn({10}), device_of(gpu));
  Tensor wrong = kernels::to_device(zeros({10 * w.size + 1}), device_of(gpu));
  EXPECT_TRUE(throws_with<ValueError>([&] { group.all_gather(wrong, x); }, {name, "all_gather", "output has"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { group.reduce_scatter(x, wrong); }, {name, "reduce_scatter"}));
  Tensor other = kernels::to_device(zeros({10 * w.size}, DType::f64), device_of(gpu));
  EXPECT_TRUE(throws_with<TypeError>([&] { group.all_gather(other, x); }, {"f64", "f32"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { group.broadcast(x, w.size); }, {"root", std::to_string(w.size)}));
  EXPECT_TRUE(throws_with<ValueError>([&] { group.all_reduce(std::vector<Tensor>{x, x}); }, {"share memory"}));
  Tensor flags = kernels::to_device(zeros({3}, DType::boolean), device_of(gpu));
  EXPECT_TRUE(throws_with<TypeError>([&] { group.all_reduce(flags, ReduceOp::sum); }, {"bool", "sum"}));
}

INSTANTIATE_TEST_SUITE_P(All, GroupTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return device_label(info.param); });

// ---- what only one backend has ----

TEST(MpiGroupTest, CudaTensorsBelongToTheNcclGroup) {
  TANDEM_REQUIRE_CUDA();
  Tensor x = kernels::to_device(randn({8}), Device(DeviceType::cuda, 0));
  EXPECT_TRUE(throws_with<DeviceError>([&] { world().cpu_group->all_reduce(x); }, {"mpi", "cuda:0", "cpu"}));
}

TEST(NcclGroupTest, CpuTensorsBelongToTheMpiGroup) {
  TANDEM_REQUIRE_NCCL();
  Tensor x = randn({8});
  EXPECT_TRUE(throws_with<DeviceError>([&] { world().gpu_group->all_reduce(x); }, {"nccl", "cpu"}));
}

TEST(NcclGroupTest, WaitOrdersTheCallersStreamWithoutBlocking) {
  TANDEM_REQUIRE_NCCL();
  const World& w = world();
  uint64_t seed = shared_seed();
  Shape shape{1 << 20};
  Tensor x = kernels::to_device(rank_input(seed, w.rank, shape, DType::f32), w.device);
  std::shared_ptr<Work> work;
  {
    TimedCollectives timed;
    work = w.gpu_group->all_reduce(x, ReduceOp::sum);
  }
  work->wait();
  // Work queued after wait() on the compute stream sees the reduced values.
  Tensor doubled = kernels::unary(UnaryOp::scale, x, 2.0);
  std::vector<double> expected = reduce_all(all_inputs(seed, w.size, shape, DType::f32), ReduceOp::sum, DType::f32);
  for (double& v : expected) v *= 2;
  EXPECT_TRUE(all_close(doubled, expected, rtol_for(DType::f32), 0.0));
  work->synchronize();
  // A group of one launches nothing for an in-place all-reduce: no device time to report. Made to
  // launch, NCCL has nothing to do for one rank in place: its events may be a few us apart, or none.
  if (w.size > 1) {
    EXPECT_GT(work->elapsed_ms(), 0.0);
  } else if (launches_alone(*w.gpu_group)) {
    EXPECT_GE(work->elapsed_ms(), 0.0);
  } else {
    EXPECT_EQ(work->elapsed_ms(), 0.0);
  }
}

// NCCL collectives carry timing events only inside TimedCollectives (a timing event costs the
// stream some 3 us): outside, elapsed_ms() is -1 once completed, never a host-side guess; inside,
// the device time, on either stream. Scopes nest.
TEST(NcclGroupTest, CollectivesAreTimedOnlyWhenAsked) {
  TANDEM_REQUIRE_NCCL();
  const World& w = world();
  if (w.size == 1 && !launches_alone(*w.gpu_group)) {
    GTEST_SKIP() << "a group of one that launches nothing times nothing";
  }
  uint64_t seed = shared_seed();
  Tensor x = kernels::to_device(rank_input(seed, w.rank, Shape{1 << 16}, DType::f32), w.device);
  std::shared_ptr<Work> untimed = w.gpu_group->all_reduce(x, ReduceOp::sum, "untimed");
  std::shared_ptr<Work> timed, nested, on_current_stream;
  {
    TimedCollectives outer;
    timed = w.gpu_group->all_reduce(x, ReduceOp::sum, "timed");
    {
      TimedCollectives inner;
      nested = w.gpu_group->all_reduce(x, ReduceOp::sum, "nested");
    }
    CollectivesOnCurrentStream here;
    on_current_stream = w.gpu_group->all_reduce(x, ReduceOp::sum, "timed on the current stream");
  }
  std::shared_ptr<Work> after = w.gpu_group->all_reduce(x, ReduceOp::sum, "untimed again");
  for (const auto& work : {untimed, timed, nested, on_current_stream, after}) work->synchronize();
  EXPECT_EQ(untimed->elapsed_ms(), -1.0);
  EXPECT_EQ(after->elapsed_ms(), -1.0);
  EXPECT_GE(timed->elapsed_ms(), 0.0);
  EXPECT_GE(nested->elapsed_ms(), 0.0);
  EXPECT_GE(on_current_stream->elapsed_ms(), 0.0);
  EXPECT_TRUE(untimed->is_completed() && after->is_completed());
}

// Inside a CollectivesOnCurrentStream scope the collectives run on the caller's stream: work queued
// after them on that stream sees their results even without wait(), and a reduce-scatter and an
// all-gather in a row give the all-reduce's values.
TEST(NcclGroupTest, CollectivesOnTheCurrentStreamOrderWithItsWork) {
  TANDEM_REQUIRE_NCCL();
  const World& w = world();
  uint64_t seed = shared_seed();
  const int64_t n = 4099;  // elements per rank's block: odd, so no vector path lines up by luck
  Shape shape{w.size * n};
  std::vector<double> expected = reduce_all(all_inputs(seed, w.size, shape, DType::f32), ReduceOp::sum, DType::f32);
  Tensor x = kernels::to_device(rank_input(seed, w.rank, shape, DType::f32), w.device);
  Tensor again = kernels::to_device(rank_input(seed, w.rank, shape, DType::f32), w.device);
  Tensor mine = empty({n}, TensorOptions(DType::f32, w.device));
  Tensor gathered = empty(shape, TensorOptions(DType::f32, w.device));
  Tensor doubled;
  {
    CollectivesOnCurrentStream on_this_stream;
    TimedCollectives timed;
    std::shared_ptr<Work> reduced = w.gpu_group->all_reduce(x, ReduceOp::sum, "on the current stream");
    doubled = kernels::unary(UnaryOp::scale, x, 2.0);  // no wait(): the same stream orders it
    w.gpu_group->reduce_scatter(mine, again, ReduceOp::sum);
    w.gpu_group->all_gather(gathered, mine)->wait();
    reduced->synchronize();
    EXPECT_TRUE(reduced->is_completed());
    EXPECT_GE(reduced->elapsed_ms(), 0.0);
  }
  std::vector<double> twice = expected;
  for (double& v : twice) v *= 2;
  EXPECT_TRUE(all_close(doubled, twice, rtol_for(DType::f32), 0.0));
  EXPECT_TRUE(all_close(gathered, expected, rtol_for(DType::f32), 0.0));
}

}  // namespace
}  // namespace tandem::dist
