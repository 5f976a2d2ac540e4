// WorkTracker::sweep (dist/work_tracker.h) on its own: collectives that finish in launch order
// (one completion order, as NCCL's on one CUDA stream) are completed through the newest finished
// one, found with few tests, and never before they have finished; collectives without an order
// are tested one by one.
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <vector>

#include "tandem/dist/work_tracker.h"

namespace tandem::dist::internal {
namespace {

// A collective of the fake backend: `order` is its completion order (null: none), and it has
// finished once the backend's clock of its order reached `finishes_at`.
struct FakeWork : TrackedWork {
  const void* order = nullptr;
  int finishes_at = 0;
};

class FakeTracker final : public WorkTracker {
 public:
  FakeTracker() : WorkTracker("fake", own_mutex) {}
  std::mutex own_mutex;
  int now = 0;                   // works with finishes_at <= now have finished
  int tests = 0;                 // poll() calls
  int completed_unpolled = 0;    // complete_in_order() calls
  std::vector<const FakeWork*> completed_early;  // completed before they had finished: must stay empty

  std::shared_ptr<FakeWork> launch(const void* order, int finishes_at) {
    auto w = std::make_shared<FakeWork>();
    w->order = order;
    w->finishes_at = finishes_at;
    pending.push_back(w);
    return w;
  }
  void poll(TrackedWork& tracked) override {
    ++tests;
    if (static_cast<FakeWork&>(tracked).finishes_at <= now) complete(tracked);
  }
  const void* completion_order(const TrackedWork& tracked) const override {
    return static_cast<const FakeWork&>(tracked).order;
  }
  void complete_in_order(TrackedWork& tracked) override {
    ++completed_unpolled;
    auto& w = static_cast<FakeWork&>(tracked);
    if (w.finishes_at > now) completed_early.push_back(&w);
    complete(w);
  }

 protected:
  std::chrono::microseconds poll_interval() const override { return std::chrono::microseconds(1000); }
};

const char kStream = 'a', kOtherStream = 'b';  // their addresses are the orders

TEST(OrderedSweep, AllFinishedTakesOneTest) {
  FakeTracker t;
  std::lock_guard<std::mutex> lock(t.mutex);
  for (int i = 1; i <= 100; ++i) t.launch(&kStream, i);
  t.now = 100;
  t.sweep();
  EXPECT_TRUE(t.pending.empty());
  EXPECT_EQ(t.tests, 1);
  EXPECT_EQ(t.completed_unpolled, 99);
}

TEST(OrderedSweep, SomeFinishedAreFoundFromTheNewestBackAndNoneTooEarly) {
  for (int finished = 0; finished <= 64; ++finished) {
    FakeTracker t;
    std::lock_guard<std::mutex> lock(t.mutex);
    std::vector<std::shared_ptr<FakeWork>> works;
    for (int i = 1; i <= 64; ++i) works.push_back(t.launch(&kStream, i));
    t.now = finished;
    t.sweep();
    EXPECT_EQ(t.pending.size(), static_cast<size_t>(64 - finished)) << finished << " finished";
    for (int i = 0; i < 64; ++i) EXPECT_EQ(works[i]->done, i < finished) << "work " << i << ", " << finished << " finished";
    EXPECT_TRUE(t.completed_early.empty());
    // The newest, then steps back that double until one has finished, then halvings between: for
    // k unfinished at most 1 + 2 ceil(log2(k + 1)) tests.
    const int unfinished = 64 - finished;
    int ceil_log2 = 0;
    while ((1 << ceil_log2) < unfinished + 1) ++ceil_log2;
    EXPECT_LE(t.tests, 1 + 2 * ceil_log2) << finished << " finished";
    if (unfinished == 1) EXPECT_EQ(t.tests, 2);
  }
}

TEST(OrderedSweep, OrdersAreSweptApartAndWorksWithoutOneOneByOne) {
  FakeTracker t;
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<std::shared_ptr<FakeWork>> works;
  // Interleaved: stream A finishes up to 5, stream B up to 2, the unordered ones at their own times.
  for (int i = 1; i <= 8; ++i) {
    works.push_back(t.launch(&kStream, i));
    works.push_back(t.launch(&kOtherStream, i <= 2 ? 0 : 100));
    works.push_back(t.launch(nullptr, i % 2 == 0 ? 0 : 100));
  }
  t.now = 5;
  t.sweep();
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(works[3 * i]->done, i + 1 <= 5) << "stream A, work " << i;
    EXPECT_EQ(works[3 * i + 1]->done, i + 1 <= 2) << "stream B, work " << i;
    EXPECT_EQ(works[3 * i + 2]->done, (i + 1) % 2 == 0) << "unordered, work " << i;
  }
  EXPECT_TRUE(t.completed_early.empty());
  EXPECT_EQ(t.pending.size(), 3u + 6u + 4u);
}

}  // namespace
}  // namespace tandem::dist::internal
