// The NCCL process group: collectives on cuda tensors of this rank's GPU. Each collective is
// ordered after the caller's current stream by an event, runs on a communication stream (of the
// default priority unless InitOptions::comm_stream_high_priority), and records a completion event
// (without timing: a pair of timing events around it only where asked, TimedCollectives, since
// each costs the stream some 3 us); the host never blocks. A watchdog thread completes Works
// (releasing their tensors), polls ncclCommGetAsyncError, and aborts the communicator when a
// collective fails or runs past the timeout, so no kernel spins forever on a peer that is gone.
// Collectives captured into a CUDA graph are issued again by every replay, and watched the same
// way (ReplayWatch).
//
// The communicator is blocking by default, as PyTorch's is: NCCL launches each call on the
// caller's thread. A non-blocking one (InitOptions::nccl_nonblocking) hands every call to a
// thread of NCCL's own, which cost 89-186 us of host time per all-reduce on 2 H100s (2026-11-28,
// bench/allreduce), against 13-20 us for the raw blocking call: more than a 1 MiB all-reduce
// takes on the GPU. What the non-blocking mode gives is calls that can be aborted while they run.
// The watchdog aborts only between calls (it holds the group's lock, as every launch does), so a
// blocking communicator is aborted as safely while its kernels spin; a blocking call that waits
// on a gone peer inside NCCL (creating the communicator, a launch that first connects to its
// peers, finalizing) is covered by a StuckCallWatch instead, which ends the process with a
// message naming the call once it has run past the timeout.
#include <nccl.h>  // brings cudaStream_t, the type NCCL's calls take

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/kernels.h"
#include "tandem/dist/check.h"
#include "tandem/dist/internal.h"
#include "tandem/dist/peer_all_reduce.h"
#include "tandem/dist/stuck_call.h"
#include "tandem/dist/work_tracker.h"

