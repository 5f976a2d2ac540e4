// Memset and small upload nodes of a captured graph replaced by kernel nodes (see graph_rewrite.h
// for why).
#include "tandem/core/cuda/graph_rewrite.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tandem/core/cuda/check.h"

namespace tandem::cuda {

namespace {
constexpr unsigned kRewriteThreads = 256;
constexpr size_t kMaxRewriteBlocks = 4096;  // larger fills and copies loop

// What cudaMemset2DAsync writes: `height` rows of `width` elements of `element_size` (1, 2 or 4)
// bytes, rows `pitch` bytes apart, every element the low bytes of `value`.
struct MemsetElements {
  char* dst = nullptr;
  size_t pitch = 0, width = 0, height = 0;
  unsigned value = 0, element_size = 0;

  explicit MemsetElements(const cudaMemsetParams& m)
      : dst(static_cast<char*>(m.dst)),
        pitch(m.pitch),
        width(m.width),
        height(m.height),
        value(m.value),
        element_size(m.elementSize) {}
  MemsetElements() = default;
  // Element i of `first`, `first + stride`, ... written by this thread.
  __device__ void write(size_t first, size_t stride) const {
    for (size_t i = first; i < width * height; i += stride) {
      char* p = dst + (i / width) * pitch + (i % width) * element_size;
      if (element_size == 4)
        *reinterpret_cast<uint32_t*>(p) = value;
      else if (element_size == 2)
        *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(value);
      else
        *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(value);
    }
  }
};

__global__ void __launch_bounds__(kRewriteThreads) memset_elements(MemsetElements memset) {
  memset.write(static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x, static_cast<size_t>(gridDim.x) * blockDim.x);
}

// Memsets moved to a graph's start, one block each, by value in the kernel's arguments (under the
// 4 KiB that kernel arguments may take).
constexpr int kMaxHoistedMemsets = 32;
struct MemsetTable {
  MemsetElements memsets[kMaxHoistedMemsets];
  int count = 0;
};

__global__ void __launch_bounds__(kRewriteThreads) memset_table(MemsetTable table) {
  if (static_cast<int>(blockIdx.x) < table.count) table.memsets[blockIdx.x].write(threadIdx.x, blockDim.x);
}

// Copies `bytes` bytes from src (here: host memory mapped into the device's address space) to dst,
// in 16-byte pieces where both are aligned for them.
__global__ void __launch_bounds__(kRewriteThreads)
    copy_bytes(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst, size_t bytes) {
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t done = 0;
  if (reinterpret_cast<uintptr_t>(src) % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    const size_t pieces = bytes / 16;
    for (size_t i = first; i < pieces; i += stride)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    done = pieces * 16;
  }
  for (size_t i = done + first; i < bytes; i += stride) dst[i] = src[i];
}

unsigned blocks_for(size_t items) {
  const size_t blocks = (items + kRewriteThreads - 1) / kRewriteThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < kMaxRewriteBlocks ? blocks : kMaxRewriteBlocks);
}

std::vector<cudaGraphNode_t> nodes_of(cudaGraph_t graph) {
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0) TANDEM_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  return nodes;
}

// The edges into and out of `node`, with their edge data.
struct Edges {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> data;
};
// Edges into a node (cudaGraphNodeGetDependencies) or out of it (cudaGraphNodeGetDependentNodes).
using EdgeQuery = cudaError_t (*)(cudaGraphNode_t, cudaGraphNode_t*, cudaGraphEdgeData*, size_t*);
Edges edges_of(cudaGraphNode_t node, EdgeQuery query) {
  Edges e;
  size_t count = 0;
  TANDEM_CUDA_CHECK(query(node, nullptr, nullptr, &count));
  e.nodes.resize(count);
  e.data.resize(count);
  if (count > 0) TANDEM_CUDA_CHECK(query(node, e.nodes.data(), e.data.data(), &count));
  return e;
}

