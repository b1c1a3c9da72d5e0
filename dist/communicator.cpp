// Communicators (communicator.h): one rank, and MPI on a thread of its own for CPU memory. NCCL's
// is dist/cuda/nccl.cpp.
#include "regen/dist/communicator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "regen/core/error.h"
#include "regen/core/tensor.h"
#include "regen/dist/world.h"

#ifdef REGEN_WITH_MPI
#include <mpi.h>
#endif

namespace regen::dist {

namespace {

uint64_t dtype_bytes(DType dtype) {
  REGEN_CHECK(dtype == DType::f32 || dtype == DType::f64, "collectives reduce f32 and f64, not ",
              dtype_name(dtype));
  return dtype == DType::f32 ? 4 : 8;
}

// ---- One rank ---------------------------------------------------------------------------------

class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(Device device) : Communicator(0, 1, device) {}
  const char* backend() const override { return "local"; }
  int64_t scratch_elements(int64_t) const override { return 0; }
  Work reduce_scatter_mean(DType dtype, void* data, void* out, int64_t chunk, void*) override {
    // The mean over one rank is the value itself.
    if (out != data) copy_bytes(out, device(), data, device(), dtype_bytes(dtype) * chunk);
    return finished();
  }
  Work all_gather(DType dtype, void*, int64_t) override {
    dtype_bytes(dtype);
    return finished();
  }
  Work broadcast(void*, uint64_t, int root) override {
    REGEN_CHECK(root == 0, "broadcast from rank ", root, " of 1");
    return finished();
  }
  void wait(const Work& w) override {
    w->waited = true;
    if (w->error) std::rethrow_exception(w->error);
  }

 private:
  static Work finished() {
    Work w = std::make_shared<WorkState>();
    w->done = true;
    return w;
  }
};

// ---- MPI --------------------------------------------------------------------------------------

#ifdef REGEN_WITH_MPI

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

MPI_Datatype mpi_type(DType dtype) {
  dtype_bytes(dtype);
  return dtype == DType::f32 ? MPI_FLOAT : MPI_DOUBLE;
}

// out[e] = (in[0][e] + in[1][e] + ... + in[n-1][e]) / n, the ranks' pieces summed in rank order.
template <class T>
void mean_of_pieces(const T* in, T* out, int64_t len, int ranks) {
  const T n = static_cast<T>(ranks);
  for (int64_t e = 0; e < len; ++e) {
    T s = in[e];
    for (int r = 1; r < ranks; ++r) s += in[static_cast<int64_t>(r) * len + e];
    out[e] = s / n;
  }
}

// The collectives run on one thread of the communicator's own, in the order they were issued
// (every rank issues them in the same order, which is what MPI needs). The issuing thread only
// queues them and, in wait(), blocks until one is done.
class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int rank, int size) : Communicator(rank, size, Device::cpu()) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    thread_ = std::thread([this] { loop(); });
  }
  ~MpiCommunicator() override {
    const bool clean = idle();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    if (clean) {
      thread_.join();
      MPI_Comm_free(&comm_);
    } else {
      // A collective that a failed peer will never answer: the thread cannot be joined, and the
      // job is ending (finalize aborts it).
      thread_.detach();
    }
  }
  const char* backend() const override { return "mpi"; }

  // Each piece is a few MiB at most, whatever the bucket: the scratch stays small.
  int64_t scratch_elements(int64_t chunk) const override {
    return static_cast<int64_t>(size()) * piece_elements(chunk);
  }

  Work reduce_scatter_mean(DType dtype, void* data, void* out, int64_t chunk,
                           void* scratch) override {
    const uint64_t esize = dtype_bytes(dtype);
    REGEN_CHECK(chunk >= 0 && chunk * size() < (int64_t{1} << 31),
                "reduce_scatter_mean: ", chunk * size(),
                " elements are more than MPI's int counts address");
    REGEN_CHECK(chunk == 0 || scratch != nullptr, "reduce_scatter_mean: no scratch");
    const int n = size(), me = rank();
    const int64_t piece = piece_elements(chunk);
    MPI_Comm comm = comm_;
    return submit(2 * esize * chunk * (n - 1), [=] {
      std::vector<int> counts(static_cast<size_t>(n)), sdispl(static_cast<size_t>(n)),
          rdispl(static_cast<size_t>(n));
      const MPI_Datatype type = mpi_type(dtype);
      for (int64_t at = 0; at < chunk; at += piece) {
        const int len = static_cast<int>(std::min(piece, chunk - at));
        for (int r = 0; r < n; ++r) {
          counts[static_cast<size_t>(r)] = len;
          sdispl[static_cast<size_t>(r)] = static_cast<int>(r * chunk + at);
          rdispl[static_cast<size_t>(r)] = r * len;
        }
        MPI_Alltoallv(data, counts.data(), sdispl.data(), type, scratch, counts.data(),
                      rdispl.data(), type, comm);
        if (dtype == DType::f32) {
          mean_of_pieces(static_cast<const float*>(scratch), static_cast<float*>(out) + at, len, n);
        } else {
          mean_of_pieces(static_cast<const double*>(scratch), static_cast<double*>(out) + at, len,
                         n);
        }
      }
      (void)me;
    });
  }

  Work all_gather(DType dtype, void* data, int64_t chunk) override {
    const uint64_t esize = dtype_bytes(dtype);
    REGEN_CHECK(chunk >= 0 && chunk < (int64_t{1} << 31), "all_gather: ", chunk,
                " elements per rank are more than MPI's int counts address");
    MPI_Comm comm = comm_;
    return submit(esize * chunk * (size() - 1), [=] {
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, static_cast<int>(chunk),
                    mpi_type(dtype), comm);
    });
  }

  Work broadcast(void* data, uint64_t bytes, int root) override {
    REGEN_CHECK(root >= 0 && root < size(), "broadcast from rank ", root, " of ", size());
    MPI_Comm comm = comm_;
    return submit(bytes, [=] {
      char* p = static_cast<char*>(data);
      constexpr uint64_t kMax = 1u << 30;
      for (uint64_t at = 0; at < bytes; at += kMax) {
        MPI_Bcast(p + at, static_cast<int>(std::min(kMax, bytes - at)), MPI_BYTE, root, comm);
      }
    });
  }

  void wait(const Work& w) override {
    if (w->waited) return;
    const Clock::time_point t0 = Clock::now();
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done_cv_.wait(lock, [&] { return w->done.load(); });
    }
    w->stalled_ms = ms_since(t0);
    w->waited = true;
    if (w->error) std::rethrow_exception(w->error);
  }

 private:
  static constexpr int64_t kScratchElements = int64_t{1} << 20;

  int64_t piece_elements(int64_t chunk) const {
    const int64_t cap = std::max<int64_t>(1024, kScratchElements / size());
    return std::max<int64_t>(1, std::min(chunk, cap));
  }

  Work submit(uint64_t bytes, std::function<void()> fn) {
    Work w = std::make_shared<WorkState>();
    w->bytes = bytes;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.emplace_back(w, std::move(fn));
    }
    cv_.notify_all();
    return w;
  }

  bool idle() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return queue_.empty() && !running_;
  }

  void loop() {
    for (;;) {
      std::pair<Work, std::function<void()>> task;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping
        task = std::move(queue_.front());
        queue_.pop_front();
        running_ = true;
      }
      const Clock::time_point t0 = Clock::now();
      try {
        task.second();
      } catch (...) {
        task.first->error = std::current_exception();
      }
      task.first->busy_ms = ms_since(t0);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        running_ = false;
        task.first->done = true;
      }
      done_cv_.notify_all();
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable cv_, done_cv_;
  std::deque<std::pair<Work, std::function<void()>>> queue_;
  bool stop_ = false, running_ = false;
};