namespace tandem::dist::internal {

namespace {

const std::string kBackend = "nccl";

// Why a blocking NCCL call may not return, and what to do (StuckCallWatch).
const char* const kStuckCallHint =
    "another rank probably died or hangs before NCCL connected to it (InitOptions::nccl_nonblocking, or "
    "$TANDEM_NCCL_NONBLOCKING=1, makes such calls abortable, at some 100 us of host time per collective)";

ncclDataType_t nccl_type(DType dtype) {
  // In DType's order: f32, f64, f16, bf16, i32, i64, u8, bool (as bytes).
  const ncclDataType_t types[] = {ncclFloat32, ncclFloat64, ncclFloat16, ncclBfloat16,
                                  ncclInt32,   ncclInt64,   ncclUint8,   ncclUint8};
  return types[static_cast<int>(dtype)];
}

// `size`: the communicator's ranks. With one rank, avg is the identity and goes to NCCL as sum: NCCL
// 2.28's one-rank path for ncclAvg on floats (a pre-multiplying kernel) leaves the last elements
// unwritten when the count does not split evenly over its blocks (seen: 4597 f64 values, the last
// one untouched), while its one-rank sum is a plain copy.
ncclRedOp_t nccl_op(ReduceOp op, int size) {
  if (size == 1 && op == ReduceOp::avg) return ncclSum;
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

std::string nccl_text(ncclResult_t status, ncclComm_t comm) {
  std::string text = ncclGetErrorString(status);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
  return text;
}

// The NCCL call(s) of one collective, by reference: `enqueue` makes them on the stream it is given
// and returns their status. Unlike a std::function, making one allocates nothing (a lambda that
// captures three references outgrows a std::function's inline storage), and every launch makes one.
class EnqueueRef {
 public:
  template <typename F>
  EnqueueRef(const F& enqueue)  // NOLINT: made implicitly from the lambda at each launch
      : callable_(&enqueue),
        call_([](const void* callable, cudaStream_t stream) { return (*static_cast<const F*>(callable))(stream); }) {}
  ncclResult_t operator()(cudaStream_t stream) const { return call_(callable_, stream); }

 private:
  const void* callable_;  // the caller's lambda, alive for the launch
  ncclResult_t (*call_)(const void*, cudaStream_t);
};

struct NcclWork : TrackedWork {
  NcclWork() { timed_on_host = false; }
  // On the collective's stream, around it; back to the pools once completed. A timed collective's
  // pair has timing (elapsed_ms); otherwise there is no start, and the end (without timing, which
  // costs the stream nothing) serves completion and ordering (inside a capture its waits become
  // edges of the graph).
  std::unique_ptr<cuda::Event> start, end;
  // A replayed collective's end instead: recorded after the graph's launch, shared by all the
  // collectives of that replay (ReplayWatch).
  std::shared_ptr<cuda::Event> replay_end;
  // Where its end is recorded: the stream it ran on (the communication stream or the caller's), or
  // for a replayed collective the stream the graph was launched on. Ends on one stream pass in
  // the order they were recorded (completion_order).
  cuda::StreamHandle stream = nullptr;
  // Captured on the communication stream: the graph nodes its end stands for, and how many of its
  // capture's comm_stream_nodes (ReplayWatch) it depends on: all those up to its end.
  std::vector<cuda::GraphNode> end_nodes;
  size_t nodes_before_end = 0;
  uint64_t capture_id = 0;  // cuda::capture_id() of the capture that recorded it, when captured
};

// The collectives that one CUDA graph capture recorded on the group, which every replay of the
// graph issues again. After each launch the replay's collectives are stamped (new sequence
// numbers, same fingerprints: every rank replays the same graph) and tracked, all with one end:
// an event recorded on the launching stream right after the graph, which passes when the whole
// replay has. So the watchdog fails the group when a replay runs past the timeout, and the graph
// holds nothing for it: an event-record node per collective cost each replay about 2 us per
// collective (bench/allreduce, 2 H100s, 2026-11-28), more than the rest of tandem's part.
struct ReplayWatch {
  struct Collective {
    const char* op = "";
    size_t bytes = 0;
    Fingerprint fingerprint;  // seq 0: each replay stamps its own
  };
  uint64_t capture_id = 0;  // cuda::capture_id() of the capture that recorded them
  std::vector<Collective> collectives;
  int64_t replays = 0;
  // The graph nodes of the capture that the communication stream's collectives depend on, in the
  // order they were captured: each one's fork (the caller's dependencies at its launch) and end
  // (the communication stream's after it). The stream runs its collectives in order, so each end
  // depends on every node listed before it; a wait for a collective drops those from the waiting
  // stream's dependencies (cuda::join_capture), or every wait would add them again.
  std::vector<cuda::GraphNode> comm_stream_nodes;
};

// The group's state, shared with its Works. Members and methods need `own_mutex` held.
class NcclCore final : public WorkTracker, public std::enable_shared_from_this<NcclCore> {
 public:
  NcclCore() : WorkTracker(kBackend, own_mutex) {}
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  int device = 0;
  bool launch_alone = false;            // InitOptions::nccl_launch_alone
  bool nonblocking = false;             // InitOptions::nccl_nonblocking
  bool time_all = false;                // InitOptions::time_collectives
  cuda::StreamHandle stream = nullptr;  // the communication stream
  std::unique_ptr<cuda::Event> ready;   // recorded on the caller's stream before each collective; no timing
  std::vector<std::unique_ptr<cuda::Event>> spare_timed_events, spare_sync_events;
  std::shared_ptr<ReplayWatch> capturing;  // of the latest capture that recorded a collective here
  // Small all-reduces within one node run on tandem's own kernel (dist/peer_all_reduce.h); null
  // where that path is off. `last_peer`: the latest one launched, which the next one follows (not
  // kept alive for it: once forgotten it has completed, or its capture has ended).
  std::unique_ptr<PeerAllReduce> peer;
  std::weak_ptr<NcclWork> last_peer;
  std::mutex own_mutex;

  cudaStream_t nccl_stream() const { return static_cast<cudaStream_t>(stream); }

  ~NcclCore() override {
    if (comm != nullptr) ncclCommAbort(comm);  // never shut down (creation failed half-way)
  }

  // From the pool of events with timing (`timed`: elapsed_ms) or of those without, which the
  // stream edges and completion queries need alone and CUDA handles more cheaply.
  std::unique_ptr<cuda::Event> take_event(bool timed) {
    auto& spare = timed ? spare_timed_events : spare_sync_events;
    if (spare.empty()) return std::make_unique<cuda::Event>(timed);
    std::unique_ptr<cuda::Event> e = std::move(spare.back());
    spare.pop_back();
    return e;
  }

  void poll(TrackedWork& tracked) override {
    auto& w = static_cast<NcclWork&>(tracked);
    const cuda::Event& end = w.end != nullptr ? *w.end : *w.replay_end;
    try {
      if (!end.query()) return;
    } catch (const std::exception& e) {
      fail(::tandem::detail::concat(describe(w), ": ", e.what()), &w);
      w.done = true;  // the event will not pass: forget it
      return;
    }
    if (fail_if_peer_kernel_gave_up()) return;  // passed without a result
    finish(w);
  }

  const void* completion_order(const TrackedWork& tracked) const override {
    return static_cast<const NcclWork&>(tracked).stream;
  }

  void complete_in_order(TrackedWork& tracked) override { finish(static_cast<NcclWork&>(tracked)); }

  // `w` has finished (its end has passed): its time, its events back to the pools, completed.
  void finish(NcclWork& w) {
    const bool timed = w.start != nullptr;
    if (timed) {
      try {
        w.elapsed_ms = w.start->elapsed_ms(*w.end);
      } catch (const std::exception&) {
        w.elapsed_ms = -1;  // only the timing is lost
      }
      spare_timed_events.push_back(std::move(w.start));
    }
    if (w.end != nullptr) (timed ? spare_timed_events : spare_sync_events).push_back(std::move(w.end));
    w.replay_end.reset();
    complete(w);
  }

  // The watchdog's round: NCCL's asynchronous errors, the peer all-reduce's give-ups, completions,
  // timeouts.
  void watchdog_round() override {
    fail_if_peer_kernel_gave_up();
    if (comm != nullptr && failure.empty()) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t status = ncclCommGetAsyncError(comm, &state);
      if (status != ncclSuccess) state = status;
      if (state != ncclSuccess && state != ncclInProgress) {
        TrackedWork* oldest = oldest_pending();
        std::string what = oldest != nullptr
                               ? ::tandem::detail::concat(describe(*oldest), " failed after ",
                                                          format_seconds(seconds_since(oldest->started)))
                               : ::tandem::detail::concat("rank ", rank, ": the nccl communicator failed");
        fail(::tandem::detail::concat(what, ": NCCL reported ", nccl_text(state, comm),
                                      " (another rank probably died, or its network failed)"),
             oldest);
      }
    }
    WorkTracker::watchdog_round();
  }

  // The peer kernel's backstop (dist/peer_all_reduce.h): a kernel that gave up waiting for a rank
  // ends, and so do the ends of the collectives after it on its stream, without a result. True
  // when that happened (the group has failed). The timeout fails such a wait well before.
  bool fail_if_peer_kernel_gave_up() {
    if (peer == nullptr) return false;
    const int waited_for = peer->timed_out_peer();
    if (waited_for < 0) return false;
    if (failure.empty()) {
      TrackedWork* oldest = oldest_pending();
      std::string what = oldest != nullptr ? describe(*oldest) : ::tandem::detail::concat("rank ", rank);
      fail(::tandem::detail::concat(what, ": tandem's peer all-reduce kernel waited for rank ", waited_for,
                                    " and gave up (another rank probably died, hangs, or issued a different "
                                    "collective)"),
           oldest);
    }
    return true;
  }

  // The oldest collective not done yet, or null.
  TrackedWork* oldest_pending() const {
    for (auto& w : pending) {
      if (!w->done) return w.get();
    }
    return nullptr;
  }

  // Polls a non-blocking communicator until the call in progress has finished, for at most `limit`
  // seconds since `since` (then answers ncclInProgress). A non-blocking communicator hands every
  // call to a thread of NCCL's own and answers ncclInProgress at once; that launch takes some tens
  // of microseconds, less than the shortest sleep Linux gives (~60 us), which the caller would
  // wait on every collective. So the first kSpinSeconds are polled without sleeping (yielding the
  // core to NCCL's thread); a launch that takes longer is connecting to its peers, and the polls
  // back off to 100 us.
  ncclResult_t await_comm(Clock::time_point since, double limit) {
    constexpr double kSpinSeconds = 2e-3;
    int sleep_us = 0;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t status = ncclCommGetAsyncError(comm, &state);
      if (status != ncclSuccess) return status;
      if (state != ncclInProgress) return state;
      const double waited = seconds_since(since);
      if (waited > limit) return ncclInProgress;
      if (waited < kSpinSeconds) {
        std::this_thread::yield();
        continue;
      }
      sleep_us = std::min(std::max(2 * sleep_us, 1), 100);
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
  }

  // Orders the collective after the caller's stream, enqueues it on the communication stream (or,
  // inside a CollectivesOnCurrentStream scope, on the caller's stream itself), and tracks it.
  std::shared_ptr<Work> launch(const std::shared_ptr<NcclWork>& w, const Fingerprint& fingerprint, EnqueueRef enqueue);

  // The peer kernel's protocol needs this rank's peer all-reduces to run one after another: one
  // launched on another stream than the latest one's waits for that one's end (eagerly, or inside
  // the capture that recorded both). A replayed graph's and an eager one's are ordered by the
  // caller (the graph's stream, or a wait): tandem's collectives follow the caller's stream.
  void follow_last_peer(cudaStream_t stream) {
    const std::shared_ptr<NcclWork> last = last_peer.lock();
    if (last == nullptr || last->end == nullptr || last->done || last->stream == stream) return;
    const bool capturing_now = cuda::is_capturing();
    if (last->captured != capturing_now || (capturing_now && last->capture_id != cuda::capture_id())) return;
    last->end->wait_on(stream);
  }

  // The watch of the capture under way on this thread, made (and hooked into the graph's replays)
  // by its first collective.
  ReplayWatch& watch_for_capture();
  // Inside the capture of `w` (captured on another stream): the caller's current stream depends on
  // w's end from here on, without edges to the nodes that end depends on already.
  void join_captured(const NcclWork& w);
  // Before a replay is launched: refuses it once the group failed or was shut down (its NCCL
  // kernels would run on a communicator that is gone).
  void prepare_replay(const ReplayWatch& watch);
  // After the launch: stamps and tracks the replay's collectives, ended by one event after it.
  void track_replay(ReplayWatch& watch);

 protected:
  // Aborting stops the communicator's kernels, so the streams waiting on them go on.
  void abort_backend() override {
    if (peer != nullptr) peer->abort();  // its kernels stop waiting for the other ranks
    if (comm == nullptr) return;
    report_failure(::tandem::detail::concat("rank ", rank, ": aborting the NCCL communicator"));
    try {
      cuda::DeviceGuard guard(device);
      ncclCommAbort(comm);
    } catch (const std::exception&) {
      ncclCommAbort(comm);  // on whatever device is current
    }
    comm = nullptr;
  }

  // A CUDA event needs no polling to progress, and completions wait for the next round (or the
  // next launch's sweep) at most: no wake-up per collective.
  bool polls_while_idle() const override { return true; }

  std::chrono::microseconds poll_interval() const override {
    return std::chrono::microseconds(static_cast<int64_t>(std::clamp(timeout / 20, 0.001, 0.1) * 1e6));
  }
};

// wait(): the caller's stream waits for the collective; the host goes on. A collective that ran
// on the caller's current stream is ordered before what comes next already.
class NcclWorkHandle final : public TrackedWorkHandle {
 public:
  using TrackedWorkHandle::TrackedWorkHandle;
  void wait() override {
    auto& core = static_cast<NcclCore&>(*tracker_);
    auto& w = static_cast<NcclWork&>(*state_);
    std::lock_guard<std::mutex> lock(core.mutex);
    if (w.failed) core.raise(w);
    const bool same_stream = w.stream == cuda::current_stream_handle(core.device);
    if (w.captured) {
      // Inside its capture: an edge of the graph. After it: each replay has waited already.
      if (cuda::is_capturing() && !same_stream) core.join_captured(w);
      return;
    }
    if (w.done) return;
    TANDEM_CHECK_AS(GraphCaptureError, !cuda::is_capturing(), core.describe(w),
                    " was launched before the CUDA graph capture and is waited for inside it: wait for it before "
                    "capture_begin (a capture can only wait for work it captured)");
    if (!same_stream) w.end->wait(core.device);
  }
};

std::shared_ptr<Work> NcclCore::launch(const std::shared_ptr<NcclWork>& w, const Fingerprint& fingerprint,
                                       EnqueueRef enqueue) {
  check_usable(w->op, w->bytes);
  // Inside a CUDA graph capture the communication stream joins the capture through `ready`, and the
  // collective becomes a node of the graph: no timing events, its tensors kept until the capture
  // ends (only the graph uses their memory after it). The capture issues nothing, so it gets no
  // sequence number; every replay issues it with one of its own (ReplayWatch).
  w->captured = cuda::is_capturing();
  if (w->captured) {
    w->fingerprint = fingerprint;
    w->capture_id = cuda::capture_id();
  } else {
    stamp(*w, fingerprint);
  }
  if (detail && size > 1) {
    check_before_launch(*w, [&](const void* mine, size_t bytes) { return host_all_gather(mine, bytes, timeout); });
  }
  cuda::DeviceGuard guard(device);
  cuda::ProfilerRange range(w->op);
  const bool timed = !w->captured && (time_all || collectives_timed());
  if (timed) w->start = take_event(/*timed=*/true);
  w->end = take_event(timed);
  // The caller's stream, or the communication stream ordered after it by `ready`.
  const bool on_caller_stream = collectives_on_current_stream();
  const cuda::StreamHandle caller_stream = cuda::current_stream_handle(device);
  const cudaStream_t run_on = on_caller_stream ? static_cast<cudaStream_t>(caller_stream) : nccl_stream();
  w->stream = run_on;
  std::vector<cuda::GraphNode> fork;  // captured on the communication stream: what it waits for
  if (!on_caller_stream) {
    if (w->captured) fork = cuda::capture_dependencies(caller_stream);
    ready->record_on(caller_stream);
    ready->wait_on(stream);
  }
  if (timed) w->start->record_on(run_on);
  w->started = Clock::now();
  ncclResult_t status = ncclSuccess;
  if (nonblocking) {
    status = enqueue(run_on);
    if (status == ncclInProgress) status = await_comm(w->started, timeout);
  } else {
    StuckCallWatch watch([this, w = w.get()] { return describe(*w) + location; }, kStuckCallHint, timeout);
    status = enqueue(run_on);
  }
  if (status != ncclSuccess) {
    pending.push_back(w);  // fail() marks it and aborts
    fail(status == ncclInProgress
             ? ::tandem::detail::concat(describe(*w), location, " timed out after ",
                                        format_seconds(seconds_since(w->started)), " (timeout ",
                                        format_seconds(timeout),
                                        ") while NCCL was still launching it (connecting to its peers): another "
                                        "rank probably died, hangs, or issued a different collective")
             : ::tandem::detail::concat(describe(*w), ": NCCL error ", nccl_text(status, comm)),
         w.get());
    raise(*w);
  }
  if (w->captured) watch_for_capture().collectives.push_back({w->op, w->bytes, fingerprint});
  w->end->record_on(run_on);
  if (w->captured && !on_caller_stream) {
    std::vector<cuda::GraphNode>& nodes = watch_for_capture().comm_stream_nodes;
    w->end_nodes = cuda::capture_dependencies(run_on);
    nodes.insert(nodes.end(), fork.begin(), fork.end());
    nodes.insert(nodes.end(), w->end_nodes.begin(), w->end_nodes.end());
    w->nodes_before_end = nodes.size();
  }
  if (w->captured) {
    cuda::keep_until_capture_ends(w);
    return std::make_shared<NcclWorkHandle>(shared_from_this(), w);
  }
  mark_started(*w);  // enqueued
  sweep_at_launch();
  track(w);
  return std::make_shared<NcclWorkHandle>(shared_from_this(), w);
}

ReplayWatch& NcclCore::watch_for_capture() {
  const uint64_t id = cuda::capture_id();
  if (capturing == nullptr || capturing->capture_id != id) {
    capturing = std::make_shared<ReplayWatch>();
    capturing->capture_id = id;
    // The graph keeps the group's state and the watch alive while it can be replayed.
    std::shared_ptr<NcclCore> self = shared_from_this();
    std::shared_ptr<ReplayWatch> watch = capturing;
    cuda::before_each_replay([self, watch] { self->prepare_replay(*watch); });
    cuda::after_each_replay([self, watch] { self->track_replay(*watch); });
  }
  return *capturing;
}

void NcclCore::join_captured(const NcclWork& w) {
  const bool in_its_capture = capturing != nullptr && capturing->capture_id == cuda::capture_id();
  if (w.end_nodes.empty() || !in_its_capture) {
    w.end->wait(device);
    return;
  }
  cuda::DeviceGuard guard(device);
  cuda::join_capture(cuda::current_stream_handle(device), w.end_nodes, capturing->comm_stream_nodes.data(),
                     w.nodes_before_end);
}

void NcclCore::prepare_replay(const ReplayWatch& watch) {
  std::lock_guard<std::mutex> lock(mutex);
  if (shut_down || stop || !failure.empty()) {
    TANDEM_THROW(BackendError, "rank ", rank, ": replaying a CUDA graph with ", watch.collectives.size(),
                 " nccl collective(s) refused: ",
                 failure.empty() ? std::string("the group was shut down (dist::finalize ran)")
                                 : "the group failed earlier: " + failure);
  }
}

void NcclCore::track_replay(ReplayWatch& watch) {
  std::lock_guard<std::mutex> lock(mutex);
  ++watch.replays;
  // Failed since prepare_replay (the watchdog, meanwhile): the replay's collectives run on an
  // aborted communicator, which ends them; nothing is left to watch.
  if (!failure.empty() || stop || shut_down) return;
  cuda::DeviceGuard guard(device);
  // On the stream the graph was just launched on (still current): passes once the whole replay has.
  auto end = std::make_shared<cuda::Event>(/*timing=*/false);
  end->record(device);
  sweep_at_launch();
  const Clock::time_point launched = Clock::now();
  const cuda::StreamHandle launched_on = cuda::current_stream_handle(device);
  for (const ReplayWatch::Collective& c : watch.collectives) {
    auto w = std::make_shared<NcclWork>();
    w->op = c.op;
    w->bytes = c.bytes;
    w->replay_end = end;
    w->stream = launched_on;
    stamp(*w, c.fingerprint);
    w->replay = watch.replays;
    w->started = launched;
    mark_started(*w);
    track(w);
  }
}

std::shared_ptr<NcclWork> new_state(const char* op, size_t bytes, std::vector<Tensor> tensors) {
  auto w = std::make_shared<NcclWork>();
  w->op = op;
  w->bytes = bytes;
  w->tensors = std::move(tensors);
  return w;
}

// One NCCL call per non-empty block of `whole` (rank r's block: counts[r] elements, in rank order),
// grouped into one launch; the first error wins and the group is always closed.
ncclResult_t each_block(const std::vector<int64_t>& counts, const Tensor& whole,
                        const std::function<ncclResult_t(int root, void* block, size_t count)>& call) {
  const std::vector<int64_t> offsets = block_offsets(counts);
  ncclResult_t first_error = ncclGroupStart();
  if (first_error != ncclSuccess) return first_error;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] == 0) continue;
    void* block = static_cast<char*>(whole.data_ptr()) + static_cast<size_t>(offsets[r]) * dtype_size(whole.dtype());
    ncclResult_t status = call(static_cast<int>(r), block, static_cast<size_t>(counts[r]));
    if (status != ncclSuccess && status != ncclInProgress && first_error == ncclSuccess) first_error = status;
  }
  ncclResult_t end = ncclGroupEnd();
  return first_error != ncclSuccess ? first_error : end;
}

