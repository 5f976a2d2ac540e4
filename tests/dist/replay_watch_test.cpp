// Collectives captured into a CUDA graph are watched in every replay (dist/process_group.h): each
// replay issues them again (sequence numbers, flight recorder), and one that cannot finish within
// the timeout (2 s here) fails the group as in eager mode, naming the collective and the replay.
// A world of one with InitOptions::nccl_launch_alone, so a single GPU runs the NCCL path; it has its
// own executable because the second test leaves the group failed. GPU only: skips without one.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "dist/dist_test_util.h"
#include "dist/host_gate.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/elementwise.h"

namespace tandem::dist {
namespace {

using ::tandem::testing::throws_with;

constexpr int kReplays = 5;
int replays_watched = 0;  // by the first test, found again in the second's flight recorder

std::string dump_directory() {
  return (std::filesystem::temp_directory_path() / ("tandem-replay-watch-" + std::to_string(::getpid()))).string();
}

// How many lines of `text` contain every one of `parts`.
int lines_with(const std::string& text, const std::vector<std::string>& parts) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    bool all = true;
    for (const std::string& p : parts) all = all && line.find(p) != std::string::npos;
    n += all;
  }
  return n;
}

TEST(ReplayWatch, EveryReplayIssuesTheCapturedCollectivesAgain) {
  TANDEM_REQUIRE_NCCL();
  const World& w = world();
  ASSERT_EQ(w.size, 1) << "written for a world of one (with nccl_launch_alone)";
  ProcessGroup& group = *w.gpu_group;
  const int device = w.device.index;
  const TensorOptions on_gpu(DType::f32, w.device);
  const std::vector<double> start = randn({1000}, DType::f32).to_double_vector();
  Tensor x = kernels::to_device(from_vector(start, {1000}, DType::f32), w.device);
  Tensor ones = full({1000}, 1.0, on_gpu), y = zeros({1000}, on_gpu);

  // Warm-up: NCCL sets itself up on first use. With launch-alone it is a real launch, timed by events.
  std::shared_ptr<Work> eager;
  {
    TimedCollectives timed;
    eager = group.all_reduce(x, ReduceOp::sum, "warm-up");
  }
  eager->synchronize();
  EXPECT_GE(eager->elapsed_ms(), 0.0);
  cuda::synchronize(device);

  cuda::Graph graph;
  const uint64_t before_capture = group.collectives_issued();
  {
    cuda::GraphCapture capture(graph, device);
    kernels::add_(x, ones);  // x += 1, then reduced (the sum over one rank), then y = 3 x
    group.all_reduce(x, ReduceOp::sum, "replay watch test")->wait();
    kernels::copy_(y, x);
    kernels::mul_(y, 3.0);
    capture.end();
  }
  EXPECT_EQ(group.collectives_issued(), before_capture) << "a capture runs nothing, so it issues nothing";
  for (int i = 1; i <= kReplays; ++i) {
    graph.replay();
    EXPECT_EQ(group.collectives_issued(), before_capture + static_cast<uint64_t>(i)) << "after replay " << i;
  }
  cuda::synchronize(device);
  std::vector<double> got_x = x.to_double_vector(), got_y = y.to_double_vector();
  for (size_t i = 0; i < start.size(); ++i) {
    ASSERT_NEAR(got_x[i], start[i] + kReplays, 1e-4) << "x[" << i << "]";
    ASSERT_NEAR(got_y[i], 3 * (start[i] + kReplays), 3e-4) << "y[" << i << "]";
  }
  // Every replay's collective completed and was forgotten: an eager one still goes through.
  EXPECT_NO_THROW(group.all_reduce(x, ReduceOp::sum, "after the replays")->synchronize());
  replays_watched = kReplays;
}

TEST(ReplayWatch, AReplayWhoseCollectiveCannotFinishFailsTheGroup) {
  TANDEM_REQUIRE_NCCL();
  const World& w = world();
  ASSERT_EQ(w.size, 1) << "written for a world of one (with nccl_launch_alone)";
  ProcessGroup& group = *w.gpu_group;
  const int device = w.device.index;
  Tensor x = full({1024}, 2.0, TensorOptions(DType::f32, w.device));  // 4096 bytes
  group.all_reduce(x, ReduceOp::sum, "warm-up")->synchronize();

  // Declared before the gate, so destroyed after it: the graph's reset waits for the device, which
  // the gate lets go on when it is destroyed.
  cuda::Graph graph;
  testing::HostGate gate;
  {
    cuda::GraphCapture capture(graph, device);
    gate.hold(cuda::current_stream_handle(device));  // the collective waits for this kernel
    group.all_reduce(x, ReduceOp::sum, "held replay")->wait();
    capture.end();
  }
  const uint64_t seq = group.collectives_issued() + 1;  // the replay's collective
  auto start = std::chrono::steady_clock::now();
  graph.replay();
  // The watchdog fails the group once the timeout passes and aborts the communicator. The gate
  // opens by the clock, not on seeing the failure: aborting may wait for the device, and the
  // group's state is behind the lock the watchdog holds meanwhile.
  std::this_thread::sleep_for(std::chrono::duration<double>(w.timeout_seconds + 2.0));
  gate.open();
  cuda::synchronize(device);  // the held replay ends, its collective on an aborted communicator too
  const std::string expected_what = "nccl all_reduce of 4096 bytes (#" + std::to_string(seq) +
                                    " 'held replay') in replay 1 of a CUDA graph on cuda:" + std::to_string(device) +
                                    ", or a later collective of that replay, timed out after";
  EXPECT_TRUE(throws_with<BackendError>([&] { group.all_reduce(x, ReduceOp::sum, "after the failure"); },
                                        {"rank 0", "refused", "failed earlier", expected_what, "(timeout "}));
  EXPECT_TRUE(throws_with<BackendError>([&] { graph.replay(); },
                                        {"rank 0: replaying a CUDA graph with 1 nccl collective(s) refused",
                                         "the group failed earlier", "'held replay'"}));
  EXPECT_EQ(graph.replays(), 1) << "the refused replay launched nothing";
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);

  // The flight recorder, written when the group failed: the held collective failed, and every
  // replay of the first test completed.
  std::ifstream file(dump_directory() + "/rank0-nccl.json");
  ASSERT_TRUE(file.good()) << "no flight recorder in " << dump_directory();
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_EQ(lines_with(text.str(), {"\"seq\": " + std::to_string(seq) + ",", "\"label\": \"held replay\"",
                                    "\"state\": \"failed\""}),
            1)
      << text.str();
  EXPECT_EQ(lines_with(text.str(), {"\"label\": \"replay watch test\"", "\"state\": \"completed\""}), replays_watched)
      << text.str();
}

}  // namespace
}  // namespace tandem::dist

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  tandem::dist::InitOptions options;
  options.timeout_seconds = 2;
  options.nccl_launch_alone = true;
  options.dump_dir = tandem::dist::dump_directory();
  tandem::dist::init(options);
  int status = RUN_ALL_TESTS();
  tandem::dist::finalize();
  std::error_code ignored;
  std::filesystem::remove_all(tandem::dist::dump_directory(), ignored);
  return status;
}
