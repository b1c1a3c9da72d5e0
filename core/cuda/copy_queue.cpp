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
    REGEN_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  }
  // Never throws: a failure is printed.
  ~CudaCopyQueue() override {
    try {
      drain();
      take_stall_ms();
      cuda::DeviceGuard guard(index_);
      for (cudaEvent_t e : free_done_) REGEN_CUDA_CHECK(cudaEventDestroy(e));
      for (cudaEvent_t e : free_timed_) REGEN_CUDA_CHECK(cudaEventDestroy(e));
      REGEN_CUDA_CHECK(cudaEventDestroy(ready_));
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
      // kernels that used the destination block before the allocator handed it out again. The
      // wait takes the event's state when it is called, so one event serves every copy.
      REGEN_CUDA_CHECK(cudaEventRecord(ready_, cuda::stream()));
      REGEN_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
      const cudaMemcpyKind kind =
          direction_ == CopyDirection::to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
      REGEN_CUDA_CHECK(
          cudaMemcpyAsync(j.dst->data(), j.src->data(), j.src->bytes(), kind, stream_));
      j.done = take_event(free_done_, cudaEventDisableTiming);
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
    s.before = take_event(free_timed_, cudaEventDefault);
    stalls_.push_back(s);  // from here the queue owns it, whatever fails below
    stalls_.back().after = take_event(free_timed_, cudaEventDefault);
    free_done_.push_back(j.done);  // the wait below takes its state: it can be recorded again
    REGEN_CUDA_CHECK(cudaEventRecord(stalls_.back().before, cuda::stream()));
    REGEN_CUDA_CHECK(cudaStreamWaitEvent(cuda::stream(), j.done, 0));
    REGEN_CUDA_CHECK(cudaEventRecord(stalls_.back().after, cuda::stream()));
    // The storages go now: kernels queued from here on run after the copy, and a later copy into
    // a block freed here waits for them (issue's event).
  }

  void drain() override {
    cuda::DeviceGuard guard(index_);
    REGEN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    for (auto& kv : jobs_) {
      if (kv.second.done) free_done_.push_back(kv.second.done);
    }
    jobs_.clear();
  }

  double take_stall_ms() override {
    if (stalls_.empty()) return 0;
    cuda::DeviceGuard guard(index_);
    REGEN_CUDA_CHECK(cudaStreamSynchronize(cuda::stream()));
    std::vector<Stall> read;
    read.swap(stalls_);
    for (const Stall& s : read) {  // back to the pool, whatever fails below
      if (s.before) free_timed_.push_back(s.before);
      if (s.after) free_timed_.push_back(s.after);
    }
    double total = 0;
    for (const Stall& s : read) {
      float ms = 0;
      REGEN_CUDA_CHECK(cudaEventElapsedTime(&ms, s.before, s.after));
      total += ms;
    }
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

  // An event of the pool, or a new one with `flags` when it is empty.
  static cudaEvent_t take_event(std::vector<cudaEvent_t>& pool, unsigned flags) {
    if (!pool.empty()) {
      cudaEvent_t e = pool.back();
      pool.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    REGEN_CUDA_CHECK(cudaEventCreateWithFlags(&e, flags));
    return e;
  }

  int index_;
  CopyDirection direction_;
  cudaStream_t stream_ = nullptr;
  // Events are made once and recorded again (a wait takes an event's state when it is called):
  // a copy otherwise cost four creations and destructions of events. `ready_` orders each copy
  // after the compute stream's queue; the pools hold the copies' `done` events (no timing) and
  // the timed ones around the compute stream's waits, free for reuse.
  cudaEvent_t ready_ = nullptr;
  std::vector<cudaEvent_t> free_done_, free_timed_;
  std::map<uint64_t, Job> jobs_;
  std::vector<Stall> stalls_;
  uint64_t issued_ = 0, copies_ = 0, bytes_ = 0;
};

}  // namespace

std::unique_ptr<CopyQueue> make_cuda_copy_queue(int device_index, CopyDirection direction) {
  return std::make_unique<CudaCopyQueue>(device_index, direction);
}

}  // namespace regen
