// 2-D convolution through cuDNN, on NCHW or channels-last (NHWC strides) tensors: forward,
// backward data and backward filter. The three tensors of a call share one layout (core/conv.cpp
// decides it), and the descriptors carry their strides.
// Every shape and direction goes through cuDNN's graph (backend) API, as PyTorch runs its
// convolutions: an operation graph, engine configs from cuDNN's heuristics, the first that
// builds and runs kept as an execution plan per shape (or, in benchmark mode, the fastest of
// them, like torch.backends.cudnn.benchmark). A shape the graph API cannot run falls back to
// cuDNN's v7 algorithm lists. (The v7 lists as the main path cost several times the host time per
// call on ResNet-18's shapes, 0.6-0.9x PyTorch's speed where the graph API matches it.)
// Workspaces come from the caching allocator. 16-bit inputs compute in f32 with tensor cores; f32
// convolutions use TF32 only under MatmulPrecision::high. Deterministic mode drops engines with
// cuDNN's non-deterministic note (and v7 algorithms not marked deterministic) and turns timing
// off, so the same shape always gets the same engine and so the same bits.
#include "tandem/core/cuda/cudnn_conv_v7.h"
#include "tandem/core/determinism.h"

namespace tandem::cuda {

namespace {
using namespace cudnn;

bool benchmark_mode = false;

// Whether choices are timed: benchmark mode, unless deterministic mode wants a fixed choice.
bool timed_choice() { return benchmark_mode && !are_deterministic_algorithms_enabled(); }

// ---------------------------------------------------------------------------------------------
// Settings from the environment (read once per process):
// TANDEM_CUDNN_BENCHMARK_LIMIT=n (benchmark mode; default 10, 0: all): time at most n plans, like
//   torch.backends.cudnn.benchmark_limit (default 10).
// TANDEM_CUDNN_LOG=1: one line on stderr for every choice (shape, direction, engine or algorithm,
//   workspace, timings), to compare with PyTorch's.
struct SelectOptions {
  int benchmark_limit = 10;
  bool log = false;
};

std::string env_value(const char* name) {
  const char* v = std::getenv(name);
  std::string s = v ? v : "";
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

const SelectOptions& select_options() {
  static const SelectOptions options = [] {
    SelectOptions o;
    const std::string limit = env_value("TANDEM_CUDNN_BENCHMARK_LIMIT");
    if (!limit.empty()) {
      char* end = nullptr;
      long n = std::strtol(limit.c_str(), &end, 10);
      TANDEM_CHECK_AS(ValueError, end != limit.c_str() && *end == '\0' && n >= 0 && n <= 100000,
                      "TANDEM_CUDNN_BENCHMARK_LIMIT=", limit, ": expected a count >= 0");
      o.benchmark_limit = static_cast<int>(n);
    }
    o.log = env_value("TANDEM_CUDNN_LOG") == "1";
    if (o.log) {
      std::fprintf(stderr, "[tandem cudnn] cuDNN %zu at run time, %d at build time\n", cudnnGetVersion(),
                   CUDNN_VERSION);
    }
    return o;
  }();
  return options;
}

std::string describe(Direction dir, const ConvTensors& t, const Conv2dParams& p) {
  return detail::concat("conv2d ", direction_name(dir), " ", dtype_name(t.x.dtype()), " x", shape_str(t.x.shape()),
                        " w", shape_str(t.w.shape()), " stride ", p.stride_h, " pad ", p.pad_h, " ",
                        memory_format_name(t.x.suggest_memory_format()),
                        timed_choice() ? " (benchmark)" : "",
                        are_deterministic_algorithms_enabled() ? " (deterministic)" : "");
}

void log_choice(const std::string& what, const std::string& how) {
  if (select_options().log) std::fprintf(stderr, "[tandem cudnn] %s: %s\n", what.c_str(), how.c_str());
}

// Device time of one run of `run`, in ms: one warm-up run, then the mean of `reps` runs between
// two events on the current stream. Used once per shape, when choosing in benchmark mode.
double time_runs(int device, const std::function<void()>& run, int reps = 3) {
  cudaStream_t stream = current_stream(device);
  run();
  cudaEvent_t start = nullptr, stop = nullptr;
  TANDEM_CUDA_CHECK(cudaEventCreate(&start));
  TANDEM_CUDA_CHECK(cudaEventCreate(&stop));
  float ms = 0;
  cudaError_t status = cudaEventRecord(start, stream);
  try {
    for (int i = 0; i < reps && status == cudaSuccess; ++i) run();
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  if (status == cudaSuccess) status = cudaEventRecord(stop, stream);
  if (status == cudaSuccess) status = cudaEventSynchronize(stop);
  if (status == cudaSuccess) status = cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  TANDEM_CUDA_CHECK(status);
  return static_cast<double>(ms) / reps;
}

// ---- the graph (backend) API ----------------------------------------------------------------

class BackendDesc {
 public:
  BackendDesc() = default;
  explicit BackendDesc(cudnnBackendDescriptorType_t type) { TANDEM_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &desc_)); }
  ~BackendDesc() {
    if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);
  }
  BackendDesc(BackendDesc&& other) noexcept : desc_(other.desc_) { other.desc_ = nullptr; }
  BackendDesc& operator=(BackendDesc&& other) noexcept {
    std::swap(desc_, other.desc_);
    return *this;
  }
  BackendDesc(const BackendDesc&) = delete;
  BackendDesc& operator=(const BackendDesc&) = delete;
  cudnnBackendDescriptor_t get() const { return desc_; }
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values) {
    TANDEM_CUDNN_CHECK(cudnnBackendSetAttribute(desc_, name, type, count, values));
  }
  void set_desc(cudnnBackendAttributeName_t name, const BackendDesc& other) {
    cudnnBackendDescriptor_t d = other.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &d);
  }
  void finalize() { TANDEM_CUDNN_CHECK(cudnnBackendFinalize(desc_)); }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
};

