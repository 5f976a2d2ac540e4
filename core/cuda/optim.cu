// CUDA optimizer updates: SGD and AdamW as fused multi-tensor kernels, and GradScaler's check
// and scale update. One launch updates every tensor of a list that keeps its weights alike (see
// Weights below; a list of mixed kinds takes one launch per kind; the device-neutral layer hands
// over one dtype on one device at a time):
//
// - Each tensor is cut into chunks of kChunk elements, a block each. The host writes two tables
//   into one buffer: a TensorSlot per tensor (its parameter, gradient, state, master-weight and
//   step-count pointers, its size, whether it can take vector loads) and where each tensor's
//   chunks start among all the chunks (a prefix sum), from which block b finds its tensor by a
//   binary search.
// - Lists of up to kInlineTensors tensors pass the tables inline, in the kernel's parameters: with
//   nothing to upload, the kernel launches as a dependent launch right behind the one before it.
//   Longer lists have the buffer go to the device in one upload, into a block of tandem's caching
//   allocator on the stream the kernel runs on, so the block is only reused after the kernel
//   (stream order), and the number of tensors is not limited by the size of kernel parameters. It
//   grows with the number of tensors, not of chunks. Inside a graph capture the tables are the
//   same at every replay: they are uploaded once, into memory the graph holds (upload_for_graph),
//   and no replay copies them.
// - Block b updates its chunk in a loop over its elements: 16-byte loads of the f32 / f64 state
//   (4 / 2 elements, with the matching 8- or 16-byte loads of 16-bit parameters and gradients)
//   when every pointer of the tensor is aligned for them, one element at a time otherwise (views
//   at odd offsets) and for the tail of a tensor.
// - Chunks are small (one pass of a block's threads in f32) and blocks start in order, so the
//   blocks at work at any time cover neighbouring memory: on one H200 an AdamW update of 58.7M
//   parameters moved its 28 bytes per parameter at 3.98 TB/s in chunks of 2048, against 3.71 in
//   chunks of 65536 (a standalone test of this kernel's shape). Chunks of 1024 were faster in such a
//   test (4.10 TB/s) but slower in the training steps (the MLP's update in its step moves 4.12
//   TB/s in chunks of 2048), and so was thread 0 making the tensor's rule after the block's first
//   loads rather than before: see docs/measurement-log.md, 2026-11-29.
// - With GradScaler, every block first reads the found-inf flag and returns when it is set, so a
//   skipped step is decided on the device; gradients are multiplied by 1 / scale as they are read.
//   AdamW's step counts live on the device too: each block derives the bias corrections from its
//   tensor's count, and a second small launch increments the counts unless the step was skipped.
//
// The arithmetic is the CPU backend's (core/cpu/optim.cpp): in f32 for f32, f16 and bf16
// parameters, in f64 for f64 ones, with the state in that type and one rounding of the new
// parameter to its dtype. Every product, sum and quotient is rounded on its own, in the CPU's
// order (the rn helpers below), so that the compiler fuses none into an FMA: left to itself it
// fused differently in the copies of the loop it made for each kind of master, and those gave
// masters 1 ulp apart. A master weight, when given, is read instead of the parameter and
// written back beside it; a compact one (a bf16 parameter's low halves, core/master_halves.h) is
// joined with the parameter into the f32 master and split into both again. The tensors of a list
// are launched by kind (no master, f32 master, compact master), one kernel each.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "tandem/core/backend.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/cuda/dependent_launch.cuh"
#include "tandem/core/cuda/loops.cuh"
#include "tandem/core/master_halves.h"

