// The CUDA backend of a build without CUDA: device management reports no devices and every
// kernel raises a DeviceError that says how to get a CUDA build.
#include <string>

#include "tandem/core/backend.h"
#include "tandem/core/cuda_graph.h"

namespace tandem::cuda {

namespace {
[[noreturn]] void no_cuda(const char* what) {
  TANDEM_THROW(DeviceError, what,
               ": tandem was built without CUDA (reconfigure with -DTANDEM_WITH_CUDA=ON on a machine with nvcc)");
}
}  // namespace

bool is_built() { return false; }
int device_count() { return 0; }
bool is_available() { return false; }
int64_t l2_cache_bytes(int) { return 0; }
void synchronize(int) { no_cuda("synchronize"); }
void profiler_start() {}
void profiler_stop() {}
StreamHandle current_stream_handle(int) { no_cuda("current_stream_handle"); }
StreamHandle collective_stream(int, bool) { no_cuda("collective_stream"); }
StreamHandle side_stream(int) { no_cuda("side_stream"); }
void set_device(int device) { no_cuda(("set_device(" + std::to_string(device) + ")").c_str()); }
DeviceGuard::DeviceGuard(int device) { no_cuda(("DeviceGuard(cuda:" + std::to_string(device) + ")").c_str()); }
DeviceGuard::~DeviceGuard() = default;
StreamGuard::StreamGuard(int, StreamHandle) : device_(0), previous_(nullptr) { no_cuda("StreamGuard"); }
StreamGuard::~StreamGuard() = default;
ProfilerRange::ProfilerRange(const char*) {}
ProfilerRange::~ProfilerRange() = default;

MemoryStats memory_stats(int) { no_cuda("memory_stats"); }
size_t memory_allocated(int) { no_cuda("memory_allocated"); }
size_t memory_reserved(int) { no_cuda("memory_reserved"); }
size_t max_memory_allocated(int) { no_cuda("max_memory_allocated"); }
void reset_peak_memory_stats(int) { no_cuda("reset_peak_memory_stats"); }
void empty_cache(int) { no_cuda("empty_cache"); }
void set_poison_allocations(bool) {}
// Nothing is ever captured without CUDA.
bool is_capturing() { return false; }
uint64_t capture_id() { return 0; }
std::vector<GraphNode> capture_dependencies(StreamHandle) { return {}; }
void join_capture(StreamHandle, const std::vector<GraphNode>&, const GraphNode*, size_t) {
  no_cuda("CUDA graph capture");
}
void check_not_capturing(const char*) {}
void keep_until_capture_ends(std::shared_ptr<void>) { no_cuda("keep_until_capture_ends"); }
void before_each_replay(std::function<void()>) { no_cuda("before_each_replay"); }
void write_on_each_replay(void*, size_t, std::function<void(void*)>) { no_cuda("write_on_each_replay"); }
void* upload_for_graph(const void*, size_t, int) { no_cuda("upload_for_graph"); }
void* scratch_for_graph(size_t, int) { no_cuda("scratch_for_graph"); }
void after_each_replay(std::function<void()>) { no_cuda("after_each_replay"); }
CapturedDraw capture_random_draw(Generator&, uint64_t, int) { no_cuda("capture_random_draw"); }
OutsideGraphPool::OutsideGraphPool(int device) : device_(device) {}
OutsideGraphPool::~OutsideGraphPool() = default;
struct Graph::State {};
Graph::Graph() : state_(std::make_unique<State>()) {}
Graph::~Graph() = default;
void Graph::capture_begin(int) { no_cuda("CUDA graph capture"); }
void Graph::capture_end() { no_cuda("CUDA graph capture"); }
void Graph::abandon_capture() noexcept {}
void Graph::replay() { no_cuda("CUDA graph replay"); }
void Graph::reset() {}
bool Graph::captured() const { return false; }
int Graph::device() const { return -1; }
int64_t Graph::num_nodes() const { return 0; }
int64_t Graph::num_edges() const { return 0; }
int64_t Graph::replays() const { return 0; }
size_t Graph::pool_bytes() const { return 0; }
void Graph::debug_dump(const std::string&) const { no_cuda("CUDA graph debug_dump"); }

Event::Event(bool /*timing*/) { no_cuda("cuda::Event"); }
Event::~Event() = default;
void Event::record(int) { no_cuda("cuda::Event"); }
void Event::record_on(StreamHandle) { no_cuda("cuda::Event"); }
void Event::wait(int) const { no_cuda("cuda::Event"); }
void Event::wait_on(StreamHandle) const { no_cuda("cuda::Event"); }
void Event::synchronize() const { no_cuda("cuda::Event"); }
bool Event::query() const { no_cuda("cuda::Event"); }
double Event::elapsed_ms(const Event&) const { no_cuda("cuda::Event"); }
void set_matmul_precision(MatmulPrecision) {}
MatmulPrecision matmul_precision() { return MatmulPrecision::highest; }
void set_matmul_tuning(MatmulTuning) {}
MatmulTuning matmul_tuning() { return MatmulTuning::large; }
void set_gemm_kernels(GemmKernels) {}
GemmKernels gemm_kernels() { return GemmKernels::automatic; }
bool cutlass_gemm_built() { return false; }
void set_cudnn_benchmark(bool) {}
void* device_allocate(size_t, int) { no_cuda("allocating cuda memory"); }
void device_free(void*, int) {}
void copy_host_to_device(void*, const void*, size_t, int) { no_cuda("copy to cuda"); }
void copy_device_to_host(void*, const void*, size_t, int) { no_cuda("copy from cuda"); }
void copy_device_to_device(void*, int, const void*, int, size_t) { no_cuda("copy between cuda devices"); }
void* pinned_allocate(size_t) { no_cuda("pinned host memory"); }
void pinned_free(void*) {}

void unary(UnaryOp op, const Tensor&, const Tensor&, double, double) { no_cuda(unary_op_name(op)); }
void unary_backward(UnaryOp op, const Tensor&, const Tensor&, const Tensor&, double, double) {
  no_cuda(unary_op_name(op));
}
void binary(BinaryOp op, const Tensor&, const Tensor&, const Tensor&) { no_cuda(binary_op_name(op)); }
void where(const Tensor&, const Tensor&, const Tensor&, const Tensor&) { no_cuda("where"); }
void copy(const Tensor&, const Tensor&) { no_cuda("copy"); }
void fill(const Tensor&, double) { no_cuda("fill"); }
void arange(const Tensor&, double, double) { no_cuda("arange"); }
void reduce(ReduceOp op, const Tensor&, const Tensor&) { no_cuda(reduce_op_name(op)); }
void content_hash(const Tensor&, const Tensor&) { no_cuda("content_hash"); }
void softmax(const Tensor&, const Tensor&, bool) { no_cuda("softmax"); }
void softmax_backward(const Tensor&, const Tensor&, const Tensor&, bool) { no_cuda("softmax_backward"); }
void cross_entropy_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, double) {
  no_cuda("cross_entropy");
}
void cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                            double) {
  no_cuda("cross_entropy_backward");
}
void cross_entropy_with_grad(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                             double) {
  no_cuda("cross_entropy_with_grad");
}
void squared_error_with_grad(const Tensor&, const Tensor&, bool, const Tensor&, const Tensor&) {
  no_cuda("mse_loss");
}
void scale_unless_one(const Tensor&, const Tensor&, const Tensor&) { no_cuda("scale_unless_one"); }
void matmul(const Tensor&, const Tensor&, const Tensor&) { no_cuda("matmul"); }
void index_select(const Tensor&, const Tensor&, const Tensor&) { no_cuda("index_select"); }
void index_add(const Tensor&, const Tensor&, const Tensor&, bool) { no_cuda("index_add"); }
void gather(const Tensor&, const Tensor&, const Tensor&) { no_cuda("gather"); }
void scatter_add(const Tensor&, const Tensor&, const Tensor&) { no_cuda("scatter_add"); }
void random(const Tensor&, RandomKind, uint64_t, uint64_t, double, double) { no_cuda("random"); }
void add_inplace(const Tensor&, const Tensor&, double) { no_cuda("add_"); }
void random_from_base(const Tensor&, RandomKind, const uint64_t*, uint64_t, double, double) {
  no_cuda("random_from_base");
}
void conv2d_forward(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) { no_cuda("conv2d"); }
void conv2d_backward_input(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) {
  no_cuda("conv2d_backward_input");
}
void conv2d_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Conv2dParams&) {
  no_cuda("conv2d_backward_weight");
}
void pool2d_forward(const Tensor&, const Tensor&, const Pool2dParams&) { no_cuda("pool2d"); }
void pool2d_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Pool2dParams&) {
  no_cuda("pool2d_backward");
}
void batch_norm_forward_training(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                 const Tensor&, bool, const Tensor&, const Tensor&, const Tensor&, double, double) {
  no_cuda("batch_norm");
}
void batch_norm_forward_inference(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                  const Tensor&, bool, const Tensor&, double) {
  no_cuda("batch_norm");
}
void batch_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("batch_norm_backward");
}
void copy_each(const std::vector<Tensor>&, const std::vector<Tensor>&) { no_cuda("copy_each"); }
void sgd_step(const UpdateTensors&, const SgdHyper&) { no_cuda("sgd_step"); }
void adamw_step(const UpdateTensors&, const AdamWHyper&) { no_cuda("adamw_step"); }
void join_master_halves(const Tensor&, const Tensor&, const Tensor&) { no_cuda("join_master_halves"); }
void split_master(const Tensor&, const Tensor&, const Tensor&) { no_cuda("split_master"); }
void non_finite_check_and_unscale_(const std::vector<Tensor>&, const Tensor&, const Tensor&) {
  no_cuda("non_finite_check_and_unscale_");
}
void update_scale_(const Tensor&, const Tensor&, const Tensor&, double, double, int64_t) { no_cuda("update_scale_"); }
void layer_norm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, double) {
  no_cuda("layer_norm_forward");
}
void layer_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("layer_norm_backward");
}
void add_layer_norm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                            const Tensor&, const Tensor&, const Tensor&, double) {
  no_cuda("add_layer_norm_forward");
}
bool linear_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, Activation,
                    const Tensor&) {
  no_cuda("linear_forward");
}
bool linear_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("linear_backward_weight");
}
bool linear_backward_input_gelu(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool*) {
  no_cuda("linear_backward_input_gelu");
}
void gelu_backward_column_sums(const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("gelu_backward_column_sums");
}
void column_sums(const Tensor&, const Tensor&) { no_cuda("column_sums"); }
void add_partial_rows(const Tensor&, const Tensor&) { no_cuda("add_partial_rows"); }
bool cudnn_attention_built() { return false; }
bool fused_attention_supported(const Tensor&, const Tensor&, const Tensor&) { return false; }
void fused_attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double) {
  no_cuda("fused_attention_forward");
}
void fused_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double) {
  no_cuda("fused_attention_backward");
}
bool flash_attention_supported(const Tensor&, const Tensor&, const Tensor&) { return false; }
void flash_attention_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double) {
  no_cuda("flash_attention_forward");
}
void flash_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double) {
  no_cuda("flash_attention_backward");
}
void flash_attention_half_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool,
                                  double) {
  no_cuda("flash_attention_half_forward");
}
void flash_attention_half_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                   const Tensor&, const Tensor&, const Tensor&, const Tensor&, bool, double) {
  no_cuda("flash_attention_half_backward");
}

}  // namespace tandem::cuda
