// Optimizers, schedules and gradient clipping. Updates are checked against PyTorch's documented
// rules written out here in f64 on fresh random parameters and gradients; the GPU cases compare
// the fused CUDA kernels with the CPU ones.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

using optim::AdamW;
using optim::AdamWOptions;
using optim::SGD;
using optim::SgdOptions;

constexpr double kPi = 3.14159265358979323846;

// A fresh parameter (a leaf that requires grad) of the given dtype, N(0, 1) values.
Tensor make_param(const Shape& shape, DType dtype, Device device = Device()) {
  Tensor t = kernels::to_device(kernels::to_dtype(testing::random_tensor(shape), dtype), device);
  t.requires_grad_();
  return t;
}

// Gives p a fresh random gradient.
void set_random_grad(const Tensor& p) {
  p.set_grad(kernels::to_device(kernels::to_dtype(testing::random_tensor(p.shape()), p.dtype()), p.device()));
}

std::vector<Tensor> make_params(const std::vector<Shape>& shapes, DType dtype) {
  std::vector<Tensor> params;
  for (const Shape& s : shapes) params.push_back(make_param(s, dtype));
  return params;
}

const std::vector<Shape> kShapes = {{1}, {3}, {4, 5}, {2, 3, 7}};

double tolerance(DType dtype) { return dtype == DType::f64 ? 1e-12 : 2e-6; }

// ---- the reference rules, in f64 ----
struct SgdReference {
  std::vector<double> buf;
  bool has_buf = false;

  void step(std::vector<double>& p, const std::vector<double>& g, const SgdOptions& o) {
    if (buf.empty()) buf.assign(p.size(), 0.0);
    for (size_t i = 0; i < p.size(); ++i) {
      double d = g[i] + o.weight_decay * p[i];
      if (o.momentum != 0.0) {
        buf[i] = has_buf ? o.momentum * buf[i] + (1.0 - o.dampening) * d : d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
    has_buf = true;
  }
};

struct AdamWReference {
  std::vector<double> m, v;
  int64_t t = 0;

  void step(std::vector<double>& p, const std::vector<double>& g, const AdamWOptions& o) {
    if (m.empty()) {
      m.assign(p.size(), 0.0);
      v.assign(p.size(), 0.0);
    }
    ++t;
    double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
    double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
    for (size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g[i] * g[i];
      p[i] -= o.lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + o.eps);
    }
  }
};

// Steps `opt` over `params` `steps` times with fresh gradients, following each parameter with
// `Reference` (one per parameter) and checking the parameters after every step.
template <typename Reference, typename Options>
void check_against_reference(optim::Optimizer& opt, const std::vector<Tensor>& params, const Options& options,
                             int steps, double rtol) {
  std::vector<Reference> refs(params.size());
  std::vector<std::vector<double>> expected;
  for (const Tensor& p : params) expected.push_back(p.to_double_vector());
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < params.size(); ++i) {
      set_random_grad(params[i]);
      refs[i].step(expected[i], params[i].grad().to_double_vector(), options);
    }
    opt.step();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(testing::all_close(params[i], expected[i], rtol, rtol)) << "step " << s + 1 << ", parameter " << i;
    }
  }
}

// ---- SGD ----
struct SgdCase {
  const char* name;
  SgdOptions options;
};

std::vector<SgdCase> sgd_cases() {
  return {
      {"plain", {0.1, 0.0, 0.0, 0.0, false}},
      {"weight_decay", {0.1, 0.0, 0.0, 0.01, false}},
      {"momentum", {0.05, 0.9, 0.0, 0.0, false}},
      {"dampening", {0.05, 0.9, 0.3, 0.0, false}},
      {"nesterov", {0.05, 0.8, 0.0, 0.0, true}},
      {"everything", {0.02, 0.7, 0.0, 0.05, true}},
      {"momentum_dampening_decay", {0.03, 0.5, 0.2, 0.1, false}},
  };
}

TEST(SGD, OneStepMatchesTheRule) {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (const SgdCase& c : sgd_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dtype));
      std::vector<Tensor> params = make_params(kShapes, dtype);
      SGD opt(params, c.options);
      check_against_reference<SgdReference>(opt, params, c.options, 1, tolerance(dtype));
    }
  }
}

TEST(SGD, SeveralStepsMatchTheRule) {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (const SgdCase& c : sgd_cases()) {
      SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dtype));
      std::vector<Tensor> params = make_params(kShapes, dtype);
      SGD opt(params, c.options);
      check_against_reference<SgdReference>(opt, params, c.options, 4, 4 * tolerance(dtype));
    }
  }
}

TEST(SGD, NesterovNeedsMomentumAndNoDampening) {
  std::vector<Tensor> params = make_params({{3}}, DType::f64);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { SGD(params, {0.1, 0.0, 0.0, 0.0, true}); },
                                               {"Nesterov", "momentum > 0", "zero dampening"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { SGD(params, {0.1, 0.9, 0.1, 0.0, true}); },
                                               {"Nesterov", "dampening 0.1"}));
  // Also when a group is changed after construction.
  SGD opt(params, {0.1, 0.9});
  opt.group(0).nesterov = true;
  opt.group(0).dampening = 0.5;
  set_random_grad(params[0]);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { opt.step(); }, {"Nesterov"}));
}

TEST(SGD, RejectsBadArguments) {
  EXPECT_TRUE(testing::throws_with<ValueError>([] { SGD({}, {}); }, {"empty parameter list"}));
  std::vector<Tensor> params = make_params({{3}}, DType::f64);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { SGD(params, {-0.1}); }, {"learning rate -0.1"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { SGD({params[0], params[0]}); }, {"appears twice"}));
  SGD opt(params);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { opt.add_param_group(params); }, {"already in another"}));
  Tensor ints = zeros({3}, DType::i64);
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { opt.add_param_group({ints}); }, {"i64", "floating-point"}));
  Tensor leaf = make_param({3}, DType::f64);
  Tensor non_leaf = leaf * 2.0;
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { opt.add_param_group({non_leaf}); }, {"not a leaf"}));
}

