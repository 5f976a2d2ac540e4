// CUDA graph capture and replay (core/cuda_graph.h). A capture runs on a stream of its own per
// device, in thread-local capture mode (other threads, such as a data loader's, go on with their
// own work), with the calling thread's allocations in a pool of the graph (allocator.cpp).
#include "tandem/core/cuda_graph.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/allocator.h"
#include "tandem/core/cuda/graph_rewrite.h"
#include "tandem/core/cuda/replay_values.h"
#include "tandem/core/cuda/runtime.h"
#include "tandem/core/random.h"

namespace tandem::cuda {

struct Graph::State {
  int device = -1;
  uint64_t pool = 0;                        // the allocator's pool id, unique per capture
  cudaStream_t stream = nullptr;            // what the capture recorded
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::unique_ptr<StreamGuard> redirect;    // the capturing thread's kernels go to `stream`
  bool capturing = false;
  std::vector<std::shared_ptr<void>> kept;  // alive until the capture ends
  std::vector<std::function<void()>> before_replay;
  std::vector<std::function<void()>> after_replay;
  std::vector<void*> staging;               // pinned host copies of captured uploads, read by every replay
  // Nodes that write values the host sets before every launch (write_on_each_replay).
  struct ReplayWrite {
    cudaGraphNode_t node = nullptr;
    void* dst = nullptr;  // (nbytes,) bytes of device memory
    unsigned nbytes = 0;
    std::function<void(void*)> values;
  };
  std::vector<ReplayWrite> writes;
  // upload_for_graph's and scratch_for_graph's memory, outside the pool: held until reset.
  std::vector<Tensor> held;
  std::vector<MemoryRange> scratch;  // scratch_for_graph's, touched by one captured call each
  // Random draws inside the capture, per generator.
  struct Draws {
    Generator* generator = nullptr;
    uint64_t start_offset = 0;  // the generator's offset when the capture first drew from it
    uint64_t counters = 0;      // how many the capture drew
    Tensor base;                // (2,) i64 on the device: seed, offset of this replay's first counter
  };
  std::vector<Draws> draws;
  int64_t replays = 0;
};

namespace {
thread_local Graph::State* capturing_state = nullptr;
std::atomic<uint64_t> next_pool{1};

Graph::State& active_capture(const char* what) {
  TANDEM_CHECK_AS(GraphCaptureError, capturing_state != nullptr, what, ": no CUDA graph capture is under way on this thread");
  return *capturing_state;
}

// Raised by cudaStreamEndCapture and friends: the capture was broken by a call it cannot hold.
std::string capture_status_text(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
}
}  // namespace

bool is_capturing() { return capturing_state != nullptr; }
uint64_t capture_id() { return capturing_state != nullptr ? capturing_state->pool : 0; }

void check_not_capturing(const char* what) {
  if (capturing_state == nullptr) return;
  TANDEM_THROW(GraphCaptureError, what, " inside a CUDA graph capture on cuda:", capturing_state->device,
               ": a captured graph replays device work only, so host work and host waits cannot be part of it. "
               "Do it before the capture or after a replay (a replay's outputs are ordinary tensors then)");
}

std::vector<GraphNode> capture_dependencies(StreamHandle stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* nodes = nullptr;
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, nullptr, nullptr, &nodes,
                                             nullptr, &count));
  if (status != cudaStreamCaptureStatusActive) return {};
  return std::vector<GraphNode>(nodes, nodes + count);
}

void join_capture(StreamHandle stream, const std::vector<GraphNode>& nodes, const GraphNode* ancestors,
                  size_t num_ancestors) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* current = nullptr;  // (count,) the stream's dependencies now
  const cudaGraphEdgeData* current_edges = nullptr;  // (count,) their edges' data
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaStreamGetCaptureInfo(s, &status, nullptr, nullptr, &current, &current_edges, &count));
  TANDEM_CHECK_AS(GraphCaptureError, status == cudaStreamCaptureStatusActive,
                  "join_capture: the stream is not capturing a CUDA graph");
  auto among = [](GraphNode node, const GraphNode* list, size_t n) { return std::find(list, list + n, node) != list + n; };
  std::vector<cudaGraphNode_t> kept;  // the new dependencies, and the data of their edges
  std::vector<cudaGraphEdgeData> kept_edges;
  for (size_t i = 0; i < count; ++i) {
    if (among(current[i], ancestors, num_ancestors) || among(current[i], nodes.data(), nodes.size())) continue;
    kept.push_back(current[i]);
    kept_edges.push_back(current_edges != nullptr ? current_edges[i] : cudaGraphEdgeData{});
  }
  for (GraphNode node : nodes) {
    kept.push_back(static_cast<cudaGraphNode_t>(node));
    kept_edges.push_back(cudaGraphEdgeData{});
  }
  TANDEM_CUDA_CHECK(cudaStreamUpdateCaptureDependencies(s, kept.data(), kept_edges.data(), kept.size(),
                                                        cudaStreamSetCaptureDependencies));
}