namespace tandem::cuda {

namespace {
constexpr int kOptimThreads = 256;
constexpr int kInFlight = 2;  // vectors per stream each thread loads before computing (see below)
// Pointer roles of a TensorSlot.
constexpr int kParam = 0, kGrad = 1, kState0 = 2, kMaster = 4, kStep = 5, kMaxRoles = 6;
constexpr int64_t kChunk = kOptimThreads * kInFlight * 4;  // elements per block: one pass in f32

struct TensorSlot {
  // parameter (n,), gradient (n,), two state tensors (n,), master weight (n,), step count ();
  // null where unused
  void* ptr[kMaxRoles];
  int64_t numel;
  int32_t vectorised;  // every pointer is aligned for Packed loads
};
static_assert(sizeof(TensorSlot) % 16 == 0, "the chunk starts after the tensor table stay aligned");

// The tables as a kernel reads them, uploaded to device memory (TablesInMemory) or inline in its
// parameters (TablesInline); the kernels take either, as a __grid_constant__ parameter, which they
// index in place (a computed index into a parameter would otherwise copy it to local memory).
struct TablesInMemory {
  const TensorSlot* tensors;    // (num_tensors,)
  const int64_t* chunk_starts;  // (num_tensors,)
  __device__ const TensorSlot* slots() const { return tensors; }
  __device__ const int64_t* starts() const { return chunk_starts; }
};

// The most tensors whose tables go inline: 32 x 72 bytes, within the 4 KiB that kernel parameters
// may take on every architecture. The MLP's update (10 tensors) takes them inline. In its eager step
// on an H200 (2026-11-29) the upload of its 720 bytes of tables had stood between the update and
// the kernel before it with about 3 us of idle GPU; inline, the step took 0.958-0.963 ms against
// 0.965-0.967 (three runs each, alternated).
constexpr int kInlineTensors = 32;
struct TablesInline {
  TensorSlot tensors[kInlineTensors];    // the first num_tensors used
  int64_t chunk_starts[kInlineTensors];  // the first num_tensors used
  __device__ const TensorSlot* slots() const { return tensors; }
  __device__ const int64_t* starts() const { return chunk_starts; }
};
static_assert(sizeof(TablesInline) == kInlineTensors * (sizeof(TensorSlot) + sizeof(int64_t)) &&
                  sizeof(TablesInline) <= 3072,
              "the inline tables leave room for the other parameters in 4 KiB");

// Where block `chunk`'s elements are: tensor `tensor`, elements [begin, begin + n) of it.
struct ChunkPlace {
  int64_t tensor, begin, n;
};

// chunk_starts[t] is the index of tensor t's first chunk: ascending from 0, each tensor's chunks
// running up to the next one's first (none for an empty tensor). Block `chunk` belongs to the
// last tensor whose first chunk is at or before it.
__device__ ChunkPlace place_of_chunk(const TensorSlot* tensors, const int64_t* chunk_starts, int64_t num_tensors,
                                     int64_t chunk) {
  int64_t lo = 0, hi = num_tensors - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (chunk_starts[mid] <= chunk) lo = mid;
    else hi = mid - 1;
  }
  const int64_t begin = (chunk - chunk_starts[lo]) * kChunk;
  const int64_t numel = tensors[lo].numel;
  return {lo, begin, numel - begin < kChunk ? numel - begin : kChunk};
}

// Arithmetic rounded after each operation, never contracted into FMAs (see the top of the file).
namespace rn {
__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt(double a) { return __dsqrt_rn(a); }
}  // namespace rn

// Scaling of one update (GradScaler), read by every block: null pointers when unused.
struct ScalingArgs {
  const float* found_inf;  // () the step is skipped when *found_inf != 0
  const float* inv_scale;  // () gradients are multiplied by it
};

// Compact master weights (core/master_halves.h): only a bf16 parameter can hold a master's high
// halves. The two helpers compile for every T and are reached for bf16 alone.
template <typename T>
constexpr bool kCanHoldHalves = std::is_same_v<T, __nv_bfloat16>;

// The f32 master of a bf16 parameter element and its low half.
template <typename T>
__device__ __forceinline__ acc_t<T> joined_master(T high, uint16_t low) {
  if constexpr (kCanHoldHalves<T>) {
    return __uint_as_float(master_halves::join(__bfloat16_as_ushort(high), low));
  } else {
    return to_acc(high);
  }
}

// Where a tensor keeps the weights its update reads and writes. Each kind has a kernel of its own,
// whose loop carries no code for the others: with one loop for all three, deciding per tensor at
// run time, the MLP's compact-master update took 442 us in a replayed step on an H200, and 403 us
// with its own kernel (f32 masters 406 and 400).
enum class Weights {
  parameter,   // the parameter itself
  f32_master,  // an f32 (f64 for f64) master weight beside the parameter
  low_halves,  // a bf16 parameter's compact master: its low halves beside it
};
constexpr int kWeightKinds = 3;

// Splits an f32 master into the bf16 parameter element and its low half.
template <typename T>
__device__ __forceinline__ void split_master_into(acc_t<T> master, T& high, uint16_t& low) {
  if constexpr (kCanHoldHalves<T>) {
    const uint32_t bits = __float_as_uint(master);
    high = __ushort_as_bfloat16(master_halves::high(bits));
    low = master_halves::low(bits);
  } else {
    high = cast_to<T>(master);
  }
}

// Updates one chunk per block. Op holds the hyper-parameters and the per-element rule
// op(p, g, state) on the compute type, with Op::kStates state tensors (read when
// op.loads_state()); op.for_tensor(step_count) gives the rule for one tensor.
template <typename T, typename Op, Weights kWeights, typename Tables>
__global__ void __launch_bounds__(kOptimThreads)
    multi_tensor_update(const __grid_constant__ Tables tables, int64_t num_tensors, Op base_op, ScalingArgs scaling) {
  dependent_kernel_begin();
  const TensorSlot* tensors = tables.slots();
  using C = acc_t<T>;
  constexpr int K = Op::kStates;
  constexpr int KS = K > 0 ? K : 1;
  constexpr int V = 16 / sizeof(C);
  if (scaling.found_inf != nullptr && *scaling.found_inf != 0.0f) return;
  const C unscale = scaling.inv_scale != nullptr ? static_cast<C>(*scaling.inv_scale) : C(1);
  const ChunkPlace place = place_of_chunk(tensors, tables.starts(), num_tensors, blockIdx.x);
  const TensorSlot& slot = tensors[place.tensor];
  // The tensor's rule (AdamW's bias corrections take two f64 powers): once per block.
  __shared__ alignas(Op) unsigned char op_bytes[sizeof(Op)];
  Op& op = *reinterpret_cast<Op*>(op_bytes);
  if (threadIdx.x == 0) op = base_op.for_tensor(static_cast<const float*>(slot.ptr[kStep]));
  __syncthreads();
  const int64_t begin = place.begin, n = place.n;
  T* p = static_cast<T*>(slot.ptr[kParam]) + begin;              // (n,)
  const T* g = static_cast<const T*>(slot.ptr[kGrad]) + begin;   // (n,)
  // The master: f32 (n,), or for a bf16 parameter its low halves (n,) beside the parameter's high
  // halves (core/master_halves.h); the compiler keeps the halves' code for bf16 alone.
  constexpr bool halves = kCanHoldHalves<T> && kWeights == Weights::low_halves;
  C* master = kWeights == Weights::f32_master ? static_cast<C*>(slot.ptr[kMaster]) + begin : nullptr;
  uint16_t* low = halves ? static_cast<uint16_t*>(slot.ptr[kMaster]) + begin : nullptr;  // (n,)
  C* s[KS];                                                      // K x (n,)
#pragma unroll
  for (int k = 0; k < K; ++k) s[k] = static_cast<C*>(slot.ptr[kState0 + k]) + begin;
  const bool load_state = op.loads_state();

  int64_t done = 0;
  if (slot.vectorised) {
    // Each thread loads kInFlight vectors of every stream before it computes and stores any: the
    // update moves ~28 bytes per element and nothing else, so its speed is the bytes in flight.
    const int64_t n_vec = n / V;
    const int64_t stride = static_cast<int64_t>(blockDim.x);
    for (int64_t first = threadIdx.x; first < n_vec; first += kInFlight * stride) {
      Packed<T, V> vg[kInFlight];
      Packed<C, V> vm[kInFlight];  // the working weights: the master's, or the parameter's in C
      Packed<C, V> vs[kInFlight][KS] = {};
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t i = first + u * stride;
        if (i >= n_vec) break;
        vg[u] = reinterpret_cast<const Packed<T, V>*>(g)[i];
        if (master != nullptr) {
          vm[u] = reinterpret_cast<const Packed<C, V>*>(master)[i];
        } else {
          const Packed<T, V> vp = reinterpret_cast<const Packed<T, V>*>(p)[i];
          if (halves) {
            const Packed<uint16_t, V> vl = reinterpret_cast<const Packed<uint16_t, V>*>(low)[i];
#pragma unroll
            for (int j = 0; j < V; ++j) vm[u].v[j] = joined_master(vp.v[j], vl.v[j]);
          } else {
#pragma unroll
            for (int j = 0; j < V; ++j) vm[u].v[j] = to_acc(vp.v[j]);
          }
        }
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (load_state) vs[u][k] = reinterpret_cast<const Packed<C, V>*>(s[k])[i];
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        const int64_t i = first + u * stride;
        if (i >= n_vec) break;
        Packed<T, V> vp;
        Packed<uint16_t, V> vl;
#pragma unroll
        for (int j = 0; j < V; ++j) {
          C st[KS];
#pragma unroll
          for (int k = 0; k < K; ++k) st[k] = vs[u][k].v[j];
          op(vm[u].v[j], rn::mul(to_acc(vg[u].v[j]), unscale), st);
          if (halves) split_master_into(vm[u].v[j], vp.v[j], vl.v[j]);
          else vp.v[j] = cast_to<T>(vm[u].v[j]);
#pragma unroll
          for (int k = 0; k < K; ++k) vs[u][k].v[j] = st[k];
        }
        reinterpret_cast<Packed<T, V>*>(p)[i] = vp;
        if (master != nullptr) reinterpret_cast<Packed<C, V>*>(master)[i] = vm[u];
        if (halves) reinterpret_cast<Packed<uint16_t, V>*>(low)[i] = vl;
#pragma unroll
        for (int k = 0; k < K; ++k) reinterpret_cast<Packed<C, V>*>(s[k])[i] = vs[u][k];
      }
    }
    done = n_vec * V;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    C pi = master != nullptr ? master[i] : halves ? joined_master(p[i], low[i]) : to_acc(p[i]);
    C st[KS] = {};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (load_state) st[k] = s[k][i];
    }
    op(pi, rn::mul(to_acc(g[i]), unscale), st);
    if (halves) split_master_into(pi, p[i], low[i]);
    else p[i] = cast_to<T>(pi);
    if (master != nullptr) master[i] = pi;
#pragma unroll
    for (int k = 0; k < K; ++k) s[k][i] = st[k];
  }
}

