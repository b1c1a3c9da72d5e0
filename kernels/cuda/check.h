// Error macros of the CUDA backend: REGEN_CUBLAS_CHECK, REGEN_CUDNN_CHECK and
// REGEN_CUDA_LAUNCH_CHECK. Like REGEN_CUDA_CHECK (core/cuda/runtime.h) they throw regen::Error
// naming the call (or the launcher), the library's status and file:line; nothing exits.
// The macros name library functions only when expanded, so this header pulls in no cuBLAS or
// cuDNN headers: a file that uses REGEN_CUBLAS_CHECK includes <cublas_v2.h> itself, one that uses
// REGEN_CUDNN_CHECK includes <cudnn.h> (cuDNN builds only, REGEN_WITH_CUDNN).
#pragma once

#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#include "regen/core/error.h"

#define REGEN_CUBLAS_CHECK(call)                                                          \
  do {                                                                                    \
    const cublasStatus_t regen_status_ = (call);                                          \
    if (regen_status_ != CUBLAS_STATUS_SUCCESS) {                                         \
      ::regen::detail::throw_error(                                                       \
          __FILE__, __LINE__,                                                             \
          ::regen::detail::str_cat("cuBLAS call ", #call,                                 \
                                   " failed: ", cublasGetStatusName(regen_status_), " (", \
                                   cublasGetStatusString(regen_status_), ")"));           \
    }                                                                                     \
  } while (0)

#define REGEN_CUDNN_CHECK(call)                                                                   \
  do {                                                                                            \
    const cudnnStatus_t regen_status_ = (call);                                                   \
    if (regen_status_ != CUDNN_STATUS_SUCCESS) {                                                  \
      ::regen::detail::throw_error(__FILE__, __LINE__,                                            \
                                   ::regen::detail::str_cat("cuDNN call ", #call, " failed: ",    \
                                                            cudnnGetErrorString(regen_status_))); \
    }                                                                                             \
  } while (0)

// After every <<<...>>> launch: a bad configuration (too many threads, too much shared memory, no
// kernel image for this GPU) is reported here, naming the launcher. Errors of the kernel's
// execution surface at the next synchronizing call, unless REGEN_CUDA_SYNC=1
// (cuda::sync_launches(), core/cuda/runtime.h): then the stream is synchronized here and a fault
// is reported under this launcher's name.
#define REGEN_CUDA_LAUNCH_CHECK(launcher)                                                \
  do {                                                                                   \
    const cudaError_t regen_err_ = cudaGetLastError();                                   \
    if (regen_err_ != cudaSuccess) {                                                     \
      ::regen::detail::throw_error(                                                      \
          __FILE__, __LINE__,                                                            \
          ::regen::detail::str_cat("CUDA kernel launch in ", launcher,                   \
                                   " failed: ", cudaGetErrorName(regen_err_), " (",      \
                                   cudaGetErrorString(regen_err_), ")"));                \
    }                                                                                    \
    if (::regen::cuda::sync_launches()) ::regen::cuda::check_launch_completed(launcher); \
  } while (0)

#endif
