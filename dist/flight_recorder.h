#pragma once
// Internal to dist/: the flight recorder of one process group, a ring buffer of its last
// collectives (fingerprint, state, timestamps), written as JSON to <dir>/rank<R>-<backend>.json when
// the group fails (a timeout, a failed collective, an abort) or the process gets SIGTERM/SIGINT.
// The directory is InitOptions::dump_dir or $TANDEM_DIST_DUMP_DIR; without one nothing is written.
// scripts/dist_analyze.py reads every rank's file and names the rank that is behind.
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/dist/fingerprint.h"

namespace tandem::dist::internal {

enum class RecordState : uint8_t { queued, started, completed, failed };
const char* record_state_name(RecordState state);  // "queued", ...

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity);
  void queued(const Fingerprint& fingerprint);
  void set_state(uint64_t seq, RecordState state);  // ignored once the entry left the ring
  // The recorded fingerprints with sequence numbers in [first, last], oldest first.
  std::vector<Fingerprint> fingerprints(uint64_t first, uint64_t last) const;
  std::string to_json(int rank, int size, const std::string& backend, const std::string& reason) const;
  // Writes the JSON file; returns its path, or "" when no directory is set or writing failed.
  std::string dump(int rank, int size, const std::string& backend, const std::string& reason) const;

 private:
  struct Entry {
    Fingerprint fingerprint;
    RecordState state = RecordState::queued;
    double queued_at = 0, started_at = 0, ended_at = 0;  // seconds since the epoch; 0: not yet
  };
  std::vector<Entry> ring_;  // (capacity,) entry of seq s at (s - 1) % capacity
  uint64_t last_seq_ = 0;
};

// The dump directory ("" when none): set by dist::init from InitOptions::dump_dir, else
// $TANDEM_DIST_DUMP_DIR.
void set_dump_directory(const std::string& directory);
const std::string& dump_directory();

}  // namespace tandem::dist::internal
