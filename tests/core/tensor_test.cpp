// Tensor metadata, factories, element access, dtype conversion, storage sharing and printing.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::all_close;

const DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16,
                            DType::i32, DType::i64, DType::u8,  DType::boolean};

std::string printed(const Tensor& t) {
  std::ostringstream out;
  out << t;
  return out.str();
}

TEST(TensorFactories, EmptyHasContiguousLayout) {
  Tensor t = empty({2, 3, 4});
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.device(), Device("cpu"));
  EXPECT_EQ(t.offset(), 0);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.element_size(), 4u);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_GE(t.storage().nbytes(), 96u);
}

TEST(TensorFactories, EmptyWithZeroSizedDims) {
  Tensor t = empty({3, 0, 2}, DType::i64);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.nbytes(), 0u);
  EXPECT_TRUE(t.to_double_vector().empty());
  EXPECT_TRUE(testing::throws_with<ValueError>([] { empty({2, -1}); }, {"empty", "negative size", "[2, -1]"}));
}

TEST(TensorFactories, ZerosOnesFullInEveryDType) {
  for (DType d : kAllDTypes) {
    Tensor z = zeros({2, 3}, d), o = ones({4}, d), f = full({3, 1}, 1.0, d);
    EXPECT_EQ(z.dtype(), d);
    EXPECT_EQ(o.dtype(), d);
    EXPECT_EQ(f.shape(), (Shape{3, 1}));
    EXPECT_EQ(z.to_double_vector(), std::vector<double>(6, 0.0)) << d;
    EXPECT_EQ(o.to_double_vector(), std::vector<double>(4, 1.0)) << d;
    EXPECT_EQ(f.to_double_vector(), std::vector<double>(3, 1.0)) << d;
  }
  EXPECT_EQ(full({2}, -7.0, DType::i32).to_vector<int>(), (std::vector<int>{-7, -7}));
  // full rounds the value to the dtype like a conversion would.
  EXPECT_EQ(full({2}, 0.1, DType::f16).to_double_vector()[0], static_cast<double>(static_cast<float>(Half(0.1f))));
  EXPECT_EQ(full({2}, 0.1, DType::bf16).to_double_vector()[1], static_cast<double>(static_cast<float>(BFloat16(0.1f))));
  EXPECT_EQ(full({1}, 2.5, DType::boolean).item(), 1.0);
}

