#pragma once
// A timeline of one training step on this rank: spans on the compute track (forward, backward,
// the wait for gradients, the optimizer step, ...) and on the communication track (each bucket's
// all-reduce), in microseconds since the step began. bench/step_trace.h turns every rank's
// timeline into one Chrome trace.
//
// Off until start(): begin(), end() and collective() return at once, so the hooks may stay in a
// training loop. While recording, GPU spans are CUDA events on the device's current stream (the
// compute stream), read only in stop(); CPU spans are host clock readings (the CPU backend is
// synchronous).
//
//   dist::Timeline timeline(device);
//   ddp.set_timeline(&timeline);          // DDP adds its buckets and its wait
//   timeline.start();
//   timeline.begin("forward"); ...; timeline.end();
//   timeline.stop();                      // waits for the step, then spans() is ready
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/core/device.h"
#include "tandem/dist/process_group.h"

namespace tandem::dist {

struct TimelineSpan {
  std::string name;
  std::string track;  // "compute" or "communication"
  double start_us = 0;
  double duration_us = 0;
  int depth = 0;  // compute: nesting (the wait for gradients sits inside backward)
  int lane = 0;   // communication: collectives that ran at once (MPI on the CPU) take further lanes
  std::vector<std::pair<std::string, double>> numbers;       // extra facts: bucket index, bytes, ...
  std::vector<std::pair<std::string, std::string>> strings;  // extra facts: dtype, ...
};

class Timeline {
 public:
  explicit Timeline(Device device);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // Starts recording: t = 0 is now, on the compute stream (GPU) or the host clock. Drops what an
  // earlier recording held.
  void start();
  // Ends recording: waits for the step's device work and collectives, then resolves every span.
  // Every begin() must have had its end().
  void stop();
  bool recording() const { return recording_; }

  // A compute span from begin(name) to the matching end(); spans nest.
  void begin(const std::string& name);
  void end();
  // Around a collective's launch: launching() just before the call that enqueues it, collective()
  // with its Work right after. It appears on the communication track, its launch as a mark on the
  // compute track.
  void launching();
  void collective(const std::string& name, std::shared_ptr<Work> work,
                  std::vector<std::pair<std::string, double>> numbers = {},
                  std::vector<std::pair<std::string, std::string>> strings = {});

  // After stop(): the spans, compute ones in the order they began, then the collectives in
  // launch order.
  const std::vector<TimelineSpan>& spans() const { return spans_; }
  const Device& device() const { return device_; }

 private:
  struct Mark;
  struct Open;
  struct Pending;
  struct PendingCollective;
  Mark mark();
  double us_since_origin(const Mark& m) const;

  Device device_;
  bool recording_ = false;
  std::unique_ptr<Mark> origin_;
  std::vector<Pending> compute_;
  std::vector<size_t> open_;  // indices into compute_ of spans begun and not ended
  std::vector<PendingCollective> collectives_;
  std::unique_ptr<Mark> launching_;
  std::vector<TimelineSpan> spans_;
};

}  // namespace tandem::dist