class NcclGroup final : public TrackedGroup {
 public:
  explicit NcclGroup(const std::shared_ptr<NcclCore>& core) : TrackedGroup(core), core_(core) {
    {
      // Allocated for the communication stream: its block is reused in that stream's order.
      cuda::StreamGuard stream_guard(core_->device, core_->nccl_stream());
      barrier_tensor_ = zeros({1}, TensorOptions(DType::f32, device()));
    }
    core_->start_watchdog();
  }
  ~NcclGroup() override { shutdown(); }

  using TrackedGroup::all_reduce;

  std::shared_ptr<Work> all_reduce(const std::vector<Tensor>& tensors, ReduceOp op, const std::string& label) override {
    const char* name = "all_reduce";
    TANDEM_CHECK_AS(ValueError, !tensors.empty(), "nccl all_reduce: no tensors given");
    size_t bytes = 0, count = 0;
    for (const Tensor& t : tensors) {
      check_tensor(t, device(), kBackend, name, "tensor");
      check_reducible(t.dtype(), op, kBackend, name);
      bytes += t.nbytes();
      count += static_cast<size_t>(t.numel());
    }
    check_disjoint(tensors, kBackend, name);
    const Fingerprint fingerprint = Fingerprint::make(name, count, tensors[0].dtype(), op, -1, label);
    if (completes_alone()) return complete_alone(name, bytes, fingerprint);  // sum, avg, max, min of one: itself
    auto w = new_state(name, bytes, tensors);
    std::lock_guard<std::mutex> lock(core_->mutex);
    if (core_->peer != nullptr && tensors.size() == 1 && core_->peer->takes(tensors[0], op)) {
      std::shared_ptr<Work> work = core_->launch(w, fingerprint, [&](cudaStream_t stream) {
        core_->follow_last_peer(stream);
        core_->peer->launch(tensors[0], op, stream);
        return ncclSuccess;
      });
      core_->last_peer = w;
      return work;
    }
    return core_->launch(w, fingerprint, [&](cudaStream_t stream) {
      ncclComm_t comm = core_->comm;
      if (tensors.size() == 1) {
        const Tensor& t = tensors[0];
        return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                             nccl_op(op, core_->size), comm, stream);
      }
      ncclResult_t first_error = ncclGroupStart();
      if (first_error != ncclSuccess) return first_error;
      for (const Tensor& t : tensors) {
        ncclResult_t status = ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                            nccl_type(t.dtype()), nccl_op(op, core_->size), comm, stream);
        if (status != ncclSuccess && status != ncclInProgress && first_error == ncclSuccess) first_error = status;
      }
      ncclResult_t end = ncclGroupEnd();  // always closes the group, also after an error
      return first_error != ncclSuccess ? first_error : end;
    });
  }

  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root, const std::string& label) override {
    check_tensor(tensor, device(), kBackend, "broadcast", "tensor");
    check_root(root, core_->size, kBackend);
    auto w = new_state("broadcast", tensor.nbytes(), {tensor});
    auto fingerprint = Fingerprint::make("broadcast", tensor.numel(), tensor.dtype(), std::nullopt, root, label);
    if (completes_alone()) return complete_alone("broadcast", tensor.nbytes(), fingerprint);
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->launch(w, fingerprint, [&](cudaStream_t stream) {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                           nccl_type(tensor.dtype()), root, core_->comm, stream);
    });
  }

  std::shared_ptr<Work> all_gather(const Tensor& output, const Tensor& input, const std::string& label) override {
    const char* name = "all_gather";
    const bool in_place = check_all_gather(output, input, core_->rank, core_->size, device(), kBackend);
    auto fingerprint = Fingerprint::make(name, input.numel(), input.dtype(), std::nullopt, -1, label);
    if (completes_alone()) {
      if (!in_place) kernels::copy_(output, input);  // on the caller's stream, where the result is awaited
      return complete_alone(name, output.nbytes(), fingerprint);
    }
    auto w = new_state(name, output.nbytes(), {output, input});  // NCCL does in place itself
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->launch(w, fingerprint, [&](cudaStream_t stream) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                           nccl_type(input.dtype()), core_->comm, stream);
    });
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op,
                                       const std::string& label) override {
    const char* name = "reduce_scatter";
    const bool in_place = check_reduce_scatter(output, input, op, core_->rank, core_->size, device(), kBackend);
    auto fingerprint = Fingerprint::make(name, output.numel(), input.dtype(), op, -1, label);
    if (completes_alone()) {
      if (!in_place) kernels::copy_(output, input);  // on the caller's stream, where the result is awaited
      return complete_alone(name, input.nbytes(), fingerprint);
    }
    auto w = new_state(name, input.nbytes(), {output, input});
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->launch(w, fingerprint, [&](cudaStream_t stream) {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                               nccl_type(input.dtype()), nccl_op(op, core_->size), core_->comm, stream);
    });
  }

  std::shared_ptr<Work> all_gather_v(const Tensor& whole, const Tensor& part, const std::vector<int64_t>& counts,
                                     const std::string& label) override {
    const char* name = "all_gather_v";
    const bool in_place = check_blocks(whole, part, counts, core_->rank, core_->size, device(), kBackend, name);
    auto fingerprint = Fingerprint::make(name, whole.numel(), whole.dtype(), std::nullopt, -1, label);
    if (completes_alone()) {
      if (!in_place && part.numel() > 0) kernels::copy_(whole, part);  // on the caller's stream
      return complete_alone(name, whole.nbytes(), fingerprint);
    }
    auto w = new_state(name, whole.nbytes(), {whole, part});
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->launch(w, fingerprint, [&](cudaStream_t stream) {
      // Rank r's block is a broadcast rooted at r: its `part` goes into that block everywhere.
      return each_block(counts, whole, [&](int root, void* block, size_t count) {
        const void* send = root == core_->rank ? part.data_ptr() : block;
        return ncclBroadcast(send, block, count, nccl_type(whole.dtype()), root, core_->comm, stream);
      });
    });
  }

  std::shared_ptr<Work> reduce_scatter_v(const Tensor& part, const Tensor& whole, const std::vector<int64_t>& counts,
                                         ReduceOp op, const std::string& label) override {
    const char* name = "reduce_scatter_v";
    check_reducible(whole.dtype(), op, kBackend, name);
    const bool in_place = check_blocks(whole, part, counts, core_->rank, core_->size, device(), kBackend, name);
    auto fingerprint = Fingerprint::make(name, whole.numel(), whole.dtype(), op, -1, label);
    if (completes_alone()) {
      if (!in_place && part.numel() > 0) kernels::copy_(part, whole);  // on the caller's stream
      return complete_alone(name, whole.nbytes(), fingerprint);
    }
    auto w = new_state(name, whole.nbytes(), {whole, part});
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->launch(w, fingerprint, [&](cudaStream_t stream) {
      // Rank r's block is a reduce rooted at r, into its `part`.
      return each_block(counts, whole, [&](int root, void* block, size_t count) {
        void* recv = root == core_->rank ? part.data_ptr() : block;  // read on the root only
        return ncclReduce(block, recv, count, nccl_type(whole.dtype()), nccl_op(op, core_->size), root, core_->comm,
                          stream);
      });
    });
  }

  void barrier() override {
    std::shared_ptr<NcclWork> w = new_state("barrier", barrier_tensor_.nbytes(), {barrier_tensor_});
    std::shared_ptr<Work> work;
    {
      std::lock_guard<std::mutex> lock(core_->mutex);
      work = core_->launch(w, Fingerprint::make("barrier", 0, std::nullopt, std::nullopt, -1, "barrier"),
                           [&](cudaStream_t stream) {
        return ncclAllReduce(barrier_tensor_.data_ptr(), barrier_tensor_.data_ptr(), 1, ncclFloat32, ncclSum,
                             core_->comm, stream);
      });
    }
    work->synchronize();
  }

  // The rolling hash is the host's: the check is a host all-gather over MPI, never a GPU sync.
  void check_in_sync(const std::string& where) override {
    std::lock_guard<std::mutex> lock(core_->mutex);
    core_->check_in_sync(where, [&](const void* mine, size_t bytes) {
      return host_all_gather(mine, bytes, core_->timeout);
    });
  }


  // Never throws.
  void shutdown() {
    if (!core_->stop_watchdog()) return;
    std::unique_lock<std::mutex> lock(core_->mutex);
    if (core_->comm != nullptr) {
      double limit = std::min(core_->timeout, 10.0);
      bool drained = core_->drain(limit, lock);
      std::optional<cuda::DeviceGuard> guard;
      try {
        guard.emplace(core_->device);
      } catch (const std::exception&) {
        // finalize on whatever device is current
      }
      bool finalized = false;
      if (drained) {
        const int rank = core_->rank;
        StuckCallWatch watch([rank] { return ::tandem::detail::concat("rank ", rank, ": finalizing the NCCL communicator"); },
                             kStuckCallHint, limit);
        ncclResult_t status = ncclCommFinalize(core_->comm);
        if (status == ncclInProgress) status = core_->await_comm(Clock::now(), limit);
        finalized = status == ncclSuccess;
      }
      if (core_->peer != nullptr) {
        core_->peer->abort();  // a kernel still waiting (not drained) gives up
        if (drained) core_->peer.reset();  // this rank's kernels are done: its mappings of the others' go
      }
      core_->last_peer.reset();
      if (finalized) {
        ncclCommDestroy(core_->comm);
      } else {
        report_failure(::tandem::detail::concat("rank ", core_->rank,
                                                ": dist::finalize: nccl collectives still pending; aborting the "
                                                "communicator"));
        ncclCommAbort(core_->comm);
      }
      core_->comm = nullptr;
    }
    core_->shut_down = true;
  }

 private:
  Device device() const { return Device(DeviceType::cuda, core_->device); }
  // A world of one launches nothing, unless asked to (nccl_launch_alone): NCCL then copies what an
  // out-of-place collective needs itself.
  bool completes_alone() const { return core_->size == 1 && !core_->launch_alone; }

  std::shared_ptr<NcclCore> core_;
  Tensor barrier_tensor_;  // (1,) f32
};

}  // namespace

