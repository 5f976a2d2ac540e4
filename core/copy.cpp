// Copies (with casts, across devices), fills, dtype and device conversion, random fills.
#include "tandem/core/copy.h"

#include "tandem/core/backend.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/views.h"

namespace tandem::kernels {

void copy_(const Tensor& dst, const Tensor& src) {
  Tensor s = views::expand(src, dst.shape());
  if (dst.numel() == 0) return;
  if (s.device() == dst.device()) {
    TANDEM_ROUTE(dst.device(), copy, s, dst);
    return;
  }
  // Across devices: make a dense copy on the source device (in its memory format, so a
  // channels-last tensor moves without a transpose), move its bytes, then lay them out (and cast)
  // on the destination device.
  const MemoryFormat format = s.suggest_memory_format();
  Tensor packed = contiguous(s, format);
  Tensor staged = empty(packed.shape(), TensorOptions(packed.dtype(), dst.device()), format);
  if (src.device().is_cpu()) {
    cuda::copy_host_to_device(staged.data_ptr(), packed.data_ptr(), packed.nbytes(), dst.device().index);
  } else if (dst.device().is_cpu()) {
    cuda::copy_device_to_host(staged.data_ptr(), packed.data_ptr(), packed.nbytes(), src.device().index);
  } else {
    cuda::copy_device_to_device(staged.data_ptr(), dst.device().index, packed.data_ptr(), src.device().index,
                                packed.nbytes());
  }
  TANDEM_ROUTE(dst.device(), copy, staged, dst);
}

void copy_each_(const std::vector<Tensor>& dsts, const std::vector<Tensor>& srcs) {
  TANDEM_CHECK_AS(ValueError, dsts.size() == srcs.size(), "copy_each_: ", dsts.size(), " destinations for ",
                  srcs.size(), " sources");
  // The pairs one backend call can take, by device; the others one copy_ each.
  std::vector<Tensor> together_src, together_dst;
  for (size_t i = 0; i < dsts.size(); ++i) {
    const Tensor &d = dsts[i], &s = srcs[i];
    TANDEM_CHECK_AS(ValueError, d.shape() == s.shape(), "copy_each_: pair ", i, " has shapes ",
                    shape_str(d.shape()), " (destination) and ", shape_str(s.shape()), " (source)");
    // Both dense in one layout (a channels-last weight's gradient in its channels-last slot too):
    // then the copy is of nbytes, byte for byte.
    const bool plain = d.device() == s.device() && d.dtype() == s.dtype() && d.strides() == s.strides() &&
                       d.is_contiguous(d.suggest_memory_format()) &&
                       (together_dst.empty() || d.device() == together_dst.front().device());
    if (!plain) {
      copy_(d, s);
    } else if (d.numel() > 0) {
      together_dst.push_back(d);
      together_src.push_back(s);
    }
  }
  if (together_dst.empty()) return;
  TANDEM_ROUTE(together_dst.front().device(), copy_each, together_src, together_dst);
}

void fill_(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  TANDEM_ROUTE(dst.device(), fill, dst, value);
}

Tensor contiguous(const Tensor& x) { return x.is_contiguous() ? x : clone(x); }

Tensor clone(const Tensor& x) { return clone(x, MemoryFormat::contiguous); }

Tensor contiguous(const Tensor& x, MemoryFormat format) {
  if (!x.is_contiguous(format)) return clone(x, format);
  const Strides exact = memory_format_strides(x.shape(), format);
  return x.strides() == exact ? x : x.as_strided(x.shape(), exact, x.offset());
}

Tensor clone(const Tensor& x, MemoryFormat format) {
  Tensor out = empty(x.shape(), x.options(), format);
  copy_(out, x);
  return out;
}

// Conversions keep the memory format, as PyTorch's x.to(dtype) and x.to(device) do.
Tensor to_dtype(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = empty(x.shape(), TensorOptions(dtype, x.device()), x.suggest_memory_format());
  copy_(out, x);
  return out;
}

Tensor to_device(const Tensor& x, Device device) {
  if (x.device() == device) return x;
  Tensor out = empty(x.shape(), TensorOptions(x.dtype(), device), x.suggest_memory_format());
  copy_(out, x);
  return out;
}

void random_(const Tensor& out, RandomKind kind, uint64_t seed, uint64_t offset, double p1, double p2) {
  check_floating("random", out);
  TANDEM_CHECK_AS(ValueError, out.is_contiguous(), "random: the output must be contiguous");
  if (out.numel() == 0) return;
  TANDEM_ROUTE(out.device(), random, out, kind, seed, offset, p1, p2);
}

void random_from_base_(const Tensor& out, RandomKind kind, const uint64_t* base, uint64_t offset, double p1, double p2) {
  check_floating("random", out);
  TANDEM_CHECK_AS(ValueError, out.is_contiguous() && out.device().is_cuda(),
                  "random_from_base_: the output must be a contiguous cuda tensor");
  if (out.numel() == 0) return;
  cuda::random_from_base(out, kind, base, offset, p1, p2);
}

}  // namespace tandem::kernels
