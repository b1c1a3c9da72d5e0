// The training step with a canonical start (train.h).
#include "regen/models/train.h"

#include <time.h>

#include <chrono>
#include <cmath>
#include <utility>

#include "regen/kernels/kernels.h"
#include "regen/models/optim.h"

namespace regen {

double process_cpu_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

Trainer::Trainer(Model& model, Optimizer& optimizer, DataSource& data, int64_t batch_size,
                 Device device)
    : model_(model), optimizer_(optimizer), data_(data), batch_size_(batch_size), device_(device) {
  REGEN_CHECK(batch_size > 0, "batch size must be positive, got ", batch_size);
  REGEN_CHECK(model.device() == device, "trainer: the model is on ", model.device().str(),
              " but training was asked on ", device.str());
}

void Trainer::set_gradient_sync(GradientSync* sync) {
  REGEN_CHECK(!prepared_, "trainer: the gradient sync is set before the first step");
  sync_ = sync;
}

void Trainer::prepare() {
  if (prepared_) return;
  kernels::prepare_device(device_);
  if (sync_) sync_->prepare();
  // Gradients a sync makes during backward (ZeRO-2) are not made here.
  const bool make_grads = !sync_ || !sync_->manages_gradients();
  for (auto& kv : model_.named_parameters()) {
    TensorImpl* impl = kv.second.impl().get();
    if (impl->grad || !make_grads) continue;
    CategoryScope cat(Category::gradient);
    TagScope tag(kv.first + ".grad");
    impl->grad = zeros(kv.second.shape(), kv.second.dtype(), device_).impl();
  }
  optimizer_.initialize_state();
  model_.prepare_inputs(device_);
  if (cuda_graph_ && !graph_state_.defined()) {
    CategoryScope cat(Category::other);
    TagScope tag("cuda_graph.state");
    graph_state_ = zeros({kGraphStateWords}, DType::i64, device_);
  }
  kernels::synchronize(device_);
  prepared_ = true;
}

void Trainer::set_cuda_graph(bool on) {
  REGEN_CHECK(!prepared_, "trainer: CUDA graphs are set before the first step");
  cuda_graph_ = on;
}

Batch Trainer::begin_replayed_step(StepResult& r) {
  REGEN_CHECK(prepared_ && accumulation_ == 1 && precision_ != Precision::fp16 && clip_ == 0 &&
                  !track_norm_,
              "trainer: a replayed step follows a captured one (one micro-batch, no loss scale, "
              "no clipping or norm)");
  if (has_schedule_) optimizer_.set_lr(schedule_.at(optimizer_steps_));
  r.lr = optimizer_.lr();
  r.micro_batches = 1;
  return data_.next(batch_size_, Device::cpu());
}

void Trainer::end_replayed_step(StepResult& r) {
  model_.replayed_forward();
  optimizer_.count_replayed_step();
  ++optimizer_steps_;
  r.optimizer_step = optimizer_steps_;
}

void Trainer::set_accumulation(int64_t k) {
  REGEN_CHECK(k >= 1, "gradient accumulation: ", k, " micro-batches per step (at least 1)");
  accumulation_ = k;
}

void Trainer::set_schedule(const LrSchedule& s) {
  const std::string bad = s.problem();
  REGEN_CHECK(bad.empty(), "learning-rate schedule: ", bad);
  schedule_ = s;
  has_schedule_ = true;
}

void Trainer::set_clip_grad_norm(double max_norm) {
  REGEN_CHECK(max_norm >= 0 && std::isfinite(max_norm), "gradient clipping: the maximum norm ",
              max_norm, " must be a finite number >= 0 (0: no clipping)");
  clip_ = max_norm;
}

void LossScale::update(bool finite) {
  if (finite) {
    if (++good_steps >= kGrowthInterval) {
      scale *= kGrowth;
      good_steps = 0;
    }
    return;
  }
  ++skipped;
  good_steps = 0;
  scale *= kBackoff;
  REGEN_CHECK(scale >= kFloor, "fp16 training: the loss scale fell to ", scale, " after ", skipped,
              " steps skipped for gradients that overflowed (inf or NaN): they overflow fp16 even "
              "unscaled, so training cannot go on in fp16 (train in bf16, which has f32's range, "
              "or lower the learning rate)");
}

void Trainer::set_precision(Precision p) {
  REGEN_CHECK(!prepared_, "trainer: the precision is set before the first step");
  precision_ = p;
}

void Trainer::set_loss_scale(const LossScale& s) {
  REGEN_CHECK(std::isfinite(s.scale) && s.scale >= LossScale::kFloor && s.good_steps >= 0 &&
                  s.good_steps < LossScale::kGrowthInterval && s.skipped >= 0,
              "trainer: a loss scale of ", s.scale, " with ", s.good_steps, " good steps and ",
              s.skipped, " skipped is not one a run reaches (a scale >= ", LossScale::kFloor,
              ", good steps below ", LossScale::kGrowthInterval, ")");
  loss_scale_ = s;
}

void Trainer::set_optimizer_steps(int64_t n) {
  REGEN_CHECK(n >= 0, "trainer: optimizer steps ", n, " must be >= 0");
  optimizer_steps_ = n;
}

StepResult Trainer::step(StepObserver* observer) {
  // ZeRO-2 makes the gradients during backward and frees all but this rank's shard of them once
  // reduced, so there is nothing to accumulate micro-batches into: refused before the step starts.
  REGEN_CHECK(accumulation_ == 1 || sync_ == nullptr || sync_->supports_accumulation(),
              "gradient accumulation (", accumulation_,
              " micro-batches) with gradients sharded across the ranks (ZeRO-2) is not "
              "supported: shard the optimizer state only (ZeRO-1), or one micro-batch per step");
  prepare();
  CachingAllocator& alloc = allocator();
  kernels::synchronize(device_);
  alloc.empty_cache();
  alloc.reset_peak();
  alloc.begin_planned_step();  // with a planned layout installed, its first request is next
  const auto t0 = std::chrono::steady_clock::now();
  const double cpu0 = process_cpu_ms();
  if (observer) observer->on_iteration_begin(alloc);
  StepResult r;
  if (has_schedule_) optimizer_.set_lr(schedule_.at(optimizer_steps_));
  r.lr = optimizer_.lr();
  r.micro_batches = accumulation_;
  // Under data parallelism: every gradient reduced, then clipping (or the norm alone) and the
  // update inside the optimizer's window, then ZeRO's gathers.
  const bool scaled = precision_ == Precision::fp16;
  if (scaled) r.loss_scale = loss_scale_.scale;
  // A captured step (set_step_capture): for this step only; dropped if the step throws.
  StepCapture* const capture = std::exchange(capture_, nullptr);
  REGEN_CHECK(!capture || (accumulation_ == 1 && !scaled && clip_ == 0 && !track_norm_),
              "CUDA graph capture: the step reads device values on the host (",
              accumulation_ > 1 ? "gradient accumulation"
              : scaled          ? "fp16's loss scale"
                                : "the gradient norm",
              "), which a replayed graph cannot do");
  struct AbandonOnThrow {
    StepCapture* c;
    bool done = false;
    ~AbandonOnThrow() {
      if (c && !done) c->abandon();
    }
  } abandon_guard{capture};
  // The forward pass, under autocast in a mixed precision.
  auto forward = [&](const Batch& batch) {
    Tensor loss;
    {
      AutocastScope autocast(low_dtype(precision_));
      PackedSavesScope packed(packed_saves_.get());
      loss = model_.forward_loss(batch.input, batch.target);
    }
    if (sync_) sync_->end_forward();
    return loss;
  };
  // Backward from `loss` times `factor` (1/k for k micro-batches) and, in fp16, the loss scale.
  // `reduce`: under data parallelism, with the sync's hooks (its buckets reduce the gradients as
  // backward finishes them); without them the gradients only accumulate here, as DDP's no_sync.
  auto run_backward = [&](const Tensor& loss, double factor, bool reduce) {
    const double seed_value = factor * (scaled ? loss_scale_.scale : 1.0);
    Tensor seed;
    if (seed_value != 1.0) {
      CategoryScope cat(Category::gradient);
      seed = full(loss.shape(), seed_value, loss.dtype(), loss.device());
    }
    if (sync_ && reduce) {
      const HooksScope hooks(&sync_->backward_hooks());
      Tape::current().backward(loss, seed);
    } else {
      Tape::current().backward(loss, seed);
    }
  };
  // Under data parallelism: every gradient reduced, then clipping (or the norm alone) and the
  // update inside the optimizer's window, then ZeRO's gathers.
  auto update = [&] {
    if (sync_) sync_->end_backward();
    if (observer) observer->on_optimizer_begin(alloc);
    const std::vector<Tensor>& params = optimizer_.params();
    // GradScaler's unscale_ (fp16): the gradients divided by the scale before anything reads them.
    if (scaled) scale_gradients(params, 1.0 / loss_scale_.scale);
    bool finite = true;
    if (scaled || clip_ > 0 || track_norm_) {
      // clip_grad_norm_'s arithmetic, with the sum of squares reduced across the ranks when each
      // holds a shard of the gradients (ZeRO): the global norm on every rank. In fp16 it is also
      // the overflow check: the global sum of squares is finite exactly when every gradient is.
      double squares = gradient_sum_squares(params);
      if (sync_ && !dry_run_active()) squares = sync_->reduce_squared_norm(squares);
      finite = !scaled || std::isfinite(squares) || dry_run_active();
      if (finite) r.grad_norm = std::sqrt(squares);
      const double coef = clip_ > 0 ? clip_ / (r.grad_norm + 1e-6) : 1.0;
      if (finite && coef < 1.0) scale_gradients(params, coef);
    }
    if (finite) optimizer_.step();
    if (scaled && !dry_run_active()) loss_scale_.update(finite);
    r.skipped = !finite;
    if (sync_) sync_->end_optimizer();
    ++optimizer_steps_;
    r.optimizer_step = optimizer_steps_;
    if (capture) {  // the captured work runs now, once
      abandon_guard.done = true;
      r.loss = capture->end();
    }
    kernels::synchronize(device_);
    if (observer) observer->on_optimizer_end(alloc);
  };
  if (accumulation_ == 1) {
    Batch batch = data_.next(batch_size_, device_);
    model_.check_batch(batch);
    if (capture) capture->begin(batch);
    optimizer_.zero_grad();
    if (sync_) sync_->begin_step();
    Tensor loss = forward(batch);
    if (capture) {
      capture->keep_loss(loss);
    } else {
      r.loss = loss.dtype() == DType::f64 ? loss.item<double>() : loss.item<float>();
    }
    run_backward(loss, 1.0, true);
    loss = Tensor();
    update();
    r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    r.cpu_ms = process_cpu_ms() - cpu0;
    if (observer) observer->on_iteration_end(alloc);
  } else {
    // Under data parallelism, the first k - 1 micro-batches run backward without the sync's
    // hooks (their gradients add up in this rank's buffers, as in one process) and the last one
    // under them: its buckets reduce the sums, overlapped with its backward (DDP's no_sync). The
    // sync's own allocations (its collectives' scratch) come in the last micro-batch only; the
    // profiler keeps that one and the simulator replays the others without them.
    optimizer_.zero_grad();
    if (sync_) sync_->begin_step();
    const double k = static_cast<double>(accumulation_);
    double sum = 0;
    for (int64_t i = 0; i < accumulation_; ++i) {
      {
        Batch batch = data_.next(batch_size_, device_);
        model_.check_batch(batch);
        Tensor loss = forward(batch);
        sum += loss.dtype() == DType::f64 ? loss.item<double>() : loss.item<float>();
        // The gradient of the mean over all micro-batches: backward's seed is 1/k, not 1 (the
        // block backward would take for its seed of ones, taken here).
        run_backward(loss, 1.0 / k, i + 1 == accumulation_);
      }
      if (observer) observer->on_micro_batch_end(alloc, i);
    }
    r.loss = sum / k;
    update();
    r.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    r.cpu_ms = process_cpu_ms() - cpu0;
    if (observer) observer->on_iteration_end(alloc);
  }
  r.memory = alloc.stats();
  if (sync_) r.loss = sync_->reduce_loss(r.loss);
  return r;
}

PackedSaves learn_packed_saves(const ModelConfig& config, int64_t batch_size, Device device,
                               Precision precision) {
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
    Tensor loss;
    {
      AutocastScope autocast(low_dtype(precision));
      loss = model->forward_loss(batch.input, batch.target);
    }
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
  std::shared_ptr<const PackedSaves> decisions;
  if (packed) decisions = std::make_shared<const PackedSaves>(*packed);
  return dry_run_step(
      config, batch_size, device, [&](Model& m, GradientSync*) { return make_optimizer(m); },
      [](Model&) { return std::unique_ptr<GradientSync>(); },
      [&](Trainer& t) {
        if (decisions) t.set_packed_saves(decisions);
      });
}

int64_t dry_run_parameter_bytes(const ModelConfig& config, Device device) {
  kernels::prepare_device(device);
  DryRunScope scope(device);
  int64_t bytes = 0;
  {
    std::unique_ptr<Model> model = make_model(config, device);
    bytes = scope.allocator().stats().allocated.current - scope.kept_bytes();
  }
  const MemoryStats left = scope.allocator().stats();
  REGEN_CHECK(left.live_blocks == scope.kept_blocks(), "dry build of ", config.name, ": ",
              left.live_blocks - scope.kept_blocks(), " block(s) still allocated after the model");
  return bytes;
}

DryRunResult dry_run_step(
    const ModelConfig& config, int64_t batch_size, Device device,
    const std::function<std::unique_ptr<Optimizer>(Model&, GradientSync*)>& make_optimizer,
    const std::function<std::unique_ptr<GradientSync>(Model&)>& make_sync,
    const std::function<void(Trainer&)>& setup) {
  // What a device keeps for the life of the process (cuBLAS's handle and workspace) is made
  // now, on the device's own allocator, where the real step finds it; the scope counts it from its
  // start (kept), as the real step's peaks do.
  kernels::prepare_device(device);
  DryRunScope scope(device);
  DryRunResult r;
  try {
    {
      std::unique_ptr<Model> model = make_model(config, device);
      std::unique_ptr<GradientSync> sync = make_sync(*model);
      std::unique_ptr<Optimizer> optimizer = make_optimizer(*model, sync.get());
      std::unique_ptr<DataSource> data = make_shape_source(config);
      Trainer trainer(*model, *optimizer, *data, batch_size, device);
      trainer.set_gradient_sync(sync.get());
      if (setup) setup(trainer);
      r.memory = trainer.step().memory;
      r.kept = scope.kept_bytes();
      r.persistent = scope.allocator().stats().allocated.current - r.kept;
    }
    // Every block of the dry run goes with the objects above: one kept longer would outlive the
    // scope's allocator.
    const MemoryStats left = scope.allocator().stats();
    REGEN_CHECK(left.live_blocks == scope.kept_blocks(), "dry run of ", config.name, ": ",
                left.live_blocks - scope.kept_blocks(), " block(s) (",
                format_bytes(left.allocated.current - scope.kept_bytes()),
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
