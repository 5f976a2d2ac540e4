// Fused scaled-dot-product attention through cuDNN's graph API, via NVIDIA's header-only C++
// frontend (cudnn_frontend.h): cuDNN builds a flash-attention kernel for each shape, so the
// (Tq x Tk) attention matrix never reaches memory. The forward saves one f32 log-sum-exp per
// query ("stats"), which the backward uses to recompute the probabilities tile by tile.
//
// A built graph is cached per shape, strides, dtype, mask and scale (one entry per attention
// layer shape in practice); building one takes milliseconds, running it microseconds.
//
// cuDNN's backward adds dQ across key tiles with atomics unless asked for its deterministic
// algorithm (on Hopper: a variant that keeps dP in a workspace of B x H x Tq x Tk 16-bit values);
// deterministic mode asks for it, and a cuDNN without it makes the backward raise
// NotImplementedError.
#include <cudnn_frontend.h>

#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tandem/core/cuda/cudnn_common.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/determinism.h"

namespace tandem::cuda {

namespace {

namespace fe = cudnn_frontend;

// Tensor ids inside the graphs (the variant pack maps them to device pointers).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kdO, kdQ, kdK, kdV };

fe::DataType_t fe_type(DType dtype) {
  switch (dtype) {
    case DType::f16: return fe::DataType_t::HALF;
    case DType::bf16: return fe::DataType_t::BFLOAT16;
    default: TANDEM_THROW(TypeError, "fused attention: dtype ", dtype_name(dtype), " is not supported (f16, bf16)");
  }
}

std::vector<int64_t> dims_of(const Tensor& t) { return std::vector<int64_t>(t.shape().begin(), t.shape().end()); }
std::vector<int64_t> strides_of(const Tensor& t) {
  return std::vector<int64_t>(t.strides().begin(), t.strides().end());
}

// Everything a built graph depends on.
struct GraphKey {
  int device;
  bool backward;
  DType dtype;
  bool causal;
  double scale;
  std::vector<std::vector<int64_t>> layout;  // dims and strides of every tensor, in uid order
  bool deterministic;                        // the backward's deterministic algorithm
  bool operator<(const GraphKey& o) const {
    return std::tie(device, backward, dtype, causal, scale, layout, deterministic) <
           std::tie(o.device, o.backward, o.dtype, o.causal, o.scale, o.layout, o.deterministic);
  }
};

struct BuiltGraph {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;  // bytes
};

void check_fe(fe::error_t status, const char* step, const GraphKey& key) {
  if (status.is_good()) return;
  TANDEM_THROW(BackendError, "cuDNN fused attention (", key.backward ? "backward" : "forward", ", ",
               dtype_name(key.dtype), key.causal ? ", causal" : "", "): ", step, " failed: ", status.get_message());
}

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, Uid uid, const Tensor& t) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims_of(t)).set_stride(
      strides_of(t)));
}

void mark_output(const std::shared_ptr<fe::graph::Tensor_attributes>& a, Uid uid, const Tensor& t) {
  a->set_output(true).set_uid(uid).set_dim(dims_of(t)).set_stride(strides_of(t));
}

void finish(fe::graph::Graph& g, cudnnHandle_t h, const GraphKey& key, BuiltGraph& built) {
  check_fe(g.validate(), "validate", key);
  check_fe(g.build_operation_graph(h), "build_operation_graph", key);
  check_fe(g.create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans", key);
  check_fe(g.check_support(h), "check_support", key);
  check_fe(g.build_plans(h), "build_plans", key);
  check_fe(g.get_workspace_size(built.workspace), "get_workspace_size", key);
}

std::shared_ptr<fe::graph::Graph> new_graph(DType dtype) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_type(dtype))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

BuiltGraph build_forward(cudnnHandle_t h, const GraphKey& key, const Tensor& q, const Tensor& k, const Tensor& v,
                         const Tensor& out, const Tensor& lse) {
  BuiltGraph built;
  built.graph = new_graph(key.dtype);
  fe::graph::Graph& g = *built.graph;
  auto Q = input(g, "Q", kQ, q), K = input(g, "K", kK, k), V = input(g, "V", kV, v);
  auto options = fe::graph::SDPA_attributes()
                     .set_name("attention_forward")
                     .set_generate_stats(true)
                     .set_attn_scale(static_cast<float>(key.scale))
                     .set_causal_mask(key.causal);
  auto [O, stats] = g.sdpa(Q, K, V, options);
  mark_output(O, kO, out);
  mark_output(stats, kStats, lse);
  stats->set_data_type(fe::DataType_t::FLOAT);
  finish(g, h, key, built);
  return built;
}

