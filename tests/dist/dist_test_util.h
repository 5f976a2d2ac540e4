#pragma once
// Helpers for the distributed tests: inputs that every rank can regenerate for every other rank,
// and the expected results of reductions computed from them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "support/test_util.h"
#include "tandem/core/kernels.h"
#include "tandem/core/random.h"
#include "tandem/dist/process_group.h"

namespace tandem::dist::testing {

// The device a test case runs on (this rank's GPU or the CPU), and the group that reduces there.
inline const char* device_label(bool gpu) { return gpu ? "gpu" : "cpu"; }
inline Device device_of(bool gpu) { return gpu ? world().device : Device(); }
inline ProcessGroup& group_of(bool gpu) { return world().group_for(device_of(gpu)); }

// A seed that every rank shares and that is fresh on every call: rank 0 draws it, the cpu group
// broadcasts it.
inline uint64_t shared_seed() {
  const World& w = world();
  Tensor seed = zeros({1}, DType::i64);
  if (w.rank == 0) seed.data<int64_t>()[0] = static_cast<int64_t>(::tandem::testing::next_seed() >> 1);
  w.cpu_group->broadcast(seed, 0)->wait();
  return static_cast<uint64_t>(seed.data<int64_t>()[0]);
}

// Rank r's input for the collective drawn with `seed`: any rank computes any rank's input. Floats
// are normal, integers uniform in [-10^6, 10^6), bool is a coin flip.
inline Tensor rank_input(uint64_t seed, int r, const Shape& shape, DType dtype) {
  Generator gen(seed * 1000003ULL + static_cast<uint64_t>(r) * 7919ULL + 17);
  if (dtype == DType::i64 || dtype == DType::i32) return randint(-1000000, 1000000, shape, dtype, &gen);
  if (dtype == DType::u8) return randint(0, 256, shape, dtype, &gen);
  if (dtype == DType::boolean) return kernels::to_dtype(bernoulli(shape, 0.5, DType::f32, &gen), dtype);
  return kernels::to_dtype(randn(shape, DType::f64, &gen), dtype);
}

// Every rank's input, as doubles.
inline std::vector<std::vector<double>> all_inputs(uint64_t seed, int size, const Shape& shape, DType dtype) {
  std::vector<std::vector<double>> inputs;
  for (int r = 0; r < size; ++r) inputs.push_back(rank_input(seed, r, shape, dtype).to_double_vector());
  return inputs;
}

inline bool is_integral(DType dtype) {
  return dtype == DType::i32 || dtype == DType::i64 || dtype == DType::u8 || dtype == DType::boolean;
}

// Elementwise reduction of every rank's values, the way the collective computes it (integer avg
// truncates toward zero).
inline std::vector<double> reduce_all(const std::vector<std::vector<double>>& inputs, ReduceOp op, DType dtype) {
  std::vector<double> out = inputs[0];
  for (size_t i = 0; i < out.size(); ++i) {
    for (size_t r = 1; r < inputs.size(); ++r) {
      double v = inputs[r][i];
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg: out[i] += v; break;
        case ReduceOp::max: out[i] = std::max(out[i], v); break;
        case ReduceOp::min: out[i] = std::min(out[i], v); break;
      }
    }
    if (op == ReduceOp::avg) {
      auto n = static_cast<int64_t>(inputs.size());
      out[i] = is_integral(dtype) ? static_cast<double>(static_cast<int64_t>(out[i]) / n) : out[i] / n;
    }
  }
  return out;
}

// Tolerances relative to the largest expected magnitude: float sums may run in another order, and
// 16-bit floats round every partial sum.
inline double rtol_for(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return 1e-5;
    case DType::f16: return 5e-3;
    case DType::bf16: return 3e-2;
    default: return 0.0;
  }
}

inline std::string dtype_param_name(DType dtype) { return dtype_name(dtype); }

// Whether `group` is an NCCL group of one that launches its collectives all the same
// ($TANDEM_NCCL_LAUNCH_ALONE=1, as the *_launch_alone tests run): its Works then complete on the
// device, not at once.
inline bool launches_alone(const ProcessGroup& group) {
  const char* env = std::getenv("TANDEM_NCCL_LAUNCH_ALONE");
  return group.backend() == "nccl" && group.size() == 1 && env != nullptr && std::string(env) == "1";
}

// Skips a GPU test unless this rank has a GPU and an NCCL group.
#define TANDEM_REQUIRE_NCCL()                                                                    \
  do {                                                                                           \
    TANDEM_REQUIRE_CUDA();                                                                       \
    if (::tandem::dist::world().gpu_group == nullptr) GTEST_SKIP() << "no NCCL group on this rank"; \
  } while (0)

}  // namespace tandem::dist::testing
