#pragma once
// Temporary files of atomic writes ("<target>.tmp.<pid>", written and then renamed over the target):
// the name, the removal of those a killed process left behind, and their removal when this
// process is stopped by SIGINT or SIGTERM in the middle of a write.
#include <string>

namespace tandem {

// "<target>.tmp.<pid of this process>".
std::string temp_path_for(const std::string& target);

// Removes the "<target>.tmp.<pid>" files whose process is no longer alive (a save that was
// killed); files of live processes and of other targets stay. Returns how many were removed.
int remove_stale_temp_files(const std::string& target);

// Why a file cannot be written atomically at `target` (its temporary file created beside it, then
// renamed over it), in words naming the path: "'x' is a directory", "the directory 'd' does not
// exist", "cannot create files in 'd': Permission denied"; "" when it can. Tries it: creates and
// removes the temporary file.
std::string unwritable_reason(const std::string& target);

// While it lives, SIGINT and SIGTERM remove `path` before the process ends as the signal (or the
// handler that was installed before) would have it. Up to 16 guards at a time; more are a
// ValueError.
class TempFileGuard {
 public:
  explicit TempFileGuard(const std::string& path);
  ~TempFileGuard();
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;

 private:
  int slot_;
};

}  // namespace tandem