TEST(SGD, GroupsHaveTheirOwnHyperParameters) {
  std::vector<Tensor> a = make_params({{5}}, DType::f64);
  std::vector<Tensor> b = make_params({{4}}, DType::f64);
  SgdOptions oa{0.1, 0.9};
  SgdOptions ob{0.01, 0.5, 0.1, 0.2};
  SGD opt(a, oa);
  optim::SgdGroup& group = opt.add_param_group(b);
  EXPECT_EQ(group.lr, oa.lr);  // the defaults
  group.lr = ob.lr;
  group.momentum = ob.momentum;
  group.dampening = ob.dampening;
  group.weight_decay = ob.weight_decay;
  SgdReference ra, rb;
  std::vector<double> pa = a[0].to_double_vector(), pb = b[0].to_double_vector();
  for (int s = 0; s < 3; ++s) {
    set_random_grad(a[0]);
    set_random_grad(b[0]);
    ra.step(pa, a[0].grad().to_double_vector(), oa);
    rb.step(pb, b[0].grad().to_double_vector(), ob);
    opt.step();
  }
  EXPECT_TRUE(testing::all_close(a[0], pa, 1e-12, 1e-12));
  EXPECT_TRUE(testing::all_close(b[0], pb, 1e-12, 1e-12));
}

// ---- AdamW ----
TEST(AdamW, DefaultsArePyTorchs) {
  AdamWOptions o;
  EXPECT_EQ(o.lr, 1e-3);
  EXPECT_EQ(o.beta1, 0.9);
  EXPECT_EQ(o.beta2, 0.999);
  EXPECT_EQ(o.eps, 1e-8);
  EXPECT_EQ(o.weight_decay, 1e-2);
}

TEST(AdamW, OneStepMatchesTheRule) {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (AdamWOptions o : {AdamWOptions{}, AdamWOptions{0.01, 0.8, 0.95, 1e-6, 0.1}}) {
      SCOPED_TRACE(dtype_name(dtype));
      std::vector<Tensor> params = make_params(kShapes, dtype);
      AdamW opt(params, o);
      check_against_reference<AdamWReference>(opt, params, o, 1, tolerance(dtype));
    }
  }
}

TEST(AdamW, SeveralStepsMatchTheRule) {
  for (DType dtype : {DType::f64, DType::f32}) {
    for (AdamWOptions o : {AdamWOptions{}, AdamWOptions{0.01, 0.8, 0.95, 1e-6, 0.1}}) {
      SCOPED_TRACE(dtype_name(dtype));
      std::vector<Tensor> params = make_params(kShapes, dtype);
      AdamW opt(params, o);
      check_against_reference<AdamWReference>(opt, params, o, 5, 4 * tolerance(dtype));
    }
  }
}

TEST(AdamW, EachParameterCountsItsOwnSteps) {
  std::vector<Tensor> params = make_params({{6}, {3}}, DType::f64);
  AdamWOptions o{0.05, 0.9, 0.99, 1e-8, 0.01};
  AdamW opt(params, o);
  AdamWReference r0, r1;
  std::vector<double> p0 = params[0].to_double_vector(), p1 = params[1].to_double_vector();
  for (int s = 0; s < 4; ++s) {
    set_random_grad(params[0]);
    r0.step(p0, params[0].grad().to_double_vector(), o);
    if (s % 2 == 1) {  // parameter 1 has a gradient every other step only
      set_random_grad(params[1]);
      r1.step(p1, params[1].grad().to_double_vector(), o);
    } else {
      params[1].set_grad(Tensor());
    }
    opt.step();
  }
  EXPECT_TRUE(testing::all_close(params[0], p0, 1e-12, 1e-12));
  EXPECT_TRUE(testing::all_close(params[1], p1, 1e-12, 1e-12));
  optim::StateDict state = opt.state_dict();
  EXPECT_EQ(state.metadata.at("state.0.step"), 4.0);
  EXPECT_EQ(state.metadata.at("state.1.step"), 2.0);
}

TEST(AdamW, RejectsBadHyperParameters) {
  std::vector<Tensor> params = make_params({{3}}, DType::f64);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { AdamW(params, {1e-3, 1.0}); }, {"beta1 1", "[0, 1)"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { AdamW(params, {1e-3, 0.9, -0.1}); }, {"beta2"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { AdamW(params, {1e-3, 0.9, 0.999, -1.0}); }, {"eps"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { AdamW(params, {1e-3, 0.9, 0.999, 1e-8, -1.0}); },
                                               {"weight_decay"}));
}

// ---- both ----
TEST(Optimizer, ParametersWithoutGradientsAreUntouched) {
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<Tensor> params = make_params({{4}, {3, 2}, {5}}, DType::f64);
    std::unique_ptr<optim::Optimizer> opt;
    if (kind == 0) opt = std::make_unique<SGD>(params, SgdOptions{0.1, 0.9, 0.0, 0.1});
    else opt = std::make_unique<AdamW>(params, AdamWOptions{0.1});
    std::vector<double> before = params[1].to_double_vector();
    std::vector<double> moved = params[0].to_double_vector();
    set_random_grad(params[0]);
    set_random_grad(params[2]);
    opt->step();
    opt->step();
    EXPECT_EQ(params[1].to_double_vector(), before) << opt->name();
    EXPECT_NE(params[0].to_double_vector(), moved) << opt->name();
    optim::StateDict state = opt->state_dict();
    for (const auto& entry : state.tensors) EXPECT_EQ(entry.first.rfind("state.1.", 0), std::string::npos);
    EXPECT_EQ(state.metadata.count("state.1.step"), 0u);
  }
}

