#include "tandem/core/cuda/cublaslt_plan.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tandem/core/backend.h"
#include "tandem/core/determinism.h"

namespace tandem::cuda {

namespace {
std::atomic<MatmulTuning> tuning{MatmulTuning::large};

bool log_choices() {
  static const bool log = [] {
    const char* v = std::getenv("TANDEM_MATMUL_LOG");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return log;
}
}  // namespace

void set_matmul_tuning(MatmulTuning t) { tuning = t; }
MatmulTuning matmul_tuning() { return tuning; }

namespace {
// -1: not decided yet (TANDEM_GEMM is read on first use); else a GemmKernels value.
std::atomic<int> gemm_choice{-1};

GemmKernels parse_gemm_env(const char* value) {
  if (value == nullptr) return GemmKernels::automatic;
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v.empty() || v == "auto" || v == "automatic") return GemmKernels::automatic;
  if (v == "cublaslt") return GemmKernels::cublaslt;
  if (v == "cutlass") return GemmKernels::cutlass;
  TANDEM_THROW(ValueError, "TANDEM_GEMM=", value, ": expected auto, cublaslt or cutlass");
}
}  // namespace

void set_gemm_kernels(GemmKernels kernels) { gemm_choice.store(static_cast<int>(kernels)); }

GemmKernels gemm_kernels() {
  int choice = gemm_choice.load();
  if (choice < 0) {
    int expected = -1;  // a concurrent set_gemm_kernels() wins over the environment
    gemm_choice.compare_exchange_strong(expected, static_cast<int>(parse_gemm_env(std::getenv("TANDEM_GEMM"))));
    choice = gemm_choice.load();
  }
  return static_cast<GemmKernels>(choice);
}

namespace lt {

namespace {
bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  TANDEM_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Milliseconds per run of `run_once`: the median of kRuns after one untimed run, each run after
// `flush` (L2-sized bytes) was overwritten, so that the operands come from memory as in a step
// (back to back, a product whose operands fit in L2 timed faster than it runs there). Negative when
// run_once refuses (returns false).
double time_runs(const std::function<bool()>& run_once, cudaStream_t stream, const Tensor& flush) {
  constexpr int kRuns = 7;
  if (!run_once()) return -1;
  std::vector<Event> start(kRuns), stop(kRuns);
  bool ran = true;
  for (int r = 0; r < kRuns && ran; ++r) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(flush.data_ptr(), r, static_cast<size_t>(flush.numel()), stream));
    start[r].record_on(stream);
    ran = run_once();
    stop[r].record_on(stream);
  }
  if (!ran) return -1;
  stop.back().synchronize();
  std::vector<double> ms;  // (kRuns,)
  for (int r = 0; r < kRuns; ++r) ms.push_back(start[r].elapsed_ms(stop[r]));
  std::nth_element(ms.begin(), ms.begin() + kRuns / 2, ms.end());
  return ms[kRuns / 2];
}

// time_runs for cuBLASLt's `algo`, with `workspace`.
double time_algorithm(const Launch& launch, const cublasLtMatmulAlgo_t& algo, const Tensor& workspace,
                      cudaStream_t stream, const Tensor& flush) {
  void* ws = workspace.data_ptr();
  const size_t ws_bytes = static_cast<size_t>(workspace.numel());
  return time_runs([&] { return launch(algo, ws, ws_bytes) == CUBLAS_STATUS_SUCCESS; }, stream, flush);
}

// The fastest of gemm_sm90.h's variants for p, timed as above: {variant, ms}, or {-1, -1} where
// none ran. `times` gets each variant's time for TANDEM_MATMUL_LOG.
std::pair<int, double> time_sm90(const sm90::Problem& p, int device, cudaStream_t stream, const Tensor& flush,
                                 std::string* times) {
  std::pair<int, double> best{-1, -1.0};
  for (int v = 0; v < sm90::kVariants; ++v) {
    const double ms = time_runs([&] { return sm90::run(p, v, device, stream); }, stream, flush);
    *times += detail::concat(v == 0 ? "" : ", ", ms < 0 ? std::string("refused") : detail::concat(ms * 1e3, " us"));
    if (ms >= 0 && (best.first < 0 || ms < best.second)) best = {v, ms};
  }
  return best;
}

// What an algorithm is, for TANDEM_MATMUL_LOG: its id and the configuration cuBLASLt gave it
// (cublasLtMatmulTile_t, cublasLtMatmulStages_t, split-K count, cublasLtClusterShape_t; 0 = automatic).
std::string describe(const cublasLtMatmulAlgo_t& algo) {
  int id = 0, tile = 0, stages = 0, split_k = 0, cluster = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split_k, sizeof split_k, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof cluster,
                                       &written);
  return detail::concat("algo ", id, ", tile ", tile, ", stages ", stages, ", split-K ", split_k, ", cluster ",
                        cluster);
}

