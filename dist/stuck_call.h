#pragma once
// Internal to dist/: a watch on host calls that cannot be interrupted. A blocking NCCL
// communicator's calls (creating it, launching a collective that first connects to its peers,
// finalizing it) wait inside NCCL for the other ranks, and nothing can abort them while they run:
// one whose peer is gone would hang the rank for ever. A StuckCallWatch covers such a call; when
// one has run past its limit, a monitor thread reports it (naming the call), writes every group's
// flight recorder and ends the process with status 1, so the rank stops instead of hanging (and
// mpirun stops the others).
#include <functional>
#include <string>

namespace tandem::dist::internal {

// A scope on one thread: watches nest, and each ends on the thread that began it.
class StuckCallWatch {
 public:
  // `what` names the call for the report ("rank 0: nccl all_reduce of 4096 bytes (#3) on cuda:0"),
  // asked only when it is stuck, from the monitor's thread; `hint` (a literal) says why it may be
  // stuck and what to do.
  StuckCallWatch(std::function<std::string()> what, const char* hint, double limit_seconds);
  ~StuckCallWatch();
  StuckCallWatch(const StuckCallWatch&) = delete;
  StuckCallWatch& operator=(const StuckCallWatch&) = delete;
};

}  // namespace tandem::dist::internal
