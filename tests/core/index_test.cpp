// Indexing and joining: index_select, gather, cat and stack, checked by index formulas.
#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

Tensor random_index(const Shape& shape, int64_t low, int64_t high, DType dtype = DType::i64) {
  Generator gen(testing::next_seed());
  return randint(low, high, shape, dtype, &gen);
}

TEST(IndexSelect, AlongEachDimWithNegativeIndices) {
  Tensor x = testing::random_tensor({4, 5, 6});
  std::vector<double> v = x.to_double_vector();
  const Shape shape = x.shape();
  for (int64_t dim : {0, 1, 2, -1}) {
    int64_t d = dim < 0 ? dim + 3 : dim;
    int64_t size = shape[d];
    Tensor index = random_index({7}, -size, size);  // repeats and negative entries
    std::vector<int64_t> idx = index.to_vector<int64_t>();
    Tensor y = index_select(x, dim, index);
    Shape out_shape = shape;
    out_shape[d] = 7;
    ASSERT_EQ(y.shape(), out_shape);
    std::vector<double> got = y.to_double_vector();
    for (int64_t i = 0; i < out_shape[0]; ++i) {
      for (int64_t j = 0; j < out_shape[1]; ++j) {
        for (int64_t k = 0; k < out_shape[2]; ++k) {
          int64_t src[3] = {i, j, k};
          int64_t r = idx[src[d]];
          src[d] = r < 0 ? r + size : r;
          EXPECT_EQ(got[(i * out_shape[1] + j) * out_shape[2] + k], v[(src[0] * 5 + src[1]) * 6 + src[2]])
              << "dim " << dim;
        }
      }
    }
  }
}

TEST(IndexSelect, Int32IndexNonContiguousSourceAndOtherDTypes) {
  Tensor base = testing::random_tensor({6, 4});
  Tensor x = views::transpose(base, 0, 1);  // (4, 6)
  std::vector<double> b = base.to_double_vector();
  Tensor index = random_index({3}, 0, 6, DType::i32);
  std::vector<int64_t> idx = index.to_vector<int64_t>();
  std::vector<double> got = index_select(x, 1, index).to_double_vector();
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(got[i * 3 + j], b[idx[j] * 4 + i]);
  }
  for (DType d : {DType::f16, DType::i32, DType::u8, DType::boolean}) {
    Tensor y = to(random_index({5, 3}, 0, 4), d);
    Tensor rows = random_index({4}, 0, 5);
    std::vector<double> vy = y.to_double_vector(), out = index_select(y, 0, rows).to_double_vector();
    std::vector<int64_t> r = rows.to_vector<int64_t>();
    for (int64_t i = 0; i < 4; ++i) {
      for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(out[i * 3 + j], vy[r[i] * 3 + j]) << d;
    }
  }
  EXPECT_EQ(index_select(x, 0, empty({0}, DType::i64)).shape(), (Shape{0, 6}));
}

TEST(IndexSelect, OutOfRangeIndicesAreIndexErrors) {
  Tensor x = testing::random_tensor({3, 4});
  EXPECT_TRUE(testing::throws_with<IndexError>(
      [&] {
        index_select(x, 0, from_vector(std::vector<int64_t>{0, 3}));
      },
      {"index_select", "index 3", "size 3", "-3 to 2"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { index_select(x, 1, from_vector(std::vector<int64_t>{-5})); },
                                               {"index_select", "index -5", "size 4"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { index_select(x, 2, from_vector(std::vector<int64_t>{0})); },
                                               {"index_select", "dim 2"}));
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { index_select(x, 0, testing::random_tensor({2})); },
                                              {"index_select", "i64 or i32", "f64"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        index_select(x, 0, random_index({2, 2}, 0, 3));
      },
      {"index_select", "1-D", "[2, 2]"}));
}

TEST(Gather, AlongEachDim) {
  Tensor x = testing::random_tensor({3, 4, 5});
  std::vector<double> v = x.to_double_vector();
  for (int64_t dim : {0, 1, 2, -2}) {
    int64_t d = dim < 0 ? dim + 3 : dim;
    Shape index_shape = x.shape();
    index_shape[d] = 6;  // more picks than the dim holds: repeats
    Tensor index = random_index(index_shape, 0, x.shape()[d]);
    std::vector<int64_t> idx = index.to_vector<int64_t>();
    Tensor y = gather(x, dim, index);
    ASSERT_EQ(y.shape(), index_shape);
    std::vector<double> got = y.to_double_vector();
    for (int64_t i = 0; i < index_shape[0]; ++i) {
      for (int64_t j = 0; j < index_shape[1]; ++j) {
        for (int64_t k = 0; k < index_shape[2]; ++k) {
          int64_t pos = (i * index_shape[1] + j) * index_shape[2] + k;
          int64_t src[3] = {i, j, k};
          src[d] = idx[pos];
          EXPECT_EQ(got[pos], v[(src[0] * 4 + src[1]) * 5 + src[2]]) << "dim " << dim;
        }
      }
    }
  }
}

TEST(Gather, PicksOnePerRowLikeATargetLookup) {
  Tensor logits = views::transpose(testing::random_tensor({5, 8}), 0, 1);  // (8, 5), non-contiguous
  Tensor target = random_index({8, 1}, 0, 5, DType::i32);
  std::vector<double> got = gather(logits, 1, target).to_double_vector();
  std::vector<double> v = logits.to_double_vector();
  std::vector<int64_t> t = target.to_vector<int64_t>();
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(got[i], v[i * 5 + t[i]]);
}

