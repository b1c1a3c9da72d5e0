// CUDA runtime helpers and the CUDA arena (runtime.h, allocator.h). Host code only: compiled by
// the host compiler against the CUDA runtime API.
#include "regen/core/cuda/runtime.h"

#include "regen/core/cuda/graph.h"

#ifdef REGEN_WITH_CUDA
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "regen/core/allocator.h"

namespace regen::cuda {

DeviceProbe classify_device_query(cudaError_t count_error, int count, int driver_version,
                                  int runtime_version) {
  DeviceProbe p;
  p.driver_version = driver_version;
  p.runtime_version = runtime_version;
  if (count_error == cudaSuccess) {
    p.count = count;
    return p;
  }
  if (count_error == cudaErrorNoDevice) return p;  // a driver, no GPU
  if (count_error == cudaErrorInsufficientDriver && driver_version == 0) return p;  // no driver
  p.error = detail::str_cat("the CUDA runtime cannot use the GPU: cudaGetDeviceCount failed with ",
                            cudaGetErrorName(count_error), " (", cudaGetErrorString(count_error),
                            "); CUDA driver ", driver_version, ", runtime ", runtime_version);
  if (count_error == cudaErrorInsufficientDriver) {
    p.error +=
        " (the installed driver is older than this runtime needs: update the driver or "
        "build against an older CUDA toolkit)";
  }
  return p;
}

const DeviceProbe& probe_devices() {
  static const DeviceProbe probe = [] {
    int n = 0, driver = 0, runtime = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    cudaGetLastError();  // a failed query leaves its error behind; clear it
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    cudaGetLastError();
    return classify_device_query(err, n, driver, runtime);
  }();
  return probe;
}

int device_count() {
  const DeviceProbe& p = probe_devices();
  REGEN_CHECK(p.error.empty(), p.error);
  return p.count;
}

namespace {
// An on/off switch from the environment: unset or "0" is off, "1" on, anything else an error.
bool env_switch(const char* name) {
  const char* v = std::getenv(name);
  if (!v || std::strcmp(v, "0") == 0) return false;
  if (std::strcmp(v, "1") == 0) return true;
  REGEN_FAIL(name, "='", v, "' is not 0 or 1");
}

// -1: not read yet; 0/1: off/on.
std::atomic<int> g_sync_launches{-1};
}  // namespace

bool require_gpu() {
  return env_switch("REGEN_REQUIRE_GPU");
}

bool sync_launches() {
  int v = g_sync_launches.load(std::memory_order_relaxed);
  if (v < 0) {
    v = env_switch("REGEN_CUDA_SYNC") ? 1 : 0;
    g_sync_launches.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_sync_launches(bool enabled) {
  g_sync_launches.store(enabled ? 1 : 0);
}

void check_launch_completed(const char* launcher) {
  if (capturing()) return;  // a captured launch runs when the graph does
  const cudaError_t err = cudaStreamSynchronize(stream());
  if (err != cudaSuccess) {
    REGEN_FAIL("CUDA work queued by ", launcher,
               " failed (REGEN_CUDA_SYNC): ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
               ")");
  }
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

void synchronize() {
  // While the step is captured nothing has run, so there is nothing to wait for; a capturing
  // stream refuses the call (graph.h).
  if (capturing()) return;
  REGEN_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

StreamTimeline::~StreamTimeline() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);  // never throws
}

void StreamTimeline::record() {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    REGEN_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  REGEN_CUDA_CHECK(cudaEventRecord(events_[used_], stream()));
  ++used_;
}

std::vector<double> StreamTimeline::elapsed() {
  std::vector<double> out(used_, 0.0);
  if (used_ == 0) return out;
  REGEN_CUDA_CHECK(cudaEventSynchronize(events_[used_ - 1]));
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0;
    REGEN_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[0], events_[i]));
    out[i] = ms;
  }
  return out;
}

void memcpy(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  if (capturing()) {
    // A device-to-device copy is captured like a kernel; the host cannot wait for one.
    if (kind != cudaMemcpyDeviceToDevice) refuse_host_copy_in_capture(bytes, kind);
    REGEN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream()));
    return;
  }
  REGEN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, stream()));
  REGEN_CUDA_CHECK(cudaStreamSynchronize(stream()));
}

void copy_between_devices(void* dst, int dst_device, const void* src, int src_device,
                          uint64_t bytes) {
  if (bytes == 0) return;
  if (dst_device == src_device) {
    DeviceGuard guard(dst_device);
    memcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
    return;
  }
  // The event belongs to the source device and is recorded on its stream; it is destroyed there
  // whatever happens after.
  struct Event {
    cudaEvent_t event = nullptr;
    int device;
    ~Event() {
      if (!event) return;
      int current = -1;
      cudaGetDevice(&current);
      cudaSetDevice(device);
      cudaEventDestroy(event);
      if (current >= 0) cudaSetDevice(current);
    }
  } ready{nullptr, src_device};
  {
    DeviceGuard guard(src_device);
    REGEN_CUDA_CHECK(cudaEventCreateWithFlags(&ready.event, cudaEventDisableTiming));
    REGEN_CUDA_CHECK(cudaEventRecord(ready.event, stream()));
  }
  DeviceGuard guard(dst_device);
  REGEN_CUDA_CHECK(cudaStreamWaitEvent(stream(), ready.event, 0));
  REGEN_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, stream()));
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

namespace {
// Page-locked host memory (the host tier of a CUDA device): what cudaMemcpyAsync needs to copy
// while kernels run, instead of staging through a driver buffer and waiting for the host.
class PinnedHostArena final : public Arena {
 public:
  explicit PinnedHostArena(int index) : index_(index) { cuda::DeviceGuard check_exists(index); }
  void* map(size_t bytes) override {
    cuda::DeviceGuard guard(index_);
    void* p = nullptr;
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    REGEN_CUDA_CHECK(err);
    return p;
  }
  // Never throws (see CudaArena::unmap). Copies into or out of a segment are waited for before
  // its last block is freed, so nothing queued still reads it.
  void unmap(void* base, size_t bytes) override {
    try {
      cuda::DeviceGuard guard(index_);
      REGEN_CUDA_CHECK(cudaFreeHost(base));
    } catch (const std::exception& e) {
      cudaGetLastError();
      std::fprintf(stderr,
                   "regen: pinned host memory of cuda:%d: returning %zu bytes at %p "
                   "failed: %s\n",
                   index_, bytes, base, e.what());
    }
  }
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "pinned host of cuda:" + std::to_string(index_); }

 private:
  int index_;
};
}  // namespace

std::unique_ptr<Arena> make_pinned_host_arena(int device_index) {
  return std::make_unique<PinnedHostArena>(device_index);
}
}  // namespace regen
#endif