// Unique ids of the three tensors in the variant pack, as PyTorch names them.
constexpr int64_t kUidX = 'x', kUidY = 'y', kUidW = 'w';

// The largest power of two up to 16 that divides the address: the alignment cuDNN is promised.
int64_t alignment_of(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  int64_t alignment = 1;
  while (alignment < 16 && a % (alignment * 2) == 0) alignment *= 2;
  return alignment;
}

// The tensor's own strides go to cuDNN: NCHW, or NHWC strides for a channels-last tensor, which
// cuDNN's NHWC (tensor-core native) kernels read without a transpose.
BackendDesc tensor_desc(int64_t uid, const Tensor& t, int64_t alignment) {
  BackendDesc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const DType dtype = t.dtype();
  std::vector<int64_t> dims(t.shape().begin(), t.shape().end()), strides(t.strides().begin(), t.strides().end());
  cudnnDataType_t type = data_type(dtype);
  d.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
  d.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, static_cast<int64_t>(dims.size()), dims.data());
  d.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, static_cast<int64_t>(strides.size()), strides.data());
  d.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
  d.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
  d.finalize();
  return d;
}

// An operation graph of one convolution, with everything it refers to; execution plans made from
// it keep it alive.
struct ConvGraph {
  BackendDesc x, w, y, conv, op, graph;
};

