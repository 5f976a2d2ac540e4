// CPU index kernels: index_select / index_add along a dim, gather / scatter_add.
#include <cstring>

#include "tandem/core/backend.h"
#include "tandem/core/dispatch.h"

namespace tandem::cpu {

namespace {
int64_t checked_index(const char* op, int64_t i, int64_t size) {
  int64_t wrapped = i < 0 ? i + size : i;  // negative indices count from the end, like PyTorch
  TANDEM_CHECK_AS(IndexError, wrapped >= 0 && wrapped < size, op, ": index ", i, " is out of range for a dim of size ",
                  size, size > 0 ? detail::concat(" (expected ", -size, " to ", size - 1, ")") : " (the dim is empty)");
  return wrapped;
}
}  // namespace

void index_select(const Tensor& x, const Tensor& index, const Tensor& out) {
  const int64_t outer = x.shape()[0], n = x.shape()[1], inner = x.shape()[2], k = index.numel();
  const int64_t* idx = index.data<int64_t>();
  size_t row_bytes = static_cast<size_t>(inner) * x.element_size();
  const char* src = static_cast<const char*>(x.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (int64_t j = 0; j < k; ++j) checked_index("index_select", idx[j], n);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < k; ++j) {
      int64_t r = idx[j] < 0 ? idx[j] + n : idx[j];
      std::memcpy(dst + (o * k + j) * row_bytes, src + (o * n + r) * row_bytes, row_bytes);
    }
  }
}

void index_add(const Tensor& out, const Tensor& index, const Tensor& src, bool /*in_order: always*/) {
  dispatch_numeric(out.dtype(), "index_add", "cpu", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const int64_t outer = out.shape()[0], n = out.shape()[1], inner = out.shape()[2], k = index.numel();
    const int64_t* idx = index.data<int64_t>();
    for (int64_t j = 0; j < k; ++j) checked_index("index_add", idx[j], n);
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < k; ++j) {
        int64_t r = idx[j] < 0 ? idx[j] + n : idx[j];
        T* d = out.data<T>() + (o * n + r) * inner;
        const T* s = src.data<T>() + (o * k + j) * inner;
        for (int64_t i = 0; i < inner; ++i) d[i] = T(static_cast<C>(d[i]) + static_cast<C>(s[i]));
      }
    }
  });
}

void gather(const Tensor& x, const Tensor& index, const Tensor& out) {
  dispatch_all(x.dtype(), "gather", "cpu", [&](auto tag) {
    using T = decltype(tag);
    const int64_t outer = x.shape()[0], n = x.shape()[1], inner = x.shape()[2], k = index.shape()[1];
    const int64_t* idx = index.data<int64_t>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < k; ++j) {
        for (int64_t i = 0; i < inner; ++i) {
          int64_t pos = (o * k + j) * inner + i;
          int64_t r = checked_index("gather", idx[pos], n);
          out.data<T>()[pos] = x.data<T>()[(o * n + r) * inner + i];
        }
      }
    }
  });
}

void scatter_add(const Tensor& out, const Tensor& index, const Tensor& src) {
  dispatch_numeric(out.dtype(), "scatter_add", "cpu", [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const int64_t outer = out.shape()[0], n = out.shape()[1], inner = out.shape()[2], k = index.shape()[1];
    const int64_t* idx = index.data<int64_t>();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < k; ++j) {
        for (int64_t i = 0; i < inner; ++i) {
          int64_t pos = (o * k + j) * inner + i;
          int64_t r = checked_index("scatter_add", idx[pos], n);
          T& d = out.data<T>()[(o * n + r) * inner + i];
          d = T(static_cast<C>(d) + static_cast<C>(src.data<T>()[pos]));
        }
      }
    }
  });
}

}  // namespace tandem::cpu
