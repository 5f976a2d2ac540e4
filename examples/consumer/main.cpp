// Uses an installed tandem with one include, as research code does, and checks values and
// gradients of the ops, tensor methods and layers a new user reaches for against numbers worked
// out by hand. Exits non-zero on the first mismatch.
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "tandem/tandem.h"

namespace {

using tandem::DType;
using tandem::Tensor;

int failures = 0;

void expect_values(const std::string& what, const Tensor& t, const std::vector<double>& expected, double tol = 1e-9) {
  std::vector<double> got = t.to_vector<double>();
  bool ok = got.size() == expected.size();
  for (size_t i = 0; ok && i < got.size(); ++i) ok = std::fabs(got[i] - expected[i]) <= tol * (1.0 + std::fabs(expected[i]));
  if (ok) return;
  ++failures;
  std::printf("MISMATCH %s: got [", what.c_str());
  for (double v : got) std::printf(" %.10g", v);
  std::printf(" ], expected [");
  for (double v : expected) std::printf(" %.10g", v);
  std::printf(" ]\n");
}

void expect_shape(const std::string& what, const Tensor& t, const tandem::Shape& shape) {
  if (t.shape() == shape) return;
  ++failures;
  std::printf("MISMATCH %s: shape %s, expected %s\n", what.c_str(), tandem::shape_str(t.shape()).c_str(),
              tandem::shape_str(shape).c_str());
}

Tensor leaf(std::initializer_list<double> values) { return tandem::tensor(values, DType::f64).requires_grad_(); }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

int main() {
  // f(x) = sum(x^3 + 2x): df/dx = 3x^2 + 2.
  {
    Tensor x = leaf({1.0, 2.0, 3.0});  // (3,)
    Tensor f = (x.pow(3.0) + 2.0 * x).sum();
    f.backward();
    expect_values("sum(x^3 + 2x)", f, {48.0});
    expect_values("d sum(x^3 + 2x)", x.grad(), {5.0, 14.0, 29.0});
  }
  // sin, cos, silu, softplus and their gradients.
  {
    const std::vector<double> v = {-1.5, 0.25, 2.0};
    Tensor x = leaf({-1.5, 0.25, 2.0});
    (x.sin() + tandem::cos(x)).sum().backward();
    std::vector<double> value, grad;
    for (double a : v) grad.push_back(std::cos(a) - std::sin(a));
    expect_values("d (sin + cos)", x.grad(), grad);

    Tensor y = leaf({-1.5, 0.25, 2.0});
    Tensor s = tandem::silu(y);
    s.sum().backward();
    value.clear();
    grad.clear();
    for (double a : v) {
      value.push_back(a * sigmoid(a));
      grad.push_back(sigmoid(a) * (1.0 + a * (1.0 - sigmoid(a))));
    }
    expect_values("silu", s, value);
    expect_values("d silu", y.grad(), grad);

    // beta 2, threshold 3: 2.0 * 2 > 3 takes the linear branch (value x, gradient 1).
    Tensor z = leaf({-1.5, 0.25, 2.0});
    Tensor p = tandem::softplus(z, 2.0, 3.0);
    p.sum().backward();
    expect_values("softplus", p, {std::log1p(std::exp(-3.0)) / 2.0, std::log1p(std::exp(0.5)) / 2.0, 2.0});
    expect_values("d softplus", z.grad(), {sigmoid(-3.0), sigmoid(0.5), 1.0});
  }
  // clamp with both bounds and with one; gradient 1 inside (bounds included), 0 outside.
  {
    Tensor x = leaf({-2.0, -1.0, 0.5, 1.0, 3.0});
    Tensor both = x.clamp(-1.0, 1.0);
    Tensor low = tandem::clamp(x, 0.0, std::nullopt);
    Tensor high = tandem::clamp(x, std::nullopt, 0.0);
    expect_values("clamp", both, {-1.0, -1.0, 0.5, 1.0, 1.0});
    expect_values("clamp min", low, {0.0, 0.0, 0.5, 1.0, 3.0});
    expect_values("clamp max", high, {-2.0, -1.0, 0.0, 0.0, 0.0});
    (both + 10.0 * low).sum().backward();
    expect_values("d clamp", x.grad(), {0.0, 1.0, 11.0, 11.0, 10.0});
  }
  // maximum / minimum split the gradient evenly on ties.
  {
    Tensor a = leaf({1.0, 2.0, 3.0});
    Tensor b = leaf({2.0, 2.0, 1.0});
    Tensor m = tandem::maximum(a, b);
    Tensor n = tandem::minimum(a, b);
    expect_values("maximum", m, {2.0, 2.0, 3.0});
    expect_values("minimum", n, {1.0, 2.0, 1.0});
    (m + 3.0 * n).sum().backward();
    expect_values("d maximum + 3 minimum, a", a.grad(), {3.0, 2.0, 1.0});
    expect_values("d maximum + 3 minimum, b", b.grad(), {1.0, 2.0, 3.0});
  }
  // where, masked_fill.
  {
    Tensor x = leaf({1.0, -2.0, 3.0, -4.0});
    Tensor positive = tandem::gt(x, 0.0);
    Tensor w = tandem::where(positive, x * 2.0, x * x);
    Tensor f = x.masked_fill(positive, 0.0);
    expect_values("where", w, {2.0, 4.0, 6.0, 16.0});
    expect_values("masked_fill", f, {0.0, -2.0, 0.0, -4.0});
    (w + f).sum().backward();
    expect_values("d (where + masked_fill)", x.grad(), {2.0, -3.0, 2.0, -7.0});
  }
  // arange, cat, stack, tril, triu, views as methods.
  {
    Tensor r = tandem::arange(0.0, 6.0, 1.0, DType::f64);  // (6,)
    expect_values("arange", r, {0, 1, 2, 3, 4, 5});
    expect_values("arange step", tandem::arange(1.0, 2.0, 0.25, DType::f32), {1.0, 1.25, 1.5, 1.75});
    Tensor m = r.reshape({2, 3}).to(DType::f64).requires_grad_();  // (2, 3) leaf
    Tensor c = tandem::cat({m, m * 10.0}, 0);                     // (4, 3)
    Tensor s = tandem::stack({m, m}, 0);                          // (2, 2, 3)
    expect_shape("cat", c, {4, 3});
    expect_shape("stack", s, {2, 2, 3});
    expect_values("cat", c, {0, 1, 2, 3, 4, 5, 0, 10, 20, 30, 40, 50});
    expect_values("tril", m.tril(), {0, 0, 0, 3, 4, 0});
    expect_values("triu 1", tandem::triu(m, 1), {0, 1, 2, 0, 0, 5});
    (c.sum() + s.sum() + m.tril().sum()).backward();
    expect_values("d (cat + stack + tril)", m.grad(), {14, 13, 13, 14, 14, 13});
  }
  // Tensor methods a PyTorch user types.
  {
    Tensor x = leaf({1.0, 2.0, 3.0, 4.0, 5.0, 6.0});
    Tensor m = x.view({2, 3});                                  // (2, 3)
    expect_shape("t", m.t(), {3, 2});
    expect_shape("transpose", m.transpose(0, 1), {3, 2});
    expect_shape("permute", m.unsqueeze(0).permute({2, 0, 1}), {3, 1, 2});
    expect_shape("squeeze", m.unsqueeze(1).squeeze(), {2, 3});
    expect_shape("flatten", m.t().contiguous().flatten(), {6});
    expect_values("sum dim", m.sum({1}), {6.0, 15.0});
    expect_values("mean", m.mean({0}, true), {2.5, 3.5, 4.5});
    expect_values("max", m.max(), {6.0});
    expect_values("exp log", m.exp().log(), {1, 2, 3, 4, 5, 6});
    expect_values("clone", m.clone(), {1, 2, 3, 4, 5, 6});
    Tensor p = m.matmul(m.t());  // (2, 2): [[14, 32], [32, 77]]
    expect_values("matmul", p, {14, 32, 32, 77});
    p.sum().backward();
    // d sum(M M^T) / dM = 2 * (column sums of M broadcast per row): [5, 7, 9] * 2.
    expect_values("d matmul", x.grad(), {10, 14, 18, 10, 14, 18});
    Tensor on_cpu = x.detach().to(tandem::Device("cpu")).to(DType::f32);
    if (on_cpu.dtype() != DType::f32 || !on_cpu.device().is_cpu()) {
      ++failures;
      std::printf("MISMATCH .to: got %s on %s\n", tandem::dtype_name(on_cpu.dtype()),
                  on_cpu.device().str().c_str());
    }
  }
  // Layers: LayerNorm over an int size, SiLU, Softplus; the distributed types are in reach.
  {
    tandem::nn::LayerNorm norm(4);
    tandem::nn::SiLU act;
    tandem::nn::Softplus smooth(1.0, 20.0);
    Tensor x = tandem::tensor({1.0, 2.0, 3.0, 4.0}).reshape({1, 4});  // (1, 4), f32
    Tensor y = smooth.forward(act.forward(norm.forward(x)));
    // LayerNorm: (x - 2.5) / sqrt(1.25 + 1e-5).
    std::vector<double> expected;
    for (double v : {1.0, 2.0, 3.0, 4.0}) {
      double n = (v - 2.5) / std::sqrt(1.25 + 1e-5);
      double s = n * sigmoid(n);
      expected.push_back(std::log1p(std::exp(s)));
    }
    expect_values("softplus(silu(layer_norm))", y, expected, 1e-5);
    tandem::dist::DistributedSampler sampler(10, 0, 2, false);
    expect_values("sampler", tandem::from_vector(sampler.indices(0), {}, DType::i64).to(DType::f64), {0, 2, 4, 6, 8});
    tandem::optim::AdamWOptions adamw;
    tandem::optim::SgdOptions sgd{0.1, 0.9};
    if (adamw.beta2 != 0.999 || sgd.momentum != 0.9) {
      ++failures;
      std::printf("MISMATCH optimizer defaults\n");
    }
  }
  if (failures != 0) {
    std::printf("%d mismatches\n", failures);
    return 1;
  }
  std::printf("all values and gradients as expected\n");
  return 0;
}
