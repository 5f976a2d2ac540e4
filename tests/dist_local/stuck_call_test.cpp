// StuckCallWatch (dist/stuck_call.h) on its own, in one process: a call over its limit ends the
// process with status 1 and a message naming it; calls within their limit leave no trace.
#include <gtest/gtest.h>

#include <chrono>
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

}  // namespace
}  // namespace tandem::dist::internal