TEST(Optimizer, UpdatesTheParameterStorageInPlace) {
  Tensor base = testing::random_tensor({6, 4});
  Tensor p = views::transpose(base, 0, 1);  // a non-contiguous leaf: updated through a copy written back
  p.requires_grad_();
  Tensor q = make_param({7}, DType::f32);
  Tensor q_view = views::narrow(q, 0, 2, 3);
  void* p_data = p.data_ptr();
  void* q_data = q.data_ptr();
  SgdOptions o{0.1, 0.9, 0.0, 0.01};
  SGD opt({p, q}, o);
  SgdReference rp, rq;
  std::vector<double> ep = p.to_double_vector(), eq = q.to_double_vector();
  for (int s = 0; s < 2; ++s) {
    set_random_grad(p);
    set_random_grad(q);
    rp.step(ep, p.grad().to_double_vector(), o);
    rq.step(eq, q.grad().to_double_vector(), o);
    opt.step();
  }
  EXPECT_EQ(p.data_ptr(), p_data);
  EXPECT_EQ(q.data_ptr(), q_data);
  EXPECT_TRUE(opt.param_group(0).params[0].is_same(p));
  EXPECT_TRUE(testing::all_close(p, ep, 1e-12, 1e-12));
  EXPECT_TRUE(testing::all_close(views::transpose(base, 0, 1), ep, 1e-12, 1e-12));
  EXPECT_TRUE(testing::all_close(q, eq, 2e-6, 2e-6));
  EXPECT_TRUE(testing::all_close(q_view, std::vector<double>(eq.begin() + 2, eq.begin() + 5), 2e-6, 2e-6));
}

TEST(Optimizer, SixteenBitParametersKeepF32State) {
  for (bool master : {true, false}) {
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)) + (master ? " with master weights" : " without master weights"));
    std::vector<Tensor> params = make_params({{33}, {2, 9}}, dtype);
    std::vector<Tensor> ref_params;  // the same values in f32, updated in f32
    for (const Tensor& p : params) ref_params.push_back(make_param(p.shape(), DType::f32));
    for (size_t i = 0; i < params.size(); ++i) kernels::copy_(ref_params[i], params[i]);
    AdamWOptions o{0.01};
    o.master_weights = master;
    AdamW opt(params, o);
    AdamW ref(ref_params, o);
    for (int s = 0; s < 3; ++s) {
      for (size_t i = 0; i < params.size(); ++i) {
        set_random_grad(params[i]);
        ref_params[i].set_grad(kernels::to_dtype(params[i].grad(), DType::f32));
      }
      opt.step();
      ref.step();
      // With master weights the parameter is the f32 run rounded; without, each step rounds the
      // parameter to 16 bits, so the reference continues from the rounded values.
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(testing::all_close(params[i], kernels::to_dtype(ref_params[i], dtype), 0.0, 0.0));
        if (!master) kernels::copy_(ref_params[i], params[i]);
      }
    }
    optim::StateDict state = opt.state_dict();
    EXPECT_EQ(state.tensors.at("state.0.exp_avg").dtype(), DType::f32);
    EXPECT_TRUE(testing::all_close(state.tensors.at("state.1.exp_avg_sq"),
                                   ref.state_dict().tensors.at("state.1.exp_avg_sq"), 0.0, 0.0));
    EXPECT_EQ(state.tensors.count("state.0.master"), master ? 1u : 0u);
  }
  }
}

TEST(Optimizer, ZeroGradSetToNone) {
  std::vector<Tensor> params = make_params({{3}, {2, 2}}, DType::f32);
  SGD opt(params);
  set_random_grad(params[0]);
  opt.zero_grad();
  EXPECT_FALSE(params[0].grad().defined());
  EXPECT_FALSE(params[1].grad().defined());
}

TEST(Optimizer, ZeroGradInPlaceKeepsViewsIntoABucket) {
  std::vector<Tensor> params = make_params({{3}, {2, 2}}, DType::f32);
  Tensor bucket = testing::random_tensor({7}, DType::f32);  // as DDP lays gradients out
  params[0].set_grad(views::narrow(bucket, 0, 0, 3));
  params[1].set_grad(views::view(views::narrow(bucket, 0, 3, 4), {2, 2}));
  void* g0 = params[0].grad().data_ptr();
  SGD opt(params);
  opt.zero_grad(false);
  ASSERT_TRUE(params[0].grad().defined());
  EXPECT_EQ(params[0].grad().data_ptr(), g0);
  EXPECT_EQ(bucket.to_double_vector(), std::vector<double>(7, 0.0));
  EXPECT_EQ(params[1].grad().to_double_vector(), std::vector<double>(4, 0.0));
}

// Saves A's state, loads it into B over copies of A's parameters, and checks that both then take
// identical steps.
void check_round_trip(optim::Optimizer& a, std::vector<Tensor>& pa, optim::Optimizer& b, std::vector<Tensor>& pb) {
  for (int s = 0; s < 2; ++s) {
    for (const Tensor& p : pa) set_random_grad(p);
    a.step();
  }
  for (size_t i = 0; i < pa.size(); ++i) kernels::copy_(pb[i], pa[i]);
  b.load_state_dict(a.state_dict());
  for (int s = 0; s < 3; ++s) {
    for (size_t i = 0; i < pa.size(); ++i) {
      set_random_grad(pa[i]);
      pb[i].set_grad(kernels::clone(pa[i].grad()));
    }
    a.step();
    b.step();
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].to_double_vector(), pb[i].to_double_vector()) << i;
  }
  optim::StateDict sa = a.state_dict(), sb = b.state_dict();
  EXPECT_EQ(sa.metadata, sb.metadata);
  ASSERT_EQ(sa.tensors.size(), sb.tensors.size());
  for (const auto& [name, t] : sa.tensors) EXPECT_EQ(t.to_double_vector(), sb.tensors.at(name).to_double_vector());
}

