// The NCCL process group: collectives on cuda tensors of this rank's GPU. Each collective is
// ordered after the caller's current stream by an event, runs on a high-priority communication
// stream, and records a completion event; the host never blocks. The communicator is created
// non-blocking so that it can be aborted: a watchdog thread completes Works (releasing their
// tensors), polls ncclCommGetAsyncError, and aborts the communicator when a collective fails or
// runs past the timeout, so no kernel spins forever on a peer that is gone.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "tandem/core/cuda/runtime.h"
#include "tandem/dist/check.h"
#include "tandem/dist/internal.h"

namespace tandem::dist::internal {

namespace {

const std::string kBackend = "nccl";

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8:
    case DType::boolean: return ncclUint8;
  }
  return ncclUint8;
}

ncclDataType_t reduce_type(DType dtype, ReduceOp op, const char* name) {
  TANDEM_CHECK_AS(TypeError, dtype != DType::boolean || op == ReduceOp::max || op == ReduceOp::min, "nccl ", name,
                  ": bool tensors reduce with max (any) or min (all), not ", reduce_op_name(op));
  return nccl_type(dtype);
}

// `size`: the communicator's ranks. With one rank, avg is the identity and goes to NCCL as sum: NCCL
// 2.28's one-rank path for ncclAvg on floats (a pre-multiplying kernel) leaves the last elements
// unwritten when the count does not split evenly over its blocks (seen: 4597 f64 values, the last
// one untouched), while its one-rank sum is a plain copy.
ncclRedOp_t nccl_op(ReduceOp op, int size) {
  if (size == 1 && op == ReduceOp::avg) return ncclSum;
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

std::string nccl_text(ncclResult_t status, ncclComm_t comm) {
  std::string text = ncclGetErrorString(status);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') text += std::string(" (") + last + ")";
  return text;
}

// One per device, like the compute stream, and above it in priority so that gradients travel while
// the backward pass keeps the GPU busy.
cudaStream_t communication_stream(int device) {
  static std::mutex mutex;
  static auto* streams = new std::unordered_map<int, cudaStream_t>();
  std::lock_guard<std::mutex> lock(mutex);
  cudaStream_t& stream = (*streams)[device];
  if (stream == nullptr) {
    cuda::DeviceGuard guard(device);
    int least = 0, greatest = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    TANDEM_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  }
  return stream;
}

struct NcclWorkState {
  const char* op = "";
  size_t bytes = 0;
  cudaEvent_t start = nullptr, end = nullptr;  // on the communication stream; back to the pool once completed
  std::vector<Tensor> tensors;                 // alive until the collective completed
  Clock::time_point enqueued = Clock::now();
  double elapsed_ms = -1;
  bool completed = false;
  bool failed = false;  // wait() raises `error`
  std::string error;
};

// The group's state, shared with its Works. Members and methods need `mutex` held.
class NcclCore : public std::enable_shared_from_this<NcclCore> {
 public:
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  int rank = 0, size = 1, device = 0;
  double timeout = 600;
  cudaStream_t stream = nullptr;  // the communication stream
  cudaEvent_t ready = nullptr;    // recorded on the caller's stream before each collective
  std::vector<cudaEvent_t> spare_events;
  std::vector<std::shared_ptr<NcclWorkState>> in_flight;  // launched and not completed, failed ones too
  std::string failure;                                    // the group is unusable once set
  bool shut_down = false;
  bool stop = false;
  std::mutex mutex;
  std::condition_variable wake;
  std::thread watchdog;

  ~NcclCore() {
    if (comm != nullptr) ncclCommAbort(comm);  // never shut down (creation failed half-way)
    for (cudaEvent_t e : spare_events) cudaEventDestroy(e);
    for (auto& w : in_flight) {
      if (w->start) cudaEventDestroy(w->start);
      if (w->end) cudaEventDestroy(w->end);
    }
    if (ready) cudaEventDestroy(ready);
  }

  std::string describe(const NcclWorkState& w) const {
    return internal::describe(rank, kBackend, w.op, w.bytes);
  }

  void check_usable(const char* op, size_t bytes) const {
    if (shut_down || stop) {
      TANDEM_THROW(BackendError, internal::describe(rank, kBackend, op, bytes),
                   ": the group was shut down (dist::finalize ran)");
    }
    if (!failure.empty()) {
      TANDEM_THROW(BackendError, internal::describe(rank, kBackend, op, bytes),
                   " refused: the group failed earlier: ", failure);
    }
  }

  [[noreturn]] void raise(const NcclWorkState& w) const { TANDEM_THROW(BackendError, w.error); }

  cudaEvent_t take_event() {
    if (!spare_events.empty()) {
      cudaEvent_t e = spare_events.back();
      spare_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    TANDEM_CUDA_CHECK(cudaEventCreate(&e));  // with timing: elapsed_ms()
    return e;
  }

  void complete(NcclWorkState& w) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, w.start, w.end) == cudaSuccess) w.elapsed_ms = ms;
    cudaGetLastError();
    spare_events.push_back(w.start);
    spare_events.push_back(w.end);
    w.start = w.end = nullptr;
    w.tensors.clear();
    w.completed = true;
  }

  // Marks the group failed, fails every pending Work, and aborts the communicator.
  void fail(const std::string& message, const NcclWorkState* culprit) {
    if (!failure.empty()) return;
    failure = message;
    report_failure(message + "; aborting the NCCL communicator");
    for (auto& w : in_flight) {
      if (w->completed || w->failed) continue;
      w->failed = true;
      w->error = w.get() == culprit ? message
                                    : ::tandem::detail::concat(describe(*w), " was pending for ",
                                                               format_seconds(seconds_since(w->enqueued)),
                                                               " when the group failed: ", message);
    }
    if (comm != nullptr) {
      int previous = 0;
      bool switched = cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device) == cudaSuccess;
      ncclCommAbort(comm);  // blocking; its kernels stop, so the streams waiting on them go on
      if (switched) cudaSetDevice(previous);
      comm = nullptr;
    }
  }

  // Completes the Works whose events have passed and forgets them.
  void sweep() {
    for (auto& w : in_flight) {
      if (w->completed) continue;
      cudaError_t status = cudaEventQuery(w->end);
      if (status == cudaSuccess) {
        complete(*w);
      } else if (status != cudaErrorNotReady) {
        cudaGetLastError();
        fail(::tandem::detail::concat(describe(*w), ": CUDA error ", cudaGetErrorName(status), ": ",
                                      cudaGetErrorString(status)),
             w.get());
      }
    }
    in_flight.erase(std::remove_if(in_flight.begin(), in_flight.end(), [](const auto& w) { return w->completed; }),
                    in_flight.end());
  }

  // The watchdog's round: NCCL's asynchronous errors, completions, timeouts.
  void check() {
    if (comm != nullptr && failure.empty()) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t status = ncclCommGetAsyncError(comm, &state);
      if (status != ncclSuccess) state = status;
      if (state != ncclSuccess && state != ncclInProgress) {
        NcclWorkState* oldest = nullptr;
        for (auto& w : in_flight) {
          if (!w->completed) {
            oldest = w.get();
            break;
          }
        }
        std::string what =
            oldest != nullptr
                ? ::tandem::detail::concat(describe(*oldest), " failed after ",
                                           format_seconds(seconds_since(oldest->enqueued)))
                : ::tandem::detail::concat("rank ", rank, ": the nccl communicator failed");
        fail(::tandem::detail::concat(what, ": NCCL reported ", nccl_text(state, comm),
                                      " (another rank probably died, or its network failed)"),
             oldest);
      }
    }
    sweep();
    if (!failure.empty()) return;
    for (auto& w : in_flight) {
      double waited = seconds_since(w->enqueued);
      if (!w->completed && !w->failed && waited > timeout) {
        fail(::tandem::detail::concat(describe(*w), " on cuda:", device, " timed out after ", format_seconds(waited),
                                      " (timeout ", format_seconds(timeout),
                                      "): another rank probably died, hangs, or issued a different collective (every "
                                      "rank must issue the same collectives in the same order)"),
             w.get());
        return;
      }
    }
  }

  void watch() {
    auto poll = std::chrono::duration<double>(std::clamp(timeout / 20, 0.001, 0.1));
    std::unique_lock<std::mutex> lock(mutex);
    while (!stop) {
      if (in_flight.empty()) {
        wake.wait(lock, [&] { return stop || !in_flight.empty(); });
      } else {
        wake.wait_for(lock, poll, [&] { return stop; });
      }
      if (stop) break;
      try {
        check();
      } catch (const std::exception& e) {
        report_failure(std::string("nccl watchdog: ") + e.what());
      }
    }
  }

  // Polls a non-blocking communicator until the call in progress has finished, for at most `limit`
  // seconds since `since` (then answers ncclInProgress).
  ncclResult_t await_comm(Clock::time_point since, double limit) {
    int sleep_us = 0;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t status = ncclCommGetAsyncError(comm, &state);
      if (status != ncclSuccess) return status;
      if (state != ncclInProgress) return state;
      if (seconds_since(since) > limit) return ncclInProgress;
      sleep_us = std::min(std::max(2 * sleep_us, 1), 100);
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    }
  }

  // Orders the collective after the caller's stream, enqueues it on the communication stream, and
  // tracks it. `enqueue` makes the NCCL call(s) and returns their status.
  std::shared_ptr<Work> launch(const std::shared_ptr<NcclWorkState>& w, const std::function<ncclResult_t()>& enqueue) {
    check_usable(w->op, w->bytes);
    cuda::DeviceGuard guard(device);
    cuda::NvtxRange range(w->op);
    cudaStream_t caller = cuda::current_stream(device);
    w->start = take_event();
    w->end = take_event();
    TANDEM_CUDA_CHECK(cudaEventRecord(ready, caller));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
    TANDEM_CUDA_CHECK(cudaEventRecord(w->start, stream));
    w->enqueued = Clock::now();
    ncclResult_t status = enqueue();
    if (status == ncclInProgress) status = await_comm(w->enqueued, timeout);
    if (status != ncclSuccess) {
      in_flight.push_back(w);  // fail() marks it and aborts
      fail(status == ncclInProgress
               ? ::tandem::detail::concat(describe(*w), " on cuda:", device, " timed out after ",
                                          format_seconds(seconds_since(w->enqueued)), " (timeout ",
                                          format_seconds(timeout),
                                          ") while NCCL was still launching it (connecting to its peers): another "
                                          "rank probably died, hangs, or issued a different collective")
               : ::tandem::detail::concat(describe(*w), ": NCCL error ", nccl_text(status, comm)),
           w.get());
      raise(*w);
    }
    TANDEM_CUDA_CHECK(cudaEventRecord(w->end, stream));
    sweep();
    in_flight.push_back(w);
    wake.notify_one();
    return make_work(w);
  }

  std::shared_ptr<Work> make_work(const std::shared_ptr<NcclWorkState>& w);
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCore> core, std::shared_ptr<NcclWorkState> state)
      : core_(std::move(core)), state_(std::move(state)) {}

  void wait() override {
    std::lock_guard<std::mutex> lock(core_->mutex);
    if (state_->failed) core_->raise(*state_);
    if (state_->completed) return;
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(core_->device), state_->end, 0));
  }

  void synchronize() override {
    int sleep_us = 0;
    std::unique_lock<std::mutex> lock(core_->mutex);
    for (;;) {
      if (poll()) return;
      lock.unlock();
      sleep_us = std::min(std::max(2 * sleep_us, 2), 200);
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      lock.lock();
    }
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(core_->mutex);
    if (state_->failed) return true;
    return poll();
  }

  double elapsed_ms() override {
    std::lock_guard<std::mutex> lock(core_->mutex);
    if (state_->failed || !poll()) return -1.0;
    return state_->elapsed_ms;
  }

 private:
  // With the lock held: true once completed; raises once failed.
  bool poll() {
    if (state_->failed) core_->raise(*state_);
    if (state_->completed) return true;
    cudaError_t status = cudaEventQuery(state_->end);
    if (status == cudaErrorNotReady) return false;
    if (status != cudaSuccess) {
      cudaGetLastError();
      core_->fail(::tandem::detail::concat(core_->describe(*state_), ": CUDA error ", cudaGetErrorName(status), ": ",
                                           cudaGetErrorString(status)),
                  state_.get());
      core_->raise(*state_);
    }
    core_->complete(*state_);
    return true;
  }

  std::shared_ptr<NcclCore> core_;
  std::shared_ptr<NcclWorkState> state_;
};

