#pragma once
// Memory formats: the order in which a 4-D (N, C, H, W) tensor's elements lie in memory. A
// channels-last tensor keeps its logical NCHW sizes, with the strides of a dense NHWC buffer:
// (H*W*C, 1, W*C, C), as in PyTorch's torch.channels_last. Kernels that take channels-last inputs
// give channels-last outputs, so a network converted once stays in that layout end to end.
#include <cstdint>

#include "tandem/core/shape.h"

namespace tandem {

enum class MemoryFormat { contiguous, channels_last };

const char* memory_format_name(MemoryFormat format);  // "contiguous", "channels_last"

// The dense strides of `format` for `shape`; channels_last needs 4 dims.
Strides memory_format_strides(const Shape& shape, MemoryFormat format);

// Whether the layout is dense in `format`; the stride of a size-1 dim never matters.
bool layout_is(const Shape& shape, const Strides& strides, MemoryFormat format);

// Whether the elements fill a block of memory without gaps or overlaps, in any dim order.
bool layout_is_dense(const Shape& shape, const Strides& strides);

}  // namespace tandem
