// Seeded counter-based random numbers: reproducibility, Generator offsets, distribution
// statistics, and Philox4x32-10 against the Random123 known answers.
#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "support/test_util.h"
#include "tandem/core/philox.h"

namespace tandem {
namespace {

constexpr int64_t kSamples = 100000;
constexpr double kSigmas = 5.0;  // a correct generator fails one check in ~1.7 million

struct Moments {
  double mean = 0;
  double var = 0;  // with Bessel's correction
};

Moments moments(const std::vector<double>& v) {
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(v.size() - 1);
  return m;
}

// Philox4x32-10 over a full 4-word counter and 2-word key, written from the published
// algorithm (Salmon et al., SC'11; Random123's philox4x32_R): each round multiplies words 0
// and 2, swaps the pairs and mixes in the key; the key is bumped by the Weyl constants between rounds.
std::array<uint32_t, 4> reference_philox(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += 0x9E3779B9u;
      key[1] += 0xBB67AE85u;
    }
    uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * ctr[0];
    uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * ctr[2];
    auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
  }
  return ctr;
}

TEST(Philox, KnownAnswerForZeroSeedAndCounter) {
  philox::Block b = philox::generate(0, 0);
  EXPECT_EQ(b.w[0], 0x6627e8d5u);
  EXPECT_EQ(b.w[1], 0xe169c58du);
  EXPECT_EQ(b.w[2], 0xbc57ac4cu);
  EXPECT_EQ(b.w[3], 0x9b00dbd8u);
}