std::shared_ptr<Work> NcclCore::make_work(const std::shared_ptr<NcclWorkState>& w) {
  return std::make_shared<NcclWork>(shared_from_this(), w);
}

std::shared_ptr<NcclWorkState> new_state(const char* op, size_t bytes, std::vector<Tensor> tensors) {
  auto w = std::make_shared<NcclWorkState>();
  w->op = op;
  w->bytes = bytes;
  w->tensors = std::move(tensors);
  return w;
}

class NcclGroup final : public ProcessGroup {
 public:
  explicit NcclGroup(std::shared_ptr<NcclCore> core) : core_(std::move(core)) {
    {
      // Allocated for the communication stream: its block is reused in that stream's order.
      cuda::StreamGuard stream_guard(core_->device, core_->stream);
      barrier_tensor_ = zeros({1}, TensorOptions(DType::f32, device()));
    }
    core_->watchdog = std::thread([core = core_.get()] { core->watch(); });
  }
  ~NcclGroup() override { shutdown(); }

  int rank() const override { return core_->rank; }
  int size() const override { return core_->size; }
  std::string backend() const override { return kBackend; }

  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op) override {
    return all_reduce(std::vector<Tensor>{tensor}, op);
  }

  std::shared_ptr<Work> all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) override {
    const char* name = "all_reduce";
    TANDEM_CHECK_AS(ValueError, !tensors.empty(), "nccl all_reduce: no tensors given");
    size_t bytes = 0;
    for (const Tensor& t : tensors) {
      check_tensor(t, device(), kBackend, name, "tensor");
      reduce_type(t.dtype(), op, name);
      bytes += t.nbytes();
    }
    check_disjoint(tensors, kBackend, name);
    auto w = new_state(name, bytes, tensors);
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->launch(w, [&] {
      ncclComm_t comm = core_->comm;
      if (tensors.size() == 1) {
        const Tensor& t = tensors[0];
        return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), nccl_type(t.dtype()),
                             nccl_op(op, core_->size), comm, core_->stream);
      }
      ncclResult_t first_error = ncclGroupStart();
      if (first_error != ncclSuccess) return first_error;
      for (const Tensor& t : tensors) {
        ncclResult_t status = ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                                            nccl_type(t.dtype()), nccl_op(op, core_->size), comm, core_->stream);
        if (status != ncclSuccess && status != ncclInProgress && first_error == ncclSuccess) first_error = status;
      }
      ncclResult_t end = ncclGroupEnd();  // always closes the group, also after an error
      return first_error != ncclSuccess ? first_error : end;
    });
  }

  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override {
    check_tensor(tensor, device(), kBackend, "broadcast", "tensor");
    check_root(root, core_->size, kBackend);
    auto w = new_state("broadcast", tensor.nbytes(), {tensor});
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->launch(w, [&] {
      return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                           nccl_type(tensor.dtype()), root, core_->comm, core_->stream);
    });
  }

  std::shared_ptr<Work> all_gather(const Tensor& output, const Tensor& input) override {
    const char* name = "all_gather";
    check_tensor(output, device(), kBackend, name, "output");
    check_tensor(input, device(), kBackend, name, "input");
    check_same_dtype(output, input, kBackend, name);
    TANDEM_CHECK_AS(ValueError, output.numel() == core_->size * input.numel(), "nccl all_gather: output has ",
                    output.numel(), " elements, but ", core_->size, " ranks x input's ", input.numel(), " make ",
                    core_->size * input.numel());
    is_rank_slice(output, input, core_->rank, kBackend, name);  // NCCL does the in-place layout itself
    auto w = new_state(name, output.nbytes(), {output, input});
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->launch(w, [&] {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), static_cast<size_t>(input.numel()),
                           nccl_type(input.dtype()), core_->comm, core_->stream);
    });
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    const char* name = "reduce_scatter";
    check_tensor(output, device(), kBackend, name, "output");
    check_tensor(input, device(), kBackend, name, "input");
    check_same_dtype(output, input, kBackend, name);
    TANDEM_CHECK_AS(ValueError, input.numel() == core_->size * output.numel(), "nccl reduce_scatter: input has ",
                    input.numel(), " elements, but ", core_->size, " ranks x output's ", output.numel(), " make ",
                    core_->size * output.numel());
    reduce_type(input.dtype(), op, name);
    is_rank_slice(input, output, core_->rank, kBackend, name);
    auto w = new_state(name, input.nbytes(), {output, input});
    std::lock_guard<std::mutex> lock(core_->mutex);
    return core_->launch(w, [&] {
      return ncclReduceScatter(input.data_ptr(), output.data_ptr(), static_cast<size_t>(output.numel()),
                               nccl_type(input.dtype()), nccl_op(op, core_->size), core_->comm, core_->stream);
    });
  }

  void barrier() override {
    std::shared_ptr<NcclWorkState> w = new_state("barrier", barrier_tensor_.nbytes(), {barrier_tensor_});
    std::shared_ptr<Work> work;
    {
      std::lock_guard<std::mutex> lock(core_->mutex);
      work = core_->launch(w, [&] {
        return ncclAllReduce(barrier_tensor_.data_ptr(), barrier_tensor_.data_ptr(), 1, ncclFloat32, ncclSum,
                             core_->comm, core_->stream);
      });
    }
    work->synchronize();
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(core_->mutex);
    core_->fail(::tandem::detail::concat("rank ", core_->rank, ": the nccl group was aborted: ", reason), nullptr);
  }

  // Never throws.
  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(core_->mutex);
      if (core_->stop) return;
      core_->stop = true;
    }
    core_->wake.notify_all();
    if (core_->watchdog.joinable()) core_->watchdog.join();

    std::unique_lock<std::mutex> lock(core_->mutex);
    if (core_->comm != nullptr) {
      double limit = std::min(core_->timeout, 10.0);
      auto start = Clock::now();
      for (;;) {
        core_->sweep();
        if (core_->in_flight.empty() || seconds_since(start) > limit) break;
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        lock.lock();
      }
      int previous = 0;
      bool switched = cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(core_->device) == cudaSuccess;
      bool finalized = false;
      if (core_->in_flight.empty()) {
        ncclResult_t status = ncclCommFinalize(core_->comm);
        if (status == ncclInProgress) status = core_->await_comm(Clock::now(), limit);
        finalized = status == ncclSuccess;
      }
      if (finalized) {
        ncclCommDestroy(core_->comm);
      } else {
        report_failure(::tandem::detail::concat("rank ", core_->rank,
                                                ": dist::finalize: nccl collectives still pending; aborting the "
                                                "communicator"));
        ncclCommAbort(core_->comm);
      }
      if (switched) cudaSetDevice(previous);
      core_->comm = nullptr;
    }
    core_->shut_down = true;
  }

 private:
  Device device() const { return Device(DeviceType::cuda, core_->device); }

  std::shared_ptr<NcclCore> core_;
  Tensor barrier_tensor_;  // (1,) f32
};

}  // namespace

