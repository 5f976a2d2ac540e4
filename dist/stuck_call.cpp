#include "tandem/dist/stuck_call.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

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

// One thread for the process, started by the first watch and never stopped. Entering and leaving
// a call only takes the lock (no wake-up: the calls watched are mostly over in microseconds); the
// thread looks every quarter second, or every quarter of the shortest limit ever watched.
class Monitor {
 public:
  static Monitor& instance() {
    static auto* monitor = new Monitor();  // never destroyed: a watch may end during exit
    return *monitor;
  }

  uint64_t enter(Call call) {
    std::lock_guard<std::mutex> lock(mutex_);
    interval_ = std::min(interval_, std::max(call.limit / 4, 1e-3));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    calls_.emplace(next_, std::move(call));
    return next_++;
  }

  void leave(uint64_t ticket) {
    std::lock_guard<std::mutex> lock(mutex_);
    calls_.erase(ticket);
  }

 private:
  Monitor() = default;

  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait_for(lock, std::chrono::duration<double>(interval_));
      for (const auto& [ticket, call] : calls_) {
        if (seconds_since(call.started) > call.limit) stuck(call);
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

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<uint64_t, Call> calls_;  // by ticket
  uint64_t next_ = 1;
  double interval_ = 0.25;  // seconds between looks
  std::thread thread_;
};

}  // namespace

StuckCallWatch::StuckCallWatch(std::function<std::string()> what, const char* hint, double limit_seconds)
    : ticket_(Monitor::instance().enter({std::move(what), hint, Clock::now(), limit_seconds})) {}

StuckCallWatch::~StuckCallWatch() { Monitor::instance().leave(ticket_); }

}  // namespace tandem::dist::internal
