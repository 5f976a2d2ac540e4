#include "tandem/core/storage.h"

#include <cstdlib>
#include <new>

#include "tandem/core/backend.h"
#include "tandem/core/error.h"

namespace tandem {

namespace {
constexpr size_t kHostAlignment = 64;  // a cache line, and enough for any SIMD load

void* host_allocate(size_t nbytes) {
  size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* p = std::aligned_alloc(kHostAlignment, rounded == 0 ? kHostAlignment : rounded);
  TANDEM_CHECK_AS(OutOfMemoryError, p != nullptr, "cpu: could not allocate ", nbytes, " bytes of host memory");
  return p;
}
}  // namespace

Storage::Impl::~Impl() {
  if (release) {
    try {
      release(data);
    } catch (...) {
      // Destructors never throw; a failed free during teardown is not recoverable anyway.
    }
  }
}

Storage Storage::allocate(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    return wrap(host_allocate(nbytes), nbytes, device, [](void* p) { std::free(p); });
  }
  void* p = cuda::device_allocate(nbytes, device.index);
  int index = device.index;
  return wrap(p, nbytes, device, [index](void* q) { cuda::device_free(q, index); });
}

Storage Storage::allocate_pinned(size_t nbytes) {
  Storage s = wrap(cuda::pinned_allocate(nbytes), nbytes, Device(), [](void* p) { cuda::pinned_free(p); });
  s.impl_->pinned = true;
  return s;
}

Storage Storage::wrap(void* data, size_t nbytes, Device device, std::function<void(void*)> release) {
  Storage s;
  s.impl_ = std::make_shared<Impl>();
  s.impl_->data = data;
  s.impl_->nbytes = nbytes;
  s.impl_->device = device;
  s.impl_->release = std::move(release);
  return s;
}

}  // namespace tandem