bool nccl_is_built() { return true; }

std::shared_ptr<ProcessGroup> make_nccl_group(ProcessGroup& cpu_group, int device, double timeout_seconds) {
  int rank = cpu_group.rank(), size = cpu_group.size();
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  Tensor id_bytes = zeros({static_cast<int64_t>(sizeof(id))}, DType::u8);  // travels over MPI
  if (rank == 0) {
    TANDEM_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(id_bytes.data_ptr(), &id, sizeof(id));
  }
  cpu_group.broadcast(id_bytes, 0)->wait();
  std::memcpy(&id, id_bytes.data_ptr(), sizeof(id));

  cuda::DeviceGuard guard(device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that the communicator can be aborted while a collective hangs
  ncclComm_t comm = nullptr;
  auto start = Clock::now();
  TANDEM_NCCL_CHECK_ASYNC(ncclCommInitRankConfig(&comm, size, id, rank, &config));
  // Creating a communicator can take seconds on a busy machine (it sets up every link): it gets
  // at least a minute, whatever short timeout the collectives have.
  const double init_timeout = std::max(timeout_seconds, 60.0);
  ncclResult_t state = ncclInProgress;
  while (state == ncclInProgress && seconds_since(start) <= init_timeout) {
    ncclResult_t status = ncclCommGetAsyncError(comm, &state);
    if (status != ncclSuccess) state = status;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (state != ncclSuccess) {
    std::string text = state == ncclInProgress ? "timed out after " + format_seconds(seconds_since(start))
                                               : nccl_text(state, comm);
    ncclCommAbort(comm);
    TANDEM_THROW(BackendError, "rank ", rank, ": creating the NCCL communicator of ", size, " ranks on cuda:", device,
                 " failed: ", text);
  }

  auto core = std::make_shared<NcclCore>();
  core->comm = comm;
  core->rank = rank;
  core->size = size;
  core->device = device;
  core->timeout = timeout_seconds;
  core->stream = communication_stream(device);
  TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&core->ready, cudaEventDisableTiming));
  return std::make_shared<NcclGroup>(core);
}

void nccl_shutdown_group(ProcessGroup& group) {
  if (auto* g = dynamic_cast<NcclGroup*>(&group)) g->shutdown();
}

}  // namespace tandem::dist::internal