std::shared_ptr<ConvGraph> build_conv_graph(Direction dir, cudnnHandle_t h, const ConvTensors& t,
                                            const Conv2dParams& p) {
  auto g = std::make_shared<ConvGraph>();
  const DType dtype = t.x.dtype();
  g->x = tensor_desc(kUidX, t.x, alignment_of(t.x.data_ptr()));
  g->w = tensor_desc(kUidW, t.w, alignment_of(t.w.data_ptr()));
  g->y = tensor_desc(kUidY, t.y, alignment_of(t.y.data_ptr()));

  g->conv = BackendDesc(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
  cudnnDataType_t comp = compute_type(dtype);  // f32 for f16/bf16, as PyTorch sets it
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  int64_t spatial = 2;
  int64_t dilation[2] = {p.dilation_h, p.dilation_w}, stride[2] = {p.stride_h, p.stride_w};
  int64_t padding[2] = {p.pad_h, p.pad_w};
  g->conv.set(CUDNN_ATTR_CONVOLUTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
  g->conv.set(CUDNN_ATTR_CONVOLUTION_CONV_MODE, CUDNN_TYPE_CONVOLUTION_MODE, 1, &mode);
  g->conv.set(CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS, CUDNN_TYPE_INT64, 1, &spatial);
  g->conv.set(CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_TYPE_INT64, 2, dilation);
  g->conv.set(CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES, CUDNN_TYPE_INT64, 2, stride);
  g->conv.set(CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_TYPE_INT64, 2, padding);
  g->conv.set(CUDNN_ATTR_CONVOLUTION_POST_PADDINGS, CUDNN_TYPE_INT64, 2, padding);
  g->conv.finalize();

  // Groups follow from the shapes: x has groups times the filter's input channels.
  const bool f64 = dtype == DType::f64;
  const cudnnBackendAttributeType_t scalar_type = f64 ? CUDNN_TYPE_DOUBLE : CUDNN_TYPE_FLOAT;
  const void* alpha = kScalars.one(dtype);
  const void* beta = kScalars.zero(dtype);
  // The same six attributes under each direction's names; x, w and y keep their roles (for
  // backward data, x is dx; for backward filter, w is dw).
  struct OpAttributes {
    cudnnBackendDescriptorType_t type;
    cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
  };
  static const OpAttributes kAttributes[3] = {
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA},
      {CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
       CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA},
  };
  const OpAttributes& a = kAttributes[static_cast<int>(dir)];
  g->op = BackendDesc(a.type);
  g->op.set_desc(a.x, g->x);
  g->op.set_desc(a.w, g->w);
  g->op.set_desc(a.y, g->y);
  g->op.set_desc(a.conv, g->conv);
  g->op.set(a.alpha, scalar_type, 1, alpha);
  g->op.set(a.beta, scalar_type, 1, beta);
  g->op.finalize();

  g->graph = BackendDesc(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  cudnnBackendDescriptor_t ops[1] = {g->op.get()};
  g->graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
  g->graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, ops);
  g->graph.finalize();
  return g;
}

// Engine configs for the graph in the order cuDNN ranks them; empty if the mode has none.
std::vector<BackendDesc> engine_configs(const ConvGraph& g, cudnnBackendHeurMode_t mode) {
  BackendDesc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, g.graph);
  heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (cudnnBackendFinalize(heur.get()) != CUDNN_STATUS_SUCCESS) return {};
  int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0) {
    return {};
  }
  std::vector<BackendDesc> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                               raw.data()) != CUDNN_STATUS_SUCCESS) {
    return {};
  }
  configs.resize(static_cast<size_t>(std::min(got, count)));
  return configs;
}

struct EngineInfo {
  int64_t index = -1;
  std::vector<cudnnBackendNumericalNote_t> notes;
};

EngineInfo engine_info(const BackendDesc& config) {
  EngineInfo info;
  BackendDesc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  cudnnBackendDescriptor_t e = engine.get();
  int64_t n = 0;
  if (cudnnBackendGetAttribute(config.get(), CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e) !=
      CUDNN_STATUS_SUCCESS) {
    return info;
  }
  cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &info.index);
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  if (cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &n, notes) == CUDNN_STATUS_SUCCESS) {
    info.notes.assign(notes, notes + std::min<int64_t>(n, CUDNN_NUMERICAL_NOTE_TYPE_COUNT));
  }
  return info;
}

// PyTorch's filterEngineConfigs: never down-convert inputs; f32 uses tensor cores (TF32) only
// when allowed (here: MatmulPrecision::high, as for the v7 math type).
bool engine_allowed(const EngineInfo& e, DType dtype) {
  for (cudnnBackendNumericalNote_t note : e.notes) {
    if (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return false;
    if (dtype == DType::f32 && math_type(dtype) == CUDNN_FMA_MATH && note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) return false;
    if (note == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC && are_deterministic_algorithms_enabled()) return false;
  }
  return true;
}

struct GraphPlan {
  std::shared_ptr<ConvGraph> graph;
  BackendDesc config, plan;
  int64_t workspace = 0;
  int64_t engine = -1;
  std::string source;  // "instant", "b", "a" or "fallback", and the rank there
  std::string json;    // cuDNN's description of the plan (engine and knobs)
};

std::unique_ptr<GraphPlan> build_plan(cudnnHandle_t h, const std::shared_ptr<ConvGraph>& g, BackendDesc config,
                                      const EngineInfo& info, std::string source) {
  auto gp = std::make_unique<GraphPlan>();
  gp->graph = g;
  gp->config = std::move(config);
  gp->engine = info.index;
  gp->source = std::move(source);
  gp->plan = BackendDesc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
  cudnnBackendDescriptor_t cfg = gp->config.get();
  if (cudnnBackendSetAttribute(gp->plan.get(), CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h) !=
          CUDNN_STATUS_SUCCESS ||
      cudnnBackendSetAttribute(gp->plan.get(), CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                               1, &cfg) != CUDNN_STATUS_SUCCESS ||
      cudnnBackendFinalize(gp->plan.get()) != CUDNN_STATUS_SUCCESS) {
    return nullptr;
  }
  int64_t n = 0;
  if (cudnnBackendGetAttribute(gp->plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n,
                               &gp->workspace) != CUDNN_STATUS_SUCCESS ||
      gp->workspace < 0) {
    return nullptr;
  }
  int64_t size = 0;
  if (cudnnBackendGetAttribute(gp->plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &size,
                               nullptr) == CUDNN_STATUS_SUCCESS &&
      size > 0) {
    std::vector<char> text(static_cast<size_t>(size) + 1, '\0');
    if (cudnnBackendGetAttribute(gp->plan.get(), CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, size,
                                 &size, text.data()) == CUDNN_STATUS_SUCCESS) {
      gp->json.assign(text.data());
    }
  }
  return gp;
}

void run_graph(cudnnHandle_t h, const GraphPlan& gp, const ConvTensors& t, void* workspace) {
  BackendDesc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  void* pointers[3] = {t.x.data_ptr(), t.y.data_ptr(), t.w.data_ptr()};
  int64_t uids[3] = {kUidX, kUidY, kUidW};
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 3, pointers);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 3, uids);
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  TANDEM_CUDNN_CHECK(cudnnBackendExecute(h, gp.plan.get(), pack.get()));
}

