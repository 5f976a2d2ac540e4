// CPU convolution. Each sample's input is unfolded (im2col) into one (C/g * R * S, P * Q) matrix
// per group, so that every product is an Eigen GEMM; the input gradient is folded back (col2im).
// Samples run in parallel. Half types are widened to f32, as in the CPU matmul.
#include <Eigen/Core>
#include <algorithm>
#include <vector>

#include "tandem/core/backend.h"
#include "tandem/core/cpu/parallel.h"

namespace tandem::cpu {

namespace {
template <typename T>
using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMap = Eigen::Map<const Matrix<T>>;
template <typename T>
using MutMap = Eigen::Map<Matrix<T>>;

struct Geometry {
  int64_t n, c, h, w;      // input (N, C, H, W)
  int64_t k, r, s;         // weight (K, C / groups, R, S)
  int64_t p, q;            // output (N, K, P, Q)
  int64_t groups, cg, kg;  // groups, input channels and filters per group
  Conv2dParams prm;

  int64_t rows() const { return cg * r * s; }  // of the unfolded matrix
  int64_t cols() const { return p * q; }
  // A 1x1 kernel with unit stride and no padding: the unfolded matrix is the input itself.
  bool direct() const {
    return r == 1 && s == 1 && prm.stride_h == 1 && prm.stride_w == 1 && prm.pad_h == 0 && prm.pad_w == 0;
  }
};

Geometry geometry(const Shape& x, const Shape& weight, const Shape& out, const Conv2dParams& prm) {
  Geometry g{};
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.k = weight[0];
  g.r = weight[2];
  g.s = weight[3];
  g.p = out[2];
  g.q = out[3];
  g.groups = prm.groups;
  g.cg = g.c / prm.groups;
  g.kg = g.k / prm.groups;
  g.prm = prm;
  return g;
}

// col (Cg * R * S, P * Q) from one group's planes x (Cg, H, W); padding reads as zero.
template <typename T>
void im2col(const T* x, T* col, const Geometry& g) {
  const Conv2dParams& prm = g.prm;
  for (int64_t c = 0; c < g.cg; ++c) {
    const T* plane = x + c * g.h * g.w;  // (H, W)
    for (int64_t i = 0; i < g.r; ++i) {
      for (int64_t j = 0; j < g.s; ++j) {
        T* row = col + ((c * g.r + i) * g.s + j) * g.p * g.q;  // (P, Q)
        for (int64_t op = 0; op < g.p; ++op) {
          T* dst = row + op * g.q;
          const int64_t ih = op * prm.stride_h - prm.pad_h + i * prm.dilation_h;
          if (ih < 0 || ih >= g.h) {
            std::fill(dst, dst + g.q, T(0));
            continue;
          }
          const T* src = plane + ih * g.w;
          for (int64_t oq = 0; oq < g.q; ++oq) {
            const int64_t iw = oq * prm.stride_w - prm.pad_w + j * prm.dilation_w;
            dst[oq] = iw >= 0 && iw < g.w ? src[iw] : T(0);
          }
        }
      }
    }
  }
}

// The adjoint of im2col: x (Cg, H, W) += the entries of col (Cg * R * S, P * Q) that were read from it.
template <typename T>
void col2im(const T* col, T* x, const Geometry& g) {
  const Conv2dParams& prm = g.prm;
  for (int64_t c = 0; c < g.cg; ++c) {
    T* plane = x + c * g.h * g.w;  // (H, W)
    for (int64_t i = 0; i < g.r; ++i) {
      for (int64_t j = 0; j < g.s; ++j) {
        const T* row = col + ((c * g.r + i) * g.s + j) * g.p * g.q;  // (P, Q)
        for (int64_t op = 0; op < g.p; ++op) {
          const int64_t ih = op * prm.stride_h - prm.pad_h + i * prm.dilation_h;
          if (ih < 0 || ih >= g.h) continue;
          const T* src = row + op * g.q;
          T* dst = plane + ih * g.w;
          for (int64_t oq = 0; oq < g.q; ++oq) {
            const int64_t iw = oq * prm.stride_w - prm.pad_w + j * prm.dilation_w;
            if (iw >= 0 && iw < g.w) dst[iw] += src[oq];
          }
        }
      }
    }
  }
}

// The unfolded matrix of group `grp` of sample b: x itself when the unfolding is the identity,
// else written into `col`.
template <typename T>
const T* unfold(const T* x, int64_t b, int64_t grp, const Geometry& g, std::vector<T>& col) {
  const T* xg = x + (b * g.c + grp * g.cg) * g.h * g.w;  // (Cg, H, W)
  if (g.direct()) return xg;
  im2col(xg, col.data(), g);
  return col.data();
}

template <typename T>
void forward_typed(const Tensor& x, const Tensor& weight, const Tensor& out, const Conv2dParams& params) {
  const Geometry g = geometry(x.shape(), weight.shape(), out.shape(), params);
  const T* px = x.data<T>();       // (N, C, H, W)
  const T* pw = weight.data<T>();  // (K, Cg, R, S) = (K, rows)
  T* po = out.data<T>();           // (N, K, P, Q)
  const int64_t rows = g.rows(), cols = g.cols();
  parallel_for(g.n, g.k * rows * cols, [&](int64_t b) {
    std::vector<T> col(g.direct() ? 0 : rows * cols);  // (rows, cols)
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      ConstMap<T> wm(pw + grp * g.kg * rows, g.kg, rows);
      ConstMap<T> cm(unfold(px, b, grp, g, col), rows, cols);
      MutMap<T> om(po + (b * g.k + grp * g.kg) * cols, g.kg, cols);
      om.noalias() = wm * cm;
    }
  });
}

template <typename T>
void backward_input_typed(const Tensor& grad_out, const Tensor& weight, const Tensor& grad_x,
                          const Conv2dParams& params) {
  const Geometry g = geometry(grad_x.shape(), weight.shape(), grad_out.shape(), params);
  const T* pg = grad_out.data<T>();  // (N, K, P, Q)
  const T* pw = weight.data<T>();    // (K, rows)
  T* px = grad_x.data<T>();          // (N, C, H, W)
  const int64_t rows = g.rows(), cols = g.cols();
  parallel_for(g.n, g.k * rows * cols, [&](int64_t b) {
    std::vector<T> col(g.direct() ? 0 : rows * cols);  // (rows, cols)
    T* sample = px + b * g.c * g.h * g.w;              // (C, H, W)
    if (!g.direct()) std::fill(sample, sample + g.c * g.h * g.w, T(0));
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      ConstMap<T> wm(pw + grp * g.kg * rows, g.kg, rows);
      ConstMap<T> gm(pg + (b * g.k + grp * g.kg) * cols, g.kg, cols);
      T* xg = sample + grp * g.cg * g.h * g.w;  // (Cg, H, W)
      if (g.direct()) {
        MutMap<T>(xg, rows, cols).noalias() = wm.transpose() * gm;
      } else {
        MutMap<T>(col.data(), rows, cols).noalias() = wm.transpose() * gm;
        col2im(col.data(), xg, g);
      }
    }
  });
}