void write_on_each_replay(void* dst, size_t nbytes, std::function<void(void*)> values) {
  Graph::State& s = active_capture("write_on_each_replay");
  TANDEM_CHECK_AS(ValueError, nbytes > 0 && nbytes <= kReplayValueBytes, "write_on_each_replay: ", nbytes,
                  " bytes; a node writes 1 to ", kReplayValueBytes);
  DeviceGuard guard(s.device);
  cudaStream_t stream = current_stream(s.device);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TANDEM_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, nullptr, nullptr, nullptr));
  TANDEM_CHECK_AS(GraphCaptureError, status == cudaStreamCaptureStatusActive,
                  "write_on_each_replay: the current stream of cuda:", s.device, " is not part of the capture");
  // In line, where the caller is: the node waits for the work captured before it and what this
  // stream captures next waits for it, through dependent launch. It was a root beside the graph's
  // first nodes, with an edge to the next node captured: its reader became a join of two branches.
  // In line, on two H200s, the MLP's replayed step took 2 to 3 us less and GPT-2 B1 T1024's 2 to 4
  // us more (the optimizer's update waits for one more kernel). Its values until the first launch
  // sets them: zeros.
  Graph::State::ReplayWrite w{nullptr, dst, static_cast<unsigned>(nbytes), std::move(values)};
  launch_replay_values(ReplayValues{}, dst, w.nbytes, stream);
  const cudaGraphNode_t* last = nullptr;
  size_t count = 0;
  TANDEM_CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &last, nullptr, &count));
  TANDEM_CHECK(count == 1,
               "write_on_each_replay: the captured write should be the stream's one dependency, and it has ", count);
  w.node = last[0];
  s.writes.push_back(std::move(w));
}

void keep_until_capture_ends(std::shared_ptr<void> object) {
  active_capture("keep_until_capture_ends").kept.push_back(std::move(object));
}

void before_each_replay(std::function<void()> fn) {
  active_capture("before_each_replay").before_replay.push_back(std::move(fn));
}

void after_each_replay(std::function<void()> fn) {
  active_capture("after_each_replay").after_replay.push_back(std::move(fn));
}

OutsideGraphPool::OutsideGraphPool(int device) : device_(device) {
  if (capturing_state == nullptr || capturing_state->device != device) return;
  pool_ = capturing_state->pool;
  stream_ = current_stream(device);
  end_pool_use(device);
  set_stream_override(device, compute_stream(device));
}

OutsideGraphPool::~OutsideGraphPool() {
  if (pool_ == 0) return;
  set_stream_override(device_, static_cast<cudaStream_t>(stream_));
  begin_pool_use(device_, pool_);
}

CapturedDraw capture_random_draw(Generator& gen, uint64_t count, int device) {
  Graph::State& s = active_capture("random draw");
  TANDEM_CHECK_AS(GraphCaptureError, device == s.device, "a random draw on cuda:", device,
                  " inside a CUDA graph capture of cuda:", s.device);
  Graph::State::Draws* d = nullptr;
  for (auto& existing : s.draws) {
    if (existing.generator == &gen) d = &existing;
  }
  if (d == nullptr) {
    Tensor base;  // (2,) i64
    {
      OutsideGraphPool outside(device);  // written at the start of every replay: no node of the graph may reuse it
      base = empty({2}, TensorOptions(DType::i64, Device(DeviceType::cuda, device)));
    }
    s.draws.push_back(Graph::State::Draws{&gen, gen.offset(), 0, base});
    d = &s.draws.back();
    Generator* g = &gen;
    const size_t index = s.draws.size() - 1;
    Graph::State* state = &s;
    // Every replay draws where the eager stream is now, then moves the generator past its draws.
    write_on_each_replay(base.data_ptr(), 2 * sizeof(uint64_t), [g, index, state](void* bytes) {
      const uint64_t values[2] = {g->seed(), g->offset()};
      std::memcpy(bytes, values, sizeof values);
      g->advance(state->draws[index].counters);
    });
  }
  const uint64_t first = gen.advance(count);
  d->counters += count;
  return CapturedDraw{first - d->start_offset, static_cast<const uint64_t*>(d->base.data_ptr())};
}

