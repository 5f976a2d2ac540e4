// GPU-only checks of core: device discovery and host/device transfers. Each test skips cleanly
// when tandem was built without CUDA or no GPU is visible.
#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

TEST(Cuda, DeviceCountIsPositive) {
  TANDEM_REQUIRE_CUDA();
  EXPECT_TRUE(cuda::is_built());
  EXPECT_GT(cuda::device_count(), 0);
}

TEST(Cuda, RoundTripThroughTheDevicePreservesValues) {
  TANDEM_REQUIRE_CUDA();
  for (const Shape& shape : {Shape{}, Shape{1}, Shape{7, 13}, Shape{3, 1025}}) {
    Tensor host = testing::random_tensor(shape, DType::f32);
    Tensor device = to(host, Device("cuda:0"));
    EXPECT_EQ(device.device(), Device("cuda:0"));
    EXPECT_EQ(device.shape(), shape);
    EXPECT_EQ(device.dtype(), DType::f32);
    EXPECT_FALSE(device.storage().is_same(host.storage()));
    Tensor back = to(device, Device("cpu"));
    EXPECT_EQ(back.device(), Device("cpu"));
    EXPECT_EQ(back.to_double_vector(), host.to_double_vector()) << shape_str(shape);
    // to_double_vector and item read a device tensor through the host.
    EXPECT_EQ(device.to_double_vector(), host.to_double_vector());
  }
}

TEST(Cuda, RoundTripOfANonContiguousHostTensor) {
  TANDEM_REQUIRE_CUDA();
  Tensor host = views::transpose(testing::random_tensor({5, 8}, DType::f32), 0, 1);
  Tensor back = to(to(host, Device("cuda:0")), Device("cpu"));
  EXPECT_TRUE(back.is_contiguous());
  EXPECT_EQ(back.to_double_vector(), host.to_double_vector());
}

TEST(Cuda, RoundTripOfEveryDType) {
  TANDEM_REQUIRE_CUDA();
  Generator gen(testing::next_seed());
  Tensor ints = randint(0, 100, {6, 5}, DType::i64, &gen);
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8}) {
    Tensor host = to(ints, d);
    EXPECT_EQ(to(to(host, Device("cuda:0")), Device("cpu")).to_double_vector(), host.to_double_vector()) << d;
  }
}

}  // namespace
}  // namespace tandem
