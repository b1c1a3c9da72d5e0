// Host-side helpers shared by the CUDA launchers (kernels/cuda/*.cu, *.cpp): the current device,
// grid sizing for grid-stride loops, a kernel's dynamic shared-memory limit, and reading a small
// result back to the host.
#pragma once

#ifdef REGEN_WITH_CUDA
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>

#include "regen/core/cuda/graph.h"
#include "regen/core/cuda/runtime.h"
#include "regen/core/types.h"

namespace regen::cuda::detail {

// The device REGEN_LAUNCH made current: where a launcher's Workspace must live.
inline Device device() {
  return Device::cuda(current_device());
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Blocks for a grid-stride loop over n items with `threads` per block. The cap keeps enough
// blocks for every SM of an H100 many times over; element-wise kernels need no more.
constexpr int64_t kMaxGridBlocks = 8192;
inline unsigned grid_blocks(int64_t n, int threads) {
  int64_t b = ceil_div(n, threads);
  if (b < 1) b = 1;
  if (b > kMaxGridBlocks) b = kMaxGridBlocks;
  return static_cast<unsigned>(b);
}

// Copies one value from device memory to the host; synchronizes the compute stream, so use it
// only where a launcher must report a data-dependent error (bad ids, bad targets).
template <class T>
T read_back(const T* device_ptr) {
  T value{};
  memcpy(&value, device_ptr, sizeof(T), cudaMemcpyDeviceToHost);
  return value;
}

// A flag a kernel raised for data-dependent errors (bad ids, bad targets), read back to report
// them; `none` while the compute stream is captured (core/cuda/graph.h): a graph cannot read it,
// so a captured step's kernels do not check its batch (docs/memory.md, "One CUDA graph per step").
template <class T>
T read_back_flag(const T* device_ptr, T none) {
  if (capturing()) return none;
  return read_back(device_ptr);
}

// Raises a kernel's dynamic shared-memory limit on the current device to `smem`. The attribute
// stays with the kernel on its device, so the driver call is made once per (kernel, device), again
// only when a launch needs more than was set.
inline void allow_shared_memory(const void* kernel, size_t smem) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> allowed;
  const std::pair<const void*, int> key{kernel, current_device()};
  std::lock_guard<std::mutex> lock(mutex);
  size_t& have = allowed[key];
  if (smem <= have) return;
  REGEN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  have = smem;
}

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace regen::cuda::detail
#endif
