// Compact master weights (core/master_halves.h, optim/optimizer.h): a bf16 parameter's f32 master
// kept as the parameter (its high half) plus a 16-bit low half. The split is exact; updates
// through it give the f32 masters' bits; checkpoints hold whole f32 masters and load into either
// kind; the GPU's update and conversions give the CPU's bits.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/master_halves.h"
#include "tandem/core/views.h"

namespace tandem {
namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

bool is_nan_pattern(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }

// ---- the split of one master ----

TEST(MasterHalves, JoiningTheHalvesGivesEveryMasterBack) {
  std::mt19937_64 gen(testing::next_seed());
  std::vector<uint32_t> masters = {
      0x00000000u, 0x80000000u,               // +0, -0
      0x00000001u, 0x00008000u, 0x80018000u,  // subnormals, a tie among them
      0x3f808000u, 0x3f818000u, 0xbf808000u,  // ties under an even and an odd high half
      0x3f807fffu, 0x3f80ffffu, 0x3f7fffffu,  // either side of a tie, the top of a binade
      0x7f7fffffu, 0x7f7f8000u, 0xff7fffffu,  // the largest finite values: their high halves are inf
      0x7f800000u, 0xff800000u,               // inf, -inf
  };
  for (int i = 0; i < 1000000; ++i) masters.push_back(static_cast<uint32_t>(gen()));
  int ties = 0;
  for (uint32_t x : masters) {
    const uint16_t high = master_halves::high(x), low = master_halves::low(x);
    if (is_nan_pattern(x)) {
      ASSERT_TRUE(std::isnan(float(BFloat16(float_of(x))))) << std::hex << x;
      ASSERT_TRUE(is_nan_pattern(uint32_t(high) << 16)) << std::hex << x;
      ASSERT_TRUE(is_nan_pattern(master_halves::join(high, low))) << std::hex << x;
      continue;
    }
    ASSERT_EQ(master_halves::join(high, low), x) << std::hex << x;
    // The parameter is the master rounded to nearest: as tandem's bf16 conversion (ties to even)
    // except on an exact tie under an even high half, which goes away from zero.
    const uint16_t to_even = BFloat16::from_float(float_of(x));
    const bool tie_under_even = (x & 0xffffu) == 0x8000u && ((x >> 16) & 1u) == 0;
    ties += tie_under_even;
    ASSERT_EQ(high, tie_under_even ? to_even + 1 : to_even) << std::hex << x;
  }
  EXPECT_GE(ties, 3);  // the listed ones, at least
}

TEST(MasterHalves, AnyLowHalfKeepsTheParameter) {
  // Whatever low half sits beside a parameter (one written by other code, say), the master they
  // make rounds back to that parameter: an update never jumps from it.
  std::mt19937_64 gen(testing::next_seed());
  for (int i = 0; i < 1000000; ++i) {
    const auto high = static_cast<uint16_t>(gen()), low = static_cast<uint16_t>(gen());
    if (is_nan_pattern(uint32_t(high) << 16)) continue;
    ASSERT_EQ(master_halves::high(master_halves::join(high, low)), high) << std::hex << high << " " << low;
  }
}

TEST(MasterHalves, JoinMatchesItsDefinitionWhereTheOffsetCrossesABoundary) {
  // join checks whether the master rounds back to its parameter only for NaN patterns; the
  // definition checks every pair. Every low half beside the parameters where an offset can cross
  // into the other sign, into NaN or past the largest finite value, and beside a few others.
  auto defined_join = [](uint16_t high, uint16_t low) {
    const uint32_t offset = low >= 0x8000u ? 0x10000u : 0u;
    const uint32_t bits = (uint32_t(high) << 16) + low - offset;
    return master_halves::high(bits) == high ? bits : uint32_t(high) << 16;
  };
  const uint16_t highs[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x7f7f, 0xff7f, 0x7f80,
                            0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x3f80, 0xbf80, 0xffff};
  for (uint16_t high : highs) {
    for (uint32_t low = 0; low <= 0xffffu; ++low) {
      ASSERT_EQ(master_halves::join(high, static_cast<uint16_t>(low)), defined_join(high, static_cast<uint16_t>(low)))
          << std::hex << high << " " << low;
    }
  }
}

// Fresh f32 masters of `shape`, on `device`: random values over many binades, with an exact tie
// (low half 0x8000) every 7th element.
Tensor random_masters(const Shape& shape, Device device) {
  Tensor m = kernels::to_dtype(testing::random_tensor(shape), DType::f32);
  float* v = m.data<float>();
  for (int64_t i = 0; i < m.numel(); ++i) {
    v[i] *= std::ldexp(1.0f, static_cast<int>(i % 41) - 20);
    if (i % 7 == 3) v[i] = float_of((bits_of(v[i]) & 0xffff0000u) | 0x8000u);
  }
  return kernels::to_device(m, device);
}

void expect_split_and_join_exact(Device device) {
  for (bool transposed : {false, true}) {
    SCOPED_TRACE(transposed ? "transposed parameter" : "contiguous parameter");
    Tensor master = random_masters({37, 29}, device);
    Tensor param = transposed ? views::transpose(empty({29, 37}, TensorOptions(DType::bf16, device)), 0, 1)
                              : empty({37, 29}, TensorOptions(DType::bf16, device));
    Tensor low = empty({37, 29}, TensorOptions(DType::bf16, device));
    kernels::split_master_(master, param, low);
    Tensor joined = kernels::join_master_halves(param, low);
    EXPECT_EQ(joined.dtype(), DType::f32);
    Tensor m = kernels::contiguous(kernels::to_device(master, Device()));
    Tensor p = kernels::contiguous(kernels::to_device(param, Device()));
    Tensor j = kernels::to_device(joined, Device());
    for (int64_t i = 0; i < m.numel(); ++i) {
      const uint32_t x = bits_of(m.data<float>()[i]);
      ASSERT_EQ(bits_of(j.data<float>()[i]), x) << i;
      ASSERT_EQ(p.data<BFloat16>()[i].bits, master_halves::high(x)) << i;
    }
  }
}

TEST(MasterHalves, KernelsSplitAndJoinTensors) { expect_split_and_join_exact(Device()); }

TEST(MasterHalves, KernelsCheckTheirArguments) {
  Tensor master = random_masters({4, 3}, Device());
  Tensor param = empty({4, 3}, DType::bf16), low = empty({4, 3}, DType::bf16);
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { kernels::split_master_(master, empty({4, 3}, DType::f16), low); },
                                              {"split_master_", "must both be bf16", "f16"}));
  EXPECT_TRUE(testing::throws_with<ValueError>([&] { kernels::split_master_(master, param, empty({3, 4}, DType::bf16)); },
                                               {"low halves have shape [3, 4]", "parameter has shape [4, 3]"}));
  EXPECT_TRUE(testing::throws_with<TypeError>(
      [&] { kernels::split_master_(kernels::to_dtype(master, DType::f64), param, low); }, {"master must be f32"}));
  EXPECT_TRUE(testing::throws_with<TypeError>([&] { kernels::join_master_halves(param, empty({4, 3}, DType::f32)); },
                                              {"join_master_halves", "must both be bf16"}));
}

