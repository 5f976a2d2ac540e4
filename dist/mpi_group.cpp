// The MPI process group: collectives on cpu tensors over a duplicate of MPI_COMM_WORLD, whose
// error handler returns codes instead of aborting. Every collective is non-blocking; a watchdog
// thread drives MPI's progress (Open MPI advances non-blocking collectives only inside MPI calls),
// completes requests, and fails the group when one runs past the timeout.
//
// Every MPI call tandem makes holds one process-wide mutex, so MPI_THREAD_SERIALIZED suffices.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "tandem/dist/check.h"
#include "tandem/dist/internal.h"

namespace tandem::dist::internal {

namespace {

const std::string kBackend = "mpi";

std::mutex& mpi_mutex() {
  static auto* m = new std::mutex();  // never destroyed: used from atexit
  return *m;
}
bool mpi_initialized_here = false;
bool unclean_shutdown = false;  // MPI_Finalize would wait forever: leave without it

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

// The MPI type that carries `dtype` unchanged (16-bit floats as their bits, bool as bytes).
MPI_Datatype transfer_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8:
    case DType::boolean: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Datatype reduce_type(DType dtype, ReduceOp op, const char* name) {
  TANDEM_CHECK_AS(TypeError, dtype != DType::boolean || op == ReduceOp::max || op == ReduceOp::min, "mpi ", name,
                  ": bool tensors reduce with max (any) or min (all), not ", reduce_op_name(op));
  return transfer_type(dtype);
}

// MPI has no 16-bit float types: f16 and bf16 travel as 16-bit integers and reduce through
// user-defined operations that widen each pair of elements to f32, combine them and round back
// (what NCCL does for them too).
template <typename H, ReduceOp kOp>
void combine_16bit(void* in, void* inout, int* len, MPI_Datatype*) {
  const H* a = static_cast<const H*>(in);  // (len,)
  H* b = static_cast<H*>(inout);           // (len,)
  for (int i = 0; i < *len; ++i) {
    const float x = a[i], y = b[i];
    float r = x + y;
    if (kOp == ReduceOp::max) r = (x > y || x != x) ? x : y;  // NaN wins, like NCCL
    if (kOp == ReduceOp::min) r = (x < y || x != x) ? x : y;
    b[i] = H(r);
  }
}

// Made at the first use (MPI is initialised by then), under mpi_mutex() like every MPI call.
MPI_Op op_16bit(DType dtype, ReduceOp op) {
  static MPI_Op ops[2][3] = {{MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}, {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL}};
  static MPI_User_function* const functions[2][3] = {
      {combine_16bit<Half, ReduceOp::sum>, combine_16bit<Half, ReduceOp::max>, combine_16bit<Half, ReduceOp::min>},
      {combine_16bit<BFloat16, ReduceOp::sum>, combine_16bit<BFloat16, ReduceOp::max>,
       combine_16bit<BFloat16, ReduceOp::min>}};
  const int d = dtype == DType::f16 ? 0 : 1;
  const int o = op == ReduceOp::max ? 1 : op == ReduceOp::min ? 2 : 0;  // sum and avg add
  if (ops[d][o] == MPI_OP_NULL) MPI_Op_create(functions[d][o], 1, &ops[d][o]);
  return ops[d][o];
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (is_half(dtype)) return op_16bit(dtype, op);
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;  // avg divides afterwards
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

int count_of(const Tensor& t, const char* op) {
  TANDEM_CHECK_AS(ValueError, t.numel() <= INT_MAX, "mpi ", op, ": ", t.numel(),
                  " elements are more than one MPI call carries (", INT_MAX, "); split the tensor");
  return static_cast<int>(t.numel());
}

template <typename T>
void divide_typed(const Tensor& t, int n) {
  T* p = static_cast<T*>(t.data_ptr());
  T divisor = static_cast<T>(n);
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(p[i] / divisor);
}

// avg = sum / size in place; integers truncate toward zero, like NCCL's ncclAvg.
void divide_in_place(const Tensor& t, int n) {
  switch (t.dtype()) {
    case DType::f32: divide_typed<float>(t, n); return;
    case DType::f64: divide_typed<double>(t, n); return;
    case DType::i32: divide_typed<int32_t>(t, n); return;
    case DType::i64: divide_typed<int64_t>(t, n); return;
    case DType::u8: divide_typed<uint8_t>(t, n); return;
    case DType::f16: divide_typed<Half>(t, n); return;
    case DType::bf16: divide_typed<BFloat16>(t, n); return;
    default: TANDEM_THROW(TypeError, "mpi all_reduce: avg of ", dtype_name(t.dtype()), " is not supported");
  }
}

struct MpiWorkState {
  const char* op = "";
  size_t bytes = 0;
  std::vector<MPI_Request> requests;
  std::vector<Tensor> tensors;   // alive until the requests completed
  std::function<void()> finish;  // once they completed: avg division, copy out of a temporary
  Clock::time_point started = Clock::now();
  double elapsed_ms = -1;
  bool done = false;    // the requests completed
  bool failed = false;  // wait() raises `error`
  std::string error;
};

// The group's state, shared with its Works. Every member and method needs mpi_mutex() held.
class MpiCore : public std::enable_shared_from_this<MpiCore> {
 public:
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  double timeout = 600;
  std::vector<std::shared_ptr<MpiWorkState>> pending;  // posted and not completed, failed ones too
  std::string failure;                                 // the group is unusable once set
  bool shut_down = false;
  bool stop = false;
  std::condition_variable wake;
  std::thread watchdog;

  std::string describe(const MpiWorkState& w) const { return internal::describe(rank, kBackend, w.op, w.bytes); }

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

  [[noreturn]] void raise(const MpiWorkState& w) const { TANDEM_THROW(BackendError, w.error); }

  void fail(const std::string& message, const MpiWorkState* culprit) {
    if (!failure.empty()) return;
    failure = message;
    report_failure(message);
    for (auto& w : pending) {
      if (w->done || w->failed) continue;
      w->failed = true;
      w->error = w.get() == culprit ? message
                                    : ::tandem::detail::concat(describe(*w), " was pending for ",
                                                               format_seconds(seconds_since(w->started)),
                                                               " when the group failed: ", message);
    }
  }

  void progress(MpiWorkState& w) {
    if (w.done) return;
    if (shut_down) {  // MPI may be finalized: never touch the requests again
      if (!w.failed) {
        w.failed = true;
        w.error = ::tandem::detail::concat(describe(w), ": the group was shut down (dist::finalize ran) before it "
                                           "completed");
      }
      return;
    }
    int flag = 0;
    int status = MPI_Testall(static_cast<int>(w.requests.size()), w.requests.data(), &flag, MPI_STATUSES_IGNORE);
    if (status != MPI_SUCCESS) {
      fail(::tandem::detail::concat(describe(w), " failed after ", format_seconds(seconds_since(w.started)), ": ",
                                    mpi_error_text(status), " (another rank probably died)"),
           &w);
      flag = 1;  // the requests are finished, in error
    }
    if (!flag) return;
    w.elapsed_ms = seconds_since(w.started) * 1e3;
    if (w.finish && !w.failed) {
      try {
        w.finish();
      } catch (const std::exception& e) {
        w.failed = true;
        w.error = ::tandem::detail::concat(describe(w), ": ", e.what());
      }
    }
    w.finish = nullptr;
    w.tensors.clear();
    w.done = true;
  }

  void progress_all() {
    for (auto& w : pending) progress(*w);
    pending.erase(std::remove_if(pending.begin(), pending.end(), [](const auto& w) { return w->done; }),
                  pending.end());
  }

  void check_timeouts() {
    if (!failure.empty()) return;
    for (auto& w : pending) {
      if (w->done || w->failed) continue;
      double waited = seconds_since(w->started);
      if (waited > timeout) {
        fail(::tandem::detail::concat(describe(*w), " timed out after ", format_seconds(waited), " (timeout ",
                                      format_seconds(timeout),
                                      "): another rank probably died, hangs, or issued a different collective "
                                      "(every rank must issue the same collectives in the same order); the group is "
                                      "unusable now"),
             w.get());
        return;
      }
    }
  }

  using Start = std::function<int(MPI_Request*)>;
  std::shared_ptr<Work> post(const std::shared_ptr<MpiWorkState>& w,
                             const std::vector<std::pair<const char*, Start>>& starts);

  void watch() {
    std::unique_lock<std::mutex> lock(mpi_mutex());
    while (!stop) {
      if (pending.empty()) {
        wake.wait(lock, [&] { return stop || !pending.empty(); });
      } else {
        // Polling is what moves MPI's non-blocking collectives along; slower once the group failed.
        wake.wait_for(lock, failure.empty() ? std::chrono::milliseconds(1) : std::chrono::milliseconds(100),
                      [&] { return stop; });
      }
      if (stop) break;
      try {
        progress_all();
        check_timeouts();
      } catch (const std::exception& e) {
        report_failure(std::string("mpi watchdog: ") + e.what());
      }
    }
  }
};

class MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<MpiCore> core, std::shared_ptr<MpiWorkState> state)
      : core_(std::move(core)), state_(std::move(state)) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(mpi_mutex());
    int sleep_us = 0;
    for (;;) {
      core_->progress(*state_);
      if (state_->failed) core_->raise(*state_);
      if (state_->done) return;
      core_->check_timeouts();
      if (state_->failed) core_->raise(*state_);
      lock.unlock();
      // Short sleeps: each MPI_Test advances the collective, but two ranks spinning on few cores
      // would starve each other.
      sleep_us = std::min(std::max(2 * sleep_us, 5), 200);
      std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
      lock.lock();
    }
  }

