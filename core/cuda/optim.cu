// CUDA optimizer updates: SGD and AdamW as fused multi-tensor kernels. One launch updates every
// tensor of a list (the device-neutral layer hands over one dtype on one device at a time):
//
// - The host cuts each tensor into chunks of `chunk_size` elements and writes two tables into one
//   buffer: a TensorSlot per tensor (its parameter, gradient and state pointers, its size, whether
//   it can take vector loads) and a ChunkSlot per block (which tensor, which chunk of it).
// - The buffer goes to the device in one upload, into a block of tandem's caching allocator on the
//   stream the kernel runs on, so the block is only reused after the kernel (stream order), and the
//   number of tensors is not limited by the size of kernel parameters.
// - Block b updates chunk chunks[b] in a loop over its elements: 16-byte loads of the f32 / f64
//   state (4 / 2 elements, with the matching 8- or 16-byte loads of 16-bit parameters and
//   gradients) when every pointer of the tensor is aligned for them, one element at a time
//   otherwise (views at odd offsets) and for the tail of a tensor.
//
// The arithmetic is the CPU backend's (core/cpu/optim.cpp): in f32 for f32, f16 and bf16
// parameters, in f64 for f64 ones, with the state in that type and one rounding of the new
// parameter to its dtype.
#include <cstring>

#include "tandem/core/backend.h"
#include "tandem/core/cuda/loops.cuh"

namespace tandem::cuda {

namespace {
constexpr int kOptimThreads = 256;
constexpr int kMaxRoles = 4;                  // parameter, gradient, up to two state tensors
constexpr int64_t kMaxChunk = 65536;          // elements per block for large lists
constexpr int64_t kMinChunk = 2048;           // ... and the smallest chunk for small ones
constexpr int64_t kTargetBlocks = 4 * 132;    // enough blocks to fill an H100 several times over

struct TensorSlot {
  void* ptr[kMaxRoles];  // parameter (n,), gradient (n,), state tensors (n,); null where unused
  int64_t numel;
  int32_t vectorised;    // every pointer is aligned for Vec loads
  int32_t unused;
};
static_assert(sizeof(TensorSlot) % 16 == 0, "the chunk table after the tensor table stays aligned");

struct ChunkSlot {
  int32_t tensor;  // index into the tensor table
  int32_t chunk;   // elements [chunk * chunk_size, min(numel, (chunk + 1) * chunk_size)) of it
};

// Large chunks keep the chunk table short; small lists get smaller chunks so that they still
// spread over the whole GPU.
int64_t choose_chunk_size(int64_t total) {
  int64_t chunk = kMaxChunk;
  while (chunk > kMinChunk && total < chunk * kTargetBlocks) chunk /= 2;
  return chunk;
}

// Updates one chunk per block. Op holds the hyper-parameters and the per-element rule
// op(p, g, state) on the compute type, with Op::kStates state tensors (read when
// op.loads_state()).
template <typename T, typename Op>
__global__ void __launch_bounds__(kOptimThreads)
    multi_tensor_update(const TensorSlot* __restrict__ tensors,  // (num_tensors,)
                        const ChunkSlot* __restrict__ chunks,    // (gridDim.x,)
                        int64_t chunk_size, Op op) {
  using C = acc_t<T>;
  constexpr int K = Op::kStates;
  constexpr int KS = K > 0 ? K : 1;
  constexpr int V = 16 / sizeof(C);
  const ChunkSlot chunk = chunks[blockIdx.x];
  const TensorSlot& slot = tensors[chunk.tensor];
  const int64_t begin = static_cast<int64_t>(chunk.chunk) * chunk_size;
  const int64_t n = slot.numel - begin < chunk_size ? slot.numel - begin : chunk_size;
  T* p = static_cast<T*>(slot.ptr[0]) + begin;              // (n,)
  const T* g = static_cast<const T*>(slot.ptr[1]) + begin;  // (n,)
  C* s[KS];                                                 // K x (n,)
#pragma unroll
  for (int k = 0; k < K; ++k) s[k] = static_cast<C*>(slot.ptr[2 + k]) + begin;
  const bool load_state = op.loads_state();

  int64_t done = 0;
  if (slot.vectorised) {
    const int64_t n_vec = n / V;
    for (int64_t i = threadIdx.x; i < n_vec; i += blockDim.x) {
      Vec<T, V> vp = reinterpret_cast<const Vec<T, V>*>(p)[i];
      const Vec<T, V> vg = reinterpret_cast<const Vec<T, V>*>(g)[i];
      Vec<C, V> vs[KS] = {};
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (load_state) vs[k] = reinterpret_cast<const Vec<C, V>*>(s[k])[i];
      }
#pragma unroll
      for (int j = 0; j < V; ++j) {
        C pj = to_acc(vp.v[j]);
        C st[KS];
#pragma unroll
        for (int k = 0; k < K; ++k) st[k] = vs[k].v[j];
        op(pj, to_acc(vg.v[j]), st);
        vp.v[j] = cast_to<T>(pj);
#pragma unroll
        for (int k = 0; k < K; ++k) vs[k].v[j] = st[k];
      }
      reinterpret_cast<Vec<T, V>*>(p)[i] = vp;
#pragma unroll
      for (int k = 0; k < K; ++k) reinterpret_cast<Vec<C, V>*>(s[k])[i] = vs[k];
    }
    done = n_vec * V;
  }
  for (int64_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    C pi = to_acc(p[i]);
    C st[KS] = {};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (load_state) st[k] = s[k][i];
    }
    op(pi, to_acc(g[i]), st);
    p[i] = cast_to<T>(pi);
#pragma unroll
    for (int k = 0; k < K; ++k) s[k][i] = st[k];
  }
}