BuiltGraph build_backward(cudnnHandle_t h, const GraphKey& key, const Tensor& grad_out, const Tensor& q,
                          const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& grad_q,
                          const Tensor& grad_k, const Tensor& grad_v) {
  BuiltGraph built;
  built.graph = new_graph(key.dtype);
  fe::graph::Graph& g = *built.graph;
  auto Q = input(g, "Q", kQ, q), K = input(g, "K", kK, k), V = input(g, "V", kV, v);
  auto O = input(g, "O", kO, out), dO = input(g, "dO", kdO, grad_out);
  auto stats = input(g, "stats", kStats, lse);
  stats->set_data_type(fe::DataType_t::FLOAT);
  auto options = fe::graph::SDPA_backward_attributes()
                     .set_name("attention_backward")
                     .set_attn_scale(static_cast<float>(key.scale))
                     .set_causal_mask(key.causal)
                     .set_deterministic_algorithm(key.deterministic);
  auto [dQ, dK, dV] = g.sdpa_backward(Q, K, V, O, dO, stats, options);
  mark_output(dQ, kdQ, grad_q);
  mark_output(dK, kdK, grad_k);
  mark_output(dV, kdV, grad_v);
  finish(g, h, key, built);
  return built;
}

// The cached graph for `key`, built by `build` on first use.
template <typename Build>
const BuiltGraph& cached_graph(const GraphKey& key, Build build) {
  static std::mutex mutex;
  static std::map<GraphKey, BuiltGraph> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, build()).first;
  return it->second;
}

GraphKey make_key(bool backward, const Tensor& q, bool causal, double scale, const std::vector<const Tensor*>& all) {
  GraphKey key{q.device().index, backward, q.dtype(), causal, scale, {},
               backward && are_deterministic_algorithms_enabled()};
  for (const Tensor* t : all) {
    key.layout.push_back(dims_of(*t));
    key.layout.push_back(strides_of(*t));
  }
  return key;
}

void execute(const BuiltGraph& built, cudnnHandle_t h, const GraphKey& key,
             std::unordered_map<int64_t, void*>& pointers, const Tensor& like) {
  // Inside a capture, a small workspace is the graph's own, so that the 4-byte memset cuDNN issues
  // before every call moves to the graph's start (scratch_for_graph). GPT-2 124M's in bf16: 256
  // bytes forward; backward 0.4 MiB at B1 T128, 3.0 MiB at B1 T1024 (36.6 MiB more for the graph's
  // 12), 24.4 MiB at B8 T1024, which like every larger one comes from the caching allocator.
  void* scratch = built.workspace > 0 && is_capturing()
                      ? scratch_for_graph(static_cast<size_t>(built.workspace), like.device().index)
                      : nullptr;
  Tensor workspace;  // (bytes,) u8, from the caching allocator on the current stream
  if (built.workspace > 0 && scratch == nullptr) {
    workspace = empty({built.workspace}, TensorOptions(DType::u8, like.device()));
    scratch = workspace.data_ptr();
  }
  check_fe(built.graph->execute(h, pointers, scratch), "execute", key);
}

}  // namespace

bool cudnn_attention_built() { return true; }

bool fused_attention_supported(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (!is_half(q.dtype()) || k.dtype() != q.dtype() || v.dtype() != q.dtype()) return false;
  int64_t head_dim = q.shape()[3];
  // cuDNN's flash attention: head dims up to 128 (a multiple of 8); K and V share theirs here.
  // (The caller hands over layouts with the last stride 1 and 16-byte aligned rows.)
  return head_dim % 8 == 0 && head_dim <= 128 && k.shape()[3] == head_dim && v.shape()[3] == head_dim;
}

void fused_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                             bool causal, double scale) {
  int device = q.device().index;
  DeviceGuard guard(device);
  cudnnHandle_t h = cudnn::handle(device);
  GraphKey key = make_key(false, q, causal, scale, {&q, &k, &v, &out});
  const BuiltGraph& built = cached_graph(key, [&] { return build_forward(h, key, q, k, v, out, lse); });
  std::unordered_map<int64_t, void*> pointers = {
      {kQ, q.data_ptr()}, {kK, k.data_ptr()}, {kV, v.data_ptr()}, {kO, out.data_ptr()}, {kStats, lse.data_ptr()}};
  execute(built, h, key, pointers, q);
}

void fused_attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& out, const Tensor& lse, const Tensor& grad_q, const Tensor& grad_k,
                              const Tensor& grad_v, bool causal, double scale) {
  int device = q.device().index;
  DeviceGuard guard(device);
  cudnnHandle_t h = cudnn::handle(device);
  GraphKey key = make_key(true, q, causal, scale, {&q, &k, &v, &out, &grad_out, &grad_q, &grad_k, &grad_v});
  const BuiltGraph& built = cached_graph(key, [&] {
    try {
      return build_backward(h, key, grad_out, q, k, v, out, lse, grad_q, grad_k, grad_v);
    } catch (const BackendError& e) {
      if (!key.deterministic) throw;
      alert_not_deterministic(detail::concat("scaled_dot_product_attention backward (cuDNN fused, ",
                                             dtype_name(key.dtype), "; cuDNN ", cudnnGetVersion(),
                                             " built no deterministic engine: ", e.message(), ")"));
      throw;
    }
  });
  std::unordered_map<int64_t, void*> pointers = {
      {kQ, q.data_ptr()},        {kK, k.data_ptr()},          {kV, v.data_ptr()},
      {kO, out.data_ptr()},      {kStats, lse.data_ptr()},    {kdO, grad_out.data_ptr()},
      {kdQ, grad_q.data_ptr()},  {kdK, grad_k.data_ptr()},    {kdV, grad_v.data_ptr()}};
  execute(built, h, key, pointers, q);
}

}  // namespace tandem::cuda
