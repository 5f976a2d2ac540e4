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
// terms. TandemColumnPartials below is tandem's own, without a final reduction across tiles
// (which would need a workspace and a counter per column of tiles cleared before each launch).
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp>

#include "tandem/core/cuda/gemm_sm90_gelu.cuh"

namespace tandem::cuda::sm90 {

// The fusion operation: LinCombDeEltAct's, as a type of its own for the callbacks below.
template <typename T>
struct DgeluBiasPartials : cutlass::epilogue::fusion::LinCombDeEltAct<cutlass::layout::RowMajor, Dgelu, T, float, T> {};

}  // namespace tandem::cuda::sm90

namespace cutlass::epilogue::fusion {

// D = gelu_tanh'(aux) * acc in f32 (tandem's Dgelu), rounded to T: LinCombDeEltAct's tree
// without its alpha and beta * C terms (alpha 1, no C), aux read as T.
template <int Stages, class EpilogueTile, class T, class SmemLayoutAtom, class CopyOpS2R>
using TandemDgeluOfAcc =
    Sm90EVT<Sm90Compute<tandem::cuda::sm90::Dgelu, T, float, FloatRoundStyle::round_to_nearest>, Sm90AccFetch,
            Sm90AuxLoad<Stages, EpilogueTile, T, cute::Stride<int64_t, cute::_1, int64_t>, SmemLayoutAtom, CopyOpS2R,
                        /*Alignment=*/128 / sizeof_bits_v<T>, /*EnableNullptr=*/false>>;
// Column sums of the values visited, in f32: each tile's sums over its rows, written (not added)
// to row m_tile of `partials` (tiles of m, n), f32, n-major. Each thread adds its values into one
// register per column it holds (a tensor with stride 0 along m); at the tile's last piece the
// lanes that share a column add theirs by a butterfly of shuffles (every lane ends with the same
// sum), the warps along m meet in shared memory (the piece's store buffer, free at that point),
// and their rows are added in warp order. A fixed order throughout: the same bits on every run.
// Rows past m need no check: their product and aux are zeros from TMA, so their D is 0. Tiles
// past the problem's edge write no row at all: CUTLASS's persistent scheduler pads its grid of
// tiles to whole clusters and swizzles and runs the padding's tiles too (their TMA stores
// clipped), and their rows would land past the end of `partials` (bias_partial_rows of m) or, past
// n, over the next row's columns.
// (CUTLASS's Sm90RowReduction does this too, but in the ping-pong kernels its exchange of halves
// between lanes kept its sums in local memory, which doubled those kernels' time.)
template <class CtaTileShapeMNK>
struct TandemColumnPartials {
  struct SharedStorage {};
  struct Arguments {
    float* partials = nullptr;  // (tiles of m, n) f32
  };
  using Params = Arguments;

  template <class ProblemShape>
  static constexpr Params to_underlying_arguments(ProblemShape const&, Arguments const& args, void*) {
    return args;
  }
  template <class ProblemShape>
  static bool can_implement(ProblemShape const&, Arguments const&) {
    return true;
  }
  template <class ProblemShape>
  static size_t get_workspace_size(ProblemShape const&, Arguments const&) {
    return 0;
  }
  template <class ProblemShape>
  static cutlass::Status initialize_workspace(ProblemShape const&, Arguments const&, void*, cudaStream_t,
                                              CudaHostAdapter* = nullptr) {
    return cutlass::Status::kSuccess;
  }

  CUTLASS_HOST_DEVICE TandemColumnPartials() {}
  CUTLASS_HOST_DEVICE TandemColumnPartials(Params const& params, SharedStorage const&) : params(params) {}
  Params params;

  CUTLASS_DEVICE bool is_producer_load_needed() const { return false; }
  CUTLASS_DEVICE bool is_C_load_needed() const { return false; }

  template <class... Args>
  CUTLASS_DEVICE auto get_producer_load_callbacks(ProducerLoadArgs<Args...> const&) {
    return EmptyProducerLoadCallbacks{};
  }

  template <class Sums, class Coords, class LanesMN, class WarpsMN>
  struct ConsumerStoreCallbacks : EmptyConsumerStoreCallbacks {
    static constexpr int kTileN = cute::size<1>(CtaTileShapeMNK{});

    Sums sums;        // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) f32, stride 0 along m: a register per column
    Coords coords;    // (CPY,CPY_M,CPY_N,EPI_M,EPI_N) each value's (m, n) in the tile
    float* row;       // (row_columns,) this tile's partial row, from its first column
    int row_columns;  // the tile's columns inside the problem; 0 for a tile past its edge (no row)
    int lane_m;       // this lane's place along m among the lanes of its warp
    int warp_m;       // this warp's place along m among the epilogue's warps
    int thread_idx;

