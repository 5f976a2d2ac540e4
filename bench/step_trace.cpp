#include "step_trace.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "tandem/dist/process_group.h"

namespace tandem::bench {

namespace {

constexpr int kComputeTid = 0;
constexpr int kCommunicationTid = 1;

nlohmann::ordered_json spans_to_json(const dist::Timeline& timeline) {
  nlohmann::ordered_json spans = nlohmann::ordered_json::array();
  for (const dist::TimelineSpan& s : timeline.spans()) {
    nlohmann::ordered_json args = nlohmann::ordered_json::object();
    for (const auto& [key, value] : s.numbers) args[key] = value;
    for (const auto& [key, value] : s.strings) args[key] = value;
    spans.push_back({{"name", s.name},
                     {"track", s.track},
                     {"start_us", s.start_us},
                     {"duration_us", s.duration_us},
                     {"depth", s.depth},
                     {"lane", s.lane},
                     {"args", args}});
  }
  return {{"device", timeline.device().str()}, {"spans", spans}};
}

// Every rank's text, on rank 0 (empty elsewhere): lengths first, then the bytes padded to the
// longest, since all_gather moves the same count from every rank.
std::vector<std::string> gather_to_rank0(const std::string& mine) {
  dist::ProcessGroup& group = *dist::world().cpu_group;
  const int size = group.size();
  Tensor length = from_vector(std::vector<int64_t>{static_cast<int64_t>(mine.size())});
  Tensor lengths = empty({size}, DType::i64);  // (size,)
  group.all_gather(lengths, length)->synchronize();
  std::vector<int64_t> all_lengths = lengths.to_vector<int64_t>();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(all_lengths.begin(), all_lengths.end()));

  Tensor bytes = zeros({longest}, DType::u8);  // (longest,) this rank's text, zero-padded
  std::memcpy(bytes.data<uint8_t>(), mine.data(), mine.size());
  Tensor all = empty({size * longest}, DType::u8);  // (size * longest,)
  group.all_gather(all, bytes)->synchronize();
  if (group.rank() != 0) return {};
  std::vector<std::string> texts;
  const char* base = reinterpret_cast<const char*>(all.data<uint8_t>());
  for (int r = 0; r < size; ++r) texts.emplace_back(base + r * longest, static_cast<size_t>(all_lengths[r]));
  return texts;
}

nlohmann::ordered_json metadata_event(const char* name, int pid, int tid, const nlohmann::ordered_json& args) {
  nlohmann::ordered_json e = {{"name", name}, {"ph", "M"}, {"pid", pid}};
  if (tid >= 0) e["tid"] = tid;
  e["args"] = args;
  return e;
}

}  // namespace

void write_chrome_trace(const dist::Timeline& timeline, const std::string& path,
                        const nlohmann::ordered_json& metadata) {
  std::vector<std::string> texts = gather_to_rank0(spans_to_json(timeline).dump());
  if (texts.empty()) return;  // not rank 0

  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  for (int rank = 0; rank < static_cast<int>(texts.size()); ++rank) {
    nlohmann::ordered_json rank_json = nlohmann::ordered_json::parse(texts[rank]);
    std::string device = rank_json["device"].get<std::string>();
    events.push_back(metadata_event("process_name", rank, -1, {{"name", "rank " + std::to_string(rank)}}));
    events.push_back(metadata_event("process_labels", rank, -1, {{"labels", device}}));
    events.push_back(metadata_event("process_sort_index", rank, -1, {{"sort_index", rank}}));
    events.push_back(metadata_event("thread_name", rank, kComputeTid, {{"name", "compute"}}));
    events.push_back(metadata_event("thread_sort_index", rank, kComputeTid, {{"sort_index", 0}}));
    int lanes = 1;
    for (const auto& span : rank_json["spans"]) lanes = std::max(lanes, span["lane"].get<int>() + 1);
    for (int lane = 0; lane < lanes; ++lane) {  // lanes past the first: MPI collectives that ran at once
      std::string name = lane == 0 ? "communication" : "communication (concurrent " + std::to_string(lane) + ")";
      events.push_back(metadata_event("thread_name", rank, kCommunicationTid + lane, {{"name", name}}));
      events.push_back(metadata_event("thread_sort_index", rank, kCommunicationTid + lane, {{"sort_index", 1 + lane}}));
    }
    for (const auto& span : rank_json["spans"]) {
      const bool comm = span["track"] == "communication";
      const int tid = comm ? kCommunicationTid + span["lane"].get<int>() : kComputeTid;
      events.push_back({{"name", span["name"]},
                        {"cat", span["track"]},
                        {"ph", "X"},
                        {"pid", rank},
                        {"tid", tid},
                        {"ts", span["start_us"]},
                        {"dur", span["duration_us"]},
                        {"args", span["args"]}});
      if (comm) {  // where the compute stream handed the bucket over
        events.push_back({{"name", "launch " + span["name"].get<std::string>()},
                          {"cat", "compute"},
                          {"ph", "i"},
                          {"s", "t"},
                          {"pid", rank},
                          {"tid", kComputeTid},
                          {"ts", span["args"]["launched_us"]}});
      }
    }
  }
  nlohmann::ordered_json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", metadata}};
  std::ofstream out(path);
  TANDEM_CHECK_AS(ValueError, out.good(), "cannot write the trace file '", path,
                  "': expected a path in an existing, writable folder");
  out << trace.dump(1) << "\n";
  TANDEM_CHECK_AS(ValueError, out.good(), "writing the trace file '", path, "' failed");
}

void trace_step(dist::Timeline& timeline, const std::function<void()>& step, const std::string& path,
                const nlohmann::ordered_json& metadata) {
  timeline.start();
  timeline.begin("step");
  step();
  timeline.end();
  timeline.stop();
  write_chrome_trace(timeline, path, metadata);
}

}  // namespace tandem::bench
