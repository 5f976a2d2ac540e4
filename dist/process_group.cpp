// init(), world(), finalize(), and the helpers both backends share.
#include "tandem/dist/process_group.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <utility>

#include "tandem/core/cuda_api.h"
#include "tandem/dist/flight_recorder.h"
#include "tandem/dist/internal.h"

namespace tandem::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

namespace internal {

std::string format_bytes(size_t n) {
  std::ostringstream out;
  out << n << " bytes";
  if (n >= (size_t(1) << 30)) {
    out << " (" << std::setprecision(3) << static_cast<double>(n) / (size_t(1) << 30) << " GiB)";
  } else if (n >= (size_t(1) << 20)) {
    out << " (" << std::setprecision(3) << static_cast<double>(n) / (size_t(1) << 20) << " MiB)";
  }
  return out.str();
}

std::string format_seconds(double s) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(s < 10 ? 2 : 1) << s << " s";
  return out.str();
}

std::string describe(int rank, const std::string& backend, const char* op, size_t bytes) {
  return ::tandem::detail::concat("rank ", rank, ": ", backend, " ", op, " of ", format_bytes(bytes));
}

void report_failure(const std::string& message) {
  std::fprintf(stderr, "[tandem] %s\n", message.c_str());
  std::fflush(stderr);
}

void check_tensor(const Tensor& t, const Device& device, const std::string& backend, const char* op,
                  const char* name) {
  TANDEM_CHECK_AS(ValueError, t.defined(), backend, " ", op, ": ", name, " is an undefined tensor");
  TANDEM_CHECK_AS(DeviceError, t.device() == device, backend, " ", op, ": ", name, " is on ", t.device(),
                  " but this group works on ", device,
                  device.is_cpu() ? " (use the NCCL group, World::group_for, for cuda tensors)"
                                  : " (use World::group_for to pick the group of a tensor's device)");
  TANDEM_CHECK_AS(ValueError, t.is_contiguous(), backend, " ", op, ": ", name, " ", shape_str(t.shape()),
                  " is not contiguous (collectives work in place on contiguous memory; make a contiguous copy)");
}

void check_disjoint(const std::vector<Tensor>& tensors, const std::string& backend, const char* op) {
  if (tensors.size() < 2) return;
  std::vector<std::pair<const char*, const char*>> ranges;
  for (const Tensor& t : tensors) {
    auto* p = static_cast<const char*>(t.data_ptr());
    if (t.nbytes() > 0) ranges.emplace_back(p, p + t.nbytes());
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    TANDEM_CHECK_AS(ValueError, ranges[i].first >= ranges[i - 1].second, backend, " ", op,
                    ": two of the tensors share memory (each must be reduced once)");
  }
}

bool is_rank_slice(const Tensor& whole, const Tensor& part, int rank, const std::string& backend, const char* op) {
  auto* w = static_cast<const char*>(whole.data_ptr());
  auto* p = static_cast<const char*>(part.data_ptr());
  if (p == w + static_cast<size_t>(rank) * part.nbytes()) return true;
  bool overlap = p < w + whole.nbytes() && w < p + part.nbytes();
  TANDEM_CHECK_AS(ValueError, !overlap || part.nbytes() == 0, backend, " ", op,
                  ": input and output overlap; the only overlap allowed is the in-place layout, where the (n,) "
                  "tensor is the (size * n,) tensor's slice at rank * n");
  return false;
}

void check_root(int root, int size, const std::string& backend) {
  TANDEM_CHECK_AS(ValueError, root >= 0 && root < size, backend, " broadcast: root ", root,
                  " is not a rank of this group (size ", size, ")");
}

void check_reducible(DType dtype, ReduceOp op, const std::string& backend, const char* name) {
  TANDEM_CHECK_AS(TypeError, dtype != DType::boolean || op == ReduceOp::max || op == ReduceOp::min, backend, " ",
                  name, ": bool tensors reduce with max (any) or min (all), not ", reduce_op_name(op));
}

