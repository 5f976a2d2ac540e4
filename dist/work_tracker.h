#pragma once
// Internal to dist/: the collectives a process group has in flight and the watchdog thread that
// completes them, fails the group when one fails or runs past the timeout, and words the error.
// Shared by the MPI and NCCL groups; a backend says only how to test one collective for completion
// (poll) and what to do once the group failed (abort_backend).
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tandem/dist/fingerprint.h"
#include "tandem/dist/flight_recorder.h"
#include "tandem/dist/internal.h"

namespace tandem::dist::internal {

// One collective. A backend derives from it to add its handles (MPI requests, CUDA events).
struct TrackedWork {
  virtual ~TrackedWork() = default;
  const char* op = "";
  size_t bytes = 0;
  Fingerprint fingerprint;      // seq 0 until stamped
  std::vector<Tensor> tensors;  // alive until the collective completed
  Clock::time_point started = Clock::now();
  double elapsed_ms = -1;
  // Without a time of its own by completion, it gets the host's from launch until completion was
  // seen (MPI); a GPU collective without timing events keeps -1 (that span says nothing of it).
  bool timed_on_host = true;
  bool done = false;    // completed, or finished in error; forgotten by the next sweep
  bool failed = false;  // waiting on it raises `error`
  // Part of a CUDA graph being captured: never tracked nor stamped (the capture runs nothing); its
  // waits are edges of the graph. Each replay issues it again as a TrackedWork of its own.
  bool captured = false;
  int64_t replay = 0;  // which replay of a CUDA graph ran it (1, 2, ...); 0: issued eagerly
  std::string error;
};

// Writes the flight recorder of every group alive (best effort, without their locks: for a process
// about to end, as on SIGTERM).
void dump_every_flight_recorder(const std::string& reason);

// Every member and method needs `mutex` held, except start_watchdog/stop_watchdog.
class WorkTracker {
 public:
  WorkTracker(std::string backend, std::mutex& mutex) : backend(std::move(backend)), mutex(mutex) {}
  virtual ~WorkTracker() = default;
  WorkTracker(const WorkTracker&) = delete;
  WorkTracker& operator=(const WorkTracker&) = delete;

  const std::string backend;  // "mpi", "nccl"
  std::mutex& mutex;
  int rank = 0, size = 1;
  double timeout = 600;
  std::string location;  // where the collectives run, for timeout messages: "" or " on cuda:0"
  std::vector<std::shared_ptr<TrackedWork>> pending;  // posted and not completed, failed ones too
  std::string failure;                                // the group is unusable once set
  bool shut_down = false;
  bool stop = false;
  // $TANDEM_DIST_DEBUG: "detail" compares every collective's fingerprint across ranks before it is
  // launched (the call itself raises on a mismatch); "off" leaves only check_in_sync (the MPI group
  // then posts its collectives without exchanging their fingerprints first); unset: the default.
  enum class DebugMode { off, standard, detail };
  const DebugMode debug = debug_mode();
  const bool detail = debug == DebugMode::detail;
  Clock::time_point last_launch_sweep;   // sweep_at_launch's
  uint64_t last_seq = 0;                 // of the last stamped collective
  uint64_t rolling_hash = kInitialHash;  // over every stamped fingerprint
  uint64_t last_checked_seq = 0;         // every rank agreed up to here at the last check
  FlightRecorder recorder{recorder_capacity()};

  // "rank 0: mpi all_reduce of 4096 bytes"; with a fingerprint, " (#12 'ddp bucket 0 of step 5')" after it,
  // and " in replay 3 of a CUDA graph" for a collective a replay issued.
  std::string describe(const char* op, size_t bytes) const;
  std::string describe(const TrackedWork& w) const;
  // Gives `w` the next sequence number and this fingerprint, rolls the hash, records it as queued.
  void stamp(TrackedWork& w, Fingerprint fingerprint);
  void mark_started(const TrackedWork& w) { recorder.set_state(w.fingerprint.seq, RecordState::started); }
  // The cheap cross-rank check: one all-gather (through `gather`) of each rank's sequence number and
  // rolling hash. On a mismatch a second one brings the fingerprints issued since the last check,
  // and the group fails on every rank with the first collective that differs ("rank 1 issued
  // all_reduce #57 'metrics' (1 f32 element, 4 B, sum) where rank 0 issued ..."), raised as a BackendError.
  using HostAllGather = std::function<std::vector<uint8_t>(const void* mine, size_t bytes)>;
  void check_in_sync(const std::string& where, const HostAllGather& gather);
  // Detail mode: compares `w`'s fingerprint across ranks (through `gather`) before it is launched.
  void check_before_launch(const TrackedWork& w, const HostAllGather& gather);
  // "rank 0: mpi ranks issued different collectives: rank 1 issued ... where rank 0 issued ..."
  // `where`: the check that found it ("" for the check before a launch).
  std::string mismatch_message(const std::vector<Fingerprint>& per_rank, const std::string& where = "") const;
  // The fingerprints of one collective from every rank disagree: fails the group and raises.
  [[noreturn]] void fail_mismatch(const std::vector<Fingerprint>& per_rank, const TrackedWork* w,
                                  const std::string& where = "");
  // The flight recorder's JSON file, when a dump directory is set; says where on stderr.
  void dump(const std::string& reason) const;

