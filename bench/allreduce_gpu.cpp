// The GPU half of the all-reduce benchmark: tandem's NCCL group (comm stream, events, watchdog)
// against a raw ncclAllReduce on the compute stream, through a second communicator of the same
// ranks, on the same buffer. CUDA events on the caller's stream time both.
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "allreduce.h"
#include "tandem/core/cuda/runtime.h"
#include "tandem/core/random.h"
#include "tandem/dist/check.h"
#include "tandem/dist/process_group.h"

namespace tandem::bench {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

class NcclBench final : public AllReduceBench {
 public:
  NcclBench() {
    const dist::World& w = dist::world();
    device_ = w.device.index;
    ncclUniqueId id;
    if (w.rank == 0) TANDEM_NCCL_CHECK(ncclGetUniqueId(&id));
    TANDEM_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD));
    cuda::DeviceGuard guard(device_);
    TANDEM_NCCL_CHECK(ncclCommInitRank(&comm_, w.size, id, w.rank));
  }
  ~NcclBench() override { ncclCommDestroy(comm_); }

  std::string backend() const override { return "nccl"; }
  std::string raw_name() const override { return "ncclAllReduce"; }

  AllReduceTiming time(size_t bytes, int warmup, int reps) override {
    const dist::World& w = dist::world();
    cuda::DeviceGuard guard(device_);
    cudaStream_t stream = cuda::current_stream(device_);
    // (n,) f32 of normal values: never zeros. Sums grow by the world size per call, far from
    // overflowing within one size's calls.
    int64_t n = static_cast<int64_t>(bytes / sizeof(float));
    Tensor buffer = randn({n}, TensorOptions(DType::f32, w.device));
    auto run_tandem = [&] { w.gpu_group->all_reduce(buffer, dist::ReduceOp::sum)->wait(); };
    auto run_raw = [&] {
      TANDEM_NCCL_CHECK(ncclAllReduce(buffer.data_ptr(), buffer.data_ptr(), static_cast<size_t>(n), ncclFloat32,
                                      ncclSum, comm_, stream));
    };
    for (int i = 0; i < warmup; ++i) {
      run_tandem();
      run_raw();
    }
    std::vector<cudaEvent_t> events(4 * reps);
    for (auto& e : events) TANDEM_CUDA_CHECK(cudaEventCreate(&e));
    std::vector<double> tandem_host_us, raw_host_us;
    auto host_us = [](const auto& call) {
      auto start = std::chrono::steady_clock::now();
      call();
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    };
    for (int i = 0; i < reps; ++i) {
      TANDEM_CUDA_CHECK(cudaEventRecord(events[4 * i], stream));
      tandem_host_us.push_back(host_us(run_tandem));
      TANDEM_CUDA_CHECK(cudaEventRecord(events[4 * i + 1], stream));
      TANDEM_CUDA_CHECK(cudaEventRecord(events[4 * i + 2], stream));
      raw_host_us.push_back(host_us(run_raw));
      TANDEM_CUDA_CHECK(cudaEventRecord(events[4 * i + 3], stream));
    }
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<double> tandem_ms, raw_ms;
    for (int i = 0; i < reps; ++i) {
      float a = 0, b = 0;
      TANDEM_CUDA_CHECK(cudaEventElapsedTime(&a, events[4 * i], events[4 * i + 1]));
      TANDEM_CUDA_CHECK(cudaEventElapsedTime(&b, events[4 * i + 2], events[4 * i + 3]));
      tandem_ms.push_back(a);
      raw_ms.push_back(b);
    }
    for (auto& e : events) cudaEventDestroy(e);
    return {median(tandem_ms), median(raw_ms), median(tandem_host_us), median(raw_host_us)};
  }

 private:
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
};

}  // namespace

std::unique_ptr<AllReduceBench> make_gpu_bench() { return std::make_unique<NcclBench>(); }

}  // namespace tandem::bench
