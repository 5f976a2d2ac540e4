#pragma once
// GELU's backward with its layer's bias gradient, as a CUTLASS sm_90 epilogue (gemm_sm90.h's
// Epilogue::dgelu_aux_bias_partials): D = gelu_tanh'(aux) * acc, rounded to T and stored, and the
// column sums of D as stored (the rounded values, as a separate pass over D would sum them), one
// f32 row per tile of rows. Each tile's sums are added in registers, then across the lanes and
// warps that share a column, in a fixed order, and written (not added) to the tile's row: no
// atomics, so the same bits on every run. sum_partial_rows (partial_rows.cuh) then adds the rows.
//
// CUTLASS has the per-row form of this (LinCombDeEltActDePerRowBias: sums along n); the bias of
// a linear layer runs along n, so its gradient sums along m: a row reduction of D in CUTLASS's
// terms (Sm90RowReduction), without its final reduction, which would need a workspace and a
// counter per column of tiles cleared before each launch.
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

namespace tandem::cuda::sm90 {

// The fusion operation: LinCombDeEltAct's, as a type of its own for the callbacks below.
template <typename T>
struct DgeluBiasPartials : cutlass::epilogue::fusion::LinCombDeEltAct<cutlass::layout::RowMajor,
                                                                      cutlass::epilogue::thread::dGELU, T, float, T> {};

}  // namespace tandem::cuda::sm90

namespace cutlass::epilogue::fusion {

// LinCombDeEltAct's callbacks for GELU's backward in T, and those under the row reduction.
template <class Dispatch, class T, class CtaTileShapeMNK, class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
using TandemDgeluCallbacks = FusionCallbacks<Dispatch, LinCombDeEltAct<layout::RowMajor, thread::dGELU, T, float, T>,
                                             CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpS2R>;
// The row reduction takes its child's values in f32, T's values widened (what it adds without its
// per-element bounds check, which rows past m need not have: their product and aux are zeros from
// TMA, so their D is 0).
template <class CtaTileShapeMNK, class T, class Child>
using TandemColumnSumsOf =
    Sm90EVT<Sm90RowReduction<plus, plus, plus, 0, CtaTileShapeMNK, float, float, FloatRoundStyle::round_to_nearest,
                             cute::Stride<cute::_0, cute::_1, int64_t>, /*Alignment=*/4, /*EnableNullptr=*/false,
                             /*FinalReduction=*/false, /*VisitCheckOOB=*/false>,
            Sm90EVT<Sm90Compute<thread::Identity, float, T, FloatRoundStyle::round_to_nearest>, Child>>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class T,
          class CtaTileShapeMNK, class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
struct FusionCallbacks<epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
                       tandem::cuda::sm90::DgeluBiasPartials<T>, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom,
                       CopyOpS2R>
    : TandemColumnSumsOf<
          CtaTileShapeMNK, T,
          typename TandemDgeluCallbacks<
              epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>, T,
              CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpS2R>::Impl> {
  using DeEltAct =
      TandemDgeluCallbacks<epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
                           T, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom, CopyOpS2R>;
  // partial (tiles of m, n) f32, n-major: each tile's column sums of D = gelu'(aux) * acc in T
  using Impl = TandemColumnSumsOf<CtaTileShapeMNK, T, typename DeEltAct::Impl>;
  using Operation = tandem::cuda::sm90::DgeluBiasPartials<T>;

  // LinCombDeEltAct's arguments (alpha, beta, aux_ptr, dAux), and where the partial rows go.
  struct Arguments : DeEltAct::Arguments {
    float* bias_partials_ptr = nullptr;

    operator typename Impl::Arguments() const {
      const typename DeEltAct::Impl::Arguments child = static_cast<const typename DeEltAct::Arguments&>(*this);
      return {{child, {}}, {bias_partials_ptr, 0.0f, {}}};
    }
  };

  using Impl::Impl;
};

}  // namespace cutlass::epilogue::fusion
