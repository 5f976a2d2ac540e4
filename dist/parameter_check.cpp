#include "tandem/dist/parameter_check.h"

#include <cmath>
#include <cstring>

#include "tandem/core/kernels.h"
#include "tandem/dist/internal.h"

namespace tandem::dist {

void check_parameters_agree(const std::vector<std::string>& names, const std::vector<Tensor>& parameters,
                            int64_t step, double timeout_seconds) {
  const World& w = world();
  const size_t n = parameters.size();
  // (n,) one digest per parameter, computed on the parameters' device (one read-back per device).
  const std::vector<uint64_t> mine = kernels::content_hashes(parameters);
  std::vector<uint8_t> bytes = internal::host_all_gather(mine.data(), n * sizeof(uint64_t), timeout_seconds);
  std::vector<uint64_t> all(static_cast<size_t>(w.size) * n);  // (size * n,)
  std::memcpy(all.data(), bytes.data(), all.size() * sizeof(uint64_t));
  for (size_t i = 0; i < n; ++i) {
    std::vector<int> differing;
    for (int r = 1; r < w.size; ++r) {
      if (all[r * n + i] != all[i]) differing.push_back(r);
    }
    if (differing.empty()) continue;
    // Every rank found the same parameter: its values travel so the error can say by how much.
    std::vector<double> values = parameters[i].to_double_vector();  // (numel,)
    std::vector<uint8_t> gathered =
        internal::host_all_gather(values.data(), values.size() * sizeof(double), timeout_seconds);
    std::vector<double> every(values.size() * w.size);  // (size * numel,)
    std::memcpy(every.data(), gathered.data(), every.size() * sizeof(double));
    std::string detail;
    for (int r : differing) {
      double largest = 0;
      size_t at = 0;
      for (size_t k = 0; k < values.size(); ++k) {
        double d = std::fabs(every[r * values.size() + k] - every[k]);
        if (d > largest || std::isnan(d)) {
          largest = d;
          at = k;
          if (std::isnan(d)) break;
        }
      }
      detail += ::tandem::detail::concat(detail.empty() ? "" : "; ", "rank ", r, " differs from rank 0 by up to ",
                                         largest, " (at element ", at, ")");
    }
    std::string ranks;
    for (int r : differing) ranks += ::tandem::detail::concat(ranks.empty() ? "" : ", ", r);
    TANDEM_THROW(BackendError, "rank ", w.rank, ": parameters differ between ranks at step ", step,
                 ": the first that differs is '", names[i], "' (", shape_str(parameters[i].shape()), " ",
                 dtype_name(parameters[i].dtype()), "): ", detail, "; ranks that differ from rank 0: ", ranks,
                 " (a rank-dependent update, a missed all-reduce, or non-deterministic kernels)");
  }
}

}  // namespace tandem::dist
