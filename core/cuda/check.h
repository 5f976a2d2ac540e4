#pragma once
// Checks for CUDA runtime calls: a failure becomes a BackendError naming the call and CUDA's text.
// The error is also taken off the thread's last-error slot, so that a kernel launch's check after
// it does not report it again (an error that breaks the context stays: every later call fails).
#include <cuda_runtime.h>

#include "tandem/core/error.h"

#define TANDEM_CUDA_CHECK(call)                                                                        \
  do {                                                                                                 \
    cudaError_t tandem_status_ = (call);                                                               \
    if (tandem_status_ != cudaSuccess) {                                                               \
      cudaGetLastError();                                                                              \
      throw ::tandem::BackendError(                                                                    \
          ::tandem::detail::concat("CUDA error ", cudaGetErrorName(tandem_status_), ": ",               \
                                   cudaGetErrorString(tandem_status_)),                                \
          #call, __FILE__, __LINE__);                                                                  \
    }                                                                                                  \
  } while (0)
