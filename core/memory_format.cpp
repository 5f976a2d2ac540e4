#include "tandem/core/memory_format.h"

#include <algorithm>
#include <numeric>

#include "tandem/core/error.h"

namespace tandem {

const char* memory_format_name(MemoryFormat format) {
  switch (format) {
    case MemoryFormat::contiguous: return "contiguous";
    case MemoryFormat::channels_last: return "channels_last";
  }
  return "unknown";
}

Strides memory_format_strides(const Shape& shape, MemoryFormat format) {
  if (format == MemoryFormat::contiguous) return contiguous_strides(shape);
  TANDEM_CHECK_AS(ValueError, shape.size() == 4, "channels_last: needs a 4-D (N, C, H, W) tensor, got shape ",
                  shape_str(shape));
  const int64_t c = std::max<int64_t>(shape[1], 1), h = std::max<int64_t>(shape[2], 1);
  const int64_t w = std::max<int64_t>(shape[3], 1);
  return {h * w * c, 1, w * c, c};
}

bool layout_is(const Shape& shape, const Strides& strides, MemoryFormat format) {
  if (format == MemoryFormat::channels_last && shape.size() != 4) return false;
  const Strides expected = memory_format_strides(shape, format);
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] != 1 && strides[d] != expected[d]) return false;
  }
  return true;
}

bool layout_is_dense(const Shape& shape, const Strides& strides) {
  if (shape_numel(shape) == 0) return true;  // no elements: nothing to overlap
  std::vector<size_t> order(shape.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] < strides[b]; });
  int64_t expected = 1;
  for (size_t d : order) {
    if (shape[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

}  // namespace tandem
