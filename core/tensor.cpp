#include "tandem/core/tensor.h"

#include <algorithm>
#include <cmath>

#include "tandem/core/backend.h"
#include "tandem/core/cuda_graph.h"
#include "tandem/core/kernel_checks.h"
#include "tandem/core/kernels.h"

namespace tandem {

namespace {
bool layout_is_contiguous(const Shape& shape, const Strides& strides) {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;  // the stride of a size-1 dim never matters
    if (strides[i] != expected) return false;
    expected *= std::max<int64_t>(shape[i], 1);
  }
  return true;
}
}  // namespace

Tensor::Tensor(Storage storage, Shape shape, Strides strides, int64_t offset, DType dtype) {
  TANDEM_CHECK_AS(ValueError, shape.size() == strides.size(), "tensor: shape ", shape_str(shape), " and strides ",
                  shape_str(strides), " have different lengths");
  TANDEM_CHECK_AS(ValueError, offset >= 0, "tensor: negative storage offset ", offset);
  int64_t numel = 1;
  int64_t last = offset;  // the furthest element the layout reaches
  for (size_t i = 0; i < shape.size(); ++i) {
    TANDEM_CHECK_AS(ValueError, shape[i] >= 0, "tensor: negative size in shape ", shape_str(shape));
    TANDEM_CHECK_AS(ValueError, strides[i] >= 0, "tensor: negative stride in strides ", shape_str(strides));
    numel *= shape[i];
    if (shape[i] > 0) last += (shape[i] - 1) * strides[i];
  }
  if (numel > 0) {
    size_t needed = static_cast<size_t>(last + 1) * dtype_size(dtype);
    TANDEM_CHECK_AS(ValueError, needed <= storage.nbytes(), "tensor: layout with shape ", shape_str(shape),
                    ", strides ", shape_str(strides), " and offset ", offset, " needs ", needed,
                    " bytes but the storage holds ", storage.nbytes());
  }
  impl_ = std::make_shared<Impl>();
  impl_->storage = std::move(storage);
  impl_->contiguous = layout_is_contiguous(shape, strides);
  impl_->shape = std::move(shape);
  impl_->strides = std::move(strides);
  impl_->offset = offset;
  impl_->numel = numel;
  impl_->dtype = dtype;
}

namespace {
// wrap_dim lets dim 0 and -1 through for a 0-dim tensor (reductions treat it as one element), but
// there is no size or stride to return then.
int64_t wrap_existing_dim(int64_t d, int64_t ndim, const char* op) {
  TANDEM_CHECK_AS(IndexError, ndim > 0, op, ": dim ", d, " is out of range for a tensor of 0 dims (it has none)");
  return wrap_dim(d, ndim, op);
}
}  // namespace

bool Tensor::is_contiguous(MemoryFormat format) const {
  return format == MemoryFormat::contiguous ? is_contiguous() : layout_is(shape(), strides(), format);
}

MemoryFormat Tensor::suggest_memory_format() const {
  return !is_contiguous() && is_contiguous(MemoryFormat::channels_last) ? MemoryFormat::channels_last
                                                                          : MemoryFormat::contiguous;
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_existing_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_existing_dim(d, dim(), "stride")]; }

void* Tensor::data_ptr() const {
  return static_cast<char*>(storage().data()) + offset() * static_cast<int64_t>(element_size());
}

Tensor Tensor::as_strided(Shape shape, Strides strides, int64_t offset) const {
  return Tensor(storage(), std::move(shape), std::move(strides), offset, dtype());
}

void Tensor::set_data(const Tensor& source) const {
  Impl& self = impl();
  const Impl& other = source.impl();
  if (&self == &other) return;
  self.storage = other.storage;
  self.shape = other.shape;
  self.strides = other.strides;
  self.offset = other.offset;
  self.numel = other.numel;
  self.dtype = other.dtype;
  self.contiguous = other.contiguous;
}

std::vector<double> Tensor::to_double_vector() const {
  Tensor host = kernels::contiguous(kernels::to_dtype(kernels::to_device(*this, Device()), DType::f64));
  const double* p = host.data<double>();
  return std::vector<double>(p, p + host.numel());
}

std::vector<int64_t> Tensor::to_int64_vector() const {
  Tensor host = kernels::contiguous(kernels::to_dtype(kernels::to_device(*this, Device()), DType::i64));
  const int64_t* p = host.data<int64_t>();
  return std::vector<int64_t>(p, p + host.numel());
}

double Tensor::item_double() const {
  if (device().is_cuda()) cuda::check_not_capturing("item() on a cuda tensor");
  TANDEM_CHECK_AS(ValueError, numel() == 1, "item(): the tensor has ", numel(), " elements (shape ",
                  shape_str(shape()), "), expected exactly one");
  return to_double_vector()[0];
}

// ---- factories ----

Tensor empty(const Shape& shape, TensorOptions options) { return empty(shape, options, MemoryFormat::contiguous); }