// ---- the optimizers ----

// bf16 parameters of assorted shapes, one channels-last, on `device`.
std::vector<Tensor> bf16_params(Device device) {
  std::vector<Tensor> params;
  for (const Shape& s : std::vector<Shape>{{1}, {3}, {1000}, {7, 33}}) {
    params.push_back(kernels::to_device(kernels::to_dtype(testing::random_tensor(s), DType::bf16), device));
  }
  params.push_back(kernels::contiguous(
      kernels::to_device(kernels::to_dtype(testing::random_tensor({2, 6, 4, 5}), DType::bf16), device),
      MemoryFormat::channels_last));
  for (Tensor& p : params) p.requires_grad_();
  return params;
}

std::vector<Tensor> clones(const std::vector<Tensor>& params) {
  std::vector<Tensor> out;
  for (const Tensor& p : params) {
    Tensor c = kernels::clone(p);
    c.requires_grad_();
    out.push_back(c);
  }
  return out;
}

std::unique_ptr<optim::Optimizer> make_optimizer(bool adamw, const std::vector<Tensor>& params, bool compact) {
  if (adamw) {
    optim::AdamWOptions o{0.01, 0.8, 0.95, 1e-6, 0.1};
    o.compact_masters = compact;
    return std::make_unique<optim::AdamW>(params, o);
  }
  optim::SgdOptions o{0.05, 0.9, 0.0, 0.01, true};
  o.compact_masters = compact;
  return std::make_unique<optim::SGD>(params, o);
}

