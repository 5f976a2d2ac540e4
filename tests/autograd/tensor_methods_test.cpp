// Tensor's methods (x.sum(), x.to(dtype), ...) are the free functions of autograd/ops.h: the same
// values and the same gradients, on fresh random inputs.
#include <functional>
#include <string>

#include "gradcheck_util.h"

namespace tandem {
namespace {

using testing::Inputs;
using testing::random_leaf;

struct MethodCase {
  std::string name;
  std::function<Tensor(const Tensor&)> method, function;
};

std::vector<MethodCase> method_cases() {
  using T = const Tensor&;
  return {
      {"reshape", [](T x) { return x.reshape({4, 6}); }, [](T x) { return reshape(x, {4, 6}); }},
      {"view", [](T x) { return x.view({6, 4}); }, [](T x) { return view(x, {6, 4}); }},
      {"flatten", [](T x) { return x.flatten(1); }, [](T x) { return flatten(x, 1); }},
      {"transpose", [](T x) { return x.transpose(0, 2); }, [](T x) { return transpose(x, 0, 2); }},
      {"permute", [](T x) { return x.permute({1, 2, 0}); }, [](T x) { return permute(x, {1, 2, 0}); }},
      {"t", [](T x) { return x.flatten(1).t(); }, [](T x) { return t(flatten(x, 1)); }},
      {"unsqueeze squeeze", [](T x) { return x.unsqueeze(1).squeeze(1); }, [](T x) { return squeeze(unsqueeze(x, 1), 1); }},
      {"squeeze all", [](T x) { return x.unsqueeze(0).squeeze(); }, [](T x) { return squeeze(unsqueeze(x, 0)); }},
      {"expand", [](T x) { return x.unsqueeze(0).expand({2, 2, 3, 4}); },
       [](T x) { return expand(unsqueeze(x, 0), {2, 2, 3, 4}); }},
      {"narrow", [](T x) { return x.narrow(2, 1, 2); }, [](T x) { return narrow(x, 2, 1, 2); }},
      {"contiguous", [](T x) { return x.transpose(0, 1).contiguous(); }, [](T x) { return contiguous(transpose(x, 0, 1)); }},
      {"clone", [](T x) { return x.clone(); }, [](T x) { return clone(x); }},
      {"sum", [](T x) { return x.sum({0, 2}, true); }, [](T x) { return sum(x, {0, 2}, true); }},
      {"sum all", [](T x) { return x.sum(); }, [](T x) { return sum(x); }},
      {"mean", [](T x) { return x.mean({1}); }, [](T x) { return mean(x, {1}); }},
      {"max", [](T x) { return x.max(); }, [](T x) { return amax(x); }},
      {"min", [](T x) { return x.min(); }, [](T x) { return amin(x); }},
      {"matmul", [](T x) { return x.matmul(x.transpose(1, 2)); }, [](T x) { return matmul(x, transpose(x, 1, 2)); }},
      {"pow", [](T x) { return x.pow(2.0); }, [](T x) { return pow(x, 2.0); }},
      {"pow tensor", [](T x) { return x.abs().pow(x); }, [](T x) { return pow(abs(x), x); }},
      {"exp log", [](T x) { return x.exp().log(); }, [](T x) { return log(exp(x)); }},
      {"sqrt abs", [](T x) { return x.abs().sqrt(); }, [](T x) { return sqrt(abs(x)); }},
      {"neg", [](T x) { return x.neg(); }, [](T x) { return neg(x); }},
      {"sin cos", [](T x) { return x.sin() + x.cos(); }, [](T x) { return sin(x) + cos(x); }},
      {"tanh sigmoid relu", [](T x) { return x.tanh() + x.sigmoid() + x.relu(); },
       [](T x) { return tanh(x) + sigmoid(x) + relu(x); }},
      {"softmax", [](T x) { return x.softmax(-1); }, [](T x) { return softmax(x, -1); }},
      {"log_softmax", [](T x) { return x.log_softmax(1); }, [](T x) { return log_softmax(x, 1); }},
      {"clamp", [](T x) { return x.clamp(-0.5, 0.5); }, [](T x) { return clamp(x, -0.5, 0.5); }},
      {"masked_fill", [](T x) { return x.masked_fill(gt(x, 0.25), 2.0); }, [](T x) { return masked_fill(x, gt(x, 0.25), 2.0); }},
      {"tril triu", [](T x) { return x.tril(1) + x.triu(-1); }, [](T x) { return tril(x, 1) + triu(x, -1); }},
      {"to dtype", [](T x) { return x.to(DType::f32).to(DType::f64); }, [](T x) { return to(to(x, DType::f32), DType::f64); }},
      {"to device", [](T x) { return x.to(Device("cpu")); }, [](T x) { return to(x, Device("cpu")); }},
  };
}

TEST(TensorMethods, SameValuesAndGradientsAsTheFunctions) {
  for (const MethodCase& c : method_cases()) {
    SCOPED_TRACE(c.name);
    Tensor base = testing::random_tensor({2, 3, 4});
    Tensor a = base.clone().requires_grad_(), b = base.clone().requires_grad_();
    Tensor ya = c.method(a), yb = c.function(b);
    ASSERT_EQ(ya.shape(), yb.shape());
    EXPECT_TRUE(testing::all_close(ya, yb, 1e-12, 1e-12));
    Tensor w = testing::random_tensor(ya.shape());
    (ya * w).sum().backward();
    (yb * w).sum().backward();
    EXPECT_TRUE(testing::all_close(a.grad(), b.grad(), 1e-12, 1e-12));
  }
}

TEST(TensorMethods, Gradcheck) {
  auto x = random_leaf({3, 4});
  EXPECT_GRADCHECK([](const Inputs& v) { return v[0].t().matmul(v[0]).sum({1}); }, (Inputs{x}));
  EXPECT_GRADCHECK([](const Inputs& v) { return v[0].unsqueeze(0).permute({2, 0, 1}).reshape({12}).sin(); }, (Inputs{x}));
}

TEST(TensorMethods, ArgmaxIsAFlatIndex) {
  Tensor x = testing::random_tensor({4, 5});
  EXPECT_EQ(x.argmax().item<int64_t>(), argmax(x).item<int64_t>());
  EXPECT_EQ(x.argmax().dtype(), DType::i64);
}

}  // namespace
}  // namespace tandem
