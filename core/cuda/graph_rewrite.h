#pragma once
// Nodes of a captured graph that the copy engines would run, replaced by kernel nodes that do the
// same work (core/cuda/graph_rewrite.cu). Graph::capture_end applies both before instantiating.
//
// Why: in a replay on an H200 (2026-11-25) a memset node held the next kernel back by about 5 us
// and a small host-to-device copy node by about 10, where a kernel node costs about 1. cuDNN's
// attention issues a 4-byte memset before each call (24 in a GPT-2 step), as cuBLASLt does before
// some products, and tandem's uploads inside a capture (`from_vector`'s) are copies of a few KiB
// from pinned memory the graph owns.
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

namespace tandem::cuda {

// Device memory [data, data + bytes).
struct MemoryRange {
  void* data = nullptr;
  size_t bytes = 0;
};

// Moves every memset node of `graph` whose bytes lie inside one of `scratch` (memory that no other
// node touches: scratch_for_graph's) off the path it was captured on: its predecessors get edges
// to its successors, and one kernel node with no predecessors, at the graph's start, writes what
// all of them wrote, with an edge to each successor not already after another one. Memsets over
// bytes that another memset into scratch also sets stay where they are (moved, they would run in
// no order). A replay's nodes then do not wait for a memset between two kernels (about 1 us each
// on an H200). Returns how many nodes were moved.
int hoist_scratch_memsets(cudaGraph_t graph, const std::vector<MemoryRange>& scratch);

// Replaces every memset node of `graph` by a kernel node that writes the same values to the same
// bytes, with the same edges (and edge data) in and out. Returns how many nodes were replaced.
// Nodes inside child graphs are left alone (stream capture makes none).
int replace_memset_nodes(cudaGraph_t graph);

// Largest host-to-device copy replace_small_upload_nodes hands to a kernel: beyond it the copy
// engine's bandwidth is worth its fixed cost.
constexpr size_t kMaxKernelUploadBytes = 64 << 10;

// Replaces every one-dimensional host-to-device copy node of `graph` of at most
// kMaxKernelUploadBytes whose source is page-locked host memory mapped into the device's address
// space (cudaHostAlloc's, as the graph's staging buffers are) by a kernel node that reads the
// source through that mapping, at every replay as the copy did, with the same edges. Returns how
// many nodes were replaced.
int replace_small_upload_nodes(cudaGraph_t graph);

}  // namespace tandem::cuda
