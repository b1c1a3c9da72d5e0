// Copies between a device's memory and its host tier (host_allocator_for) that run beside the
// compute, for the offload fate (docs/remat.md, "Offload"): one queue per direction, whose copies
// run in the order they were issued.
//   cuda:N  cudaMemcpyAsync on a stream of the queue's own. A copy starts after the work the
//           compute stream had queued when it was issued (an event the copy stream waits for), and
//           waiting for it makes the compute stream wait for its event (cudaStreamWaitEvent): the
//           host never blocks, and kernels queued after the wait may reuse the copied block.
//   cpu     a helper thread does each memcpy; waiting blocks the calling thread until it is done.
// A copy holds both storages until it is waited for (or the queue drains), so a step that throws
// half-way never frees memory a copy still touches. Tests: tests/test_offload.cpp (CPU),
// tests/cuda/test_cuda_offload.cpp.
#pragma once

#include <cstdint>
#include <memory>

#include "regen/core/tensor.h"

namespace regen {

enum class CopyDirection : uint8_t { to_host, to_device };
const char* copy_direction_name(CopyDirection d);  // "device to host", "host to device"

class CopyQueue {
 public:
  // The queue of `device` for one direction (a regen::Error for a CUDA device in a build without
  // CUDA).
  static std::unique_ptr<CopyQueue> make(Device device, CopyDirection direction);
  virtual ~CopyQueue() = default;  // implementations drain first

  // Issues a copy of src's bytes into dst (the same number of bytes; a regen::Error otherwise) and
  // returns its ticket (1, 2, ... in issue order). In a dry run nothing is copied.
  virtual uint64_t issue(std::shared_ptr<Storage> dst, std::shared_ptr<Storage> src) = 0;
  // The compute waits until copy `ticket` is done (and so every copy issued before it); then the
  // queue lets go of that copy's storages. Each ticket is waited for once (a regen::Error for an
  // unknown or waited ticket).
  virtual void wait(uint64_t ticket) = 0;
  // Blocks the host until every copy issued is done, and lets go of every storage.
  virtual void drain() = 0;
  // The time the compute spent waiting in wait() since the last call, in ms: on the CPU the
  // blocked wall time; on CUDA the compute stream's time from reaching each wait to the copy's end
  // (events around the wait; the call synchronizes the compute stream to read them).
  virtual double take_stall_ms() = 0;
  // Copies issued and bytes copied since the queue was made.
  virtual uint64_t copies() const = 0;
  virtual uint64_t bytes() const = 0;
};

#ifdef REGEN_WITH_CUDA
std::unique_ptr<CopyQueue> make_cuda_copy_queue(int device_index, CopyDirection direction);
#endif

}  // namespace regen