namespace {
// `whole` (size * n,) and `part` (n,): the shared checks of all_gather and reduce_scatter.
bool check_whole_and_part(const Tensor& whole, const Tensor& part, const char* whole_name, const char* part_name,
                          int rank, int size, const Device& device, const std::string& backend, const char* name) {
  check_tensor(whole, device, backend, name, whole_name);
  check_tensor(part, device, backend, name, part_name);
  TANDEM_CHECK_AS(TypeError, whole.dtype() == part.dtype(), backend, " ", name, ": ", whole_name, " is ",
                  dtype_name(whole.dtype()), " but ", part_name, " is ", dtype_name(part.dtype()));
  TANDEM_CHECK_AS(ValueError, whole.numel() == size * part.numel(), backend, " ", name, ": ", whole_name, " has ",
                  whole.numel(), " elements, but ", size, " ranks x ", part_name, "'s ", part.numel(), " make ",
                  size * part.numel());
  return is_rank_slice(whole, part, rank, backend, name);
}
}  // namespace

bool check_all_gather(const Tensor& output, const Tensor& input, int rank, int size, const Device& device,
                      const std::string& backend) {
  return check_whole_and_part(output, input, "output", "input", rank, size, device, backend, "all_gather");
}

bool check_reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op, int rank, int size,
                          const Device& device, const std::string& backend) {
  check_reducible(input.dtype(), op, backend, "reduce_scatter");
  return check_whole_and_part(input, output, "input", "output", rank, size, device, backend, "reduce_scatter");
}

std::vector<int64_t> block_offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> offsets(counts.size(), 0);
  for (size_t r = 1; r < counts.size(); ++r) offsets[r] = offsets[r - 1] + counts[r - 1];
  return offsets;
}

bool check_blocks(const Tensor& whole, const Tensor& part, const std::vector<int64_t>& counts, int rank, int size,
                  const Device& device, const std::string& backend, const char* name) {
  check_tensor(whole, device, backend, name, "whole");
  check_tensor(part, device, backend, name, "part");
  TANDEM_CHECK_AS(TypeError, whole.dtype() == part.dtype(), backend, " ", name, ": whole is ",
                  dtype_name(whole.dtype()), " but part is ", dtype_name(part.dtype()));
  TANDEM_CHECK_AS(ValueError, counts.size() == static_cast<size_t>(size), backend, " ", name, ": ", counts.size(),
                  " block sizes given for a group of ", size, " ranks (one per rank expected)");
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    TANDEM_CHECK_AS(ValueError, counts[r] >= 0, backend, " ", name, ": rank ", r, "'s block size is ", counts[r],
                    "; expected 0 or more elements");
    total += counts[r];
  }
  TANDEM_CHECK_AS(ValueError, whole.numel() == total, backend, " ", name, ": whole has ", whole.numel(),
                  " elements, but the blocks add up to ", total);
  TANDEM_CHECK_AS(ValueError, part.numel() == counts[rank], backend, " ", name, ": part has ", part.numel(),
                  " elements, but rank ", rank, "'s block has ", counts[rank]);
  auto* w = static_cast<const char*>(whole.data_ptr());
  auto* p = static_cast<const char*>(part.data_ptr());
  const size_t element = dtype_size(whole.dtype());
  if (part.numel() > 0 && p == w + static_cast<size_t>(block_offsets(counts)[rank]) * element) return true;
  bool overlap = part.numel() > 0 && p < w + whole.nbytes() && w < p + part.nbytes();
  TANDEM_CHECK_AS(ValueError, !overlap, backend, " ", name,
                  ": part and whole overlap; the only overlap allowed is the in-place layout, where part is "
                  "whole's block of this rank");
  return false;
}

}  // namespace internal