TEST(TensorFactories, Arange) {
  EXPECT_EQ(arange(0.0, 10.0, 3.0).to_double_vector(), (std::vector<double>{0, 3, 6, 9}));
  EXPECT_EQ(arange(1.0, 2.0, 0.25).to_double_vector(), (std::vector<double>{1, 1.25, 1.5, 1.75}));
  EXPECT_EQ(arange(5.0, 0.0, -2.0).to_double_vector(), (std::vector<double>{5, 3, 1}));
  EXPECT_EQ(arange(2.0, 2.0).numel(), 0);
  Tensor i = arange(5);
  EXPECT_EQ(i.dtype(), DType::i64);
  EXPECT_EQ(i.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(0.0, 3.0, 1.0, DType::f64).dtype(), DType::f64);
  EXPECT_TRUE(testing::throws_with<ValueError>([] { arange(0.0, 1.0, 0.0); }, {"arange", "step", "non-zero"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([] { arange(0.0, 5.0, -1.0); }, {"arange", "[0, 5)", "step -1"}));
}

TEST(TensorFactories, FromVectorAndTensor) {
  std::vector<double> values = testing::random_tensor({6}).to_double_vector();
  Tensor a = from_vector(values, {2, 3}, DType::f64);
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(a.to_double_vector(), values);
  Tensor flat = from_vector(values, {}, DType::f64);
  EXPECT_EQ(flat.shape(), (Shape{6}));

  std::vector<float> fvalues(values.begin(), values.end());
  Tensor f = from_vector(fvalues, {3, 2});
  EXPECT_EQ(f.dtype(), DType::f32);
  EXPECT_EQ(f.to_vector<float>(), fvalues);

  // Large integers survive exactly through the i64 overload.
  std::vector<int64_t> big = {(int64_t{1} << 53) + 1, -(int64_t{1} << 60) - 3, 7};
  EXPECT_EQ(from_vector(big).to_vector<int64_t>()[2], 7);
  Tensor b = from_vector(big);
  EXPECT_EQ(b.dtype(), DType::i64);
  EXPECT_EQ(b.data<int64_t>()[0], big[0]);
  EXPECT_EQ(b.data<int64_t>()[1], big[1]);

  Tensor t = tensor({values[0], values[1], values[2]}, DType::f64);
  EXPECT_EQ(t.shape(), (Shape{3}));
  EXPECT_EQ(t.to_double_vector(), (std::vector<double>{values[0], values[1], values[2]}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        from_vector(values, {4, 2});
      },
      {"from_vector", "6 values", "[4, 2]"}));
}

TEST(TensorFactories, ScalarTensorIsZeroDim) {
  double v = testing::random_tensor({1}).item();
  Tensor s = scalar_tensor(v, DType::f64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_TRUE(s.shape().empty());
  EXPECT_TRUE(s.is_contiguous());
  EXPECT_EQ(s.item(), v);
  EXPECT_EQ(scalar_tensor(3.0, DType::i32).item<int>(), 3);
}

TEST(TensorFactories, LikeFactoriesCopyShapeDTypeAndDevice) {
  Tensor x = views::transpose(testing::random_tensor({3, 4}, DType::f16), 0, 1);
  for (Tensor y : {empty_like(x), zeros_like(x), ones_like(x), full_like(x, 2.0)}) {
    EXPECT_EQ(y.shape(), (Shape{4, 3}));
    EXPECT_EQ(y.dtype(), DType::f16);
    EXPECT_EQ(y.device(), x.device());
    EXPECT_TRUE(y.is_contiguous());
    EXPECT_FALSE(y.storage().is_same(x.storage()));
  }
  EXPECT_EQ(zeros_like(x).to_double_vector(), std::vector<double>(12, 0.0));
  EXPECT_EQ(ones_like(x).to_double_vector(), std::vector<double>(12, 1.0));
  EXPECT_EQ(full_like(x, 2.0).to_double_vector(), std::vector<double>(12, 2.0));
}

TEST(TensorMetadata, SizesStridesAndNegativeDims) {
  Tensor t = testing::random_tensor({2, 3, 5});
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 5);
  EXPECT_EQ(t.size(-3), 2);
  EXPECT_EQ(t.stride(0), 15);
  EXPECT_EQ(t.stride(-2), 5);
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { t.size(3); }, {"size", "dim 3", "3 dims", "-3 to 2"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { t.stride(-4); }, {"stride", "dim -4"}));
}

TEST(TensorMetadata, SizeOfAZeroDimTensorIsAnIndexError) {
  Tensor s = scalar_tensor(1.5);
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { s.size(0); }, {"size", "0 dims"}));
  EXPECT_TRUE(testing::throws_with<IndexError>([&] { s.stride(-1); }, {"stride", "0 dims"}));
}

TEST(TensorMetadata, ContiguityFlag) {
  Tensor t = testing::random_tensor({4, 6});
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(views::transpose(t, 0, 1).is_contiguous());
  EXPECT_TRUE(views::narrow(t, 0, 1, 2).is_contiguous());   // whole rows: still dense
  EXPECT_FALSE(views::narrow(t, 1, 1, 2).is_contiguous());  // part of each row: gaps
  EXPECT_FALSE(views::expand(views::narrow(t, 0, 0, 1), {3, 6}).is_contiguous());
  // The stride of a size-1 dim never matters.
  EXPECT_TRUE(t.as_strided({4, 1, 6}, {6, 100, 1}, 0).is_contiguous());
  EXPECT_TRUE(views::transpose(views::narrow(t, 0, 2, 1), 0, 1).as_strided({6}, {1}, 12).is_contiguous());
}

TEST(TensorMetadata, AsStridedChecksTheStorageBounds) {
  Tensor t = testing::random_tensor({6});
  Tensor v = t.as_strided({2, 2}, {3, 1}, 1);  // elements 1, 2, 4, 5
  std::vector<double> all = t.to_double_vector();
  EXPECT_EQ(v.to_double_vector(), (std::vector<double>{all[1], all[2], all[4], all[5]}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      [&] {
        t.as_strided({2, 3}, {3, 1}, 1);
      },
      {"[2, 3]", "needs 56 bytes", "holds"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { t.as_strided({2}, {1, 1}, 0); }, {"different lengths"}));
}

TEST(TensorMetadata, UndefinedTensorIsAClearError) {
  Tensor u;
  EXPECT_FALSE(u.defined());
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { u.numel(); }, {"undefined tensor"}));
  EXPECT_EQ(printed(u), "Tensor(undefined)");
}

