// 2-D convolution through cuDNN, on NCHW tensors: forward, backward data and backward filter.
// By default every shape and direction goes through cuDNN's graph (backend) API, as PyTorch
// runs its convolutions: an operation graph, engine configs from cuDNN's heuristics, the first
// that builds and runs kept as an execution plan per shape (or, in benchmark mode, the fastest
// of them, like torch.backends.cudnn.benchmark). TANDEM_CUDNN_ALGO_SELECT (see "How convolution
// algorithms are chosen" below) switches to the v7-style algorithm lists for comparison; on the
// ResNet-18 shapes in bf16 they cost several times more host time per call, which showed as
// 0.6-0.9x PyTorch's speed where the graph API matches it. Workspaces come from the caching
// allocator. 16-bit inputs compute in f32 with tensor cores; f32 convolutions use TF32 only under
// MatmulPrecision::high.
#include "tandem/core/cuda/cudnn_common.h"

namespace tandem::cuda {

namespace {
using namespace cudnn;

bool benchmark_mode = false;

// The three convolution directions differ only in which cuDNN functions they call.
enum class Direction { forward, backward_data, backward_filter };
const char* direction_name(Direction dir) {
  static const char* names[] = {"fwd", "bwd_data", "bwd_filter"};
  return names[static_cast<int>(dir)];
}

// ---------------------------------------------------------------------------------------------
// How convolution algorithms are chosen, from the environment (read once per process):
//
// TANDEM_CUDNN_ALGO_SELECT
//   legacy            cuDNN's v7 heuristics (cudnnGet*Algorithm_v7), or cudnnFind* in benchmark
//                     mode; the first successful result, run with the descriptor's own math type
//                     (tensor ops for f16/bf16).
//   v7                the same lists used as PyTorch's Conv_v7.cpp uses them: each result runs with
//                     the math type cuDNN returned for it (its Note [behavior of cudnnFind and
//                     cudnnGet]: running a result's algorithm with another math type can give a
//                     slower kernel), and a result whose workspace cannot be allocated gives way to
//                     the next.
//   graph (default)   cuDNN's graph (backend) API, as PyTorch's Conv_v8.cpp runs every bf16
//                     convolution: an operation graph per shape and direction, engine configs from
//                     heuristics (mode INSTANT) followed by the FALLBACK list, minus configs that
//                     down-convert inputs (and, for f32 without TF32, tensor-core ones); the first
//                     that builds and runs is kept as an execution plan. In benchmark mode the
//                     configs are timed in that order and the fastest kept (PyTorch's
//                     cudnn.benchmark; see TANDEM_CUDNN_BENCHMARK_LIMIT). Any shape
//                     the graph API cannot run falls back to "v7".
// TANDEM_CUDNN_TIME_TOPK=k (v7, graph; default 0): outside benchmark mode, time the first k
//   candidates once per shape on the real tensors and keep the fastest instead of the first.
// TANDEM_CUDNN_BENCHMARK_LIMIT=n (graph, benchmark mode; default 10, 0: all): time at most n
//   plans, like torch.backends.cudnn.benchmark_limit (default 10).
// TANDEM_CUDNN_HEUR_MODE=instant|b|a (graph; default instant, PyTorch's default; PyTorch switches
//   to b with TORCH_CUDNN_USE_HEURISTIC_MODE_B=1).
// TANDEM_CUDNN_LOG=1: one line on stderr for every choice (shape, direction, algorithm or engine,
//   workspace, timings), to compare with PyTorch's.
enum class AlgoSelect { legacy, v7, graph };

struct SelectOptions {
  AlgoSelect select = AlgoSelect::graph;
  int time_topk = 0;
  int benchmark_limit = 10;
  cudnnBackendHeurMode_t heur_mode = CUDNN_HEUR_MODE_INSTANT;
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
    const std::string select = env_value("TANDEM_CUDNN_ALGO_SELECT");
    if (select.empty() || select == "graph") o.select = AlgoSelect::graph;
    else if (select == "legacy") o.select = AlgoSelect::legacy;
    else if (select == "v7") o.select = AlgoSelect::v7;
    else TANDEM_THROW(ValueError, "TANDEM_CUDNN_ALGO_SELECT=", select, ": expected legacy, v7 or graph");
    const std::string topk = env_value("TANDEM_CUDNN_TIME_TOPK");
    if (!topk.empty()) {
      char* end = nullptr;
      long k = std::strtol(topk.c_str(), &end, 10);
      TANDEM_CHECK_AS(ValueError, end != topk.c_str() && *end == '\0' && k >= 0 && k <= 1000,
                      "TANDEM_CUDNN_TIME_TOPK=", topk, ": expected a count >= 0");
      o.time_topk = static_cast<int>(k);
    }
    const std::string limit = env_value("TANDEM_CUDNN_BENCHMARK_LIMIT");
    if (!limit.empty()) {
      char* end = nullptr;
      long n = std::strtol(limit.c_str(), &end, 10);
      TANDEM_CHECK_AS(ValueError, end != limit.c_str() && *end == '\0' && n >= 0 && n <= 100000,
                      "TANDEM_CUDNN_BENCHMARK_LIMIT=", limit, ": expected a count >= 0");
      o.benchmark_limit = static_cast<int>(n);
    }
    const std::string mode = env_value("TANDEM_CUDNN_HEUR_MODE");
    if (mode.empty() || mode == "instant") o.heur_mode = CUDNN_HEUR_MODE_INSTANT;
    else if (mode == "b") o.heur_mode = CUDNN_HEUR_MODE_B;
    else if (mode == "a") o.heur_mode = CUDNN_HEUR_MODE_A;
    else TANDEM_THROW(ValueError, "TANDEM_CUDNN_HEUR_MODE=", mode, ": expected instant, b or a");
    o.log = env_value("TANDEM_CUDNN_LOG") == "1";
    if (o.log) {
      std::fprintf(stderr, "[tandem cudnn] cuDNN %zu at run time, %d at build time\n", cudnnGetVersion(),
                   CUDNN_VERSION);
    }
    return o;
  }();
  return options;
}

const char* select_name(AlgoSelect s) {
  switch (s) {
    case AlgoSelect::legacy: return "legacy";
    case AlgoSelect::v7: return "v7";
    case AlgoSelect::graph: return "graph";
  }
  return "?";
}

// The tensors of one call: x input (N, C, H, W), w filter, y output (N, K, P, Q); which of them
// is written depends on the direction.
struct ConvTensors {
  const Tensor& x;
  const Tensor& w;
  const Tensor& y;
};

std::string describe(Direction dir, const ConvTensors& t, const Conv2dParams& p) {
  return detail::concat("conv2d ", direction_name(dir), " ", dtype_name(t.x.dtype()), " x", shape_str(t.x.shape()),
                        " w", shape_str(t.w.shape()), " stride ", p.stride_h, " pad ", p.pad_h,
                        benchmark_mode ? " (benchmark)" : "");
}

void log_choice(const std::string& what, const std::string& how) {
  const SelectOptions& opt = select_options();
  if (opt.log) {
    std::fprintf(stderr, "[tandem cudnn select=%s topk=%d] %s: %s\n", select_name(opt.select), opt.time_topk,
                 what.c_str(), how.c_str());
  }
}

// Device time of one run of `run`, in ms: one warm-up run, then the mean of `reps` runs between
// two events on the current stream. Used once per shape, when choosing.
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

// ---- the legacy (v7-style) API --------------------------------------------------------------

// One of cuDNN's algorithm results.
struct LegacyAlgo {
  int algo = -1;
  size_t workspace = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

template <typename Perf>
std::vector<LegacyAlgo> successful(const Perf* results, int count, const char* what) {
  std::vector<LegacyAlgo> out;
  for (int i = 0; i < count; ++i) {
    if (results[i].status == CUDNN_STATUS_SUCCESS) {
      out.push_back({static_cast<int>(results[i].algo), results[i].memory, results[i].mathType});
    }
  }
  if (out.empty()) TANDEM_THROW(BackendError, "cuDNN has no usable algorithm for ", what);
  return out;
}

// Descriptors of one shape, shared by the three directions.
struct ShapeDescs {
  std::unique_ptr<TensorDesc> x, y;
  std::unique_ptr<FilterDesc> w;
};

// cuDNN's results in its order (heuristics: expected speed; benchmark mode: measured time),
// successful ones only.
std::vector<LegacyAlgo> legacy_candidates(Direction dir, cudnnHandle_t h, const ShapeDescs& d, const ConvDesc& cd) {
  constexpr int kMax = 16;
  int count = 0;
  switch (dir) {
    case Direction::forward: {
      cudnnConvolutionFwdAlgoPerf_t r[kMax];
      if (benchmark_mode) TANDEM_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithm(h, d.x->get(), d.w->get(), cd.get(), d.y->get(), kMax, &count, r));
      else TANDEM_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x->get(), d.w->get(), cd.get(), d.y->get(), kMax, &count, r));
      return successful(r, count, "conv2d forward");
    }
    case Direction::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t r[kMax];
      if (benchmark_mode) TANDEM_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithm(h, d.w->get(), d.y->get(), cd.get(), d.x->get(), kMax, &count, r));
      else TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w->get(), d.y->get(), cd.get(), d.x->get(), kMax, &count, r));
      return successful(r, count, "conv2d backward data");
    }
    case Direction::backward_filter: {
      cudnnConvolutionBwdFilterAlgoPerf_t r[kMax];
      if (benchmark_mode) TANDEM_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithm(h, d.x->get(), d.y->get(), cd.get(), d.w->get(), kMax, &count, r));
      else TANDEM_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x->get(), d.y->get(), cd.get(), d.w->get(), kMax, &count, r));
      return successful(r, count, "conv2d backward filter");
    }
  }
  return {};
}