// After an update: every tensor's step count + 1, unless the step was skipped.
template <typename Tables>
__global__ void increment_step_counts(const __grid_constant__ Tables tables, int64_t num_tensors,
                                      const float* found_inf) {
  dependent_kernel_begin();
  if (found_inf != nullptr && *found_inf != 0.0f) return;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t < num_tensors) *static_cast<float*>(tables.slots()[t].ptr[kStep]) += 1.0f;
}

// Sets *found_inf to 1 when an element of a chunk is inf or NaN; with inv_scale, also multiplies
// every element by it in place.
template <typename T, typename Tables>
__global__ void __launch_bounds__(kOptimThreads)
    multi_tensor_check_and_unscale(const __grid_constant__ Tables tables, int64_t num_tensors, float* found_inf,
                                   const float* inv_scale) {
  dependent_kernel_begin();
  using C = acc_t<T>;
  constexpr int V = 16 / sizeof(T);
  const ChunkPlace place = place_of_chunk(tables.slots(), tables.starts(), num_tensors, blockIdx.x);
  const TensorSlot& slot = tables.slots()[place.tensor];
  const int64_t begin = place.begin, n = place.n;
  T* g = static_cast<T*>(slot.ptr[kGrad]) + begin;  // (n,)
  const C unscale = inv_scale != nullptr ? static_cast<C>(*inv_scale) : C(1);
  bool found = false;
  int64_t done = 0;
  if (slot.vectorised) {
    const int64_t n_vec = n / V;
    for (int64_t i = threadIdx.x; i < n_vec; i += blockDim.x) {
      Packed<T, V> vg = reinterpret_cast<const Packed<T, V>*>(g)[i];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const C value = to_acc(vg.v[j]);
        found = found || !isfinite(value);
        vg.v[j] = cast_to<T>(value * unscale);
      }
      if (inv_scale != nullptr) reinterpret_cast<Packed<T, V>*>(g)[i] = vg;
    }
    done = n_vec * V;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    const C value = to_acc(g[i]);
    found = found || !isfinite(value);
    if (inv_scale != nullptr) g[i] = cast_to<T>(value * unscale);
  }
  if (__syncthreads_or(found) && threadIdx.x == 0) *found_inf = 1.0f;
}