template <typename T>
void backward_weight_typed(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w, const Conv2dParams& params) {
  const Geometry g = geometry(x.shape(), grad_w.shape(), grad_out.shape(), params);
  const T* pg = grad_out.data<T>();  // (N, K, P, Q)
  const T* px = x.data<T>();         // (N, C, H, W)
  const int64_t rows = g.rows(), cols = g.cols();
  // Each worker sums its share of the samples into its own (K, rows) matrix; adding the partial
  // sums in a fixed order afterwards keeps the result independent of scheduling.
  const bool big = g.n * g.k * rows * cols >= kParallelGrain;
  const int64_t workers = big ? std::max<int64_t>(1, std::min(max_threads(), g.n)) : 1;
  std::vector<Matrix<T>> partial(static_cast<size_t>(workers));
  parallel_for(workers, kParallelGrain, [&](int64_t t) {
    Matrix<T>& acc = partial[static_cast<size_t>(t)];  // (K, rows)
    acc.setZero(g.k, rows);
    std::vector<T> col(g.direct() ? 0 : rows * cols);  // (rows, cols)
    for (int64_t b = t; b < g.n; b += workers) {
      for (int64_t grp = 0; grp < g.groups; ++grp) {
        ConstMap<T> cm(unfold(px, b, grp, g, col), rows, cols);
        ConstMap<T> gm(pg + (b * g.k + grp * g.kg) * cols, g.kg, cols);
        acc.middleRows(grp * g.kg, g.kg).noalias() += gm * cm.transpose();
      }
    }
  });
  MutMap<T> out(grad_w.data<T>(), g.k, rows);  // (K, Cg * R * S)
  out = partial[0];
  for (size_t t = 1; t < partial.size(); ++t) out += partial[t];
}

// Runs fn(tag, a, b, out) in f32 or f64; 16-bit operands are widened to f32 and the result is
// narrowed into out.
template <typename Fn>
void run_widened(const char* op, const Tensor& a, const Tensor& b, const Tensor& out, Fn&& fn) {
  switch (out.dtype()) {
    case DType::f32: fn(float{}, a, b, out); return;
    case DType::f64: fn(double{}, a, b, out); return;
    case DType::f16:
    case DType::bf16: {
      Tensor wide = empty(out.shape(), TensorOptions(DType::f32));
      fn(float{}, kernels::to_dtype(a, DType::f32), kernels::to_dtype(b, DType::f32), wide);
      kernels::copy_(out, wide);
      return;
    }
    default:
      TANDEM_THROW(TypeError, op, ": dtype ", out.dtype(), " is not supported on cpu (supported: f32, f64, f16, bf16)");
  }
}
}  // namespace

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& out, const Conv2dParams& p) {
  run_widened("conv2d", x, w, out, [&](auto tag, const Tensor& a, const Tensor& b, const Tensor& o) {
    forward_typed<decltype(tag)>(a, b, o, p);
  });
}

void conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_x, const Conv2dParams& p) {
  run_widened("conv2d_backward_input", grad_out, w, grad_x,
              [&](auto tag, const Tensor& a, const Tensor& b, const Tensor& o) {
                backward_input_typed<decltype(tag)>(a, b, o, p);
              });
}

void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w, const Conv2dParams& p) {
  run_widened("conv2d_backward_weight", grad_out, x, grad_w,
              [&](auto tag, const Tensor& a, const Tensor& b, const Tensor& o) {
                backward_weight_typed<decltype(tag)>(a, b, o, p);
              });
}

}  // namespace tandem::cpu
