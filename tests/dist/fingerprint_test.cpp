// Fingerprints, the rolling-hash check and the flight recorder: the words of the errors, and the
// bookkeeping of both process groups (the NCCL case runs on the GPU machine and skips elsewhere).
#include <cstdio>
#include <string>
#include <vector>

#include "dist/dist_test_util.h"
#include "tandem/dist/ddp.h"
#include "tandem/dist/fingerprint.h"
#include "tandem/dist/flight_recorder.h"
#include "tandem/layers/layers.h"
#include "tandem/optim/sgd.h"

namespace tandem::dist {
namespace {

using internal::Fingerprint;

TEST(Fingerprint, DescribesOpLabelCountDtypeAndReduceOp) {
  Fingerprint f = Fingerprint::make("all_reduce", 300000, DType::f32, ReduceOp::avg, -1, "ddp bucket 3 of step 3");
  f.seq = 57;
  EXPECT_EQ(f.describe(), "all_reduce #57 'ddp bucket 3 of step 3' (300000 f32 elements, 1.2 MB, avg)");
  Fingerprint b = Fingerprint::make("broadcast", 1, DType::i64, std::nullopt, 0, "buffers");
  b.seq = 2;
  EXPECT_EQ(b.describe(), "broadcast #2 'buffers' (1 i64 element, 8 B, root 0)");
}

TEST(Fingerprint, MismatchTextNamesEveryRankThatDiffersFromRankZero) {
  Fingerprint bucket = Fingerprint::make("all_reduce", 300000, DType::f32, ReduceOp::avg, -1, "ddp bucket 3 of step 3");
  Fingerprint metrics = Fingerprint::make("all_reduce", 1, DType::f32, ReduceOp::sum, -1, "metrics");
  bucket.seq = metrics.seq = 57;
  EXPECT_EQ(internal::mismatch_text({bucket, bucket, bucket}), "");
  EXPECT_EQ(internal::mismatch_text({bucket, metrics, bucket}),
            "rank 1 issued all_reduce #57 'metrics' (1 f32 element, 4 B, sum) where rank 0 issued all_reduce #57 "
            "'ddp bucket 3 of step 3' (300000 f32 elements, 1.2 MB, avg)");
  // The rolling hash differs as soon as one fingerprint does, whatever its sequence number.
  EXPECT_NE(internal::roll_hash(internal::kInitialHash, bucket), internal::roll_hash(internal::kInitialHash, metrics));
  Fingerprint later = bucket;
  later.seq = 58;
  EXPECT_EQ(internal::roll_hash(1, bucket), internal::roll_hash(1, later));
}

TEST(FlightRecorder, KeepsTheLastEntriesWithTheirStatesAsJson) {
  internal::FlightRecorder recorder(2);
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    Fingerprint f = Fingerprint::make("all_reduce", 10, DType::f32, ReduceOp::sum, -1, "step " + std::to_string(seq));
    f.seq = seq;
    recorder.queued(f);
  }
  recorder.set_state(2, internal::RecordState::completed);
  recorder.set_state(3, internal::RecordState::started);
  recorder.set_state(1, internal::RecordState::completed);  // left the ring: ignored
  std::string json = recorder.to_json(0, 2, "mpi", "a test");
  EXPECT_EQ(json.find("\"seq\": 1,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"seq\": 2, \"op\": \"all_reduce\", \"label\": \"step 2\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"state\": \"completed\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"state\": \"started\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"last_seq\": 3"), std::string::npos) << json;
  EXPECT_EQ(recorder.fingerprints(1, 3).size(), 2u);
}

TEST(FlightRecorder, DumpWritesOneFilePerRankAndBackend) {
  tandem::testing::ScratchDirectory scratch;  // this process's own: other CTest entries run this test at once
  const std::string dir = scratch.path();
  internal::set_dump_directory(dir);
  internal::FlightRecorder recorder(4);
  Fingerprint f = Fingerprint::make("broadcast", 3, DType::f32, std::nullopt, 0, "buffers");
  f.seq = 1;
  recorder.queued(f);
  std::string path = recorder.dump(world().rank, world().size, "nccl", "a test");
  internal::set_dump_directory("");
  EXPECT_EQ(path, dir + "/rank" + std::to_string(world().rank) + "-nccl.json");
  std::FILE* file = std::fopen(path.c_str(), "r");
  ASSERT_NE(file, nullptr);
  char text[512] = {};
  size_t n = std::fread(text, 1, sizeof(text) - 1, file);
  std::fclose(file);
  EXPECT_NE(std::string(text, n).find("\"reason\": \"a test\""), std::string::npos) << text;
  std::remove(path.c_str());
}

// Each collective takes one sequence number, and ranks that issued the same ones agree.
void check_bookkeeping(ProcessGroup& group, const Device& device) {
  uint64_t before = group.collectives_issued();
  Tensor x = to(randn({100}), device);
  group.all_reduce(x, ReduceOp::sum, "a test's all_reduce")->synchronize();
  group.broadcast(x, 0, "a test's broadcast")->synchronize();
  EXPECT_EQ(group.collectives_issued(), before + 2);
  EXPECT_NO_THROW(group.check_in_sync("the end of a test"));
}

TEST(Fingerprint, MpiGroupCountsCollectivesAndItsRanksAgree) { check_bookkeeping(*world().cpu_group, Device()); }

TEST(Fingerprint, NcclGroupCountsCollectivesAndItsRanksAgree) {
  TANDEM_REQUIRE_NCCL();
  check_bookkeeping(*world().gpu_group, world().device);
}

// In a world of one a collective launches nothing, yet it takes its sequence number (so the
// cross-rank checks and the flight recorder see it) and its Work is complete at once; its result
// is the collective's: the input itself, or (out of place) a copy of it. With
// $TANDEM_NCCL_LAUNCH_ALONE=1 the NCCL group launches them: the same counts and results.
void check_world_of_one(ProcessGroup& group, const Device& device) {
  if (group.size() != 1) GTEST_SKIP() << "a world of one only (this group has " << group.size() << " ranks)";
  const uint64_t before = group.collectives_issued();
  Tensor x = to(randn({37}), device), y = to(randn({5}), device);  // (37,), (5,)
  const Tensor x0 = kernels::to_device(x, Device()), y0 = kernels::to_device(y, Device());
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    std::shared_ptr<Work> work = group.all_reduce(x, op, "a test's all_reduce");
    if (!testing::launches_alone(group)) EXPECT_TRUE(work->is_completed());
    work->wait();
  }
  group.all_reduce(std::vector<Tensor>{x, y}, ReduceOp::avg, "a test's grouped all_reduce")->wait();
  group.broadcast(x, 0, "a test's broadcast")->wait();
  group.all_gather(x, x, "a test's all_gather in place")->wait();
  group.reduce_scatter(x, x, ReduceOp::avg, "a test's reduce_scatter in place")->wait();
  Tensor gathered = to(zeros({37}), device), scattered = to(zeros({37}), device);  // (37,) each
  group.all_gather(gathered, x, "a test's all_gather")->wait();
  group.reduce_scatter(scattered, x, ReduceOp::sum, "a test's reduce_scatter")->wait();
  EXPECT_EQ(group.collectives_issued(), before + 10);
  EXPECT_NO_THROW(group.check_in_sync("the end of a test"));
  for (const Tensor& t : {x, gathered, scattered}) {
    EXPECT_TRUE(::tandem::testing::all_close(kernels::to_device(t, Device()), x0, 0.0, 0.0));
  }
  EXPECT_TRUE(::tandem::testing::all_close(kernels::to_device(y, Device()), y0, 0.0, 0.0));

