// CPU elementwise kernels: unary, binary, where, copy (with casts), fill, in-place add, random.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tandem/core/backend.h"
#include "tandem/core/cpu/loops.h"
#include "tandem/core/dispatch.h"
#include "tandem/core/philox.h"
#include "tandem/core/elementwise_ops.h"

namespace tandem::cpu {

namespace {
// Every element through the table's formula for op (core/elementwise_ops.h), on the compute type.
template <typename T>
void unary_typed(UnaryOp op, const Tensor& x, const Tensor& out, double alpha, double beta) {
  using C = compute_t<T>;
  bool ran = elementwise::visit_unary<C>(op, static_cast<C>(alpha), static_cast<C>(beta), [&](auto fn) {
    map1<T, T>(x, out, [fn](T v) { return T(fn(static_cast<C>(v))); });
  });
  TANDEM_CHECK(ran, "unary: unhandled op ", unary_op_name(op), " for ", DTypeOf<T>::value);
}

template <typename T>
void unary_backward_typed(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& out, double alpha,
                          double beta) {
  using C = compute_t<T>;
  bool ran = elementwise::visit_unary_backward<C>(op, static_cast<C>(alpha), static_cast<C>(beta), [&](auto fn) {
    map2<T, T, T>(grad, x, out, [fn](T g, T v) { return T(fn(static_cast<C>(g), static_cast<C>(v))); });
  });
  TANDEM_CHECK(ran, "unary_backward: unhandled op ", unary_op_name(op));
}

template <typename T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;
  bool ran = elementwise::visit_binary<C>(op, [&](auto fn) {
    if constexpr (std::is_same_v<decltype(fn(C{}, C{})), bool>) {
      map2<T, T, bool>(a, b, out, [fn](T x, T y) { return fn(static_cast<C>(x), static_cast<C>(y)); });
    } else {
      map2<T, T, T>(a, b, out, [fn](T x, T y) { return T(fn(static_cast<C>(x), static_cast<C>(y))); });
    }
  });
  TANDEM_CHECK(ran, "binary: unhandled op ", binary_op_name(op), " for ", DTypeOf<T>::value);
}
}  // namespace

void unary(UnaryOp op, const Tensor& x, const Tensor& out, double alpha, double beta) {
  const char* name = unary_op_name(op);
  if (op == UnaryOp::logical_not) {
    dispatch_all(x.dtype(), name, "cpu", [&](auto tag) {
      using T = decltype(tag);
      map1<T, bool>(x, out, [](T v) { return !convert<bool>(v); });
    });
    return;
  }
  if (is_floating_only(op)) {
    dispatch_floating(x.dtype(), name, "cpu", [&](auto tag) { unary_typed<decltype(tag)>(op, x, out, alpha, beta); });
  } else {
    dispatch_numeric(x.dtype(), name, "cpu", [&](auto tag) { unary_typed<decltype(tag)>(op, x, out, alpha, beta); });
  }
}

void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& out, double alpha, double beta) {
  dispatch_floating(x.dtype(), unary_op_name(op), "cpu",
                    [&](auto tag) { unary_backward_typed<decltype(tag)>(op, grad, x, out, alpha, beta); });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_op_name(op);
  auto typed = [&](auto tag) { binary_typed<decltype(tag)>(op, a, b, out); };
  if (is_comparison(op)) {
    dispatch_all(a.dtype(), name, "cpu", typed);
  } else if (is_floating_only(op)) {
    dispatch_floating(a.dtype(), name, "cpu", typed);
  } else {
    dispatch_numeric(a.dtype(), name, "cpu", typed);
  }
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_all(a.dtype(), "where", "cpu", [&](auto tag) {
    using T = decltype(tag);
    map3<bool, T, T, T>(cond, a, b, out, [](bool c, T x, T y) { return c ? x : y; });
  });
}

