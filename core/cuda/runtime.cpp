// CUDA runtime helpers and the CUDA arena (runtime.h, allocator.h). Host code only: compiled by
// the host compiler against the CUDA runtime API.
#include "regen/core/cuda/runtime.h"

#ifdef REGEN_WITH_CUDA
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "regen/core/allocator.h"

namespace regen::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

void set_device(int index) {
  // Every launch calls this: remember the visible count and this thread's current device.
  static const int n = device_count();
  thread_local int current = -1;
  if (index == current) return;
  REGEN_CHECK(index >= 0 && index < n, "CUDA device ", index, " does not exist (", n,
              " device(s) visible)");
  REGEN_CUDA_CHECK(cudaSetDevice(index));
  current = index;
}

int current_device() {
  int d = 0;
  REGEN_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

cudaStream_t stream() {
  static std::mutex mutex;
  static std::vector<cudaStream_t> streams;
  const int d = current_device();
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<int>(streams.size()) <= d) streams.resize(d + 1, nullptr);
  if (!streams[d]) REGEN_CUDA_CHECK(cudaStreamCreateWithFlags(&streams[d], cudaStreamNonBlocking));
  return streams[d];
}

void synchronize() { REGEN_CUDA_CHECK(cudaStreamSynchronize(stream())); }

void memcpy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  REGEN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream()));
  REGEN_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void memset_zero(void* dst, uint64_t bytes) {
  if (bytes == 0) return;
  REGEN_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream()));
}

void mem_get_info(uint64_t& free_bytes, uint64_t& total_bytes) {
  size_t f = 0, t = 0;
  REGEN_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  free_bytes = f;
  total_bytes = t;
}

DeviceGuard::DeviceGuard(int index) : previous_(current_device()), index_(index) {
  set_device(index);
}

DeviceGuard::~DeviceGuard() {
  if (previous_ == index_) return;
  try {
    set_device(previous_);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regen: restoring CUDA device %d failed: %s\n", previous_, e.what());
  }
}

}  // namespace regen::cuda

namespace regen {
namespace {
class CudaArena final : public Arena {
 public:
  explicit CudaArena(int index) : index_(index) { cuda::DeviceGuard check_exists(index); }
  void* map(size_t bytes) override {
    cuda::DeviceGuard guard(index_);
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;  // the allocator frees its cache and retries, then reports OutOfMemory
    }
    REGEN_CUDA_CHECK(err);
    return p;
  }
  // Called by empty_cache() and by the allocator's destructor, so it never throws: a failure is
  // printed (the segment may stay mapped on the device) and the CUDA error is cleared.
  void unmap(void* base, size_t bytes) override {
    try {
      cuda::DeviceGuard guard(index_);
      // Blocks are freed in stream order: wait for the kernels queued on this arena's device
      // (not the caller's current one) before the memory goes back.
      REGEN_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
      REGEN_CUDA_CHECK(cudaFree(base));
    } catch (const std::exception& e) {
      cudaGetLastError();
      std::fprintf(stderr, "regen: cuda:%d: returning a segment of %zu bytes at %p failed: %s\n",
                   index_, bytes, base, e.what());
    }
  }
  Device device() const override { return Device::cuda(index_); }
  std::string name() const override { return "cuda:" + std::to_string(index_); }

 private:
  int index_;
};
}  // namespace

std::unique_ptr<Arena> make_cuda_arena(int device_index) {
  return std::make_unique<CudaArena>(device_index);
}
}  // namespace regen
#endif
