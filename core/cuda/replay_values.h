#pragma once
// The kernel behind cuda_graph.h's write_on_each_replay: a node of a captured graph that writes a
// few bytes the host sets before each launch (core/cuda/replay_values.cu).
//
// Why a kernel node and not a copy before the launch: a host-to-device copy queued between two
// replays runs on a copy engine, and on an H200 (2026-11-28) the replays of GPT-2 B1 T1024 and of
// the MLP stood about 10 us apart with the learning rate's 16-byte copy (and the caller's 4-byte
// copy of the loss) between them. The node's arguments are set with
// cudaGraphExecKernelNodeSetParams, which affects later launches only: a replay already queued
// keeps the values it was launched with.
#include <cuda_runtime.h>

#include <cstddef>

namespace tandem::cuda {

// The most bytes one such node writes.
constexpr size_t kReplayValueBytes = 64;

// A kernel argument carrying the bytes by value.
struct ReplayValues {
  alignas(16) unsigned char bytes[kReplayValueBytes];
};

// Launches the kernel on `stream` (a capturing one: that makes the node), writing values.bytes[0,
// nbytes) to dst once the work before it in the stream has finished.
void launch_replay_values(const ReplayValues& values, void* dst, unsigned nbytes, cudaStream_t stream);

// The node's kernel, threads and arguments for cudaGraphExecKernelNodeSetParams: it writes
// values->bytes[0, *nbytes) to *dst. `args` (3,) receives the arguments' addresses; values, dst and
// nbytes must stay alive for the duration of that call.
cudaKernelNodeParams replay_values_node(const ReplayValues* values, void* const* dst, const unsigned* nbytes,
                                        void* args[3]);

}  // namespace tandem::cuda
