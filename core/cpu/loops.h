#pragma once
// Strided loops for the CPU backend. Operands share one shape; each has its own strides (in
// elements, 0 where broadcast). Adjacent dims that are contiguous in every operand are merged,
// then the innermost dim is handed to a callback that can use a plain pointer loop.
#include <array>
#include <cstdint>
#include <vector>

#include "tandem/core/tensor.h"

namespace tandem::cpu {

template <size_t N>
struct StridedLoop {
  std::vector<int64_t> sizes;                 // merged sizes, outermost first
  std::array<std::vector<int64_t>, N> steps;  // bytes per step in each merged dim

  StridedLoop(const Shape& shape, const std::array<const Tensor*, N>& operands) {
    std::vector<Strides> strides;
    for (const Tensor* t : operands) strides.push_back(t->strides());
    CollapsedDims collapsed = collapse_dims(shape, strides);
    sizes = collapsed.sizes;
    for (size_t k = 0; k < N; ++k) {
      for (int64_t s : collapsed.strides[k]) steps[k].push_back(s * static_cast<int64_t>(operands[k]->element_size()));
    }
  }

  // inner(ptrs, n, inner_steps): process n elements starting at ptrs, stepping by inner_steps bytes.
  template <typename Inner>
  void run(std::array<char*, N> base, Inner&& inner) const {
    size_t nd = sizes.size();
    std::array<int64_t, N> inner_steps;
    for (size_t k = 0; k < N; ++k) inner_steps[k] = steps[k][nd - 1];
    int64_t inner_n = sizes[nd - 1];
    std::vector<int64_t> counter(nd, 0);
    std::array<char*, N> ptrs = base;
    while (true) {
      inner(ptrs, inner_n, inner_steps);
      // Advance the outer dims like an odometer.
      size_t d = nd - 1;
      while (true) {
        if (d == 0) return;
        --d;
        ++counter[d];
        for (size_t k = 0; k < N; ++k) ptrs[k] += steps[k][d];
        if (counter[d] < sizes[d]) break;
        for (size_t k = 0; k < N; ++k) ptrs[k] -= steps[k][d] * sizes[d];
        counter[d] = 0;
      }
    }
  }
};

inline char* bytes(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// out[i] = fn(a[i]) over out's shape; `a` is expanded to it.
template <typename TA, typename TO, typename Fn>
void map1(const Tensor& a, const Tensor& out, Fn fn) {
  if (out.numel() == 0) return;
  StridedLoop<2> loop(out.shape(), {&a, &out});
  loop.run({bytes(a), bytes(out)}, [&](std::array<char*, 2> p, int64_t n, std::array<int64_t, 2> s) {
    if (s[0] == sizeof(TA) && s[1] == sizeof(TO)) {
      const TA* x = reinterpret_cast<const TA*>(p[0]);
      TO* y = reinterpret_cast<TO*>(p[1]);
      for (int64_t i = 0; i < n; ++i) y[i] = fn(x[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<TO*>(p[1] + i * s[1]) = fn(*reinterpret_cast<const TA*>(p[0] + i * s[0]));
      }
    }
  });
}

// out[i] = fn(a[i], b[i]).
template <typename TA, typename TB, typename TO, typename Fn>
void map2(const Tensor& a, const Tensor& b, const Tensor& out, Fn fn) {
  if (out.numel() == 0) return;
  StridedLoop<3> loop(out.shape(), {&a, &b, &out});
  loop.run({bytes(a), bytes(b), bytes(out)}, [&](std::array<char*, 3> p, int64_t n, std::array<int64_t, 3> s) {
    if (s[0] == sizeof(TA) && s[1] == sizeof(TB) && s[2] == sizeof(TO)) {
      const TA* x = reinterpret_cast<const TA*>(p[0]);
      const TB* y = reinterpret_cast<const TB*>(p[1]);
      TO* z = reinterpret_cast<TO*>(p[2]);
      for (int64_t i = 0; i < n; ++i) z[i] = fn(x[i], y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        *reinterpret_cast<TO*>(p[2] + i * s[2]) =
            fn(*reinterpret_cast<const TA*>(p[0] + i * s[0]), *reinterpret_cast<const TB*>(p[1] + i * s[1]));
      }
    }
  });
}

// out[i] = fn(a[i], b[i], c[i]).
template <typename TA, typename TB, typename TC, typename TO, typename Fn>
void map3(const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& out, Fn fn) {
  if (out.numel() == 0) return;
  StridedLoop<4> loop(out.shape(), {&a, &b, &c, &out});
  loop.run({bytes(a), bytes(b), bytes(c), bytes(out)}, [&](std::array<char*, 4> p, int64_t n, std::array<int64_t, 4> s) {
    for (int64_t i = 0; i < n; ++i) {
      *reinterpret_cast<TO*>(p[3] + i * s[3]) =
          fn(*reinterpret_cast<const TA*>(p[0] + i * s[0]), *reinterpret_cast<const TB*>(p[1] + i * s[1]),
             *reinterpret_cast<const TC*>(p[2] + i * s[2]));
    }
  });
}

}  // namespace tandem::cpu
