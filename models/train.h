// One training iteration with a canonical start. Before the first step, gradients, optimizer
// state and model inputs that persist are created, so they take the same place in the allocator
// every time; every step then drops the previous step's tensors, empties the allocator cache and
// resets its peaks before touching anything. Every step therefore starts from the same allocator
// layout, which is what lets a profiled iteration predict later ones to the byte.
// Tests: tests/test_models.cpp (canonical start), tests/test_remat.cpp; used by `regen train`,
// `profile`, `sweep`, `bench train`.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "regen/autograd/precision.h"
#include "regen/kernels/half.h"
#include "regen/models/data.h"
#include "regen/models/model.h"
#include "regen/models/schedule.h"

namespace regen {

class Optimizer;
class TapeHooks;

// Data parallelism's part of a training step (dist/data_parallel.h implements it; the trainer
// knows only this interface). The trainer calls it at the same points of every step, on the
// calling thread, so whatever it allocates (gradient buckets, collectives' scratch, staging)
// comes in the same order at every step: a profiled step predicts the next ones to the byte.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  // Trainer::prepare, before the trainer creates gradients: the persistent buffers the sync keeps
  // (flat gradient buckets, gradient shards) and the gradients of the parameters it manages.
  virtual void prepare() = 0;
  // True when the parameters' gradients are made by the sync during backward (ZeRO-2): prepare()
  // then creates none for them.
  virtual bool manages_gradients() const = 0;
  // True when micro-batches can add up their gradients before one reduction (--accumulate):
  // not when the sync keeps no whole gradients between backward passes (ZeRO-2).
  virtual bool supports_accumulation() const { return !manages_gradients(); }
  // The tensors the optimizer updates: the model's parameters, or this rank's shard of them.
  virtual std::vector<Tensor> optimizer_parameters() const = 0;
  // After optimizer.zero_grad(), before the forward pass.
  virtual void begin_step() = 0;
  // After each forward pass of a step (every micro-batch's), before its backward.
  virtual void end_forward() {}
  // Observes backward; registered around backward() only, after every other hook (the profiler's
  // markers and a plan's executor run first at each node).
  virtual TapeHooks& backward_hooks() = 0;
  // After backward: every gradient reduced (waits for the collectives still in flight).
  virtual void end_backward() = 0;
  // After optimizer.step(): sharded parameters gathered.
  virtual void end_optimizer() = 0;
  // The step's loss as reported: the mean over the ranks of each rank's loss.
  virtual double reduce_loss(double loss) = 0;
  // The squared global gradient norm from this rank's sum of squares over optimizer_parameters()'s
  // gradients: itself when every rank holds every gradient, the sum over the ranks when each holds
  // a shard of them (ZeRO), the same number on every rank. Clipping and the logged norm use it.
  virtual double reduce_squared_norm(double local) { return local; }
};

// A CUDA graph's part of one training step (remat/execute/cuda_graph.h CudaGraphStep implements
// it; the trainer knows only this interface): the step's device work, from the gradients' zeroing
// to the optimizer's last kernel, is captured instead of run. The host runs the step as always
// (autograd, the allocator's planned requests), so the graph holds the planned addresses.
class StepCapture {
 public:
  virtual ~StepCapture() = default;
  // After the batch is on the device and checked, before the gradients are zeroed: capture begins.
  virtual void begin(const Batch& batch) = 0;
  // Where an uncaptured step reads the loss on the host (which waits for the device): the loss is
  // copied, captured, to device memory that end() reads once the graph has run.
  virtual void keep_loss(const Tensor& loss) = 0;
  // After the optimizer step: capture ends, the graph is instantiated and run once (the step's
  // own work); returns the step's loss.
  virtual double end() = 0;
  // The step threw while capturing: the capture is dropped. Never throws.
  virtual void abandon() noexcept = 0;
};

// Observers of a step's phases (the profiler is one).
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // After the canonical start (cache emptied, peaks reset), before the batch is created.
  virtual void on_iteration_begin(CachingAllocator&) {}
  virtual void on_optimizer_begin(CachingAllocator&) {}
  virtual void on_optimizer_end(CachingAllocator&) {}
  // After the optimizer step, with the device synchronized; the batch is still alive.
  virtual void on_iteration_end(CachingAllocator&) {}
  // With gradient accumulation (Trainer::set_accumulation, K > 1): after micro-batch `index`
  // (0-based) has run forward and backward and its batch is gone, before the next one.
  virtual void on_micro_batch_end(CachingAllocator&, int64_t /*index*/) {}
};

