// Bad input is a clear error: the exception type, and a message that names the op, the operands'
// shapes, dtypes or devices, and what was expected.
#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using testing::throws_with;

TEST(Errors, AddOfShapesThatDoNotBroadcast) {
  Tensor a = testing::random_tensor({2, 3}), b = testing::random_tensor({4});
  EXPECT_TRUE(throws_with<ValueError>([&] { add(a, b); }, {"add: shapes [2, 3] and [4] do not broadcast",
                                                           "sizes 3 and 4 differ", "each must match or be 1"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { mul(b, a); }, {"mul", "[4] and [2, 3]"}));
}

TEST(Errors, MatmulInnerSizesDiffer) {
  Tensor a = testing::random_tensor({2, 3}), b = testing::random_tensor({4, 5});
  EXPECT_TRUE(throws_with<ValueError>([&] { matmul(a, b); }, {"matmul: [2, 3] @ [4, 5]: inner sizes 3 and 4 differ"}));
}

TEST(Errors, DTypeMismatch) {
  Tensor a = testing::random_tensor({2, 3}, DType::f32), b = testing::random_tensor({3}, DType::f64);
  EXPECT_TRUE(throws_with<TypeError>([&] { add(a, b); },
                                     {"add: dtypes differ", "f32 (shape [2, 3])", "f64 (shape [3])", ".to(dtype)"}));
  EXPECT_TRUE(throws_with<TypeError>([&] { where(gt(a, 0.0), a, b); }, {"where", "f32", "f64"}));
}

TEST(Errors, BadDeviceString) {
  for (const char* spec : {"gpu", "cuda:", "cuda:x", "cuda:-1", "CPU", "cuda0"}) {
    EXPECT_TRUE(throws_with<ValueError>(
        [&] { Device d(spec); }, {std::string("unknown device '") + spec + "'", "expected 'cpu', 'cuda' or 'cuda:N'"}))
        << spec;
  }
  EXPECT_EQ(Device("cuda:3").index, 3);
  EXPECT_EQ(Device("cuda").str(), "cuda:0");
  EXPECT_EQ(Device("cpu").str(), "cpu");
}

TEST(Errors, ViewThatNeedsACopy) {
  Tensor x = views::transpose(testing::random_tensor({3, 2}), 0, 1);
  EXPECT_TRUE(throws_with<ValueError>([&] { view(x, {6}); },
                                      {"view: a tensor of shape [2, 3] with strides [1, 2] cannot be viewed as [6] "
                                       "without a copy",
                                       "use reshape"}));
}

TEST(Errors, IndexOutOfRange) {
  Tensor x = testing::random_tensor({3, 4});
  EXPECT_TRUE(throws_with<IndexError>(
      [&] {
        index_select(x, 1, from_vector(std::vector<int64_t>{1, 4}));
      },
      {"index_select: index 4 is out of range for a dim of size 4", "expected -4 to 3"}));
  EXPECT_TRUE(throws_with<IndexError>([&] { views::narrow(x, 0, 2, 2); },
                                      {"narrow: elements [2, 4) are out of range for dim 0 of size 3", "[3, 4]"}));
}

TEST(Errors, DimOutOfRange) {
  Tensor x = testing::random_tensor({2, 3, 4});
  EXPECT_TRUE(throws_with<IndexError>([&] { softmax(x, 3); },
                                      {"softmax: dim 3 is out of range for a tensor of 3 dims", "expected -3 to 2"}));
  EXPECT_TRUE(throws_with<IndexError>([&] { sum(x, {-4}); }, {"sum: dim -4", "3 dims"}));
  EXPECT_TRUE(throws_with<IndexError>([&] { views::transpose(x, 0, 5); }, {"transpose: dim 5"}));
  EXPECT_TRUE(throws_with<IndexError>([&] { x.size(3); }, {"size: dim 3"}));
}

TEST(Errors, ReshapeWithWrongNumel) {
  Tensor x = testing::random_tensor({2, 3});
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        reshape(x, {4, 4});
      },
      {"reshape: shape [4, 4] has 16 elements but the tensor of shape [2, 3] has 6"}));
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        reshape(x, {4, -1});
      },
      {"reshape: cannot infer the -1 in [4, -1]", "shape [2, 3]", "6 elements"}));
  EXPECT_TRUE(throws_with<ValueError>([&] { view(x, {7}); }, {"view: shape [7] has 7 elements", "[2, 3]"}));
}

TEST(Errors, CrossEntropyTargetOutOfRange) {
  Tensor logits = testing::random_tensor({2, 5});
  EXPECT_TRUE(throws_with<IndexError>(
      [&] {
        cross_entropy(logits, from_vector(std::vector<int64_t>{1, 5}));
      },
      {"cross_entropy: target 5 of row 1 is out of range for 5 classes", "expected 0 to 4, or ignore_index"}));
}