// Every tensor of a's state equals b's bit for bit (masters as f32 through state_dict).
void expect_same_state(const optim::Optimizer& a, const optim::Optimizer& b) {
  optim::StateDict sa = a.state_dict(), sb = b.state_dict();
  EXPECT_EQ(sa.metadata, sb.metadata);
  ASSERT_EQ(sa.tensors.size(), sb.tensors.size());
  for (const auto& [name, t] : sa.tensors) {
    ASSERT_TRUE(sb.tensors.count(name)) << name;
    EXPECT_EQ(t.dtype(), sb.tensors.at(name).dtype()) << name;
    EXPECT_TRUE(testing::all_close(kernels::to_device(t, Device()), kernels::to_device(sb.tensors.at(name), Device()),
                                   0.0, 0.0))
        << name;
  }
}

// Each parameter is its f32 master's high half.
void expect_parameters_are_high_halves(const optim::Optimizer& opt, const std::vector<Tensor>& params) {
  optim::StateDict s = opt.state_dict();
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor master = kernels::contiguous(kernels::to_device(s.tensors.at(optim::state_key(i, "master")), Device()));
    Tensor p = kernels::contiguous(kernels::to_device(params[i], Device()));
    for (int64_t k = 0; k < p.numel(); ++k) {
      ASSERT_EQ(p.data<BFloat16>()[k].bits, master_halves::high(bits_of(master.data<float>()[k])))
          << "parameter " << i << " element " << k;
    }
  }
}

// Two copies of the same bf16 parameters, one stepped with f32 masters and one with compact ones,
// given the same gradients (and GradScaler's flag and 1 / scale: step 2 is skipped): the masters
// and moments agree bit for bit after every step, and each compact parameter is its master's high
// half, where the other is its master rounded to even.
void expect_compact_gives_the_f32_masters(Device device) {
  for (bool adamw : {true, false}) {
    SCOPED_TRACE(adamw ? "AdamW" : "SGD");
    std::vector<Tensor> full_params = bf16_params(device), compact_params = clones(full_params);
    auto whole = make_optimizer(adamw, full_params, false);
    auto compact = make_optimizer(adamw, compact_params, true);
    for (int s = 0; s < 5; ++s) {
      SCOPED_TRACE("step " + std::to_string(s));
      for (size_t i = 0; i < full_params.size(); ++i) {
        Tensor g = kernels::to_device(kernels::to_dtype(testing::random_tensor(full_params[i].shape()), DType::bf16),
                                      device);
        full_params[i].set_grad(g);
        compact_params[i].set_grad(kernels::clone(g));
      }
      optim::StepScaling scaling;
      scaling.found_inf = full({}, s == 2 ? 1.0 : 0.0, TensorOptions(DType::f32, device));
      scaling.inv_scale = full({}, 0.5, TensorOptions(DType::f32, device));
      whole->step(scaling);
      compact->step(scaling);
      expect_same_state(*whole, *compact);
      expect_parameters_are_high_halves(*compact, compact_params);
      for (size_t i = 0; i < full_params.size(); ++i) {
        Tensor master = whole->state_dict().tensors.at(optim::state_key(i, "master"));
        EXPECT_TRUE(testing::all_close(kernels::to_device(full_params[i], Device()),
                                       kernels::to_device(kernels::to_dtype(master, DType::bf16), Device()), 0.0, 0.0));
        // The parameters agree except where a tie under an even high half went the other way.
        EXPECT_TRUE(testing::all_close(kernels::to_device(compact_params[i], Device()),
                                       kernels::to_device(full_params[i], Device()), 1.0 / 64, 0.0));
      }
    }
  }
}

