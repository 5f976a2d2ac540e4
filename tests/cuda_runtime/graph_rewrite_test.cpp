// Memset nodes of a graph replaced by kernel nodes (core/cuda/graph_rewrite.h): a graph of memsets
// of every element size (1, 2 and 4 bytes; one row and pitched rows) between copies that read and
// overwrite what they wrote writes the same bytes after the rewrite as before it, replay after
// replay, and holds no memset node any more; memsets into scratch move to one kernel node at the
// graph's start, and the copies after them still read what they wrote. Calls the CUDA runtime directly, so it is built
// only with the CUDA backend; skips without a GPU.
#include <cstdint>
#include <cstring>
#include <vector>

#include "support/test_util.h"
#include "tandem/core/cuda/check.h"
#include "tandem/core/cuda/graph_rewrite.h"

namespace tandem::cuda {
namespace {

constexpr size_t kBytes = 64 << 10;
constexpr unsigned char kBackground = 0xA5;  // what every byte holds before a launch

struct Memset {
  size_t offset, pitch, width, height;  // offset and pitch in bytes, width in elements
  unsigned element_size, value;
};

// The bytes a launch of the graph below leaves in `out` (kBytes), written on the host.
std::vector<unsigned char> expected_bytes(const std::vector<Memset>& memsets, size_t copy_from, size_t copy_to,
                                          size_t copy_bytes) {
  std::vector<unsigned char> bytes(kBytes, kBackground);
  for (const Memset& m : memsets) {
    for (size_t row = 0; row < m.height; ++row) {
      for (size_t i = 0; i < m.width; ++i) {
        std::memcpy(&bytes[m.offset + row * m.pitch + i * m.element_size], &m.value, m.element_size);
      }
    }
  }
  std::memmove(&bytes[copy_to], &bytes[copy_from], copy_bytes);
  return bytes;
}

// The index of the first byte where got and want differ; their size where none does.
size_t first_difference(const std::vector<unsigned char>& got, const std::vector<unsigned char>& want) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) return i;
  }
  return got.size();
}

int nodes_of_type(cudaGraph_t graph, cudaGraphNodeType type) {
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  int n = 0;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t;
    TANDEM_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
    n += t == type;
  }
  return n;
}

// kBytes of device memory on device 0 and a stream for one test, given back at its end.
struct DeviceBuffer {
  unsigned char* bytes = nullptr;
  cudaStream_t stream = nullptr;
  DeviceBuffer() {
    TANDEM_CUDA_CHECK(cudaSetDevice(0));
    TANDEM_CUDA_CHECK(cudaMalloc(&bytes, kBytes));
    TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~DeviceBuffer() {
    cudaStreamDestroy(stream);
    cudaFree(bytes);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// Instantiates `graph` and launches it three times on `stream`, each time over kBytes of `buffer`
// set to kBackground first; after each, the buffer must hold `want`.
void expect_replays_write(cudaGraph_t graph, unsigned char* buffer, cudaStream_t stream,
                          const std::vector<unsigned char>& want) {
  cudaGraphExec_t exec = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(buffer, kBackground, kBytes, stream));
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    std::vector<unsigned char> got(kBytes);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(got.data(), buffer, kBytes, cudaMemcpyDeviceToHost, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const size_t first_wrong = first_difference(got, want);
    EXPECT_EQ(first_wrong, kBytes) << "replay " << replay << ": byte " << first_wrong << " is " << int(got[first_wrong])
                                   << ", expected " << int(want[first_wrong]);
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
}

TEST(GraphMemsetNodes, BecomeKernelNodesThatWriteTheSameBytes) {
  TANDEM_REQUIRE_CUDA();
  DeviceBuffer device;
  unsigned char* buffer = device.bytes;
  cudaStream_t stream = device.stream;

  // Three memsets on independent branches, a copy that reads the first two once they are done, and
  // a 4-byte memset (as cuDNN's attention issues) after the copy that overwrites part of its output.
  const std::vector<Memset> memsets = {
      {0, 0, 1000, 1, 1, 0x5C},              // bytes
      {4096, 256, 100, 7, 2, 0xBEEF},        // 16-bit values in pitched rows
      {8192, 4096, 1000, 3, 4, 0x12345678},  // 32-bit values in pitched rows
  };
  const Memset last = {20000, 0, 1, 1, 4, 0xCAFEF00D};
  const size_t copy_from = 0, copy_to = 16384, copy_bytes = 5000;
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphCreate(&graph, 0));
  std::vector<cudaGraphNode_t> sets;
  auto add_memset = [&](const Memset& m, const cudaGraphNode_t* deps, size_t count) {
    cudaMemsetParams p{};
    p.dst = buffer + m.offset;
    p.pitch = m.height > 1 ? m.pitch : 0;
    p.value = m.value;
    p.elementSize = m.element_size;
    p.width = m.width;
    p.height = m.height;
    cudaGraphNode_t node = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphAddMemsetNode(&node, graph, deps, count, &p));
    return node;
  };
  for (const Memset& m : memsets) sets.push_back(add_memset(m, nullptr, 0));
  cudaGraphNode_t copy = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&copy, graph, sets.data(), sets.size(), buffer + copy_to,
                                             buffer + copy_from, copy_bytes, cudaMemcpyDeviceToDevice));
  add_memset(last, &copy, 1);
  std::vector<Memset> all = memsets;
  std::vector<unsigned char> want = expected_bytes(all, copy_from, copy_to, copy_bytes);
  std::memcpy(&want[last.offset], &last.value, 4);

  ASSERT_EQ(nodes_of_type(graph, cudaGraphNodeTypeMemset), 4);
  EXPECT_EQ(replace_memset_nodes(graph), 4);
  EXPECT_EQ(nodes_of_type(graph, cudaGraphNodeTypeMemset), 0);
  EXPECT_EQ(nodes_of_type(graph, cudaGraphNodeTypeKernel), 4);
  EXPECT_EQ(replace_small_upload_nodes(graph), 0);  // a device-to-device copy stays one
  EXPECT_EQ(nodes_of_type(graph, cudaGraphNodeTypeMemcpy), 1);
  size_t edges = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  EXPECT_EQ(edges, 4u);  // three into the copy, one out of it

  expect_replays_write(graph, buffer, stream, want);
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
}

