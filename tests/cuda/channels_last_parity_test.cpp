// Channels-last on CUDA against the CPU: convolution (forward, input and weight gradients),
// pooling, batch norm and elementwise ops on channels-last inputs give channels-last outputs and
// gradients, with the values of the CPU's row-major f64 computation on the same inputs, in f32,
// bf16 and f16, on fresh random inputs. New allocations are poisoned with NaN, so an element a
// kernel misses shows up.
#include <functional>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

constexpr MemoryFormat kCL = MemoryFormat::channels_last;

double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return 1e-4;  // sums of a few hundred products
    case DType::f16: return 8e-3;
    case DType::bf16: return 6e-2;
    default: return 1e-12;
  }
}

// One op over channels-last CUDA inputs, checked against the f64 CPU reference on row-major
// copies of the same values: the output's values and layout, and every input's gradient (of
// sum(out * w) for a random w), values and layout.
void check_op(const std::string& name, DType dtype, const std::vector<Shape>& shapes,
              const std::function<Tensor(const std::vector<Tensor>&)>& fn, double scale = 1.0) {
  SCOPED_TRACE(name + " " + dtype_name(dtype));
  std::vector<Tensor> reference, device;
  for (const Shape& s : shapes) {
    Tensor host = testing::random_uniform(s, -2.0, 2.0, dtype);  // fresh values in the test dtype
    reference.push_back(kernels::to_dtype(host, DType::f64).requires_grad_());
    Tensor d = kernels::to_device(host, Device("cuda:0"));
    if (s.size() == 4) d = kernels::contiguous(d, kCL);
    device.push_back(d.requires_grad_());
  }
  Tensor expected = fn(reference);
  Tensor got = fn(device);
  ASSERT_TRUE(got.device().is_cuda());
  if (got.dim() == 4) EXPECT_TRUE(got.is_contiguous(kCL)) << "output strides " << shape_str(got.strides());
  const double tol = tolerance(dtype) * scale;
  EXPECT_TRUE(testing::all_close(kernels::to_dtype(kernels::to_device(got, Device()), DType::f64), expected, tol, tol));
  Tensor w = testing::random_tensor(expected.shape());
  sum(mul(expected, w)).backward();
  sum(mul(to(got, DType::f32), to(to(w, DType::f32), got.device()))).backward();
  for (size_t i = 0; i < device.size(); ++i) {
    SCOPED_TRACE("gradient of input " + std::to_string(i));
    ASSERT_TRUE(device[i].grad().defined());
    if (device[i].dim() == 4) EXPECT_TRUE(device[i].grad().is_contiguous(kCL));
    Tensor g = kernels::to_dtype(kernels::to_device(device[i].grad(), Device()), DType::f64);
    EXPECT_TRUE(testing::all_close(g, reference[i].grad(), 2 * tol, 2 * tol));
  }
}

Conv2dParams conv_params(int64_t stride, int64_t pad) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  return p;
}

void run_channels_last_parity(DType dtype) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  using V = const std::vector<Tensor>&;
  // ResNet-18's kinds of convolution: 3x3 stride 1 and 2, the 1x1 stride-2 shortcut, the stem's
  // three input channels.
  check_op("conv3x3", dtype, {{4, 16, 9, 9}, {24, 16, 3, 3}}, [](V x) { return conv2d(x[0], x[1], Tensor(), conv_params(1, 1)); }, 4);
  check_op("conv3x3_stride2", dtype, {{4, 16, 9, 9}, {32, 16, 3, 3}},
           [](V x) { return conv2d(x[0], x[1], Tensor(), conv_params(2, 1)); }, 4);
  check_op("conv1x1_stride2", dtype, {{4, 16, 8, 8}, {32, 16, 1, 1}},
           [](V x) { return conv2d(x[0], x[1], Tensor(), conv_params(2, 0)); }, 4);
  check_op("conv_stem", dtype, {{4, 3, 8, 8}, {16, 3, 3, 3}}, [](V x) { return conv2d(x[0], x[1], Tensor(), conv_params(1, 1)); }, 4);
  check_op("max_pool", dtype, {{4, 8, 9, 9}}, [](V x) { return max_pool2d(x[0], 3, 2, 1); });
  check_op("avg_pool", dtype, {{4, 8, 8, 8}}, [](V x) { return avg_pool2d(x[0], 2, 2, 0, true); });
  check_op("global_avg_pool", dtype, {{4, 16, 4, 4}}, [](V x) { return adaptive_avg_pool2d(x[0], 1, 1); }, 2);
  check_op("relu_add", dtype, {{4, 8, 5, 5}, {4, 8, 5, 5}}, [](V x) { return relu(add(x[0], x[1])); });
  check_op("mul_per_channel", dtype, {{4, 8, 5, 5}, {1, 8, 1, 1}}, [](V x) { return mul(x[0], x[1]); });
  check_op("where_tanh", dtype, {{4, 8, 5, 5}, {4, 8, 5, 5}},
           [](V x) { return where(gt(x[0], x[1]), tanh(x[0]), x[1]); });
  check_op("batch_norm", dtype, {{4, 8, 5, 5}}, [](V x) {
    TensorOptions o(x[0].dtype() == DType::f64 ? DType::f64 : DType::f32, x[0].device());
    Tensor weight = full({8}, 1.5, o), bias = full({8}, -0.25, o), rm = zeros({8}, o), rv = ones({8}, o);
    return batch_norm(x[0], weight, bias, rm, rv, true, 0.1, 1e-5);
  }, 4);
  cuda::synchronize();
  cuda::set_poison_allocations(false);
}

TEST(CudaChannelsLast, ParityF32) { run_channels_last_parity(DType::f32); }
TEST(CudaChannelsLast, ParityBF16) { run_channels_last_parity(DType::bf16); }
TEST(CudaChannelsLast, ParityF16) { run_channels_last_parity(DType::f16); }

// The flat (vectorised) path of a same-layout elementwise op and the strided path of a mixed one
// give the same values; a channels-last upload moves without a transpose and comes back equal.
TEST(CudaChannelsLast, ElementwiseLayoutsAndTransfers) {
  TANDEM_REQUIRE_CUDA();
  Tensor a = kernels::contiguous(testing::random_tensor({3, 5, 7, 6}, DType::f32), kCL);
  Tensor b = kernels::contiguous(testing::random_tensor({3, 5, 7, 6}, DType::f32), kCL);
  Tensor da = kernels::to_device(a, Device("cuda:0")), db = kernels::to_device(b, Device("cuda:0"));
  EXPECT_TRUE(da.is_contiguous(kCL));
  Tensor same = kernels::binary(BinaryOp::add, da, db);
  EXPECT_TRUE(same.is_contiguous(kCL));
  Tensor mixed = kernels::binary(BinaryOp::add, da, kernels::contiguous(db));
  EXPECT_TRUE(mixed.is_contiguous());
  EXPECT_EQ(kernels::to_device(same, Device()).to_double_vector(), kernels::to_device(mixed, Device()).to_double_vector());
  EXPECT_EQ(kernels::to_device(same, Device()).to_double_vector(), kernels::binary(BinaryOp::add, a, b).to_double_vector());
  Tensor back = kernels::to_device(da, Device());
  EXPECT_TRUE(back.is_contiguous(kCL));
  EXPECT_EQ(back.to_double_vector(), a.to_double_vector());
}

}  // namespace
}  // namespace tandem