TEST(CompactMasters, UpdatesGiveTheBitsOfF32Masters) { expect_compact_gives_the_f32_masters(Device()); }

TEST(CompactMasters, StateIsTwoBytesPerParameterLess) {
  std::vector<Tensor> full_params = bf16_params(Device()), compact_params = clones(full_params);
  std::vector<Tensor> f16_params;  // f16 keeps whole f32 masters either way
  for (const Tensor& p : full_params) {
    Tensor h = kernels::to_dtype(p, DType::f16);
    h.requires_grad_();
    f16_params.push_back(h);
  }
  auto whole = make_optimizer(true, full_params, false);
  auto compact = make_optimizer(true, compact_params, true);
  auto f16 = make_optimizer(true, f16_params, true);
  int64_t elements = 0;
  for (size_t i = 0; i < full_params.size(); ++i) {
    elements += full_params[i].numel();
    full_params[i].set_grad(kernels::to_dtype(testing::random_tensor(full_params[i].shape()), DType::bf16));
    compact_params[i].set_grad(kernels::clone(full_params[i].grad()));
    f16_params[i].set_grad(kernels::to_dtype(full_params[i].grad(), DType::f16));
  }
  whole->step();
  compact->step();
  f16->step();
  EXPECT_EQ(whole->state_bytes() - compact->state_bytes(), 2 * elements);
  EXPECT_EQ(f16->state_bytes(), whole->state_bytes());
  EXPECT_TRUE(compact->compact_masters());
  EXPECT_EQ(f16->state_dict().tensors.at("state.0.master").dtype(), DType::f32);
}

// A checkpoint holds whole f32 masters whichever kind saved it, and loads into either kind: the
// loaded optimizer then steps as the one that saved it (masters bit for bit).
TEST(CompactMasters, CheckpointsLoadIntoEitherKind) {
  for (bool saved_compact : {true, false}) {
    for (bool loaded_compact : {true, false}) {
      SCOPED_TRACE(std::string(saved_compact ? "compact" : "f32") + " masters loaded into " +
                   (loaded_compact ? "compact" : "f32") + " masters");
      std::vector<Tensor> saver_params = bf16_params(Device());
      auto saver = make_optimizer(true, saver_params, saved_compact);
      for (int s = 0; s < 2; ++s) {
        for (const Tensor& p : saver_params) {
          p.set_grad(kernels::to_dtype(testing::random_tensor(p.shape()), DType::bf16));
        }
        saver->step();
      }
      const optim::StateDict saved = saver->state_dict();
      for (const auto& [name, t] : saved.tensors) {
        if (name.find("master") != std::string::npos) {
          EXPECT_EQ(t.dtype(), DType::f32) << name;
        }
      }
      // The loading side starts from other parameter values: loading sets compact ones from the
      // masters.
      std::vector<Tensor> loader_params = bf16_params(Device());
      auto loader = make_optimizer(true, loader_params, loaded_compact);
      if (!loaded_compact) {
        for (size_t i = 0; i < saver_params.size(); ++i) kernels::copy_(loader_params[i], saver_params[i]);
      }
      loader->load_state_dict(saved);
      expect_same_state(*saver, *loader);
      if (loaded_compact) expect_parameters_are_high_halves(*loader, loader_params);
      for (size_t i = 0; i < saver_params.size(); ++i) {
        Tensor g = kernels::to_dtype(testing::random_tensor(saver_params[i].shape()), DType::bf16);
        saver_params[i].set_grad(g);
        loader_params[i].set_grad(kernels::clone(g));
      }
      saver->step();
      loader->step();
      expect_same_state(*saver, *loader);
    }
  }
}