TEST(Optimizer, StateDictRoundTripSGD) {
  std::vector<Tensor> pa = make_params({{4}, {2, 3}}, DType::f32);
  std::vector<Tensor> pb = make_params({{4}, {2, 3}}, DType::f32);
  std::vector<Tensor> ha = make_params({{5}}, DType::f64);
  std::vector<Tensor> hb = make_params({{5}}, DType::f64);
  SGD a(pa, {0.1, 0.9, 0.1, 0.01});
  a.add_param_group(ha, {0.05, 0.8, 0.0, 0.0, true});
  SGD b(pb);  // default hyper-parameters: loading brings A's
  b.add_param_group(hb);
  std::vector<Tensor> all_a = {pa[0], pa[1], ha[0]}, all_b = {pb[0], pb[1], hb[0]};
  check_round_trip(a, all_a, b, all_b);
  EXPECT_EQ(b.group(1).nesterov, true);
  EXPECT_EQ(b.group(0).dampening, 0.1);
  optim::StateDict s = a.state_dict();
  EXPECT_EQ(s.optimizer, "SGD");
  EXPECT_EQ(s.metadata.at("num_param_groups"), 2.0);
  EXPECT_EQ(s.metadata.at("param_groups.1.num_params"), 1.0);
  EXPECT_EQ(s.metadata.at("param_groups.1.lr"), 0.05);
  EXPECT_EQ(s.tensors.count("state.2.momentum_buffer"), 1u);
}

TEST(Optimizer, StateDictRoundTripAdamW) {
  std::vector<Tensor> pa = make_params({{4}, {2, 3}, {1}}, DType::f32);
  std::vector<Tensor> pb = make_params({{4}, {2, 3}, {1}}, DType::f32);
  AdamW a(pa, {0.01, 0.8, 0.95, 1e-6, 0.1});
  AdamW b(pb);
  check_round_trip(a, pa, b, pb);
  EXPECT_EQ(b.group(0).beta2, 0.95);
  optim::StateDict s = a.state_dict();
  EXPECT_EQ(s.optimizer, "AdamW");
  EXPECT_EQ(s.metadata.at("state.0.step"), 5.0);
  EXPECT_EQ(s.metadata.at("param_groups.0.eps"), 1e-6);
  EXPECT_EQ(s.tensors.count("state.2.exp_avg_sq"), 1u);
}