  void synchronize() override { wait(); }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    core_->progress(*state_);
    return state_->done || state_->failed;
  }

  double elapsed_ms() override {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    return state_->done && !state_->failed ? state_->elapsed_ms : -1.0;
  }

 private:
  std::shared_ptr<MpiCore> core_;
  std::shared_ptr<MpiWorkState> state_;
};

std::shared_ptr<Work> MpiCore::post(const std::shared_ptr<MpiWorkState>& w,
                                    const std::vector<std::pair<const char*, Start>>& starts) {
  check_usable(w->op, w->bytes);
  w->started = Clock::now();
  pending.push_back(w);  // before starting: a request that started stays tracked even if the next fails
  for (const auto& [call, start] : starts) {
    MPI_Request request = MPI_REQUEST_NULL;
    int status = start(&request);
    if (status != MPI_SUCCESS) {
      fail(::tandem::detail::concat(describe(*w), ": ", call, " failed: ", mpi_error_text(status)), w.get());
      raise(*w);
    }
    w->requests.push_back(request);
  }
  wake.notify_one();
  return std::make_shared<MpiWork>(shared_from_this(), w);
}

class MpiGroup final : public ProcessGroup {
 public:
  explicit MpiGroup(std::shared_ptr<MpiCore> core) : core_(std::move(core)) {
    core_->watchdog = std::thread([core = core_.get()] { core->watch(); });
  }
  // Without dist::finalize (an init that failed half-way, say), the other ranks may still be
  // communicating: stop the watchdog and leave the communicator alone.
  ~MpiGroup() override { shutdown(false); }

