#pragma once
// Checks for MPI and NCCL calls: a failure becomes a BackendError naming the call and the library's
// text. The file that expands a macro includes <mpi.h> or <nccl.h> itself, so this header needs
// neither.
#include "tandem/core/error.h"

// MPI calls on a communicator whose error handler is MPI_ERRORS_RETURN.
#define TANDEM_MPI_CHECK(call)                                                                            \
  do {                                                                                                    \
    int tandem_mpi_status_ = (call);                                                                      \
    if (tandem_mpi_status_ != MPI_SUCCESS) {                                                              \
      char tandem_mpi_text_[MPI_MAX_ERROR_STRING] = {};                                                   \
      int tandem_mpi_length_ = 0;                                                                         \
      MPI_Error_string(tandem_mpi_status_, tandem_mpi_text_, &tandem_mpi_length_);                        \
      throw ::tandem::BackendError(::tandem::detail::concat("MPI error ", tandem_mpi_status_, ": ",       \
                                                            tandem_mpi_text_),                            \
                                   #call, __FILE__, __LINE__);                                            \
    }                                                                                                     \
  } while (0)

// NCCL calls that must succeed at once.
#define TANDEM_NCCL_CHECK(call) TANDEM_NCCL_CHECK_IMPL(call, false)
// NCCL calls on a non-blocking communicator, which may also answer ncclInProgress (the caller then
// polls ncclCommGetAsyncError until the communicator is ready).
#define TANDEM_NCCL_CHECK_ASYNC(call) TANDEM_NCCL_CHECK_IMPL(call, true)

#define TANDEM_NCCL_CHECK_IMPL(call, in_progress_ok)                                                      \
  do {                                                                                                    \
    ncclResult_t tandem_nccl_status_ = (call);                                                            \
    if (tandem_nccl_status_ != ncclSuccess && !((in_progress_ok) && tandem_nccl_status_ == ncclInProgress)) { \
      const char* tandem_nccl_last_ = ncclGetLastError(nullptr);                                          \
      bool tandem_nccl_has_last_ = tandem_nccl_last_ != nullptr && tandem_nccl_last_[0] != '\0';          \
      throw ::tandem::BackendError(                                                                       \
          ::tandem::detail::concat("NCCL error ", ncclGetErrorString(tandem_nccl_status_),                \
                                   tandem_nccl_has_last_ ? ": " : "",                                     \
                                   tandem_nccl_has_last_ ? tandem_nccl_last_ : ""),                       \
          #call, __FILE__, __LINE__);                                                                     \
    }                                                                                                     \
  } while (0)
