#pragma once
// Tensor: a cheap value handle to shared metadata (sizes, strides, offset, dtype, device) and a
// reference-counted Storage. Copying a Tensor shares everything; views share the storage.
//
// Core knows nothing of autograd beyond an opaque pointer: the autograd accessors declared at the
// bottom (requires_grad, grad, backward, ...) are defined in autograd/, so no kernel touches them.
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <type_traits>
#include <vector>

#include "tandem/core/device.h"
#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/core/memory_format.h"
#include "tandem/core/shape.h"
#include "tandem/core/storage.h"

namespace tandem {

namespace autograd {
struct AutogradMeta;
}

struct TensorOptions {
  DType dtype = DType::f32;
  Device device;
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}                 // NOLINT: lets f(shape, DType::f64) read well
  TensorOptions(Device dev) : device(dev) {}           // NOLINT
  TensorOptions(DType d, Device dev) : dtype(d), device(dev) {}
};

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing
  // A tensor over `storage` with the given layout. Throws if the layout reaches past the storage.
  Tensor(Storage storage, Shape shape, Strides strides, int64_t offset, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Strides& strides() const { return impl().strides; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t offset() const { return impl().offset; }  // in elements, into the storage
  int64_t numel() const { return impl().numel; }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage.device(); }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  bool is_contiguous() const { return impl().contiguous; }  // row-major, no gaps (cached)
  // Dense in `format` (channels_last: 4-D with strides (H*W*C, 1, W*C, C); size-1 dims ignored).
  bool is_contiguous(MemoryFormat format) const;
  // channels_last for a 4-D tensor laid out channels-last and not also row-major (a tensor that is
  // both, as with C == 1 or H == W == 1, counts as contiguous); contiguous otherwise. The layout
  // that outputs computed from this tensor take.
  MemoryFormat suggest_memory_format() const;
  const Storage& storage() const { return impl().storage; }
  bool is_pinned() const { return impl().storage.is_pinned(); }
  TensorOptions options() const { return TensorOptions(dtype(), device()); }

  // Address of the first element. data<T>() checks that T matches the dtype.
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    TANDEM_CHECK_AS(TypeError, DTypeOf<T>::value == dtype(), "data<", dtype_name(DTypeOf<T>::value),
                    ">(): the tensor holds ", dtype_name(dtype()));
    return static_cast<T*>(data_ptr());
  }

  // A view of the same storage with another layout (no copy, no autograd).
  Tensor as_strided(Shape shape, Strides strides, int64_t offset) const;
  // Makes this tensor (every handle to it) refer to `source`'s data and layout, keeping its
  // autograd state. How a module moves its parameters to another device or dtype in place.
  void set_data(const Tensor& source) const;
  // True when both handles point at the same metadata.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  long use_count() const { return impl_.use_count(); }

  // The single value of a one-element tensor, converted to T (copies from the device if needed).
  template <typename T = double>
  T item() const {
    if constexpr (std::is_integral_v<T>) {
      if (!is_floating(dtype())) return static_cast<T>(to_vector<int64_t>().at(0));
    }
    return static_cast<T>(item_double());
  }
  // All values in row-major order, converted to T (copies from the device if needed).
  template <typename T>
  std::vector<T> to_vector() const {
    if constexpr (std::is_integral_v<T>) {
      if (!is_floating(dtype())) {  // exact for every 64-bit value, unlike a trip through double
        std::vector<int64_t> values = to_int64_vector();
        return std::vector<T>(values.begin(), values.end());
      }
    }
    std::vector<double> values = to_double_vector();
    return std::vector<T>(values.begin(), values.end());
  }
  std::vector<double> to_double_vector() const;
  std::vector<int64_t> to_int64_vector() const;
  double item_double() const;

  // ---- autograd (defined in autograd/tensor_autograd.cpp) ----
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires = true);  // only on leaves
  bool is_leaf() const;                           // no grad_fn: created by the user, not an op
  Tensor grad() const;                            // undefined until backward reaches this leaf
  void set_grad(const Tensor& grad) const;        // replace .grad (undefined clears it)
  // Runs backward from this tensor. A scalar may omit `gradient` (it defaults to 1).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;  // shares storage, no history, requires_grad false
  // Called with the leaf after each accumulation into its .grad (what DDP listens to).
  void register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook);
  std::shared_ptr<autograd::AutogradMeta>& autograd_meta() const { return impl().autograd; }

  // ---- differentiable methods, as in PyTorch: x.f(...) is f(x, ...) of autograd/ops.h
  // (defined in autograd/tensor_methods.cpp) ----
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor reshape(const Shape& shape) const;
  Tensor view(const Shape& shape) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor permute(const std::vector<int64_t>& order) const;
  Tensor t() const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor expand(const Shape& shape) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor contiguous() const;
  // This tensor laid out in `format` (itself when it already is); the gradient comes back in the
  // input's layout. to(format) is the same op, named as in PyTorch's x.to(memory_format=...).
  Tensor contiguous(MemoryFormat format) const;
  Tensor to(MemoryFormat format) const;
  Tensor clone() const;
  Tensor sum(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor mean(const std::vector<int64_t>& dims = {}, bool keepdim = false) const;
  Tensor max() const;  // the largest element, 0-dim (amax over every dim)
  Tensor min() const;
  Tensor argmax() const;  // flat index of the largest element
  Tensor matmul(const Tensor& other) const;
  Tensor pow(double exponent) const;
  Tensor pow(const Tensor& exponent) const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor abs() const;
  Tensor neg() const;
  Tensor sin() const;
  Tensor cos() const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;
  Tensor clamp(double min, double max) const;
  Tensor masked_fill(const Tensor& mask, double value) const;
  Tensor tril(int64_t diagonal = 0) const;
  Tensor triu(int64_t diagonal = 0) const;

 private:
  struct Impl {
    Storage storage;
    Shape shape;              // sizes per dim
    Strides strides;          // elements per step in each dim
    int64_t offset = 0;       // elements from the start of storage
    int64_t numel = 0;
    DType dtype = DType::f32;
    bool contiguous = true;
    mutable std::shared_ptr<autograd::AutogradMeta> autograd;  // null until autograd needs it
  };
  Impl& impl() const {
    TANDEM_CHECK_AS(ValueError, impl_ != nullptr, "use of an undefined tensor (default-constructed or moved-from)");
    return *impl_;
  }
  std::shared_ptr<Impl> impl_;
};

