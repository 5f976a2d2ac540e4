// DataLoader: every sample once per epoch, reproducible orders, drop_last, index subsets,
// resuming, errors from the background thread, and shutdown in the middle of an epoch.
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/data/loader.h"

namespace tandem::data {
namespace {

using testing::throws_with;

// n samples: inputs row i is [i, -i] (f32), target i is i (i64), so a batch shows what it holds.
struct Dataset {
  Tensor inputs;   // (n, 2)
  Tensor targets;  // (n,)
};
Dataset make_dataset(int64_t n) {
  std::vector<float> rows;
  for (int64_t i = 0; i < n; ++i) {
    rows.push_back(static_cast<float>(i));
    rows.push_back(-static_cast<float>(i));
  }
  return {from_vector(rows, {n, 2}), arange(n)};
}

DataLoaderOptions make_options(int64_t batch_size, bool shuffle, uint64_t seed = 0, bool drop_last = false) {
  DataLoaderOptions o;
  o.batch_size = batch_size;
  o.shuffle = shuffle;
  o.seed = seed;
  o.drop_last = drop_last;
  return o;
}

// Runs an epoch and returns the samples in the order seen, checking each batch's contents.
std::vector<int64_t> run_epoch(DataLoader& loader, int64_t epoch, int64_t first_batch = 0) {
  loader.start_epoch(epoch, first_batch);
  std::vector<int64_t> seen;
  int64_t expected_index = first_batch;
  while (auto batch = loader.next()) {
    EXPECT_EQ(batch->index, expected_index++);
    std::vector<int64_t> targets = batch->targets.to_vector<int64_t>();
    std::vector<float> inputs = batch->inputs.to_vector<float>();
    EXPECT_EQ(targets, batch->sample_indices);
    EXPECT_EQ(batch->inputs.shape(), (Shape{static_cast<int64_t>(targets.size()), 2}));
    for (size_t i = 0; i < targets.size(); ++i) {
      EXPECT_EQ(inputs[2 * i], static_cast<float>(targets[i]));
      EXPECT_EQ(inputs[2 * i + 1], -static_cast<float>(targets[i]));
    }
    seen.insert(seen.end(), targets.begin(), targets.end());
  }
  EXPECT_EQ(expected_index, loader.num_batches());
  EXPECT_FALSE(loader.next().has_value());  // stays at the end
  return seen;
}

TEST(DataLoader, SeesEverySampleOncePerEpoch) {
  Dataset d = make_dataset(103);
  for (int64_t prefetch : {0, 1, 3}) {
    SCOPED_TRACE(prefetch);
    DataLoaderOptions o = make_options(10, true, testing::next_seed());
    o.prefetch = prefetch;
    DataLoader loader(d.inputs, d.targets, o);
    EXPECT_EQ(loader.num_samples(), 103);
    EXPECT_EQ(loader.num_batches(), 11);
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int64_t> seen = run_epoch(loader, epoch);
      ASSERT_EQ(seen.size(), 103u);
      std::set<int64_t> unique(seen.begin(), seen.end());
      EXPECT_EQ(unique.size(), 103u);
      EXPECT_EQ(*unique.begin(), 0);
      EXPECT_EQ(*unique.rbegin(), 102);
    }
  }
}

TEST(DataLoader, KeepsTheOrderWithoutShuffle) {
  Dataset d = make_dataset(25);
  DataLoader loader(d.inputs, d.targets, make_options(7, false));
  std::vector<int64_t> expected(25);
  for (int64_t i = 0; i < 25; ++i) expected[i] = i;
  EXPECT_EQ(run_epoch(loader, 0), expected);
  EXPECT_EQ(run_epoch(loader, 1), expected);
}

TEST(DataLoader, OrderDependsOnlyOnSeedAndEpoch) {
  Dataset d = make_dataset(200);
  uint64_t seed = testing::next_seed();
  DataLoader a(d.inputs, d.targets, make_options(16, true, seed));
  DataLoader b(d.inputs, d.targets, make_options(16, true, seed));
  DataLoader c(d.inputs, d.targets, make_options(16, true, seed + 1000));
  std::vector<int64_t> a0 = run_epoch(a, 0), a1 = run_epoch(a, 1), a5 = run_epoch(a, 5);
  EXPECT_EQ(run_epoch(b, 5), a5);  // a fresh loader at a later epoch: as a resumed run would be
  EXPECT_EQ(run_epoch(b, 0), a0);
  EXPECT_EQ(run_epoch(a, 0), a0);  // the same epoch again
  EXPECT_NE(a0, a1);
  EXPECT_NE(a1, a5);
  EXPECT_NE(run_epoch(c, 0), a0);
  // The documented rule: randperm under a Generator seeded with seed + epoch.
  Generator gen(seed + 1);
  EXPECT_EQ(randperm(200, &gen).to_vector<int64_t>(), a1);
}

TEST(DataLoader, DropsTheLastPartialBatch) {
  Dataset d = make_dataset(103);
  DataLoader keep(d.inputs, d.targets, make_options(10, true, 1, false));
  DataLoader drop(d.inputs, d.targets, make_options(10, true, 1, true));
  EXPECT_EQ(keep.num_batches(), 11);
  EXPECT_EQ(drop.num_batches(), 10);
  drop.start_epoch(0);
  int64_t batches = 0;
  while (auto batch = drop.next()) {
    EXPECT_EQ(batch->targets.size(0), 10);
    ++batches;
  }
  EXPECT_EQ(batches, 10);
  // The dropped samples are the last 3 of the same order.
  std::vector<int64_t> all = run_epoch(keep, 0);
  std::vector<int64_t> kept = run_epoch(drop, 0);
  EXPECT_EQ(kept, std::vector<int64_t>(all.begin(), all.begin() + 100));
  DataLoader tiny(d.inputs, d.targets, make_options(500, true, 1, true));
  EXPECT_EQ(tiny.num_batches(), 0);
  EXPECT_TRUE(run_epoch(tiny, 0).empty());
}

TEST(DataLoader, DrawsFromAnIndexSubset) {
  Dataset d = make_dataset(100);
  DataLoader loader(d.inputs, d.targets, make_options(3, true, 7));
  std::vector<int64_t> subset = {5, 7, 7, 90, 42, 0, 99};
  loader.set_indices(subset);
  EXPECT_EQ(loader.num_samples(), 7);
  EXPECT_EQ(loader.num_batches(), 3);
  std::vector<int64_t> seen = run_epoch(loader, 0);
  std::multiset<int64_t> got(seen.begin(), seen.end()), want(subset.begin(), subset.end());
  EXPECT_EQ(got, want);
  EXPECT_NE(run_epoch(loader, 1), seen);

  EXPECT_TRUE(throws_with<IndexError>(
      [&] {
        loader.set_indices({1, 100});
      },
      {"index 100 at position 1 is outside [0, 100)"}));
  loader.set_indices({3, 4});
  EXPECT_TRUE(throws_with<ValueError>([&] { loader.next(); }, {"call start_epoch(epoch) first"}));
  loader.clear_indices();
  EXPECT_EQ(loader.num_samples(), 100);
  EXPECT_EQ(run_epoch(loader, 0).size(), 100u);
}

TEST(DataLoader, ResumesMidEpochAndRestartsEpochs) {
  Dataset d = make_dataset(50);
  DataLoader loader(d.inputs, d.targets, make_options(8, true, 3));
  std::vector<int64_t> full = run_epoch(loader, 4);
  EXPECT_EQ(run_epoch(loader, 4, 3), std::vector<int64_t>(full.begin() + 24, full.end()));
  EXPECT_TRUE(run_epoch(loader, 4, loader.num_batches()).empty());
  EXPECT_TRUE(throws_with<ValueError>([&] { loader.start_epoch(4, 8); }, {"first_batch 8 is outside [0, 7]"}));

  // Abandoning an epoch half-way: the next one is complete and in its own order.
  loader.start_epoch(0);
  loader.next();
  loader.next();
  std::vector<int64_t> epoch1 = run_epoch(loader, 1);
  DataLoader fresh(d.inputs, d.targets, make_options(8, true, 3));
  EXPECT_EQ(run_epoch(fresh, 1), epoch1);
}

TEST(DataLoader, PreparesBatchesOnABackgroundThread) {
  Dataset d = make_dataset(40);
  std::set<std::thread::id> threads;
  std::mutex mutex;
  DataLoaderOptions o = make_options(10, false);
  o.transform = [&](Batch& b) {
    std::lock_guard<std::mutex> lock(mutex);
    threads.insert(std::this_thread::get_id());
    b.inputs = kernels::unary(UnaryOp::scale, b.inputs, 2.0);  // runs before the batch is handed out
  };
  DataLoader loader(d.inputs, d.targets, o);
  loader.start_epoch(0);
  auto batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->inputs.to_vector<float>()[2], 2.0f);  // sample 1, doubled
  while (loader.next()) {
  }
  EXPECT_EQ(threads.size(), 1u);
  EXPECT_EQ(threads.count(std::this_thread::get_id()), 0u);
}

