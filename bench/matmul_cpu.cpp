// CPU matmul throughput: tandem::matmul against Eigen's own GEMM (C.noalias() = A * B over the
// same buffers), f32, row-major. After a warm-up the two run interleaved, one call each per
// round, and each reports the median time over the rounds.
//
//   bench/matmul_cpu [--m 1024] [--n 1024] [--k 1024] [--repeats 15] [--warmup 3]
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "tandem/tandem.h"

namespace {

using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <typename Fn>
double seconds(Fn&& fn) {
  auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t m = 1024, n = 1024, k = 1024;
  int repeats = 15, warmup = 3;
  CLI::App app("CPU matmul throughput: tandem against Eigen, f32");
  app.add_option("--m", m, "rows of A and C")->check(CLI::PositiveNumber);
  app.add_option("--n", n, "columns of B and C")->check(CLI::PositiveNumber);
  app.add_option("--k", k, "columns of A, rows of B")->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "timed calls of each, interleaved")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls of each first")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  tandem::manual_seed(42);
  tandem::Tensor a = tandem::randn({m, k});  // (M, K)
  tandem::Tensor b = tandem::randn({k, n});  // (K, N)
  Eigen::Map<const RowMajor> ea(a.data<float>(), m, k);
  Eigen::Map<const RowMajor> eb(b.data<float>(), k, n);
  RowMajor ec(m, n);  // (M, N) Eigen's own output

  tandem::Tensor c;  // (M, N) tandem's output
  auto run_tandem = [&] { c = tandem::matmul(a, b); };
  auto run_eigen = [&] { ec.noalias() = ea * eb; };

  for (int i = 0; i < warmup; ++i) {
    run_tandem();
    run_eigen();
  }
  std::vector<double> t_tandem, t_eigen;
  for (int i = 0; i < repeats; ++i) {
    t_tandem.push_back(seconds(run_tandem));
    t_eigen.push_back(seconds(run_eigen));
  }

  // The two must agree, or the comparison means nothing.
  Eigen::Map<const RowMajor> tc(c.data<float>(), m, n);
  double rel = (tc - ec).norm() / ec.norm();
  if (!(rel < 1e-5)) {
    std::fprintf(stderr, "matmul_cpu: tandem and Eigen disagree (relative error %.3g)\n", rel);
    return 1;
  }

  const double flop = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const double med_tandem = median(t_tandem), med_eigen = median(t_eigen);
  std::printf("matmul f32 %lldx%lldx%lld (M x N x K), %d threads, median of %d after %d warm-up\n",
              static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), Eigen::nbThreads(),
              repeats, warmup);
  std::printf("%-8s %12s %12s\n", "", "median ms", "GFLOP/s");
  std::printf("%-8s %12.2f %12.1f\n", "tandem", med_tandem * 1e3, flop / med_tandem * 1e-9);
  std::printf("%-8s %12.2f %12.1f\n", "eigen", med_eigen * 1e3, flop / med_eigen * 1e-9);
  std::printf("tandem/eigen throughput: %.3f\n", med_eigen / med_tandem);
  return 0;
}
