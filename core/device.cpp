#include "tandem/core/device.h"

#include <cctype>

#include "tandem/core/error.h"

namespace tandem {

Device Device::parse(const std::string& spec) {
  if (spec == "cpu") return Device(DeviceType::cpu);
  if (spec == "cuda") return Device(DeviceType::cuda, 0);
  if (spec.rfind("cuda:", 0) == 0 && spec.size() > 5) {
    std::string digits = spec.substr(5);
    bool all_digits = digits.size() <= 4;
    for (char c : digits) all_digits = all_digits && std::isdigit(static_cast<unsigned char>(c));
    if (all_digits) return Device(DeviceType::cuda, std::stoi(digits));
  }
  TANDEM_THROW(ValueError, "unknown device '", spec, "': expected 'cpu', 'cuda' or 'cuda:N'");
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& out, const Device& device) { return out << device.str(); }

}  // namespace tandem
