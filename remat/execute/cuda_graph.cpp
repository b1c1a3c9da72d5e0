// The planned step as one CUDA graph (cuda_graph.h).
#include "regen/remat/execute/cuda_graph.h"

#include <chrono>
#include <cstring>

#include "regen/autograd/tape.h"
#include "regen/models/optim.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/plan/planner.h"

#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#endif

namespace regen {

CudaGraphMode parse_cuda_graph_mode(const std::string& text, const std::string& option) {
  if (text == "off") return CudaGraphMode::off;
  if (text == "on") return CudaGraphMode::on;
  if (text == "auto") return CudaGraphMode::automatic;
  REGEN_FAIL(option, " is '", text, "': use on, off or auto");
}

const char* cuda_graph_mode_name(CudaGraphMode mode) {
  switch (mode) {
    case CudaGraphMode::off:
      return "off";
    case CudaGraphMode::on:
      return "on";
    case CudaGraphMode::automatic:
      return "auto";
  }
  return "?";
}

std::string cuda_graph_step_refusal(const Trainer& trainer) {
  if (!trainer.device().is_cuda()) {
    return "the device is " + trainer.device().str() + ": CUDA graphs are a CUDA device's";
  }
  if (!trainer.cuda_graph()) {
    return "the trainer has no CUDA graph state (set_cuda_graph before its first step)";
  }
  if (trainer.gradient_sync()) {
    return "data parallelism: the gradients' collectives (NCCL) are not captured yet";
  }
  if (trainer.accumulation() > 1) {
    return "gradient accumulation: each micro-batch's loss is read on the host";
  }
  if (trainer.precision() == Precision::fp16) {
    return "fp16's loss scale reads the gradients' norm on the host at every step and skips the "
           "steps that overflow";
  }
  if (trainer.clip_grad_norm() > 0 || trainer.track_grad_norm()) {
    return "the gradient norm (clipping or logging) is read on the host at every step";
  }
  if (!dynamic_cast<const SGD*>(&const_cast<Trainer&>(trainer).optimizer())) {
    return "the optimizer is not SGD: AdamW's bias corrections change at every step and are "
           "kernel arguments, which a replayed graph repeats";
  }
  const LrSchedule* s = trainer.schedule();
  if (s && (s->kind != LrSchedule::Kind::constant || s->warmup > 0)) {
    return "the learning rate changes from step to step (a schedule or warm-up) and is a kernel "
           "argument, which a replayed graph repeats";
  }
  if (trainer.allocator().direct()) {
    return "the allocator maps every block on its own (REGEN_ALLOC_DIRECT=1), not at the planned "
           "layout's addresses";
  }
  return "";
}

std::string cuda_graph_refusal(const Trainer& trainer, const Plan* plan, bool host_tier) {
  const std::string step = cuda_graph_step_refusal(trainer);
  if (!step.empty()) return step;
  if (!plan) {
    return "no plan: a step's block addresses are known before it runs only under a plan with "
           "--layout planned";
  }
  // DTR first: no layout would help it, so its refusal names the reason that matters.
  if (dtr_policy(plan->policy)) {
    return "policy " + plan->policy +
           " evicts and regenerates as the step runs (DTR), so the step is not the same at every "
           "iteration";
  }
  if (!plan->planned_layout || !plan->layout) {
    return "the plan runs with the caching allocator's placement (--layout caching): a block's "
           "address is known only when it is requested; plan with --layout planned";
  }
  if (host_tier) {
    return "the plan keeps tensors or optimizer state on the host tier (offload): its copies and "
           "their waits run on the copy queues' own streams, which are not captured yet";
  }
  return "";
}

#ifdef REGEN_WITH_CUDA
CudaGraphStep::CudaGraphStep(Trainer& trainer) : trainer_(trainer) {
  REGEN_CHECK(trainer.graph_state().defined(),
              "CUDA graph: the trainer has no graph state block (set_cuda_graph before its first "
              "step)");
}

CudaGraphStep::~CudaGraphStep() {
  abandon();
}

void CudaGraphStep::write_offset(uint64_t offset) {
  cuda::memcpy(trainer_.graph_state().raw_data(), &offset, sizeof offset, cudaMemcpyHostToDevice);
}

void CudaGraphStep::begin(const Batch& batch) {
  REGEN_CHECK(!graph_.valid() && !capturing_, "CUDA graph: the step is captured once");
  REGEN_CHECK(
      batch.input.device() == trainer_.device() && batch.target.device() == trainer_.device(),
      "CUDA graph: the batch is not on ", trainer_.device().str());
  input_ = batch.input.raw_data();
  target_ = batch.target.raw_data();
  input_bytes_ = batch.input.nbytes();
  target_bytes_ = batch.target.nbytes();
  const MemoryStats m = trainer_.allocator().stats();
  maps_at_begin_ = m.num_segment_maps;
  allocs_at_begin_ = m.num_allocs;
  served_at_begin_ = trainer_.allocator().planned_served().size();
  stream_at_begin_ = rng_stream_position();
  // The captured kernels add this word to their Philox streams; the step itself runs with 0.
  write_offset(0);
  cuda::set_rng_stream_offset(static_cast<const uint64_t*>(trainer_.graph_state().raw_data()));
  cuda::begin_capture();
  capturing_ = true;
}

void CudaGraphStep::keep_loss(const Tensor& loss) {
  REGEN_CHECK(capturing_, "CUDA graph: keep_loss outside a capture");
  REGEN_CHECK(loss.numel() == 1 && (loss.dtype() == DType::f32 || loss.dtype() == DType::f64),
              "CUDA graph: the loss is ", loss.str(), ", not one f32 or f64 value");
  loss_dtype_ = loss.dtype();
  char* word = static_cast<char*>(trainer_.graph_state().raw_data()) + sizeof(uint64_t);
  cuda::memcpy(word, loss.raw_data(), loss.nbytes(), cudaMemcpyDeviceToDevice);
}

namespace {
double read_loss(const Tensor& state, DType dtype) {
  uint64_t word = 0;
  cuda::memcpy(&word, static_cast<const char*>(state.raw_data()) + sizeof(uint64_t), sizeof word,
               cudaMemcpyDeviceToHost);
  if (dtype == DType::f64) {
    double d;
    std::memcpy(&d, &word, sizeof d);
    return d;
  }
  float f;
  std::memcpy(&f, &word, sizeof f);
  return f;
}
}  // namespace

double CudaGraphStep::end() {
  REGEN_CHECK(capturing_, "CUDA graph: end without a capture");
  capturing_ = false;
  cuda::set_rng_stream_offset(nullptr);
  graph_ = cuda::end_capture();
  streams_ = rng_stream_position() - stream_at_begin_;
  // The graph's memory is the plan's: every request of the step came from the planned layout, at
  // the layout's address, and nothing was mapped while capturing.
  CachingAllocator& a = trainer_.allocator();
  const MemoryStats m = a.stats();
  addresses_ = a.planned_served();
  planned_.clear();
  for (size_t k = 0; k < addresses_.size(); ++k) planned_.push_back(a.planned_address(k));
  const int64_t allocs = m.num_allocs - allocs_at_begin_;
  const int64_t planned = static_cast<int64_t>(addresses_.size() - served_at_begin_);
  REGEN_CHECK(m.num_segment_maps == maps_at_begin_,
              "CUDA graph capture: ", m.num_segment_maps - maps_at_begin_,
              " segment(s) mapped while the step was captured: the graph's memory is not the "
              "planned layout's");
  REGEN_CHECK(allocs == planned, "CUDA graph capture: ", allocs - planned, " of the ", allocs,
              " requests made while the step was captured were served outside the planned layout "
              "(the step made more requests than the plan has): the graph's memory is not the "
              "plan's");
  for (size_t k = 0; k < addresses_.size(); ++k) {
    REGEN_CHECK(addresses_[k] == planned_[k], "CUDA graph capture: request ", k,
                " of the step got address ", addresses_[k], ", not the layout's ", planned_[k]);
  }
  graph_.launch();
  cuda::synchronize();
  return read_loss(trainer_.graph_state(), loss_dtype_);
}

void CudaGraphStep::abandon() noexcept {
  if (!capturing_) return;
  capturing_ = false;
  cuda::set_rng_stream_offset(nullptr);
  cuda::abandon_capture();
}

StepResult CudaGraphStep::replay() {
  REGEN_CHECK(graph_.valid(), "CUDA graph: replay before the step was captured");
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = process_cpu_ms();
  StepResult r;
  Batch batch = trainer_.begin_replayed_step(r);
  REGEN_CHECK(batch.input.nbytes() == input_bytes_ && batch.target.nbytes() == target_bytes_,
              "CUDA graph: the batch has ", batch.input.nbytes(), " + ", batch.target.nbytes(),
              " bytes, but the captured step's had ", input_bytes_, " + ", target_bytes_);
  cuda::memcpy(input_, batch.input.raw_data(), input_bytes_, cudaMemcpyHostToDevice);
  cuda::memcpy(target_, batch.target.raw_data(), target_bytes_, cudaMemcpyHostToDevice);
  // The uncaptured step this replay stands for draws the streams after the previous step's.
  ++replays_;
  write_offset(static_cast<uint64_t>(replays_) * streams_);
  set_rng_state(rng_seed(), rng_stream_position() + streams_);
  graph_.launch();
  cuda::synchronize();
  r.loss = read_loss(trainer_.graph_state(), loss_dtype_);
  trainer_.end_replayed_step(r);
  r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  r.cpu_ms = process_cpu_ms() - cpu0;
  r.memory = memory_;
  return r;
}
#endif

}  // namespace regen