    CUTLASS_DEVICE ConsumerStoreCallbacks(Sums&& sums, Coords coords, float* row, int row_columns, int lane_m,
                                          int warp_m, int thread_idx)
        : sums(cute::move(sums)),
          coords(coords),
          row(row),
          row_columns(row_columns),
          lane_m(lane_m),
          warp_m(warp_m),
          thread_idx(thread_idx) {}

    template <typename ElementAccumulator, typename ElementInput, int FragmentSize>
    CUTLASS_DEVICE Array<ElementInput, FragmentSize> visit(Array<ElementAccumulator, FragmentSize> const&, int epi_v,
                                                           int epi_m, int epi_n,
                                                           Array<ElementInput, FragmentSize> const& values) {
      Tensor piece = sums(_, _, _, epi_m, epi_n);
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < FragmentSize; ++i) piece(epi_v * FragmentSize + i) += static_cast<float>(values[i]);
      return values;
    }

    template <class STensor, class SyncFn, class VTensor>
    CUTLASS_DEVICE void reduce(STensor&& buffer, SyncFn const& sync, int, int, bool is_last_iteration, VTensor) {
      if (!is_last_iteration) return;
      // One register per column: the m modes cut to one (their stride is 0), with their coordinates.
      Tensor column_sums = filter_zeros(sums);
      Tensor columns = make_tensor(coords.data(), make_layout(column_sums.shape(), coords.stride()));
      // The lanes along m: a butterfly over the lane-index bits that step along m.
      constexpr int kLanesM = cute::size<0>(LanesMN{});
      CUTLASS_PRAGMA_UNROLL
      for (int i = 0; i < cute::size(column_sums); ++i) {
        float sum = column_sums(i);
        CUTLASS_PRAGMA_UNROLL
        for (int step = 1; step < kLanesM; step *= 2) {
          sum += __shfl_xor_sync(0xffffffff, sum, LanesMN{}(step, cute::_0{}));
        }
        column_sums(i) = sum;
      }
      // The warps along m: one row each in shared memory, (kWarpsM, kTileN) f32.
      constexpr int kWarpsM = cute::size<0>(WarpsMN{});
      constexpr int kThreads = NumThreadsPerWarp * cute::size(WarpsMN{});
      static_assert(
          kWarpsM * kTileN * sizeof(float) <= cute::cosize(typename cute::remove_cvref_t<STensor>::layout_type{}) *
                                                  sizeof(typename cute::remove_cvref_t<STensor>::value_type),
          "the store buffer cannot hold a row of column sums per warp along m");
      float* rows = reinterpret_cast<float*>(raw_pointer_cast(buffer.data()));  // (kWarpsM, kTileN)
      sync();
      if (lane_m == 0) {
        CUTLASS_PRAGMA_UNROLL
        for (int i = 0; i < cute::size(column_sums); ++i) {
          rows[warp_m * kTileN + get<1>(columns(i))] = column_sums(i);
        }
      }
      sync();
      for (int c = thread_idx; c < row_columns; c += kThreads) {
        float sum = rows[c];
        CUTLASS_PRAGMA_UNROLL
        for (int w = 1; w < kWarpsM; ++w) sum += rows[w * kTileN + c];
        row[c] = sum;
      }
      sync();  // before the piece's D is written over the rows
    }
  };