std::string graph_str(const GraphPlan& gp) {
  return detail::concat("engine ", gp.engine, " from ", gp.source, " workspace ", gp.workspace, " B",
                        gp.json.empty() ? "" : " plan ", gp.json);
}

const char* heur_mode_name(cudnnBackendHeurMode_t mode) {
  switch (mode) {
    case CUDNN_HEUR_MODE_INSTANT: return "instant";
    case CUDNN_HEUR_MODE_B: return "b";
    case CUDNN_HEUR_MODE_A: return "a";
    case CUDNN_HEUR_MODE_FALLBACK: return "fallback";
    default: return "?";
  }
}

// The graph API's choice for one shape and direction, or nullptr if no engine config builds and
// runs (the caller falls back to the v7 API).
std::unique_ptr<GraphPlan> choose_graph(Direction dir, cudnnHandle_t h, int device, const ConvTensors& t,
                                        const Conv2dParams& p, const std::string& what) {
  const SelectOptions& opt = select_options();
  std::shared_ptr<ConvGraph> g;
  try {
    g = build_conv_graph(dir, h, t, p);
  } catch (const BackendError& e) {
    log_choice(what, detail::concat("graph: operation graph not supported (", e.message(), ")"));
    return nullptr;
  }
  // Candidates in order: the heuristics' list, then the fallback list, as PyTorch's
  // get_generator_sources gives them.
  struct Candidate {
    BackendDesc config;
    EngineInfo info;
    std::string source;
  };
  std::vector<Candidate> candidates;
  int filtered = 0;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_INSTANT, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<BackendDesc> configs = engine_configs(*g, mode);
    for (size_t i = 0; i < configs.size(); ++i) {
      EngineInfo info = engine_info(configs[i]);
      if (!engine_allowed(info, t.x.dtype())) {
        ++filtered;
        continue;
      }
      candidates.push_back({std::move(configs[i]), std::move(info), detail::concat(heur_mode_name(mode), " #", i)});
    }
  }
  const bool timed = timed_choice();
  const size_t limit = !timed                       ? 1
                       : opt.benchmark_limit > 0 ? static_cast<size_t>(opt.benchmark_limit)
                                                 : candidates.size();
  std::unique_ptr<GraphPlan> best;
  double best_ms = 0;
  size_t tried = 0, built = 0;
  std::vector<std::string> seen;  // plans already timed (the fallback list repeats the heuristics' engines)
  std::string timings;
  for (Candidate& c : candidates) {
    if (built >= limit) break;
    ++tried;
    std::unique_ptr<GraphPlan> gp = build_plan(h, g, std::move(c.config), c.info, c.source);
    if (!gp) continue;
    if (!gp->json.empty()) {
      if (std::find(seen.begin(), seen.end(), gp->json) != seen.end()) continue;
      seen.push_back(gp->json);
    }
    try {
      Tensor workspace = workspace_for(static_cast<size_t>(gp->workspace), t.x);
      if (!timed) {
        run_graph(h, *gp, t, workspace.data_ptr());  // it runs: keep it, as PyTorch's try_configs does
        log_choice(what, detail::concat("graph ", graph_str(*gp), " (candidate ", tried, " of ", candidates.size(),
                                        ", ", filtered, " filtered out)"));
        return gp;
      }
      ++built;
      double ms = time_runs(device, [&] { run_graph(h, *gp, t, workspace.data_ptr()); });
      timings += detail::concat(timings.empty() ? "" : ", ", "engine ", gp->engine, ": ", ms, " ms");
      if (!best || ms < best_ms) {
        best_ms = ms;
        best = std::move(gp);
      }
    } catch (const OutOfMemoryError&) {
      continue;  // workspace too large for what is free: the next candidate
    } catch (const BackendError&) {
      continue;  // built but does not run on this device
    }
  }
  if (best) {
    log_choice(what, detail::concat("graph ", graph_str(*best), " (fastest of ", built, " timed: ", timings, ")"));
  } else {
    log_choice(what, detail::concat("graph: none of ", candidates.size(), " engine configs built and ran (", filtered,
                                    " filtered out)"));
  }
  return best;
}

