#pragma once
// What user code may ask of the CUDA backend, without including any CUDA header. In a build
// without CUDA these report no devices, and the memory functions raise a DeviceError.
#include <cstddef>
#include <cstdint>

namespace tandem::cuda {

bool is_built();     // this build has the CUDA backend
int device_count();  // 0 when built without CUDA or when no GPU is visible
bool is_available();  // is_built() && device_count() > 0
void synchronize(int device = 0);  // waits for all work tandem queued on the device
int64_t l2_cache_bytes(int device = 0);  // the device's L2 cache (0 without CUDA)
// Marks the span a profiler started with "profile from start off" records (ncu
// --profile-from-start off, nsys --capture-range=cudaProfilerApi); no-ops without CUDA.
void profiler_start();
void profiler_stop();

// The caching allocator's figures for one device, in bytes.
struct MemoryStats {
  size_t allocated = 0;      // held by live tensors (rounded block sizes)
  size_t reserved = 0;       // obtained from the driver: allocated + cached
  size_t peak_allocated = 0;  // highest `allocated` since the last reset
  uint64_t num_device_allocs = 0;  // cudaMalloc calls made
  uint64_t num_ooms = 0;      // requests that failed even after freeing the cache
};
MemoryStats memory_stats(int device = 0);
size_t memory_allocated(int device = 0);
size_t memory_reserved(int device = 0);
size_t max_memory_allocated(int device = 0);
void reset_peak_memory_stats(int device = 0);
// Gives every cached block that no tensor uses back to the driver.
void empty_cache(int device = 0);
// Debugging: fill every new allocation with 0xFF bytes (NaN in every float type), so a kernel
// that leaves an output element unwritten shows up as NaN.
void set_poison_allocations(bool enabled);

// Streams as opaque handles (a cudaStream_t), for code that hands them to another CUDA library
// (NCCL) without including CUDA headers.
using StreamHandle = void*;
StreamHandle current_stream_handle(int device);  // tandem's compute stream unless a StreamGuard says otherwise
// A non-blocking stream for collectives, beside the compute stream, so that they travel while it is
// busy: at the device's highest priority or at the default one, made once per device and priority
// and kept for the process.
StreamHandle collective_stream(int device, bool highest_priority);
// A second non-blocking compute stream per device (default priority, kept for the process), for
// work that runs beside the compute stream: backward's weight gradients (autograd/side_stream.h).
StreamHandle side_stream(int device);

// cudaSetDevice: `device` is the calling thread's current device from now on.
void set_device(int device);

// Makes `device` current for the scope and restores the previous device after.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// Runs kernels of this thread on `stream` (for `device`) for the scope.
class StreamGuard {
 public:
  StreamGuard(int device, StreamHandle stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  StreamHandle previous_;
};

// Names an NVTX range for the scope, so a profiler timeline reads like the code (no-op without CUDA).
class ProfilerRange {
 public:
  explicit ProfilerRange(const char* name);
  ~ProfilerRange();
  ProfilerRange(const ProfilerRange&) = delete;
  ProfilerRange& operator=(const ProfilerRange&) = delete;
};

// A CUDA event, usable without CUDA headers: marks a point in a device's current stream, to
// time device work or wait for it.
class Event {
 public:
  // timing = false: for ordering and completion only (cudaEventDisableTiming), which CUDA records
  // and waits on more cheaply; elapsed_ms() needs both events made with timing.
  explicit Event(bool timing = true);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(int device);                   // on the device's current stream
  void record_on(StreamHandle stream);       // on `stream` (of the current device)
  void wait(int device) const;               // the device's current stream waits for it (host does not block)
  void wait_on(StreamHandle stream) const;   // `stream` waits for it (host does not block)
  void synchronize() const;                  // the host waits for it
  bool query() const;                        // reached yet? A CUDA error raises a BackendError
  double elapsed_ms(const Event& end) const;  // both recorded and reached
  bool recorded() const { return recorded_; }
  void* handle() const { return handle_; }  // the cudaEvent_t