TEST(Optimizer, LoadStateDictErrors) {
  std::vector<Tensor> params = make_params({{4}, {2, 3}}, DType::f32);
  AdamW opt(params, {0.01});
  for (const Tensor& p : params) set_random_grad(p);
  opt.step();
  const optim::StateDict good = opt.state_dict();
  auto load_changed = [&](const std::function<void(optim::StateDict&)>& change) {
    optim::StateDict s = good;
    change(s);
    return [&opt, s] { opt.load_state_dict(s); };
  };

  SGD sgd(make_params({{4}, {2, 3}}, DType::f32));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { sgd.load_state_dict(good); }, {"saved by AdamW", "is SGD"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(load_changed([](auto& s) { s.metadata["num_param_groups"] = 2; }),
                                               {"2 parameter groups", "has 1"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      load_changed([](auto& s) { s.metadata["param_groups.0.num_params"] = 3; }), {"group 0 has 3 parameters"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(load_changed([](auto& s) { s.metadata.erase("param_groups.0.beta1"); }),
                                               {"lacks \"param_groups.0.beta1\""}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      load_changed([](auto& s) { s.tensors["state.1.exp_avg"] = zeros({3, 2}); }),
      {"\"state.1.exp_avg\" has shape [3, 2]", "parameter 1 has shape [2, 3]"}));
  EXPECT_TRUE(testing::throws_with<TypeError>(
      load_changed([](auto& s) { s.tensors["state.0.exp_avg"] = zeros({4}, DType::f64); }),
      {"\"state.0.exp_avg\" is f64", "f32"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(
      load_changed([](auto& s) { s.tensors["state.0.momentum_buffer"] = zeros({4}); }), {"not state of a f32 parameter of AdamW"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(load_changed([](auto& s) { s.tensors["state.7.exp_avg"] = zeros({4}); }),
                                               {"parameter 7", "has 2 parameters"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(load_changed([](auto& s) { s.tensors["weights"] = zeros({4}); }),
                                               {"unexpected tensor \"weights\""}));
  EXPECT_TRUE(testing::throws_with<ValueError>(load_changed([](auto& s) { s.tensors.erase("state.1.exp_avg_sq"); }),
                                               {"parameter 1", "lacks its exp_avg_sq"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(load_changed([](auto& s) { s.metadata["state.0.step"] = 0.5; }),
                                               {"\"state.0.step\" must be a whole number >= 1"}));
  EXPECT_TRUE(testing::throws_with<ValueError>(load_changed([](auto& s) { s.metadata["momentum"] = 0.9; }),
                                               {"unexpected metadata \"momentum\""}));

  // A hyper-parameter out of range is refused and nothing changes.
  optim::StateDict bad = good;
  bad.metadata["param_groups.0.beta1"] = 1.5;
  bad.metadata["param_groups.0.lr"] = 0.5;
  std::vector<double> before = opt.state_dict().tensors.at("state.0.exp_avg").to_double_vector();
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { opt.load_state_dict(bad); }, {"beta1 1.5"}));
  EXPECT_EQ(opt.group(0).lr, 0.01);
  EXPECT_EQ(opt.group(0).beta1, 0.9);
  EXPECT_EQ(opt.state_dict().tensors.at("state.0.exp_avg").to_double_vector(), before);
}

// ---- schedules ----
std::unique_ptr<SGD> two_group_sgd(double lr0, double lr1) {
  auto opt = std::make_unique<SGD>(make_params({{2}}, DType::f32), SgdOptions{lr0});
  opt->add_param_group(make_params({{2}}, DType::f32)).lr = lr1;
  return opt;
}

TEST(Schedule, StepLR) {
  optim::StepLR s(3, 0.5);
  for (int64_t step : {0, 2, 3, 5, 6, 7, 30}) {
    EXPECT_DOUBLE_EQ(s.lr_at(step, 0.2), 0.2 * std::pow(0.5, static_cast<double>(step / 3))) << step;
  }
  auto opt = two_group_sgd(0.2, 0.02);
  for (int i = 0; i < 7; ++i) s.step(*opt);
  EXPECT_EQ(s.last_step(), 7);
  EXPECT_DOUBLE_EQ(opt->param_group(0).lr, 0.2 * 0.25);
  EXPECT_DOUBLE_EQ(opt->param_group(1).lr, 0.02 * 0.25);
  EXPECT_EQ(opt->param_group(1).initial_lr, 0.02);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.2 * 0.125);
}

TEST(Schedule, CosineAnnealingLR) {
  optim::CosineAnnealingLR s(10, 0.001);
  auto closed = [](int64_t step, double base) {
    return 0.001 + (base - 0.001) * (1 + std::cos(kPi * step / 10.0)) / 2;
  };
  for (int64_t step : {0, 1, 5, 9, 10, 13, 20}) EXPECT_NEAR(s.lr_at(step, 0.1), closed(step, 0.1), 1e-15) << step;
  EXPECT_NEAR(s.lr_at(10, 0.1), 0.001, 1e-15);
  auto opt = two_group_sgd(0.1, 0.05);
  s.apply(*opt, 4);
  EXPECT_NEAR(opt->param_group(0).lr, closed(4, 0.1), 1e-15);
  EXPECT_NEAR(opt->param_group(1).lr, closed(4, 0.05), 1e-15);
  s.step(*opt);
  EXPECT_EQ(s.last_step(), 5);
  EXPECT_NEAR(opt->param_group(1).lr, closed(5, 0.05), 1e-15);
}

TEST(Schedule, WarmupCosine) {
  optim::WarmupCosineLR s(5, 25, 1e-4);
  const double base = 3e-3;
  auto closed = [&](int64_t step) {
    if (step < 5) return base * step / 5.0;
    double progress = std::min(1.0, (step - 5) / 20.0);
    return 1e-4 + (base - 1e-4) * 0.5 * (1 + std::cos(kPi * progress));
  };
  for (int64_t step : {0, 1, 4, 5, 6, 15, 24, 25, 40}) EXPECT_NEAR(s.lr_at(step, base), closed(step), 1e-15) << step;
  EXPECT_EQ(s.lr_at(0, base), 0.0);
  EXPECT_NEAR(s.lr_at(5, base), base, 1e-15);
  EXPECT_NEAR(s.lr_at(15, base), (base + 1e-4) / 2, 1e-15);
  EXPECT_NEAR(s.lr_at(40, base), 1e-4, 1e-15);

  auto opt = two_group_sgd(base, base / 10);
  s.apply(*opt, 0);
  EXPECT_EQ(opt->param_group(0).lr, 0.0);
  for (int i = 0; i < 15; ++i) s.step(*opt);
  EXPECT_NEAR(opt->param_group(0).lr, closed(15), 1e-15);
  EXPECT_NEAR(opt->param_group(1).lr, 1e-4 + (base / 10 - 1e-4) / 2, 1e-15);
}

TEST(Schedule, Errors) {
  EXPECT_TRUE(testing::throws_with<ValueError>([] { optim::StepLR(0); }, {"step_size must be > 0"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([] { optim::CosineAnnealingLR(0); }, {"t_max must be > 0"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([] { optim::WarmupCosineLR(10, 10); }, {"warmup_steps < total_steps"}));
  optim::StepLR s(2);
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { s.lr_at(3); }, {"no base learning rate", "lr_at(step, base_lr)"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { s.lr_at(-1, 0.1); }, {"step must be >= 0"}));
}

// ---- gradient clipping ----
double direct_norm(const std::vector<Tensor>& params) {
  double sum = 0.0;
  for (const Tensor& p : params) {
    if (!p.grad().defined()) continue;
    for (double v : p.grad().to_double_vector()) sum += v * v;
  }
  return std::sqrt(sum);
}

TEST(ClipGradNorm, ScalesEveryGradientByTheGlobalNorm) {
  for (DType dtype : {DType::f64, DType::f32}) {
    SCOPED_TRACE(dtype_name(dtype));
    std::vector<Tensor> params = make_params({{10}, {3, 4}, {1}, {6}}, dtype);
    for (size_t i = 0; i < params.size(); ++i) {
      if (i != 2) set_random_grad(params[i]);  // parameter 2 has none: skipped
    }
    double norm = direct_norm(params);
    std::vector<std::vector<double>> before;
    for (const Tensor& p : params) {
      before.push_back(p.grad().defined() ? p.grad().to_double_vector() : std::vector<double>());
    }
    double max_norm = norm / 3;
    Tensor result = optim::clip_grad_norm_(params, max_norm);
    EXPECT_EQ(result.dim(), 0);
    EXPECT_EQ(result.dtype(), dtype);
    EXPECT_NEAR(result.item(), norm, norm * tolerance(dtype));
    double coef = max_norm / (norm + 1e-6);
    for (size_t i = 0; i < params.size(); ++i) {
      if (i == 2) {
        EXPECT_FALSE(params[i].grad().defined());
        continue;
      }
      std::vector<double> expected = before[i];
      for (double& v : expected) v *= coef;
      EXPECT_TRUE(testing::all_close(params[i].grad(), expected, tolerance(dtype), tolerance(dtype)));
    }
    EXPECT_NEAR(direct_norm(params), max_norm, 1e-5 * max_norm);
  }
}

TEST(ClipGradNorm, LeavesGradientsUnderTheLimitAlone) {
  std::vector<Tensor> params = make_params({{5}, {2, 2}}, DType::f32);
  for (const Tensor& p : params) set_random_grad(p);
  std::vector<double> g0 = params[0].grad().to_double_vector(), g1 = params[1].grad().to_double_vector();
  double norm = direct_norm(params);
  Tensor result = optim::clip_grad_norm_(params, norm * 2);
  EXPECT_NEAR(result.item(), norm, norm * 1e-6);
  EXPECT_EQ(params[0].grad().to_double_vector(), g0);
  EXPECT_EQ(params[1].grad().to_double_vector(), g1);
  // No gradient at all: a norm of 0.
  Tensor none = optim::clip_grad_norm_(make_params({{3}}, DType::f32), 1.0);
  EXPECT_EQ(none.item(), 0.0);
}

TEST(ClipGradNorm, SixteenBitGradientsAccumulateInF32) {
  std::vector<Tensor> params = make_params({{300}, {7}}, DType::bf16);
  for (const Tensor& p : params) set_random_grad(p);
  double norm = direct_norm(params);
  Tensor result = optim::clip_grad_norm_(params, 1.0);
  EXPECT_EQ(result.dtype(), DType::f32);
  EXPECT_NEAR(result.item(), norm, norm * 1e-6);
  EXPECT_NEAR(direct_norm(params), 1.0, 1e-2);
}

// ---- GPU: the fused CUDA kernels against the CPU ones ----
const Device kCuda("cuda:0");

double parity_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return 1e-5;
    case DType::f16: return 2e-3;
    default: return 1e-2;  // bf16: a rounding that flips one bit of the 8-bit mantissa
  }
}

// Tensors of assorted sizes, on the GPU; the `misaligned` ones are views one element into a
// larger tensor, so their addresses do not allow vector loads.
struct GpuLists {
  std::vector<Tensor> params, grads;
};

std::vector<Tensor> assorted(DType dtype, const std::vector<int64_t>& sizes, bool misaligned) {
  std::vector<Tensor> out;
  for (int64_t n : sizes) {
    Tensor base = kernels::to_device(kernels::to_dtype(testing::random_tensor({n + 1}), dtype), kCuda);
    out.push_back(misaligned ? views::narrow(base, 0, 1, n) : views::narrow(base, 0, 0, n));
  }
  return out;
}

std::vector<Tensor> to_cpu(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(kernels::clone(kernels::to_device(t, Device())));
  return out;
}

std::vector<Tensor> state_like(const std::vector<Tensor>& params, bool random) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    DType dtype = optimizer_state_dtype(p.dtype());
    Tensor s = random ? kernels::to_dtype(testing::random_uniform(p.shape(), 0.0, 1.0), dtype)
                      : zeros(p.shape(), dtype);
    out.push_back(kernels::to_device(s, p.device()));
  }
  return out;
}

void expect_parity(const std::vector<Tensor>& gpu, const std::vector<Tensor>& cpu, double tol, const char* what) {
  for (size_t i = 0; i < gpu.size(); ++i) {
    EXPECT_TRUE(testing::all_close(kernels::to_device(gpu[i], Device()), cpu[i], tol, tol)) << what << " " << i;
  }
}

const std::vector<int64_t> kSizes = {1, 3, 1000, 65537, 4, 8191, 2};

UpdateTensors lists(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<std::vector<Tensor>>& states, const std::vector<Tensor>& steps = {}) {
  UpdateTensors t;
  t.params = params;
  t.grads = grads;
  t.states = states;
  t.steps = steps;
  return t;
}

// 0-dim f32 step counts, one per parameter, each at a different count.
std::vector<Tensor> step_counts(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    out.push_back(full({}, static_cast<double>(i % 3), TensorOptions(DType::f32, params[i].device())));
  }
  return out;
}

// Master weights (f32) and GradScaler's scaling: the GPU kernels against the CPU ones, for a
// clean step (unscaled by 1/8 as gradients are read, masters written back rounded) and a skipped
// one (nothing changes, step counts included).
TEST(OptimCuda, MasterWeightsAndScalingMatchCpu) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (bool misaligned : {false, true}) {
      for (bool adamw : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(dtype)) + (misaligned ? " misaligned" : "") + (adamw ? " adamw" : " sgd"));
        std::vector<Tensor> gp = assorted(dtype, kSizes, misaligned);
        std::vector<Tensor> gmaster;
        for (const Tensor& p : gp) gmaster.push_back(kernels::to_dtype(p, DType::f32));
        std::vector<Tensor> cp = to_cpu(gp), cmaster = to_cpu(gmaster);
        std::vector<Tensor> gm = state_like(gp, true), gv = state_like(gp, true);
        std::vector<Tensor> cm = to_cpu(gm), cv = to_cpu(gv);
        std::vector<Tensor> gs = step_counts(gp), cs = to_cpu(gs);
        for (int s = 0; s < 3; ++s) {
          const bool skip = s == 1;
          std::vector<Tensor> gg = assorted(dtype, kSizes, misaligned);
          std::vector<Tensor> cg = to_cpu(gg);
          UpdateTensors g = adamw ? lists(gp, gg, {gm, gv}, gs) : lists(gp, gg, {gm});
          UpdateTensors c = adamw ? lists(cp, cg, {cm, cv}, cs) : lists(cp, cg, {cm});
          g.masters = gmaster;
          c.masters = cmaster;
          g.found_inf = full({}, skip ? 1.0 : 0.0, TensorOptions(DType::f32, kCuda));
          c.found_inf = full({}, skip ? 1.0 : 0.0, DType::f32);
          g.inv_scale = full({}, 0.125, TensorOptions(DType::f32, kCuda));
          c.inv_scale = full({}, 0.125, DType::f32);
          const std::vector<Tensor> before = to_cpu(gmaster);
          if (adamw) {
            AdamWHyper h{0.01, 0.8, 0.95, 1e-6, 0.1};
            kernels::adamw_step(g, h);
            kernels::adamw_step(c, h);
          } else {
            SgdHyper h{0.1, 0.9, 0.0, 0.01, true};
            kernels::sgd_step(g, h);
            kernels::sgd_step(c, h);
          }
          expect_parity(gmaster, cmaster, 1e-5, "master");
          expect_parity(gm, cm, 1e-5, "state");
          if (adamw) expect_parity(gs, cs, 0.0, "step count");
          for (size_t i = 0; i < gp.size(); ++i) {
            // The parameter is its master rounded, and a skipped step changed nothing.
            Tensor rounded = kernels::to_dtype(kernels::to_device(gmaster[i], Device()), dtype);
            EXPECT_TRUE(testing::all_close(kernels::to_device(gp[i], Device()), rounded, 0.0, 0.0)) << i;
            if (skip) {
              EXPECT_TRUE(testing::all_close(kernels::to_device(gmaster[i], Device()), before[i], 0.0, 0.0)) << i;
            }
          }
          cp = to_cpu(gp);
          cmaster = to_cpu(gmaster);
          cm = to_cpu(gm);
          cv = to_cpu(gv);
        }
        if (adamw) {
          // Two clean steps from counts i % 3: the counts went up by 2.
          for (size_t i = 0; i < gs.size(); ++i) EXPECT_EQ(gs[i].item_double(), static_cast<double>(i % 3 + 2));
        }
      }
    }
  }
  cuda::set_poison_allocations(false);
}

// GradScaler's check: a gradient list with one inf (and one with a NaN) sets the flag on the
// GPU as on the CPU; unscaling multiplies in place.
TEST(OptimCuda, NonFiniteCheckAndUnscaleMatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (double bad : {0.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " bad " + std::to_string(bad));
      std::vector<Tensor> gg = assorted(dtype, kSizes, true);
      if (bad != 0.0) {
        Tensor one = views::narrow(gg[3], 0, 65000, 1);
        kernels::fill_(one, bad);
      }
      std::vector<Tensor> cg = to_cpu(gg);
      Tensor gf = zeros({}, TensorOptions(DType::f32, kCuda)), cf = zeros({}, DType::f32);
      Tensor gi = full({}, 0.25, TensorOptions(DType::f32, kCuda)), ci = full({}, 0.25, DType::f32);
      kernels::non_finite_check_and_unscale_(gg, gf, gi);
      kernels::non_finite_check_and_unscale_(cg, cf, ci);
      EXPECT_EQ(gf.item_double(), bad != 0.0 ? 1.0 : 0.0);
      EXPECT_EQ(cf.item_double(), gf.item_double());
      if (bad == 0.0) expect_parity(gg, cg, 0.0, "unscaled gradient");
    }
  }
}

TEST(OptimCuda, SgdStepMatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (bool misaligned : {false, true}) {
      for (const SgdCase& c : sgd_cases()) {
        SCOPED_TRACE(std::string(c.name) + " " + dtype_name(dtype) + (misaligned ? " misaligned" : ""));
        std::vector<Tensor> gp = assorted(dtype, kSizes, misaligned);
        std::vector<Tensor> cp = to_cpu(gp);
        bool momentum = c.options.momentum != 0.0;
        std::vector<Tensor> gb = momentum ? state_like(gp, false) : std::vector<Tensor>();
        std::vector<Tensor> cb = to_cpu(gb);
        SgdHyper h{c.options.lr, c.options.momentum, c.options.dampening, c.options.weight_decay, c.options.nesterov};
        for (int s = 0; s < 3; ++s) {
          h.first_step = s == 0;
          std::vector<Tensor> gg = assorted(dtype, kSizes, misaligned);
          std::vector<Tensor> cg = to_cpu(gg);
          using Roles = std::vector<std::vector<Tensor>>;
          kernels::sgd_step(lists(gp, gg, momentum ? Roles{gb} : Roles{}), h);
          kernels::sgd_step(lists(cp, cg, momentum ? Roles{cb} : Roles{}), h);
          // Each step rounds 16-bit parameters; continue both from the GPU's values.
          expect_parity(gp, cp, parity_tolerance(dtype), "param");
          expect_parity(gb, cb, parity_tolerance(DType::f32), "momentum buffer");
          cp = to_cpu(gp);
          cb = to_cpu(gb);
        }
      }
    }
  }
  cuda::set_poison_allocations(false);
}

