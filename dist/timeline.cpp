#include "tandem/dist/timeline.h"

#include <algorithm>
#include <chrono>

#include "tandem/core/cuda_api.h"
#include "tandem/core/error.h"

namespace tandem::dist {

using Clock = std::chrono::steady_clock;

// A point of the step: an event on the compute stream (GPU) or a host clock reading (CPU).
struct Timeline::Mark {
  std::unique_ptr<cuda::Event> event;
  Clock::time_point host;
};

struct Timeline::Pending {
  std::string name;
  int depth = 0;
  Mark begin, end;
  bool ended = false;
};

struct Timeline::PendingCollective {
  std::string name;
  std::shared_ptr<Work> work;
  Mark launched;
  std::vector<std::pair<std::string, double>> numbers;
  std::vector<std::pair<std::string, std::string>> strings;
};

Timeline::Timeline(Device device) : device_(device) {}
Timeline::~Timeline() = default;

Timeline::Mark Timeline::mark() {
  Mark m;
  m.host = Clock::now();
  if (device_.is_cuda()) {
    m.event = std::make_unique<cuda::Event>();
    m.event->record(device_.index);
  }
  return m;
}

double Timeline::us_since_origin(const Mark& m) const {
  if (m.event) return origin_->event->elapsed_ms(*m.event) * 1e3;
  return std::chrono::duration<double, std::micro>(m.host - origin_->host).count();
}

void Timeline::start() {
  compute_.clear();
  open_.clear();
  collectives_.clear();
  launching_.reset();
  spans_.clear();
  origin_ = std::make_unique<Mark>(mark());
  recording_ = true;
}

void Timeline::begin(const std::string& name) {
  if (!recording_) return;
  Pending p;
  p.name = name;
  p.depth = static_cast<int>(open_.size());
  p.begin = mark();
  open_.push_back(compute_.size());
  compute_.push_back(std::move(p));
}

void Timeline::end() {
  if (!recording_) return;
  TANDEM_CHECK_AS(ValueError, !open_.empty(), "Timeline::end(): no span is open (end() without begin())");
  Pending& p = compute_[open_.back()];
  p.end = mark();
  p.ended = true;
  open_.pop_back();
}

void Timeline::launching() {
  if (!recording_) return;
  launching_ = std::make_unique<Mark>(mark());
}

void Timeline::collective(const std::string& name, std::shared_ptr<Work> work,
                          std::vector<std::pair<std::string, double>> numbers,
                          std::vector<std::pair<std::string, std::string>> strings) {
  if (!recording_) return;
  TANDEM_CHECK_AS(ValueError, work != nullptr, "Timeline::collective('", name, "'): null Work");
  TANDEM_CHECK_AS(ValueError, launching_ != nullptr, "Timeline::collective('", name,
                  "'): call launching() right before launching the collective");
  collectives_.push_back({name, std::move(work), std::move(*launching_), std::move(numbers), std::move(strings)});
  launching_.reset();
}

void Timeline::stop() {
  if (!recording_) return;
  recording_ = false;
  TANDEM_CHECK_AS(ValueError, open_.empty(), "Timeline::stop(): span '", compute_[open_.back()].name,
                  "' was begun and never ended; every begin() needs its end()");
  Mark last = mark();
  if (last.event) last.event->synchronize();

  for (const Pending& p : compute_) {
    TimelineSpan s;
    s.name = p.name;
    s.track = "compute";
    s.depth = p.depth;
    s.start_us = us_since_origin(p.begin);
    s.duration_us = std::max(0.0, us_since_origin(p.end) - s.start_us);
    spans_.push_back(std::move(s));
  }

  // On a GPU, the collectives of one group run one after another on its communication stream, and
  // each starts once its input is ready (the launch mark: the event the group records on the
  // caller's stream sits at the same point of that stream) and the one before it has finished. So
  // its start is the later of the two and its end the start plus the Work's own device time: the
  // track shows what the stream did without needing the group's events. On the CPU the Work times
  // the collective from its posting to its completion, and MPI runs posted collectives at once, in
  // no fixed order: a collective that overlaps one still running takes the next free lane.
  const bool gpu = device_.is_cuda();
  double previous_end = 0;
  std::vector<double> lane_ends;  // CPU: when each lane's last collective ended
  for (const PendingCollective& c : collectives_) {
    c.work->synchronize();
    double launched = us_since_origin(c.launched);
    double elapsed_us = std::max(0.0, c.work->elapsed_ms() * 1e3);
    TimelineSpan s;
    s.name = c.name;
    s.track = "communication";
    if (gpu) {
      s.start_us = std::max(launched, previous_end);
      s.duration_us = elapsed_us;
      previous_end = s.start_us + elapsed_us;
    } else {
      s.start_us = launched;
      s.duration_us = elapsed_us;
      size_t lane = 0;
      while (lane < lane_ends.size() && lane_ends[lane] > launched) ++lane;
      if (lane == lane_ends.size()) lane_ends.push_back(0);
      lane_ends[lane] = launched + elapsed_us;
      s.lane = static_cast<int>(lane);
    }
    s.numbers = c.numbers;
    s.numbers.push_back({"launched_us", launched});
    if (gpu) s.numbers.push_back({"queued_us", s.start_us - launched});  // behind the previous bucket
    s.strings = c.strings;
    spans_.push_back(std::move(s));
  }
  collectives_.clear();
  compute_.clear();
  origin_.reset();
}

}  // namespace tandem::dist
