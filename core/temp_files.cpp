#include "tandem/core/temp_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "tandem/core/error.h"

namespace tandem {

namespace {
constexpr int kSlots = 16;
constexpr size_t kMaxPath = 4096;

// Paths to remove on a signal. A signal handler may only read memory that is complete, so each
// slot's text is written before its flag is raised and the flag lowered before it is reused.
struct Slot {
  std::atomic<bool> used{false};
  char path[kMaxPath];
};
Slot slots[kSlots];
std::mutex slots_mutex;  // taken by constructors and destructors, never by the handler
struct sigaction previous_int, previous_term;
int active = 0;  // guards alive; the handlers are installed while there are any

void remove_on_signal(int sig) {
  for (Slot& s : slots) {
    if (s.used.load()) ::unlink(s.path);
  }
  // End as the signal would have without us: the previous disposition, raised again on return.
  ::sigaction(sig, sig == SIGINT ? &previous_int : &previous_term, nullptr);
  ::raise(sig);
}

void install_handlers() {
  struct sigaction action {};
  action.sa_handler = remove_on_signal;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, &previous_int);
  ::sigaction(SIGTERM, &action, &previous_term);
}

// Puts back what was there before, unless someone replaced our handler meanwhile.
void restore_handlers() {
  struct sigaction current {};
  if (::sigaction(SIGINT, nullptr, &current) == 0 && current.sa_handler == remove_on_signal) {
    ::sigaction(SIGINT, &previous_int, nullptr);
  }
  if (::sigaction(SIGTERM, nullptr, &current) == 0 && current.sa_handler == remove_on_signal) {
    ::sigaction(SIGTERM, &previous_term, nullptr);
  }
}

// Whether a process with this id exists (kill with signal 0 only checks).
bool process_alive(long pid) { return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM; }

std::string directory_of(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}
}  // namespace

std::string temp_path_for(const std::string& target) { return detail::concat(target, ".tmp.", ::getpid()); }

int remove_stale_temp_files(const std::string& target) {
  const std::string dir = directory_of(target);
  const std::string prefix = target.substr(target.rfind('/') == std::string::npos ? 0 : target.rfind('/') + 1) + ".tmp.";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;  // the write itself will report a missing directory
  int removed = 0;
  while (dirent* entry = ::readdir(d)) {
    const std::string name = entry->d_name;
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    char* end = nullptr;
    long pid = std::strtol(digits.c_str(), &end, 10);
    if (*end != '\0' || pid <= 0 || digits[0] == '+' || digits[0] == '-') continue;  // not one of ours
    if (pid == ::getpid() || process_alive(pid)) continue;
    if (::unlink((dir + "/" + name).c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

std::string unwritable_reason(const std::string& target) {
  if (target.empty() || target.back() == '/') return "'" + target + "' names no file";
  struct stat st {};
  if (::stat(target.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return "'" + target + "' is a directory";
  const std::string dir = directory_of(target);
  if (::stat(dir.c_str(), &st) != 0) return "the directory '" + dir + "' does not exist";
  if (!S_ISDIR(st.st_mode)) return "'" + dir + "' is not a directory";
  const std::string probe = temp_path_for(target);
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot create files in '" + dir + "': " + std::strerror(errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

TempFileGuard::TempFileGuard(const std::string& path) : slot_(-1) {
  TANDEM_CHECK_AS(ValueError, path.size() < kMaxPath, "TempFileGuard: the path is ", path.size(),
                  " characters; at most ", kMaxPath - 1, " are supported");
  std::lock_guard<std::mutex> lock(slots_mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (!slots[i].used.load()) {
      std::memcpy(slots[i].path, path.c_str(), path.size() + 1);
      slots[i].used.store(true);
      slot_ = i;
      if (active++ == 0) install_handlers();
      return;
    }
  }
  TANDEM_THROW(ValueError, "TempFileGuard: more than ", kSlots, " temporary files are guarded at once");
}

TempFileGuard::~TempFileGuard() {
  std::lock_guard<std::mutex> lock(slots_mutex);
  slots[slot_].used.store(false);
  if (--active == 0) restore_handlers();
}

}  // namespace tandem
