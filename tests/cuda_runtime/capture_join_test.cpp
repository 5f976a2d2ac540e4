// A capturing stream that joins work of another stream again and again (core/cuda_graph.h,
// cuda::join_capture), as a stream waiting for one collective after another on the communication
// stream does: with event waits alone every join adds edges to all the nodes joined before, and
// the graph's edges grow with the square of the joins; join_capture drops the nodes the joined
// work depends on already, so the graph keeps one chain, does the same work, and keeps the edges
// to nodes the waiting stream captured in between. Calls the CUDA runtime directly (copies and
// memsets are the work), so it is built only with the CUDA backend; skips without a GPU.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "support/test_util.h"
#include "tandem/core/cuda/check.h"
#include "tandem/core/cuda_graph.h"

namespace tandem::cuda {
namespace {

constexpr int kJoins = 16;
constexpr size_t kFloats = 1024;

// The f32 value of four bytes 0x3F: what the first memset writes, and the chain carries into `out`.
float memset_value() {
  const unsigned int bits = 0x3F3F3F3Fu;
  float value = 0;
  static_assert(sizeof(value) == sizeof(bits), "f32 is 4 bytes");
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

size_t edges_of(cudaGraph_t graph) {
  size_t edges = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  return edges;
}

size_t dependencies_of(cudaGraphNode_t node) {
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count));
  return count;
}

// Captures on `caller`: a memset of chain[0], then kJoins rounds of a fork to `side`, a copy there
// chain[i] -> chain[i + 1], and a join back (the caller captures nothing between rounds, except a
// memset of `between` in round kJoins / 2 when asked), then a copy of the chain's end into `out`.
// `joined`: cuda::join_capture with the nodes listed so far as the copy's ancestors, as the NCCL
// group does; otherwise an event wait. Returns the graph; `last` is the final copy's node.
cudaGraph_t capture_rounds(cudaStream_t caller, cudaStream_t side, float* const* chain, float* out, float* between,
                           bool joined, cudaGraphNode_t* last) {
  cudaEvent_t fork_event = nullptr, end_event = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&fork_event, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&end_event, cudaEventDisableTiming));
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(caller, cudaStreamCaptureModeThreadLocal));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(chain[0], 0x3F, kFloats * sizeof(float), caller));  // 0x3F3F3F3F ~ 0.75
  std::vector<GraphNode> known;  // every fork and end so far: ancestors of the side stream's next end
  for (int i = 0; i < kJoins; ++i) {
    const std::vector<GraphNode> fork = capture_dependencies(caller);
    TANDEM_CUDA_CHECK(cudaEventRecord(fork_event, caller));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(side, fork_event, 0));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(chain[i + 1], chain[i], kFloats * sizeof(float), cudaMemcpyDeviceToDevice, side));
    TANDEM_CUDA_CHECK(cudaEventRecord(end_event, side));
    const std::vector<GraphNode> end = capture_dependencies(side);
    known.insert(known.end(), fork.begin(), fork.end());
    known.insert(known.end(), end.begin(), end.end());
    if (between != nullptr && i == kJoins / 2) {
      TANDEM_CUDA_CHECK(cudaMemsetAsync(between, 0x40, kFloats * sizeof(float), caller));  // after the fork
    }
    if (joined) {
      join_capture(caller, end, known.data(), known.size());
    } else {
      TANDEM_CUDA_CHECK(cudaStreamWaitEvent(caller, end_event, 0));
    }
  }
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(out, chain[kJoins], kFloats * sizeof(float), cudaMemcpyDeviceToDevice, caller));
  const std::vector<GraphNode> final_copy = capture_dependencies(caller);
  *last = final_copy.size() == 1 ? static_cast<cudaGraphNode_t>(final_copy[0]) : nullptr;
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(caller, &graph));
  cudaEventDestroy(fork_event);
  cudaEventDestroy(end_event);
  return graph;
}

