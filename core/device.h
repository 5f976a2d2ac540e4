#pragma once
#include <ostream>
#include <string>

namespace tandem {

enum class DeviceType { cpu, cuda };

// Where a tensor's storage lives: the host, or one CUDA device by index.
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // the CUDA device ordinal; always 0 for the cpu

  Device() = default;
  Device(DeviceType t, int i = 0) : type(t), index(t == DeviceType::cpu ? 0 : i) {}  // NOLINT
  Device(const char* spec) : Device(parse(spec)) {}                                     // NOLINT
  Device(const std::string& spec) : Device(parse(spec)) {}                              // NOLINT

  // "cpu", "cuda" (device 0) or "cuda:N"; anything else throws a ValueError.
  static Device parse(const std::string& spec);
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

std::ostream& operator<<(std::ostream& out, const Device& device);

}  // namespace tandem