TEST(Gather, BadIndices) {
  Tensor x = testing::random_tensor({3, 4});
  Tensor bad = from_vector(std::vector<int64_t>{0, 1, 4, 2, 0, 0}, {3, 2});
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { gather(x, 1, bad); }, {"gather", "index 4", "size 4"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        gather(x, 1, random_index({2, 2}, 0, 4));
      },
      {"gather", "[2, 2]", "[3, 4]", "except at dim 1"}));
  EXPECT_TRUE(
      testing::throws_with<ValueError>([&] { gather(x, 0, random_index({3}, 0, 3)); }, {"gather", "1 dims", "2"}));
}

TEST(Cat, AlongSeveralDimsWithDifferentSizes) {
  for (int64_t dim : {0, 1, 2, -1}) {
    int64_t d = dim < 0 ? dim + 3 : dim;
    std::vector<Tensor> parts;
    std::vector<int64_t> sizes = {2, 1, 4};
    for (int64_t s : sizes) {
      Shape shape = {3, 4, 5};
      shape[d] = s;
      parts.push_back(testing::random_tensor(shape));
    }
    Tensor y = cat(parts, dim);
    Shape shape = {3, 4, 5};
    shape[d] = 7;
    ASSERT_EQ(y.shape(), shape);
    std::vector<double> got = y.to_double_vector();
    std::vector<std::vector<double>> pv;
    for (const Tensor& p : parts) pv.push_back(p.to_double_vector());
    for (int64_t i = 0; i < shape[0]; ++i) {
      for (int64_t j = 0; j < shape[1]; ++j) {
        for (int64_t k = 0; k < shape[2]; ++k) {
          int64_t src[3] = {i, j, k};
          size_t part = 0;
          while (src[d] >= sizes[part]) src[d] -= sizes[part++];
          Shape ps = parts[part].shape();
          EXPECT_EQ(got[(i * shape[1] + j) * shape[2] + k], pv[part][(src[0] * ps[1] + src[1]) * ps[2] + src[2]])
              << "dim " << dim;
        }
      }
    }
  }
}

TEST(Cat, NonContiguousAndEmptyParts) {
  Tensor a = views::transpose(testing::random_tensor({3, 2}), 0, 1);  // (2, 3)
  Tensor b = empty({0, 3}, DType::f64);
  Tensor c = slice(testing::random_tensor({4, 6}), 1, 0, 6, 2);  // (4, 3)
  Tensor y = cat({a, b, c});
  EXPECT_EQ(y.shape(), (Shape{6, 3}));
  std::vector<double> expected = a.to_double_vector(), vc = c.to_double_vector();
  expected.insert(expected.end(), vc.begin(), vc.end());
  EXPECT_EQ(y.to_double_vector(), expected);
  Tensor single = testing::random_tensor({2, 2});
  EXPECT_EQ(cat({single}, 1).to_double_vector(), single.to_double_vector());
}

TEST(Cat, MismatchedInputsAreClearErrors) {
  Tensor a = testing::random_tensor({3, 3}), b = testing::random_tensor({2, 4});
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        cat({a, b}, 0);
      },
      {"cat", "tensor 1 has shape [2, 4]", "tensor 0 has [3, 3]", "except in dim 0"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        cat({a, testing::random_tensor({3})}, 0);
      },
      {"cat", "[3]", "same number of dims"}));
  EXPECT_TRUE(testing::throws_with<TypeError>(
      [&] {
        cat({a, testing::random_tensor({3, 3}, DType::f32)}, 0);
      },
      {"cat", "f64", "f32"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { cat({}, 0); }, {"cat", "at least one"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { cat({scalar_tensor(1.0)}, 0); }, {"cat", "0-dim"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { cat({a, a}, 2); }, {"cat", "dim 2"}));
}

TEST(Stack, AddsANewDim) {
  std::vector<Tensor> parts = {testing::random_tensor({2, 3}), testing::random_tensor({2, 3}),
                               views::transpose(testing::random_tensor({3, 2}), 0, 1)};
  std::vector<std::vector<double>> pv;
  for (const Tensor& p : parts) pv.push_back(p.to_double_vector());
  for (int64_t dim : {0, 1, 2, -1}) {
    Tensor y = stack(parts, dim);
    int64_t d = dim < 0 ? dim + 3 : dim;
    Shape shape = {2, 3};
    shape.insert(shape.begin() + d, 3);
    ASSERT_EQ(y.shape(), shape);
    std::vector<double> got = y.to_double_vector();
    for (int64_t i = 0; i < shape[0]; ++i) {
      for (int64_t j = 0; j < shape[1]; ++j) {
        for (int64_t k = 0; k < shape[2]; ++k) {
          int64_t idx[3] = {i, j, k};
          int64_t part = idx[d];
          std::vector<int64_t> rest;
          for (int64_t q = 0; q < 3; ++q) {
            if (q != d) rest.push_back(idx[q]);
          }
          EXPECT_EQ(got[(i * shape[1] + j) * shape[2] + k], pv[part][rest[0] * 3 + rest[1]]) << "dim " << dim;
        }
      }
    }
  }
  Tensor s = stack({scalar_tensor(1.5), scalar_tensor(-2.0)});
  EXPECT_EQ(s.to_double_vector(), (std::vector<double>{1.5, -2.0}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        stack({parts[0], testing::random_tensor({3, 2})});
      },
      {"stack", "tensor 1 has shape [3, 2]", "[2, 3]"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { stack(parts, 3); }, {"stack", "dim 3"}));
}

}  // namespace
}  // namespace tandem