bool aligned_to(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// The tables of one multi-tensor launch, on the host.
struct HostTables {
  std::vector<TensorSlot> slots;      // (num_tensors,)
  std::vector<int64_t> chunk_starts;  // (num_tensors,)
  int64_t num_chunks = 0;
  int64_t num_tensors() const { return static_cast<int64_t>(slots.size()); }
};

// Builds the tables for one list of tensors. slots[t] has every pointer but its size;
// vector_bytes[r] is the alignment role r needs for vector loads. Empty tensors have no chunks.
HostTables build_tables(const char* name, std::vector<TensorSlot> slots, const std::vector<int64_t>& numels,
                        const size_t (&vector_bytes)[kMaxRoles]) {
  std::vector<int64_t> chunk_starts;  // (num_tensors,)
  int64_t chunks = 0;
  for (size_t t = 0; t < slots.size(); ++t) {
    TensorSlot& slot = slots[t];
    slot.numel = numels[t];
    bool vectorised = true;
    for (int r = 0; r < kMaxRoles; ++r) {
      if (slot.ptr[r] != nullptr && vector_bytes[r] > 0) {
        vectorised = vectorised && aligned_to(slot.ptr[r], vector_bytes[r]);
      }
    }
    slot.vectorised = vectorised ? 1 : 0;
    chunk_starts.push_back(chunks);
    chunks += (slot.numel + kChunk - 1) / kChunk;
  }
  TANDEM_CHECK_AS(ValueError, chunks <= INT32_MAX, name, ": ", chunks, " chunks of ", kChunk,
                  " elements are more than one launch can take");
  return {std::move(slots), std::move(chunk_starts), chunks};
}

// Calls launch(tables) with the tables as the kernel takes them: inline for up to kInlineTensors
// tensors, otherwise uploaded. An upload goes into a block of the caching allocator on the current
// stream (held here until launch has queued the kernel; the allocator reuses it only after), or
// inside a capture into memory the graph holds: every replay reads the same tables, uploaded once.
template <typename Launch>
void with_device_tables(const HostTables& host, Device device, Launch&& launch) {
  if (host.num_tensors() <= kInlineTensors) {
    TablesInline tables{};
    std::copy(host.slots.begin(), host.slots.end(), tables.tensors);
    std::copy(host.chunk_starts.begin(), host.chunk_starts.end(), tables.chunk_starts);
    launch(tables);
    return;
  }
  const size_t slot_bytes = host.slots.size() * sizeof(TensorSlot);
  const size_t start_bytes = host.chunk_starts.size() * sizeof(int64_t);
  std::vector<unsigned char> bytes(slot_bytes + start_bytes);  // tensor table, then chunk starts
  std::memcpy(bytes.data(), host.slots.data(), slot_bytes);
  std::memcpy(bytes.data() + slot_bytes, host.chunk_starts.data(), start_bytes);
  Tensor buffer;  // (bytes,) u8, outside a capture
  const unsigned char* base = nullptr;
  if (is_capturing()) {
    base = static_cast<const unsigned char*>(upload_for_graph(bytes.data(), bytes.size(), device.index));
  } else {
    buffer = empty({static_cast<int64_t>(bytes.size())}, TensorOptions(DType::u8, device));
    copy_host_to_device(buffer.data_ptr(), bytes.data(), bytes.size(), device.index);
    base = static_cast<const unsigned char*>(buffer.data_ptr());
  }
  const auto* tensors = reinterpret_cast<const TensorSlot*>(base);
  launch(TablesInMemory{tensors, reinterpret_cast<const int64_t*>(base + slot_bytes)});
}

const float* scalar_ptr(const Tensor& t) { return t.defined() ? static_cast<const float*>(t.data_ptr()) : nullptr; }

const double* lr_pointer(const UpdateTensors& t) {
  if (!t.lr_on_device.defined()) return nullptr;
  TANDEM_CHECK_AS(ValueError,
                  t.lr_on_device.dtype() == DType::f64 && t.lr_on_device.numel() == 2 && t.lr_on_device.is_contiguous() &&
                      t.lr_on_device.device() == t.params[0].device(),
                  "optimizer step: lr_on_device must be (2,) f64 on ", t.params[0].device());
  return static_cast<const double*>(t.lr_on_device.data_ptr());
}

// Launches the update over the lists of `t` (states, masters and steps where given).
template <typename T, typename Op>
void launch_update(const char* name, const UpdateTensors& t, const Op& op) {
  using C = acc_t<T>;
  constexpr size_t kVecBytes = 16;  // C vectors; the T vectors of parameters and gradients are a fraction
  if (t.params.empty()) return;
  NvtxRange range(name);
  const Device device = t.params[0].device();
  DeviceGuard guard(device.index);
  // The tensors by where they keep their weights (in Weights' order); usually all of one kind.
  std::vector<TensorSlot> slots[kWeightKinds];
  std::vector<int64_t> numels[kWeightKinds];
  for (size_t i = 0; i < t.params.size(); ++i) {
    TensorSlot slot{};
    Weights kind = Weights::parameter;
    slot.ptr[kParam] = t.params[i].data_ptr();
    slot.ptr[kGrad] = t.grads[i].data_ptr();
    for (size_t k = 0; k < t.states.size(); ++k) slot.ptr[kState0 + k] = t.states[k][i].data_ptr();
    if (!t.masters.empty() && t.masters[i].defined()) {
      slot.ptr[kMaster] = t.masters[i].data_ptr();
      const bool low_halves = t.masters[i].dtype() == DType::bf16;  // a compact master (core/master_halves.h)
      TANDEM_CHECK_AS(TypeError, !low_halves || kCanHoldHalves<T>, name,
                      ": a compact master (bf16 low halves) needs a bf16 parameter, and parameter ", i, " is ",
                      dtype_name(t.params[i].dtype()));
      kind = low_halves ? Weights::low_halves : Weights::f32_master;
    }
    if (!t.steps.empty()) slot.ptr[kStep] = t.steps[i].data_ptr();
    slots[static_cast<int>(kind)].push_back(slot);
    numels[static_cast<int>(kind)].push_back(t.params[i].numel());
  }
  const size_t vec_t = kVecBytes / sizeof(C) * sizeof(T);
  const size_t vector_bytes[kMaxRoles] = {vec_t, vec_t, kVecBytes, kVecBytes, kVecBytes, 0};
  const ScalingArgs scaling{scalar_ptr(t.found_inf), scalar_ptr(t.inv_scale)};
  cudaStream_t stream = stream_of(t.params[0]);
  for (int kind = 0; kind < kWeightKinds; ++kind) {
    if (slots[kind].empty()) continue;
    const HostTables host = build_tables(name, std::move(slots[kind]), numels[kind], vector_bytes);
    if (host.num_chunks == 0) continue;
    const unsigned blocks = static_cast<unsigned>(host.num_chunks);
    const int64_t count = host.num_tensors();
    with_device_tables(host, device, [&](const auto& tables) {
      using Tables = std::decay_t<decltype(tables)>;
      if (kind == static_cast<int>(Weights::parameter)) {
        launch_dependent(multi_tensor_update<T, Op, Weights::parameter, Tables>, blocks, kOptimThreads, 0, stream,
                         tables, count, op, scaling);
      } else if (kind == static_cast<int>(Weights::f32_master)) {
        launch_dependent(multi_tensor_update<T, Op, Weights::f32_master, Tables>, blocks, kOptimThreads, 0, stream,
                         tables, count, op, scaling);
      } else if constexpr (kCanHoldHalves<T>) {
        launch_dependent(multi_tensor_update<T, Op, Weights::low_halves, Tables>, blocks, kOptimThreads, 0, stream,
                         tables, count, op, scaling);
      }
      check_launch(name);
      if (!t.steps.empty()) {
        const auto step_blocks = static_cast<unsigned>((count + kOptimThreads - 1) / kOptimThreads);
        launch_dependent(increment_step_counts<Tables>, step_blocks, kOptimThreads, 0, stream, tables, count,
                         scaling.found_inf);
        check_launch(name);
      }
    });
  }
}

template <typename C, bool kMomentum>
struct SgdOp {
  static constexpr int kStates = kMomentum ? 1 : 0;
  C lr, weight_decay, momentum, keep;  // keep = 1 - dampening
  bool nesterov, first_step;
  const double* lr_on_device;  // null, or (2,) lr, 1 - lr * weight_decay: replaces lr

  __device__ SgdOp for_tensor(const float*) const {
    SgdOp op = *this;
    if (lr_on_device != nullptr) op.lr = static_cast<C>(lr_on_device[0]);
    return op;
  }
  __device__ bool loads_state() const { return kMomentum && !first_step; }
  __device__ void operator()(C& p, C g, C* state) const {
    C d = rn::add(g, rn::mul(weight_decay, p));
    if constexpr (kMomentum) {
      C buf = first_step ? d : rn::add(rn::mul(momentum, state[0]), rn::mul(keep, d));
      state[0] = buf;
      d = nesterov ? rn::add(d, rn::mul(momentum, buf)) : buf;
    }
    p = rn::sub(p, rn::mul(lr, d));
  }
};

template <typename C>
struct AdamWOp {
  static constexpr int kStates = 2;
  double lr, beta1_d, beta2_d;  // for the bias corrections, computed per tensor in f64 as on the host
  C decay, beta1, beta2, one_minus_beta1, one_minus_beta2, eps;
  C step_size, bc2_sqrt;  // set by for_tensor
  const double* lr_on_device;  // null, or (2,) lr, 1 - lr * weight_decay: replace lr and decay

  __device__ AdamWOp for_tensor(const float* step_count) const {
    AdamWOp op = *this;
    if (lr_on_device != nullptr) {
      op.lr = lr_on_device[0];
      op.decay = static_cast<C>(lr_on_device[1]);
    }
    const double step = static_cast<double>(*step_count) + 1.0;
    op.step_size = static_cast<C>(op.lr / (1.0 - pow(beta1_d, step)));
    op.bc2_sqrt = static_cast<C>(sqrt(1.0 - pow(beta2_d, step)));
    return op;
  }
  __device__ bool loads_state() const { return true; }
  __device__ void operator()(C& p, C g, C* state) const {
    C m = rn::add(rn::mul(beta1, state[0]), rn::mul(one_minus_beta1, g));
    C v = rn::add(rn::mul(beta2, state[1]), rn::mul(rn::mul(one_minus_beta2, g), g));
    state[0] = m;
    state[1] = v;
    const C denom = rn::add(rn::div(rn::sqrt(v), bc2_sqrt), eps);
    p = rn::sub(rn::mul(p, decay), rn::div(rn::mul(step_size, m), denom));
  }
};
}  // namespace