TEST(OptimCuda, AdamWStepMatchesCpu) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
    for (bool misaligned : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (misaligned ? " misaligned" : ""));
      std::vector<Tensor> gp = assorted(dtype, kSizes, misaligned);
      std::vector<Tensor> cp = to_cpu(gp);
      std::vector<Tensor> gm = state_like(gp, true), gv = state_like(gp, true);
      std::vector<Tensor> cm = to_cpu(gm), cv = to_cpu(gv);
      std::vector<Tensor> gs = step_counts(gp), cs = to_cpu(gs);
      AdamWHyper h{0.01, 0.8, 0.95, 1e-6, 0.1};
      for (int s = 1; s <= 3; ++s) {
        std::vector<Tensor> gg = assorted(dtype, kSizes, misaligned);
        std::vector<Tensor> cg = to_cpu(gg);
        kernels::adamw_step(lists(gp, gg, {gm, gv}, gs), h);
        kernels::adamw_step(lists(cp, cg, {cm, cv}, cs), h);
        expect_parity(gs, cs, 0.0, "step count");
        expect_parity(gp, cp, parity_tolerance(dtype), "param");
        expect_parity(gm, cm, parity_tolerance(DType::f32), "exp_avg");
        expect_parity(gv, cv, parity_tolerance(DType::f32), "exp_avg_sq");
        cp = to_cpu(gp);
        cm = to_cpu(gm);
        cv = to_cpu(gv);
      }
    }
  }
  cuda::set_poison_allocations(false);
}

