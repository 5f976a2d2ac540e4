// Setting up the peer all-reduce (dist/peer_all_reduce.h): every rank's buffer mapped into every
// other rank through CUDA IPC. Each step that can fail on one rank only (an allocation, a peer
// check, opening a mapping) is followed by an all-gather of every rank's verdict, so that all ranks
// take the path or none does, and no rank throws while the others wait for it.
#include "tandem/dist/peer_all_reduce.h"

#include <cstring>

#include "tandem/core/cuda/check.h"
#include "tandem/core/cuda_api.h"
#include "tandem/core/error.h"
#include "tandem/core/tensor.h"
#include "tandem/dist/internal.h"

namespace tandem::dist::internal {

namespace {

constexpr int64_t kFlagsBytes = 4096;  // (kPeerBlocks, kPeerMaxRanks) u32, padded so the slots stay aligned
static_assert(kPeerBlocks * kPeerMaxRanks * sizeof(uint32_t) <= kFlagsBytes, "flags outgrow their region");

// A verdict of this rank that every rank learns: empty when fine, else why not.
struct Verdict {
  char why[240] = {};
  void set(const std::string& text) {
    if (why[0] == '\0') std::strncpy(why, text.c_str(), sizeof(why) - 1);
  }
  bool ok() const { return why[0] == '\0'; }
};

// Every rank's verdict; the first failing one's reason, or "" when all are fine.
std::string agree(const Verdict& mine, int size, double timeout) {
  std::vector<uint8_t> all = host_all_gather(&mine, sizeof(Verdict), timeout);
  for (int r = 0; r < size; ++r) {
    Verdict v;
    std::memcpy(&v, all.data() + static_cast<size_t>(r) * sizeof(Verdict), sizeof(Verdict));
    if (!v.ok()) return ::tandem::detail::concat("rank ", r, ": ", v.why);
  }
  return "";
}

std::string cuda_text(cudaError_t status) {
  cudaGetLastError();  // off the thread's last-error slot
  return ::tandem::detail::concat(cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

struct BusId {
  char text[32] = {};
};

}  // namespace

std::unique_ptr<PeerAllReduce> PeerAllReduce::create(int rank, int size, bool one_node, int device,
                                                     int64_t max_read_bytes, double timeout_seconds,
                                                     std::string* why_not) {
  // Decided alike on every rank from what every rank knows.
  if (max_read_bytes <= 0) {
    *why_not = "turned off (peer_all_reduce_max_bytes is 0)";
    return nullptr;
  }
  if (size < 2 || size > kPeerMaxRanks) {
    *why_not = ::tandem::detail::concat(size, " ranks (it serves 2 to ", kPeerMaxRanks, ")");
    return nullptr;
  }
  if (!one_node) {
    *why_not = "the ranks are on more than one node";
    return nullptr;
  }
  cuda::DeviceGuard guard(device);

  // Every peer's GPU visible here and linked to this one by NVLink. CUDA reports native atomics
  // over NVLink and not over PCIe, where reading the peers' copies would be slower than NCCL.
  BusId mine;
  Verdict verdict;
  cudaError_t status = cudaDeviceGetPCIBusId(mine.text, sizeof(mine.text), device);
  if (status != cudaSuccess) verdict.set("cudaDeviceGetPCIBusId: " + cuda_text(status));
  std::vector<uint8_t> ids = host_all_gather(&mine, sizeof(BusId), timeout_seconds);
  for (int r = 0; r < size && verdict.ok(); ++r) {
    if (r == rank) continue;
    BusId theirs;
    std::memcpy(&theirs, ids.data() + static_cast<size_t>(r) * sizeof(BusId), sizeof(BusId));
    int peer_device = -1, can_access = 0, atomics = 0;
    if (cudaDeviceGetByPCIBusId(&peer_device, theirs.text) != cudaSuccess) {
      cudaGetLastError();
      verdict.set(::tandem::detail::concat("rank ", r, "'s GPU (", theirs.text, ") is not visible here"));
    } else if (cudaDeviceCanAccessPeer(&can_access, device, peer_device) != cudaSuccess || can_access == 0) {
      cudaGetLastError();
      verdict.set(::tandem::detail::concat("no peer access to rank ", r, "'s GPU (", theirs.text, ")"));
    } else if (cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, device, peer_device) !=
                   cudaSuccess ||
               atomics == 0) {
      cudaGetLastError();
      verdict.set(::tandem::detail::concat("rank ", r, "'s GPU (", theirs.text, ") is not linked by NVLink"));
    }
  }
  std::string why = agree(verdict, size, timeout_seconds);
  if (!why.empty()) {
    *why_not = why;
    return nullptr;
  }

  std::unique_ptr<PeerAllReduce> self(new PeerAllReduce());
  PeerAllReduceArgs& a = self->args_;
  self->device_ = device;
  a.rank = rank;
  a.size = size;
  // Past the group's timeout the watchdog fails the collective waited for, naming it, and the abort
  // word releases the kernel; its own limit is a backstop for a host that cannot.
  a.timeout_ns = static_cast<uint64_t>((2 * timeout_seconds + 10) * 1e9);
  // The largest tensor: max_read_bytes over the other ranks' copies, in whole 16-byte vectors.
  a.slot_bytes = (max_read_bytes / (size - 1)) / 16 * 16;
  if (a.slot_bytes < 16) a.slot_bytes = 16;

  // This rank's buffer (flags at zero, then 2 slots) and its IPC handle, the per-block call counts,
  // and the two host-mapped words.
  cudaIpcMemHandle_t handle;
  std::memset(&handle, 0, sizeof(handle));
  Verdict allocated;
  const size_t own_bytes = static_cast<size_t>(kFlagsBytes + 2 * a.slot_bytes);
  if ((status = cudaMalloc(&self->own_, own_bytes)) != cudaSuccess) {
    self->own_ = nullptr;
    allocated.set("cudaMalloc of " + std::to_string(own_bytes) + " bytes: " + cuda_text(status));
  } else if ((status = cudaMemset(self->own_, 0, kFlagsBytes)) != cudaSuccess ||
             (status = cudaIpcGetMemHandle(&handle, self->own_)) != cudaSuccess) {
    allocated.set("preparing the shared buffer: " + cuda_text(status));
  }
  void* calls = nullptr;
  if (allocated.ok()) {
    if ((status = cudaMalloc(&calls, kPeerBlocks * sizeof(uint32_t))) != cudaSuccess ||
        (status = cudaMemset(calls, 0, kPeerBlocks * sizeof(uint32_t))) != cudaSuccess) {
      if (status != cudaSuccess) allocated.set("the call counts: " + cuda_text(status));
    }
  }
  if (allocated.ok()) {
    if ((status = cudaHostAlloc(&self->host_words_, 2 * sizeof(int), cudaHostAllocMapped)) != cudaSuccess) {
      self->host_words_ = nullptr;
      allocated.set("cudaHostAlloc of the abort and status words: " + cuda_text(status));
    } else {
      std::memset(self->host_words_, 0, 2 * sizeof(int));
      void* device_words = nullptr;
      if ((status = cudaHostGetDevicePointer(&device_words, self->host_words_, 0)) != cudaSuccess) {
        allocated.set("cudaHostGetDevicePointer: " + cuda_text(status));
      } else {
        a.abort_flag = static_cast<const volatile int*>(device_words);
        a.status = static_cast<int*>(device_words) + 1;
      }
    }
  }
  a.calls = static_cast<uint32_t*>(calls);
  if (allocated.ok() && (status = cudaDeviceSynchronize()) != cudaSuccess) {
    allocated.set("cudaDeviceSynchronize: " + cuda_text(status));  // the flags are zero before any peer writes
  }

  // Every rank's handle, each opened here (the mapping enables peer access itself).
  std::vector<uint8_t> handles = host_all_gather(&handle, sizeof(handle), timeout_seconds);
  why = agree(allocated, size, timeout_seconds);
  Verdict opened;
  for (int r = 0; r < size && why.empty(); ++r) {
    char* base = nullptr;
    if (r == rank) {
      base = static_cast<char*>(self->own_);
    } else if (opened.ok()) {
      cudaIpcMemHandle_t theirs;
      std::memcpy(&theirs, handles.data() + static_cast<size_t>(r) * sizeof(theirs), sizeof(theirs));
      void* mapped = nullptr;
      if ((status = cudaIpcOpenMemHandle(&mapped, theirs, cudaIpcMemLazyEnablePeerAccess)) != cudaSuccess) {
        opened.set(::tandem::detail::concat("cudaIpcOpenMemHandle of rank ", r, "'s buffer: ", cuda_text(status)));
        continue;
      }
      self->opened_.push_back(mapped);
      base = static_cast<char*>(mapped);
    }
    if (base != nullptr) {
      a.flags[r] = reinterpret_cast<uint32_t*>(base);
      a.staging[r] = base + kFlagsBytes;
    }
  }
  if (why.empty()) why = agree(opened, size, timeout_seconds);
  if (!why.empty()) {
    *why_not = why;
    return nullptr;  // no kernel ran: the destructor unmaps and frees what was made
  }
  self->ran_ = true;
  return self;
}

PeerAllReduce::~PeerAllReduce() {
  try {
    cuda::DeviceGuard guard(device_);
    // Only the NCCL group's shutdown destroys a path that ran, once this rank's kernels are done:
    // nothing here reads the peers' buffers any more. This rank's own buffer stays until the
    // process ends (dist::init runs once per process), since a peer's kernel may still read its
    // slots or store into its flags.
    for (void* mapped : opened_) cudaIpcCloseMemHandle(mapped);
    if (!ran_) {
      if (own_ != nullptr) cudaFree(own_);
      if (args_.calls != nullptr) cudaFree(args_.calls);
      if (host_words_ != nullptr) cudaFreeHost(host_words_);
    }
    cudaGetLastError();
  } catch (const std::exception&) {
    // the device is gone: nothing to release
  }
}

bool PeerAllReduce::takes(const Tensor& t, ReduceOp op) const {
  const DType d = t.dtype();
  const bool typed = d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16 ||
                     ((d == DType::i32 || d == DType::i64) && op != ReduceOp::avg);  // NCCL's integer avg
  return typed && t.numel() > 0 && static_cast<int64_t>(t.nbytes()) <= args_.slot_bytes;
}

void PeerAllReduce::launch(const Tensor& t, ReduceOp op, cudaStream_t stream) {
  args_.data = t.data_ptr();
  args_.n = t.numel();
  launch_peer_all_reduce(args_, t.dtype(), op, stream);
}

int PeerAllReduce::timed_out_peer() const {
  if (host_words_ == nullptr) return -1;
  const int status = static_cast<const volatile int*>(host_words_)[1];
  return status > 0 ? status - 1 : -1;
}

void PeerAllReduce::abort() {
  if (host_words_ != nullptr) static_cast<volatile int*>(host_words_)[0] = 1;
}

}  // namespace tandem::dist::internal
