// NCCL's communicator for CUDA memory (communicator.h make_nccl_communicator): the collectives run
// on a stream of the communicator's own, after the work queued on the device's compute stream so
// far; wait() makes the compute stream wait for them. Rank 0 makes the unique id and the world
// broadcasts it over MPI (with one rank nothing is sent). Compiled with CUDA; without NCCL in the
// build, make_nccl_communicator refuses. Test: tests/cuda/test_cuda_nccl.cpp (one rank).
#include "regen/dist/communicator.h"

#ifdef REGEN_WITH_NCCL
#include <nccl.h>

#include "regen/core/cuda/runtime.h"
#include "regen/dist/world.h"

// Throws regen::Error naming the failed call and NCCL's words for it.
#define REGEN_NCCL_CHECK(call)                                                                     \
  do {                                                                                             \
    ncclResult_t regen_nccl_ = (call);                                                             \
    if (regen_nccl_ != ncclSuccess) {                                                              \
      ::regen::detail::throw_error(__FILE__, __LINE__,                                             \
                                   ::regen::detail::str_cat("NCCL call ", #call, " failed: ",      \
                                                            ncclGetErrorString(regen_nccl_), " (", \
                                                            ncclGetLastError(nullptr), ")"));      \
    }                                                                                              \
  } while (0)

namespace regen::dist {
namespace {

struct NcclWork final : WorkState {
  cudaEvent_t start = nullptr, end = nullptr, stall_begin = nullptr, stall_end = nullptr;
  bool stalled = false;
  ~NcclWork() override {
    for (cudaEvent_t e : {start, end, stall_begin, stall_end}) {
      if (e) cudaEventDestroy(e);
    }
  }
};

ncclDataType_t nccl_type(DType dtype) {
  REGEN_CHECK(dtype == DType::f32 || dtype == DType::f64, "collectives reduce f32 and f64, not ",
              dtype_name(dtype));
  return dtype == DType::f32 ? ncclFloat32 : ncclFloat64;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Device device, int rank, int ranks) : Communicator(rank, ranks, device) {
    REGEN_CHECK(device.is_cuda(), "NCCL reduces CUDA memory, not ", device.str());
    const cuda::DeviceGuard guard(device.index);
    ncclUniqueId id{};
    if (rank == 0) REGEN_NCCL_CHECK(ncclGetUniqueId(&id));
    if (ranks > 1) world().broadcast(&id, sizeof id, 0);
    REGEN_NCCL_CHECK(ncclCommInitRank(&comm_, ranks, id, rank));
    REGEN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~NcclCommunicator() override {
    const cuda::DeviceGuard guard(device().index);
    if (stream_ && cudaStreamQuery(stream_) == cudaSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);  // a collective a failed peer will never answer
    }
    if (stream_) cudaStreamDestroy(stream_);
  }
  const char* backend() const override { return "nccl"; }
  int64_t scratch_elements(int64_t) const override { return 0; }

  Work reduce_scatter_mean(DType dtype, void* data, void* out, int64_t chunk, void*) override {
    const uint64_t esize = dtype == DType::f64 ? 8 : 4;
    return issue(2 * esize * chunk * (size() - 1), [&] {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 10, 0)
      const ncclRedOp_t op = ncclAvg;
#else
#error "regen needs NCCL 2.10 or later (ncclAvg)"
#endif
      REGEN_NCCL_CHECK(ncclReduceScatter(data, out, static_cast<size_t>(chunk), nccl_type(dtype),
                                         op, comm_, stream_));
    });
  }

  Work all_gather(DType dtype, void* data, int64_t chunk) override {
    const uint64_t esize = dtype == DType::f64 ? 8 : 4;
    return issue(esize * chunk * (size() - 1), [&] {
      const void* mine = static_cast<const char*>(data) + esize * chunk * rank();
      REGEN_NCCL_CHECK(
          ncclAllGather(mine, data, static_cast<size_t>(chunk), nccl_type(dtype), comm_, stream_));
    });
  }

  Work broadcast(void* data, uint64_t bytes, int root) override {
    return issue(bytes, [&] {
      REGEN_NCCL_CHECK(ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream_));
    });
  }

  void wait(const Work& w) override {
    if (w->waited) return;
    auto* nw = static_cast<NcclWork*>(w.get());
    const cuda::DeviceGuard guard(device().index);
    cudaStream_t compute = cuda::stream();
    REGEN_CUDA_CHECK(cudaEventCreate(&nw->stall_begin));
    REGEN_CUDA_CHECK(cudaEventCreate(&nw->stall_end));
    REGEN_CUDA_CHECK(cudaEventRecord(nw->stall_begin, compute));
    REGEN_CUDA_CHECK(cudaStreamWaitEvent(compute, nw->end, 0));
    REGEN_CUDA_CHECK(cudaEventRecord(nw->stall_end, compute));
    nw->stalled = true;
    w->waited = true;
    ncclResult_t async = ncclSuccess;
    REGEN_NCCL_CHECK(ncclCommGetAsyncError(comm_, &async));
    REGEN_CHECK(async == ncclSuccess, "NCCL reports an asynchronous error on ", device().str(),
                ": ", ncclGetErrorString(async));
  }

  void resolve(const Work& w) override {
    auto* nw = static_cast<NcclWork*>(w.get());
    float ms = 0;
    if (cudaEventElapsedTime(&ms, nw->start, nw->end) == cudaSuccess) w->busy_ms = ms;
    if (nw->stalled && cudaEventElapsedTime(&ms, nw->stall_begin, nw->stall_end) == cudaSuccess) {
      w->stalled_ms = ms;
    }
    w->done = true;
  }

 private:
  template <class F>
  Work issue(uint64_t bytes, F&& call) {
    const cuda::DeviceGuard guard(device().index);
    auto w = std::make_shared<NcclWork>();
    w->bytes = bytes;
    cudaEvent_t ready = nullptr;
    REGEN_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
    REGEN_CUDA_CHECK(cudaEventCreate(&w->start));
    REGEN_CUDA_CHECK(cudaEventCreate(&w->end));
    // After everything queued on the compute stream so far (the gradients it reduces).
    REGEN_CUDA_CHECK(cudaEventRecord(ready, cuda::stream()));
    REGEN_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready, 0));
    cudaEventDestroy(ready);
    REGEN_CUDA_CHECK(cudaEventRecord(w->start, stream_));
    call();
    REGEN_CUDA_CHECK(cudaEventRecord(w->end, stream_));
    return w;
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Device device, int rank, int ranks) {
  return std::make_unique<NcclCommunicator>(device, rank, ranks);
}

}  // namespace regen::dist
#endif  // REGEN_WITH_NCCL
