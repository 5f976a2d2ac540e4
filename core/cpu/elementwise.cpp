// CPU elementwise kernels: unary, binary, where, copy (with casts), fill, in-place add, random.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "tandem/core/backend.h"
#include "tandem/core/cpu/loops.h"
#include "tandem/core/dispatch.h"
#include "tandem/core/philox.h"
#include "tandem/core/scalar_math.h"

namespace tandem::cpu {

namespace {
template <typename T>
void unary_typed(UnaryOp op, const Tensor& x, const Tensor& out, double alpha, double beta) {
  using C = compute_t<T>;
  auto run = [&](auto fn) { map1<T, T>(x, out, [fn](T v) { return T(fn(static_cast<C>(v))); }); };
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case UnaryOp::exp: return run([](C v) { return std::exp(v); });
      case UnaryOp::log: return run([](C v) { return std::log(v); });
      case UnaryOp::sqrt: return run([](C v) { return std::sqrt(v); });
      case UnaryOp::rsqrt: return run([](C v) { return C(1) / std::sqrt(v); });
      case UnaryOp::tanh: return run([](C v) { return std::tanh(v); });
      case UnaryOp::sigmoid: return run([](C v) { return math::sigmoid(v); });
      case UnaryOp::gelu_tanh: return run([](C v) { return math::gelu_tanh(v); });
      case UnaryOp::gelu_erf: return run([](C v) { return math::gelu_erf(v); });
      case UnaryOp::pow_scalar: {
        C e = static_cast<C>(alpha);
        if (alpha == 2.0) return run([](C v) { return v * v; });
        return run([e](C v) { return std::pow(v, e); });
      }
      default: break;
    }
  }
  switch (op) {
    case UnaryOp::neg: return run([](C v) { return C(-v); });
    case UnaryOp::abs: return run([](C v) { return v < C(0) ? C(-v) : v; });
    case UnaryOp::relu: return run([](C v) { return v > C(0) ? v : C(0); });
    case UnaryOp::sign: return run([](C v) { return C((C(0) < v) - (v < C(0))); });
    case UnaryOp::scale: {
      C s = static_cast<C>(alpha);
      return run([s](C v) { return C(v * s); });
    }
    case UnaryOp::clamp: {
      C lo = static_cast<C>(alpha), hi = static_cast<C>(beta);
      return run([lo, hi](C v) { return v < lo ? lo : (v > hi ? hi : v); });
    }
    default: TANDEM_THROW(Error, "unary: unhandled op ", unary_op_name(op));
  }
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

namespace {
template <typename T>
void comparison_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;
  auto run = [&](auto fn) {
    map2<T, T, bool>(a, b, out, [fn](T x, T y) { return fn(static_cast<C>(x), static_cast<C>(y)); });
  };
  switch (op) {
    case BinaryOp::eq: return run([](C x, C y) { return x == y; });
    case BinaryOp::ne: return run([](C x, C y) { return x != y; });
    case BinaryOp::lt: return run([](C x, C y) { return x < y; });
    case BinaryOp::le: return run([](C x, C y) { return x <= y; });
    case BinaryOp::gt: return run([](C x, C y) { return x > y; });
    case BinaryOp::ge: return run([](C x, C y) { return x >= y; });
    default: TANDEM_THROW(Error, "comparison: unhandled op ", binary_op_name(op));
  }
}

template <typename T>
void arithmetic_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;
  auto run = [&](auto fn) {
    map2<T, T, T>(a, b, out, [fn](T x, T y) { return T(fn(static_cast<C>(x), static_cast<C>(y))); });
  };
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case BinaryOp::div: return run([](C x, C y) { return x / y; });
      case BinaryOp::pow: return run([](C x, C y) { return std::pow(x, y); });
      case BinaryOp::relu_backward: return run([](C g, C x) { return x > C(0) ? g : C(0); });
      case BinaryOp::gelu_tanh_backward: return run([](C g, C x) { return g * math::gelu_tanh_grad(x); });
      case BinaryOp::gelu_erf_backward: return run([](C g, C x) { return g * math::gelu_erf_grad(x); });
      default: break;
    }
  }
  switch (op) {
    case BinaryOp::add: return run([](C x, C y) { return C(x + y); });
    case BinaryOp::sub: return run([](C x, C y) { return C(x - y); });
    case BinaryOp::mul: return run([](C x, C y) { return C(x * y); });
    case BinaryOp::maximum: return run([](C x, C y) { return math::nan_max(x, y); });
    case BinaryOp::minimum: return run([](C x, C y) { return math::nan_min(x, y); });
    default: TANDEM_THROW(Error, "binary: unhandled op ", binary_op_name(op));
  }
}

}  // namespace

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_op_name(op);
  if (is_comparison(op)) {
    dispatch_all(a.dtype(), name, "cpu", [&](auto tag) { comparison_typed<decltype(tag)>(op, a, b, out); });
  } else if (is_floating_only(op)) {
    dispatch_floating(a.dtype(), name, "cpu", [&](auto tag) { arithmetic_typed<decltype(tag)>(op, a, b, out); });
  } else {
    dispatch_numeric(a.dtype(), name, "cpu", [&](auto tag) { arithmetic_typed<decltype(tag)>(op, a, b, out); });
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