// Puts a kernel node with `params` in `node`'s place: the same edges (and edge data) in and out.
void replace_by_kernel(cudaGraph_t graph, cudaGraphNode_t node, const cudaKernelNodeParams& params) {
  const Edges in = edges_of(node, cudaGraphNodeGetDependencies);
  const Edges out = edges_of(node, cudaGraphNodeGetDependentNodes);
  cudaGraphNode_t kernel = nullptr;
  TANDEM_CUDA_CHECK(cudaGraphAddKernelNode(&kernel, graph, nullptr, 0, &params));
  if (!in.nodes.empty()) {
    const std::vector<cudaGraphNode_t> to(in.nodes.size(), kernel);
    TANDEM_CUDA_CHECK(cudaGraphAddDependencies(graph, in.nodes.data(), to.data(), in.data.data(), in.nodes.size()));
  }
  if (!out.nodes.empty()) {
    const std::vector<cudaGraphNode_t> from(out.nodes.size(), kernel);
    TANDEM_CUDA_CHECK(
        cudaGraphAddDependencies(graph, from.data(), out.nodes.data(), out.data.data(), out.nodes.size()));
  }
  TANDEM_CUDA_CHECK(cudaGraphDestroyNode(node));
}

cudaGraphNodeType type_of(cudaGraphNode_t node) {
  cudaGraphNodeType type;
  TANDEM_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
  return type;
}

// The device address of the host memory at `host` when it is page-locked and mapped into the
// device's address space; null otherwise.
const void* mapped_host_memory(const void* host) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, host) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return attributes.type == cudaMemoryTypeHost ? attributes.devicePointer : nullptr;
}
}  // namespace

int replace_memset_nodes(cudaGraph_t graph) {
  int replaced = 0;
  for (cudaGraphNode_t node : nodes_of(graph)) {
    if (type_of(node) != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams params{};
    TANDEM_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &params));
    MemsetElements memset(params);
    void* args[] = {&memset};
    cudaKernelNodeParams kernel{};
    kernel.func = reinterpret_cast<void*>(memset_elements);
    kernel.gridDim = dim3(blocks_for(memset.width * memset.height));
    kernel.blockDim = dim3(kRewriteThreads);
    kernel.kernelParams = args;
    replace_by_kernel(graph, node, kernel);
    ++replaced;
  }
  return replaced;
}

int hoist_scratch_memsets(cudaGraph_t graph, const std::vector<MemoryRange>& scratch) {
  if (scratch.empty()) return 0;
  // The bytes a memset writes, [first, last).
  auto bytes_of = [](const cudaMemsetParams& m) {
    const char* first = static_cast<const char*>(m.dst);
    return std::make_pair(first, first + (m.height - 1) * m.pitch + m.width * m.elementSize);
  };
  auto in_scratch = [&](std::pair<const char*, const char*> bytes) {
    return std::any_of(scratch.begin(), scratch.end(), [&](const MemoryRange& r) {
      const char* data = static_cast<const char*>(r.data);
      return bytes.first >= data && bytes.second <= data + r.bytes;
    });
  };
  // The memsets into scratch; of those, the ones to move: none whose bytes another one also sets
  // (moved, they would run at once, in no order), which stay where they were.
  struct Candidate {
    cudaGraphNode_t node;
    cudaMemsetParams params;
    std::pair<const char*, const char*> bytes;
  };
  std::vector<Candidate> candidates;
  for (cudaGraphNode_t node : nodes_of(graph)) {
    if (type_of(node) != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams params{};
    TANDEM_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &params));
    if (params.height == 0 || params.width == 0 || !in_scratch(bytes_of(params))) continue;
    candidates.push_back(Candidate{node, params, bytes_of(params)});
  }
  std::vector<cudaGraphNode_t> to_move;
  std::vector<MemsetElements> moved;
  for (const Candidate& c : candidates) {
    const bool overlaps = std::any_of(candidates.begin(), candidates.end(), [&](const Candidate& other) {
      return other.node != c.node && c.bytes.first < other.bytes.second && other.bytes.first < c.bytes.second;
    });
    if (overlaps) continue;
    to_move.push_back(c.node);
    moved.emplace_back(c.params);
  }
  if (moved.empty()) return 0;
  std::vector<cudaGraphNode_t> successors;  // of the moved nodes, each once, none of them moved
  for (cudaGraphNode_t node : to_move) {
    // What came before the memset still comes before what followed it.
    const Edges in = edges_of(node, cudaGraphNodeGetDependencies);
    const Edges out = edges_of(node, cudaGraphNodeGetDependentNodes);
    for (cudaGraphNode_t after : out.nodes) {
      const Edges before_after = edges_of(after, cudaGraphNodeGetDependencies);
      for (cudaGraphNode_t before : in.nodes) {
        const bool linked =
            std::find(before_after.nodes.begin(), before_after.nodes.end(), before) != before_after.nodes.end();
        if (!linked) TANDEM_CUDA_CHECK(cudaGraphAddDependencies(graph, &before, &after, nullptr, 1));
      }
      const bool moving = std::find(to_move.begin(), to_move.end(), after) != to_move.end();
      if (!moving && std::find(successors.begin(), successors.end(), after) == successors.end()) {
        successors.push_back(after);
      }
    }
    TANDEM_CUDA_CHECK(cudaGraphDestroyNode(node));
  }

  // A successor that another one precedes waits for the new node through it: no edge of its own.
  size_t edge_count = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edge_count));
  std::vector<cudaGraphNode_t> from(edge_count), to(edge_count);
  std::vector<cudaGraphEdgeData> data(edge_count);  // unused, but asking without it fails on programmatic edges
  if (edge_count > 0) TANDEM_CUDA_CHECK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edge_count));
  std::unordered_multimap<cudaGraphNode_t, cudaGraphNode_t> next;
  for (size_t i = 0; i < edge_count; ++i) next.emplace(from[i], to[i]);
  std::unordered_set<cudaGraphNode_t> after_a_successor;
  std::vector<cudaGraphNode_t> pending;
  auto push_next = [&](cudaGraphNode_t n) {
    auto range = next.equal_range(n);
    for (auto it = range.first; it != range.second; ++it) {
      if (after_a_successor.insert(it->second).second) pending.push_back(it->second);
    }
  };
  for (cudaGraphNode_t n : successors) push_next(n);
  while (!pending.empty()) {
    cudaGraphNode_t n = pending.back();
    pending.pop_back();
    push_next(n);
  }
  std::vector<cudaGraphNode_t> first_successors;
  for (cudaGraphNode_t n : successors) {
    if (after_a_successor.count(n) == 0) first_successors.push_back(n);
  }

  for (size_t begin = 0; begin < moved.size(); begin += kMaxHoistedMemsets) {
    MemsetTable table;
    table.count = static_cast<int>(std::min<size_t>(kMaxHoistedMemsets, moved.size() - begin));
    std::copy_n(moved.begin() + static_cast<std::ptrdiff_t>(begin), table.count, table.memsets);
    void* args[] = {&table};
    cudaKernelNodeParams kernel{};
    kernel.func = reinterpret_cast<void*>(memset_table);
    kernel.gridDim = dim3(static_cast<unsigned>(table.count));
    kernel.blockDim = dim3(kRewriteThreads);
    kernel.kernelParams = args;
    cudaGraphNode_t node = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphAddKernelNode(&node, graph, nullptr, 0, &kernel));
    for (cudaGraphNode_t after : first_successors) {
      TANDEM_CUDA_CHECK(cudaGraphAddDependencies(graph, &node, &after, nullptr, 1));
    }
  }
  return static_cast<int>(moved.size());
}

