// libFuzzer target: any bytes either parse as safetensors or raise a ValueError, and whatever
// parses writes back to a file that parses to the same tensors and metadata.
#include <cstdlib>
#include <cstring>

#include "tandem/core/safetensors.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::SafetensorsFile file;
  try {
    file = tandem::parse_safetensors(data, size);
  } catch (const tandem::ValueError&) {
    return 0;
  }
  require(file.names.size() == file.tensors.size());
  std::vector<std::pair<std::string, tandem::Tensor>> tensors;
  for (const std::string& name : file.names) tensors.emplace_back(name, file.at(name));
  std::vector<uint8_t> bytes = tandem::serialize_safetensors(tensors, file.metadata);
  tandem::SafetensorsFile again = tandem::parse_safetensors(bytes.data(), bytes.size());
  require(again.metadata == file.metadata);
  require(again.tensors.size() == file.tensors.size());
  for (const auto& [name, t] : file.tensors) {
    const tandem::Tensor& u = again.at(name);
    require(u.dtype() == t.dtype() && u.shape() == t.shape());
    require(t.nbytes() == 0 || std::memcmp(u.data_ptr(), t.data_ptr(), t.nbytes()) == 0);
  }
  return 0;
}
