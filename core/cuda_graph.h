#pragma once
// CUDA graphs: record the kernels, copies and collectives a piece of code issues once, then run
// them again ("replay") with one launch, so the host leaves the loop. Without CUDA headers; in a
// build without CUDA, capturing raises a DeviceError and nothing is ever capturing.
//
// The contract (PyTorch's torch.cuda.CUDAGraph has the same one):
// - Warm up first: run the code eagerly a few times before capturing it, so that everything made
//   once (optimizer state, cuBLASLt and cuDNN plans, DDP's buckets) exists already.
// - What is captured is replayed on the same memory: inputs are static tensors the caller fills
//   (copy_ into them) before each replay, and outputs are the tensors the captured code made; they
//   hold the newest replay's values. Every tensor the captured code reads must stay alive as long
//   as the graph (parameters, optimizer state, static inputs).
// - Memory made during capture comes from a pool owned by the graph: it is not shared with
//   anything else, so replays can reuse the same addresses; it is given back when the graph is
//   reset or destroyed. Blocks of the ordinary pool freed by the capturing thread during capture are
//   held until then as well, since the graph may read them.
// - Host work runs once, at capture: a host synchronisation, a host read of a device value
//   (`item()`, `.to(cpu)`), a CPU tensor op, or a timing read inside the capture raises a
//   GraphCaptureError naming the call, and the capture is abandoned.
// - Values the host changes between replays without a recapture are read from device memory:
//   the learning rate of tandem's optimizers and the offsets of random draws (dropout) are written
//   there by a node of the graph whose arguments each launch sets (`write_on_each_replay`).
// - Collectives are watched in every replay as in eager mode: the capture issues none; each replay
//   issues the captured ones again (new sequence numbers, flight-recorder entries), and the
//   group's watchdog fails the group when a replay's collectives run past the timeout, saying they
//   ran in a replay of a CUDA graph (dist/process_group.h). This is done on the host around each
//   launch (`before_each_replay`, `after_each_replay`), with an event recorded after the launch:
//   the graph holds nothing for it.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/core/cuda_api.h"
#include "tandem/core/error.h"

namespace tandem {

class Generator;

namespace cuda {

// Whether the calling thread is capturing a graph now.
bool is_capturing();
// An id of the capture under way on this thread, unique in the process; 0 when none is.
uint64_t capture_id();
// Raises GraphCaptureError naming `what` (and why it cannot be captured) when the calling thread is
// capturing; does nothing otherwise.
void check_not_capturing(const char* what);

// During a capture: keeps `object` alive until the capture ends (e.g. the tensors of a collective
// the graph runs: after the capture only the graph uses their memory).
void keep_until_capture_ends(std::shared_ptr<void> object);
// During a capture: `fn` runs on the host before every launch of a replay of the graph being
// captured, with the graph's stream current (dist's NCCL group checks there that it may replay).
// Values a replay reads from the device are better written by write_on_each_replay's nodes: work
// queued here runs between two replays.
void before_each_replay(std::function<void()> fn);

// During a capture: adds a node to the graph that writes `nbytes` bytes (1 to 64) to `dst` (device
// memory made outside the graph's pool: see OutsideGraphPool) in every replay, in line on the
// calling thread's current stream: it waits for the work captured there before it (which may still
// read an earlier write's values), and work captured next there waits for it. Before each launch
// of a replay `values` runs on the host (after the before-replay functions) and fills the bytes
// that replay writes: they are the node's arguments, set on the instantiated graph, so no copy
// runs between replays and a replay already queued keeps its own values. `values` is not called
// at capture.
void write_on_each_replay(void* dst, size_t nbytes, std::function<void(void* bytes)> values);

// During a capture on `device`: copies `nbytes` bytes from the host into device memory that the
// graph being captured holds until it is reset or destroyed, and returns that memory. For values
// fixed at capture that the graph reads (the optimizers' tensor tables): an upload inside the
// capture becomes a copy that every replay runs again, because the graph's own pool may reuse its
// destination for something else; this memory is outside that pool, written once, now.
void* upload_for_graph(const void* src, size_t nbytes, int device);

// During a capture on `device`: `nbytes` of device memory for the scratch of one call being
// captured (a library's workspace), held by the graph until it is reset or destroyed and outside
// its pool, so that no other node of the graph touches it. A memset node into such memory waits
// for nothing the graph did before it: capture_end moves those nodes to the graph's start, into one
// kernel node beside its first nodes, off the path of the kernels that follow (cuDNN's attention
// sets 4 bytes of its workspace before every call, which took about 1 us between two kernels on an
// H200). The memory is the graph's for as long as it lives, so only small scratch is given: null
// for 0 bytes or more than kMaxGraphScratchBytes, and the caller allocates as usual (from the
// graph's pool, where nodes share memory).
constexpr size_t kMaxGraphScratchBytes = size_t{8} << 20;
void* scratch_for_graph(size_t nbytes, int device);

// During a capture: `fn` runs on the host right after every launch of a replay of the graph being
// captured (its work may still be queued), in the order the functions were added, with the stream
// the graph was launched on current (an event recorded there passes once the replay has); a
// replay whose launch failed runs none. For watching what the replay does (dist's NCCL group
// tracks its collectives from here).
void after_each_replay(std::function<void()> fn);

// Graph nodes as opaque handles (a cudaGraphNode_t).
using GraphNode = void*;

// During a capture: the nodes that work captured next on `stream` will depend on (the stream's
// capture dependencies); empty when `stream` is not capturing.
std::vector<GraphNode> capture_dependencies(StreamHandle stream);

// During a capture: makes the capturing `stream` depend on `nodes`, as waiting on an event recorded
// after them would, and drops from its dependencies the `num_ancestors` nodes at `ancestors`: nodes
// that the caller knows `nodes` depend on already. An event wait only adds, so a stream that waits
// on work of another stream again and again, capturing nothing of its own in between, collects
// every node it ever waited on, and each later node gets an edge to all of them: a graph of n such
// collectives had n(n - 1)/2 edges, which cost each replay time (see docs/architecture.md).
void join_capture(StreamHandle stream, const std::vector<GraphNode>& nodes, const GraphNode* ancestors,
                  size_t num_ancestors);

// For the scope, during a capture: allocations of this thread on `device` come from the ordinary pool
// and stream, not the graph's. Memory that each replay writes before the graph runs (the lr, the
// random offsets) must be made so: a block of the graph's pool may be used by earlier nodes of the
// same graph for something else, which would overwrite the value at every replay.
class OutsideGraphPool {
 public:
  explicit OutsideGraphPool(int device);
  ~OutsideGraphPool();
  OutsideGraphPool(const OutsideGraphPool&) = delete;
  OutsideGraphPool& operator=(const OutsideGraphPool&) = delete;