void sgd_step(const UpdateTensors& t, const SgdHyper& h) {
  if (t.params.empty()) return;
  dispatch_floating(t.params[0].dtype(), "sgd_step", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using C = acc_t<T>;
    const C lr = static_cast<C>(h.lr), wd = static_cast<C>(h.weight_decay);
    const C momentum = static_cast<C>(h.momentum), keep = static_cast<C>(1.0 - h.dampening);
    const double* lr_on_device = lr_pointer(t);
    if (h.momentum != 0.0) {
      launch_update<T>("sgd_step", t, SgdOp<C, true>{lr, wd, momentum, keep, h.nesterov, h.first_step, lr_on_device});
    } else {
      launch_update<T>("sgd_step", t, SgdOp<C, false>{lr, wd, momentum, keep, false, false, lr_on_device});
    }
  });
}

void adamw_step(const UpdateTensors& t, const AdamWHyper& h) {
  if (t.params.empty()) return;
  dispatch_floating(t.params[0].dtype(), "adamw_step", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using C = acc_t<T>;
    AdamWOp<C> op{h.lr,
                  h.beta1,
                  h.beta2,
                  static_cast<C>(1.0 - h.lr * h.weight_decay),
                  static_cast<C>(h.beta1),
                  static_cast<C>(h.beta2),
                  static_cast<C>(1.0 - h.beta1),
                  static_cast<C>(1.0 - h.beta2),
                  static_cast<C>(h.eps),
                  C(0),
                  C(1),
                  lr_pointer(t)};
    launch_update<T>("adamw_step", t, op);
  });
}

