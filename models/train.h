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

#include "regen/kernels/half.h"
#include "regen/models/data.h"
#include "regen/models/model.h"

namespace regen {

class Optimizer;

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
};

struct StepResult {
  double loss = 0;
  double ms = 0;       // wall time of the iteration (device synchronized)
  MemoryStats memory;  // allocator statistics, peaks over this iteration
  // A step run under a remat plan at the plan's own limit (RematPipeline::step): the peaks the
  // plan predicted for it, which the measured ones (memory.allocated.peak, memory.reserved.peak)
  // must equal to the byte. `predicted` is false for any other step.
  bool predicted = false;
  int64_t predicted_allocated = 0, predicted_reserved = 0;
  // A step whose plan keeps tensors or optimizer state on the device's host tier (offload,
  // host_allocator_for): the host tier's statistics over the step and its predicted peaks, which
  // must equal them as well.
  bool host_predicted = false;
  MemoryStats host_memory;
  int64_t predicted_host_allocated = 0, predicted_host_reserved = 0;
  bool exact() const {
    return predicted && memory.allocated.peak == predicted_allocated &&
           memory.reserved.peak == predicted_reserved &&
           (!host_predicted || (host_memory.allocated.peak == predicted_host_allocated &&
                                host_memory.reserved.peak == predicted_host_reserved));
  }
};

class Trainer {
 public:
  Trainer(Model& model, Optimizer& optimizer, DataSource& data, int64_t batch_size, Device device);
  // Creates gradients (zeros) and optimizer state before the first step; step() calls it once.
  void prepare();
  StepResult step(StepObserver* observer = nullptr);
  CachingAllocator& allocator() const { return allocator_for(device_); }
  Model& model() { return model_; }
  Optimizer& optimizer() { return optimizer_; }
  Device device() const { return device_; }
  int64_t batch_size() const { return batch_size_; }
  // Packed saves (autograd/tape.h PackedSaves): decisions every step's forward pass records with
  // (learn_packed_saves below makes them); none (the default): every op saves its full form.
  void set_packed_saves(std::shared_ptr<const PackedSaves> decisions) {
    packed_saves_ = std::move(decisions);
  }
  const PackedSaves* packed_saves() const { return packed_saves_.get(); }
  // How the run holds retained activations between forward and backward (--compress): the remat
  // runtime narrows them (remat/schedule.h); the trainer carries the setting so that profiles of
  // its steps record it.
  void set_compression(Compression c) { compression_ = c; }
  Compression compression() const { return compression_; }

 private:
  Model& model_;
  Optimizer& optimizer_;
  DataSource& data_;
  int64_t batch_size_;
  Device device_;
  bool prepared_ = false;
  std::shared_ptr<const PackedSaves> packed_saves_;
  Compression compression_ = Compression::none;
};

// The packed-save decisions for the step of `config` at `batch_size` on `device`: its forward pass
// recorded once with nothing packed, in a dry run (core/allocator.h DryRunScope: shapes only, on
// the Null arena, no kernel run, a model of its own), then decide_packed_saves. The global RNG's
// stream counter is put back afterwards, so the steps that follow draw the dropout masks they
// would draw without it. The calling thread's tape must be empty (nothing recorded and not yet
// released by backward).
PackedSaves learn_packed_saves(const ModelConfig& config, int64_t batch_size, Device device);

// The first training step of a configuration, run dry (core/allocator.h, DryRunScope): a model,
// its optimizer (from `make_optimizer`) and a trainer built inside the scope, one step on a batch
// of the right shapes and no values. Nothing is computed and no memory is used. `persistent` is
// the bytes still allocated after the step, exactly as the real step leaves them: parameters,
// gradients, optimizer state and the inputs a model keeps. `memory` has every tensor of the step
// and, on the CPU, the kernels' own scratch space too (each CPU launcher that takes a Workspace
// requests it in a dry run, kernels/kernels.h): there its peak of allocated bytes and every
// per-category peak, workspace included, are the real first step's, run on the same thread with
// the same OpenMP thread count (tests/test_cli.cpp checks them). On a CUDA device no launcher runs:
// the workspace category lacks the CUDA side's scratch (the launchers' and cuBLAS's, which
// prepare_device keeps on the device's own allocator), so the peak is a lower bound that the real
// one passes by at most that scratch; the other categories' peaks are exact. A block still
// allocated once the model, optimizer and trainer are gone is a regen::Error. The global RNG
// stream advances as in a real step; reseed (manual_seed) before building the real model.
struct DryRunResult {
  MemoryStats memory;
  int64_t persistent = 0;
};
// `packed`: the packed-save decisions the real steps record with (nullptr: none).
DryRunResult dry_run_step(const ModelConfig& config, int64_t batch_size, Device device,
                          const std::function<std::unique_ptr<Optimizer>(Model&)>& make_optimizer,
                          const PackedSaves* packed = nullptr);

}  // namespace regen
