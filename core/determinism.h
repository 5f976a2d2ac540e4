#pragma once
// Deterministic mode, with PyTorch's names: when it is on, every kernel tandem launches gives the
// same bits run to run for the same inputs on the same GPU model, library versions and world
// size. Kernels that accumulate with float atomics switch to an ordered twin, cuDNN is kept to
// engines without the non-deterministic note and never times candidates, and an op with no
// deterministic path raises NotImplementedError instead of running.
//
// The mode is process-wide. It starts from the environment variable TANDEM_DETERMINISTIC
// (1/true/on or 0/false/off, read on first use) and use_deterministic_algorithms() overrides it.
#include <string>

namespace tandem {

void use_deterministic_algorithms(bool enabled);
bool are_deterministic_algorithms_enabled();

// Sets the mode for a scope and restores the previous one on exit.
class DeterministicAlgorithmsGuard {
 public:
  explicit DeterministicAlgorithmsGuard(bool enabled) : previous_(are_deterministic_algorithms_enabled()) {
    use_deterministic_algorithms(enabled);
  }
  ~DeterministicAlgorithmsGuard() { use_deterministic_algorithms(previous_); }
  DeterministicAlgorithmsGuard(const DeterministicAlgorithmsGuard&) = delete;
  DeterministicAlgorithmsGuard& operator=(const DeterministicAlgorithmsGuard&) = delete;

 private:
  bool previous_;
};

// Raises NotImplementedError naming `op` (and how to turn the mode off) when deterministic mode
// is on; does nothing otherwise. Ops call it before a path that has no deterministic variant.
void alert_not_deterministic(const std::string& op);

namespace detail {
// The value of TANDEM_DETERMINISTIC as a flag; ValueError for a value that is not a boolean.
bool parse_deterministic_env(const char* value);
}  // namespace detail

}  // namespace tandem