  static DebugMode debug_mode();
  static size_t recorder_capacity();
  // Raises when the group was shut down or failed.
  void check_usable(const char* op, size_t bytes) const;
  [[noreturn]] void raise(const TrackedWork& w) const;

  // Tracks a collective that was just posted, and wakes the watchdog unless it polls while idle.
  void track(const std::shared_ptr<TrackedWork>& w);
  // Marks the group failed with `message` (the culprit's own error; the others say they were
  // pending), reports it once on stderr, and aborts the backend. Later failures are ignored.
  void fail(const std::string& message, const TrackedWork* culprit);
  // Completes `w`: its time, its tensors released, the backend's `finish` already done.
  void complete(TrackedWork& w);
  // Completes every pending collective that has finished and forgets it. Those without a completion
  // order are polled one by one. Of those with one, each order's newest finished collective is
  // found by a search from the newest back (newest_finished), and it completes all earlier ones of its
  // order unpolled: a CUDA event query costs about 1.3 us of host time (one H200, 2026-11-28), and
  // a query per collective was a third of tandem's host time per all-reduce.
  void sweep();
  // What a launch does, so that a collective's tensors go back soon after it ended (not only at the
  // watchdog's next round, up to 100 ms later): a sweep, at most once a millisecond.
  void sweep_at_launch();
  // Fails the group when a collective has run past the timeout.
  void check_timeouts();
  // The host waits for `w` (polling, back to back at first and then with short sleeps, `lock`
  // released meanwhile); raises on failure.
  void wait_for(TrackedWork& w, std::unique_lock<std::mutex>& lock);
  // Sweeps until nothing is pending or `limit` seconds passed; true when nothing is pending.
  bool drain(double limit, std::unique_lock<std::mutex>& lock);

  // The watchdog thread: a round (watchdog_round) every poll_interval while work is pending (and
  // while idle too where the backend polls while idle).
  void start_watchdog();
  // Stops and joins it; false when it was stopped already (by an earlier shutdown).
  bool stop_watchdog();

  // Backend: test `w` for completion without blocking; call complete(w) once it is, fail() on an error.
  virtual void poll(TrackedWork& w) = 0;
  // Backend: collectives that finish in launch order share a key (NCCL: the CUDA stream their end is
  // recorded on); null where no order is known (MPI). Once one has finished, so has every earlier
  // one with its key.
  virtual const void* completion_order(const TrackedWork&) const { return nullptr; }
  // Backend: completes `w`, which has finished because a later collective of its order has, without
  // testing it.
  virtual void complete_in_order(TrackedWork& w) { poll(w); }

 protected:
  // Backend: after fail(): stop whatever could hang (NCCL aborts its communicator).
  virtual void abort_backend() {}
  // Backend: one watchdog round; the default sweeps and checks the timeouts.
  virtual void watchdog_round();
  virtual std::chrono::microseconds poll_interval() const = 0;
  // Backend: true makes the watchdog poll every poll_interval also while nothing is pending, so
  // that track() need not wake it. Waking it per collective costs the launching thread a system
  // call, and the woken watchdog then takes the group's lock while the launcher wants it.
  virtual bool polls_while_idle() const { return false; }

 private:
  void watch();
  // Of the pending collectives at `in_order` (indices in launch order, one completion order, none
  // done), the position of the newest that has finished, or -1; polls about 2 log2(k) + 1 of them,
  // k being how many of the newest have not finished.
  std::ptrdiff_t newest_finished(const std::vector<size_t>& in_order);
  std::condition_variable wake_;
  std::thread watchdog_;
};

// What both process groups answer from their tracker alone.
class TrackedGroup : public ProcessGroup {
 public:
  explicit TrackedGroup(std::shared_ptr<WorkTracker> tracker) : tracker_(std::move(tracker)) {}
  int rank() const override { return tracker_->rank; }
  int size() const override { return tracker_->size; }
  std::string backend() const override { return tracker_->backend; }
  using ProcessGroup::all_reduce;
  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op, const std::string& label) override {
    return all_reduce(std::vector<Tensor>{tensor}, op, label);
  }
  uint64_t collectives_issued() const override;
  void abort(const std::string& reason) override;

 protected:
  // A group of one, where a collective's result is its input (the caller has made the one copy an
  // out-of-place collective needs): nothing is launched, yet it counts as any collective (sequence
  // number, fingerprint, flight recorder), so the cross-rank checks see the same sequence, and its
  // Work is complete at once.
  std::shared_ptr<Work> complete_alone(const char* op, size_t bytes, const Fingerprint& fingerprint);

  std::shared_ptr<WorkTracker> tracker_;
};

// The Work handle of a tracked collective: the host-side waits, shared by both backends. A backend
// whose wait() need not block the host (NCCL: the caller's stream waits) overrides it.
class TrackedWorkHandle : public Work {
 public:
  TrackedWorkHandle(std::shared_ptr<WorkTracker> tracker, std::shared_ptr<TrackedWork> state)
      : tracker_(std::move(tracker)), state_(std::move(state)) {}
  void wait() override { synchronize(); }
  void synchronize() override;
  bool is_completed() override;
  double elapsed_ms() override;

 protected:
  std::shared_ptr<WorkTracker> tracker_;
  std::shared_ptr<TrackedWork> state_;
};

}  // namespace tandem::dist::internal
