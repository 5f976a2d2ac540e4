#include "tandem/dist/stuck_call.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/dist/internal.h"
#include "tandem/dist/work_tracker.h"

namespace tandem::dist::internal {

namespace {

struct Call {
  std::function<std::string()> what;
  const char* hint = "";
  Clock::time_point started;
  double limit = 0;
};

// The watched calls one thread is inside, innermost last. Its own lock, which only the monitor's
// look contends for: a collective's launch enters and leaves a watch, and a lock shared by every
// thread plus a map node per call cost it some 0.3 us (2 H200s, 2026-11-28).
struct ThreadCalls {
  std::mutex mutex;
  std::vector<Call> calls;  // keeps its capacity: entering allocates nothing after the first time
};

// One thread for the process, started by the first watch and never stopped. Entering and leaving
// a call only takes the calling thread's lock (no wake-up: the calls watched are mostly over in
// microseconds); the monitor looks every quarter second, or every quarter of the shortest limit
// ever watched.
class Monitor {
 public:
  static Monitor& instance() {
    static auto* monitor = new Monitor();  // never destroyed: a watch may end during exit
    return *monitor;
  }

  void add(ThreadCalls* calls) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    threads_.push_back(calls);
  }

  void remove(ThreadCalls* calls) {
    std::lock_guard<std::mutex> lock(mutex_);
    threads_.erase(std::remove(threads_.begin(), threads_.end(), calls), threads_.end());
  }

  void shorten_interval(double limit) {
    const double wanted = std::max(limit / 4, 1e-3);
    double now = interval_.load(std::memory_order_relaxed);
    while (wanted < now && !interval_.compare_exchange_weak(now, wanted)) {
    }
  }

 private:
  Monitor() = default;

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait_for(lock, std::chrono::duration<double>(interval_.load()));
      for (ThreadCalls* thread : threads_) {
        std::lock_guard<std::mutex> calls_lock(thread->mutex);
        for (const Call& call : thread->calls) {
          if (seconds_since(call.started) > call.limit) stuck(call);
        }
      }
    }
  }

  [[noreturn]] static void stuck(const Call& call) {
    const std::string message =
        ::tandem::detail::concat(call.what(), ": the call did not return within ", format_seconds(call.limit),
                                 " (it waits inside NCCL, where it cannot be aborted): ", call.hint,
                                 "; this rank exits");
    report_failure(message);
    dump_every_flight_recorder(message);
    std::_Exit(1);
  }

  std::mutex mutex_;  // guards threads_ and the monitor's look
  std::condition_variable wake_;
  std::vector<ThreadCalls*> threads_;   // every thread that has entered a watch and not ended
  std::atomic<double> interval_{0.25};  // seconds between looks
  std::thread thread_;
};

// This thread's calls, known to the monitor from its first watch until the thread ends.
class RegisteredCalls {
 public:
  RegisteredCalls() { Monitor::instance().add(&calls); }
  ~RegisteredCalls() { Monitor::instance().remove(&calls); }
  ThreadCalls calls;
};

ThreadCalls& this_thread_calls() {
  thread_local RegisteredCalls registered;
  return registered.calls;
}

}  // namespace

StuckCallWatch::StuckCallWatch(std::function<std::string()> what, const char* hint, double limit_seconds) {
  Monitor::instance().shorten_interval(limit_seconds);
  ThreadCalls& calls = this_thread_calls();
  std::lock_guard<std::mutex> lock(calls.mutex);
  calls.calls.push_back({std::move(what), hint, Clock::now(), limit_seconds});
}

StuckCallWatch::~StuckCallWatch() {
  ThreadCalls& calls = this_thread_calls();
  std::lock_guard<std::mutex> lock(calls.mutex);
  calls.calls.pop_back();
}

}  // namespace tandem::dist::internal
