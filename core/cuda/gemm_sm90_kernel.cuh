#pragma once
// The CUTLASS side of gemm_sm90.h: one kernel type per operand layout, epilogue, element type and
// configuration, and its launch. Included only by the generated gemm_sm90_<kind>_<dtype>.cu files
// (CMake writes them from gemm_sm90_instance.cu.in), which compile for sm_90a with CUTLASS's
// grid-dependency control on (CUTLASS_ENABLE_GDC_FOR_SM90: the kernels wait for the previous grid
// before their first load and let the next one launch when their last tile's loads are done).
#include <type_traits>

#include <cutlass/cutlass.h>
#include <cutlass/epilogue/thread/activation.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cute/tensor.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/operations.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "tandem/core/cuda/gemm_sm90.h"
#include "tandem/core/cuda/gemm_sm90_bias_partials.cuh"
#include "tandem/core/cuda/gemm_sm90_gelu.cuh"
#include "tandem/core/cuda/runtime.h"

namespace tandem::cuda::sm90 {

// The operand layouts of gemm_sm90.h as CUTLASS's tags: A row-major (m, k) is K-major (RowMajor),
// stored transposed it is M-major (ColumnMajor); CUTLASS's B is (n, k), so B stored (k, n)
// row-major is N-major (RowMajor) and stored (n, k) it is K-major (ColumnMajor).
enum class Kind { forward, input_gradient, weight_gradient };
template <Kind kind>
struct Layouts;
template <>
struct Layouts<Kind::forward> {
  using A = cutlass::layout::RowMajor;
  using B = cutlass::layout::ColumnMajor;
};
template <>
struct Layouts<Kind::input_gradient> {
  using A = cutlass::layout::RowMajor;
  using B = cutlass::layout::RowMajor;
};
template <>
struct Layouts<Kind::weight_gradient> {
  using A = cutlass::layout::ColumnMajor;
  using B = cutlass::layout::RowMajor;
};

// The epilogue as CUTLASS's fusion operation (f32 compute, output type T; GELU's tanh form).
template <Epilogue epilogue, typename T>
struct Fusion;
template <typename T>
struct Fusion<Epilogue::none, T> {
  using Op = cutlass::epilogue::fusion::LinearCombination<T, float>;
};
template <typename T>
struct Fusion<Epilogue::bias, T> {
  using Op = cutlass::epilogue::fusion::LinCombPerColBias<T, float, T>;
};
template <typename T>
struct Fusion<Epilogue::bias_residual, T> {
  using Op = cutlass::epilogue::fusion::LinCombPerColBias<T, float, T>;  // with beta 1 and C the residual
};
template <typename T>
struct Fusion<Epilogue::bias_gelu_aux, T> {
  using Op = BiasGeluAux<T>;  // gemm_sm90_gelu.cuh
};

template <typename T>
struct Fusion<Epilogue::dgelu_aux, T> {
  using Op = cutlass::epilogue::fusion::LinCombDeEltAct<cutlass::layout::RowMajor, Dgelu, T, float, T>;
};

template <typename T>
struct Fusion<Epilogue::dgelu_aux_bias_partials, T> {
  using Op = DgeluBiasPartials<T>;
};

// gemm_sm90.h's configurations: tile, cluster, the kernel and epilogue schedules, and the pieces
// the epilogue stores the tile in.
template <int config>
struct Config;
template <>
struct Config<0> {
  using Tile = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
  using EpilogueTile = cutlass::epilogue::collective::EpilogueTileAuto;
};
template <>
struct Config<1> {
  using Tile = cute::Shape<cute::_128, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  // Stored in 64 x 64 pieces rather than CUTLASS's default for this tile: in GPT-2 B8's GELU
  // products (8192 x 3072, k 768, one H200) 2.5-3 us faster, with the pre-activation stored
  // (forward) or read (backward) beside D.
  using EpilogueTile = cute::Shape<cute::_64, cute::_64>;
};
template <>
struct Config<2> {
  using Tile = cute::Shape<cute::_64, cute::_128, cute::_64>;
  using Cluster = cute::Shape<cute::_1, cute::_1, cute::_1>;
  using Schedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
  using EpilogueSchedule = cutlass::epilogue::TmaWarpSpecialized;
  using EpilogueTile = cutlass::epilogue::collective::EpilogueTileAuto;
};

template <Kind kind, Epilogue epilogue, typename T, int config>
struct KernelFor {
  using C = Config<config>;
  using L = Layouts<kind>;
  static constexpr int kAlign = 8;  // elements: 16 bytes
  // The source C: read (the residual) only by bias_residual; the others have none to load.
  using ElementC = std::conditional_t<epilogue == Epilogue::bias_residual, T, void>;
  using CollectiveEpilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, typename C::Tile, typename C::Cluster,
      typename C::EpilogueTile, float, float, ElementC, cutlass::layout::RowMajor, kAlign, T,
      cutlass::layout::RowMajor, kAlign, typename C::EpilogueSchedule, typename Fusion<epilogue, T>::Op>::CollectiveOp;
  using CollectiveMainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, T, typename L::A, kAlign, T, typename L::B, kAlign, float,
      typename C::Tile, typename C::Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename CollectiveEpilogue::SharedStorage))>,
      typename C::Schedule>::CollectiveOp;
  using Kernel =
      cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, CollectiveMainloop, CollectiveEpilogue>;
};