 private:
  int device_;
  uint64_t pool_ = 0;
  void* stream_ = nullptr;  // the thread's stream before (a cudaStream_t)
};

// During a capture on `device`: a random draw of `count` counters from `gen` inside the graph. Returns
// the counter offset of the draw relative to the graph's base and the device address of the base
// (2 x u64: seed, offset), which every replay sets from the generator's state and then advances the
// generator by what the capture drew, so replays continue the eager stream exactly.
struct CapturedDraw {
  uint64_t relative_offset = 0;
  const uint64_t* base = nullptr;  // (2,) u64 on the device: seed, offset
};
CapturedDraw capture_random_draw(Generator& gen, uint64_t count, int device);

// One captured graph.
class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Starts capturing what this thread issues on `device`: its kernels go to a capture stream until
  // capture_end(). Collectives on other streams join when they wait on the captured work (events).
  void capture_begin(int device);
  // Ends the capture and instantiates the graph. Raises GraphCaptureError if the capture was
  // invalidated (work left on a stream that never joined back, an uncapturable call).
  void capture_end();
  // Abandons a capture under way (after an error inside it); never throws.
  void abandon_capture() noexcept;

  // Runs the before-replay functions, sets the values of write_on_each_replay's nodes, launches the
  // graph on the device's current stream, then runs the after-replay functions.
  void replay();
  // Destroys the graph and gives its memory pool back (after the device finished with it).
  void reset();

  bool captured() const;
  int device() const;
  int64_t num_nodes() const;  // kernels, copies and other nodes of the graph
  int64_t num_edges() const;  // the dependencies between them
  int64_t replays() const;
  size_t pool_bytes() const;  // device memory held by the graph's pool
  // Writes the captured graph (as instantiated) to `path` in Graphviz DOT form, every node with its
  // kind, kernel and parameters, and the edges between them (cudaGraphDebugDotPrint), as PyTorch's
  // CUDAGraph.debug_dump does. Raises GraphCaptureError when nothing was captured.
  void debug_dump(const std::string& path) const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// Captures into `graph` for the scope: capture_begin() in the constructor, capture_end() from
// end(); leaving the scope without end() (an exception) abandons the capture.
class GraphCapture {
 public:
  GraphCapture(Graph& graph, int device) : graph_(graph) { graph_.capture_begin(device); }
  ~GraphCapture() {
    if (!ended_) graph_.abandon_capture();
  }
  void end() {
    ended_ = true;
    graph_.capture_end();
  }
  GraphCapture(const GraphCapture&) = delete;
  GraphCapture& operator=(const GraphCapture&) = delete;

 private:
  Graph& graph_;
  bool ended_ = false;
};

}  // namespace cuda
}  // namespace tandem