TEST(TensorAccess, ItemAndToVector) {
  Tensor x = testing::random_tensor({2, 3});
  std::vector<double> values = x.to_double_vector();
  ASSERT_EQ(values.size(), 6u);
  const double* raw = x.data<double>();
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(values[i], raw[i]);
  std::vector<float> as_float = x.to_vector<float>();
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(as_float[i], static_cast<float>(values[i]));
  EXPECT_EQ(views::narrow(views::narrow(x, 0, 1, 1), 1, 2, 1).item(), values[5]);
  EXPECT_EQ(views::reshape(views::narrow(x, 1, 0, 1), {2}).to_double_vector(),
            (std::vector<double>{values[0], values[3]}));
  // item<T> converts.
  Tensor i = from_vector(std::vector<int64_t>{-42});
  EXPECT_EQ(i.item<int64_t>(), -42);
  EXPECT_EQ(i.item<int>(), -42);
}

TEST(TensorAccess, DataChecksTheElementType) {
  Tensor x = testing::random_tensor({3}, DType::f32);
  EXPECT_NE(x.data<float>(), nullptr);
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { x.data<double>(); }, {"data<f64>", "holds f32"}));
}

// Small integers are exact in every dtype, so converting between any two dtypes must preserve them
// (bool keeps only "non-zero").
TEST(TensorConversion, RoundTripsBetweenAllDTypes) {
  Generator gen(testing::next_seed());
  Tensor ints = randint(0, 100, {3, 5}, DType::i64, &gen);
  std::vector<double> expected = ints.to_double_vector();
  std::vector<double> expected_bool(expected.size());
  for (size_t i = 0; i < expected.size(); ++i) expected_bool[i] = expected[i] != 0 ? 1.0 : 0.0;
  for (DType from : kAllDTypes) {
    Tensor a = to(ints, from);
    EXPECT_EQ(a.dtype(), from);
    for (DType to_dtype : kAllDTypes) {
      Tensor b = to(a, to_dtype);
      EXPECT_EQ(b.dtype(), to_dtype);
      EXPECT_EQ(b.shape(), ints.shape());
      bool through_bool = from == DType::boolean || to_dtype == DType::boolean;
      EXPECT_EQ(b.to_double_vector(), through_bool ? expected_bool : expected) << from << " -> " << to_dtype;
      EXPECT_EQ(to(b, from).to_double_vector(), through_bool ? expected_bool : expected)
          << from << " -> " << to_dtype << " -> " << from;
    }
  }
}

TEST(TensorConversion, FloatNarrowingRoundsLikeTheScalarTypes) {
  Tensor x = testing::random_tensor({64}, DType::f64);
  std::vector<double> v = x.to_double_vector();
  std::vector<double> f32 = to(x, DType::f32).to_double_vector();
  std::vector<double> f16 = to(x, DType::f16).to_double_vector();
  std::vector<double> bf16 = to(x, DType::bf16).to_double_vector();
  for (size_t i = 0; i < v.size(); ++i) {
    auto f = static_cast<float>(v[i]);
    EXPECT_EQ(f32[i], static_cast<double>(f));
    EXPECT_EQ(f16[i], static_cast<double>(static_cast<float>(Half(f))));
    EXPECT_EQ(bf16[i], static_cast<double>(static_cast<float>(BFloat16(f))));
  }
  // Float to integer truncates toward zero; float to bool is "non-zero".
  Tensor fr = from_vector(std::vector<double>{-2.75, -0.5, 0.0, 0.5, 3.99}, {}, DType::f64);
  EXPECT_EQ(to(fr, DType::i32).to_double_vector(), (std::vector<double>{-2, 0, 0, 0, 3}));
  EXPECT_EQ(to(fr, DType::boolean).to_double_vector(), (std::vector<double>{1, 1, 0, 1, 1}));
}

TEST(TensorConversion, ToSameDTypeReturnsTheSameTensor) {
  Tensor x = testing::random_tensor({3});
  EXPECT_TRUE(to(x, DType::f64).is_same(x));
  EXPECT_TRUE(kernels::to_dtype(x, DType::f64).is_same(x));
  EXPECT_TRUE(kernels::to_device(x, Device("cpu")).is_same(x));
}