void run_legacy(Direction dir, cudnnHandle_t h, const ShapeDescs& d, const ConvDesc& cd, const LegacyAlgo& a,
                const ConvTensors& t, void* workspace) {
  const void* one = kScalars.one(t.x.dtype());
  const void* zero = kScalars.zero(t.x.dtype());
  switch (dir) {
    case Direction::forward:
      TANDEM_CUDNN_CHECK(cudnnConvolutionForward(h, one, d.x->get(), t.x.data_ptr(), d.w->get(), t.w.data_ptr(),
                                                 cd.get(), static_cast<cudnnConvolutionFwdAlgo_t>(a.algo), workspace,
                                                 a.workspace, zero, d.y->get(), t.y.data_ptr()));
      break;
    case Direction::backward_data:
      TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardData(h, one, d.w->get(), t.w.data_ptr(), d.y->get(), t.y.data_ptr(),
                                                      cd.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo),
                                                      workspace, a.workspace, zero, d.x->get(), t.x.data_ptr()));
      break;
    case Direction::backward_filter:
      TANDEM_CUDNN_CHECK(cudnnConvolutionBackwardFilter(h, one, d.x->get(), t.x.data_ptr(), d.y->get(), t.y.data_ptr(),
                                                        cd.get(), static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo),
                                                        workspace, a.workspace, zero, d.w->get(), t.w.data_ptr()));
      break;
  }
}

