// Collectives over the ranks of the job for the tensors of one device: MPI for CPU memory (the
// collectives run on a thread of the communicator's own, so the calling thread computes while
// they run), NCCL for CUDA memory (on a stream of its own; the unique id is broadcast over MPI),
// and, with one rank, a communicator that needs neither. No collective allocates: the caller
// passes every buffer, taken from regen's allocator (dist/data_parallel.h does, in the
// communication category), so the simulator sees every byte. MPI's and NCCL's own fixed internal
// buffers are theirs (docs/distributed.md says what they are). Tests: tests/test_dist.cpp,
// tests/mpi/, tests/cuda/test_cuda_nccl.cpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "regen/core/types.h"

namespace regen::dist {

// One issued collective. The communicator fills it in; wait() on the issuing thread finishes it.
struct WorkState {
  virtual ~WorkState() = default;
  std::atomic<bool> done{false};  // the collective ended (MPI, one rank)
  std::exception_ptr error;       // what it threw, rethrown by wait()
  bool waited = false;
  uint64_t bytes = 0;  // what this rank sent and received, for the figures
  // Times, in milliseconds, known once the device is synchronized (Communicator::resolve): how
  // long the collective ran on the communicator's thread or stream, and how long wait() held the
  // caller back (the thread blocked, or the compute stream stalled).
  double busy_ms = 0, stalled_ms = 0;
};
using Work = std::shared_ptr<WorkState>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  Device device() const { return device_; }
  // "mpi", "nccl", "local".
  virtual const char* backend() const = 0;

  // Elements of scratch (on the device, of the collective's dtype) that reduce_scatter_mean needs
  // for chunks of `chunk` elements (MPI: the pieces every rank sends this one, at most a few MiB
  // whatever the chunk; NCCL and one rank: none).
  virtual int64_t scratch_elements(int64_t chunk) const = 0;
  // `data` holds size() chunks of `chunk` elements of `dtype` (f32 or f64), rank r's at r * chunk.
  // Writes to `out` (chunk elements; it may be data + rank() * chunk) the mean over the ranks of
  // their chunk rank(). MPI sums in rank order 0, 1, ..., N-1 and divides by N, so every rank gets
  // the same bits run after run whatever MPI's own algorithms; NCCL reduces with ncclAvg. `data`
  // and `scratch` may be reused once wait() returned.
  virtual Work reduce_scatter_mean(DType dtype, void* data, void* out, int64_t chunk,
                                   void* scratch) = 0;
  // Every rank's chunk of `data` (size() chunks of `chunk` elements) to every rank, in place.
  virtual Work all_gather(DType dtype, void* data, int64_t chunk) = 0;
  // `bytes` bytes at `data` from rank `root` to every rank, in place.
  virtual Work broadcast(void* data, uint64_t bytes, int root) = 0;
  // Until `w` is done: the calling thread blocks (MPI), or the device's compute stream waits for
  // it (NCCL), so that work issued after it sees its results and its buffers may be freed.
  // Rethrows what the collective threw. Collectives run in the order they were issued.
  virtual void wait(const Work& w) = 0;
  // Fills in busy_ms and stalled_ms of waited collectives, after the device was synchronized
  // (NCCL reads its events; MPI timed them as they ran).
  virtual void resolve(const Work& w) { (void)w; }
  // No collective queued or running (false once a failed peer left one waiting forever).
  virtual bool idle() const { return true; }

 protected:
  Communicator(int rank, int size, Device device) : rank_(rank), size_(size), device_(device) {}

 private:
  int rank_, size_;
  Device device_;
};

// The process's communicator for `device` over the world's ranks, made on first use and kept
// (an NCCL communicator takes a while to set up): MPI for the CPU, NCCL for cuda:N, and with one
// rank the local one. A CUDA device without NCCL in the build under more than one rank is a
// regen::Error saying so.
Communicator& communicator_for(Device device);
// A communicator of one rank for `device` (tests; what communicator_for gives a process alone).
std::unique_ptr<Communicator> make_local_communicator(Device device);
// NCCL over `ranks` ranks for cuda:N (dist/cuda/nccl.cpp): rank 0 makes the unique id and the
// world broadcasts it (with one rank nothing is sent, so this runs without MPI). A regen::Error in
// a build without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(Device device, int rank, int ranks);
// Ends every communicator communicator_for made (joins their threads, destroys NCCL's). Called by
// finalize() before MPI ends. False when one still had a collective in flight (a peer failed):
// its thread is left behind, and MPI cannot be finalized cleanly.
bool shutdown_communicators();

}  // namespace regen::dist
