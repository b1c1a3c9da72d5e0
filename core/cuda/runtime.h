// The CUDA runtime layer of core: device discovery, the one compute stream, copies, and the
// REGEN_CUDA_CHECK macro. Compiled only when REGEN_WITH_CUDA is defined. The CUDA arena that
// backs the caching allocator lives in runtime.cpp too; nothing else in regen calls cudaMalloc.
// Tests: tests/cuda/test_cuda_allocator.cpp.
#pragma once

#ifdef REGEN_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "regen/core/error.h"

// Throws regen::Error naming the failed call, the CUDA error and file:line.
#define REGEN_CUDA_CHECK(call)                                                                     \
  do {                                                                                             \
    cudaError_t regen_err_ = (call);                                                               \
    if (regen_err_ != cudaSuccess) {                                                               \
      ::regen::detail::throw_error(                                                                \
          __FILE__, __LINE__,                                                                      \
          ::regen::detail::str_cat("CUDA call ", #call, " failed: ", cudaGetErrorName(regen_err_), \
                                   " (", cudaGetErrorString(regen_err_), ")"));                    \
    }                                                                                              \
  } while (0)

namespace regen::cuda {

// What the CUDA runtime reports about the machine's devices (probe_devices()).
// A machine without a GPU is one where the runtime says there is no device
// (cudaErrorNoDevice), or where no CUDA driver is installed at all (cudaErrorInsufficientDriver
// with cudaDriverGetVersion reporting 0): `count` is 0 and `error` empty. Every other failure
// (a driver older than the runtime, a container without the device nodes, a bad
// CUDA_VISIBLE_DEVICES, ...) is a broken GPU setup, not a missing GPU: `error` names the
// runtime's error and what it means, so that a GPU machine whose runtime fails is never taken
// for a machine without a GPU (the GPU test suites fail then instead of reporting skipped).
struct DeviceProbe {
  int count = 0;
  std::string error;
  int driver_version = 0;   // cudaDriverGetVersion (0: no driver installed)
  int runtime_version = 0;  // cudaRuntimeGetVersion
};
// The decision above, from the results of cudaGetDeviceCount and cudaDriverGetVersion (a pure
// function, tested on machines with and without a GPU).
DeviceProbe classify_device_query(cudaError_t count_error, int count, int driver_version,
                                  int runtime_version);
// Asks the runtime once per process and caches the answer; never throws.
const DeviceProbe& probe_devices();
// Number of usable devices: 0 on a machine without a GPU. Throws regen::Error with the probe's
// message when the runtime fails otherwise (see DeviceProbe).
int device_count();

// REGEN_REQUIRE_GPU=1: a missing GPU is a failure, not a skip (GPU test suites; set by
// scripts/gpu-session.sh). Unset or 0: off. Any other value is a regen::Error naming it.
bool require_gpu();

// REGEN_CUDA_SYNC=1: every kernel launch (REGEN_CUDA_LAUNCH_CHECK) and every CUDA launcher called
// through REGEN_LAUNCH synchronizes the stream and checks for errors, so that a fault inside a
// kernel is reported under the launcher that caused it instead of at the next synchronizing call
// (slow; for debugging and the first run on a new GPU). Unset or 0: off; any other value is a
// regen::Error naming it. set_sync_launches overrides the variable.
bool sync_launches();
void set_sync_launches(bool enabled);
// Synchronizes the compute stream and throws regen::Error naming `launcher` and the CUDA error
// when the queued work failed (what sync_launches() runs after each launch).
void check_launch_completed(const char* launcher);
// Makes `index` current on this thread (checks it exists).
void set_device(int index);
int current_device();
// The compute stream of the current device, created on first use. Every regen kernel and copy
// is issued on it, so freeing a block while earlier kernels are queued is safe (stream order).
cudaStream_t stream();
void synchronize();
// Copies between host and device memory on the compute stream; returns after the copy is done.
void memcpy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind);
// Copies device memory of cuda:src_device to cuda:dst_device (they may be the same). The copy
// runs on the destination's compute stream after the work queued on the source's stream (an
// event recorded there and waited for: the streams are non-blocking, so without it the copy
// could read the source before the kernels writing it had run); returns after the copy is done.
void copy_between_devices(void* dst, int dst_device, const void* src, int src_device,
                          uint64_t bytes);
void memset_zero(void* dst, uint64_t bytes);
// Sets `count` elements of `width` bytes (2, 4 or 8) at dst to the low `width` bytes of `pattern`,
// on the compute stream, and returns at once (core/cuda/fill.cu): fill_, full and ones on CUDA,
// with the value converted to its bits on the host.
void fill_pattern(void* dst, int64_t count, int width, uint64_t pattern);
// cudaMemGetInfo of the current device.
void mem_get_info(uint64_t& free_bytes, uint64_t& total_bytes);

// Points on the current device's compute stream, timed by the device (the profiler's device
// timing, kernels::DeviceTimeline): record() queues an event after the work queued so far and
// returns at once; elapsed() waits for the last point and returns each point's milliseconds after
// the first. The events are created as needed and reused after clear().
class StreamTimeline {
 public:
  StreamTimeline() = default;
  ~StreamTimeline();
  StreamTimeline(const StreamTimeline&) = delete;
  StreamTimeline& operator=(const StreamTimeline&) = delete;
  void record();
  std::vector<double> elapsed();
  void clear() { used_ = 0; }

 private:
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

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
