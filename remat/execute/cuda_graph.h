// The planned step as one CUDA graph (--cuda-graph on|off|auto; docs/memory.md, "One CUDA graph
// per step"). Under a plan with a planned layout (--layout planned) every block of the step has
// its address before the step runs, which is what a graph needs: RematPipeline runs the first
// step under the plan uncaptured (the warm-up: libraries' lazy set-up, cuBLAS's workspace),
// captures the second through Trainer's StepCapture (forward, regenerations, backward and the
// optimizer step on the compute stream), and replays that graph for every later step. Tests:
// tests/cuda/test_cuda_graph.cpp (scripts/cuda-emu/run.sh graph without a GPU), tests/test_cli.cpp
// (the refusals).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "regen/core/allocator.h"
#include "regen/models/train.h"

#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/graph.h"
#endif

namespace regen {

struct Plan;
class CudaGraphStep;

// off: every step runs uncaptured. on: the steps under the plan are captured, and a run where they
// cannot be is refused before its first step (cuda_graph_refusal). automatic ("auto"): captured
// where they can be, else uncaptured with the reason said once.
enum class CudaGraphMode { off, on, automatic };
// "off", "on", "auto"; anything else is a regen::Error naming `option` and the three values.
CudaGraphMode parse_cuda_graph_mode(const std::string& text, const std::string& option);
const char* cuda_graph_mode_name(CudaGraphMode mode);

// Why the steps of `trainer` under `plan` (nullptr: no plan) cannot be one CUDA graph, "" when they
// can: each condition the capture needs, in this order: a CUDA device; the trainer's graph state
// (Trainer::set_cuda_graph, made before the profile); a plan; not a DTR policy (evictions decided
// at run time); a planned layout; nothing on the host tier (offload's copies and their
// waits run on the copy queues' own streams); no data parallelism (the collectives are not
// captured yet); one micro-batch; not fp16 (the loss scale's overflow check reads the gradients'
// norm on the host and may skip the step); no clipping or gradient norm (read on the host); SGD
// (AdamW's bias corrections change at every step, and are kernel arguments); a constant learning
// rate (also a kernel argument); the caching allocator's segments (not REGEN_ALLOC_DIRECT's
// block-by-block mappings). `host_tier`: the plan uses the device's host tier.
std::string cuda_graph_refusal(const Trainer& trainer, const Plan* plan, bool host_tier);
// The conditions above that do not depend on the plan (all but the plan's layout, policy and host
// tier): a run can be refused with them before it profiles.
std::string cuda_graph_step_refusal(const Trainer& trainer);

#ifdef REGEN_WITH_CUDA
// One captured step and its replays (Trainer::set_step_capture). Capture: the batch is on the
// device when it begins; the loss is copied, captured, into the trainer's graph state block; at
// the end the graph is instantiated and run once for the step itself. The checks at the end of the
// capture, each a regen::Error naming what failed: every request of the step was served from the
// planned layout at the address the layout gives it, and no segment was mapped while capturing
// (the graph's memory is the plan's to the byte). Replay: the next batch drawn on the host and
// copied to the captured batch's blocks, the Philox stream offset written (graph.h
// rng_stream_offset), the graph launched, the loss read back.
class CudaGraphStep final : public StepCapture {
 public:
  explicit CudaGraphStep(Trainer& trainer);
  ~CudaGraphStep() override;
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  // StepCapture
  void begin(const Batch& batch) override;
  void keep_loss(const Tensor& loss) override;
  double end() override;
  void abandon() noexcept override;

  bool captured() const { return graph_.valid(); }
  // The captured step's memory statistics (the pipeline sets them from its StepResult), which every
  // replay reports: a replay allocates nothing.
  void set_memory(const MemoryStats& m) { memory_ = m; }
  // One replay of the captured step (after it ran once): its result with the loss read back.
  StepResult replay();

  // The planned blocks' addresses the graph holds, in request order, and the layout's own.
  const std::vector<uintptr_t>& addresses() const { return addresses_; }
  const std::vector<uintptr_t>& planned_addresses() const { return planned_; }
  // Philox streams a step draws (the offset each replay moves on by), and replays so far.
  uint64_t streams_per_step() const { return streams_; }
  int64_t replays() const { return replays_; }

 private:
  void write_offset(uint64_t offset);

  Trainer& trainer_;
  cuda::Graph graph_;
  bool capturing_ = false;
  MemoryStats memory_;
  std::vector<uintptr_t> addresses_, planned_;
  // The captured batch's device blocks, which each replay's batch is copied into.
  void* input_ = nullptr;
  void* target_ = nullptr;
  uint64_t input_bytes_ = 0, target_bytes_ = 0;
  DType loss_dtype_ = DType::f32;
  uint64_t stream_at_begin_ = 0, streams_ = 0;
  int64_t maps_at_begin_ = 0, allocs_at_begin_ = 0;
  size_t served_at_begin_ = 0;
  int64_t replays_ = 0;
};
#endif

}  // namespace regen