TEST(Errors, CatWithMismatchedShapes) {
  Tensor a = testing::random_tensor({2, 3}), b = testing::random_tensor({2, 4});
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        cat({a, b}, 0);
      },
      {"cat: tensor 1 has shape [2, 4] but tensor 0 has [2, 3]", "sizes must match except in dim 0"}));
}

TEST(Errors, ExpOnIntegers) {
  EXPECT_TRUE(throws_with<TypeError>([] { exp(arange(3)); },
                                     {"exp: dtype i64 is not supported on cpu", "supported: f32, f64, f16, bf16"}));
}

TEST(Errors, ItemOnAMultiElementTensor) {
  Tensor x = testing::random_tensor({2, 3});
  EXPECT_TRUE(throws_with<ValueError>([&] { x.item(); },
                                      {"item(): the tensor has 6 elements (shape [2, 3]), expected exactly one"}));
  EXPECT_TRUE(throws_with<ValueError>([] { empty({0}).item(); }, {"item()", "0 elements"}));
}

TEST(Errors, RequiresGradOnANonLeaf) {
  Tensor w = testing::random_leaf({3});
  Tensor y = exp(w);
  EXPECT_TRUE(throws_with<ValueError>(
      [&] { y.requires_grad_(); },
      {"requires_grad_: only leaf tensors can change requires_grad", "computed by exp", "detach()"}));
}

TEST(Errors, IndexWithAFloatTensor) {
  Tensor x = testing::random_tensor({3, 4});
  EXPECT_TRUE(throws_with<TypeError>(
      [&] {
        gather(x, 0, testing::random_tensor({3, 4}));
      },
      {"gather: index must be i64 or i32, got f64"}));
}

TEST(Errors, WhereConditionMustBeBool) {
  Tensor x = testing::random_tensor({3});
  EXPECT_TRUE(throws_with<TypeError>([&] { where(x, x, x); }, {"where: the condition must be bool, got f64"}));
}

TEST(Errors, ExpandToAnIncompatibleShape) {
  Tensor x = testing::random_tensor({2, 3});
  EXPECT_TRUE(throws_with<ValueError>(
      [&] {
        expand(x, {2, 4});
      },
      {"expand: shape [2, 3] cannot be expanded to [2, 4]", "must equal 4 or be 1"}));
}

TEST(Errors, MessagesCarryTheLocation) {
  try {
    add(testing::random_tensor({2}), testing::random_tensor({3}));
    FAIL() << "did not throw";
  } catch (const ValueError& e) {
    EXPECT_EQ(e.message().find("add: shapes [2] and [3]"), 0u) << e.message();
    EXPECT_FALSE(e.file().empty());
    EXPECT_GT(e.line(), 0);
    EXPECT_NE(std::string(e.what()).find(e.message()), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("check failed"), std::string::npos);
  }
  // Every tandem error is a tandem::Error and a std::runtime_error.
  EXPECT_TRUE(throws_with<Error>([] { exp(arange(2)); }, {"exp"}));
  EXPECT_TRUE(throws_with<std::runtime_error>([] { exp(arange(2)); }, {"exp"}));
}

TEST(Errors, DeviceMismatchOrNoCudaDevice) {
  Tensor a = testing::random_tensor({2}, DType::f32);
  if (testing::cuda_available()) {
    Tensor b = to(testing::random_tensor({2}, DType::f32), Device("cuda:0"));
    EXPECT_TRUE(throws_with<DeviceError>([&] { add(a, b); },
                                         {"add: tensors are on different devices, cpu and cuda:0", ".to(device)"}));
    EXPECT_TRUE(throws_with<DeviceError>([&] { matmul(views::unsqueeze(b, 0), views::unsqueeze(a, 1)); },
                                         {"matmul", "cuda:0", "cpu"}));
    int missing = cuda::device_count();
    EXPECT_TRUE(throws_with<DeviceError>([&] { empty({2}, Device(DeviceType::cuda, missing)); },
                                         {"cuda:" + std::to_string(missing), "does not exist"}));
  } else if (cuda::is_built()) {
    EXPECT_TRUE(throws_with<DeviceError>([] { empty({2}, Device("cuda:0")); }, {"cuda:0 does not exist"}));
    EXPECT_TRUE(throws_with<DeviceError>([&] { to(a, Device("cuda:0")); }, {"cuda:0 does not exist"}));
  } else {
    EXPECT_TRUE(throws_with<DeviceError>([] { empty({2}, Device("cuda:0")); }, {"built without CUDA"}));
    EXPECT_TRUE(throws_with<DeviceError>([&] { to(a, Device("cuda")); }, {"built without CUDA", "TANDEM_WITH_CUDA"}));
    EXPECT_EQ(cuda::device_count(), 0);
  }
}

}  // namespace
}  // namespace tandem