  int rank() const override { return core_->rank; }
  int size() const override { return core_->size; }
  std::string backend() const override { return kBackend; }

  std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op) override {
    return all_reduce(std::vector<Tensor>{tensor}, op);
  }

  std::shared_ptr<Work> all_reduce(const std::vector<Tensor>& tensors, ReduceOp op) override {
    const char* name = "all_reduce";
    TANDEM_CHECK_AS(ValueError, !tensors.empty(), "mpi all_reduce: no tensors given");
    auto w = std::make_shared<MpiWorkState>();
    w->op = name;
    std::vector<std::pair<const char*, MpiCore::Start>> starts;
    for (const Tensor& t : tensors) {
      check_tensor(t, Device(), kBackend, name, "tensor");
      MPI_Datatype type = reduce_type(t.dtype(), op, name);
      int count = count_of(t, name);
      w->bytes += t.nbytes();
      void* data = t.data_ptr();
      const DType dtype = t.dtype();
      starts.emplace_back("MPI_Iallreduce", [this, data, count, type, op, dtype](MPI_Request* r) {
        return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi_op(op, dtype), core_->comm, r);
      });
    }
    check_disjoint(tensors, kBackend, name);
    w->tensors = tensors;
    if (op == ReduceOp::avg) {
      w->finish = [tensors, n = core_->size] {
        for (const Tensor& t : tensors) divide_in_place(t, n);
      };
    }
    std::lock_guard<std::mutex> lock(mpi_mutex());
    return core_->post(w, starts);
  }

  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root) override {
    const char* name = "broadcast";
    check_tensor(tensor, Device(), kBackend, name, "tensor");
    check_root(root, core_->size, kBackend);
    int count = count_of(tensor, name);
    auto w = std::make_shared<MpiWorkState>();
    w->op = name;
    w->bytes = tensor.nbytes();
    w->tensors = {tensor};
    void* data = tensor.data_ptr();
    MPI_Datatype type = transfer_type(tensor.dtype());
    std::lock_guard<std::mutex> lock(mpi_mutex());
    return core_->post(w, {{"MPI_Ibcast", [this, data, count, type, root](MPI_Request* r) {
                              return MPI_Ibcast(data, count, type, root, core_->comm, r);
                            }}});
  }

  std::shared_ptr<Work> all_gather(const Tensor& output, const Tensor& input) override {
    const char* name = "all_gather";
    check_tensor(output, Device(), kBackend, name, "output");
    check_tensor(input, Device(), kBackend, name, "input");
    check_same_dtype(output, input, kBackend, name);
    TANDEM_CHECK_AS(ValueError, output.numel() == core_->size * input.numel(), "mpi all_gather: output has ",
                    output.numel(), " elements, but ", core_->size, " ranks x input's ", input.numel(), " make ",
                    core_->size * input.numel());
    int count = count_of(input, name);
    count_of(output, name);
    bool in_place = is_rank_slice(output, input, core_->rank, kBackend, name);
    auto w = std::make_shared<MpiWorkState>();
    w->op = name;
    w->bytes = output.nbytes();
    w->tensors = {output, input};
    void* send = in_place ? MPI_IN_PLACE : input.data_ptr();
    void* recv = output.data_ptr();
    MPI_Datatype type = transfer_type(input.dtype());
    std::lock_guard<std::mutex> lock(mpi_mutex());
    return core_->post(w, {{"MPI_Iallgather", [this, send, recv, count, type](MPI_Request* r) {
                              return MPI_Iallgather(send, count, type, recv, count, type, core_->comm, r);
                            }}});
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op) override {
    const char* name = "reduce_scatter";
    check_tensor(output, Device(), kBackend, name, "output");
    check_tensor(input, Device(), kBackend, name, "input");
    check_same_dtype(output, input, kBackend, name);
    TANDEM_CHECK_AS(ValueError, input.numel() == core_->size * output.numel(), "mpi reduce_scatter: input has ",
                    input.numel(), " elements, but ", core_->size, " ranks x output's ", output.numel(), " make ",
                    core_->size * output.numel());
    MPI_Datatype type = reduce_type(input.dtype(), op, name);
    int count = count_of(output, name);
    count_of(input, name);
    // MPI's in-place reduce_scatter has another layout than NCCL's: receive into a temporary instead.
    bool in_place = is_rank_slice(input, output, core_->rank, kBackend, name);
    Tensor target = in_place ? empty(output.shape(), output.options()) : output;
    auto w = std::make_shared<MpiWorkState>();
    w->op = name;
    w->bytes = input.nbytes();
    w->tensors = {output, input, target};
    w->finish = [output, target, in_place, op, n = core_->size] {
      if (op == ReduceOp::avg) divide_in_place(target, n);
      if (in_place) std::memcpy(output.data_ptr(), target.data_ptr(), output.nbytes());
    };
    void* send = input.data_ptr();
    void* recv = target.data_ptr();
    std::lock_guard<std::mutex> lock(mpi_mutex());
    const DType dtype = input.dtype();
    return core_->post(w, {{"MPI_Ireduce_scatter_block", [this, send, recv, count, type, op, dtype](MPI_Request* r) {
                              return MPI_Ireduce_scatter_block(send, recv, count, type, mpi_op(op, dtype),
                                                               core_->comm, r);
                            }}});
  }

  void barrier() override {
    auto w = std::make_shared<MpiWorkState>();
    w->op = "barrier";
    std::shared_ptr<Work> work;
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      work = core_->post(w, {{"MPI_Ibarrier", [this](MPI_Request* r) { return MPI_Ibarrier(core_->comm, r); }}});
    }
    work->wait();
  }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(mpi_mutex());
    core_->fail(::tandem::detail::concat("rank ", core_->rank, ": the mpi group was aborted: ", reason), nullptr);
  }

  // Never throws. With `wait_for_peers` (dist::finalize), finishes pending collectives, waits for
  // every rank to get here and frees the communicator.
  void shutdown(bool wait_for_peers) {
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      if (core_->shut_down || core_->stop) return;
      core_->stop = true;
    }
    core_->wake.notify_all();
    if (core_->watchdog.joinable()) core_->watchdog.join();

    std::unique_lock<std::mutex> lock(mpi_mutex());
    struct MarkShutDown {
      MpiCore& core;
      ~MarkShutDown() { core.shut_down = true; }
    } mark{*core_};
    if (!wait_for_peers) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // someone else finalized MPI under us: nothing can be freed
    // Collectives nobody waited for usually finish at once; a peer that is gone never lets them.
    auto start = Clock::now();
    double limit = std::min(core_->timeout, 3.0);
    for (;;) {
      core_->progress_all();
      if (core_->pending.empty() || seconds_since(start) > limit) break;
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      lock.lock();
    }
    if (!core_->pending.empty()) {
      report_failure(::tandem::detail::concat("rank ", core_->rank, ": dist::finalize: ", core_->pending.size(),
                                              " mpi collective(s) still pending; leaving without MPI_Finalize, "
                                              "which would wait for them forever"));
      unclean_shutdown = true;
      return;
    }
    // MPI_Finalize waits for every rank; a rank that never gets there would hang this one. Wait for
    // them here, with the timeout.
    MPI_Request request = MPI_REQUEST_NULL;
    int status = MPI_Ibarrier(core_->comm, &request);
    start = Clock::now();
    int flag = 0;
    while (status == MPI_SUCCESS && !flag && seconds_since(start) <= core_->timeout) {
      status = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        lock.lock();
      }
    }
    if (status != MPI_SUCCESS || !flag) {
      report_failure(::tandem::detail::concat("rank ", core_->rank, ": dist::finalize: the other ranks did not reach ",
                                              "dist::finalize within ", format_seconds(core_->timeout),
                                              status != MPI_SUCCESS ? " (" + mpi_error_text(status) + ")" : "",
                                              "; leaving without MPI_Finalize, which would wait for them forever"));
      unclean_shutdown = true;
      return;
    }
    MPI_Comm_free(&core_->comm);
  }

 private:
  std::shared_ptr<MpiCore> core_;
};

}  // namespace