void* upload_for_graph(const void* src, size_t nbytes, int device) {
  Graph::State& s = active_capture("upload_for_graph");
  TANDEM_CHECK_AS(GraphCaptureError, device == s.device, "upload_for_graph: cuda:", device,
                  " inside a CUDA graph capture of cuda:", s.device);
  Tensor held;  // (nbytes,) u8
  {
    OutsideGraphPool outside(device);  // the current stream is now the eager one, which is not capturing
    held = empty({static_cast<int64_t>(nbytes == 0 ? 1 : nbytes)}, TensorOptions(DType::u8, Device(DeviceType::cuda, device)));
    // The capture forbids waiting on this thread; this copy is no part of it, and is done when the
    // capture ends (the graph's first launch comes after).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    TANDEM_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaStream_t stream = current_stream(device);
    cudaError_t status = cudaMemcpyAsync(held.data_ptr(), src, nbytes, cudaMemcpyHostToDevice, stream);
    if (status == cudaSuccess) status = cudaStreamSynchronize(stream);
    cudaThreadExchangeStreamCaptureMode(&mode);
    TANDEM_CUDA_CHECK(status);
  }
  s.held.push_back(held);
  return held.data_ptr();
}

void* scratch_for_graph(size_t nbytes, int device) {
  Graph::State& s = active_capture("scratch_for_graph");
  TANDEM_CHECK_AS(GraphCaptureError, device == s.device, "scratch_for_graph: cuda:", device,
                  " inside a CUDA graph capture of cuda:", s.device);
  if (nbytes == 0 || nbytes > kMaxGraphScratchBytes) return nullptr;
  Tensor held;  // (nbytes,) u8
  {
    OutsideGraphPool outside(device);  // a block of the pool may have been used by earlier nodes
    held = empty({static_cast<int64_t>(nbytes)}, TensorOptions(DType::u8, Device(DeviceType::cuda, device)));
  }
  s.held.push_back(held);
  s.scratch.push_back(MemoryRange{held.data_ptr(), nbytes});
  return held.data_ptr();
}

bool capturing_uploads() { return capturing_state != nullptr; }

// A host-to-device copy inside a capture reads pinned memory the graph owns, so every replay
// uploads the values the capture saw (a pageable source cannot be captured).
void captured_upload(void* dst, const void* src, size_t nbytes, cudaStream_t stream) {
  Graph::State& s = *capturing_state;
  void* pinned = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  TANDEM_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  cudaError_t status = cudaHostAlloc(&pinned, nbytes == 0 ? 1 : nbytes, cudaHostAllocDefault);
  cudaThreadExchangeStreamCaptureMode(&mode);
  TANDEM_CUDA_CHECK(status);
  s.staging.push_back(pinned);
  std::memcpy(pinned, src, nbytes);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst, pinned, nbytes, cudaMemcpyHostToDevice, stream));
}

Graph::Graph() : state_(std::make_unique<State>()) {}

Graph::~Graph() {
  if (state_->capturing) abandon_capture();
  try {
    reset();
  } catch (const std::exception&) {
    // never throw from a destructor
  }
}

void Graph::capture_begin(int device) {
  TANDEM_CHECK_AS(GraphCaptureError, capturing_state == nullptr,
                  "capture_begin: this thread is already capturing a CUDA graph (captures do not nest)");
  TANDEM_CHECK_AS(GraphCaptureError, !state_->capturing && state_->exec == nullptr,
                  "capture_begin: this graph holds a capture already; reset() it first");
  check_device(device);
  reset();  // what an abandoned capture left
  State& s = *state_;
  s.device = device;
  s.pool = next_pool.fetch_add(1);
  s.stream = capture_stream(device);
  DeviceGuard guard(device);
  begin_pool_use(device, s.pool);
  s.redirect = std::make_unique<StreamGuard>(device, s.stream);
  cudaError_t status = cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal);
  if (status != cudaSuccess) {
    s.redirect.reset();
    end_pool_use(device);
    TANDEM_THROW(BackendError, "cuda:", device, ": could not begin a graph capture: ", capture_status_text(status));
  }
  s.capturing = true;
  capturing_state = &s;
}

// Undoes what capture_begin set on this thread, and gives the generators back the counters the
// capture reserved (it ran nothing: the first replay draws them).
static void leave_capture(Graph::State& s) {
  capturing_state = nullptr;
  s.capturing = false;
  s.redirect.reset();
  end_pool_use(s.device);
  for (auto& d : s.draws) d.generator->set_state(d.generator->seed(), d.start_offset);
}