// Up to `count` of the heuristic's answers for the problem with at most `max_workspace` bytes of
// workspace, best first; `status` is the query's.
std::vector<cublasLtMatmulHeuristicResult_t> ask_heuristic(int device, const MatmulDesc& desc, const Layout& a,
                                                           const Layout& b, const Layout& d,
                                                           const Alignments& alignments, size_t max_workspace,
                                                           int count, cublasStatus_t* status) {
  cublasLtMatmulPreference_t pref = nullptr;
  TANDEM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  uint32_t al_a = static_cast<uint32_t>(alignments.a), al_b = static_cast<uint32_t>(alignments.b),
           al_d = static_cast<uint32_t>(alignments.d);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace,
                                       sizeof max_workspace);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));  // (count,)
  int found = 0;
  *status = cublasLtMatmulAlgoGetHeuristic(handle(device), desc.get(), a.get(), b.get(), d.get(), d.get(), pref, count,
                                           results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  results.resize(*status == CUBLAS_STATUS_SUCCESS ? static_cast<size_t>(found) : 0);
  return results;
}

bool same_algorithm(const cublasLtMatmulAlgo_t& x, const cublasLtMatmulAlgo_t& y) {
  return std::memcmp(&x, &y, sizeof x) == 0;
}
}  // namespace

Heuristic query_heuristic(int device, const MatmulDesc& desc, const Layout& a, const Layout& b, const Layout& d,
                          const Alignments& alignments, double flops, const Launch& launch, const std::string& what,
                          const sm90::Problem* sm90_problem, const std::function<bool()>& sm90_saves) {
  const cudaStream_t stream = current_stream(device);
  const MatmulTuning mode = tuning;
  const bool wanted = mode == MatmulTuning::all || (mode == MatmulTuning::large && flops >= kTunedMatmulMinFlops);
  const bool tune = wanted && !are_deterministic_algorithms_enabled() && !stream_capturing(stream);
  const GemmKernels kernels = gemm_kernels();
  const bool sm90_wanted = sm90_problem != nullptr && kernels != GemmKernels::cublaslt && sm90::available(device) &&
                           sm90::supported(*sm90_problem);
  const bool sm90_forced = sm90_wanted && kernels == GemmKernels::cutlass;
  Heuristic h;
  const std::vector<cublasLtMatmulHeuristicResult_t> any_workspace =
      ask_heuristic(device, desc, a, b, d, alignments, kWorkspaceBytes, tune ? kTunedCandidates : 1, &h.status);
  h.found = !any_workspace.empty();
  if (h.found) {
    h.algo = any_workspace[0].algo;
    h.workspace_bytes = any_workspace[0].workspaceSize;
  }
  if (!tune) {
    if (sm90_forced) h.sm90_variant = sm90::default_variant(*sm90_problem, device);
    return h;
  }
  if (!h.found && !sm90_wanted) return h;
  // cuBLASLt's candidates: the heuristic's best without a workspace first, then the answers above
  // that are not among them. Many of cuBLASLt's Hopper kernels come in two variants, one of which
  // keeps a 4-byte counter in the workspace and clears it with a memset before each run; on an
  // H200 the other ran as fast, and eagerly the memset and the launch gaps around it cost about
  // 2.6 us a product. A failed workspace-free query leaves the answers above alone.
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;  // (up to 2 x kTunedCandidates,)
  if (h.found) {
    cublasStatus_t workspace_free_status = CUBLAS_STATUS_SUCCESS;
    candidates = ask_heuristic(device, desc, a, b, d, alignments, 0, kTunedCandidates, &workspace_free_status);
    for (const auto& r : any_workspace) {
      bool seen = false;
      for (const auto& c : candidates) seen = seen || same_algorithm(c.algo, r.algo);
      if (!seen) candidates.push_back(r);
    }
    if (candidates.size() == 1) {
      h.algo = candidates[0].algo;
      h.workspace_bytes = candidates[0].workspaceSize;
      if (!sm90_wanted) return h;  // nothing to compare it with
    }
  }
  // The allocations the timing needs. Where memory is too short for them, the heuristic's first,
  // untimed, rather than failing the product.
  Tensor flush;      // (2 x L2 bytes,)
  Tensor workspace;  // (kWorkspaceBytes,) what any candidate may use
  try {
    const TensorOptions bytes(DType::u8, Device(DeviceType::cuda, device));
    flush = empty({2 * l2_cache_bytes(device)}, bytes);
    workspace = empty({static_cast<int64_t>(kWorkspaceBytes)}, bytes);
  } catch (const OutOfMemoryError&) {
    if (sm90_forced) h.sm90_variant = sm90::default_variant(*sm90_problem, device);
    return h;
  }
  std::vector<TimedCandidate> timed;  // (candidates,)
  std::string times;
  for (size_t i = 0; i < candidates.size(); ++i) {
    timed.push_back(
        {time_algorithm(launch, candidates[i].algo, workspace, stream, flush), candidates[i].workspaceSize});
    times += detail::concat(i == 0 ? "" : ", ",
                            timed[i].ms < 0 ? std::string("refused") : detail::concat(timed[i].ms * 1e3, " us"),
                            timed[i].workspace_bytes > 0 ? " (workspace)" : "");
  }
  const int best = choose_timed_candidate(timed);
  if (best >= 0) {
    h.algo = candidates[best].algo;
    h.workspace_bytes = candidates[best].workspaceSize;
  }
  std::string sm90_times;
  const std::pair<int, double> sm90_best =
      sm90_wanted ? time_sm90(*sm90_problem, device, stream, flush, &sm90_times) : std::pair<int, double>{-1, -1.0};
  // The pass cuBLASLt's result still needs, where gemm_sm90.h's kernel does it in its epilogue.
  const double saved_ms = sm90_best.first >= 0 && sm90_saves ? std::max(0.0, time_runs(sm90_saves, stream, flush)) : 0;
  if (sm90_best.first >= 0) {
    // cuBLASLt's best as choose_timed_candidate charged it, plus that pass; CUTLASS's replaces it
    // where 2% faster.
    const double lt_charged =
        best < 0 ? 0.0 : timed[best].ms + (timed[best].workspace_bytes > 0 ? kWorkspaceChargeMs : 0.0) + saved_ms;
    if (sm90_forced || best < 0 || sm90_best.second < 0.98 * lt_charged) h.sm90_variant = sm90_best.first;
  } else if (sm90_forced) {
    h.sm90_variant = sm90::default_variant(*sm90_problem, device);
  }
  if (log_choices()) {
    const std::string lt_choice =
        best < 0 ? std::string("none ran")
                 : detail::concat("candidate #", best, " of ", candidates.size(), ", ", describe(candidates[best].algo),
                                  ", workspace ", h.workspace_bytes);
    if (h.sm90_variant >= 0) {
      std::fprintf(
          stderr, "[tandem matmul] %s: %s (%s); cuBLASLt's best: %s (%s)%s\n", what.c_str(),
          sm90::variant_name(h.sm90_variant).c_str(), sm90_times.c_str(), lt_choice.c_str(), times.c_str(),
          sm90_saves ? detail::concat(", plus the pass the kernel saves: ", saved_ms * 1e3, " us").c_str() : "");
    } else {
      std::fprintf(stderr, "[tandem matmul] %s: cuBLASLt %s (%s)%s%s%s\n", what.c_str(), lt_choice.c_str(),
                   times.c_str(), sm90_wanted ? "; CUTLASS sm90: " : "", sm90_times.c_str(),
                   sm90_saves ? detail::concat("; the pass the kernel saves: ", saved_ms * 1e3, " us").c_str() : "");
    }
  }
  return h;
}

