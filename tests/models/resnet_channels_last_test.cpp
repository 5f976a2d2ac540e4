// Channels-last training on the CPU gives the row-major results: Module::to(channels_last), a
// small convolution net with batch norm and ResNet-18, forward, backward and optimizer steps
// compared bit for bit (the CPU runs the same arithmetic in either layout), on fresh random data.
#include <map>

#include "support/test_util.h"
#include "tandem/models/resnet.h"

namespace tandem {
namespace {

constexpr MemoryFormat kCL = MemoryFormat::channels_last;

std::map<std::string, Tensor> state_of(const nn::Module& m) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : m.state_dict()) out[name] = t;
  return out;
}

// Every parameter, buffer and gradient of `a` equals `b`'s, bit for bit.
void expect_same_state(const nn::Module& a, const nn::Module& b) {
  auto sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    SCOPED_TRACE(sa[i].first);
    EXPECT_EQ(sa[i].second.to_double_vector(), sb[i].second.to_double_vector());
    if (sa[i].second.grad().defined()) {
      ASSERT_TRUE(sb[i].second.grad().defined());
      EXPECT_EQ(sa[i].second.grad().to_double_vector(), sb[i].second.grad().to_double_vector());
    }
  }
}

struct SmallConvNet : nn::Module {
  SmallConvNet() {
    nn::Conv2dOptions o;
    o.padding = 1;
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(3, 8, 3, o));
    bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(8));
    o.stride = 2;
    conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(8, 8, 3, o));
    bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(8));
    fc = register_module("fc", std::make_shared<nn::Linear>(8, 5));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = relu((*bn1)((*conv1)(x)));                         // (N, 8, H, W)
    Tensor z = (*bn2)((*conv2)(y));                               // (N, 8, H / 2, W / 2)
    z = relu(add(z, max_pool2d(y, 3, 2, 1)));                     // residual add of a pooled shortcut
    return (*fc)(flatten(adaptive_avg_pool2d(z, 1, 1), 1));       // (N, 5)
  }
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Linear> fc;
};

TEST(ChannelsLast, ModuleToConvertsFourDimensionalTensorsOnly) {
  SmallConvNet net;
  std::map<std::string, Tensor> before = state_of(net);
  std::map<std::string, std::vector<double>> values;
  for (const auto& [name, t] : before) values[name] = t.to_double_vector();
  net.to(kCL);
  for (const auto& [name, t] : net.state_dict()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(t.is_same(before.at(name)));  // converted in place: the same handles
    EXPECT_EQ(t.dim() == 4, t.is_contiguous(kCL));
    EXPECT_EQ(t.dim() != 4, t.is_contiguous());
    EXPECT_EQ(t.to_double_vector(), values.at(name));
  }
  EXPECT_TRUE(net.conv1->weight.requires_grad());
  net.to(MemoryFormat::contiguous);
  for (const auto& [name, t] : net.state_dict()) EXPECT_TRUE(t.is_contiguous());
}

// Trains two copies of a model, one channels-last, for `steps` steps with `make_optimizer`'s
// optimizer and checks every loss, parameter, gradient and running statistic is the same.
template <typename Model, typename MakeOptimizer>
void expect_same_training(std::shared_ptr<Model> a, std::shared_ptr<Model> b, const Shape& image_shape,
                          int64_t classes, int steps, MakeOptimizer make_optimizer) {
  b->load_state_dict(state_of(*a));
  b->to(kCL);
  auto opt_a = make_optimizer(a->parameters());
  auto opt_b = make_optimizer(b->parameters());
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Tensor images = testing::random_tensor(image_shape, DType::f32);                       // (N, 3, H, W)
    Tensor labels = randint(0, classes, {image_shape[0]}, DType::i64);                     // (N,)
    opt_a->zero_grad();
    opt_b->zero_grad();
    Tensor loss_a = cross_entropy((*a)(images), labels);
    Tensor loss_b = cross_entropy((*b)(images.contiguous(kCL)), labels);
    EXPECT_EQ(loss_a.item(), loss_b.item());
    loss_a.backward();
    loss_b.backward();
    expect_same_state(*a, *b);
    for (const Tensor& p : b->parameters()) EXPECT_EQ(p.dim() == 4, p.grad().is_contiguous(kCL));
    opt_a->step();
    opt_b->step();
    expect_same_state(*a, *b);
  }
  for (const Tensor& p : b->parameters()) EXPECT_EQ(p.dim() == 4, p.is_contiguous(kCL));
}

TEST(ChannelsLast, SmallConvNetTrainsToTheSameBitsWithSgdMomentum) {
  optim::SgdOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 1e-4;
  expect_same_training(std::make_shared<SmallConvNet>(), std::make_shared<SmallConvNet>(), {4, 3, 8, 8}, 5, 3,
                       [o](std::vector<Tensor> p) { return std::make_unique<optim::SGD>(std::move(p), o); });
}

TEST(ChannelsLast, ResNet18TrainsToTheSameBitsWithAdamW) {
  auto a = std::make_shared<models::ResNet18>(10);
  auto b = std::make_shared<models::ResNet18>(10, TensorOptions(), kCL);
  EXPECT_TRUE(b->conv1->weight.is_contiguous(kCL));
  optim::AdamWOptions o;
  o.lr = 1e-3;
  expect_same_training(a, b, {2, 3, 8, 8}, 10, 2,
                       [o](std::vector<Tensor> p) { return std::make_unique<optim::AdamW>(std::move(p), o); });
}

}  // namespace
}  // namespace tandem