namespace {

struct State {
  std::mutex mutex;
  bool initialized = false;
  bool finalized = false;
  World world;
  std::string no_gpu_group_reason;  // why world.gpu_group is null although the device is a GPU
};

State& state() {
  static auto* s = new State();  // never destroyed: finalize runs from atexit
  return *s;
}

double timeout_from_env(double fallback) {
  const char* env = std::getenv("TANDEM_DIST_TIMEOUT");
  if (env == nullptr || env[0] == '\0') return fallback;
  char* end = nullptr;
  double value = std::strtod(env, &end);
  TANDEM_CHECK_AS(ValueError, end != env && *end == '\0' && value > 0, "TANDEM_DIST_TIMEOUT=\"", env,
                  "\" is not a positive number of seconds");
  return value;
}

// $NAME: "1" or "0" overrides `fallback` (an InitOptions flag); `meaning` says what 1 does.
bool flag_from_env(const char* name, bool fallback, const char* meaning) {
  const char* env = std::getenv(name);
  if (env == nullptr || env[0] == '\0') return fallback;
  std::string value(env);
  TANDEM_CHECK_AS(ValueError, value == "1" || value == "0", name, "=\"", value, "\" must be 1 (", meaning, ") or 0");
  return value == "1";
}

// $TANDEM_PEER_ALL_REDUCE_MAX_BYTES: a count of bytes (0 or more) overriding `fallback`.
int64_t peer_bytes_from_env(int64_t fallback) {
  const char* env = std::getenv("TANDEM_PEER_ALL_REDUCE_MAX_BYTES");
  if (env == nullptr || env[0] == '\0') return fallback;
  char* end = nullptr;
  long long value = std::strtoll(env, &end, 10);
  TANDEM_CHECK_AS(ValueError, end != env && *end == '\0' && value >= 0, "TANDEM_PEER_ALL_REDUCE_MAX_BYTES=\"", env,
                  "\" is not a count of bytes (0 or more; 0 sends every all-reduce to NCCL)");
  return value;
}

void finalize_at_exit() { finalize(); }

}  // namespace

namespace {
thread_local int on_current_stream_depth = 0;  // CollectivesOnCurrentStream scopes alive on this thread
thread_local int timed_depth = 0;              // TimedCollectives scopes alive on this thread
}  // namespace

CollectivesOnCurrentStream::CollectivesOnCurrentStream() { ++on_current_stream_depth; }
CollectivesOnCurrentStream::~CollectivesOnCurrentStream() { --on_current_stream_depth; }

TimedCollectives::TimedCollectives() { ++timed_depth; }
TimedCollectives::~TimedCollectives() { --timed_depth; }

namespace internal {
bool collectives_on_current_stream() { return on_current_stream_depth > 0; }
bool collectives_timed() { return timed_depth > 0; }
}  // namespace internal

ProcessGroup& World::group_for(const Device& d) const {
  if (d.is_cpu()) {
    TANDEM_CHECK_AS(DeviceError, cpu_group != nullptr, "dist: no process group for cpu tensors (call dist::init())");
    return *cpu_group;
  }
  TANDEM_CHECK_AS(DeviceError, device.is_cuda(), "dist: a ", d, " tensor, but this rank runs on ", device,
                  " (dist::init found no CUDA device, or was asked not to use one)");
  TANDEM_CHECK_AS(DeviceError, d == device, "dist: a ", d, " tensor, but rank ", rank, " is bound to ", device,
                  " (each rank communicates from its own GPU)");
  if (gpu_group == nullptr) {
    const std::string& reason = state().no_gpu_group_reason;
    TANDEM_THROW(DeviceError, "dist: no NCCL process group for ", d, " tensors: ",
                 reason.empty() ? std::string("dist::init() made none") : reason);
  }
  return *gpu_group;
}

