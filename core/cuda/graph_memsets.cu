// Memset nodes of a captured graph replaced by kernel nodes (see graph_memsets.h for why).
#include "tandem/core/cuda/graph_memsets.h"

#include <cstdint>
#include <vector>

#include "tandem/core/cuda/check.h"

namespace tandem::cuda {

namespace {
constexpr unsigned kMemsetThreads = 256;
constexpr size_t kMaxMemsetBlocks = 4096;  // larger memsets loop

// What cudaMemset2DAsync writes: `height` rows of `width` elements of `element_size` (1, 2 or 4)
// bytes, rows `pitch` bytes apart, every element the low bytes of `value`.
__global__ void __launch_bounds__(kMemsetThreads)
    memset_elements(char* dst, size_t pitch, unsigned value, unsigned element_size, size_t width, size_t height) {
  const size_t n = width * height;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    char* p = dst + (i / width) * pitch + (i % width) * element_size;
    if (element_size == 4)
      *reinterpret_cast<uint32_t*>(p) = value;
    else if (element_size == 2)
      *reinterpret_cast<uint16_t*>(p) = static_cast<uint16_t>(value);
    else
      *reinterpret_cast<uint8_t*>(p) = static_cast<uint8_t>(value);
  }
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
Edges edges_into(cudaGraphNode_t node) {
  Edges e;
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count));
  e.nodes.resize(count);
  e.data.resize(count);
  if (count > 0) TANDEM_CUDA_CHECK(cudaGraphNodeGetDependencies(node, e.nodes.data(), e.data.data(), &count));
  return e;
}
Edges edges_out_of(cudaGraphNode_t node) {
  Edges e;
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, nullptr, nullptr, &count));
  e.nodes.resize(count);
  e.data.resize(count);
  if (count > 0) TANDEM_CUDA_CHECK(cudaGraphNodeGetDependentNodes(node, e.nodes.data(), e.data.data(), &count));
  return e;
}
}  // namespace

int replace_memset_nodes(cudaGraph_t graph) {
  int replaced = 0;
  for (cudaGraphNode_t node : nodes_of(graph)) {
    cudaGraphNodeType type;
    TANDEM_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (type != cudaGraphNodeTypeMemset) continue;
    cudaMemsetParams memset{};
    TANDEM_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &memset));
    const Edges in = edges_into(node), out = edges_out_of(node);

    char* dst = static_cast<char*>(memset.dst);
    size_t pitch = memset.pitch, width = memset.width, height = memset.height;
    unsigned value = memset.value, element_size = memset.elementSize;
    void* args[] = {&dst, &pitch, &value, &element_size, &width, &height};
    const size_t elements = width * height;
    cudaKernelNodeParams kernel{};
    kernel.func = reinterpret_cast<void*>(memset_elements);
    kernel.blockDim = dim3(kMemsetThreads);
    const size_t blocks = (elements + kMemsetThreads - 1) / kMemsetThreads;
    kernel.gridDim = dim3(static_cast<unsigned>(blocks < 1                  ? 1
                                                : blocks < kMaxMemsetBlocks ? blocks
                                                                            : kMaxMemsetBlocks));
    kernel.kernelParams = args;
    cudaGraphNode_t fill = nullptr;
    TANDEM_CUDA_CHECK(cudaGraphAddKernelNode(&fill, graph, nullptr, 0, &kernel));
    // The kernel takes the memset's place: the same edges (and edge data) in and out.
    if (!in.nodes.empty()) {
      const std::vector<cudaGraphNode_t> to(in.nodes.size(), fill);
      TANDEM_CUDA_CHECK(cudaGraphAddDependencies(graph, in.nodes.data(), to.data(), in.data.data(), in.nodes.size()));
    }
    if (!out.nodes.empty()) {
      const std::vector<cudaGraphNode_t> from(out.nodes.size(), fill);
      TANDEM_CUDA_CHECK(
          cudaGraphAddDependencies(graph, from.data(), out.nodes.data(), out.data.data(), out.nodes.size()));
    }
    TANDEM_CUDA_CHECK(cudaGraphDestroyNode(node));
    ++replaced;
  }
  return replaced;
}

}  // namespace tandem::cuda