void copy(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  dispatch_all(src.dtype(), "copy", "cpu", [&](auto src_tag) {
    using S = decltype(src_tag);
    dispatch_all(dst.dtype(), "copy", "cpu", [&](auto dst_tag) {
      using D = decltype(dst_tag);
      map1<S, D>(src, dst, [](S v) { return convert<D>(v); });
    });
  });
}

void copy_each(const std::vector<Tensor>& srcs, const std::vector<Tensor>& dsts) {
  for (size_t i = 0; i < srcs.size(); ++i) std::memmove(dsts[i].data_ptr(), srcs[i].data_ptr(), dsts[i].nbytes());
}

void arange(const Tensor& out, double start, double step) {
  dispatch_all(out.dtype(), "arange", "cpu", [&](auto tag) {
    using T = decltype(tag);
    T* p = out.data<T>();  // (n,)
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = convert<T>(start + static_cast<double>(i) * step);
  });
}

void fill(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), "fill", "cpu", [&](auto tag) {
    using T = decltype(tag);
    T v = convert<T>(value);
    // Writes only: reading the old, possibly uninitialized elements (as map1 would) is undefined
    // behaviour for bool.
    StridedLoop<1> loop(dst.shape(), {&dst});
    loop.run({bytes(dst)}, [v](std::array<char*, 1> p, int64_t n, std::array<int64_t, 1> s) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
    });
  });
}

void add_inplace(const Tensor& dst, const Tensor& src, double alpha) {
  dispatch_numeric(dst.dtype(), "add_", "cpu", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    C a = static_cast<C>(alpha);
    map2<T, T, T>(dst, src, dst, [a](T d, T s) { return T(static_cast<C>(d) + a * static_cast<C>(s)); });
  });
}

void scale_unless_one(const Tensor& x, const Tensor& g, const Tensor& out) {
  dispatch_floating(x.dtype(), "scale_unless_one", "cpu", [&](auto tag) {
    using T = decltype(tag);
    using S = compute_t<T>;  // g's dtype
    const S scale = g.data<S>()[0];
    if (scale == S(1) && x.data_ptr() == out.data_ptr()) return;
    const T* in = x.data<T>();
    T* o = out.data<T>();
    for (int64_t i = 0; i < x.numel(); ++i) o[i] = T(scale * static_cast<S>(in[i]));
  });
}

namespace {
// The largest finite value of T below the finite x.
template <typename T>
T next_below(T x) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    T r = x;
    if ((x.bits & 0x7fffu) == 0) r.bits = 0x8001u;  // below zero: the negative value of least magnitude
    else if (x.bits & 0x8000u) r.bits = static_cast<uint16_t>(x.bits + 1u);
    else r.bits = static_cast<uint16_t>(x.bits - 1u);
    return r;
  } else {
    return std::nextafter(x, -std::numeric_limits<T>::infinity());
  }
}
}  // namespace

void random(const Tensor& out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2) {
  dispatch_floating(out.dtype(), "random", "cpu", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    T* data = out.data<T>();
    int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) {
      uint64_t counter = offset + static_cast<uint64_t>(i);
      double v = 0.0;
      switch (kind) {
        case RandomKind::uniform: v = p1 + (p2 - p1) * philox::uniform(seed, counter); break;
        case RandomKind::normal: v = p1 + p2 * philox::normal(seed, counter); break;
        case RandomKind::bernoulli: v = philox::uniform(seed, counter) < p1 ? 1.0 : 0.0; break;
      }
      T r = T(static_cast<C>(v));
      // A uniform draw just below `high` can round up to it in the output dtype (in f16 one draw
      // in 4096 below 1.0 would); the next value down keeps the range half-open.
      if (kind == RandomKind::uniform && p1 < p2 && !(static_cast<double>(static_cast<C>(r)) < p2)) {
        r = next_below(r);
        if (static_cast<double>(static_cast<C>(r)) < p1) r = T(static_cast<C>(p1));
      }
      data[i] = r;
    }
  });
}

}  // namespace tandem::cpu