namespace {
// Compact master weights in and out of f32 (checkpoints): grid-stride loops over n elements.
__global__ void join_master_halves_kernel(const uint16_t* __restrict__ high,  // (n,) the bf16 parameter
                                          const uint16_t* __restrict__ low,   // (n,)
                                          float* __restrict__ master,         // (n,)
                                          int64_t n) {
  dependent_kernel_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    master[i] = __uint_as_float(master_halves::join(high[i], low[i]));
  }
}

__global__ void split_master_kernel(const float* __restrict__ master,  // (n,)
                                    uint16_t* __restrict__ high,       // (n,) the bf16 parameter
                                    uint16_t* __restrict__ low,        // (n,)
                                    int64_t n) {
  dependent_kernel_begin();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = __float_as_uint(master[i]);
    high[i] = master_halves::high(bits);
    low[i] = master_halves::low(bits);
  }
}
}  // namespace

void join_master_halves(const Tensor& param, const Tensor& low_halves, const Tensor& master) {
  DeviceGuard guard(param.device().index);
  const int64_t n = param.numel();
  launch_dependent(join_master_halves_kernel, blocks_for(n, kOptimThreads), kOptimThreads, 0, stream_of(param),
                   device_ptr<const uint16_t>(param), device_ptr<const uint16_t>(low_halves), device_ptr<float>(master),
                   n);
  check_launch("join_master_halves");
}