// A stride of CUTLASS's (rows, cols, batch) form with leading dimension ld: (ld, 1, 0) where the
// type's second mode is the contiguous one, (1, ld, 0) where the first is.
template <typename Stride>
Stride leading_dimension(int64_t ld) {
  Stride s{};
  if constexpr (cute::is_static<cute::remove_cvref_t<decltype(cute::get<0>(s))>>::value) {
    cute::get<1>(s) = ld;
  } else {
    cute::get<0>(s) = ld;
  }
  cute::get<2>(s) = 0;
  return s;
}

// Raster orders and swizzle widths a variant takes beside its config (gemm_sm90.h's kVariants).
constexpr int kSwizzles[2] = {1, 4};

template <Kind kind, Epilogue epilogue, typename T, int config>
bool launch(const Problem& p, int variant, int device, cudaStream_t stream) {
  using Kernel = typename KernelFor<kind, epilogue, T, config>::Kernel;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  typename Kernel::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {static_cast<int>(p.m), static_cast<int>(p.n), static_cast<int>(p.k), 1};
  args.mainloop.ptr_A = static_cast<const T*>(p.a);
  args.mainloop.dA = leading_dimension<typename Kernel::StrideA>(p.lda);
  args.mainloop.ptr_B = static_cast<const T*>(p.b);
  args.mainloop.dB = leading_dimension<typename Kernel::StrideB>(p.ldb);
  if constexpr (epilogue == Epilogue::bias_residual) {
    args.epilogue.ptr_C = static_cast<const T*>(p.c);
  } else {
    args.epilogue.ptr_C = nullptr;
  }
  args.epilogue.dC = leading_dimension<typename Kernel::StrideC>(p.ldd);
  args.epilogue.ptr_D = static_cast<T*>(p.d);
  args.epilogue.dD = leading_dimension<typename Kernel::StrideD>(p.ldd);
  auto& fusion = args.epilogue.thread;
  // Tandem's own trees (bias_gelu_aux, dgelu_aux_bias_partials) have no alpha or beta.
  if constexpr (epilogue != Epilogue::bias_gelu_aux && epilogue != Epilogue::dgelu_aux_bias_partials) {
    fusion.alpha = 1.0f;
    fusion.beta = epilogue == Epilogue::bias_residual ? 1.0f : 0.0f;
  }
  if constexpr (epilogue == Epilogue::bias || epilogue == Epilogue::bias_residual ||
                epilogue == Epilogue::bias_gelu_aux) {
    fusion.bias_ptr = static_cast<const T*>(p.bias);
  }
  // aux (m, n) with D's leading dimension: written by the GELU forward, read by GELU's backward.
  if constexpr (epilogue == Epilogue::bias_gelu_aux || epilogue == Epilogue::dgelu_aux ||
                epilogue == Epilogue::dgelu_aux_bias_partials) {
    fusion.aux_ptr = static_cast<decltype(fusion.aux_ptr)>(p.aux);
    fusion.dAux = leading_dimension<decltype(fusion.dAux)>(p.ldd);
  }
  // (bias_partial_rows(variant, m), n) f32: the column sums of D per tile of rows.
  if constexpr (epilogue == Epilogue::dgelu_aux_bias_partials) fusion.bias_partials_ptr = p.bias_partials;
  int sm_count = 0;
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device));
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sm_count;
  args.scheduler.raster_order = (variant / 2) % 2 == 0 ? cutlass::gemm::kernel::detail::RasterOrderOptions::AlongN
                                                       : cutlass::gemm::kernel::detail::RasterOrderOptions::AlongM;
  args.scheduler.max_swizzle_size = kSwizzles[variant % 2];
  // The persistent tile scheduler needs no workspace; a problem that would is left to cuBLASLt.
  if (Kernel::can_implement(args) != true || Kernel::get_workspace_size(args) != 0) return false;
  typename Kernel::Params params = Kernel::to_underlying_arguments(args, nullptr);
  allow_dynamic_shared_memory(cutlass::device_kernel<Kernel>, device, Kernel::SharedStorageSize);
  const cutlass::Status status = Gemm::run(params, stream, nullptr, launch_as_dependent(device));
  if (status != cutlass::Status::kSuccess) {
    TANDEM_THROW(BackendError, "CUTLASS's sm_90 product (", p.m, ", ", p.n, ", ", p.k,
                 ") failed to launch: ", cutlassGetStatusString(status));
  }
  check_launch("gemm_sm90");
  return true;
}

// The entry point of one generated file: its kind, epilogue and type, the config chosen at run time.
template <Kind kind, Epilogue epilogue, typename T>
bool launch_any(const Problem& p, int variant, int device, cudaStream_t stream) {
  switch (variant / 4) {
    case 0: return launch<kind, epilogue, T, 0>(p, variant, device, stream);
    case 1: return launch<kind, epilogue, T, 1>(p, variant, device, stream);
    default: return launch<kind, epilogue, T, 2>(p, variant, device, stream);
  }
}

}  // namespace tandem::cuda::sm90
