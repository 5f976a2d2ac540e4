#pragma once
// One training step of every rank as a Chrome trace (the JSON "traceEvents" format that
// chrome://tracing and ui.perfetto.dev open): a process per rank ("rank N"), a thread per track
// ("compute", "communication"), one complete event per span, timestamps in microseconds since
// that rank's step began.
#include <nlohmann/json.hpp>

#include <functional>
#include <string>

#include "tandem/dist/timeline.h"

namespace tandem::bench {

// Collective: every rank calls it after timeline.stop(). The ranks' spans travel to rank 0 over
// the CPU (MPI) process group, and rank 0 writes `path`; `metadata` goes to the trace's
// "otherData" (workload, DDP options, ...).
void write_chrome_trace(const dist::Timeline& timeline, const std::string& path,
                        const nlohmann::ordered_json& metadata = nlohmann::ordered_json::object());

// Runs `step` once while `timeline` records, inside a "step" span, then writes the trace as above
// (every rank calls it).
void trace_step(dist::Timeline& timeline, const std::function<void()>& step, const std::string& path,
                const nlohmann::ordered_json& metadata = nlohmann::ordered_json::object());

}  // namespace tandem::bench
