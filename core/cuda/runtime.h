// The CUDA runtime layer of core: device discovery, the one compute stream, copies, and the
// REGEN_CUDA_CHECK macro. Compiled only when REGEN_WITH_CUDA is defined. The CUDA arena that
// backs the caching allocator lives in runtime.cpp too; nothing else in regen calls cudaMalloc.
// Tests: tests/cuda/test_cuda_allocator.cpp.
#pragma once

#ifdef REGEN_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

#include "regen/core/error.h"

// Throws regen::Error naming the failed call, the CUDA error and file:line.
#define REGEN_CUDA_CHECK(call)                                                                 \
  do {                                                                                         \
    cudaError_t regen_err_ = (call);                                                           \
    if (regen_err_ != cudaSuccess) {                                                           \
      ::regen::detail::throw_error(__FILE__, __LINE__,                                         \
                                   ::regen::detail::str_cat("CUDA call ", #call, " failed: ",  \
                                                            cudaGetErrorName(regen_err_), " (", \
                                                            cudaGetErrorString(regen_err_), ")")); \
    }                                                                                          \
  } while (0)

namespace regen::cuda {

// Number of usable devices; 0 when there is no driver or no GPU (never throws).
int device_count();
// Makes `index` current on this thread (checks it exists).
void set_device(int index);
int current_device();
// The compute stream of the current device, created on first use. Every regen kernel and copy
// is issued on it, so freeing a block while earlier kernels are queued is safe (stream order).
cudaStream_t stream();
void synchronize();
// Copies between host and device memory on the compute stream; returns after the copy is done.
void memcpy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind);
void memset_zero(void* dst, uint64_t bytes);
// cudaMemGetInfo of the current device.
void mem_get_info(uint64_t& free_bytes, uint64_t& total_bytes);

// Makes `index` the current device for the guard's lifetime, then restores the previous one.
// The constructor throws like set_device; the destructor never throws (a failure to restore is
// printed to stderr).
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
  int index_;
};

}  // namespace regen::cuda
#endif
