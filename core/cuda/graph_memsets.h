#pragma once
// Memset nodes of a captured graph replaced by kernel nodes (core/cuda/graph_memsets.cu).
#include <cuda_runtime.h>

namespace tandem::cuda {

// Replaces every memset node of `graph` by a kernel node that writes the same values to the same
// bytes, with the same dependencies on both sides, before the graph is instantiated. Why: in a
// replay on an H200 (2026-11-25) a 4-byte memset node, such as the one cuDNN's attention issues
// before each call, held the next kernel back by about 5 us, where a kernel node costs about 1 us.
// Returns how many nodes were replaced. Nodes inside child graphs are left alone (stream capture
// makes none).
int replace_memset_nodes(cudaGraph_t graph);

}  // namespace tandem::cuda