std::ostream& operator<<(std::ostream& out, const Tensor& t);

// ---- factories (no autograd history; call requires_grad_() on the result for a parameter) ----
Tensor empty(const Shape& shape, TensorOptions options = {});
Tensor empty(const Shape& shape, TensorOptions options, MemoryFormat format);  // strides of `format`
Tensor zeros(const Shape& shape, TensorOptions options = {});
Tensor zeros(const Shape& shape, TensorOptions options, MemoryFormat format);
Tensor ones(const Shape& shape, TensorOptions options = {});
Tensor full(const Shape& shape, double value, TensorOptions options = {});
Tensor arange(double start, double end, double step = 1.0, TensorOptions options = {});
Tensor arange(int64_t end, TensorOptions options = DType::i64);
Tensor scalar_tensor(double value, TensorOptions options = {});  // 0-dim
// Values in row-major order; shape defaults to 1-D.
Tensor from_vector(const std::vector<double>& values, const Shape& shape = {}, TensorOptions options = {});
Tensor from_vector(const std::vector<float>& values, const Shape& shape = {}, TensorOptions options = {});
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape = {},
                   TensorOptions options = DType::i64);
Tensor tensor(std::initializer_list<double> values, TensorOptions options = {});
// A contiguous copy of a cpu tensor in page-locked memory, for asynchronous uploads to a GPU.
// An upload from it returns before the copy has run: do not write into the pinned tensor again
// until the device's stream has passed the copy (cuda::synchronize, or an event).
Tensor pin_memory(const Tensor& t);
// The *_like factories keep t's memory format (t.suggest_memory_format()), as PyTorch's do.
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);

}  // namespace tandem
