// CUDA elementwise kernels: unary, binary, where, copy with casts, fill, in-place add, random.
// The formulas are the CPU backend's (core/scalar_math.h), computed in f32 for 16-bit floats.
#include "tandem/core/backend.h"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/loops.cuh"
#include "tandem/core/elementwise_ops.h"
#include "tandem/core/philox.h"

namespace tandem::cuda {

namespace {
// Wraps a formula on the compute type C into an element function on T.
template <typename T, typename Fn>
struct OnAcc1 {
  Fn fn;
  __device__ T operator()(T v) const { return cast_to<T>(fn(to_acc(v))); }
};
template <typename T, typename Fn>
OnAcc1<T, Fn> on_acc(Fn fn) {
  return {fn};
}

template <typename T, typename Fn>
struct OnAcc2 {
  Fn fn;
  __device__ T operator()(T a, T b) const { return cast_to<T>(fn(to_acc(a), to_acc(b))); }
};
template <typename T, typename Fn>
OnAcc2<T, Fn> on_acc2(Fn fn) {
  return {fn};
}

// Every element through the table's formula for op (core/elementwise_ops.h), on the compute type.
template <typename T>
void unary_typed(UnaryOp op, const Tensor& x, const Tensor& out, double alpha, double beta) {
  using C = acc_t<T>;
  const char* name = unary_op_name(op);
  bool ran = elementwise::visit_unary<C>(op, static_cast<C>(alpha), static_cast<C>(beta),
                                         [&](auto fn) { map1<T, T>(name, x, out, on_acc<T>(fn)); });
  TANDEM_CHECK(ran, "unary: unhandled op ", name);
}

template <typename T>
void unary_backward_typed(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& out, double alpha,
                          double beta) {
  using C = acc_t<T>;
  const char* name = unary_op_name(op);
  bool ran = elementwise::visit_unary_backward<C>(op, static_cast<C>(alpha), static_cast<C>(beta),
                                                  [&](auto fn) { map2<T, T, T>(name, grad, x, out, on_acc2<T>(fn)); });
  TANDEM_CHECK(ran, "unary_backward: unhandled op ", name);
}

template <typename T>
void logical_not_typed(const Tensor& x, const Tensor& out) {
  map1<T, bool>("logical_not", x, out, [] __device__(T v) { return !cast_to<bool>(v); });
}

// A comparison on the compute types of two elements.
template <typename T, typename Fn>
struct CompareOnAcc {
  Fn fn;
  __device__ bool operator()(T a, T b) const { return fn(to_acc(a), to_acc(b)); }
};

template <typename T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = acc_t<T>;
  const char* name = binary_op_name(op);
  bool ran = elementwise::visit_binary<C>(op, [&](auto fn) {
    if constexpr (std::is_same_v<decltype(fn(C{}, C{})), bool>) {
      map2<T, T, bool>(name, a, b, out, CompareOnAcc<T, decltype(fn)>{fn});
    } else {
      map2<T, T, T>(name, a, b, out, on_acc2<T>(fn));
    }
  });
  TANDEM_CHECK(ran, "binary: unhandled op ", name);
}

template <typename T>
void where_typed(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  map3<bool, T, T, T>("where", cond, a, b, out, [] __device__(bool c, T x, T y) { return c ? x : y; });
}

template <typename S, typename D>
void copy_typed(const Tensor& src, const Tensor& dst) {
  map1<S, D>("copy", src, dst, [] __device__(S v) { return cast_to<D>(v); });
}

template <typename T>
void fill_typed(const Tensor& dst, double value) {
  T v = cast_to<T>(value);
  map1<T, T>("fill", dst, dst, [v] __device__(T) { return v; });
}

template <typename T>
void add_inplace_typed(const Tensor& dst, const Tensor& src, double alpha) {
  using C = acc_t<T>;
  C a = static_cast<C>(alpha);
  map2<T, T, T>("add_", dst, src, dst, [a] __device__(T d, T s) { return cast_to<T>(to_acc(d) + a * to_acc(s)); });
}

// The largest value of T below x (x finite), as in the CPU backend.
template <typename T>
__device__ T next_below(T x) {
  if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
    unsigned short bits = *reinterpret_cast<unsigned short*>(&x);
    if ((bits & 0x7fffu) == 0) bits = 0x8001u;  // below zero: the negative value of least magnitude
    else if (bits & 0x8000u) bits = static_cast<unsigned short>(bits + 1u);
    else bits = static_cast<unsigned short>(bits - 1u);
    return *reinterpret_cast<T*>(&bits);
  } else {
    return nextafter(x, -static_cast<T>(INFINITY));
  }
}