int replace_small_upload_nodes(cudaGraph_t graph) {
  int replaced = 0;
  for (cudaGraphNode_t node : nodes_of(graph)) {
    if (type_of(node) != cudaGraphNodeTypeMemcpy) continue;
    cudaMemcpy3DParms copy{};
    TANDEM_CUDA_CHECK(cudaGraphMemcpyNodeGetParams(node, &copy));
    const cudaExtent& e = copy.extent;
    const bool one_dimensional = copy.srcArray == nullptr && copy.dstArray == nullptr && e.height == 1 &&
                                 e.depth == 1 && copy.srcPos.y == 0 && copy.srcPos.z == 0 && copy.dstPos.y == 0 &&
                                 copy.dstPos.z == 0;
    const bool upload = copy.kind == cudaMemcpyHostToDevice || copy.kind == cudaMemcpyDefault;
    if (!one_dimensional || !upload || e.width > kMaxKernelUploadBytes) continue;
    const auto* host = static_cast<const unsigned char*>(copy.srcPtr.ptr) + copy.srcPos.x;
    const auto* mapped = static_cast<const unsigned char*>(mapped_host_memory(host));
    if (mapped == nullptr) continue;  // pageable or device memory: the copy engine's work
    const unsigned char* src = mapped;
    unsigned char* dst = static_cast<unsigned char*>(copy.dstPtr.ptr) + copy.dstPos.x;
    size_t bytes = e.width;
    void* args[] = {&src, &dst, &bytes};
    cudaKernelNodeParams kernel{};
    kernel.func = reinterpret_cast<void*>(copy_bytes);
    kernel.gridDim = dim3(blocks_for((bytes + 15) / 16));
    kernel.blockDim = dim3(kRewriteThreads);
    kernel.kernelParams = args;
    replace_by_kernel(graph, node, kernel);
    ++replaced;
  }
  return replaced;
}

}  // namespace tandem::cuda
