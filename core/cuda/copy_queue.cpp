// The CUDA copy queue (core/copy_queue.h): cudaMemcpyAsync on a stream of its own, ordered with
// the compute stream by events in both directions.
#include <cuda_runtime_api.h>

#include <deque>
#include <map>
#include <vector>

#include "regen/core/copy_queue.h"
#include "regen/core/cuda/runtime.h"

namespace regen {

namespace {

class CudaCopyQueue final : public CopyQueue {
 public:
  CudaCopyQueue(int index, CopyDirection direction) : index_(index), direction_(direction) {
    cuda::DeviceGuard guard(index_);
    REGEN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  // Never throws: a failure is printed.
  ~CudaCopyQueue() override {
    try {
      drain();
      take_stall_ms();
      cuda::DeviceGuard guard(index_);
      REGEN_CUDA_CHECK(cudaStreamDestroy(stream_));
    } catch (const std::exception& e) {
      cudaGetLastError();
      std::fprintf(stderr, "regen: cuda:%d: closing a copy queue failed: %s\n", index_, e.what());
    }
  }

  uint64_t issue(std::shared_ptr<Storage> dst, std::shared_ptr<Storage> src) override {
    REGEN_CHECK(dst && src && dst->bytes() == src->bytes(), "copy queue (",
                copy_direction_name(direction_), ") of cuda:", index_,
                ": the two storages of a copy differ in size");
    REGEN_CHECK(dst->resident() && src->resident(), "copy queue (", copy_direction_name(direction_),
                ") of cuda:", index_, ": a storage of the copy holds no bytes");
    cuda::DeviceGuard guard(index_);
    Job j;
    j.dst = std::move(dst);
    j.src = std::move(src);
    if (!dry_run_active() && j.src->bytes() > 0) {
      // After everything the compute stream has queued: the source's producer, and the last
      // kernels that used the destination block before the allocator handed it out again.
      cudaEvent_t ready = nullptr;
      REGEN_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
      REGEN_CUDA_CHECK(cudaEventRecord(ready, cuda::stream()));
      REGEN_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
      REGEN_CUDA_CHECK(cudaEventDestroy(ready));  // released once the wait has seen it
      const cudaMemcpyKind kind =
          direction_ == CopyDirection::to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
      REGEN_CUDA_CHECK(
          cudaMemcpyAsync(j.dst->data(), j.src->data(), j.src->bytes(), kind, stream_));
      REGEN_CUDA_CHECK(cudaEventCreateWithFlags(&j.done, cudaEventDisableTiming));
      REGEN_CUDA_CHECK(cudaEventRecord(j.done, stream_));
    }
    const uint64_t ticket = ++issued_;
    ++copies_;
    bytes_ += j.src->bytes();
    jobs_.emplace(ticket, std::move(j));
    return ticket;
  }

  void wait(uint64_t ticket) override {
    auto it = jobs_.find(ticket);
    REGEN_CHECK(it != jobs_.end(), "copy queue (", copy_direction_name(direction_),
                ") of cuda:", index_, ": ticket ", ticket,
                " was never issued or was waited for already");
    Job j = std::move(it->second);
    jobs_.erase(it);
    if (!j.done) return;  // nothing was copied (a dry run or no bytes)
    cuda::DeviceGuard guard(index_);
    // The compute stream waits for the copy's end; events around the wait time it.
    Stall s;
    REGEN_CUDA_CHECK(cudaEventCreate(&s.before));
    REGEN_CUDA_CHECK(cudaEventCreate(&s.after));
    REGEN_CUDA_CHECK(cudaEventRecord(s.before, cuda::stream()));
    REGEN_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), j.done, 0));
    REGEN_CUDA_CHECK(cudaEventRecord(s.after, cuda::stream()));
    REGEN_CUDA_CHECK(cudaEventDestroy(j.done));
    stalls_.push_back(s);
    // The storages go now: kernels queued from here on run after the copy, and a later copy into
    // a block freed here waits for them (issue's event).
  }

  void drain() override {
    cuda::DeviceGuard guard(index_);
    REGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto& kv : jobs_) {
      if (kv.second.done) REGEN_CUDA_CHECK(cudaEventDestroy(kv.second.done));
    }
    jobs_.clear();
  }

  double take_stall_ms() override {
    if (stalls_.empty()) return 0;
    cuda::DeviceGuard guard(index_);
    REGEN_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
    double total = 0;
    for (const Stall& s : stalls_) {
      float ms = 0;
      REGEN_CUDA_CHECK(cudaEventElapsedTime(&ms, s.before, s.after));
      total += ms;
      REGEN_CUDA_CHECK(cudaEventDestroy(s.before));
      REGEN_CUDA_CHECK(cudaEventDestroy(s.after));
    }
    stalls_.clear();
    return total;
  }
  uint64_t copies() const override { return copies_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  struct Job {
    std::shared_ptr<Storage> dst, src;
    cudaEvent_t done = nullptr;
  };
  struct Stall {
    cudaEvent_t before = nullptr, after = nullptr;
  };

  int index_;
  CopyDirection direction_;
  cudaStream_t stream_ = nullptr;
  std::map<uint64_t, Job> jobs_;
  std::vector<Stall> stalls_;
  uint64_t issued_ = 0, copies_ = 0, bytes_ = 0;
};

}  // namespace

std::unique_ptr<CopyQueue> make_cuda_copy_queue(int device_index, CopyDirection direction) {
  return std::make_unique<CudaCopyQueue>(device_index, direction);
}

}  // namespace regen