// base: null, or (2,) seed and first counter set by a graph replay (they replace seed and add to offset).
template <typename T>
__global__ void random_kernel(int64_t n, T* out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2,
                              const uint64_t* base) {
  dependent_kernel_begin();
  if (base != nullptr) {
    seed = base[0];
    offset += base[1];
  }
  int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    uint64_t counter = offset + static_cast<uint64_t>(i);
    double v = 0.0;
    switch (kind) {
      case RandomKind::uniform: v = p1 + (p2 - p1) * philox::uniform(seed, counter); break;
      case RandomKind::normal: v = p1 + p2 * philox::normal(seed, counter); break;
      case RandomKind::bernoulli: v = philox::uniform(seed, counter) < p1 ? 1.0 : 0.0; break;
    }
    T r = cast_to<T>(v);
    // A uniform draw just below `high` can round up to it in T: step down to keep [low, high).
    if (kind == RandomKind::uniform && p1 < p2 && !(static_cast<double>(to_acc(r)) < p2)) {
      r = next_below(r);
      if (static_cast<double>(to_acc(r)) < p1) r = cast_to<T>(p1);
    }
    out[i] = r;
  }
}
}  // namespace

void unary(UnaryOp op, const Tensor& x, const Tensor& out, double alpha, double beta) {
  const char* name = unary_op_name(op);
  auto typed = [&](auto tag) { unary_typed<device_t<decltype(tag)>>(op, x, out, alpha, beta); };
  if (op == UnaryOp::logical_not) {
    dispatch_all(x.dtype(), name, "cuda", [&](auto tag) { logical_not_typed<device_t<decltype(tag)>>(x, out); });
  } else if (is_floating_only(op)) {
    dispatch_floating(x.dtype(), name, "cuda", typed);
  } else {
    dispatch_numeric(x.dtype(), name, "cuda", typed);
  }
}

void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& out, double alpha, double beta) {
  dispatch_floating(x.dtype(), unary_op_name(op), "cuda", [&](auto tag) {
    unary_backward_typed<device_t<decltype(tag)>>(op, grad, x, out, alpha, beta);
  });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_op_name(op);
  auto typed = [&](auto tag) { binary_typed<device_t<decltype(tag)>>(op, a, b, out); };
  if (is_comparison(op)) {
    dispatch_all(a.dtype(), name, "cuda", typed);
  } else if (is_floating_only(op)) {
    dispatch_floating(a.dtype(), name, "cuda", typed);
  } else {
    dispatch_numeric(a.dtype(), name, "cuda", typed);
  }
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_all(a.dtype(), "where", "cuda", [&](auto tag) { where_typed<device_t<decltype(tag)>>(cond, a, b, out); });
}

void copy(const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    DeviceGuard guard(dst.device().index);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice,
                                      stream_of(dst)));
    return;
  }
  dispatch_all(src.dtype(), "copy", "cuda", [&](auto src_tag) {
    dispatch_all(dst.dtype(), "copy", "cuda", [&](auto dst_tag) {
      copy_typed<device_t<decltype(src_tag)>, device_t<decltype(dst_tag)>>(src, dst);
    });
  });
}

