// The runtime side of the host emulation (scripts/cuda-emu): runs a grid block after block, one
// OS thread per CUDA thread; stands in for the CUDA runtime calls regen makes and for
// core/cuda/runtime.cpp; "device" memory is host memory from a host-backed CUDA arena.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <utility>
#include "emu.h"

#include "regen/core/allocator.h"
#include "regen/core/copy_queue.h"
#include "regen/core/cuda/graph.h"
#include "regen/core/cuda/runtime.h"

// A captured graph and its executable: the recorded work, in order (emu_graph.h).
struct CUgraph_st {
  std::vector<std::function<void()>> work;
};
struct CUgraphExec_st {
  std::vector<std::function<void()>> work;
};

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
dim3 gridDim, blockDim;

namespace emu {
Block* g_block = nullptr;
std::vector<unsigned char> g_dyn_smem(256 << 10);
std::mutex atomic_mutex;
// The graph the (one) emulated stream is capturing into, and whether a call the capture does not
// support has invalidated it (as cudaStreamSynchronize on a capturing stream does).
CUgraph_st* g_capture = nullptr;
bool g_capture_invalidated = false;
bool capturing() {
  return g_capture != nullptr;
}
void record(std::function<void()> work) {
  g_capture->work.push_back(std::move(work));
}
void run_grid(const Cfg& cfg, const std::function<void()>& body) {
  gridDim = cfg.grid;
  blockDim = cfg.block;
  const unsigned nt = cfg.block.x * cfg.block.y * cfg.block.z;
  if (nt > 1024) {
    std::fprintf(stderr, "emu: block of %u threads\n", nt);
    std::abort();
  }
  if (cfg.smem > g_dyn_smem.size()) {
    std::fprintf(stderr, "emu: smem %zu\n", cfg.smem);
    std::abort();
  }
  for (unsigned bz = 0; bz < cfg.grid.z; ++bz)
    for (unsigned by = 0; by < cfg.grid.y; ++by)
      for (unsigned bx = 0; bx < cfg.grid.x; ++bx) {
        Block blk;
        blk.bar = std::make_unique<std::barrier<>>(nt);
        for (unsigned w = 0; w < (nt + 31) / 32; ++w)
          blk.warp_bar.push_back(std::make_unique<std::barrier<>>(std::min(32u, nt - 32 * w)));
        blk.slots.assign(nt, 0);
        g_block = &blk;
        // Poison dynamic shared memory so reads of unwritten smem show up.
        std::memset(g_dyn_smem.data(), 0xFF, cfg.smem);
        std::vector<std::thread> threads;
        threads.reserve(nt);
        for (unsigned t = 0; t < nt; ++t) {
          threads.emplace_back([&, t] {
            threadIdx = make_uint3(t % cfg.block.x, (t / cfg.block.x) % cfg.block.y,
                                   t / (cfg.block.x * cfg.block.y));
            blockIdx = make_uint3(bx, by, bz);
            body();
            blk.warp_bar[t / 32]->arrive_and_drop();
            blk.bar->arrive_and_drop();
          });
        }
        for (auto& th : threads) th.join();
      }
}
}  // namespace emu

// ---- CUDA runtime API stand-ins -----------------------------------------------------------------
extern "C" {
cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t) {
  return "emu";
}
const char* cudaGetErrorString(cudaError_t) {
  return "emu";
}
cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  emu::run_or_record([=] { std::memset(p, v, n); });
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind, cudaStream_t) {
  emu::run_or_record([=] { std::memmove(d, s, n); });
  return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void*, cudaFuncAttribute, int) {
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  if (emu::g_capture) {  // CUDA refuses it and invalidates the capture
    emu::g_capture_invalidated = true;
    return cudaErrorStreamCaptureUnsupported;
  }
  return cudaSuccess;
}
// ---- Stream capture and graphs (emu_graph.h)
// -----------------------------------------------------
cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  if (emu::g_capture) return cudaErrorIllegalState;
  emu::g_capture = new CUgraph_st();
  emu::g_capture_invalidated = false;
  return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = !emu::g_capture              ? cudaStreamCaptureStatusNone
            : emu::g_capture_invalidated ? cudaStreamCaptureStatusInvalidated
                                         : cudaStreamCaptureStatusActive;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  if (!emu::g_capture) return cudaErrorIllegalState;
  CUgraph_st* g = std::exchange(emu::g_capture, nullptr);
  if (std::exchange(emu::g_capture_invalidated, false)) {
    delete g;
    *graph = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = g;
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph,
                                          unsigned long long) {
  if (!graph) return cudaErrorInvalidValue;
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long f) {
  return cudaGraphInstantiateWithFlags(exec, graph, f);
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  if (!exec) return cudaErrorInvalidValue;
  if (emu::g_capture) return cudaErrorStreamCaptureUnsupported;  // no child graphs here
  for (const auto& work : exec->work) work();
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}
}