Tensor workspace_for(size_t bytes, const Tensor& like) {
  return empty({static_cast<int64_t>(bytes)}, TensorOptions(DType::u8, like.device()));
}

std::string legacy_str(const LegacyAlgo& a) {
  return detail::concat("algo ", a.algo, " math ", static_cast<int>(a.math), " workspace ", a.workspace, " B");
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

BackendDesc tensor_desc(int64_t uid, DType dtype, const Shape& shape, int64_t alignment) {
  BackendDesc d(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  std::vector<int64_t> dims(shape.begin(), shape.end()), strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];  // NCHW, contiguous
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
  g->x = tensor_desc(kUidX, dtype, t.x.shape(), alignment_of(t.x.data_ptr()));
  g->w = tensor_desc(kUidW, dtype, t.w.shape(), alignment_of(t.w.data_ptr()));
  g->y = tensor_desc(kUidY, dtype, t.y.shape(), alignment_of(t.y.data_ptr()));

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
// when allowed (here: MatmulPrecision::high, as for the legacy math type).
bool engine_allowed(const EngineInfo& e, DType dtype) {
  for (cudnnBackendNumericalNote_t note : e.notes) {
    if (note == CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) return false;
    if (dtype == DType::f32 && math_type(dtype) == CUDNN_FMA_MATH && note == CUDNN_NUMERICAL_NOTE_TENSOR_CORE) return false;
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
// runs (the caller falls back to the legacy API).
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
  for (cudnnBackendHeurMode_t mode : {opt.heur_mode, CUDNN_HEUR_MODE_FALLBACK}) {
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
  const bool timed = benchmark_mode || opt.time_topk > 0;
  const size_t limit = !benchmark_mode              ? static_cast<size_t>(std::max(opt.time_topk, 1))
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
  std::unique_ptr<ConvDesc> conv;  // legacy API: descriptor with the chosen math type
  LegacyAlgo algo;
  std::unique_ptr<GraphPlan> graph;  // graph API: the execution plan, when there is one
};

// Everything a convolution of one shape needs, made once: descriptors and, per direction, the
// chosen algorithm (and its math type and workspace size) or execution plan.
struct ConvPlan {
  ShapeDescs descs;
  DirectionChoice dir[3];
};

using ConvKey = std::tuple<int, int, int, Shape, Shape, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           bool, int64_t>;

void choose_legacy(Direction dir, cudnnHandle_t h, int device, const ConvPlan& plan, DirectionChoice& c,
                   const ConvTensors& t, const Conv2dParams& p, const std::string& what, bool after_graph) {
  const SelectOptions& opt = select_options();
  const DType dtype = t.x.dtype();
  c.conv = std::make_unique<ConvDesc>(p, dtype, math_type(dtype));
  std::vector<LegacyAlgo> candidates = legacy_candidates(dir, h, plan.descs, *c.conv);
  if (opt.select == AlgoSelect::legacy && !after_graph) {
    // tandem's original rule: the first successful result, with the descriptor's math type.
    c.algo = candidates.front();
    c.algo.math = math_type(dtype);
    log_choice(what, detail::concat("legacy ", legacy_str(c.algo), " (cuDNN's result 1 of ", candidates.size(),
                                    ", its math type ", static_cast<int>(candidates.front().math), ")"));
    return;
  }
  // PyTorch's v7 rule: each result with its own math type; one whose workspace cannot be had
  // gives way to the next. With TANDEM_CUDNN_TIME_TOPK, the first k are timed.
  const bool timed = !benchmark_mode && opt.time_topk > 0;
  const size_t limit = timed ? static_cast<size_t>(opt.time_topk) : candidates.size();
  bool found = false;
  double best_ms = 0;
  std::string timings;
  for (size_t i = 0; i < candidates.size() && i < limit; ++i) {
    const LegacyAlgo& a = candidates[i];
    try {
      Tensor workspace = workspace_for(a.workspace, t.x);
      c.conv->set_math(a.math);
      if (!timed) {
        c.algo = a;
        found = true;
        break;
      }
      double ms = time_runs(device, [&] { run_legacy(dir, h, plan.descs, *c.conv, a, t, workspace.data_ptr()); });
      timings += detail::concat(timings.empty() ? "" : ", ", "algo ", a.algo, "/math ", static_cast<int>(a.math), ": ",
                                ms, " ms");
      if (!found || ms < best_ms) {
        best_ms = ms;
        c.algo = a;
        found = true;
      }
    } catch (const OutOfMemoryError&) {
      continue;
    } catch (const BackendError&) {
      if (!timed) throw;
      continue;
    }
  }
  if (!found) TANDEM_THROW(BackendError, "cuDNN: no algorithm for ", what, " could get its workspace or run");
  c.conv->set_math(c.algo.math);
  log_choice(what, detail::concat(after_graph ? "v7 (graph fallback) " : "v7 ", legacy_str(c.algo),
                                  timed ? detail::concat(" (fastest of: ", timings, ")")
                                        : detail::concat(" (of ", candidates.size(), " results)")));
}

void convolve(Direction dir, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  static const char* names[] = {"conv2d", "conv2d_backward_input", "conv2d_backward_weight"};
  NvtxRange range(names[static_cast<int>(dir)]);
  int device = x.device().index;
  DeviceGuard guard(device);
  cudnnHandle_t h = handle(device);
  const SelectOptions& opt = select_options();
  const ConvTensors t{x, w, y};
  // The graph API is promised the pointers' alignment, so plans are per alignment too.
  int64_t alignments = opt.select == AlgoSelect::graph
                           ? alignment_of(x.data_ptr()) * 10000 + alignment_of(w.data_ptr()) * 100 + alignment_of(y.data_ptr())
                           : 0;
  static std::mutex mutex;
  static std::map<ConvKey, std::unique_ptr<ConvPlan>> plans;
  ConvKey key{device, static_cast<int>(x.dtype()), static_cast<int>(math_type(x.dtype())), x.shape(), w.shape(),
              p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups, benchmark_mode, alignments};
  ConvPlan* plan = nullptr;
  DirectionChoice* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto& slot = plans[key];
    if (!slot) {
      slot = std::make_unique<ConvPlan>();
      slot->descs.x = std::make_unique<TensorDesc>(x);
      slot->descs.y = std::make_unique<TensorDesc>(y);
      slot->descs.w = std::make_unique<FilterDesc>(w);
    }
    plan = slot.get();
    c = &plan->dir[static_cast<int>(dir)];
    if (!c->chosen) {
      const std::string what = describe(dir, t, p);
      if (opt.select == AlgoSelect::graph) c->graph = choose_graph(dir, h, device, t, p, what);
      if (!c->graph) choose_legacy(dir, h, device, *plan, *c, t, p, what, opt.select == AlgoSelect::graph);
      c->chosen = true;
    }
  }
  if (c->graph) {
    Tensor workspace = workspace_for(static_cast<size_t>(c->graph->workspace), x);
    run_graph(h, *c->graph, t, workspace.data_ptr());
  } else {
    Tensor workspace = workspace_for(c->algo.workspace, x);
    run_legacy(dir, h, plan->descs, *c->conv, c->algo, t, workspace.data_ptr());
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