  // DDP's buckets count too: one all-reduce each per step.
  manual_seed(5);
  auto model = std::make_shared<nn::Linear>(16, 8, true, TensorOptions(DType::f32, device));
  DdpOptions options;
  options.first_bucket_mb = 0.0001;  // two buckets
  DistributedDataParallel ddp(model, options);
  ASSERT_EQ(&ddp.group(), &group);
  const uint64_t before_step = group.collectives_issued();
  sum(ddp(to(randn({4, 16}), device))).backward();
  EXPECT_EQ(group.collectives_issued(), before_step + ddp.bucket_plan().size());
  EXPECT_EQ(ddp.bucket_plan().size(), 2u);
}

TEST(Fingerprint, MpiGroupOfOneCountsCollectivesItLaunchesNot) { check_world_of_one(*world().cpu_group, Device()); }

TEST(Fingerprint, NcclGroupOfOneCountsCollectivesItLaunchesNot) {
  TANDEM_REQUIRE_NCCL();
  check_world_of_one(*world().gpu_group, world().device);
}

// DDP on this rank's device (the NCCL group on a GPU, even in a world of one) with both checks on
// every step: its labelled buckets count as collectives and the ranks agree throughout.
TEST(Fingerprint, DdpChecksEveryStepOnItsGroup) {
  const Device device = world().gpu_group ? world().device : Device();
  manual_seed(3);
  auto model = std::make_shared<nn::Linear>(16, 8, true, TensorOptions(DType::f32, device));
  DdpOptions options;
  options.check_parameters_every = 1;
  DistributedDataParallel ddp(model, options);
  optim::SGD opt(model->parameters(), {0.1});
  Generator gen(11 + world().rank);
  Tensor x = to(randn({4, 16}, DType::f32, &gen), device);
  for (int step = 0; step < 3; ++step) {
    uint64_t before = ddp.group().collectives_issued();
    opt.zero_grad();
    EXPECT_NO_THROW(sum(ddp(x)).backward());
    opt.step();
    EXPECT_GT(ddp.group().collectives_issued(), before);
  }
}

}  // namespace
}  // namespace tandem::dist