struct StepResult {
  double loss = 0;
  double ms = 0;  // wall time of the iteration (device synchronized)
  // The process's CPU time over the iteration, all threads (cpu_cores).
  double cpu_ms = 0;
  MemoryStats memory;  // allocator statistics, peaks over this iteration
  // A step run under a remat plan at the plan's own limit (RematPipeline::step): the peaks the
  // plan predicted for it, which the measured ones (memory.allocated.peak, memory.reserved.peak)
  // must equal to the byte. `predicted` is false for any other step.
  bool predicted = false;
  int64_t predicted_allocated = 0, predicted_reserved = 0;
  // The learning rate the optimizer step used (the schedule's, Trainer::set_schedule), the global
  // L2 norm of the gradients before clipping (-1 when neither clipping nor set_track_grad_norm
  // asked for it), the micro-batches of the step and the optimizer steps done after it.
  double lr = 0;
  double grad_norm = -1;
  int64_t micro_batches = 1;
  int64_t optimizer_step = 0;
  // fp16 (Trainer::set_precision): the loss scale the step's backward ran with (0 in any other
  // precision), and whether its gradients held an inf or a NaN, so that the optimizer skipped it
  // (the scale was then halved; the schedule's position still moved on, as PyTorch's
  // GradScaler leaves the scheduler to the loop).
  double loss_scale = 0;
  bool skipped = false;
  // A step whose plan keeps tensors or optimizer state on the device's host tier (offload,
  // host_allocator_for): the host tier's statistics over the step and its predicted peaks, which
  // must equal them as well.
  bool host_predicted = false;
  MemoryStats host_memory;
  int64_t predicted_host_allocated = 0, predicted_host_reserved = 0;
  // cpu_ms / ms: the cores' worth of CPU time the step had over its wall time. A step on the CPU
  // never sleeps (its main thread computes or waits for its own threads, which spin): below 1
  // (kBusyCores), it was descheduled for other processes' work, and its time is the machine's
  // load as much as the step's. Parallel parts add up to the thread count.
  double cpu_cores() const { return ms > 0 ? cpu_ms / ms : 0.0; }
  bool exact() const {
    return predicted && memory.allocated.peak == predicted_allocated &&
           memory.reserved.peak == predicted_reserved &&
           (!host_predicted || (host_memory.allocated.peak == predicted_host_allocated &&
                                host_memory.reserved.peak == predicted_host_reserved));
  }
};

// The process's CPU time so far, all threads, in milliseconds (CLOCK_PROCESS_CPUTIME_ID).
double process_cpu_ms();

// fp16's dynamic loss scale, with torch.cuda.amp.GradScaler's defaults: backward runs from the
// loss times `scale`, so that small gradients stay above fp16's smallest numbers; the gradients
// are divided by it before clipping and the update. A step whose gradients hold an inf or a NaN
// (an overflow) is skipped and halves the scale; kGrowthInterval good steps in a row double it.
// A scale below kFloor means the gradients overflow fp16 even unscaled: the run ends with an error
// that says so. bf16 has f32's range and needs no scaling.
struct LossScale {
  static constexpr double kInitial = 65536.0;
  static constexpr double kGrowth = 2.0;
  static constexpr double kBackoff = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;
  static constexpr double kFloor = 1.0;
  double scale = kInitial;
  int64_t good_steps = 0;  // steps without an overflow since the scale last changed
  int64_t skipped = 0;     // steps skipped for an overflow, in this run and those it resumed
  // After a step whose unscaled gradients were `finite` or not: the scale's next value and the
  // counts; throws regen::Error when the scale falls below kFloor.
  void update(bool finite);
};