const World& init(const InitOptions& options) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.initialized) return s.world;
  TANDEM_CHECK_AS(ValueError, !s.finalized,
                  "dist::init: dist::finalize() already ran, and MPI cannot be initialised twice in one process");
  double timeout = timeout_from_env(options.timeout_seconds);
  const bool launch_alone = flag_from_env("TANDEM_NCCL_LAUNCH_ALONE", options.nccl_launch_alone,
                                          "launch NCCL collectives in a world of one too");
  const bool nonblocking = flag_from_env("TANDEM_NCCL_NONBLOCKING", options.nccl_nonblocking,
                                         "a non-blocking NCCL communicator");
  const bool time_collectives = flag_from_env("TANDEM_TIME_COLLECTIVES", options.time_collectives,
                                              "every NCCL collective timed on the GPU");
  const bool high_priority = flag_from_env("TANDEM_COMM_STREAM_HIGH_PRIORITY", options.comm_stream_high_priority,
                                           "the communication stream at the highest priority");
  TANDEM_CHECK_AS(ValueError, timeout > 0, "dist::init: timeout_seconds must be positive, got ", timeout);
  const int64_t peer_bytes = peer_bytes_from_env(options.peer_all_reduce_max_bytes);
  TANDEM_CHECK_AS(ValueError, peer_bytes >= 0, "dist::init: peer_all_reduce_max_bytes must be 0 or more, got ",
                  peer_bytes);
  const char* peer_env = std::getenv("TANDEM_PEER_ALL_REDUCE_MAX_BYTES");
  const bool report_peer_path = peer_env != nullptr && peer_env[0] != '\0' && peer_bytes > 0;

  const char* dump_env = std::getenv("TANDEM_DIST_DUMP_DIR");
  internal::set_dump_directory(!options.dump_dir.empty() ? options.dump_dir : dump_env != nullptr ? dump_env : "");

  internal::MpiWorld mpi = internal::mpi_init(timeout);
  World w;
  w.timeout_seconds = timeout;
  w.rank = mpi.rank;
  w.size = mpi.size;
  w.local_rank = mpi.local_rank;
  w.local_size = mpi.local_size;
  w.cpu_group = mpi.group;

  int devices = options.use_gpu ? cuda::device_count() : 0;
  if (devices > 0) {
    int index = w.local_rank % devices;
    cuda::set_device(index);  // the process's current device from now on
    w.device = Device(DeviceType::cuda, index);
    if (!internal::nccl_is_built()) {
      s.no_gpu_group_reason = "tandem was built without NCCL (reconfigure with -DTANDEM_WITH_NCCL=ON)";
    } else if (w.local_size > devices) {
      // NCCL refuses two ranks on one GPU; every rank of the node sees the same counts, so all skip.
      s.no_gpu_group_reason = detail::concat(w.local_size, " ranks share ", devices,
                                             " GPU(s) on this node, and NCCL needs a GPU per rank (run at most ",
                                             devices, " ranks per node)");
      if (w.local_rank == 0) internal::report_failure("dist::init: no NCCL group: " + s.no_gpu_group_reason);
    } else {
      w.gpu_group = internal::make_nccl_group(*w.cpu_group, index,
                                              {timeout, launch_alone, nonblocking, time_collectives, high_priority,
                                               w.local_size == w.size, peer_bytes, report_peer_path});
    }
  }
  s.world = w;
  s.initialized = true;
  // Registered after the CUDA runtime and MPI have started, so it runs before their own teardown.
  static bool registered = false;
  if (!registered) {
    std::atexit(finalize_at_exit);
    registered = true;
  }
  return s.world;
}

bool is_initialized() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.initialized;
}

const World& world() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  TANDEM_CHECK_AS(ValueError, s.initialized,
                  s.finalized ? "dist::world(): dist::finalize() already ran"
                              : "dist::world(): call dist::init() first");
  return s.world;
}

void finalize() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.initialized) return;
  s.initialized = false;
  s.finalized = true;
  // Never throws: it runs from atexit, and after failures.
  try {
    if (s.world.gpu_group) internal::nccl_shutdown_group(*s.world.gpu_group);
  } catch (const std::exception& e) {
    internal::report_failure(std::string("dist::finalize: shutting down the NCCL group: ") + e.what());
  }
  try {
    if (s.world.cpu_group) internal::mpi_shutdown_group(*s.world.cpu_group);
    internal::mpi_finalize();
  } catch (const std::exception& e) {
    internal::report_failure(std::string("dist::finalize: shutting down MPI: ") + e.what());
  }
  s.world = World();
}

}  // namespace tandem::dist
