// copy_each_: every pair ends as copy_ would leave it, whether it goes in the batched call (dense in
// one layout, one dtype, one device) or one copy_ on its own (a cast, other strides, another
// device); bad pairs are named.
#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

// Pairs of every kind on `device`: (destination, source, what copy_ leaves in the destination).
struct Pair {
  Tensor dst, src;
  std::string what;
};

std::vector<Pair> mixed_pairs(Device device) {
  auto on = [&](const Tensor& t) { return t.to(device); };
  std::vector<Pair> pairs;
  // Dense pairs of several dtypes and sizes (a lone element, a byte count that is no multiple of
  // 16, more than one 64 KiB chunk), and views that start off a 16-byte boundary.
  for (const auto& [shape, dtype] : std::vector<std::pair<Shape, DType>>{
           {{1}, DType::f32}, {{7}, DType::bf16}, {{3, 5}, DType::f16}, {{100003}, DType::f32},
           {{257, 129}, DType::bf16}, {{9}, DType::i64}, {{33000}, DType::f64}}) {
    Tensor src = dtype == DType::i64 ? testing::random_indices(shape_numel(shape), -1000, 1000, shape)
                                     : testing::random_tensor(shape, dtype);
    pairs.push_back({on(empty(shape, dtype)), on(src), "dense " + shape_str(shape)});
  }
  Tensor src_all = on(testing::random_tensor({1001}, DType::bf16)), dst_all = on(zeros({1001}, DType::bf16));
  pairs.push_back({views::narrow(dst_all, 0, 3, 997), views::narrow(src_all, 0, 1, 997), "unaligned views"});
  // Channels-last in channels-last: dense with the same strides, batched.
  Tensor cl = on(testing::random_tensor({2, 5, 3, 4}, DType::f32)).to(MemoryFormat::channels_last);
  pairs.push_back({on(empty({2, 5, 3, 4}, DType::f32)).to(MemoryFormat::channels_last), cl, "channels-last"});
  // Each on its own: a cast, a transposed source, another layout, an empty pair.
  pairs.push_back({on(empty({4, 6}, DType::f32)), on(testing::random_tensor({4, 6}, DType::bf16)), "cast"});
  pairs.push_back({on(empty({6, 4}, DType::f32)), views::transpose(on(testing::random_tensor({4, 6}, DType::f32)), 0, 1),
                   "transposed source"});
  pairs.push_back({on(empty({2, 5, 3, 4}, DType::f32)), cl, "channels-last into contiguous"});
  pairs.push_back({on(empty({0, 3}, DType::f32)), on(empty({0, 3}, DType::f32)), "empty"});
  return pairs;
}

void expect_each_copied(Device device) {
  std::vector<Pair> pairs = mixed_pairs(device);
  std::vector<Tensor> dsts, srcs;
  for (const Pair& p : pairs) {
    dsts.push_back(p.dst);
    srcs.push_back(p.src);
  }
  kernels::copy_each_(dsts, srcs);
  for (const Pair& p : pairs) {
    SCOPED_TRACE(p.what);
    Tensor expected = empty(p.dst.shape(), TensorOptions(p.dst.dtype(), Device("cpu")));
    kernels::copy_(expected, p.src.to(Device("cpu")));
    EXPECT_TRUE(testing::bits_match(p.dst.to(Device("cpu")), expected));
  }
}

TEST(CopyEach, LeavesEveryPairAsCopyDoesOnTheCpu) { expect_each_copied(Device("cpu")); }

TEST(CopyEach, LeavesEveryPairAsCopyDoesOnCuda) {
  TANDEM_REQUIRE_CUDA();
  expect_each_copied(Device("cuda"));
}

TEST(CopyEach, ManyPairsTakeSeveralLaunchesOnCuda) {
  TANDEM_REQUIRE_CUDA();
  std::vector<Tensor> dsts, srcs;  // 70 pairs: three launches of up to 32
  for (int i = 0; i < 70; ++i) {
    const Shape shape = {1 + (i * 37) % 300};
    srcs.push_back(testing::random_tensor(shape, DType::bf16).to(Device("cuda")));
    dsts.push_back(empty(shape, TensorOptions(DType::bf16, Device("cuda"))));
  }
  kernels::copy_each_(dsts, srcs);
  for (int i = 0; i < 70; ++i) {
    EXPECT_TRUE(testing::bits_match(dsts[i].to(Device("cpu")), srcs[i].to(Device("cpu")))) << "pair " << i;
  }
}

TEST(CopyEach, NamesAMismatch) {
  Tensor a = zeros({2, 3}), b = zeros({3, 2});
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { kernels::copy_each_({a}, {a, a}); },
                                               {"copy_each_: 1 destinations for 2 sources"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { kernels::copy_each_({a, a}, {a, b}); },
                                               {"copy_each_: pair 1 has shapes [2, 3] (destination) and [3, 2] (source)"}));
}

}  // namespace
}  // namespace tandem