TEST(OptimCuda, ManyTensorsAndMixedDtypesInOneCall) {
  TANDEM_REQUIRE_CUDA();
  std::vector<int64_t> sizes = {0};  // empty tensors first, in the middle and last: no chunks of their own
  for (int i = 0; i < 300; ++i) sizes.push_back(i == 150 ? 0 : 1 + (i * 7919) % 5000);
  sizes.push_back(0);
  std::vector<Tensor> gp = assorted(DType::f32, sizes, false);
  std::vector<Tensor> half = assorted(DType::bf16, {17, 70000}, true);
  gp.insert(gp.end(), half.begin(), half.end());
  std::vector<Tensor> gg;
  for (const Tensor& p : gp) {
    gg.push_back(kernels::to_device(kernels::to_dtype(testing::random_tensor(p.shape()), p.dtype()), kCuda));
  }
  std::vector<Tensor> cp = to_cpu(gp), cg = to_cpu(gg);
  std::vector<Tensor> gm = state_like(gp, false), gv = state_like(gp, false);
  std::vector<Tensor> cm = to_cpu(gm), cv = to_cpu(gv);
  AdamWHyper h;
  std::vector<Tensor> gs = step_counts(gp), cs = to_cpu(gs);
  kernels::adamw_step(lists(gp, gg, {gm, gv}, gs), h);
  kernels::adamw_step(lists(cp, cg, {cm, cv}, cs), h);
  for (size_t i = 0; i < gp.size(); ++i) {
    EXPECT_TRUE(testing::all_close(kernels::to_device(gp[i], Device()), cp[i], parity_tolerance(gp[i].dtype()),
                                   parity_tolerance(gp[i].dtype())))
        << i;
  }
  expect_parity(gv, cv, 1e-5, "exp_avg_sq");
}

