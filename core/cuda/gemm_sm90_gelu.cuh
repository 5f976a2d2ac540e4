#pragma once
// GELU (tanh form) in tandem's sm_90 epilogues (gemm_sm90.h's bias_gelu_aux forward and dgelu_*
// input gradients).
//
// The forward, BiasGeluAux: pre = acc + bias in f32, stored to aux as T, and D = gelu_tanh(pre)
// (CUTLASS's GELU_taylor<float>), as CUTLASS's LinCombPerColBiasEltActAux computes it but
// without that operation's alpha * acc and beta * C terms (alpha 1, no C), which its epilogue
// computed per value all the same.
//
// The derivative, Dgelu: d * gelu'(z) in f32, with
// t = tanh(k0 (z + k1 z^3)) on the hardware's tanh (CUTLASS's fast_tanh, as its dGELU):
//   gelu'(z) = 0.5 (1 + t) + 0.5 z (1 - t^2) (k0 + 3 k0 k1 z^2).
// The same derivative as CUTLASS's thread::dGELU, in 10 f32 operations and one tanh against its
// 15 (fused multiply-adds, z^2 computed once): in the ping-pong kernels the epilogues, one warp
// group's at a time, set the pace, and their warps mostly issue or wait on the instruction before.
// At GPT-2 B8's size (8192 x 3072, k 768) the input gradient through GELU took 3-5 us less with
// it (docs/performance-notes.md, "tandem's CUTLASS kernels on sm_90"). Rounding differs from dGELU's
// in the last bits of f32.
#include <cutlass/array.h>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/fast_math.h>

namespace tandem::cuda::sm90 {

template <typename T>
struct Dgelu;

template <>
struct Dgelu<float> {
  static constexpr bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE float operator()(float d, float z) const {
    constexpr float k0 = 0.7978845608028654f;     // sqrt(2 / pi)
    constexpr float k0k1 = 0.7978845608028654f * 0.044715f;
    const float zz = z * z;
    const float t = cutlass::fast_tanh(z * fmaf(k0k1, zz, k0));
    const float half_one_plus_t = fmaf(0.5f, t, 0.5f);
    const float one_minus_t2 = fmaf(-t, t, 1.0f);
    const float slope = fmaf(3.0f * k0k1, zz, k0);  // d/dz of k0 (z + k1 z^3)
    return d * fmaf((0.5f * z) * one_minus_t2, slope, half_one_plus_t);
  }
};

template <int N>
struct Dgelu<cutlass::Array<float, N>> {
  static constexpr bool kIsHeavy = true;
  CUTLASS_HOST_DEVICE cutlass::Array<float, N> operator()(cutlass::Array<float, N> const& d,
                                                          cutlass::Array<float, N> const& z) const {
    cutlass::Array<float, N> out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = Dgelu<float>{}(d[i], z[i]);
    return out;
  }
};

// The forward's fusion operation: LinCombPerColBiasEltActAux's, as a type of its own for the
// callbacks below.
template <typename T>
struct BiasGeluAux : cutlass::epilogue::fusion::LinCombPerColBiasEltActAux<
                         cutlass::layout::RowMajor, cutlass::epilogue::thread::GELU_taylor, T, float, T, T> {};

}  // namespace tandem::cuda::sm90

namespace cutlass::epilogue::fusion {

// D = gelu_tanh(pre), aux = pre as T, pre = acc + bias (n,) in f32.
template <int StagesD, class CtaTileShapeMNK, class EpilogueTile, class T, class SmemLayoutAtom, class CopyOpR2S>
using TandemBiasGeluAux = Sm90EVT<
    Sm90Compute<thread::GELU_taylor, T, float, FloatRoundStyle::round_to_nearest>,
    Sm90EVT<Sm90AuxStore<StagesD, EpilogueTile, T, FloatRoundStyle::round_to_nearest,
                         cute::Stride<int64_t, cute::_1, int64_t>, SmemLayoutAtom, CopyOpR2S>,
            Sm90EVT<Sm90Compute<plus, float, float, FloatRoundStyle::round_to_nearest>, Sm90AccFetch,
                    Sm90RowBroadcast<0, CtaTileShapeMNK, T, float, cute::Stride<cute::_0, cute::_1, int64_t>>>>>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class T,
          class CtaTileShapeMNK, class EpilogueTile, class SmemLayoutAtom, class CopyOpR2S>
struct FusionCallbacks<epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
                       tandem::cuda::sm90::BiasGeluAux<T>, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpR2S>
    : TandemBiasGeluAux<StagesD, CtaTileShapeMNK, EpilogueTile, T, SmemLayoutAtom, CopyOpR2S> {
  using Impl = TandemBiasGeluAux<StagesD, CtaTileShapeMNK, EpilogueTile, T, SmemLayoutAtom, CopyOpR2S>;
  using Operation = tandem::cuda::sm90::BiasGeluAux<T>;

  // The bias (n,), and aux (m, n) with its strides.
  struct Arguments {
    T const* bias_ptr = nullptr;
    T* aux_ptr = nullptr;
    cute::Stride<int64_t, cute::_1, int64_t> dAux = {};

    operator typename Impl::Arguments() const { return {{{{}, {bias_ptr, T(0), {}}, {}}, {aux_ptr, dAux}}, {}}; }
  };

  using Impl::Impl;
};

}  // namespace cutlass::epilogue::fusion