TEST(DataLoader, RethrowsErrorsFromPreparingABatch) {
  Dataset d = make_dataset(50);
  for (int64_t prefetch : {0, 2}) {
    SCOPED_TRACE(prefetch);
    std::atomic<int> calls{0};
    DataLoaderOptions o = make_options(10, true, 11);
    o.prefetch = prefetch;
    o.transform = [&](Batch& b) {
      if (b.index == 2 && calls++ == 0) TANDEM_THROW(ValueError, "augmentation failed on batch ", b.index);
    };
    DataLoader loader(d.inputs, d.targets, o);
    loader.start_epoch(0);
    EXPECT_TRUE(loader.next().has_value());  // batches before the failing one still arrive
    EXPECT_TRUE(loader.next().has_value());
    EXPECT_TRUE(throws_with<ValueError>([&] { loader.next(); }, {"augmentation failed on batch 2"}));
    EXPECT_TRUE(throws_with<ValueError>([&] { loader.next(); }, {"augmentation failed on batch 2"}));  // sticky
    EXPECT_EQ(run_epoch(loader, 0).size(), 50u);  // a new epoch starts clean
  }
}

TEST(DataLoader, ShutsDownInTheMiddleOfAnEpoch) {
  Dataset d = make_dataset(1000);
  auto slow = [](Batch&) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  auto start = std::chrono::steady_clock::now();
  {
    DataLoaderOptions o = make_options(10, true, 5);
    o.transform = slow;
    DataLoader loader(d.inputs, d.targets, o);
    loader.start_epoch(0);
    ASSERT_TRUE(loader.next().has_value());
  }  // the worker is preparing or waiting with a full queue
  {
    DataLoaderOptions o = make_options(10, true, 5);
    o.transform = slow;
    DataLoader loader(d.inputs, d.targets, o);
    loader.start_epoch(0);  // destroyed while the first batch is being prepared
  }
  {
    DataLoader loader(d.inputs, d.targets, make_options(10, true, 5));  // never started
  }
  {
    DataLoaderOptions o = make_options(10, true, 5);
    o.transform = [](Batch&) { TANDEM_THROW(ValueError, "boom"); };
    DataLoader loader(d.inputs, d.targets, o);
    loader.start_epoch(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }  // holding an error nobody read
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(), 2000);
}

