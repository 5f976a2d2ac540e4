#include "tandem/dist/work_tracker.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "tandem/core/cuda_graph.h"
#include "tandem/core/error.h"

namespace tandem::dist::internal {

namespace {

// The groups alive, for the SIGTERM/SIGINT handler that writes their flight recorders.
std::mutex& registry_mutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::vector<const WorkTracker*>& registry() {
  static auto* r = new std::vector<const WorkTracker*>();  // never destroyed: read by the signal handler
  return *r;
}

// Best effort: a signal can arrive while a group is being changed, and writing a file is not
// async-signal-safe; a dump that may be torn is worth more than none when a job is killed.
void dump_on_signal(int signal) {
  for (const WorkTracker* t : registry()) t->dump(signal == SIGTERM ? "SIGTERM" : "SIGINT");
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

void install_signal_dump() {
  static bool installed = false;
  if (installed || dump_directory().empty()) return;
  installed = true;
  for (int sig : {SIGTERM, SIGINT}) {
    // A handler the program installed itself stays.
    auto previous = std::signal(sig, dump_on_signal);
    if (previous != SIG_DFL && previous != SIG_ERR) std::signal(sig, previous);
  }
}

// Every host-side check exchanges this many bytes, so that ranks at different checks never post
// all-gathers of different sizes (which MPI cannot survive).
struct CheckMessage {
  uint64_t seq = 0;
  uint64_t hash = 0;
  Fingerprint fingerprint;  // detail mode: the collective about to be launched
};
constexpr size_t kHistory = 16;  // fingerprints exchanged after a mismatch

template <typename T>
std::vector<T> unpack(const std::vector<uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

}  // namespace

void dump_every_flight_recorder(const std::string& reason) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (const WorkTracker* t : registry()) t->dump(reason);
}

WorkTracker::DebugMode WorkTracker::debug_mode() {
  const char* v = std::getenv("TANDEM_DIST_DEBUG");
  if (v == nullptr || v[0] == '\0') return DebugMode::standard;
  if (std::strcmp(v, "detail") == 0) return DebugMode::detail;
  if (std::strcmp(v, "off") == 0) return DebugMode::off;
  TANDEM_CHECK_AS(ValueError, std::strcmp(v, "standard") == 0, "$TANDEM_DIST_DEBUG is '", v,
                  "'; expected off, standard or detail");
  return DebugMode::standard;
}

size_t WorkTracker::recorder_capacity() {
  const char* v = std::getenv("TANDEM_DIST_RECORDER_SIZE");
  long n = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
  return n > 0 ? static_cast<size_t>(n) : 256;
}

std::string WorkTracker::describe(const char* op, size_t bytes) const {
  return internal::describe(rank, backend, op, bytes);
}

std::string WorkTracker::describe(const TrackedWork& w) const {
  std::string text = describe(w.op, w.bytes);
  const bool labelled = w.fingerprint.label[0] != '\0';
  if (w.fingerprint.seq == 0) {  // not stamped: being captured into a CUDA graph, or not yet issued
    return labelled ? ::tandem::detail::concat(text, " ('", w.fingerprint.label, "')") : text;
  }
  text += ::tandem::detail::concat(" (#", w.fingerprint.seq);
  if (labelled) text += ::tandem::detail::concat(" '", w.fingerprint.label, "'");
  text += ")";
  if (w.replay > 0) text += ::tandem::detail::concat(" in replay ", w.replay, " of a CUDA graph");
  return text;
}

void WorkTracker::stamp(TrackedWork& w, Fingerprint fingerprint) {
  fingerprint.seq = ++last_seq;
  rolling_hash = roll_hash(rolling_hash, fingerprint);
  recorder.queued(fingerprint);
  w.fingerprint = fingerprint;
}

void WorkTracker::dump(const std::string& reason) const {
  std::string path = recorder.dump(rank, size, backend, reason);
  if (!path.empty()) report_failure(::tandem::detail::concat("rank ", rank, ": flight recorder written to ", path));
}

std::string WorkTracker::mismatch_message(const std::vector<Fingerprint>& per_rank, const std::string& where) const {
  return ::tandem::detail::concat("rank ", rank, ": ", backend, " ranks issued different collectives",
                                  where.empty() ? "" : " before " + where, ": ", mismatch_text(per_rank),
                                  " (every rank must issue the same collectives in the same order)");
}

void WorkTracker::fail_mismatch(const std::vector<Fingerprint>& per_rank, const TrackedWork* w,
                                const std::string& where) {
  std::string message = mismatch_message(per_rank, where);
  fail(message, w);
  TANDEM_THROW(BackendError, message);
}

void WorkTracker::check_before_launch(const TrackedWork& w, const HostAllGather& gather) {
  CheckMessage mine;
  mine.seq = w.fingerprint.seq;
  mine.fingerprint = w.fingerprint;
  std::vector<CheckMessage> all = unpack<CheckMessage>(gather(&mine, sizeof(mine)));
  std::vector<Fingerprint> per_rank;
  for (const CheckMessage& m : all) per_rank.push_back(m.fingerprint);
  for (const Fingerprint& f : per_rank) {
    if (!f.matches(per_rank[0])) fail_mismatch(per_rank, &w);
  }
}

void WorkTracker::check_in_sync(const std::string& where, const HostAllGather& gather) {
  check_usable("check", sizeof(CheckMessage));
  CheckMessage mine;
  mine.seq = last_seq;
  mine.hash = rolling_hash;
  std::vector<CheckMessage> all = unpack<CheckMessage>(gather(&mine, sizeof(mine)));
  bool agree = true;
  for (const CheckMessage& m : all) agree = agree && m.seq == all[0].seq && m.hash == all[0].hash;
  if (agree) {
    last_checked_seq = last_seq;
    return;
  }
  // Which collective differs first: every rank sends what it issued since the last check.
  std::vector<Fingerprint> history(kHistory);  // (kHistory,) empty past this rank's last one
  std::vector<Fingerprint> recorded = recorder.fingerprints(last_checked_seq + 1, last_checked_seq + kHistory);
  std::copy(recorded.begin(), recorded.end(), history.begin());
  std::vector<Fingerprint> everyone =
      unpack<Fingerprint>(gather(history.data(), history.size() * sizeof(Fingerprint)));  // (size * kHistory,)
  for (size_t i = 0; i < kHistory; ++i) {
    std::vector<Fingerprint> per_rank;
    for (int r = 0; r < size; ++r) per_rank.push_back(everyone[r * kHistory + i]);
    for (int r = 0; r < size; ++r) {
      if (!per_rank[r].matches(per_rank[0])) {
        for (int q = 0; q < size; ++q) per_rank[q].seq = last_checked_seq + 1 + i;
        fail_mismatch(per_rank, nullptr, where);
      }
    }
  }
  std::string counts;
  for (int r = 0; r < size; ++r) counts += ::tandem::detail::concat(r == 0 ? "" : ", ", "rank ", r, ": ", all[r].seq);
  std::string message = ::tandem::detail::concat(
      "rank ", rank, ": ", backend, " ranks issued different collectives before ", where, " (collectives issued: ",
      counts, "); the first difference is more than ", kHistory, " collectives after #", last_checked_seq);
  fail(message, nullptr);
  TANDEM_THROW(BackendError, message);
}

void WorkTracker::check_usable(const char* op, size_t bytes) const {
  if (shut_down || stop) {
    TANDEM_THROW(BackendError, describe(op, bytes), ": the group was shut down (dist::finalize ran)");
  }
  if (!failure.empty()) {
    TANDEM_THROW(BackendError, describe(op, bytes), " refused: the group failed earlier: ", failure);
  }
}

void WorkTracker::raise(const TrackedWork& w) const { TANDEM_THROW(BackendError, w.error); }

void WorkTracker::track(const std::shared_ptr<TrackedWork>& w) {
  pending.push_back(w);
  if (!polls_while_idle()) wake_.notify_one();
}

void WorkTracker::fail(const std::string& message, const TrackedWork* culprit) {
  if (!failure.empty()) return;
  failure = message;
  report_failure(message);
  if (culprit != nullptr) recorder.set_state(culprit->fingerprint.seq, RecordState::failed);
  dump(message);
  for (auto& w : pending) {
    if (w->done || w->failed) continue;
    w->failed = true;
    w->error = w.get() == culprit ? message
                                  : ::tandem::detail::concat(describe(*w), " was pending for ",
                                                             format_seconds(seconds_since(w->started)),
                                                             " when the group failed: ", message);
  }
  abort_backend();
}

void WorkTracker::complete(TrackedWork& w) {
  if (w.elapsed_ms < 0 && w.timed_on_host) w.elapsed_ms = seconds_since(w.started) * 1e3;
  recorder.set_state(w.fingerprint.seq, w.failed ? RecordState::failed : RecordState::completed);
  w.tensors.clear();
  w.done = true;
}

std::ptrdiff_t WorkTracker::newest_finished(const std::vector<size_t>& in_order) {
  auto finished = [&](std::ptrdiff_t i) {
    TrackedWork& w = *pending[in_order[static_cast<size_t>(i)]];
    poll(w);
    return w.done && !w.failed;  // a failed test says nothing of the ones before it
  };
  // Finished at `lo` (or none, -1), unfinished from `hi`. Mostly all have finished but the newest
  // one or two (a sweep at a launch, with the previous launches still running or just done): the
  // newest is tested first, then steps back from it that double (1, 2, 4, ...) until one has
  // finished, then the halving between; 2 to 4 tests there, where halving alone took log2(n) + 1.
  std::ptrdiff_t lo = -1, hi = static_cast<std::ptrdiff_t>(in_order.size()) - 1;
  if (finished(hi)) return hi;
  for (std::ptrdiff_t step = 1; hi - step > lo; step *= 2) {
    const std::ptrdiff_t at = hi - step;
    if (finished(at)) {
      lo = at;
      break;
    }
    hi = at;
  }
  while (hi - lo > 1) {
    const std::ptrdiff_t mid = lo + (hi - lo) / 2;
    if (finished(mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

void WorkTracker::sweep() {
  std::vector<std::pair<const void*, std::vector<size_t>>> orders;  // each order's pending, in launch order
  for (size_t i = 0; i < pending.size(); ++i) {
    TrackedWork& w = *pending[i];
    if (w.done) continue;
    const void* order = completion_order(w);
    if (order == nullptr) {
      poll(w);
      continue;
    }
    auto it = std::find_if(orders.begin(), orders.end(), [&](const auto& o) { return o.first == order; });
    if (it == orders.end()) it = orders.insert(orders.end(), {order, {}});
    it->second.push_back(i);
  }
  for (const auto& [order, in_order] : orders) {
    const std::ptrdiff_t newest = newest_finished(in_order);
    for (std::ptrdiff_t k = 0; k < newest; ++k) {
      TrackedWork& w = *pending[in_order[static_cast<size_t>(k)]];
      if (!w.done) complete_in_order(w);
    }
  }
  pending.erase(std::remove_if(pending.begin(), pending.end(), [](const auto& w) { return w->done; }), pending.end());
}

void WorkTracker::sweep_at_launch() {
  constexpr std::chrono::microseconds kInterval(1000);
  const Clock::time_point now = Clock::now();
  if (now - last_launch_sweep < kInterval) return;
  last_launch_sweep = now;
  sweep();
}

void WorkTracker::check_timeouts() {
  if (!failure.empty()) return;
  for (auto& w : pending) {
    if (w->done || w->failed) continue;
    double waited = seconds_since(w->started);
    if (waited > timeout) {
      // A replay's collectives are watched together (dist/nccl_group.cpp): the oldest is named.
      const char* which = w->replay > 0 ? ", or a later collective of that replay," : "";
      fail(::tandem::detail::concat(describe(*w), location, which, " timed out after ", format_seconds(waited),
                                    " (timeout ", format_seconds(timeout),
                                    "): another rank probably died, hangs, or issued a different collective (every "
                                    "rank must issue the same collectives in the same order); the group is unusable "
                                    "now"),
           w.get());
      return;
    }
  }
}

void WorkTracker::wait_for(TrackedWork& w, std::unique_lock<std::mutex>& lock) {
  // Polls back to back for the first kSpin of the wait, then with sleeps growing to 200 us. Each
  // poll advances an MPI collective by a step (Open MPI moves non-blocking collectives only inside
  // its calls), and Linux's shortest sleep is some 60 us: with sleeps from the start a 1 MiB
  // all-reduce of two CPU ranks took 6 times as long as MPI_Allreduce. Between polls the thread
  // yields its core, so ranks that share cores (mpirun --oversubscribe) still run; MPI_Wait itself
  // polls so.
  constexpr std::chrono::milliseconds kSpin(10);
  const Clock::time_point start = Clock::now();
  int sleep_us = 0;
  for (;;) {
    if (!w.done) poll(w);
    if (w.failed) raise(w);
    if (w.done) return;
    check_timeouts();
    if (w.failed) raise(w);
    lock.unlock();
    if (Clock::now() - start < kSpin) {
      std::this_thread::yield();
    } else {
      sleep_us = std::min(std::max(2 * sleep_us, 5), 200);
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
    lock.lock();
  }
}

bool WorkTracker::drain(double limit, std::unique_lock<std::mutex>& lock) {
  auto start = Clock::now();
  for (;;) {
    sweep();
    if (pending.empty()) return true;
    if (seconds_since(start) > limit) return false;
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    lock.lock();
  }
}

void WorkTracker::watchdog_round() {
  sweep();
  check_timeouts();
}

void WorkTracker::watch() {
  std::unique_lock<std::mutex> lock(mutex);
  while (!stop) {
    if (pending.empty() && !polls_while_idle()) {
      wake_.wait(lock, [&] { return stop || !pending.empty(); });
    } else {
      // Polling is what moves MPI's non-blocking collectives along; slower once the group failed.
      auto interval = failure.empty() ? poll_interval() : std::chrono::microseconds(100000);
      wake_.wait_for(lock, interval, [&] { return stop; });
    }
    if (stop) break;
    try {
      watchdog_round();
    } catch (const std::exception& e) {
      report_failure(backend + " watchdog: " + e.what());
    }
  }
}

void WorkTracker::start_watchdog() {
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().push_back(this);
    install_signal_dump();
  }
  watchdog_ = std::thread([this] { watch(); });
}

bool WorkTracker::stop_watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stop || shut_down) return false;
    stop = true;
  }
  wake_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto& r = registry();
  r.erase(std::remove(r.begin(), r.end(), this), r.end());
  return true;
}

uint64_t TrackedGroup::collectives_issued() const {
  std::lock_guard<std::mutex> lock(tracker_->mutex);
  return tracker_->last_seq;
}

std::shared_ptr<Work> TrackedGroup::complete_alone(const char* op, size_t bytes, const Fingerprint& fingerprint) {
  auto w = std::make_shared<TrackedWork>();
  w->op = op;
  w->bytes = bytes;
  std::lock_guard<std::mutex> lock(tracker_->mutex);
  tracker_->check_usable(op, bytes);
  tracker_->stamp(*w, fingerprint);
  tracker_->mark_started(*w);
  w->elapsed_ms = 0;
  tracker_->complete(*w);
  return std::make_shared<TrackedWorkHandle>(tracker_, w);
}

void TrackedGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(tracker_->mutex);
  tracker_->fail(::tandem::detail::concat("rank ", tracker_->rank, ": the ", tracker_->backend,
                                          " group was aborted: ", reason),
                 nullptr);
}

void TrackedWorkHandle::synchronize() {
  if (state_->captured) {  // a node of a graph: after the capture, the replay's stream orders it
    cuda::check_not_capturing("waiting on the host for a collective (Work::synchronize)");
    return;
  }
  std::unique_lock<std::mutex> lock(tracker_->mutex);
  if (state_->done && !state_->failed) return;
  cuda::check_not_capturing("waiting on the host for a collective (Work::synchronize)");
  tracker_->wait_for(*state_, lock);
}

bool TrackedWorkHandle::is_completed() {
  if (state_->captured) return true;
  std::lock_guard<std::mutex> lock(tracker_->mutex);
  if (state_->done || state_->failed) return true;
  cuda::check_not_capturing("asking whether a collective completed (Work::is_completed)");
  tracker_->poll(*state_);
  return state_->done || state_->failed;
}

double TrackedWorkHandle::elapsed_ms() {
  if (state_->captured) return -1.0;  // a graph records no timings
  std::lock_guard<std::mutex> lock(tracker_->mutex);
  if (!state_->done && !state_->failed) tracker_->poll(*state_);
  return state_->done && !state_->failed ? state_->elapsed_ms : -1.0;
}

}  // namespace tandem::dist::internal
