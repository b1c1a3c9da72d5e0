// The CPU's copy queue: a helper thread (copy_queue.h). The CUDA queue is in
// core/cuda/copy_queue.cpp.
#include "regen/core/copy_queue.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "regen/core/error.h"

namespace regen {

const char* copy_direction_name(CopyDirection d) {
  return d == CopyDirection::to_host ? "device to host" : "host to device";
}

namespace {

class CpuCopyQueue final : public CopyQueue {
 public:
  explicit CpuCopyQueue(CopyDirection direction) : direction_(direction) {}
  ~CpuCopyQueue() override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  uint64_t issue(std::shared_ptr<Storage> dst, std::shared_ptr<Storage> src) override {
    REGEN_CHECK(dst && src && dst->bytes() == src->bytes(), "copy queue (",
                copy_direction_name(direction_), "): a copy of ",
                src ? format_bytes(static_cast<int64_t>(src->bytes())) : std::string("nothing"),
                " into ",
                dst ? format_bytes(static_cast<int64_t>(dst->bytes())) : std::string("nothing"));
    REGEN_CHECK(dst->resident() && src->resident(), "copy queue (", copy_direction_name(direction_),
                "): a storage of the copy holds no bytes");
    std::unique_lock<std::mutex> lock(mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
    const uint64_t ticket = ++issued_;
    Job& j = jobs_[ticket];
    j.dst = std::move(dst);
    j.src = std::move(src);
    j.dry = dry_run_active();
    pending_.push_back(ticket);
    ++copies_;
    bytes_ += j.src->bytes();
    lock.unlock();
    work_.notify_one();
    return ticket;
  }

  void wait(uint64_t ticket) override {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = jobs_.find(ticket);
    REGEN_CHECK(it != jobs_.end(), "copy queue (", copy_direction_name(direction_), "): ticket ",
                ticket, " was never issued or was waited for already");
    if (done_ < ticket) {
      const auto t0 = std::chrono::steady_clock::now();
      done_cv_.wait(lock, [&] { return done_ >= ticket; });
      stall_ms_ +=
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    // The storages go on this thread, outside the lock (a free takes the allocator's lock).
    Job j = std::move(it->second);
    jobs_.erase(it);
    lock.unlock();
  }

  void drain() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return done_ >= issued_; });
    std::map<uint64_t, Job> gone;
    gone.swap(jobs_);
    lock.unlock();
  }

  double take_stall_ms() override {
    std::lock_guard<std::mutex> lock(mutex_);
    const double s = stall_ms_;
    stall_ms_ = 0;
    return s;
  }
  uint64_t copies() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return copies_;
  }
  uint64_t bytes() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return bytes_;
  }

 private:
  struct Job {
    std::shared_ptr<Storage> dst, src;
    bool dry = false;
  };

  // The helper thread: copies in issue order. Jobs are only read here; the map entry stays until
  // wait() takes it, which it does only once done_ has passed it.
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      work_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      const uint64_t ticket = pending_.front();
      pending_.pop_front();
      const Job& j = jobs_.at(ticket);
      void* dst = j.dst->data();
      const void* src = j.src->data();
      const uint64_t n = j.src->bytes();
      const bool dry = j.dry;
      lock.unlock();
      if (!dry && n > 0) std::memcpy(dst, src, n);
      lock.lock();
      done_ = ticket;
      done_cv_.notify_all();
    }
  }

  CopyDirection direction_;
  mutable std::mutex mutex_;
  std::condition_variable work_, done_cv_;
  std::thread worker_;
  std::map<uint64_t, Job> jobs_;  // issued and not waited for
  std::deque<uint64_t> pending_;  // issued and not copied yet
  uint64_t issued_ = 0, done_ = 0;
  bool stop_ = false;
  double stall_ms_ = 0;
  uint64_t copies_ = 0, bytes_ = 0;
};

}  // namespace

std::unique_ptr<CopyQueue> CopyQueue::make(Device device, CopyDirection direction) {
  if (device.is_cpu()) return std::make_unique<CpuCopyQueue>(direction);
#ifdef REGEN_WITH_CUDA
  return make_cuda_copy_queue(device.index, direction);
#else
  REGEN_FAIL("device ", device.str(),
             " is not available: regen was built without CUDA support (REGEN_CUDA=OFF or no nvcc)");
#endif
}

}  // namespace regen