// ---- the GPU ----

const Device kCuda("cuda:0");

TEST(CompactMastersCuda, SplitAndJoinGiveTheCpusBits) {
  TANDEM_REQUIRE_CUDA();
  expect_split_and_join_exact(kCuda);
}

TEST(CompactMastersCuda, UpdatesGiveTheBitsOfF32Masters) {
  TANDEM_REQUIRE_CUDA();
  cuda::set_poison_allocations(true);
  expect_compact_gives_the_f32_masters(kCuda);
  cuda::set_poison_allocations(false);
}

// The fused kernel over many tensors, aligned and one element into a larger allocation (no vector
// loads), with compact and f32 masters in one call: the compact masters' bits equal the f32 ones'.
TEST(CompactMastersCuda, MisalignedAndMixedListsInOneCall) {
  TANDEM_REQUIRE_CUDA();
  const std::vector<int64_t> sizes = {1, 3, 1000, 65537, 4, 8191, 2};
  for (bool misaligned : {false, true}) {
    SCOPED_TRACE(misaligned ? "misaligned" : "aligned");
    UpdateTensors full_lists, compact_lists;
    full_lists.states.resize(2);
    compact_lists.states.resize(2);
    std::vector<Tensor> full_masters;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t n = sizes[i];
      Tensor master = random_masters({n + 1}, kCuda);
      Tensor param = empty({n + 1}, TensorOptions(DType::bf16, kCuda)), low = empty({n + 1}, TensorOptions(DType::bf16, kCuda));
      kernels::split_master_(master, param, low);
      const int64_t at = misaligned ? 1 : 0;
      Tensor p = views::narrow(param, 0, at, n), l = views::narrow(low, 0, at, n);
      Tensor g = kernels::to_device(kernels::to_dtype(testing::random_tensor({n}), DType::bf16), kCuda);
      Tensor m = kernels::to_device(kernels::to_dtype(testing::random_uniform({n}, 0.0, 1.0), DType::f32), kCuda);
      Tensor v = kernels::to_device(kernels::to_dtype(testing::random_uniform({n}, 0.0, 1.0), DType::f32), kCuda);
      Tensor step = full({}, static_cast<double>(i % 3), TensorOptions(DType::f32, kCuda));
      // Every other tensor of the compact list keeps a whole f32 master: both kinds in one launch.
      const bool halves = i % 2 == 0;
      full_masters.push_back(kernels::clone(views::narrow(master, 0, at, n)));
      compact_lists.params.push_back(p);
      compact_lists.grads.push_back(g);
      compact_lists.states[0].push_back(m);
      compact_lists.states[1].push_back(v);
      compact_lists.steps.push_back(step);
      compact_lists.masters.push_back(halves ? l : kernels::clone(full_masters.back()));
      full_lists.params.push_back(kernels::clone(p));
      full_lists.grads.push_back(g);
      full_lists.states[0].push_back(kernels::clone(m));
      full_lists.states[1].push_back(kernels::clone(v));
      full_lists.steps.push_back(kernels::clone(step));
      full_lists.masters.push_back(full_masters.back());
    }
    AdamWHyper h{0.01, 0.8, 0.95, 1e-6, 0.1};
    kernels::adamw_step(full_lists, h);
    kernels::adamw_step(compact_lists, h);
    for (size_t i = 0; i < sizes.size(); ++i) {
      const Tensor& got = compact_lists.masters[i];
      Tensor master = got.dtype() == DType::bf16 ? kernels::join_master_halves(compact_lists.params[i], got) : got;
      EXPECT_TRUE(testing::all_close(kernels::to_device(master, Device()),
                                     kernels::to_device(full_lists.masters[i], Device()), 0.0, 0.0))
          << "tensor " << i;
      EXPECT_TRUE(testing::all_close(kernels::to_device(compact_lists.states[1][i], Device()),
                                     kernels::to_device(full_lists.states[1][i], Device()), 0.0, 0.0))
          << "tensor " << i;
    }
  }
}

}  // namespace
}  // namespace tandem
