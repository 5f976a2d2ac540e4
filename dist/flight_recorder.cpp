#include "tandem/dist/flight_recorder.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <sstream>

#include "tandem/core/error.h"

namespace tandem::dist::internal {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string json_string(const char* text) {
  std::string out = "\"";
  for (const char* p = text; *p != '\0'; ++p) {
    if (*p == '"' || *p == '\\') out += '\\';
    if (static_cast<unsigned char>(*p) < 0x20) continue;
    out += *p;
  }
  return out + "\"";
}

std::string& directory_storage() {
  static auto* d = new std::string();  // never destroyed: read from signal handlers and atexit
  return *d;
}

}  // namespace

const char* record_state_name(RecordState state) {
  switch (state) {
    case RecordState::queued: return "queued";
    case RecordState::started: return "started";
    case RecordState::completed: return "completed";
    case RecordState::failed: return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(size_t capacity) : ring_(std::max<size_t>(capacity, 1)) {}

void FlightRecorder::queued(const Fingerprint& fingerprint) {
  Entry& e = ring_[(fingerprint.seq - 1) % ring_.size()];
  e = Entry{};
  e.fingerprint = fingerprint;
  e.queued_at = now_seconds();
  last_seq_ = fingerprint.seq;
}

void FlightRecorder::set_state(uint64_t seq, RecordState state) {
  if (seq == 0 || seq > last_seq_ || last_seq_ - seq >= ring_.size()) return;
  Entry& e = ring_[(seq - 1) % ring_.size()];
  e.state = state;
  (state == RecordState::started ? e.started_at : e.ended_at) = now_seconds();
}

std::vector<Fingerprint> FlightRecorder::fingerprints(uint64_t first, uint64_t last) const {
  std::vector<Fingerprint> out;
  for (uint64_t s = std::max<uint64_t>(first, 1); s <= std::min(last, last_seq_); ++s) {
    if (last_seq_ - s < ring_.size()) out.push_back(ring_[(s - 1) % ring_.size()].fingerprint);
  }
  return out;
}

std::string FlightRecorder::to_json(int rank, int size, const std::string& backend, const std::string& reason) const {
  std::ostringstream out;
  out.precision(17);
  out << "{\"rank\": " << rank << ", \"world_size\": " << size << ", \"backend\": " << json_string(backend.c_str())
      << ", \"reason\": " << json_string(reason.c_str()) << ", \"dumped_at\": " << now_seconds()
      << ", \"last_seq\": " << last_seq_ << ", \"entries\": [";
  uint64_t first = last_seq_ >= ring_.size() ? last_seq_ - ring_.size() + 1 : 1;
  for (uint64_t s = first; s <= last_seq_; ++s) {
    const Entry& e = ring_[(s - 1) % ring_.size()];
    const Fingerprint& f = e.fingerprint;
    out << (s == first ? "\n  " : ",\n  ") << "{\"seq\": " << f.seq << ", \"op\": " << json_string(f.op)
        << ", \"label\": " << json_string(f.label) << ", \"count\": " << f.count << ", \"bytes\": " << f.bytes()
        << ", \"dtype\": "
        << (f.dtype == Fingerprint::kNone ? "null" : json_string(dtype_name(static_cast<DType>(f.dtype))))
        << ", \"state\": \"" << record_state_name(e.state) << "\", \"queued_at\": " << e.queued_at
        << ", \"started_at\": " << e.started_at << ", \"ended_at\": " << e.ended_at
        << ", \"describe\": " << json_string(f.describe().c_str()) << "}";
  }
  out << "\n]}\n";
  return out.str();
}

std::string FlightRecorder::dump(int rank, int size, const std::string& backend, const std::string& reason) const {
  const std::string& dir = dump_directory();
  if (dir.empty()) return "";
  ::mkdir(dir.c_str(), 0755);  // one level; an existing directory is fine
  std::string path = ::tandem::detail::concat(dir, "/rank", rank, "-", backend, ".json");
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return "";
  std::string text = to_json(rank, size, backend, reason);
  bool ok = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  ok = std::fclose(file) == 0 && ok;
  return ok ? path : "";
}

void set_dump_directory(const std::string& directory) { directory_storage() = directory; }
const std::string& dump_directory() { return directory_storage(); }

}  // namespace tandem::dist::internal
