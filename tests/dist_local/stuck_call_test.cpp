// StuckCallWatch (dist/stuck_call.h) on its own, in one process: a call over its limit ends the
// process with status 1 and a message naming it; calls within their limit leave no trace.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "tandem/dist/stuck_call.h"

namespace tandem::dist::internal {
namespace {

TEST(StuckCallWatch, ACallPastItsLimitEndsTheProcessNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the monitor is a thread
  EXPECT_EXIT(
      {
        StuckCallWatch watch([] { return std::string("rank 3: nccl all_reduce of 4096 bytes (#7 'bucket 0')"); },
                             "a peer is gone", 0.05);
        std::this_thread::sleep_for(std::chrono::seconds(5));  // the monitor ends the process first
      },
      testing::ExitedWithCode(1),
      "rank 3: nccl all_reduce of 4096 bytes \\(#7 'bucket 0'\\): the call did not return within .* a peer is gone; "
      "this rank exits");
}

TEST(StuckCallWatch, CallsWithinTheirLimitGoOn) {
  for (int i = 0; i < 1000; ++i) {
    StuckCallWatch watch([] { return std::string("never asked"); }, "", 0.2);
  }
  {
    StuckCallWatch longer([] { return std::string("never asked"); }, "", 0.2);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the monitor looks at least twice
  SUCCEED();
}

// dist::finalize runs from atexit and watches the NCCL communicator's finalizing, after exit() has
// destroyed the main thread's thread_local objects: a watch made there must still be watched.
TEST(StuckCallWatch, WatchesStillWorkDuringExit) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        {
          StuckCallWatch first([] { return std::string("never asked"); }, "", 10);
        }
        std::atexit([] {
          const int rank = 0;
          StuckCallWatch finalizing([rank] { return "rank " + std::to_string(rank) + ": finalizing"; },
                                    "a peer is gone", 0.05);
          std::this_thread::sleep_for(std::chrono::seconds(5));  // the monitor ends the process first
        });
        std::exit(0);
      },
      testing::ExitedWithCode(1), "rank 0: finalizing: the call did not return within .* a peer is gone");
}

TEST(StuckCallWatch, ThreadsThatEndedAreForgotten) {
  for (int i = 0; i < 50; ++i) {
    std::thread([] { StuckCallWatch watch([] { return std::string("never asked"); }, "", 0.2); }).join();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the monitor looks: nothing of them left
  SUCCEED();
}

}  // namespace
}  // namespace tandem::dist::internal