#endif  // REGEN_WITH_MPI

std::mutex g_registry_mutex;
std::map<std::string, std::unique_ptr<Communicator>>& registry() {
  static auto* r = new std::map<std::string, std::unique_ptr<Communicator>>();
  return *r;
}

}  // namespace

std::unique_ptr<Communicator> make_local_communicator(Device device) {
  return std::make_unique<LocalCommunicator>(device);
}

Communicator& communicator_for(Device device) {
  World& w = world();
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto& r = registry();
  const std::string key = device.str();
  auto it = r.find(key);
  if (it != r.end()) return *it->second;
  std::unique_ptr<Communicator> c;
  if (device.is_cuda()) {
    REGEN_CHECK(w.size() == 1 || nccl_built(), "training on ", key, " over ", w.size(),
                " ranks needs NCCL, and regen was built without it (CMake REGEN_NCCL found none: "
                "set REGEN_NCCL_ROOT to the folder of include/nccl.h and lib/libnccl.so)");
    c = w.size() == 1 ? make_local_communicator(device)
                      : make_nccl_communicator(device, w.rank(), w.size());
  } else if (w.size() == 1) {
    c = make_local_communicator(device);
  } else {
#ifdef REGEN_WITH_MPI
    c = std::make_unique<MpiCommunicator>(w.rank(), w.size());
#else
    REGEN_FAIL("more than one rank without MPI");  // world() refused it already
#endif
  }
  return *r.emplace(key, std::move(c)).first->second;
}

bool shutdown_communicators() {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  bool clean = true;
  for (const auto& kv : registry()) clean = clean && kv.second->idle();
  registry().clear();
  return clean;
}

#ifndef REGEN_WITH_NCCL
std::unique_ptr<Communicator> make_nccl_communicator(Device device, int, int) {
  REGEN_FAIL("NCCL for ", device.str(), ": regen was built without NCCL (CMake REGEN_NCCL found ",
             "none beside CUDA; set REGEN_NCCL_ROOT to the folder of include/nccl.h and "
             "lib/libnccl.so)");
}
#endif

}  // namespace regen::dist
