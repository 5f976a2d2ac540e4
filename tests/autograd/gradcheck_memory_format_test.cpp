// Gradients through channels-last tensors: finite-difference checks of convolution, pooling and
// batch norm on channels-last f64 leaves, the memory-format conversion op, and the layout the
// gradients come back in.
#include "gradcheck_util.h"
#include "tandem/core/kernels.h"

namespace tandem {
namespace {

using testing::Inputs;

constexpr MemoryFormat kCL = MemoryFormat::channels_last;

// A fresh random f64 leaf laid out channels-last.
Tensor channels_last_leaf(const Shape& shape) {
  return kernels::contiguous(testing::random_tensor(shape), kCL).requires_grad_();
}

TEST(GradcheckMemoryFormat, Conv2dOnChannelsLastLeaves) {
  Tensor x = channels_last_leaf({2, 4, 6, 5}), w = channels_last_leaf({6, 2, 3, 3}), b = testing::random_leaf({6});
  Conv2dParams p;
  p.stride_h = 2;
  p.pad_h = p.pad_w = 1;
  p.groups = 2;
  ASSERT_TRUE(conv2d(x, w, b, p).is_contiguous(kCL));
  EXPECT_GRADCHECK([p](const Inputs& v) { return conv2d(v[0], v[1], v[2], p); }, (Inputs{x, w, b}));
  // A row-major input into a channels-last weight: the convolution runs channels-last.
  Tensor xr = testing::random_leaf({2, 4, 6, 5});
  EXPECT_GRADCHECK([p](const Inputs& v) { return conv2d(v[0], v[1], Tensor(), p); }, (Inputs{xr, w}));
}

TEST(GradcheckMemoryFormat, PoolingOnChannelsLastLeaves) {
  // Values far apart, so that no finite-difference step changes a window's maximum.
  std::vector<double> values(2 * 3 * 6 * 6);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.1 * static_cast<double>((i * 37) % values.size());
  Tensor x = kernels::contiguous(from_vector(values, {2, 3, 6, 6}, DType::f64), kCL).requires_grad_();
  ASSERT_TRUE(x.is_contiguous(kCL));
  EXPECT_GRADCHECK([](const Inputs& v) { return max_pool2d(v[0], 3, 2, 1); }, (Inputs{x}));
  Tensor y = channels_last_leaf({2, 3, 6, 6});
  EXPECT_GRADCHECK([](const Inputs& v) { return avg_pool2d(v[0], 2, 2, 0, true); }, (Inputs{y}));
  EXPECT_GRADCHECK([](const Inputs& v) { return adaptive_avg_pool2d(v[0], 1, 1); }, (Inputs{y}));
}

TEST(GradcheckMemoryFormat, BatchNormOnAChannelsLastLeaf) {
  Tensor x = channels_last_leaf({3, 4, 3, 2}), w = testing::random_leaf({4}), b = testing::random_leaf({4});
  EXPECT_GRADCHECK(
      [](const Inputs& v) {
        Tensor rm = zeros({4}, DType::f64), rv = ones({4}, DType::f64);
        return batch_norm(v[0], v[1], v[2], rm, rv, true, 0.1, 1e-5);
      },
      (Inputs{x, w, b}));
}

TEST(GradcheckMemoryFormat, ConversionOpAndGradientLayouts) {
  Tensor x = testing::random_leaf({2, 3, 4, 5});
  EXPECT_GRADCHECK([](const Inputs& v) { return v[0].contiguous(kCL); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return v[0].to(kCL).contiguous(); }, (Inputs{x}));
  x.set_grad(Tensor());  // what the checks above left
  Tensor y = x.to(kCL);
  EXPECT_TRUE(y.is_contiguous(kCL));
  EXPECT_FALSE(y.is_leaf());
  EXPECT_TRUE(x.to(MemoryFormat::contiguous).is_same(x));  // already in the format: itself
  // The gradient of a row-major leaf comes back row-major through a channels-last computation...
  mul(y, y).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  EXPECT_TRUE(x.grad().is_contiguous());
  EXPECT_TRUE(testing::all_close(x.grad(), mul(x.detach(), scalar_tensor(2.0, DType::f64)), 1e-15, 0));
  // ... and a channels-last leaf's gradient is channels-last.
  Tensor w = channels_last_leaf({4, 3, 3, 3});
  conv2d(x.detach(), w, Tensor(), Conv2dParams{}).sum().backward();
  EXPECT_TRUE(w.grad().is_contiguous(kCL));
}

}  // namespace
}  // namespace tandem
