// The training step with a canonical start (train.h).
#include "regen/models/train.h"

#include <chrono>

#include "regen/kernels/kernels.h"
#include "regen/models/optim.h"

namespace regen {

Trainer::Trainer(Model& model, Optimizer& optimizer, DataSource& data, int64_t batch_size,
                 Device device)
    : model_(model), optimizer_(optimizer), data_(data), batch_size_(batch_size), device_(device) {
  REGEN_CHECK(batch_size > 0, "batch size must be positive, got ", batch_size);
  REGEN_CHECK(model.device() == device, "trainer: the model is on ", model.device().str(),
              " but training was asked on ", device.str());
}

void Trainer::prepare() {
  if (prepared_) return;
  kernels::prepare_device(device_);
  for (auto& kv : model_.named_parameters()) {
    TensorImpl* impl = kv.second.impl().get();
    if (impl->grad) continue;
    CategoryScope cat(Category::gradient);
    TagScope tag(kv.first + ".grad");
    impl->grad = zeros(kv.second.shape(), kv.second.dtype(), device_).impl();
  }
  optimizer_.initialize_state();
  model_.prepare_inputs(device_);
  kernels::synchronize(device_);
  prepared_ = true;
}

StepResult Trainer::step(StepObserver* observer) {
  prepare();
  CachingAllocator& alloc = allocator();
  kernels::synchronize(device_);
  alloc.empty_cache();
  alloc.reset_peak();
  alloc.begin_planned_step();  // with a planned layout installed, its first request is next
  const auto t0 = std::chrono::steady_clock::now();
  if (observer) observer->on_iteration_begin(alloc);
  StepResult r;
  {
    Batch batch = data_.next(batch_size_, device_);
    model_.check_batch(batch);
    optimizer_.zero_grad();
    Tensor loss;
    {
      PackedSavesScope packed(packed_saves_.get());
      loss = model_.forward_loss(batch.input, batch.target);
    }
    r.loss = loss.dtype() == DType::f64 ? loss.item<double>() : loss.item<float>();
    backward(loss);
    loss = Tensor();
    if (observer) observer->on_optimizer_begin(alloc);
    optimizer_.step();
    kernels::synchronize(device_);
    if (observer) observer->on_optimizer_end(alloc);
    r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (observer) observer->on_iteration_end(alloc);
  }
  r.memory = alloc.stats();
  return r;
}

PackedSaves learn_packed_saves(const ModelConfig& config, int64_t batch_size, Device device) {
  Tape& tape = Tape::current();
  REGEN_CHECK(tape.empty(), "learn_packed_saves: the calling thread's tape holds ",
              tape.nodes().size(),
              " recorded ops (a forward pass whose backward has not run); run backward or clear "
              "the tape first");
  kernels::prepare_device(device);
  RngStreamRestore rng;
  DryRunScope scope(device);
  PackedSaves decisions;
  try {
    std::unique_ptr<Model> model = make_model(config, device);
    std::unique_ptr<DataSource> data = make_shape_source(config);
    model->prepare_inputs(device);
    Batch batch = data->next(batch_size, device);
    model->check_batch(batch);
    Tensor loss = model->forward_loss(batch.input, batch.target);
    decisions = decide_packed_saves(tape);
    loss = Tensor();
    tape.clear();
  } catch (...) {
    tape.clear();  // its tensors belong to the scope's allocator
    throw;
  }
  return decisions;
}

DryRunResult dry_run_step(const ModelConfig& config, int64_t batch_size, Device device,
                          const std::function<std::unique_ptr<Optimizer>(Model&)>& make_optimizer,
                          const PackedSaves* packed) {
  // What a device keeps for the life of the process (cuBLAS's handle and workspace) is made
  // now, on the device's own allocator: inside the scope it would come from the Null arena.
  kernels::prepare_device(device);
  DryRunScope scope(device);
  DryRunResult r;
  try {
    {
      std::unique_ptr<Model> model = make_model(config, device);
      std::unique_ptr<Optimizer> optimizer = make_optimizer(*model);
      std::unique_ptr<DataSource> data = make_shape_source(config);
      Trainer trainer(*model, *optimizer, *data, batch_size, device);
      if (packed) trainer.set_packed_saves(std::make_shared<const PackedSaves>(*packed));
      r.memory = trainer.step().memory;
      r.persistent = scope.allocator().stats().allocated.current;
    }
    // Every block of the dry run goes with the objects above: one kept longer would outlive the
    // scope's allocator.
    const MemoryStats left = scope.allocator().stats();
    REGEN_CHECK(left.live_blocks == 0, "dry run of ", config.name, ": ", left.live_blocks,
                " block(s) (", format_bytes(left.allocated.current),
                ") still allocated after the model, optimizer and trainer are gone");
  } catch (...) {
    // A step stopped half-way leaves its tensors on the tape; they belong to the scope's
    // allocator and must go before it does.
    Tape::current().clear();
    throw;
  }
  return r;
}

}  // namespace regen