Tensor empty(const Shape& shape, TensorOptions options, MemoryFormat format) {
  int64_t n = shape_numel(shape);
  for (int64_t s : shape) {
    TANDEM_CHECK_AS(ValueError, s >= 0, "empty: negative size in shape ", shape_str(shape));
  }
  Storage storage = Storage::allocate(static_cast<size_t>(n) * dtype_size(options.dtype), options.device);
  return Tensor(std::move(storage), shape, memory_format_strides(shape, format), 0, options.dtype);
}

Tensor full(const Shape& shape, double value, TensorOptions options) {
  Tensor t = empty(shape, options);
  kernels::fill_(t, value);
  return t;
}

Tensor zeros(const Shape& shape, TensorOptions options) { return full(shape, 0.0, options); }
Tensor zeros(const Shape& shape, TensorOptions options, MemoryFormat format) {
  Tensor t = empty(shape, options, format);
  kernels::fill_(t, 0.0);
  return t;
}
Tensor ones(const Shape& shape, TensorOptions options) { return full(shape, 1.0, options); }
Tensor scalar_tensor(double value, TensorOptions options) { return full({}, value, options); }

Tensor arange(double start, double end, double step, TensorOptions options) {
  TANDEM_CHECK_AS(ValueError, step != 0.0, "arange: step must be non-zero");
  TANDEM_CHECK_AS(ValueError, (end - start) / step >= 0, "arange: the range [", start, ", ", end,
                  ") cannot be walked with step ", step);
  auto n = static_cast<int64_t>(std::ceil((end - start) / step));
  Tensor out = empty({n}, options);
  if (n > 0) TANDEM_ROUTE(options.device, arange, out, start, step);
  return out;
}

Tensor arange(int64_t end, TensorOptions options) { return arange(0.0, static_cast<double>(end), 1.0, options); }

namespace {
// Host values of `dtype` straight into a tensor on the GPU, cast there: no CPU tensor op, so it also
// works inside a CUDA graph capture (the upload is then part of the graph).
Tensor upload(const void* values, const Shape& shape, DType dtype, TensorOptions options) {
  Tensor staged = empty(shape, TensorOptions(dtype, options.device));
  if (staged.numel() > 0) cuda::copy_host_to_device(staged.data_ptr(), values, staged.nbytes(), options.device.index);
  return kernels::to_dtype(staged, options.dtype);
}
}  // namespace

Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions options) {
  Shape s = shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape;
  TANDEM_CHECK_AS(ValueError, shape_numel(s) == static_cast<int64_t>(values.size()), "from_vector: ",
                  values.size(), " values do not fill shape ", shape_str(s), " (", shape_numel(s),
                  " elements)");
  if (options.device.is_cuda()) return upload(values.data(), s, DType::f64, options);
  Storage storage = Storage::allocate(values.size() * sizeof(double), Device());
  std::copy(values.begin(), values.end(), static_cast<double*>(storage.data()));
  Tensor host(std::move(storage), s, contiguous_strides(s), 0, DType::f64);
  return kernels::to_dtype(host, options.dtype);
}

Tensor from_vector(const std::vector<float>& values, const Shape& shape, TensorOptions options) {
  return from_vector(std::vector<double>(values.begin(), values.end()), shape, options);
}

Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, TensorOptions options) {
  // Through i64 on the host so that large integers survive exactly.
  Shape s = shape.empty() ? Shape{static_cast<int64_t>(values.size())} : shape;
  TANDEM_CHECK_AS(ValueError, shape_numel(s) == static_cast<int64_t>(values.size()), "from_vector: ",
                  values.size(), " values do not fill shape ", shape_str(s));
  if (options.device.is_cuda()) return upload(values.data(), s, DType::i64, options);
  Storage storage = Storage::allocate(values.size() * sizeof(int64_t), Device());
  std::copy(values.begin(), values.end(), static_cast<int64_t*>(storage.data()));
  Tensor host(std::move(storage), s, contiguous_strides(s), 0, DType::i64);
  return kernels::to_dtype(host, options.dtype);
}

Tensor tensor(std::initializer_list<double> values, TensorOptions options) {
  return from_vector(std::vector<double>(values), {}, options);
}

Tensor pin_memory(const Tensor& t) {
  TANDEM_CHECK_AS(DeviceError, t.device().is_cpu(), "pin_memory: only cpu tensors can be pinned, got one on ", t.device());
  Storage storage = Storage::allocate_pinned(t.nbytes());
  Tensor pinned(std::move(storage), t.shape(), contiguous_strides(t.shape()), 0, t.dtype());
  kernels::copy_(pinned, t);
  return pinned;
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.options(), t.suggest_memory_format()); }
Tensor zeros_like(const Tensor& t) { return full_like(t, 0.0); }
Tensor ones_like(const Tensor& t) { return full_like(t, 1.0); }
Tensor full_like(const Tensor& t, double value) {
  Tensor out = empty_like(t);
  kernels::fill_(out, value);
  return out;
}

}  // namespace tandem