TEST(TensorConversion, NonContiguousSourceConvertsInLogicalOrder) {
  Tensor x = testing::random_tensor({3, 4});
  Tensor xt = views::transpose(x, 0, 1);
  std::vector<double> v = x.to_double_vector();
  std::vector<double> got = to(xt, DType::f32).to_double_vector();
  for (int64_t i = 0; i < 4; ++i) {
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(got[i * 3 + j], static_cast<double>(static_cast<float>(v[j * 4 + i])));
  }
}

TEST(TensorStorage, CopiesOfTheHandleShareEverything) {
  Tensor x = testing::random_tensor({3});
  Tensor y = x;
  EXPECT_TRUE(y.is_same(x));
  EXPECT_EQ(x.use_count(), 2);
}

TEST(TensorStorage, ViewsShareStorageAndSeeWrites) {
  Tensor x = testing::random_tensor({4, 5});
  Tensor row = views::narrow(x, 0, 2, 1);
  EXPECT_TRUE(row.storage().is_same(x.storage()));
  Tensor fresh = testing::random_tensor({1, 5});
  kernels::copy_(row, fresh);
  std::vector<double> v = x.to_double_vector(), f = fresh.to_double_vector();
  for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(v[10 + j], f[j]);
}

TEST(TensorStorage, CloneIsIndependent) {
  Tensor x = views::transpose(testing::random_tensor({3, 4}), 0, 1);
  std::vector<double> before = x.to_double_vector();
  Tensor c = clone(x);
  EXPECT_FALSE(c.storage().is_same(x.storage()));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_double_vector(), before);
  kernels::copy_(c, testing::random_tensor({4, 3}));
  EXPECT_EQ(x.to_double_vector(), before);
  EXPECT_NE(c.to_double_vector(), before);
}

TEST(TensorPrinting, ShowsShapeDTypeDeviceAndValues) {
  Tensor x = from_vector(std::vector<double>{1.5, -2, 3.25, 4, 5, 6}, {2, 3}, DType::f32);
  std::string s = printed(x);
  EXPECT_NE(s.find("shape=[2, 3]"), std::string::npos) << s;
  EXPECT_NE(s.find("dtype=f32"), std::string::npos) << s;
  EXPECT_NE(s.find("device=cpu"), std::string::npos) << s;
  EXPECT_NE(s.find("[[1.5, -2, 3.25],"), std::string::npos) << s;
  EXPECT_NE(s.find("[4, 5, 6]]"), std::string::npos) << s;
  EXPECT_EQ(s.find("..."), std::string::npos) << s;
}

TEST(TensorPrinting, IntegersBoolsAndScalars) {
  EXPECT_NE(printed(from_vector(std::vector<int64_t>{-3, 7})).find("[-3, 7]"), std::string::npos);
  std::string b = printed(to(from_vector(std::vector<double>{0, 2}), DType::boolean));
  EXPECT_NE(b.find("dtype=bool"), std::string::npos) << b;
  EXPECT_NE(b.find("[false, true]"), std::string::npos) << b;
  std::string s = printed(scalar_tensor(2.5, DType::f64));
  EXPECT_NE(s.find("shape=[]"), std::string::npos) << s;
  EXPECT_NE(s.find("2.5"), std::string::npos) << s;
}

TEST(TensorPrinting, NonContiguousTensorsPrintInLogicalOrder) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  std::string s = printed(views::transpose(x, 0, 1));
  EXPECT_NE(s.find("[[1, 4],"), std::string::npos) << s;
  EXPECT_NE(s.find("[3, 6]]"), std::string::npos) << s;
}

TEST(TensorPrinting, LargeTensorsAreElided) {
  Tensor x = arange(0.0, 2000.0, 1.0, DType::f32);
  std::string s = printed(x);
  EXPECT_NE(s.find("shape=[2000]"), std::string::npos);
  EXPECT_NE(s.find("[0, 1, 2, ..., 1997, 1998, 1999]"), std::string::npos) << s;
  EXPECT_EQ(s.find("1000"), std::string::npos) << "middle values must be elided";
  EXPECT_LT(s.size(), 200u);

  std::string m = printed(views::reshape(arange(0.0, 1200.0, 1.0), {40, 30}));
  EXPECT_NE(m.find("..."), std::string::npos);
  EXPECT_NE(m.find("[0, 1, 2, ..., 27, 28, 29]"), std::string::npos) << m;
  EXPECT_NE(m.find("[1170, 1171, 1172, ..., 1197, 1198, 1199]]"), std::string::npos) << m;
  EXPECT_EQ(m.find("[90, 91"), std::string::npos) << "middle rows must be elided";
}

}  // namespace
}  // namespace tandem