// The graph's nodes that depend on `node` (its successors).
std::vector<cudaGraphNode_t> dependents_of(cudaGraphNode_t node) {
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) TANDEM_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nodes.data(), nullptr, &count));
  return nodes;
}

TEST(GraphMemsetNodes, MemsetsIntoScratchMoveToTheStartAndWriteTheSameBytes) {
  TANDEM_REQUIRE_CUDA();
  DeviceBuffer device;
  unsigned char* buffer = device.bytes;
  cudaStream_t stream = device.stream;
  const std::vector<MemoryRange> scratch = {{buffer + 1024, 64}, {buffer + 2048, 64}};

  // One chain, as a capture makes it: copy A; memset M1 (scratch); copy B reads M1's bytes; memset
  // M2 (scratch); copy C reads M2's; memset M3 (not scratch); memset M4 (scratch, over two of M1's
  // bytes: both stay where they are, in their order); copy D reads M1's and M4's; memset M5
  // (scratch); copy E reads M5's. M2 and M5 move.
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphCreate(&graph, 0));
  cudaGraphNode_t last = nullptr;  // the chain's end
  auto add_copy = [&](size_t from, size_t to, size_t bytes) {
    cudaGraphNode_t node = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&node, graph, last ? &last : nullptr, last ? 1 : 0, buffer + to,
                                               buffer + from, bytes, cudaMemcpyDeviceToDevice));
    last = node;
    return node;
  };
  auto add_memset = [&](const Memset& m) {
    cudaMemsetParams p{};
    p.dst = buffer + m.offset;
    p.value = m.value;
    p.elementSize = m.element_size;
    p.width = m.width;
    p.height = 1;
    cudaGraphNode_t node = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphAddMemsetNode(&node, graph, last ? &last : nullptr, last ? 1 : 0, &p));
    last = node;
  };
  add_copy(0, 4096, 16);                        // A
  add_memset({1024, 0, 1, 1, 4, 0x11223344});   // M1
  add_copy(1024, 8192, 8);                      // B
  add_memset({2048, 0, 3, 1, 2, 0xBEEF});       // M2
  cudaGraphNode_t c = add_copy(2048, 8300, 8);  // C
  add_memset({12000, 0, 1, 1, 4, 0xCAFEF00D});  // M3
  add_memset({1026, 0, 2, 1, 1, 0x77});         // M4
  add_copy(1024, 8400, 8);                      // D
  add_memset({2100, 0, 1, 1, 4, 0x0BADF00D});   // M5
  add_copy(2100, 8500, 4);                      // E

  std::vector<unsigned char> want(kBytes, kBackground);
  const unsigned char m1_m4[] = {0x44, 0x33, 0x77, 0x77}, m2[] = {0xEF, 0xBE, 0xEF, 0xBE, 0xEF, 0xBE},
                      m3[] = {0x0D, 0xF0, 0xFE, 0xCA}, m1[] = {0x44, 0x33, 0x22, 0x11}, m5[] = {0x0D, 0xF0, 0xAD, 0x0B};
  std::memcpy(&want[1024], m1_m4, 4);
  std::memcpy(&want[2048], m2, 6);
  std::memcpy(&want[12000], m3, 4);
  std::memcpy(&want[8192], m1, 4);     // B, before M4
  std::memcpy(&want[8300], m2, 6);     // C
  std::memcpy(&want[8400], m1_m4, 4);  // D, after M4
  std::memcpy(&want[2100], m5, 4);
  std::memcpy(&want[8500], m5, 4);  // E

  EXPECT_EQ(hoist_scratch_memsets(graph, scratch), 2);  // M2 and M5
  EXPECT_EQ(nodes_of_type(graph, cudaGraphNodeTypeMemset), 3);
  ASSERT_EQ(nodes_of_type(graph, cudaGraphNodeTypeKernel), 1);
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    TANDEM_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeKernel) continue;
    size_t before = 0;
    TANDEM_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &before));
    EXPECT_EQ(before, 0u);  // at the graph's start
    // One edge, to C: E follows C, so it waits for the node through C.
    EXPECT_EQ(dependents_of(node), std::vector<cudaGraphNode_t>{c});
  }
  EXPECT_EQ(replace_memset_nodes(graph), 3);  // M1, M3 and M4, in place

  expect_replays_write(graph, buffer, stream, want);
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
}

