// libFuzzer target: any bytes, plain or gzip, either parse as an IDX file or raise a ValueError;
// a plain file that parses is exactly its header and data.
#include <cstdlib>

#include "tandem/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::Tensor t;
  try {
    t = tandem::data::parse_idx(data, size);
  } catch (const tandem::ValueError&) {
    return 0;
  }
  if (t.dim() < 1 || t.dim() > 4 || t.numel() < 1) std::abort();
  bool gzip = size >= 2 && data[0] == 0x1f && data[1] == 0x8b;
  if (!gzip) {
    size_t stored = data[2] == 0x08 || data[2] == 0x09 ? 1 : data[2] == 0x0B ? 2 : data[2] == 0x0E ? 8 : 4;
    if (size != 4 + 4 * static_cast<size_t>(t.dim()) + static_cast<size_t>(t.numel()) * stored) std::abort();
  }
  return 0;
}