void split_master(const Tensor& master, const Tensor& param, const Tensor& low_halves) {
  DeviceGuard guard(param.device().index);
  const int64_t n = param.numel();
  launch_dependent(split_master_kernel, blocks_for(n, kOptimThreads), kOptimThreads, 0, stream_of(param),
                   device_ptr<const float>(master), device_ptr<uint16_t>(param), device_ptr<uint16_t>(low_halves), n);
  check_launch("split_master");
}

void non_finite_check_and_unscale_(const std::vector<Tensor>& grads, const Tensor& found_inf, const Tensor& inv_scale) {
  if (grads.empty()) return;
  NvtxRange range("non_finite_check_and_unscale_");
  const Device device = grads[0].device();
  DeviceGuard guard(device.index);
  dispatch_floating(grads[0].dtype(), "non_finite_check_and_unscale_", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    std::vector<TensorSlot> slots(grads.size(), TensorSlot{});
    std::vector<int64_t> numels;
    for (size_t i = 0; i < grads.size(); ++i) {
      slots[i].ptr[kGrad] = grads[i].data_ptr();
      numels.push_back(grads[i].numel());
    }
    const size_t vector_bytes[kMaxRoles] = {0, 16, 0, 0, 0, 0};
    const HostTables host = build_tables("non_finite_check_and_unscale_", std::move(slots), numels, vector_bytes);
    if (host.num_chunks == 0) return;
    with_device_tables(host, device, [&](const auto& tables) {
      launch_dependent(multi_tensor_check_and_unscale<T, std::decay_t<decltype(tables)>>,
                       static_cast<unsigned>(host.num_chunks), kOptimThreads, 0, stream_of(grads[0]), tables,
                       host.num_tensors(), static_cast<float*>(found_inf.data_ptr()), scalar_ptr(inv_scale));
      check_launch("non_finite_check_and_unscale_");
    });
  });
}

namespace {
__global__ void update_scale_kernel(float* scale, int32_t* growth_tracker, const float* found_inf, float growth,
                                    float backoff, int64_t growth_interval) {
  dependent_kernel_begin();
  if (*found_inf != 0.0f) {
    *scale *= backoff;
    *growth_tracker = 0;
    return;
  }
  const int64_t successful = static_cast<int64_t>(*growth_tracker) + 1;
  if (successful >= growth_interval) {
    const float grown = *scale * growth;
    if (isfinite(grown)) *scale = grown;
    *growth_tracker = 0;
  } else {
    *growth_tracker = static_cast<int32_t>(successful);
  }
}
}  // namespace

void update_scale_(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth,
                   double backoff, int64_t growth_interval) {
  DeviceGuard guard(scale.device().index);
  launch_dependent(update_scale_kernel, 1, 1, 0, stream_of(scale), static_cast<float*>(scale.data_ptr()),
                   static_cast<int32_t*>(growth_tracker.data_ptr()), static_cast<const float*>(found_inf.data_ptr()),
                   static_cast<float>(growth), static_cast<float>(backoff), growth_interval);
  check_launch("update_scale_");
}

}  // namespace tandem::cuda