class Trainer {
 public:
  Trainer(Model& model, Optimizer& optimizer, DataSource& data, int64_t batch_size, Device device);
  // Creates gradients (zeros) and optimizer state before the first step; step() calls it once.
  void prepare();
  StepResult step(StepObserver* observer = nullptr);
  // The next step (only) is captured by `capture` (StepCapture): one micro-batch, no host reads of
  // device values (no loss scaling, clipping or norm). nullptr: none.
  void set_step_capture(StepCapture* capture) { capture_ = capture; }
  // CUDA graphs (--cuda-graph): set before the first step, so that prepare() makes the graph's
  // state block, a persistent tensor of kGraphStateWords 64-bit words (the Philox stream offset
  // of replays, the loss read back; cuda_graph.h), which profiles and plans then count as any
  // persistent block. Undefined without it.
  static constexpr int64_t kGraphStateWords = 2;
  void set_cuda_graph(bool on);
  bool cuda_graph() const { return cuda_graph_; }
  const Tensor& graph_state() const { return graph_state_; }
  // A step whose device work a CUDA graph replays: the host's part of it. begin_replayed_step sets
  // the step's learning rate and draws its batch on the host (the graph's batch blocks are to hold
  // it); end_replayed_step counts the optimizer step. `r` gets what they decide (lr, the counts).
  Batch begin_replayed_step(StepResult& r);
  void end_replayed_step(StepResult& r);
  CachingAllocator& allocator() const { return allocator_for(device_); }
  Model& model() { return model_; }
  Optimizer& optimizer() { return optimizer_; }
  Device device() const { return device_; }
  int64_t batch_size() const { return batch_size_; }
  // Data parallelism (GradientSync): set before the first step; nullptr (the default) trains alone.
  void set_gradient_sync(GradientSync* sync);
  GradientSync* gradient_sync() const { return sync_; }

  // ---- The training loop around the step (models/schedule.h) ----------------------------------
  // Gradient accumulation: each step runs `k` micro-batches of batch_size() examples (forward and
  // backward, each loss scaled by 1/k through backward's seed, so the gradients are those of the
  // mean over all k * batch_size() examples), then one optimizer step. The gradient buffers are
  // persistent and live across the micro-batches; every micro-batch's batch and activations are
  // freed before the next one starts, so each repeats the first one's allocations (the profiler
  // checks it). Batch norm computes its statistics over each micro-batch, as in PyTorch. k = 1 is
  // the plain step. Under a GradientSync, only the last micro-batch's backward runs under its
  // hooks (DDP's no_sync for the others): the gradients are reduced once per step, and the sync's
  // allocations come in the last micro-batch only. Not with a sync that manages the gradients
  // (ZeRO-2): refused.
  void set_accumulation(int64_t k);
  int64_t accumulation() const { return accumulation_; }
  // The learning rate of every later step comes from `s` at the optimizer step index (below).
  void set_schedule(const LrSchedule& s);
  const LrSchedule* schedule() const { return has_schedule_ ? &schedule_ : nullptr; }
  // Clips the gradients to a global L2 norm of `max_norm` before each optimizer step (0: off).
  void set_clip_grad_norm(double max_norm);
  double clip_grad_norm() const { return clip_; }
  // Computes the gradient norm at every step (StepResult::grad_norm) even without clipping.
  void set_track_grad_norm(bool on) { track_norm_ = on; }
  bool track_grad_norm() const { return track_norm_; }
  // Optimizer steps taken so far: the schedule's position (set when a run resumes).
  int64_t optimizer_steps() const { return optimizer_steps_; }
  void set_optimizer_steps(int64_t n);
  // Packed saves (autograd/tape.h PackedSaves): decisions every step's forward pass records with
  // (learn_packed_saves below makes them); none (the default): every op saves its full form.
  void set_packed_saves(std::shared_ptr<const PackedSaves> decisions) {
    packed_saves_ = std::move(decisions);
  }
  const PackedSaves* packed_saves() const { return packed_saves_.get(); }
  // How the run holds retained activations between forward and backward (--compress): the remat
  // runtime narrows them (remat/execute/schedule.h); the trainer carries the setting so that
  // profiles of its steps record it.
  void set_compression(Compression c) { compression_ = c; }
  Compression compression() const { return compression_; }
  // The precision the steps train in (autograd/precision.h): under bf16 and fp16 each forward pass
  // runs under autocast (AutocastScope) and fp16 scales the loss (LossScale); set before the
  // first step. fp32 (the default) and tf32 change nothing here (tf32 is the CUDA math mode).
  void set_precision(Precision p);
  Precision precision() const { return precision_; }
  // fp16's loss scale now (a resumed run sets back the stopped run's).
  const LossScale& loss_scale() const { return loss_scale_; }
  void set_loss_scale(const LossScale& s);

