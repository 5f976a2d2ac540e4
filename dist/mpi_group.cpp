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
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "tandem/core/kernels.h"
#include "tandem/dist/check.h"
#include "tandem/dist/internal.h"
#include "tandem/dist/work_tracker.h"

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
  // In DType's order: f32, f64, f16, bf16, i32, i64, u8, bool.
  const MPI_Datatype types[] = {MPI_FLOAT,   MPI_DOUBLE,  MPI_UINT16_T, MPI_UINT16_T,
                                MPI_INT32_T, MPI_INT64_T, MPI_UINT8_T,  MPI_UINT8_T};
  return types[static_cast<int>(dtype)];
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

// (2, size) i32: each rank's block size, then where it starts (prefix sums), as MPI's v-collectives take them.
Tensor block_layout(const std::vector<int64_t>& counts) {
  std::vector<int64_t> layout = counts;
  for (int64_t offset : block_offsets(counts)) layout.push_back(offset);
  return from_vector(layout, {2, static_cast<int64_t>(counts.size())}, DType::i32);
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

using Start = std::function<int(MPI_Request*)>;

// A collective goes through two stages: its fingerprint is all-gathered on the group's fingerprint
// communicator (queued), and once every rank's fingerprint matched, its data requests are posted on
// the data communicator (started), in sequence order. A mismatch fails the group before MPI sees
// collectives of different shapes, which Open MPI's non-blocking progress does not survive.
struct MpiWork : TrackedWork {
  std::vector<std::pair<const char*, Start>> starts;  // what posts the data requests
  std::vector<MPI_Request> requests;                  // the data requests, once started
  bool data_started = false;
  MPI_Request fingerprint_request = MPI_REQUEST_NULL;
  std::vector<Fingerprint> every_fingerprint;  // (size,) once the fingerprint all-gather completed
  std::function<void()> finish;  // once the requests completed: avg division, copy out of a temporary
};

// The host-side checks of every group (check_in_sync, detail mode) all-gather on this communicator,
// which no collective uses. Blocking, with the group's timeout; mpi_mutex() held (released while waiting).
MPI_Comm check_comm = MPI_COMM_NULL;
std::vector<uint8_t> all_gather_bytes(const void* mine, size_t bytes, int size, double timeout,
                                      std::unique_lock<std::mutex>& lock) {
  std::vector<uint8_t> all(bytes * size);  // (size * bytes,)
  MPI_Request request = MPI_REQUEST_NULL;
  TANDEM_MPI_CHECK(MPI_Iallgather(mine, static_cast<int>(bytes), MPI_BYTE, all.data(), static_cast<int>(bytes),
                                  MPI_BYTE, check_comm, &request));
  auto start = Clock::now();
  int flag = 0;
  int sleep_us = 0;
  for (;;) {
    TANDEM_MPI_CHECK(MPI_Test(&request, &flag, MPI_STATUS_IGNORE));
    if (flag) return all;
    if (seconds_since(start) > timeout) {
      TANDEM_THROW(BackendError, "the cross-rank check of the collectives issued timed out after ",
                   format_seconds(seconds_since(start)), ": another rank did not reach it (it died, hangs, or ",
                   "issued a different collective)");
    }
    lock.unlock();
    sleep_us = std::min(std::max(2 * sleep_us, 5), 200);
    std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
    lock.lock();
  }
}

// The group's state, shared with its Works. Every member and method needs mpi_mutex() held.
class MpiCore final : public WorkTracker, public std::enable_shared_from_this<MpiCore> {
 public:
  MpiCore() : WorkTracker(kBackend, mpi_mutex()) {}
  MPI_Comm comm = MPI_COMM_NULL;              // the data
  MPI_Comm fingerprint_comm = MPI_COMM_NULL;  // the fingerprint of each collective

  // Starts, in sequence order, every queued collective whose fingerprints have arrived and match.
  // Also after the group failed: a rank that joins late can then still complete its side.
  void start_ready() {
    for (auto& tracked : pending) {
      auto& w = static_cast<MpiWork&>(*tracked);
      if (w.data_started || w.done) continue;
      int flag = 0;
      int status = MPI_Test(&w.fingerprint_request, &flag, MPI_STATUS_IGNORE);
      if (status != MPI_SUCCESS) {
        fail(::tandem::detail::concat(describe(w), ": exchanging its fingerprint failed: ", mpi_error_text(status),
                                      " (another rank probably died)"),
             &w);
        return;
      }
      if (!flag) return;
      bool match = true;
      for (const Fingerprint& f : w.every_fingerprint) match = match && f.matches(w.fingerprint);
      if (!match) {
        fail(mismatch_message(w.every_fingerprint), &w);  // a no-op when the group failed already
        w.done = true;  // never started: nothing to wait for
        continue;
      }
      start_data(w);
    }
  }

  void start_data(MpiWork& w) {
    w.data_started = true;
    mark_started(w);
    for (const auto& [call, start] : w.starts) {
      MPI_Request request = MPI_REQUEST_NULL;
      int status = start(&request);
      if (status != MPI_SUCCESS) {
        fail(::tandem::detail::concat(describe(w), ": ", call, " failed: ", mpi_error_text(status)), &w);
        return;
      }
      w.requests.push_back(request);
    }
    w.starts.clear();
  }

  void poll(TrackedWork& tracked) override {
    auto& w = static_cast<MpiWork&>(tracked);
    if (shut_down) {  // MPI may be finalized: never touch the requests again
      if (!w.failed) {
        w.failed = true;
        w.error = ::tandem::detail::concat(describe(w), ": the group was shut down (dist::finalize ran) before it "
                                           "completed");
      }
      return;
    }
    if (!w.data_started) {
      start_ready();
      if (!w.data_started) return;
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
    if (w.finish && !w.failed) {
      try {
        w.finish();
      } catch (const std::exception& e) {
        w.failed = true;
        w.error = ::tandem::detail::concat(describe(w), ": ", e.what());
      }
    }
    w.finish = nullptr;
    complete(w);
  }

  std::shared_ptr<Work> post(const std::shared_ptr<MpiWork>& w, const Fingerprint& fingerprint,
                             std::vector<std::pair<const char*, Start>> starts) {
    check_usable(w->op, w->bytes);
    w->started = Clock::now();
    stamp(*w, fingerprint);
    w->starts = std::move(starts);
    track(w);  // before starting: a request that started stays tracked even if the next fails
    if (size == 1 || debug == DebugMode::off) {
      start_data(*w);
    } else {
      w->every_fingerprint.resize(size);
      int status = MPI_Iallgather(&w->fingerprint, sizeof(Fingerprint), MPI_BYTE, w->every_fingerprint.data(),
                                  sizeof(Fingerprint), MPI_BYTE, fingerprint_comm, &w->fingerprint_request);
      if (status != MPI_SUCCESS) {
        fail(::tandem::detail::concat(describe(*w), ": MPI_Iallgather of its fingerprint failed: ",
                                      mpi_error_text(status)),
             w.get());
      }
      start_ready();
    }
    if (detail) {  // the host waits until every rank's fingerprint matched
      std::unique_lock<std::mutex> lock(mutex, std::adopt_lock);
      int sleep_us = 0;
      while (!w->data_started && !w->failed) {
        check_timeouts();
        lock.unlock();
        sleep_us = std::min(std::max(2 * sleep_us, 5), 200);
        std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
        lock.lock();
        start_ready();
      }
      lock.release();
    }
    if (w->failed) raise(*w);
    return std::make_shared<TrackedWorkHandle>(shared_from_this(), w);
  }

 protected:
  // Polling is what moves Open MPI's non-blocking collectives along.
  std::chrono::microseconds poll_interval() const override { return std::chrono::microseconds(1000); }
};

class MpiGroup final : public TrackedGroup {
 public:
  explicit MpiGroup(const std::shared_ptr<MpiCore>& core) : TrackedGroup(core), core_(core) {
    core_->start_watchdog();
  }
  // Without dist::finalize (an init that failed half-way, say), the other ranks may still be
  // communicating: stop the watchdog and leave the communicator alone.
  ~MpiGroup() override { shutdown(false); }

  using TrackedGroup::all_reduce;

  std::shared_ptr<Work> all_reduce(const std::vector<Tensor>& tensors, ReduceOp op, const std::string& label) override {
    const char* name = "all_reduce";
    TANDEM_CHECK_AS(ValueError, !tensors.empty(), "mpi all_reduce: no tensors given");
    auto w = std::make_shared<MpiWork>();
    w->op = name;
    std::vector<std::pair<const char*, Start>> starts;
    size_t count_sum = 0;
    for (const Tensor& t : tensors) {
      check_tensor(t, Device(), kBackend, name, "tensor");
      check_reducible(t.dtype(), op, kBackend, name);
      MPI_Datatype type = transfer_type(t.dtype());
      int count = count_of(t, name);
      count_sum += static_cast<size_t>(count);
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
    auto fingerprint = Fingerprint::make(name, count_sum, tensors[0].dtype(), op, -1, label);
    if (core_->size == 1) return complete_alone(name, w->bytes, fingerprint);  // sum, avg, max, min of one: itself
    std::lock_guard<std::mutex> lock(mpi_mutex());
    return core_->post(w, fingerprint, std::move(starts));
  }

  std::shared_ptr<Work> broadcast(const Tensor& tensor, int root, const std::string& label) override {
    const char* name = "broadcast";
    check_tensor(tensor, Device(), kBackend, name, "tensor");
    check_root(root, core_->size, kBackend);
    int count = count_of(tensor, name);
    auto w = std::make_shared<MpiWork>();
    w->op = name;
    w->bytes = tensor.nbytes();
    w->tensors = {tensor};
    void* data = tensor.data_ptr();
    MPI_Datatype type = transfer_type(tensor.dtype());
    auto fingerprint = Fingerprint::make(name, count, tensor.dtype(), std::nullopt, root, label);
    if (core_->size == 1) return complete_alone(name, tensor.nbytes(), fingerprint);
    std::lock_guard<std::mutex> lock(mpi_mutex());
    return core_->post(w, fingerprint, {{"MPI_Ibcast", [this, data, count, type, root](MPI_Request* r) {
                              return MPI_Ibcast(data, count, type, root, core_->comm, r);
                            }}});
  }

  std::shared_ptr<Work> all_gather(const Tensor& output, const Tensor& input, const std::string& label) override {
    const char* name = "all_gather";
    bool in_place = check_all_gather(output, input, core_->rank, core_->size, Device(), kBackend);
    int count = count_of(input, name);
    count_of(output, name);
    auto fingerprint = Fingerprint::make(name, count, input.dtype(), std::nullopt, -1, label);
    if (core_->size == 1) {
      if (!in_place) kernels::copy_(output, input);
      return complete_alone(name, output.nbytes(), fingerprint);
    }
    auto w = std::make_shared<MpiWork>();
    w->op = name;
    w->bytes = output.nbytes();
    w->tensors = {output, input};
    void* send = in_place ? MPI_IN_PLACE : input.data_ptr();
    void* recv = output.data_ptr();
    MPI_Datatype type = transfer_type(input.dtype());
    std::lock_guard<std::mutex> lock(mpi_mutex());
    return core_->post(w, fingerprint, {{"MPI_Iallgather", [this, send, recv, count, type](MPI_Request* r) {
                              return MPI_Iallgather(send, count, type, recv, count, type, core_->comm, r);
                            }}});
  }

  std::shared_ptr<Work> reduce_scatter(const Tensor& output, const Tensor& input, ReduceOp op,
                                       const std::string& label) override {
    const char* name = "reduce_scatter";
    bool in_place = check_reduce_scatter(output, input, op, core_->rank, core_->size, Device(), kBackend);
    MPI_Datatype type = transfer_type(input.dtype());
    int count = count_of(output, name);
    count_of(input, name);
    if (core_->size == 1) {
      if (!in_place) kernels::copy_(output, input);
      return complete_alone(name, input.nbytes(), Fingerprint::make(name, count, input.dtype(), op, -1, label));
    }
    // MPI's in-place reduce_scatter has another layout than NCCL's: receive into a temporary instead.
    Tensor target = in_place ? empty(output.shape(), output.options()) : output;
    auto w = std::make_shared<MpiWork>();
    w->op = name;
    w->bytes = input.nbytes();
    w->tensors = {output, input, target};
    w->finish = [output, target, in_place, op, n = core_->size] {
      if (op == ReduceOp::avg) divide_in_place(target, n);
      if (in_place) std::memcpy(output.data_ptr(), target.data_ptr(), output.nbytes());
    };
    void* send = input.data_ptr();
    void* recv = target.data_ptr();
    const DType dtype = input.dtype();
    auto fingerprint = Fingerprint::make(name, count, dtype, op, -1, label);
    std::lock_guard<std::mutex> lock(mpi_mutex());
    auto start = [this, send, recv, count, type, op, dtype](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(send, recv, count, type, mpi_op(op, dtype), core_->comm, r);
    };
    return core_->post(w, fingerprint, {{"MPI_Ireduce_scatter_block", start}});
  }

  std::shared_ptr<Work> all_gather_v(const Tensor& whole, const Tensor& part, const std::vector<int64_t>& counts,
                                     const std::string& label) override {
    const char* name = "all_gather_v";
    const bool in_place = check_blocks(whole, part, counts, core_->rank, core_->size, Device(), kBackend, name);
    count_of(whole, name);
    auto fingerprint = Fingerprint::make(name, whole.numel(), whole.dtype(), std::nullopt, -1, label);
    if (core_->size == 1) {
      if (!in_place && part.numel() > 0) kernels::copy_(whole, part);
      return complete_alone(name, whole.nbytes(), fingerprint);
    }
    Tensor layout = block_layout(counts);  // (2, size) i32: counts, offsets; MPI reads them until completion
    auto w = std::make_shared<MpiWork>();
    w->op = name;
    w->bytes = whole.nbytes();
    w->tensors = {whole, part, layout};
    void* send = in_place ? MPI_IN_PLACE : part.data_ptr();
    void* recv = whole.data_ptr();
    const int count = static_cast<int>(part.numel());
    const int* block_counts = layout.data<int32_t>();
    const int* displacements = block_counts + core_->size;
    MPI_Datatype type = transfer_type(whole.dtype());
    std::lock_guard<std::mutex> lock(mpi_mutex());
    return core_->post(w, fingerprint,
                       {{"MPI_Iallgatherv", [this, send, recv, count, block_counts, displacements, type](MPI_Request* r) {
                           return MPI_Iallgatherv(send, count, type, recv, block_counts, displacements, type,
                                                  core_->comm, r);
                         }}});
  }

  std::shared_ptr<Work> reduce_scatter_v(const Tensor& part, const Tensor& whole, const std::vector<int64_t>& counts,
                                         ReduceOp op, const std::string& label) override {
    const char* name = "reduce_scatter_v";
    check_reducible(whole.dtype(), op, kBackend, name);
    const bool in_place = check_blocks(whole, part, counts, core_->rank, core_->size, Device(), kBackend, name);
    count_of(whole, name);
    auto fingerprint = Fingerprint::make(name, whole.numel(), whole.dtype(), op, -1, label);
    if (core_->size == 1) {
      if (!in_place && part.numel() > 0) kernels::copy_(part, whole);
      return complete_alone(name, whole.nbytes(), fingerprint);
    }
    // MPI's in-place form reads from the receive buffer: receive into a temporary instead.
    Tensor target = in_place ? empty(part.shape(), part.options()) : part;
    Tensor layout = block_layout(counts);  // (2, size) i32; MPI reads the counts until completion
    auto w = std::make_shared<MpiWork>();
    w->op = name;
    w->bytes = whole.nbytes();
    w->tensors = {whole, part, target, layout};
    w->finish = [part, target, in_place, op, n = core_->size] {
      if (op == ReduceOp::avg) divide_in_place(target, n);
      if (in_place) std::memcpy(part.data_ptr(), target.data_ptr(), part.nbytes());
    };
    void* send = whole.data_ptr();
    void* recv = target.data_ptr();
    const int* block_counts = layout.data<int32_t>();
    const DType dtype = whole.dtype();
    MPI_Datatype type = transfer_type(dtype);
    std::lock_guard<std::mutex> lock(mpi_mutex());
    auto start = [this, send, recv, block_counts, type, op, dtype](MPI_Request* r) {
      return MPI_Ireduce_scatter(send, recv, block_counts, type, mpi_op(op, dtype), core_->comm, r);
    };
    return core_->post(w, fingerprint, {{"MPI_Ireduce_scatter", start}});
  }

  void barrier() override {
    auto w = std::make_shared<MpiWork>();
    w->op = "barrier";
    std::shared_ptr<Work> work;
    {
      std::lock_guard<std::mutex> lock(mpi_mutex());
      work = core_->post(w, Fingerprint::make("barrier", 0, std::nullopt, std::nullopt, -1, "barrier"),
                         {{"MPI_Ibarrier", [this](MPI_Request* r) { return MPI_Ibarrier(core_->comm, r); }}});
    }
    work->wait();
  }

  void check_in_sync(const std::string& where) override {
    std::unique_lock<std::mutex> lock(mpi_mutex());
    core_->check_in_sync(where, [&](const void* mine, size_t bytes) {
      return all_gather_bytes(mine, bytes, core_->size, core_->timeout, lock);
    });
  }


  // Never throws. With `wait_for_peers` (dist::finalize), finishes pending collectives, waits for
  // every rank to get here and frees the communicator.
  void shutdown(bool wait_for_peers) {
    if (!core_->stop_watchdog()) return;
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
    if (!core_->drain(std::min(core_->timeout, 3.0), lock)) {
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
    auto start = Clock::now();
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
    MPI_Comm_free(&core_->fingerprint_comm);
    if (check_comm != MPI_COMM_NULL) MPI_Comm_free(&check_comm);
  }

 private:
  std::shared_ptr<MpiCore> core_;
};

}  // namespace

std::vector<uint8_t> host_all_gather(const void* mine, size_t bytes, double timeout) {
  std::unique_lock<std::mutex> lock(mpi_mutex());
  int size = 1;
  TANDEM_MPI_CHECK(MPI_Comm_size(check_comm, &size));
  return all_gather_bytes(mine, bytes, size, timeout, lock);
}

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
  TANDEM_MPI_CHECK(MPI_Comm_dup(core->comm, &core->fingerprint_comm));
  TANDEM_MPI_CHECK(MPI_Comm_dup(core->comm, &check_comm));
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