void Graph::capture_end() {
  State& s = *state_;
  TANDEM_CHECK_AS(GraphCaptureError, s.capturing && capturing_state == &s,
                  "capture_end: this graph is not capturing on this thread");
  DeviceGuard guard(s.device);
  cudaGraph_t graph = nullptr;
  cudaError_t status = cudaStreamEndCapture(s.stream, &graph);
  leave_capture(s);
  s.kept.clear();  // the collectives' tensors: only the graph uses their memory from now on
  if (status != cudaSuccess || graph == nullptr) {
    cudaGetLastError();
    if (graph != nullptr) cudaGraphDestroy(graph);
    TANDEM_THROW(GraphCaptureError, "cuda:", s.device, ": the graph capture failed (", capture_status_text(status),
                 "): work was left on a stream that never joined the capturing stream again, or a call inside it "
                 "cannot be captured");
  }
  s.graph = graph;
  hoist_scratch_memsets(graph, s.scratch);  // before the rest become kernel nodes in place
  replace_memset_nodes(graph);
  replace_small_upload_nodes(graph);
  status = cudaGraphInstantiate(&s.exec, graph, 0);
  if (status != cudaSuccess) {
    cudaGetLastError();
    s.exec = nullptr;
    TANDEM_THROW(BackendError, "cuda:", s.device, ": could not instantiate the captured graph: ",
                 capture_status_text(status));
  }
}

void Graph::abandon_capture() noexcept {
  State& s = *state_;
  if (!s.capturing) return;
  try {
    DeviceGuard guard(s.device);
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(s.stream, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // the capture's own error, if it was invalidated
  } catch (const std::exception&) {
  }
  if (capturing_state == &s) leave_capture(s);
  s.capturing = false;
  s.kept.clear();
  s.held.clear();  // nothing ran that reads it
  s.scratch.clear();
  s.before_replay.clear();
  s.after_replay.clear();
  s.writes.clear();
  s.draws.clear();
}

void Graph::replay() {
  State& s = *state_;
  TANDEM_CHECK_AS(GraphCaptureError, s.exec != nullptr, "replay: nothing captured in this graph");
  check_not_capturing("replaying a CUDA graph");
  DeviceGuard guard(s.device);
  for (auto& fn : s.before_replay) fn();
  for (auto& w : s.writes) {
    ReplayValues values{};
    w.values(values.bytes);
    void* args[3];
    const cudaKernelNodeParams params = replay_values_node(&values, &w.dst, &w.nbytes, args);
    TANDEM_CUDA_CHECK(cudaGraphExecKernelNodeSetParams(s.exec, w.node, &params));
  }
  TANDEM_CUDA_CHECK(cudaGraphLaunch(s.exec, current_stream(s.device)));
  ++s.replays;
  for (auto& fn : s.after_replay) fn();
}

void Graph::reset() {
  State& s = *state_;
  TANDEM_CHECK_AS(GraphCaptureError, !s.capturing, "reset: the graph is being captured; end or abandon the capture first");
  if (s.pool == 0) return;
  DeviceGuard guard(s.device);
  // The last replay may still run: its memory and staging buffers are in use until it ends.
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  if (s.exec != nullptr) cudaGraphExecDestroy(s.exec);
  if (s.graph != nullptr) cudaGraphDestroy(s.graph);
  s.exec = nullptr;
  s.graph = nullptr;
  for (void* p : s.staging) cudaFreeHost(p);
  s.staging.clear();
  s.held.clear();
  s.scratch.clear();
  s.before_replay.clear();
  s.after_replay.clear();
  s.writes.clear();
  s.draws.clear();
  release_pool(s.device, s.pool, compute_stream(s.device));
  s.pool = 0;
  s.replays = 0;
}

bool Graph::captured() const { return state_->exec != nullptr; }
int Graph::device() const { return state_->device; }
int64_t Graph::replays() const { return state_->replays; }

int64_t Graph::num_nodes() const {
  if (state_->graph == nullptr) return 0;
  size_t n = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetNodes(state_->graph, nullptr, &n));
  return static_cast<int64_t>(n);
}

int64_t Graph::num_edges() const {
  if (state_->graph == nullptr) return 0;
  size_t n = 0;
  TANDEM_CUDA_CHECK(cudaGraphGetEdges(state_->graph, nullptr, nullptr, nullptr, &n));
  return static_cast<int64_t>(n);
}

void Graph::debug_dump(const std::string& path) const {
  TANDEM_CHECK_AS(GraphCaptureError, state_->graph != nullptr, "debug_dump: nothing captured in this graph");
  const cudaError_t status = cudaGraphDebugDotPrint(state_->graph, path.c_str(), cudaGraphDebugDotFlagsVerbose);
  if (status != cudaSuccess) {
    cudaGetLastError();
    TANDEM_THROW(BackendError, "could not write the CUDA graph to '", path, "': ", cudaGetErrorString(status));
  }
}

size_t Graph::pool_bytes() const { return state_->pool == 0 ? 0 : ::tandem::cuda::pool_bytes(state_->device, state_->pool); }

}  // namespace tandem::cuda
