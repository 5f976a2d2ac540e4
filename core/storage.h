#pragma once
#include <cstddef>
#include <functional>
#include <memory>

#include "tandem/core/device.h"

namespace tandem {

// A reference-counted block of device or host memory. Tensors that are views of each other share
// one Storage; the memory goes back to its allocator when the last of them is gone.
class Storage {
 public:
  Storage() = default;
  // Allocates `nbytes` on `device` through that device's allocator.
  static Storage allocate(size_t nbytes, Device device);
  // Page-locked host memory (needs the CUDA backend): copies from it to a GPU do not block.
  static Storage allocate_pinned(size_t nbytes);
  // Wraps memory owned elsewhere; `release` is called once when the last reference goes.
  static Storage wrap(void* data, size_t nbytes, Device device, std::function<void(void*)> release);

  void* data() const { return impl_ ? impl_->data : nullptr; }
  size_t nbytes() const { return impl_ ? impl_->nbytes : 0; }
  Device device() const { return impl_ ? impl_->device : Device(); }
  bool defined() const { return impl_ != nullptr; }
  long use_count() const { return impl_.use_count(); }
  bool is_same(const Storage& other) const { return impl_ == other.impl_; }
  bool is_pinned() const { return impl_ && impl_->pinned; }

 private:
  struct Impl {
    void* data = nullptr;
    size_t nbytes = 0;
    Device device;
    std::function<void(void*)> release;
    bool pinned = false;
    ~Impl();
  };
  std::shared_ptr<Impl> impl_;
};

}  // namespace tandem
