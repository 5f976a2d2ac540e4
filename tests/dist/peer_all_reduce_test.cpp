// The NCCL group's small all-reduces (dist/peer_all_reduce.h): on 2-8 GPUs of one node linked by
// NVLink they run on tandem's one-shot kernel, elsewhere on NCCL; either way every rank must get the
// reduction of every rank's input, in the same bits. Sizes on both sides of the kernel's limit
// (InitOptions::peer_all_reduce_max_bytes over size - 1), odd counts, a tensor not on a 16-byte
// boundary, calls back to back on two streams without waiting (the staging slots alternate), and
// replays of a captured graph beside eager calls. GPU only: skips without an NCCL group.
#include <cstring>

#include "dist/dist_test_util.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/elementwise.h"
#include "tandem/core/copy.h"
#include "tandem/core/views.h"

namespace tandem::dist {
namespace {

using ::tandem::testing::all_close;
using testing::all_inputs;
using testing::rank_input;
using testing::reduce_all;
using testing::rtol_for;
using testing::shared_seed;

// The largest tensor the kernel takes at this world size (the default limit, or the environment's).
int64_t peer_limit_bytes() {
  int64_t limit = InitOptions().peer_all_reduce_max_bytes;
  if (const char* env = std::getenv("TANDEM_PEER_ALL_REDUCE_MAX_BYTES"); env != nullptr && env[0] != '\0') {
    limit = std::strtoll(env, nullptr, 10);
  }
  const int others = world().size > 1 ? world().size - 1 : 1;
  return limit / others / 16 * 16;
}

// True when every rank holds the same bytes in `x` (hashed here, the hashes compared over MPI).
bool same_bits_on_every_rank(const Tensor& x) {
  Tensor host = kernels::to_device(x, Device());
  const auto* bytes = static_cast<const uint8_t*>(host.data_ptr());
  uint64_t hash = 1469598103934665603ULL;  // FNV-1a
  for (size_t i = 0; i < host.nbytes(); ++i) hash = (hash ^ bytes[i]) * 1099511628211ULL;
  const World& w = world();
  Tensor mine = full({1}, 0, DType::i64), all = zeros({w.size}, DType::i64);
  std::memcpy(mine.data_ptr(), &hash, sizeof(hash));
  w.cpu_group->all_gather(all, mine)->wait();
  for (int r = 0; r < w.size; ++r) {
    if (all.data<int64_t>()[r] != all.data<int64_t>()[0]) return false;
  }
  return true;
}

class PeerAllReduceTest : public ::testing::Test {
 protected:
  void SetUp() override { TANDEM_REQUIRE_NCCL(); }
};

TEST_F(PeerAllReduceTest, EveryDtypeOpAndSizeOnBothSidesOfTheLimit) {
  const World& w = world();
  const int64_t limit = peer_limit_bytes();
  for (DType dtype : {DType::f32, DType::bf16, DType::f16, DType::f64, DType::i32, DType::i64}) {
    const int64_t item = static_cast<int64_t>(dtype_size(dtype));
    const int64_t vector = 16 / item;
    // One element, an odd count, one vector more and less than the grid's blocks take evenly, the
    // largest tensor the kernel takes, and one element more (NCCL's).
    for (int64_t n : {int64_t{1}, int64_t{3}, 32 * vector - 1, 32 * vector + 1, int64_t{10007}, limit / item,
                      limit / item + 1}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        const uint64_t seed = shared_seed();
        Tensor x = kernels::to_device(rank_input(seed, w.rank, {n}, dtype), w.device);
        w.gpu_group->all_reduce(x, op)->wait();
        const std::vector<double> expected = reduce_all(all_inputs(seed, w.size, {n}, dtype), op, dtype);
        EXPECT_TRUE(all_close(x, expected, rtol_for(dtype), 0.0))
            << dtype_name(dtype) << " " << reduce_op_name(op) << " of " << n;
        EXPECT_TRUE(same_bits_on_every_rank(x)) << dtype_name(dtype) << " " << reduce_op_name(op) << " of " << n;
      }
    }
  }
}

TEST_F(PeerAllReduceTest, ATensorOffItsSixteenByteBoundary) {
  const World& w = world();
  const uint64_t seed = shared_seed();
  const int64_t n = 5001;
  // Elements 1 .. n of a bf16 tensor: contiguous, 2 bytes past the allocation's start.
  Tensor whole = kernels::to_device(rank_input(seed, w.rank, {n + 1}, DType::bf16), w.device);
  const std::vector<double> first = whole.to_double_vector();
  Tensor x = narrow(whole, 0, 1, n);
  w.gpu_group->all_reduce(x, ReduceOp::sum)->wait();
  std::vector<std::vector<double>> inputs = all_inputs(seed, w.size, {n + 1}, DType::bf16);
  for (auto& in : inputs) in.erase(in.begin());
  EXPECT_TRUE(all_close(x, reduce_all(inputs, ReduceOp::sum, DType::bf16), rtol_for(DType::bf16), 0.0));
  EXPECT_EQ(kernels::to_device(whole, Device()).to_double_vector()[0], first[0]) << "the element before was written";
  EXPECT_TRUE(same_bits_on_every_rank(x));
}

TEST_F(PeerAllReduceTest, BackToBackOnTwoStreamsWithoutWaiting) {
  const World& w = world();
  const int64_t limit = peer_limit_bytes() / 4;  // f32 elements
  constexpr int kCalls = 40;
  std::vector<uint64_t> seeds;
  std::vector<Tensor> xs;
  std::vector<std::shared_ptr<Work>> works;
  for (int i = 0; i < kCalls; ++i) {
    const uint64_t seed = shared_seed();
    const int64_t n = 1 + static_cast<int64_t>(seed % static_cast<uint64_t>(limit));
    seeds.push_back(seed);
    xs.push_back(kernels::to_device(rank_input(seed, w.rank, {n}, DType::f32), w.device));
  }
  cuda::synchronize(w.device.index);
  for (int i = 0; i < kCalls; ++i) {
    if (i % 3 == 2) {
      CollectivesOnCurrentStream here;  // on the caller's stream, the others on the communication stream
      works.push_back(w.gpu_group->all_reduce(xs[i], ReduceOp::sum));
    } else {
      works.push_back(w.gpu_group->all_reduce(xs[i], ReduceOp::sum));
    }
  }
  for (auto& work : works) work->wait();
  for (int i = 0; i < kCalls; ++i) {
    const Shape shape{xs[i].numel()};
    EXPECT_TRUE(all_close(xs[i], reduce_all(all_inputs(seeds[i], w.size, shape, DType::f32), ReduceOp::sum,
                                            DType::f32),
                          rtol_for(DType::f32), 0.0))
        << "call " << i << " of " << xs[i].numel();
    EXPECT_TRUE(same_bits_on_every_rank(xs[i])) << "call " << i;
  }
}

TEST_F(PeerAllReduceTest, ReplaysOfACapturedGraphBesideEagerCalls) {
  const World& w = world();
  const int device = w.device.index;
  const int64_t n = std::min<int64_t>(peer_limit_bytes() / 4, 70001);
  const uint64_t seed = shared_seed();
  Tensor start = kernels::to_device(rank_input(seed, w.rank, {n}, DType::f32), w.device);
  Tensor x = kernels::clone(start);
  Tensor eager = kernels::clone(start);
  w.gpu_group->all_reduce(x, ReduceOp::avg)->wait();  // warm-up outside the capture
  cuda::synchronize(device);

  cuda::Graph graph;
  {
    cuda::GraphCapture capture(graph, device);
    kernels::copy_(x, start);
    w.gpu_group->all_reduce(x, ReduceOp::avg, "peer replay test")->wait();
    kernels::mul_(x, 3.0);
    w.gpu_group->all_reduce(x, ReduceOp::max, "peer replay test")->wait();
    capture.end();
  }
  for (int replay = 0; replay < 5; ++replay) {
    graph.replay();
    kernels::copy_(eager, start);  // the same on eager calls between the replays
    w.gpu_group->all_reduce(eager, ReduceOp::avg)->wait();
    kernels::mul_(eager, 3.0);
    w.gpu_group->all_reduce(eager, ReduceOp::max)->wait();
    cuda::synchronize(device);
    std::vector<double> expected = reduce_all(all_inputs(seed, w.size, {n}, DType::f32), ReduceOp::avg, DType::f32);
    for (double& v : expected) v *= 3.0;
    EXPECT_TRUE(all_close(x, expected, rtol_for(DType::f32), 0.0)) << "replay " << replay;
    EXPECT_EQ(kernels::to_device(x, Device()).to_double_vector(), kernels::to_device(eager, Device()).to_double_vector())
        << "replay " << replay << ": the graph's bits differ from the eager calls'";
    EXPECT_TRUE(same_bits_on_every_rank(x)) << "replay " << replay;
  }
}

}  // namespace
}  // namespace tandem::dist