 private:
  Model& model_;
  Optimizer& optimizer_;
  DataSource& data_;
  int64_t batch_size_;
  Device device_;
  bool prepared_ = false;
  int64_t accumulation_ = 1;
  LrSchedule schedule_;
  bool has_schedule_ = false;
  double clip_ = 0;
  bool track_norm_ = false;
  int64_t optimizer_steps_ = 0;
  GradientSync* sync_ = nullptr;
  std::shared_ptr<const PackedSaves> packed_saves_;
  Compression compression_ = Compression::none;
  Precision precision_ = Precision::fp32;
  LossScale loss_scale_;
  StepCapture* capture_ = nullptr;
  bool cuda_graph_ = false;
  Tensor graph_state_;
};

// The packed-save decisions for the step of `config` at `batch_size` on `device`: its forward pass
// recorded once with nothing packed, in a dry run (core/allocator.h DryRunScope: shapes only, on
// the Null arena, no kernel run, a model of its own), then decide_packed_saves. The global RNG's
// stream counter is put back afterwards, so the steps that follow draw the dropout masks they
// would draw without it. The calling thread's tape must be empty (nothing recorded and not yet
// released by backward).
// `precision`: the steps' (a mixed precision's forward pass records the casts autocast makes).
PackedSaves learn_packed_saves(const ModelConfig& config, int64_t batch_size, Device device,
                               Precision precision = Precision::fp32);

// The first training step of a configuration, run dry (core/allocator.h, DryRunScope): a model,
// its optimizer (from `make_optimizer`) and a trainer built inside the scope, one step on a batch
// of the right shapes and no values. Nothing is computed and no memory is used. `persistent` is
// the bytes still allocated after the step, exactly as the real step leaves them: parameters,
// gradients, optimizer state and the inputs a model keeps. `kept` is what the device keeps for the
// process (cuBLAS's workspace on CUDA, which prepare_device makes; 0 on the CPU), allocated
// before the step and after it, and counted in `memory`. `memory` has every tensor of the step and
// the kernels' own scratch space (each launcher that takes a Workspace requests it in a dry run,
// kernels/kernels.h): its peak of allocated bytes and every per-category peak, workspace included,
// are the real first step's, on the CPU run on the same thread with the same OpenMP thread count
// (tests/test_cli.cpp checks them), on CUDA with the same convolution algorithm and math mode
// (tests/cuda/test_cuda_dry_run.cpp; cuDNN's and CUB's scratch sizes are queried from the GPU, so
// a CUDA dry run needs one). A block still allocated once the model, optimizer and trainer are
// gone is a regen::Error. The global RNG stream advances as in a real step; reseed (manual_seed)
// before building the real model.
struct DryRunResult {
  MemoryStats memory;
  int64_t persistent = 0;
  int64_t kept = 0;
};
// The bytes of a configuration's parameters alone, exact, from a model built dry (no step, no
// optimizer): what the real run allocates before anything else, so a configuration whose
// parameters pass the memory available is refused before its step's dry run, whose requests grow
// with the sizes (an LM head of a billion-token vocabulary makes millions of tile requests).
int64_t dry_run_parameter_bytes(const ModelConfig& config, Device device);
// `packed`: the packed-save decisions the real steps record with (nullptr: none).
DryRunResult dry_run_step(const ModelConfig& config, int64_t batch_size, Device device,
                          const std::function<std::unique_ptr<Optimizer>(Model&)>& make_optimizer,
                          const PackedSaves* packed = nullptr);
// The same with data parallelism's part of the step and the trainer's setup: `make_sync` builds
// the sync for the dry run's model (its buffers come from the Null arena too; nothing is
// communicated), `make_optimizer` gets it, to update what it says
// (GradientSync::optimizer_parameters), and `setup` (accumulation, clipping, packed saves), when
// given, sets up the trainer before the step.
DryRunResult dry_run_step(
    const ModelConfig& config, int64_t batch_size, Device device,
    const std::function<std::unique_ptr<Optimizer>(Model&, GradientSync*)>& make_optimizer,
    const std::function<std::unique_ptr<GradientSync>(Model&)>& make_sync,
    const std::function<void(Trainer&)>& setup = {});

}  // namespace regen