bool nccl_is_built() { return true; }

std::shared_ptr<ProcessGroup> make_nccl_group(ProcessGroup& cpu_group, int device, const NcclSettings& settings) {
  int rank = cpu_group.rank(), size = cpu_group.size();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  Tensor id_bytes = zeros({static_cast<int64_t>(sizeof(id))}, DType::u8);  // travels over MPI
  if (rank == 0) {
    TANDEM_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  }
  cpu_group.broadcast(id_bytes, 0)->wait();
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));

  cuda::DeviceGuard guard(device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = settings.nonblocking ? 0 : 1;  // see the top of the file
  ncclComm_t comm = nullptr;
  auto start = Clock::now();
  // Creating a communicator can take seconds on a busy machine (it sets up every link): it gets
  // at least a minute, whatever short timeout the collectives have.
  const double init_timeout = std::max(settings.timeout_seconds, 60.0);
  {
    StuckCallWatch watch(
        [rank, size, device] {
          return ::tandem::detail::concat("rank ", rank, ": creating the NCCL communicator of ", size, " ranks on cuda:",
                                          device);
        },
        kStuckCallHint, init_timeout);
    TANDEM_NCCL_CHECK_ASYNC(ncclCommInitRankConfig(&comm, size, id, rank, &config));
  }
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress && seconds_since(start) <= init_timeout) {
    ncclResult_t status = ncclCommGetAsyncError(comm, &state);
    if (status != ncclSuccess) state = status;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (state != ncclSuccess) {
    std::string text = state == ncclInProgress ? "timed out after " + format_seconds(seconds_since(start))
                                               : nccl_text(state, comm);
    ncclCommAbort(comm);
    TANDEM_THROW(BackendError, "rank ", rank, ": creating the NCCL communicator of ", size, " ranks on cuda:", device,
                 " failed: ", text);
  }

  auto core = std::make_shared<NcclCore>();
  core->comm = comm;
  core->rank = rank;
  core->size = size;
  core->device = device;
  core->timeout = settings.timeout_seconds;
  core->launch_alone = settings.launch_alone;
  core->nonblocking = settings.nonblocking;
  core->time_all = settings.time_collectives;
  core->location = ::tandem::detail::concat(" on cuda:", device);
  core->stream = cuda::collective_stream(device, settings.high_priority_stream);
  core->ready = std::make_unique<cuda::Event>(/*timing=*/false);
  std::string why_not;
  core->peer = PeerAllReduce::create(rank, size, settings.one_node, device, settings.peer_all_reduce_max_bytes,
                                     settings.timeout_seconds, &why_not);
  if (core->peer == nullptr && settings.report_peer_path && rank == 0) {
    report_failure("dist::init: small all-reduces go to NCCL, not tandem's peer kernel: " + why_not);
  }
  return std::make_shared<NcclGroup>(core);
}

void nccl_shutdown_group(ProcessGroup& group) {
  if (auto* g = dynamic_cast<NcclGroup*>(&group)) g->shutdown();
}

}  // namespace tandem::dist::internal