  template <bool ReferenceSrc, class... Args>
  CUTLASS_DEVICE auto get_consumer_store_callbacks(ConsumerStoreArgs<Args...> const& args) {
    using TiledCopy = decltype(args.tiled_copy);
    // Which lane and warp hold each place of the tile: (tile m, tile n) -> thread-value index.
    auto tile_to_tv = [&]() {
      auto shape_mn = shape(typename TiledCopy::Tiler_MN{});
      if constexpr (ReferenceSrc) {
        return right_inverse(args.tiled_copy.get_layoutS_TV()).with_shape(shape_mn);
      } else {
        return right_inverse(args.tiled_copy.get_layoutD_TV()).with_shape(shape_mn);
      }
    }();
    using Warps = Int<TiledCopy::TiledNumThr::value / NumThreadsPerWarp>;
    auto tile_to_lane = composition(Layout<Shape<Int<NumThreadsPerWarp>, Warps, _1>, Stride<_1, _0, _0>>{}, tile_to_tv);
    auto tile_to_warp = composition(Layout<Shape<Int<NumThreadsPerWarp>, Warps, _1>, Stride<_0, _1, _0>>{}, tile_to_tv);
    auto lanes_mn =
        make_layout(filter(get<0>(tile_to_lane)), filter(get<1>(tile_to_lane)));  // (lane m, lane n) -> lane
    auto warps_mn =
        make_layout(filter(get<0>(tile_to_warp)), filter(get<1>(tile_to_warp)));  // (warp m, warp n) -> warp
    const int lane_m = get<0>(idx2crd(right_inverse(lanes_mn)(canonical_lane_idx()), shape(lanes_mn)));
    const int warp_m = get<0>(idx2crd(right_inverse(warps_mn)(args.thread_idx / NumThreadsPerWarp), shape(warps_mn)));

    auto [m, n, k, l] = args.tile_coord_mnkl;
    const int64_t problem_m = get<0>(args.problem_shape_mnkl), problem_n = get<1>(args.problem_shape_mnkl);
    constexpr int64_t kTileM = cute::size<0>(CtaTileShapeMNK{}), kTileN = cute::size<1>(CtaTileShapeMNK{});
    const int64_t first_column = static_cast<int64_t>(n) * kTileN;
    const bool inside = static_cast<int64_t>(m) * kTileM < problem_m && first_column < problem_n;
    const int row_columns = inside ? static_cast<int>(cute::min(kTileN, problem_n - first_column)) : 0;
    float* row = params.partials + (inside ? static_cast<int64_t>(m) * problem_n + first_column : 0);
    // A (tile m, tile n) view with stride 0 along m, partitioned as the values are: its registers
    // are one per column.
    Tensor column_view =
        make_tensor(make_gmem_ptr(row), make_layout(take<0, 2>(args.tile_shape_mnk), Stride<_0, _1>{}));
    Tensor sums = make_tensor_like<float>(
        sm90_partition_for_epilogue<ReferenceSrc>(column_view, args.epi_tile, args.tiled_copy, args.thread_idx));
    fill(sums, 0.0f);
    // Each value's (m, n) in the tile, this thread's own offset included (args.tCcD counts from the
    // thread's first value).
    Tensor coords = sm90_partition_for_epilogue<ReferenceSrc>(make_identity_tensor(take<0, 2>(args.tile_shape_mnk)),
                                                              args.epi_tile, args.tiled_copy, args.thread_idx);
    return ConsumerStoreCallbacks<decltype(sums), decltype(coords), decltype(lanes_mn), decltype(warps_mn)>(
        cute::move(sums), coords, row, row_columns, lane_m, warp_m, args.thread_idx);
  }
};

// The column sums take their child's values in f32, T's values widened.
template <class CtaTileShapeMNK, class T, class Child>
using TandemColumnSumsOf =
    Sm90EVT<TandemColumnPartials<CtaTileShapeMNK>,
            Sm90EVT<Sm90Compute<thread::Identity, float, T, FloatRoundStyle::round_to_nearest>, Child>>;

template <int StagesC, int StagesD, int FragmentSize, bool ReuseSmemC, bool DelayTmaStore, class T,
          class CtaTileShapeMNK, class EpilogueTile, class SmemLayoutAtom, class CopyOpS2R>
struct FusionCallbacks<epilogue::Sm90TmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore>,
                       tandem::cuda::sm90::DgeluBiasPartials<T>, CtaTileShapeMNK, EpilogueTile, SmemLayoutAtom,
                       CopyOpS2R>
    : TandemColumnSumsOf<CtaTileShapeMNK, T, TandemDgeluOfAcc<StagesC, EpilogueTile, T, SmemLayoutAtom, CopyOpS2R>> {
  // partial (tiles of m, n) f32, n-major: each tile's column sums of D = gelu'(aux) * acc in T
  using Impl =
      TandemColumnSumsOf<CtaTileShapeMNK, T, TandemDgeluOfAcc<StagesC, EpilogueTile, T, SmemLayoutAtom, CopyOpS2R>>;
  using Operation = tandem::cuda::sm90::DgeluBiasPartials<T>;

  // aux (m, n) with its strides, and where the partial rows go.
  struct Arguments {
    T const* aux_ptr = nullptr;
    cute::Stride<int64_t, cute::_1, int64_t> dAux = {};
    float* bias_partials_ptr = nullptr;

    operator typename Impl::Arguments() const { return {{{{}, {aux_ptr, T(0), dAux}, {}}, {}}, {bias_partials_ptr}}; }
  };

  using Impl::Impl;
};

}  // namespace cutlass::epilogue::fusion