int choose_timed_candidate(const std::vector<TimedCandidate>& candidates) {
  int best = -1;
  double best_ms = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].ms < 0) continue;
    const double charged = candidates[i].ms + (candidates[i].workspace_bytes > 0 ? kWorkspaceChargeMs : 0.0);
    if (best < 0 || charged < 0.98 * best_ms) {
      best = static_cast<int>(i);
      best_ms = charged;
    }
  }
  return best;
}

cublasStatus_t run_choice(const Heuristic& h, const Launch& launch, Device device, const sm90::Problem* sm90_problem,
                          bool* ran_sm90) {
  const bool sm90_ran = h.sm90_variant >= 0 && sm90_problem != nullptr &&
                        sm90::run(*sm90_problem, h.sm90_variant, device.index, current_stream(device.index));
  if (ran_sm90) *ran_sm90 = sm90_ran;
  if (sm90_ran) return CUBLAS_STATUS_SUCCESS;
  if (!h.found) return CUBLAS_STATUS_NOT_SUPPORTED;
  return launch_with_workspace(h, launch, device);
}

cublasStatus_t launch_with_workspace(const Heuristic& h, const Launch& launch, Device device) {
  if (h.workspace_bytes == 0) return launch(h.algo, nullptr, 0);
  Tensor workspace = empty({static_cast<int64_t>(h.workspace_bytes)}, TensorOptions(DType::u8, device));  // (bytes,)
  return launch(h.algo, workspace.data_ptr(), h.workspace_bytes);
}

}  // namespace lt
}  // namespace tandem::cuda