TEST(GraphUploadNodes, SmallUploadsFromPinnedMemoryBecomeKernelsThatReadItAtEveryReplay) {
  TANDEM_REQUIRE_CUDA();
  TANDEM_CUDA_CHECK(cudaSetDevice(0));
  const size_t large = kMaxKernelUploadBytes + 16;
  unsigned char* device = nullptr;
  unsigned char* pinned = nullptr;
  TANDEM_CUDA_CHECK(cudaMalloc(&device, 2 * large));
  TANDEM_CUDA_CHECK(cudaHostAlloc(&pinned, 2 * large, cudaHostAllocDefault));
  struct Upload {
    size_t from, to, bytes;  // offsets into pinned and device
  };
  // 16-byte pieces; both ends one byte in; an odd size; the largest a kernel takes; one too large.
  const std::vector<Upload> uploads = {{0, 0, 8192},
                                       {8193, 8193, 10657},
                                       {30001, 40003, 7},
                                       {large, large, kMaxKernelUploadBytes},
                                       {0, large, large - 16 + 8}};
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphCreate(&graph, 0));
  cudaGraphNode_t previous = nullptr;
  for (const Upload& u : uploads) {  // one after the other: the last overwrites part of the others
    cudaGraphNode_t node = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&node, graph, previous ? &previous : nullptr, previous ? 1 : 0,
                                               device + u.to, pinned + u.from, u.bytes, cudaMemcpyHostToDevice));
    previous = node;
  }
  EXPECT_EQ(replace_small_upload_nodes(graph), 4);
  EXPECT_EQ(nodes_of_type(graph, cudaGraphNodeTypeMemcpy), 1);
  EXPECT_EQ(nodes_of_type(graph, cudaGraphNodeTypeKernel), 4);
  size_t edges = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  EXPECT_EQ(edges, 4u);

  cudaStream_t stream = nullptr;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraphExec_t exec = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 3; ++replay) {
    // New host values before each replay: the replay reads them, not the ones at instantiation.
    for (size_t i = 0; i < 2 * large; ++i) pinned[i] = static_cast<unsigned char>((i * 7 + replay * 13) % 251);
    std::vector<unsigned char> want(2 * large, kBackground);
    for (const Upload& u : uploads) std::memcpy(&want[u.to], &pinned[u.from], u.bytes);
    TANDEM_CUDA_CHECK(cudaMemsetAsync(device, kBackground, 2 * large, stream));
    TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    std::vector<unsigned char> got(2 * large);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(got.data(), device, 2 * large, cudaMemcpyDeviceToHost, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    const size_t first_wrong = first_difference(got, want);
    EXPECT_EQ(first_wrong, got.size()) << "replay " << replay << ": byte " << first_wrong;
  }
  TANDEM_CUDA_CHECK(cudaGraphExecDestroy(exec));
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
  TANDEM_CUDA_CHECK(cudaStreamDestroy(stream));
  TANDEM_CUDA_CHECK(cudaFreeHost(pinned));
  TANDEM_CUDA_CHECK(cudaFree(device));
}

TEST(GraphMemsetNodes, AGraphWithoutMemsetsOrUploadsIsLeftAsItIs) {
  TANDEM_REQUIRE_CUDA();
  cudaGraph_t graph = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphCreate(&graph, 0));
  cudaGraphNode_t empty_node = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphAddEmptyNode(&empty_node, graph, nullptr, 0));
  EXPECT_EQ(replace_memset_nodes(graph), 0);
  EXPECT_EQ(replace_small_upload_nodes(graph), 0);
  EXPECT_EQ(hoist_scratch_memsets(graph, {}), 0);
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  EXPECT_EQ(count, 1u);
  TANDEM_CUDA_CHECK(cudaGraphDestroy(graph));
}

}  // namespace
}  // namespace tandem::cuda
