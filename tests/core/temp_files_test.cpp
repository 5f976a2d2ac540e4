// Temporary files of atomic writes: stale ones of dead processes are removed (only those of the
// same target), and a guarded one is removed when SIGTERM or SIGINT ends the process.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "support/test_util.h"
#include "tandem/core/safetensors.h"
#include "tandem/core/temp_files.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir() {
  fs::path dir = fs::temp_directory_path() /
                 ("tandem_tmpfiles_" + std::to_string(::getpid()) + "_" + std::to_string(testing::next_seed()));
  fs::create_directories(dir);
  return dir;
}

void touch(const fs::path& p) { std::ofstream(p) << "partial"; }

// The id of a process that has ended (and been reaped).
pid_t dead_pid() {
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST(TempFiles, RemovesOnlyStaleFilesOfTheSameTarget) {
  fs::path dir = fresh_dir();
  const std::string target = (dir / "ckpt.safetensors").string();
  const pid_t dead = dead_pid();
  touch(target + ".tmp." + std::to_string(dead));                // stale: removed
  touch(target + ".tmp." + std::to_string(::getppid()));         // a live process's: kept
  touch((dir / "other.safetensors.tmp.").string() + std::to_string(dead));  // another target: kept
  touch(target + ".tmp.notapid");                                // not a temp file of ours: kept
  EXPECT_EQ(remove_stale_temp_files(target), 1);
  EXPECT_FALSE(fs::exists(target + ".tmp." + std::to_string(dead)));
  EXPECT_TRUE(fs::exists(target + ".tmp." + std::to_string(::getppid())));
  EXPECT_TRUE(fs::exists((dir / "other.safetensors.tmp.").string() + std::to_string(dead)));
  EXPECT_TRUE(fs::exists(target + ".tmp.notapid"));
  fs::remove_all(dir);
}

TEST(TempFiles, SaveRemovesStaleTempFilesOfItsTarget) {
  fs::path dir = fresh_dir();
  const std::string target = (dir / "w.safetensors").string();
  const std::string stale = target + ".tmp." + std::to_string(dead_pid());
  touch(stale);
  save_safetensors(target, {{"w", testing::random_tensor({3}, DType::f32)}});
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(target));
  fs::remove_all(dir);
}

// A child guards a file, tells the parent, and waits to be stopped by `sig`.
void expect_removed_on(int sig) {
  fs::path dir = fresh_dir();
  const std::string path = (dir / "x.tmp.1").string();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    touch(path);
    TempFileGuard guard(path);
    char byte = 1;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(3);
    for (;;) ::pause();
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::kill(child, sig);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == sig) << "the child should end by signal " << sig;
  EXPECT_FALSE(fs::exists(path)) << "the guarded file is still there after signal " << sig;
  fs::remove_all(dir);
}

TEST(TempFiles, GuardedFileIsRemovedOnSigterm) { expect_removed_on(SIGTERM); }
TEST(TempFiles, GuardedFileIsRemovedOnSigint) { expect_removed_on(SIGINT); }

TEST(TempFiles, UnwritableReasonNamesThePathAndWhy) {
  fs::path dir = fresh_dir();
  EXPECT_EQ(unwritable_reason((dir / "ok.safetensors").string()), "");
  EXPECT_FALSE(fs::exists((dir / "ok.safetensors").string() + ".tmp." + std::to_string(::getpid())));
  EXPECT_EQ(unwritable_reason(dir.string()), "'" + dir.string() + "' is a directory");
  EXPECT_EQ(unwritable_reason((dir / "missing" / "x").string()),
            "the directory '" + (dir / "missing").string() + "' does not exist");
  touch(dir / "file");
  EXPECT_EQ(unwritable_reason((dir / "file" / "x").string()), "'" + (dir / "file").string() + "' is not a directory");
  EXPECT_NE(unwritable_reason("/proc/tandem_cannot_write_here"), "");
  fs::remove_all(dir);
}

TEST(TempFiles, HandlersAreRestoredWhenTheLastGuardGoes) {
  struct sigaction before {}, after {};
  ::sigaction(SIGTERM, nullptr, &before);
  { TempFileGuard guard("/nonexistent/tandem.tmp.1"); }
  ::sigaction(SIGTERM, nullptr, &after);
  EXPECT_EQ(before.sa_handler, after.sa_handler);
}

}  // namespace
}  // namespace tandem