namespace {
// out = scale * x over n elements, V at a time (x and out 16-byte aligned) with the last n % V
// elements one per thread of the first block; scale is read on the device, and an in-place call
// (x == out) with scale 1 writes nothing.
template <typename T, int V>
__global__ void scale_unless_one_kernel(const T* x, const acc_t<T>* scale_at, T* out, int64_t n) {
  dependent_kernel_begin();
  using A = acc_t<T>;
  const A scale = *scale_at;
  if (scale == A(1) && x == out) return;
  const int64_t vectors = n / V;
  const Packed<T, V>* in = reinterpret_cast<const Packed<T, V>*>(x);  // (vectors,)
  Packed<T, V>* o = reinterpret_cast<Packed<T, V>*>(out);             // (vectors,)
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < vectors; i += stride) {
    Packed<T, V> p = in[i];
#pragma unroll
    for (int k = 0; k < V; ++k) p.v[k] = cast_to<T>(scale * to_acc(p.v[k]));
    o[i] = p;
  }
  if (blockIdx.x == 0 && threadIdx.x < n - vectors * V) {
    const int64_t i = vectors * V + threadIdx.x;
    out[i] = cast_to<T>(scale * to_acc(x[i]));
  }
}
}  // namespace

void scale_unless_one(const Tensor& x, const Tensor& g, const Tensor& out) {
  dispatch_floating(x.dtype(), "scale_unless_one", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    const int64_t n = x.numel();
    if (n == 0) return;
    NvtxRange range("scale_unless_one");
    DeviceGuard guard(x.device().index);
    constexpr int V = 16 / sizeof(T);
    const bool aligned = aligned16(x.data_ptr()) && aligned16(out.data_ptr());
    auto kernel = aligned ? scale_unless_one_kernel<T, V> : scale_unless_one_kernel<T, 1>;
    const int v = aligned ? V : 1;
    // A grid-stride loop: 16 blocks per SM is plenty, and few enough to exit at once where g is 1.
    const int blocks = blocks_for(n / v, 256, 16LL * multiprocessors(x.device().index));
    launch_dependent(kernel, blocks, 256, 0, stream_of(x), device_ptr<const T>(x), device_ptr<const acc_t<T>>(g),
                     device_ptr<T>(out), n);
    check_launch("scale_unless_one");
  });
}

void fill(const Tensor& dst, double value) {
  dispatch_all(dst.dtype(), "fill", "cuda", [&](auto tag) { fill_typed<device_t<decltype(tag)>>(dst, value); });
}

namespace {
template <typename T>
__global__ void arange_kernel(T* __restrict__ out, int64_t n, double start, double step) {
  dependent_kernel_begin();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = cast_to<T>(start + static_cast<double>(i) * step);
  }
}
}  // namespace

// One kernel, so that a step's positions (GPT-2's arange(T)) take neither an upload nor a cast.
void arange(const Tensor& out, double start, double step) {
  dispatch_all(out.dtype(), "arange", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    NvtxRange range("arange");
    DeviceGuard guard(out.device().index);
    const int64_t n = out.numel();
    launch_dependent(arange_kernel<T>, elementwise_blocks(n), kElementwiseThreads, 0, stream_of(out),
                     device_ptr<T>(out), n, start, step);
    check_launch("arange");
  });
}

void add_inplace(const Tensor& dst, const Tensor& src, double alpha) {
  dispatch_numeric(dst.dtype(), "add_", "cuda",
                   [&](auto tag) { add_inplace_typed<device_t<decltype(tag)>>(dst, src, alpha); });
}

namespace {
void launch_random(const Tensor& out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2,
                   const uint64_t* base) {
  dispatch_floating(out.dtype(), "random", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    NvtxRange range("random");
    DeviceGuard guard(out.device().index);
    int64_t n = out.numel();
    launch_dependent(random_kernel<T>, elementwise_blocks(n), kElementwiseThreads, 0, stream_of(out), n,
                     device_ptr<T>(out), kind, seed, offset, p1, p2, base);
    check_launch("random");
  });
}
}  // namespace

void random(const Tensor& out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2) {
  launch_random(out, kind, seed, offset, p1, p2, nullptr);
}

void random_from_base(const Tensor& out, RandomKind kind, const uint64_t* base, uint64_t offset, double p1, double p2) {
  launch_random(out, kind, 0, offset, p1, p2, base);
}

}  // namespace tandem::cuda
