#include "tandem/dist/stuck_call.h"

#include <pthread.h>

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

  // The calling thread's calls (made at its first watch).
  ThreadCalls& this_thread_calls() {
    if (this_thread_ == nullptr) {
      this_thread_ = new ThreadCalls();
      std::lock_guard<std::mutex> lock(mutex_);
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      threads_.push_back(this_thread_);
      pthread_setspecific(thread_end_, this_thread_);
    }
    return *this_thread_;
  }

  void shorten_interval(double limit) {
    const double wanted = std::max(limit / 4, 1e-3);
    double now = interval_.load(std::memory_order_relaxed);
    while (wanted < now && !interval_.compare_exchange_weak(now, wanted)) {
    }
  }

 private:
  // A thread's calls are forgotten when it ends, by a pthread key's destructor: unlike a
  // thread_local object's destructor, it does not run when the main thread calls exit(), whose
  // atexit handlers (dist::finalize) still make watches.
  Monitor() {
    pthread_key_create(&thread_end_, [](void* calls) { instance().forget(static_cast<ThreadCalls*>(calls)); });
  }

  void forget(ThreadCalls* calls) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      threads_.erase(std::remove(threads_.begin(), threads_.end(), calls), threads_.end());
    }
    delete calls;
    this_thread_ = nullptr;  // a watch made later on this thread (by a later destructor) starts anew
  }

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
  pthread_key_t thread_end_;
  static thread_local ThreadCalls* this_thread_;  // trivially destructible: still there during exit()
};

thread_local ThreadCalls* Monitor::this_thread_ = nullptr;

}  // namespace

StuckCallWatch::StuckCallWatch(std::function<std::string()> what, const char* hint, double limit_seconds) {
  Monitor& monitor = Monitor::instance();
  monitor.shorten_interval(limit_seconds);
  ThreadCalls& calls = monitor.this_thread_calls();
  std::lock_guard<std::mutex> lock(calls.mutex);
  calls.calls.push_back({std::move(what), hint, Clock::now(), limit_seconds});
}

StuckCallWatch::~StuckCallWatch() {
  ThreadCalls& calls = Monitor::instance().this_thread_calls();
  std::lock_guard<std::mutex> lock(calls.mutex);
  calls.calls.pop_back();
}

}  // namespace tandem::dist::internal