// Lists of up to 32 tensors pass their tables inline in the kernel's parameters, longer ones upload
// them (core/cuda/optim.cu): 33 tensors updated in one call (uploaded) and the same tensors as 32
// and 1 (inline) end bit for bit alike, eagerly and with found_inf and inv_scale.
TEST(OptimCuda, InlineAndUploadedTablesGiveTheSameUpdate) {
  TANDEM_REQUIRE_CUDA();
  std::vector<int64_t> sizes;
  for (int i = 0; i < 33; ++i) sizes.push_back(1 + (i * 7919) % 9000);
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::vector<Tensor> start = to_cpu(assorted(dtype, sizes, false));
    const std::vector<Tensor> grads = assorted(dtype, sizes, false);
    std::vector<Tensor> results[2];  // [0] one call, [1] two calls; params then both moments
    for (int split = 0; split < 2; ++split) {
      std::vector<Tensor> gp;
      for (const Tensor& p : start) gp.push_back(kernels::to_device(p, kCuda));
      std::vector<Tensor> gm = state_like(gp, false), gv = state_like(gp, false), gs = step_counts(gp);
      UpdateTensors all = lists(gp, grads, {gm, gv}, gs);
      all.found_inf = zeros({}, TensorOptions(DType::f32, kCuda));
      all.inv_scale = full({}, 0.5, TensorOptions(DType::f32, kCuda));
      const AdamWHyper h{0.01, 0.8, 0.95, 1e-6, 0.1};
      for (int s = 0; s < 2; ++s) {
        if (split == 0) {
          kernels::adamw_step(all, h);
          continue;
        }
        for (auto [begin, end] : {std::pair<size_t, size_t>{0, 32}, {32, 33}}) {
          auto part = [&](const std::vector<Tensor>& v) {
            return std::vector<Tensor>(v.begin() + begin, v.begin() + end);
          };
          UpdateTensors some = lists(part(gp), part(grads), {part(gm), part(gv)}, part(gs));
          some.found_inf = all.found_inf;
          some.inv_scale = all.inv_scale;
          kernels::adamw_step(some, h);
        }
      }
      for (const auto* list : {&gp, &gm, &gv}) {
        for (const Tensor& t : *list) results[split].push_back(kernels::to_device(t, Device()));
      }
    }
    for (size_t i = 0; i < results[0].size(); ++i) {
      EXPECT_TRUE(testing::all_close(results[1][i], results[0][i], 0.0, 0.0)) << i;
    }
  }
}

TEST(OptimCuda, OptimizersAndClippingOnTheGpuMatchTheCpu) {
  TANDEM_REQUIRE_CUDA();
  for (int kind = 0; kind < 2; ++kind) {
    std::vector<Tensor> cpu_params = make_params({{1000}, {3, 5}, {1}}, DType::f32);
    std::vector<Tensor> gpu_params;
    for (const Tensor& p : cpu_params) {
      Tensor g = kernels::to_device(p, kCuda);
      g.requires_grad_();
      gpu_params.push_back(g);
    }
    std::unique_ptr<optim::Optimizer> c, g;
    if (kind == 0) {
      c = std::make_unique<SGD>(cpu_params, SgdOptions{0.1, 0.9, 0.0, 0.01, true});
      g = std::make_unique<SGD>(gpu_params, SgdOptions{0.1, 0.9, 0.0, 0.01, true});
    } else {
      c = std::make_unique<AdamW>(cpu_params, AdamWOptions{0.01});
      g = std::make_unique<AdamW>(gpu_params, AdamWOptions{0.01});
    }
    for (int s = 0; s < 3; ++s) {
      for (size_t i = 0; i < cpu_params.size(); ++i) {
        set_random_grad(cpu_params[i]);
        gpu_params[i].set_grad(kernels::to_device(cpu_params[i].grad(), kCuda));
      }
      Tensor cn = optim::clip_grad_norm_(cpu_params, 5.0);
      Tensor gn = optim::clip_grad_norm_(gpu_params, 5.0);
      EXPECT_EQ(gn.device(), kCuda);
      EXPECT_NEAR(gn.item(), cn.item(), 1e-5 * cn.item());
      c->step();
      g->step();
      for (size_t i = 0; i < cpu_params.size(); ++i) {
        EXPECT_TRUE(testing::all_close(kernels::to_device(gpu_params[i], Device()), cpu_params[i], 1e-5, 1e-5))
            << c->name() << " step " << s << " param " << i;
      }
    }
    // The GPU state loads into a CPU optimizer (and the other way round).
    c->load_state_dict(g->state_dict());
    g->load_state_dict(c->state_dict());
  }
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// step_some in two parts (as DDP splits a step around the last bucket) equals one step().
TEST(Optimizer, StepSomeInTwoPartsEqualsOneStep) {
  std::vector<Tensor> whole, split;
  for (const Shape& shape : {Shape{3, 4}, Shape{5}, Shape{2, 2}}) {
    Tensor p = testing::random_tensor(shape, DType::f32);
    whole.push_back(clone(p).requires_grad_());
    split.push_back(clone(p).requires_grad_());
  }
  AdamW one(whole, {1e-2}), two(split, {1e-2});
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < whole.size(); ++i) {
      Tensor g = testing::random_tensor(whole[i].shape(), DType::f32);
      whole[i].set_grad(clone(g));
      split[i].set_grad(clone(g));
    }
    one.step();
    auto is_first = [&](const Tensor& p) { return p.data_ptr() == split[0].data_ptr(); };
    two.step_some([&](const Tensor& p) { return !is_first(p); });
    two.step_some(is_first);
  }
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_TRUE(testing::all_close(split[i], whole[i], 0, 0)) << i;
}

}  // namespace
}  // namespace tandem
