#include "tandem/core/determinism.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdlib>

#include "tandem/core/error.h"

namespace tandem {

namespace {
// -1: not decided yet (the environment is read on first use); 0: off; 1: on.
std::atomic<int> state{-1};
}  // namespace

namespace detail {
bool parse_deterministic_env(const char* value) {
  if (value == nullptr) return false;
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (v.empty() || v == "0" || v == "false" || v == "off" || v == "no") return false;
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  TANDEM_THROW(ValueError, "TANDEM_DETERMINISTIC=", value, ": expected 1, true, on, yes or 0, false, off, no");
}
}  // namespace detail

void use_deterministic_algorithms(bool enabled) { state.store(enabled ? 1 : 0); }

bool are_deterministic_algorithms_enabled() {
  int s = state.load();
  if (s < 0) {
    int from_env = detail::parse_deterministic_env(std::getenv("TANDEM_DETERMINISTIC")) ? 1 : 0;
    int expected = -1;
    // A concurrent use_deterministic_algorithms() wins over the environment.
    state.compare_exchange_strong(expected, from_env);
    s = state.load();
  }
  return s == 1;
}

void alert_not_deterministic(const std::string& op) {
  if (!are_deterministic_algorithms_enabled()) return;
  TANDEM_THROW(NotImplementedError, op,
               " has no deterministic implementation, and deterministic mode is on; call "
               "tandem::use_deterministic_algorithms(false) (or unset TANDEM_DETERMINISTIC) to run it");
}

}  // namespace tandem