 private:
  void* handle_ = nullptr;
  bool recorded_ = false;
};

// f32 matrix products: "highest" keeps full f32; "high" lets cuBLASLt use TF32 tensor cores
// (like torch.set_float32_matmul_precision).
enum class MatmulPrecision { highest, high };
void set_matmul_precision(MatmulPrecision precision);
MatmulPrecision matmul_precision();

// Which matrix products (matmul and the linear layer's fused products) choose their cuBLASLt
// algorithm by timing: up to 8 of cuBLASLt's heuristic algorithms, run once per problem on the
// problem's own operands, each run after the L2 cache was overwritten (as the step leaves it), and
// the fastest kept instead of the heuristic's first (a later candidate only when at least 2%
// faster, so near ties keep the heuristic's order).
// - none: the heuristic's first for every product.
// - large (the default): products of at least kTunedMatmulMinFlops (2 x batch x m x n x k), which
//   run long enough (about 10 us and more on an H200) to time well. On an H200 this made every bf16
//   step measured faster (GPT-2 124M B8 T1024, B1 T1024 and T128, the MLP), where timing every
//   product too made GPT-2's small-batch steps slower than the heuristic's choices (see README.md,
//   "Timed algorithm choice").
// - all: every product, as PyTorch's TunableOp.
// Ignored in deterministic mode (the heuristic's first, so that runs give the same bits), during
// graph capture (a problem first met there keeps the first) and where the device has no room for
// the timing's buffer (twice the L2 cache, freed after: the first). The choice is timed, so two processes
// may choose differently and their results differ in the last bits; a problem already met keeps its
// choice when this changes. TANDEM_MATMUL_LOG=1 prints each timed choice on stderr.
enum class MatmulTuning { none, large, all };
constexpr double kTunedMatmulMinFlops = 8e9;
void set_matmul_tuning(MatmulTuning tuning);
MatmulTuning matmul_tuning();

// Which kernels run the bf16/f16 products of linear layers and 2-D matmuls on an sm_90 GPU (H100,
// H200), in a build with CUTLASS's headers (scripts/install-deps.sh; see cutlass_gemm_built):
// - automatic (the default): where the product's choice is timed (set_matmul_tuning), tandem's
//   CUTLASS kernels (core/cuda/gemm_sm90.h, launched with programmatic dependent launch) are timed
//   beside cuBLASLt's candidates and kept where at least 2% faster; untimed products run on
//   cuBLASLt.
// - cublaslt: cuBLASLt only.
// - cutlass: tandem's CUTLASS kernels wherever they have one for the product (the fastest variant
//   where timed), cuBLASLt elsewhere (batched products, f32, unaligned operands).
// Starts from TANDEM_GEMM=auto|cublaslt|cutlass (read on first use; otherwise automatic). A problem
// keeps the kernel chosen the first time it met the current setting.
enum class GemmKernels { automatic, cublaslt, cutlass };
void set_gemm_kernels(GemmKernels kernels);
GemmKernels gemm_kernels();
// Whether this build has tandem's CUTLASS kernels (they run only on sm_90 devices).
bool cutlass_gemm_built();

// Which kernels run bf16/f16 attention on CUDA: `automatic` takes cuDNN's fused flash attention
// where tandem was built with cuDNN's frontend and tandem's own flash kernels elsewhere; `flash`
// and `cudnn` force one (cudnn raises a DeviceError in a build without the frontend). The
// forward's log-sum-exp is the same for both, so a backward may run on the other. Starts from
// TANDEM_ATTENTION=auto|flash|cudnn (read on first use; otherwise automatic).
enum class AttentionKernels { automatic, flash, cudnn };
void set_attention_kernels(AttentionKernels kernels);
AttentionKernels attention_kernels();
// Whether this build has cuDNN's fused attention (cuDNN and its frontend headers).
bool cudnn_attention_built();

// Convolutions: time every cuDNN algorithm once per shape and keep the fastest (like
// torch.backends.cudnn.benchmark), instead of taking cuDNN's heuristic choice. Off by default.
void set_cudnn_benchmark(bool enabled);

}  // namespace tandem::cuda
