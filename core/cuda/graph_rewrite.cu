// Memset and small upload nodes of a captured graph replaced by kernel nodes (see graph_rewrite.h
// for why).
#include "tandem/core/cuda/graph_rewrite.h"

#include <cstdint>
#include <vector>

#include "tandem/core/cuda/check.h"

namespace tandem::cuda {

namespace {
constexpr unsigned kRewriteThreads = 256;
constexpr size_t kMaxRewriteBlocks = 4096;  // larger fills and copies loop

// What cudaMemset2DAsync writes: `height` rows of `width` elements of `element_size` (1, 2 or 4)
// bytes, rows `pitch` bytes apart, every element the low bytes of `value`.
__global__ void __launch_bounds__(kRewriteThreads)
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
    cudaMemsetParams memset{};
    TANDEM_CUDA_CHECK(cudaGraphMemsetNodeGetParams(node, &memset));
    char* dst = static_cast<char*>(memset.dst);
    size_t pitch = memset.pitch, width = memset.width, height = memset.height;
    unsigned value = memset.value, element_size = memset.elementSize;
    void* args[] = {&dst, &pitch, &value, &element_size, &width, &height};
    cudaKernelNodeParams kernel{};
    kernel.func = reinterpret_cast<void*>(memset_elements);
    kernel.gridDim = dim3(blocks_for(width * height));
    kernel.blockDim = dim3(kRewriteThreads);
    kernel.kernelParams = args;
    replace_by_kernel(graph, node, kernel);
    ++replaced;
  }
  return replaced;
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
