// The rule that keeps one of cuBLASLt's timed candidates (core/cuda/cublaslt_plan.h): in order, a
// later candidate replaces the best so far only when at least 2% faster, one that needs a
// workspace is charged kWorkspaceChargeMs, and refused ones are skipped. Pure host logic: it runs
// without a GPU.
#include <gtest/gtest.h>

#include "tandem/core/cuda/cublaslt_plan.h"

namespace tandem::cuda::lt {
namespace {

TEST(TimedCandidate, NearTiesKeepTheEarlierAndTwoPercentReplacesIt) {
  EXPECT_EQ(choose_timed_candidate({{0.0500, 0}, {0.0491, 0}}), 0);  // 1.8% faster: a tie
  EXPECT_EQ(choose_timed_candidate({{0.0500, 0}, {0.0489, 0}}), 1);  // 2.2% faster
  EXPECT_EQ(choose_timed_candidate({{0.0500, 0}, {0.0450, 0}, {0.0449, 0}}), 1);
}

TEST(TimedCandidate, OneThatNeedsAWorkspaceIsChargedForItsMemset) {
  // The MLP's 4096 x 4096 weight gradient on an H200: the same speed with and without a workspace.
  EXPECT_EQ(choose_timed_candidate({{0.04864, 0}, {0.04845, 4}}), 0);
  // First in the list, it still loses to a workspace-free one of about its speed.
  EXPECT_EQ(choose_timed_candidate({{0.04845, 4}, {0.04864, 0}}), 1);
  // A split-K algorithm far enough ahead still wins (GPT-2's head, 106.7 against 126.7 us).
  EXPECT_EQ(choose_timed_candidate({{0.12672, 0}, {0.10666, 12582928}}), 1);
  // The charge is kWorkspaceChargeMs: just over 2% beyond it wins, just under does not.
  const double base = 0.1;
  EXPECT_EQ(choose_timed_candidate({{base, 0}, {0.979 * base - kWorkspaceChargeMs, 4}}), 1);
  EXPECT_EQ(choose_timed_candidate({{base, 0}, {0.981 * base - kWorkspaceChargeMs, 4}}), 0);
}

TEST(TimedCandidate, RefusedCandidatesAreSkippedAndNoneRunGivesMinusOne) {
  EXPECT_EQ(choose_timed_candidate({{-1, 0}, {0.0700, 0}, {0.0650, 0}}), 2);
  EXPECT_EQ(choose_timed_candidate({{-1, 0}, {-1, 4}}), -1);
  EXPECT_EQ(choose_timed_candidate({}), -1);
}

}  // namespace
}  // namespace tandem::cuda::lt
