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

using MakeInput = std::function<Tensor(const Shape&, DType)>;

// Fresh uniform values in [-2, 2), drawn in the test dtype.
Tensor uniform_input(const Shape& s, DType dtype) { return testing::random_uniform(s, -2.0, 2.0, dtype); }

// (N, C, H, W) values that differ within every 9x9 patch (so no max-pool window has a tie, even
// in bf16), exact in every dtype, with a fresh random offset per (n, c).
Tensor distinct_in_windows(const Shape& s, DType dtype) {
  std::vector<double> shift = testing::random_uniform({s[0] * s[1]}, 0.0, 81.0, DType::f64).to_double_vector();
  std::vector<double> v(static_cast<size_t>(shape_numel(s)));
  size_t i = 0;
  for (int64_t n = 0; n < s[0]; ++n) {
    for (int64_t c = 0; c < s[1]; ++c) {
      const int64_t offset = static_cast<int64_t>(shift[n * s[1] + c]);
      for (int64_t h = 0; h < s[2]; ++h) {
        for (int64_t w = 0; w < s[3]; ++w) {
          v[i++] = static_cast<double>(((h % 9 * 9 + w % 9) * 7 + offset) % 81 - 40) / 16;
        }
      }
    }
  }
  return kernels::to_dtype(from_vector(v, s, DType::f64), dtype);
}

// One op over channels-last CUDA inputs, checked against the f64 CPU reference on row-major
// copies of the same values: the output's values and layout, and every input's gradient (of
// sum(out * w) for a random w), values and layout.
void check_op(const std::string& name, DType dtype, const std::vector<Shape>& shapes,
              const std::function<Tensor(const std::vector<Tensor>&)>& fn, double scale = 1.0,
              const MakeInput& make = uniform_input) {
  SCOPED_TRACE(name + " " + dtype_name(dtype));
  std::vector<Tensor> reference, device;
  for (const Shape& s : shapes) {
    Tensor host = make(s, dtype);
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
  check_op("conv3x3", dtype, {{4, 16, 9, 9}, {24, 16, 3, 3}},
           [](V x) { return conv2d(x[0], x[1], Tensor(), conv_params(1, 1)); }, 4);
  check_op("conv3x3_stride2", dtype, {{4, 16, 9, 9}, {32, 16, 3, 3}},
           [](V x) { return conv2d(x[0], x[1], Tensor(), conv_params(2, 1)); }, 4);
  check_op("conv1x1_stride2", dtype, {{4, 16, 8, 8}, {32, 16, 1, 1}},
           [](V x) { return conv2d(x[0], x[1], Tensor(), conv_params(2, 0)); }, 4);
  check_op("conv_stem", dtype, {{4, 3, 8, 8}, {16, 3, 3, 3}},
           [](V x) { return conv2d(x[0], x[1], Tensor(), conv_params(1, 1)); }, 4);
  check_op("max_pool", dtype, {{4, 8, 9, 9}}, [](V x) { return max_pool2d(x[0], 3, 2, 1); }, 1.0, distinct_in_windows);
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
  const std::vector<double> same_values = kernels::to_device(same, Device()).to_double_vector();
  EXPECT_EQ(same_values, kernels::to_device(mixed, Device()).to_double_vector());
  EXPECT_EQ(same_values, kernels::binary(BinaryOp::add, a, b).to_double_vector());
  Tensor back = kernels::to_device(da, Device());
  EXPECT_TRUE(back.is_contiguous(kCL));
  EXPECT_EQ(back.to_double_vector(), a.to_double_vector());
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Conv, batch norm, ReLU, a residual add of a pooled shortcut, global average pooling and a
// linear head: ResNet-18's ops in small.
struct ResidualConvNet : nn::Module {
  explicit ResidualConvNet(TensorOptions o) {
    nn::Conv2dOptions c;
    c.padding = 1;
    c.bias = false;
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(3, 16, 3, c, o));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(16, 1e-5, 0.1, o));
    c.stride = 2;
    conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(16, 16, 3, c, o));
    bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(16, 1e-5, 0.1, o));
    fc = register_module("fc", std::make_shared<nn::Linear>(16, 10, true, o));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = relu((*bn1)((*conv1)(x)));                       // (N, 16, H, W)
    Tensor z = relu(add((*bn2)((*conv2)(y)), max_pool2d(y, 3, 2, 1)));  // (N, 16, H / 2, W / 2)
    return (*fc)(flatten(adaptive_avg_pool2d(z, 1, 1), 1));     // (N, 10)
  }
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Linear> fc;
};

// Two training steps of the same network on the GPU, row-major and channels-last: the same losses
// and parameters within the dtype's tolerance (cuDNN may pick other kernels per layout), and the
// channels-last copy's weights and gradients stay channels-last throughout.
void run_training_parity(DType dtype) {
  TANDEM_REQUIRE_CUDA();
  const Device gpu("cuda:0");
  manual_seed(11);
  auto a = std::make_shared<ResidualConvNet>(TensorOptions(DType::f32, gpu));
  auto b = std::make_shared<ResidualConvNet>(TensorOptions(DType::f32, gpu));
  std::map<std::string, Tensor> state;
  for (auto& [name, t] : a->state_dict()) state[name] = t;
  b->load_state_dict(state);
  for (auto* m : {a.get(), b.get()}) {
    m->to(dtype);
    for (auto* bn : {static_cast<ResidualConvNet*>(m)->bn1.get(), static_cast<ResidualConvNet*>(m)->bn2.get()}) {
      bn->to(DType::f32);  // batch norm's parameters and statistics stay f32
    }
  }
  b->to(kCL);
  optim::SGD opt_a(a->parameters(), {0.05, 0.9}), opt_b(b->parameters(), {0.05, 0.9});
  const double tol = 4 * tolerance(dtype);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Tensor images = kernels::to_device(testing::random_tensor({8, 3, 8, 8}, dtype), gpu);  // (N, 3, H, W)
    Tensor labels = kernels::to_device(randint(0, 10, {8}, DType::i64), gpu);             // (N,)
    opt_a.zero_grad();
    opt_b.zero_grad();
    Tensor loss_a = cross_entropy((*a)(images), labels);
    Tensor loss_b = cross_entropy((*b)(images.contiguous(kCL)), labels);
    EXPECT_NEAR(loss_a.item(), loss_b.item(), tol * (1 + std::abs(loss_a.item())));
    loss_a.backward();
    loss_b.backward();
    for (const auto& [name, p] : b->named_parameters()) {
      if (p.dim() == 4) EXPECT_TRUE(p.grad().is_contiguous(kCL)) << name;
    }
    opt_a.step();
    opt_b.step();
  }
  auto pa = a->named_parameters(), pb = b->named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    SCOPED_TRACE(pa[i].first);
    if (pb[i].second.dim() == 4) EXPECT_TRUE(pb[i].second.is_contiguous(kCL));
    Tensor ga = kernels::to_dtype(kernels::to_device(pa[i].second, Device()), DType::f64);
    Tensor gb = kernels::to_dtype(kernels::to_device(pb[i].second, Device()), DType::f64);
    EXPECT_TRUE(testing::all_close(gb, ga, tol, tol));
  }
}

TEST(CudaChannelsLast, TrainingStepsMatchRowMajorF32) { run_training_parity(DType::f32); }
TEST(CudaChannelsLast, TrainingStepsMatchRowMajorBF16) { run_training_parity(DType::bf16); }

}  // namespace
}  // namespace tandem