TEST(Philox, ReferenceMatchesAllRandom123KnownAnswers) {
  // The all-ones and pi vectors set counter words 2 and 3, which tandem's layout (counter in
  // words 0-1, words 2-3 zero) never reaches; they validate the reference used below instead.
  EXPECT_EQ(reference_philox({0, 0, 0, 0}, {0, 0}),
            (std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(reference_philox({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}),
            (std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(reference_philox({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}),
            (std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Philox, GenerateMatchesTheReferenceOnRandomSeedsAndCounters) {
  std::mt19937_64 rng(testing::next_seed());
  for (int i = 0; i < 2000; ++i) {
    uint64_t seed = rng(), counter = rng();
    if (i % 4 == 1) counter &= 0xffffffffu;  // small counters, as most draws use
    philox::Block b = philox::generate(seed, counter);
    std::array<uint32_t, 4> r =
        reference_philox({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0},
                         {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
    ASSERT_EQ((std::array<uint32_t, 4>{b.w[0], b.w[1], b.w[2], b.w[3]}), r)
        << "seed " << seed << " counter " << counter;
  }
}

TEST(Philox, UnitDoublesAreInHalfOpenRange) {
  EXPECT_EQ(philox::to_unit(0, 0), 0.0);
  EXPECT_LT(philox::to_unit(0xffffffffu, 0xffffffffu), 1.0);
  EXPECT_EQ(philox::to_unit(0x80000000u, 0), 0.5);
}

TEST(Generator, SameSeedGivesTheSameNumbers) {
  uint64_t seed = testing::next_seed();
  Generator g1(seed), g2(seed);
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    EXPECT_EQ(rand({100}, d, &g1).to_double_vector(), rand({100}, d, &g2).to_double_vector()) << d;
    EXPECT_EQ(randn({7, 3}, d, &g1).to_double_vector(), randn({7, 3}, d, &g2).to_double_vector()) << d;
  }
  EXPECT_EQ(randint(-5, 5, {50}, DType::i64, &g1).to_double_vector(),
            randint(-5, 5, {50}, DType::i64, &g2).to_double_vector());
  EXPECT_EQ(randperm(30, &g1).to_double_vector(), randperm(30, &g2).to_double_vector());
}

TEST(Generator, DifferentSeedsDiffer) {
  uint64_t seed = testing::next_seed();
  Generator g1(seed), g2(seed + 1);
  std::vector<double> a = rand({64}, DType::f64, &g1).to_double_vector();
  std::vector<double> b = rand({64}, DType::f64, &g2).to_double_vector();
  int equal = 0;
  for (size_t i = 0; i < a.size(); ++i) equal += a[i] == b[i];
  EXPECT_EQ(equal, 0);
  EXPECT_NE(randperm(50, &g1).to_double_vector(), randperm(50, &g2).to_double_vector());
}

TEST(Generator, DrawsAdvanceTheOffsetByTheirSize) {
  uint64_t seed = testing::next_seed();
  Generator g(seed);
  EXPECT_EQ(g.seed(), seed);
  EXPECT_EQ(g.offset(), 0u);
  rand({3, 4}, DType::f32, &g);
  EXPECT_EQ(g.offset(), 12u);
  randn({5}, DType::f64, &g);
  EXPECT_EQ(g.offset(), 17u);
  randperm(6, &g);
  EXPECT_EQ(g.offset(), 23u);
  EXPECT_EQ(g.advance(7), 23u);
  EXPECT_EQ(g.offset(), 30u);
  g.manual_seed(seed + 1);
  EXPECT_EQ(g.seed(), seed + 1);
  EXPECT_EQ(g.offset(), 0u);
}

TEST(Generator, ElementIUsesCounterOffsetPlusI) {
  uint64_t seed = testing::next_seed();
  Generator whole(seed);
  std::vector<double> all = rand({10}, DType::f64, &whole).to_double_vector();
  // Two draws of 4 and 6 give the same stream as one draw of 10.
  Generator parts(seed);
  std::vector<double> first = rand({4}, DType::f64, &parts).to_double_vector();
  std::vector<double> second = rand({2, 3}, DType::f64, &parts).to_double_vector();
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_EQ(first, all);
  // Restoring (seed, offset) resumes the stream exactly.
  Generator resumed;
  resumed.set_state(seed, 7);
  std::vector<double> tail = rand({3}, DType::f64, &resumed).to_double_vector();
  EXPECT_EQ(tail, std::vector<double>(all.begin() + 7, all.end()));
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], philox::uniform(seed, i));
}

TEST(Generator, DefaultGeneratorFollowsManualSeed) {
  uint64_t seed = testing::next_seed();
  manual_seed(seed);
  EXPECT_EQ(default_generator().seed(), seed);
  EXPECT_EQ(default_generator().offset(), 0u);
  std::vector<double> a = randn({20}, DType::f64).to_double_vector();
  EXPECT_EQ(default_generator().offset(), 20u);
  manual_seed(seed);
  EXPECT_EQ(randn({20}, DType::f64).to_double_vector(), a);
  Generator explicit_gen(seed);
  EXPECT_EQ(randn({20}, DType::f64, &explicit_gen).to_double_vector(), a);
}

TEST(Generator, LowerPrecisionDrawsRoundTheSameStream) {
  uint64_t seed = testing::next_seed();
  Generator g64(seed), g32(seed);
  std::vector<double> d = randn({256}, DType::f64, &g64).to_double_vector();
  std::vector<double> f = randn({256}, DType::f32, &g32).to_double_vector();
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(f[i], static_cast<double>(static_cast<float>(d[i])));
}

TEST(Distributions, UniformMeanAndVariance) {
  Generator gen(testing::next_seed());
  double low = -1.5, high = 2.5, width = high - low;
  std::vector<double> v = uniform({kSamples}, low, high, DType::f64, &gen).to_double_vector();
  for (double x : v) ASSERT_TRUE(x >= low && x < high) << x;
  Moments m = moments(v);
  double var = width * width / 12.0;
  EXPECT_NEAR(m.mean, (low + high) / 2.0, kSigmas * std::sqrt(var / kSamples));
  double mu4 = std::pow(width, 4) / 80.0;
  EXPECT_NEAR(m.var, var, kSigmas * std::sqrt((mu4 - var * var) / kSamples));
}

TEST(Distributions, UniformStaysBelowHighInEveryFloatDType) {
  // Rounding a draw just below `high` to a narrow dtype must not produce `high` itself.
  for (DType d : {DType::f32, DType::f16, DType::bf16}) {
    Generator gen(testing::next_seed());
    std::vector<double> v = rand({kSamples}, d, &gen).to_double_vector();
    double top = *std::max_element(v.begin(), v.end());
    double bottom = *std::min_element(v.begin(), v.end());
    EXPECT_LT(top, 1.0) << d;
    EXPECT_GE(bottom, 0.0) << d;
    EXPECT_NEAR(moments(v).mean, 0.5, kSigmas * std::sqrt(1.0 / 12.0 / kSamples) + (d == DType::bf16 ? 4e-3 : 5e-4))
        << d;
    std::vector<double> w = uniform({kSamples}, -3.0, -1.0, d, &gen).to_double_vector();
    EXPECT_LT(*std::max_element(w.begin(), w.end()), -1.0) << d;
    EXPECT_GE(*std::min_element(w.begin(), w.end()), -3.0) << d;
  }
}

TEST(Distributions, NormalMeanAndVariance) {
  Generator gen(testing::next_seed());
  double mu = 0.75, sigma = 2.0;
  std::vector<double> v = normal({kSamples}, mu, sigma, DType::f64, &gen).to_double_vector();
  Moments m = moments(v);
  EXPECT_NEAR(m.mean, mu, kSigmas * sigma / std::sqrt(static_cast<double>(kSamples)));
  EXPECT_NEAR(m.var, sigma * sigma, kSigmas * sigma * sigma * std::sqrt(2.0 / kSamples));
  // The fraction within one sigma is 0.6827 for a normal.
  double p = 0.682689492137;
  double inside = 0;
  for (double x : v) inside += std::fabs(x - mu) < sigma;
  EXPECT_NEAR(inside / kSamples, p, kSigmas * std::sqrt(p * (1 - p) / kSamples));
  for (double x : v) ASSERT_TRUE(std::isfinite(x));
  Moments standard = moments(randn({kSamples}, DType::f32, &gen).to_double_vector());
  EXPECT_NEAR(standard.mean, 0.0, kSigmas / std::sqrt(static_cast<double>(kSamples)));
  EXPECT_NEAR(standard.var, 1.0, kSigmas * std::sqrt(2.0 / kSamples));
}

TEST(Distributions, BernoulliMean) {
  for (double p : {0.1, 0.5, 0.83}) {
    Generator gen(testing::next_seed());
    std::vector<double> v = bernoulli({kSamples}, p, DType::f32, &gen).to_double_vector();
    for (double x : v) ASSERT_TRUE(x == 0.0 || x == 1.0);
    EXPECT_NEAR(moments(v).mean, p, kSigmas * std::sqrt(p * (1 - p) / kSamples)) << p;
  }
  Generator gen(testing::next_seed());
  EXPECT_EQ(bernoulli({100}, 0.0, DType::f64, &gen).to_double_vector(), std::vector<double>(100, 0.0));
  EXPECT_EQ(bernoulli({100}, 1.0, DType::f64, &gen).to_double_vector(), std::vector<double>(100, 1.0));
}

TEST(Distributions, RandintCoversItsRangeUniformly) {
  Generator gen(testing::next_seed());
  int64_t low = -3, high = 7;
  Tensor t = randint(low, high, {kSamples / 10, 10}, DType::i64, &gen);
  EXPECT_EQ(t.dtype(), DType::i64);
  EXPECT_EQ(t.shape(), (Shape{kSamples / 10, 10}));
  std::vector<double> v = t.to_double_vector();
  std::vector<int64_t> counts(static_cast<size_t>(high - low), 0);
  for (double x : v) {
    ASSERT_TRUE(x >= low && x < high && x == std::floor(x)) << x;
    ++counts[static_cast<size_t>(x - low)];
  }
  double expected = static_cast<double>(kSamples) / static_cast<double>(high - low), q = 1.0 / (high - low);
  for (int64_t c : counts) EXPECT_NEAR(c, expected, kSigmas * std::sqrt(kSamples * q * (1 - q)));
  double span = static_cast<double>(high - low);
  EXPECT_NEAR(moments(v).mean, (low + high - 1) / 2.0, kSigmas * std::sqrt((span * span - 1) / 12.0 / kSamples));
  EXPECT_EQ(randint(0, 5, {4}, DType::i32, &gen).dtype(), DType::i32);
  std::vector<double> one = randint(4, 5, {20}, DType::i64, &gen).to_double_vector();
  EXPECT_EQ(one, std::vector<double>(20, 4.0));
}

TEST(Distributions, RandpermIsAPermutation) {
  Generator gen(testing::next_seed());
  for (int64_t n : {0, 1, 2, 17, 1000}) {
    Tensor p = randperm(n, &gen);
    EXPECT_EQ(p.dtype(), DType::i64);
    EXPECT_EQ(p.shape(), (Shape{n}));
    std::vector<int64_t> v = p.to_vector<int64_t>();
    std::sort(v.begin(), v.end());
    std::vector<int64_t> iota(static_cast<size_t>(n));
    std::iota(iota.begin(), iota.end(), 0);
    EXPECT_EQ(v, iota) << n;
  }
  // Each position takes each value about equally often.
  const int64_t n = 5, trials = 20000;
  std::vector<std::vector<int64_t>> hits(n, std::vector<int64_t>(n, 0));
  for (int64_t t = 0; t < trials; ++t) {
    std::vector<int64_t> v = randperm(n, &gen).to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i) ++hits[i][v[i]];
  }
  double q = 1.0 / n;
  for (const auto& row : hits) {
    for (int64_t h : row) EXPECT_NEAR(h, trials * q, kSigmas * std::sqrt(trials * q * (1 - q)));
  }
}

TEST(Distributions, BadArguments) {
  EXPECT_TRUE(testing::throws_with<ValueError>([] { uniform({2}, 1.0, 0.0); }, {"uniform", "low 1", "high 0"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([] { normal({2}, 0.0, -1.0); }, {"normal", "std", "-1"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([] { bernoulli({2}, 1.5); }, {"bernoulli", "[0, 1]", "1.5"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([] { randint(3, 3, {2}); }, {"randint", "low 3", "high 3"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([] { randperm(-1); }, {"randperm", "-1"}));
  EXPECT_TRUE(testing::throws_with<TypeError>([] { rand({2}, DType::i64); }, {"random", "floating-point", "i64"}));
}

}  // namespace
}  // namespace tandem