MpiWorld mpi_init(double timeout_seconds) {
  std::lock_guard<std::mutex> lock(mpi_mutex());
  int initialized = 0, finalized = 0;
  TANDEM_MPI_CHECK(MPI_Initialized(&initialized));
  TANDEM_MPI_CHECK(MPI_Finalized(&finalized));
  TANDEM_CHECK_AS(BackendError, !finalized, "dist::init: MPI was finalized already");
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    TANDEM_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    mpi_initialized_here = true;
  } else {
    TANDEM_MPI_CHECK(MPI_Query_thread(&provided));
  }
  TANDEM_CHECK_AS(BackendError, provided >= MPI_THREAD_SERIALIZED, "dist::init: MPI runs at thread level ", provided,
                  ", but tandem calls MPI from a watchdog thread too and needs MPI_THREAD_SERIALIZED or more");

  auto core = std::make_shared<MpiCore>();
  core->timeout = timeout_seconds;
  TANDEM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &core->comm));
  TANDEM_MPI_CHECK(MPI_Comm_set_errhandler(core->comm, MPI_ERRORS_RETURN));
  TANDEM_MPI_CHECK(MPI_Comm_rank(core->comm, &core->rank));
  TANDEM_MPI_CHECK(MPI_Comm_size(core->comm, &core->size));
  MpiWorld world;
  world.rank = core->rank;
  world.size = core->size;
  MPI_Comm node = MPI_COMM_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_split_type(core->comm, MPI_COMM_TYPE_SHARED, core->rank, MPI_INFO_NULL, &node));
  TANDEM_MPI_CHECK(MPI_Comm_rank(node, &world.local_rank));
  TANDEM_MPI_CHECK(MPI_Comm_size(node, &world.local_size));
  TANDEM_MPI_CHECK(MPI_Comm_free(&node));
  world.group = std::make_shared<MpiGroup>(core);
  return world;
}

void mpi_shutdown_group(ProcessGroup& group) {
  if (auto* g = dynamic_cast<MpiGroup*>(&group)) g->shutdown(true);
}

void mpi_finalize() {
  std::lock_guard<std::mutex> lock(mpi_mutex());
  if (!mpi_initialized_here || unclean_shutdown) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace tandem::dist::internal