TEST(DataLoader, RejectsBadArguments) {
  Dataset d = make_dataset(10);
  EXPECT_TRUE(
      throws_with<ValueError>([&] { DataLoader(d.inputs, arange(9), {}); }, {"inputs hold 10 samples but targets 9"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { DataLoader(d.inputs, d.targets, make_options(0, true)); },
                                      {"batch_size must be positive, got 0"}));
  EXPECT_TRUE(
      throws_with<ValueError>([&] { DataLoader(scalar_tensor(1.0), d.targets, {}); }, {"need a leading sample dim"}));
  DataLoader loader(d.inputs, d.targets, make_options(4, true));
  EXPECT_TRUE(throws_with<ValueError>([&] { loader.next(); }, {"no epoch is running; call start_epoch(epoch) first"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { loader.start_epoch(-1); }, {"epoch must be >= 0"}));
  if (!cuda::is_available()) {
    DataLoaderOptions o;
    o.device = Device("cuda");
    EXPECT_TRUE(
        throws_with<DeviceError>([&] { DataLoader(d.inputs, d.targets, o); }, {"DataLoader: batches for cuda"}));
  }
}

TEST(DataLoader, DeliversBatchesOnTheGpu) {
  TANDEM_REQUIRE_CUDA();
  Dataset d = make_dataset(300);
  DataLoaderOptions o = make_options(32, true, 9);
  o.device = Device("cuda");
  DataLoader gpu(d.inputs, d.targets, o);
  DataLoader cpu(d.inputs, d.targets, make_options(32, true, 9));
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    gpu.start_epoch(epoch);
    cpu.start_epoch(epoch);
    while (auto g = gpu.next()) {
      auto c = cpu.next();
      ASSERT_TRUE(c.has_value());
      EXPECT_TRUE(g->inputs.device().is_cuda());
      EXPECT_TRUE(g->targets.device().is_cuda());
      EXPECT_EQ(g->inputs.to_vector<float>(), c->inputs.to_vector<float>());
      EXPECT_EQ(g->targets.to_vector<int64_t>(), c->targets.to_vector<int64_t>());
    }
    EXPECT_FALSE(cpu.next().has_value());
  }
  // A data set already on the GPU is gathered there.
  DataLoader resident(kernels::to_device(d.inputs, Device("cuda")), kernels::to_device(d.targets, Device("cuda")), o);
  resident.start_epoch(0);
  auto b = resident.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_TRUE(b->inputs.device().is_cuda());
  EXPECT_EQ(b->targets.to_vector<int64_t>(), b->sample_indices);
}

// A rank bound to a GPU other than the first (mpirun -np 2 on two GPUs: rank 1 on cuda:1): the
// background thread's copies, and the events it waits on, belong to that GPU.
TEST(DataLoader, DeliversBatchesOnASecondGpu) {
  TANDEM_REQUIRE_CUDA();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs, this machine has " << cuda::device_count();
  Dataset d = make_dataset(300);
  DataLoaderOptions o = make_options(32, true, 9);
  o.device = Device("cuda:1");
  DataLoader gpu(d.inputs, d.targets, o);
  DataLoader cpu(d.inputs, d.targets, make_options(32, true, 9));
  gpu.start_epoch(0);
  cpu.start_epoch(0);
  while (auto g = gpu.next()) {
    auto c = cpu.next();
    ASSERT_TRUE(c.has_value());
    EXPECT_EQ(g->inputs.device(), Device("cuda:1"));
    EXPECT_EQ(g->inputs.to_vector<float>(), c->inputs.to_vector<float>());
    EXPECT_EQ(g->targets.to_vector<int64_t>(), c->targets.to_vector<int64_t>());
  }
  EXPECT_FALSE(cpu.next().has_value());
}

}  // namespace
}  // namespace tandem::data