bool aligned_to(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Builds and uploads the tables for `roles` (params, grads, then the state lists, all of one
// length) and launches the update over them.
template <typename T, typename Op>
void launch_update(const char* name, const std::vector<const std::vector<Tensor>*>& roles, const Op& op) {
  using C = acc_t<T>;
  constexpr int V = 16 / sizeof(C);
  const std::vector<Tensor>& params = *roles[0];
  if (params.empty()) return;
  NvtxRange range(name);
  const Device device = params[0].device();
  DeviceGuard guard(device.index);

  int64_t total = 0;
  for (const Tensor& p : params) total += p.numel();
  if (total == 0) return;
  const int64_t chunk_size = choose_chunk_size(total);

  std::vector<TensorSlot> slots(params.size());
  std::vector<ChunkSlot> chunks;
  for (size_t t = 0; t < params.size(); ++t) {
    TensorSlot& slot = slots[t];
    slot = TensorSlot{};
    slot.numel = params[t].numel();
    bool vectorised = true;
    for (size_t r = 0; r < roles.size(); ++r) {
      slot.ptr[r] = (*roles[r])[t].data_ptr();
      vectorised = vectorised && aligned_to(slot.ptr[r], r < 2 ? V * sizeof(T) : V * sizeof(C));
    }
    slot.vectorised = vectorised ? 1 : 0;
    const int64_t n_chunks = (slot.numel + chunk_size - 1) / chunk_size;
    TANDEM_CHECK_AS(ValueError, n_chunks <= INT32_MAX, name, ": a tensor of ", slot.numel, " elements is too large");
    for (int64_t c = 0; c < n_chunks; ++c) {
      chunks.push_back(ChunkSlot{static_cast<int32_t>(t), static_cast<int32_t>(c)});
    }
  }
  TANDEM_CHECK_AS(ValueError, chunks.size() <= static_cast<size_t>(INT32_MAX), name, ": ", chunks.size(),
                  " chunks are more than one launch can take");

  const size_t slot_bytes = slots.size() * sizeof(TensorSlot);
  const size_t chunk_bytes = chunks.size() * sizeof(ChunkSlot);
  std::vector<unsigned char> host(slot_bytes + chunk_bytes);  // tensor table, then chunk table
  std::memcpy(host.data(), slots.data(), slot_bytes);
  std::memcpy(host.data() + slot_bytes, chunks.data(), chunk_bytes);
  Tensor table = empty({static_cast<int64_t>(host.size())}, TensorOptions(DType::u8, device));  // (bytes,)
  copy_host_to_device(table.data_ptr(), host.data(), host.size(), device.index);
  const auto* device_slots = static_cast<const TensorSlot*>(table.data_ptr());
  const auto* device_chunks = reinterpret_cast<const ChunkSlot*>(static_cast<const unsigned char*>(table.data_ptr()) +
                                                                 slot_bytes);
  multi_tensor_update<T, Op><<<static_cast<unsigned>(chunks.size()), kOptimThreads, 0, stream_of(params[0])>>>(
      device_slots, device_chunks, chunk_size, op);
  check_launch(name);
}

template <typename C, bool kMomentum>
struct SgdOp {
  static constexpr int kStates = kMomentum ? 1 : 0;
  C lr, weight_decay, momentum, keep;  // keep = 1 - dampening
  bool nesterov, first_step;

  __device__ bool loads_state() const { return kMomentum && !first_step; }
  __device__ void operator()(C& p, C g, C* state) const {
    C d = g + weight_decay * p;
    if constexpr (kMomentum) {
      C buf = first_step ? d : momentum * state[0] + keep * d;
      state[0] = buf;
      d = nesterov ? d + momentum * buf : buf;
    }
    p = p - lr * d;
  }
};

template <typename C>
struct AdamWOp {
  static constexpr int kStates = 2;
  C decay, beta1, beta2, one_minus_beta1, one_minus_beta2, step_size, bc2_sqrt, eps;

  __device__ bool loads_state() const { return true; }
  __device__ void operator()(C& p, C g, C* state) const {
    C m = beta1 * state[0] + one_minus_beta1 * g;
    C v = beta2 * state[1] + one_minus_beta2 * g * g;
    state[0] = m;
    state[1] = v;
    p = p * decay - step_size * m / (std::sqrt(v) / bc2_sqrt + eps);
  }
};
}  // namespace

void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
              const std::vector<Tensor>& momentum_buffers, const SgdHyper& h) {
  if (params.empty()) return;
  dispatch_floating(params[0].dtype(), "sgd_step", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using C = acc_t<T>;
    const C lr = static_cast<C>(h.lr), wd = static_cast<C>(h.weight_decay);
    const C momentum = static_cast<C>(h.momentum), keep = static_cast<C>(1.0 - h.dampening);
    if (h.momentum != 0.0) {
      launch_update<T>("sgd_step", {&params, &grads, &momentum_buffers},
                       SgdOp<C, true>{lr, wd, momentum, keep, h.nesterov, h.first_step});
    } else {
      launch_update<T>("sgd_step", {&params, &grads}, SgdOp<C, false>{lr, wd, momentum, keep, false, false});
    }
  });
}

void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg,
                const std::vector<Tensor>& exp_avg_sq, const AdamWHyper& h) {
  if (params.empty()) return;
  dispatch_floating(params[0].dtype(), "adamw_step", "cuda", [&](auto tag) {
    using T = device_t<decltype(tag)>;
    using C = acc_t<T>;
    AdamWOp<C> op{static_cast<C>(1.0 - h.lr * h.weight_decay),
                  static_cast<C>(h.beta1),
                  static_cast<C>(h.beta2),
                  static_cast<C>(1.0 - h.beta1),
                  static_cast<C>(1.0 - h.beta2),
                  static_cast<C>(h.lr / h.bias_correction1()),
                  static_cast<C>(std::sqrt(h.bias_correction2())),
                  static_cast<C>(h.eps)};
    launch_update<T>("adamw_step", {&params, &grads, &exp_avg, &exp_avg_sq}, op);
  });
}

}  // namespace tandem::cuda