namespace regen::cuda {
DeviceProbe classify_device_query(cudaError_t, int count, int driver, int runtime) {
  DeviceProbe p;
  p.count = count;
  p.driver_version = driver;
  p.runtime_version = runtime;
  return p;
}
const DeviceProbe& probe_devices() {
  static const DeviceProbe p = classify_device_query(cudaSuccess, 1, 0, 0);
  return p;
}
int device_count() {
  return 1;
}
bool require_gpu() {
  return false;
}
bool sync_launches() {
  return false;  // every emulated launch runs to completion before it returns
}
void set_sync_launches(bool) {}
void check_launch_completed(const char*) {}
void copy_between_devices(void* d, int, const void* s, int, uint64_t n) {
  memcpy(d, s, n, cudaMemcpyDeviceToDevice);
}
void set_device(int) {}
int current_device() {
  return 0;
}
cudaStream_t stream() {
  return nullptr;
}
void synchronize() {}
// As core/cuda/runtime.cpp: while the stream captures, a device copy is recorded and a copy to or
// from the host is refused (graph.h).
void memcpy(void* d, const void* s, uint64_t n, cudaMemcpyKind kind) {
  if (n == 0) return;
  if (emu::capturing() && kind != cudaMemcpyDeviceToDevice) refuse_host_copy_in_capture(n, kind);
  emu::run_or_record([=] { std::memmove(d, s, n); });
}
void memset_zero(void* d, uint64_t n) {
  emu::run_or_record([=] { std::memset(d, 0, n); });
}
void mem_get_info(uint64_t& f, uint64_t& t) {
  f = t = 1ull << 34;
}
// Every emulated launch has run when it returns: the host clock is the device's. The emulation's
// events are the recorded times, each in a double the event pointer owns.
StreamTimeline::~StreamTimeline() {
  for (cudaEvent_t e : events_) delete reinterpret_cast<double*>(e);
}
void StreamTimeline::record() {
  static const auto t0 = std::chrono::steady_clock::now();
  if (used_ == events_.size()) events_.push_back(reinterpret_cast<cudaEvent_t>(new double(0)));
  *reinterpret_cast<double*>(events_[used_]) =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  ++used_;
}
std::vector<double> StreamTimeline::elapsed() {
  std::vector<double> out(used_, 0.0);
  for (size_t i = 1; i < used_; ++i) {
    out[i] = *reinterpret_cast<double*>(events_[i]) - *reinterpret_cast<double*>(events_[0]);
  }
  return out;
}
DeviceGuard::DeviceGuard(int index) : previous_(0), index_(index) {}
DeviceGuard::~DeviceGuard() {}
}  // namespace regen::cuda

namespace regen {
namespace {
// Host memory for the emulated device's arena (Device::cuda(0)) and for its host tier
// (Device::cpu(), which core/cuda/runtime.cpp pins on a GPU).
class HostArena final : public Arena {
 public:
  HostArena(Device device, std::string name) : device_(device), name_(std::move(name)) {}
  void* map(size_t bytes) override {
    return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  }
  void unmap(void* p, size_t) override { std::free(p); }
  Device device() const override { return device_; }
  std::string name() const override { return name_; }

 private:
  Device device_;
  std::string name_;
};
// The emulated device's copy queue (core/cuda/copy_queue.cpp makes a stream of its own): each
// copy is made when it is issued, since every emulated launch has run when it returns; a ticket
// still holds both storages until it is waited for, and is waited for once, as on a GPU.
class EmuCopyQueue final : public CopyQueue {
 public:
  explicit EmuCopyQueue(CopyDirection d) : direction_(d) {}
  uint64_t issue(std::shared_ptr<Storage> dst, std::shared_ptr<Storage> src) override {
    REGEN_CHECK(dst && src && dst->bytes() == src->bytes(), "copy queue (",
                copy_direction_name(direction_),
                ") of emu-cuda:0: the two storages differ in size");
    if (!dry_run_active() && src->bytes() > 0) std::memmove(dst->data(), src->data(), src->bytes());
    bytes_ += src->bytes();
    jobs_.emplace(++issued_, std::make_pair(std::move(dst), std::move(src)));
    return issued_;
  }
  void wait(uint64_t ticket) override {
    REGEN_CHECK(jobs_.erase(ticket) == 1, "copy queue (", copy_direction_name(direction_),
                ") of emu-cuda:0: ticket ", ticket, " was never issued or was waited for already");
  }
  void drain() override { jobs_.clear(); }
  double take_stall_ms() override { return 0; }
  uint64_t copies() const override { return issued_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  CopyDirection direction_;
  std::map<uint64_t, std::pair<std::shared_ptr<Storage>, std::shared_ptr<Storage>>> jobs_;
  uint64_t issued_ = 0, bytes_ = 0;
};
}  // namespace
std::unique_ptr<Arena> make_cuda_arena(int) {
  return std::make_unique<HostArena>(Device::cuda(0), "emu-cuda:0");
}
std::unique_ptr<Arena> make_pinned_host_arena(int) {
  return std::make_unique<HostArena>(Device::cpu(), "emu pinned host of cuda:0");
}
std::unique_ptr<CopyQueue> make_cuda_copy_queue(int, CopyDirection direction) {
  return std::make_unique<EmuCopyQueue>(direction);
}
}  // namespace regen