// ---- one shape, three directions ------------------------------------------------------------

struct DirectionChoice {
  bool chosen = false;
  std::unique_ptr<GraphPlan> graph;  // graph API: the execution plan, when there is one
  std::unique_ptr<V7Conv> v7;        // otherwise the v7 API's algorithm
};

// What a convolution of one shape needs, chosen once per direction.
struct ConvPlan {
  DirectionChoice dir[3];
};

// Device, dtype, math type, x and w shapes, the parameters, choice modes, alignments, and the
// layout: x, w and y strides (row-major or channels-last; a plan is built for its strides).
using ConvKey = std::tuple<int, int, int, Shape, Shape, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           bool, bool, int64_t, Strides, Strides, Strides>;

void convolve(Direction dir, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  static const char* names[] = {"conv2d", "conv2d_backward_input", "conv2d_backward_weight"};
  NvtxRange range(names[static_cast<int>(dir)]);
  int device = x.device().index;
  DeviceGuard guard(device);
  cudnnHandle_t h = handle(device);
  const ConvTensors t{x, w, y};
  // The graph API is promised the pointers' alignment, so plans are per alignment too.
  int64_t alignments =
      alignment_of(x.data_ptr()) * 10000 + alignment_of(w.data_ptr()) * 100 + alignment_of(y.data_ptr());
  static std::mutex mutex;
  static std::map<ConvKey, std::unique_ptr<ConvPlan>> plans;
  ConvKey key{device, static_cast<int>(x.dtype()), static_cast<int>(math_type(x.dtype())), x.shape(), w.shape(),
              p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups, timed_choice(),
              are_deterministic_algorithms_enabled(), alignments, x.strides(), w.strides(), y.strides()};
  ConvPlan* plan = nullptr;
  DirectionChoice* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = plans[key];
    if (!slot) slot = std::make_unique<ConvPlan>();
    plan = slot.get();
    c = &plan->dir[static_cast<int>(dir)];
    if (!c->chosen) {
      const std::string what = describe(dir, t, p);
      c->graph = choose_graph(dir, h, device, t, p, what);
      if (!c->graph) {
        c->v7 = std::make_unique<V7Conv>(dir, h, t, p, timed_choice(), are_deterministic_algorithms_enabled());
        log_choice(what, "v7 (graph fallback) " + c->v7->str());
      }
      c->chosen = true;
    }
  }
  if (c->graph) {
    Tensor workspace = workspace_for(static_cast<size_t>(c->graph->workspace), x);
    run_graph(h, *c->graph, t, workspace.data_ptr());
  } else {
    c->v7->run(h, t);
  }
}
}  // namespace

void set_cudnn_benchmark(bool enabled) { benchmark_mode = enabled; }

void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& out, const Conv2dParams& p) {
  convolve(Direction::forward, x, w, out, p);
}

void conv2d_backward_input(const Tensor& grad_out, const Tensor& w, const Tensor& grad_x, const Conv2dParams& p) {
  convolve(Direction::backward_data, grad_x, w, grad_out, p);
}

void conv2d_backward_weight(const Tensor& grad_out, const Tensor& x, const Tensor& grad_w, const Conv2dParams& p) {
  convolve(Direction::backward_filter, x, grad_w, grad_out, p);
}

}  // namespace tandem::cuda