class CaptureJoin : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!is_available()) GTEST_SKIP() << (is_built() ? "no CUDA device visible" : "built without CUDA");
    TANDEM_CUDA_CHECK(cudaSetDevice(0));
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&caller_, cudaStreamNonBlocking));
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    for (auto& p : chain_) TANDEM_CUDA_CHECK(cudaMalloc(&p, kFloats * sizeof(float)));
    TANDEM_CUDA_CHECK(cudaMalloc(&out_, kFloats * sizeof(float)));
    TANDEM_CUDA_CHECK(cudaMalloc(&between_, kFloats * sizeof(float)));
  }
  void TearDown() override {
    if (caller_ == nullptr) return;
    cudaDeviceSynchronize();
    for (float* p : chain_) cudaFree(p);
    cudaFree(out_);
    cudaFree(between_);
    cudaStreamDestroy(caller_);
    cudaStreamDestroy(side_);
  }

  // Replays `graph` twice, each time over buffers of 1.0f, and returns `out`.
  std::vector<float> replay(cudaGraph_t graph) {
    cudaGraphExec_t exec = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    std::vector<float> ones(kFloats, 1.0f), got(kFloats, 0.0f);
    for (int r = 0; r < 2; ++r) {
      for (float* p : chain_) {
        TANDEM_CUDA_CHECK(cudaMemcpyAsync(p, ones.data(), kFloats * sizeof(float), cudaMemcpyHostToDevice, caller_));
      }
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(out_, ones.data(), kFloats * sizeof(float), cudaMemcpyHostToDevice, caller_));
      TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, caller_));
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(got.data(), out_, kFloats * sizeof(float), cudaMemcpyDeviceToHost, caller_));
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(caller_));
    }
    TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
    return got;
  }

  cudaStream_t caller_ = nullptr, side_ = nullptr;
  float* chain_[kJoins + 1] = {};
  float* out_ = nullptr;
  float* between_ = nullptr;
};

TEST_F(CaptureJoin, RepeatedJoinsKeepOneChainWhereEventWaitsAddEveryEarlierNode) {
  cudaGraphNode_t last_waited = nullptr, last_joined = nullptr;
  cudaGraph_t waited = capture_rounds(caller_, side_, chain_, out_, nullptr, /*joined=*/false, &last_waited);
  cudaGraph_t joined = capture_rounds(caller_, side_, chain_, out_, nullptr, /*joined=*/true, &last_joined);
  // kJoins + 2 nodes either way: the memset, the copies along the chain, the final copy.
  size_t nodes_waited = 0, nodes_joined = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(waited, nullptr, &nodes_waited));
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(joined, nullptr, &nodes_joined));
  EXPECT_EQ(nodes_waited, static_cast<size_t>(kJoins + 2));
  EXPECT_EQ(nodes_joined, nodes_waited);
  // Waited: copy i depends on every copy before it and on the memset.
  EXPECT_GE(edges_of(waited), static_cast<size_t>(kJoins * (kJoins + 1) / 2));
  // Joined: a chain.
  EXPECT_EQ(edges_of(joined), static_cast<size_t>(kJoins + 1));
  ASSERT_NE(last_joined, nullptr);
  EXPECT_EQ(dependencies_of(last_joined), 1u);
  // The same work: the memset's value travels down the chain into out.
  const std::vector<float> got = replay(joined);
  for (size_t i = 0; i < kFloats; ++i) ASSERT_EQ(got[i], memset_value()) << "out[" << i << "]";
  TANDEM_CUDA_CHECK(cudaGraphDestroy(waited));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(joined));
}

TEST_F(CaptureJoin, KeepsWhatTheWaitingStreamCapturedAfterTheFork) {
  cudaGraphNode_t last = nullptr;
  cudaGraph_t graph = capture_rounds(caller_, side_, chain_, out_, between_, /*joined=*/true, &last);
  // The memset captured between a fork and its join is no ancestor of the joined copy: the next
  // fork, and so every later copy, still orders after it, and the graph ends joined.
  size_t nodes = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  EXPECT_EQ(nodes, static_cast<size_t>(kJoins + 3));
  EXPECT_EQ(edges_of(graph), static_cast<size_t>(kJoins + 3));  // the chain, plus into and out of the memset
  ASSERT_NE(last, nullptr);
  EXPECT_EQ(dependencies_of(last), 1u);
  const std::vector<float> got = replay(graph);
  for (size_t i = 0; i < kFloats; ++i) ASSERT_EQ(got[i], memset_value()) << "out[" << i << "]";
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
}

}  // namespace
}  // namespace tandem::cuda
