// all_gather_v and reduce_scatter_v: blocks of different sizes per rank (some empty), in place and
// not, against results each rank computes itself from every rank's regenerated input. ZeRO's
// shards cut buckets this way. GPU cases run on the NCCL group and skip where there is none.
#include "dist/dist_test_util.h"
#include "tandem/core/views.h"

namespace tandem::dist {
namespace {

using ::tandem::testing::all_close;
using ::tandem::testing::throws_with;
using testing::all_inputs;
using testing::device_of;
using testing::group_of;
using testing::rank_input;
using testing::reduce_all;
using testing::rtol_for;
using testing::shared_seed;

// (size,) block sizes drawn from the seed: 1 to 3000 elements, with one rank's block empty where
// there are several ranks.
std::vector<int64_t> block_counts(uint64_t seed, int size) {
  std::vector<int64_t> counts;
  for (int r = 0; r < size; ++r) counts.push_back(1 + static_cast<int64_t>((seed >> (4 * r)) % 3000));
  if (size > 1) counts[seed % size] = 0;
  return counts;
}

int64_t offset_of(const std::vector<int64_t>& counts, int rank) {
  int64_t offset = 0;
  for (int r = 0; r < rank; ++r) offset += counts[r];
  return offset;
}

int64_t total_of(const std::vector<int64_t>& counts) { return offset_of(counts, static_cast<int>(counts.size())); }

using BlockParam = std::tuple<DType, bool, bool>;  // dtype, gpu, in place

class BlockCollectives : public ::testing::TestWithParam<BlockParam> {
 protected:
  void SetUp() override {
    if (std::get<1>(GetParam())) TANDEM_REQUIRE_NCCL();
  }
};

TEST_P(BlockCollectives, AllGatherV) {
  auto [dtype, gpu, in_place] = GetParam();
  const World& w = world();
  uint64_t seed = shared_seed();
  std::vector<int64_t> counts = block_counts(seed, w.size);
  const int64_t total = total_of(counts), mine = counts[w.rank];
  // Every rank's block drawn as a slice of its own full-length input.
  Tensor input = rank_input(seed, w.rank, {total}, dtype);                             // (total,)
  Tensor whole = kernels::to_device(full({total}, 3, dtype), device_of(gpu));          // (total,)
  Tensor block = views::narrow(whole, 0, offset_of(counts, w.rank), mine);
  Tensor part = in_place ? block : kernels::to_device(zeros({mine}, dtype), device_of(gpu));  // (mine,)
  kernels::copy_(part, views::narrow(input, 0, offset_of(counts, w.rank), mine));
  group_of(gpu).all_gather_v(whole, part, counts, "blocks")->wait();
  std::vector<std::vector<double>> inputs = all_inputs(seed, w.size, {total}, dtype);
  std::vector<double> expected;
  for (int r = 0; r < w.size; ++r) {
    auto from = inputs[r].begin() + offset_of(counts, r);
    expected.insert(expected.end(), from, from + counts[r]);
  }
  EXPECT_TRUE(all_close(whole, expected, 0.0, 0.0));
}

TEST_P(BlockCollectives, ReduceScatterV) {
  auto [dtype, gpu, in_place] = GetParam();
  const World& w = world();
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
    uint64_t seed = shared_seed();
    std::vector<int64_t> counts = block_counts(seed, w.size);
    const int64_t total = total_of(counts), mine = counts[w.rank], at = offset_of(counts, w.rank);
    Tensor whole = kernels::to_device(rank_input(seed, w.rank, {total}, dtype), device_of(gpu));  // (total,)
    Tensor part = in_place ? views::narrow(whole, 0, at, mine)
                           : kernels::to_device(full({mine}, 7, dtype), device_of(gpu));  // (mine,)
    group_of(gpu).reduce_scatter_v(part, whole, counts, op, "blocks")->wait();
    std::vector<double> all = reduce_all(all_inputs(seed, w.size, {total}, dtype), op, dtype);
    std::vector<double> expected(all.begin() + at, all.begin() + at + mine);
    EXPECT_TRUE(all_close(part, expected, rtol_for(dtype), 0.0)) << reduce_op_name(op);
  }
}

std::string block_name(const ::testing::TestParamInfo<BlockParam>& info) {
  return std::string(dtype_name(std::get<0>(info.param))) + (std::get<1>(info.param) ? "_gpu" : "_cpu") +
         (std::get<2>(info.param) ? "_in_place" : "");
}

// MPI reduces 32- and 64-bit types only (16-bit floats only travel there); NCCL reduces bf16 too.
INSTANTIATE_TEST_SUITE_P(Cpu, BlockCollectives,
                         ::testing::Combine(::testing::Values(DType::f32, DType::f64, DType::i64),
                                            ::testing::Values(false), ::testing::Bool()),
                         block_name);
INSTANTIATE_TEST_SUITE_P(Gpu, BlockCollectives,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::Values(true), ::testing::Bool()),
                         block_name);

class BlockCollectiveErrors : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) TANDEM_REQUIRE_NCCL();
  }
};

TEST_P(BlockCollectiveErrors, NameWhatDoesNotFit) {
  const bool gpu = GetParam();
  const World& w = world();
  ProcessGroup& group = group_of(gpu);
  std::vector<int64_t> counts(w.size, 5);
  Tensor whole = kernels::to_device(randn({5 * w.size}), device_of(gpu));
  Tensor part = kernels::to_device(randn({5}), device_of(gpu));
  std::vector<int64_t> short_list(w.size + 1, 5);
  EXPECT_TRUE(throws_with<ValueError>([&] { group.all_gather_v(whole, part, short_list); },
                                      {"all_gather_v", "block sizes given for a group of"}));
  std::vector<int64_t> negative = counts;
  negative[0] = -1;
  EXPECT_TRUE(throws_with<ValueError>([&] { group.reduce_scatter_v(part, whole, negative); },
                                      {"reduce_scatter_v", "rank 0's block size is -1"}));
  std::vector<int64_t> more = counts;
  more[w.size - 1] = 6;
  EXPECT_TRUE(throws_with<ValueError>([&] { group.all_gather_v(whole, part, more); }, {"the blocks add up to"}));
  Tensor wrong_part = kernels::to_device(randn({4}), device_of(gpu));
  EXPECT_TRUE(throws_with<ValueError>([&] { group.reduce_scatter_v(wrong_part, whole, counts); },
                                      {"part has 4 elements", "block has 5"}));
  Tensor other = kernels::to_device(randn({5}, DType::f64), device_of(gpu));
  EXPECT_TRUE(throws_with<TypeError>([&] { group.all_gather_v(whole, other, counts); }, {"f32", "f64"}));
}

INSTANTIATE_TEST_SUITE_P(All, BlockCollectiveErrors, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return testing::device_label(info.param); });

}  // namespace
}  // namespace tandem::dist
