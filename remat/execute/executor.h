// Stage 3: applies a plan while training, through the tape's hooks. After each forward node it
// evicts the RECOMPUTE saved tensors whose last forward use that node was; before each backward
// node it runs the Schedule's regeneration program (replaying producer ops from retained
// tensors, recursively); the tape releases every saved tensor after its last backward use. The
// simulator replays the same Schedule, so the measured peak equals the predicted one.
// remat/execute/ is stage 3: this executor, the Schedule it runs, DTR's runtime and the pipeline
// that drives a step under a plan (docs/architecture.md, "remat").
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "regen/core/copy_queue.h"
#include "regen/kernels/kernels.h"
#include "regen/models/optim.h"
#include "regen/remat/plan/planner.h"

namespace regen {

// The time a step's regeneration programs take on the device: a mark before and after each
// program on the device's own clock (kernels::DeviceTimeline: CUDA events on the compute stream,
// so the host never waits for the device mid-step and keeps the queue full; on the CPU the host
// clock, whose kernels are done when they return), summed when read. start()/stop() around a
// program; finish() makes the marks so far the last finished iteration's and starts again;
// last_ms() reads them, waiting for the device to pass the last mark (the trainer has waited for
// it already when a step's figures are read).
class ReplayTimer {
 public:
  explicit ReplayTimer(Device device) : cur_(device), last_(device) {}
  void start() { cur_.mark(); }
  void stop() { cur_.mark(); }
  void restart() { cur_.clear(); }  // drops the marks of the iteration in progress
  void finish();
  double last_ms();

 private:
  kernels::DeviceTimeline cur_, last_;
  bool read_ = true;  // last_ms_ is the sum of last_'s marks
  double last_ms_ = 0;
};

// What the executor's offloads did in the last finished step (its copy queues' figures).
struct OffloadCounters {
  int64_t offloads = 0;                            // saved tensors copied out and back
  int64_t bytes_to_host = 0, bytes_to_device = 0;  // optimizer state included
  double stall_ms = 0;  // time the compute waited for copies (measured: copy_queue.h)
};

class RematExecutor : public TapeHooks {
 public:
  // `profile` and the schedule must outlive the executor. Offloads (the schedule's) copy between
  // the profile's device and its host tier (host_allocator_for) on copy queues of their own.
  RematExecutor(const Profile& profile, Schedule schedule);
  ~RematExecutor() override;

  // Node 0 starts an iteration from nothing: what an earlier one that threw had counted or
  // timed is dropped.
  void on_forward_begin(Tape& tape, int32_t node) override;
  void on_forward_end(Tape& tape, int32_t node, const std::vector<Tensor>& outputs) override;
  void on_backward_start(Tape& tape) override;
  void on_backward_begin(Tape& tape, int32_t node) override;
  void on_backward_finish(Tape& tape) override;
  bool regenerate(Tape& tape, int32_t saved) override;

  const Schedule& schedule() const { return schedule_; }
  // Of the last finished iteration.
  int64_t evictions() const { return evictions_; }
  int64_t narrowed() const { return narrowed_; }  // saved tensors held narrow (compression)
  int64_t replays() const { return replays_; }
  // The regeneration programs' time on the device (ReplayTimer).
  double regen_ms() const { return timer_.last_ms(); }
  // Of the last finished step (taken when its optimizer step ends: optimizer_hooks() must be
  // installed on the trainer's optimizer, as RematPipeline does).
  const OffloadCounters& offload() const { return offload_; }

  // Optimizer state on the host tier (Schedule::optimizer_state): moves each state tensor of the
  // schedule's groups between the device and the host tier, in allocation order (to the host:
  // a host copy, then the device block goes; back: a device copy, then the host block goes). The
  // pipeline moves it when the plan is installed and back when it is dropped. Throws regen::Error
  // when the optimizer's state is not the profiled one (names, sizes) or, moving to the host,
  // when the host tier holds anything already.
  void move_optimizer_state(Optimizer& optimizer, StatePlace to);
  // The hooks that stream host-tier state through the device during `optimizer`'s update and close
  // each step's offload counters; installed on it while steps run.
  OptimizerHooks* optimizer_hooks(Optimizer& optimizer);

 protected:
  // The DTR executor (dtr.h) is one with an empty schedule and its own counters.
  void check_node(const Tape& tape, int32_t node, const std::vector<Tensor>& outputs) const;
  const Profile& p_;
  int64_t evictions_ = 0, replays_ = 0, narrowed_ = 0;
  mutable ReplayTimer timer_;  // reading it may wait for the device

 private:
  class StateStream;
  void run_program(Tape& tape, const RegenProgram& prog);
  CopyQueue& queue(CopyDirection d);
  void close_step_offload();
  // Compression (schedule.h): narrows saved tensor s after its last forward use / widens it back.
  void narrow(Tape& tape, int32_t s);
  void widen(Tape& tape, int32_t s);
  std::map<int32_t, Tensor> narrow_;  // the narrow forms held now, by saved tensor
  int64_t cur_narrowed_ = 0;

  Schedule schedule_;
  int64_t cur_evictions_ = 0, cur_replays_ = 0;
  // Offload: the queues (made on first use), per offload op its host copy, its new device block
  // while it is copied back, and the tickets of its two copies.
  Device device_;
  std::unique_ptr<CopyQueue> to_host_, to_device_;
  std::vector<std::shared_ptr<Storage>> host_copy_, device_copy_;
  std::vector<uint64_t> out_ticket_, in_ticket_;
  std::unique_ptr<StateStream> state_stream_;
  OffloadCounters offload_;
  int64_t cur_offloads_ = 0;
  int64_t bytes_to_host_before_ = 0, bytes_to_device_before_ = 0;
};

// Runs one regeneration program on the tape (interpret_program with tensors: Tape::replay, then
// Tape::restore for each restored output) and returns the number of ops it replayed. It waits for
// nothing: on an asynchronous device the program's kernels are queued behind the step's others
// (a caller times them with a ReplayTimer).
// after_step, when given, runs after each step (interpret_program).
int64_t run_program_on_tape(Tape& tape, const Profile& p, const RegenProgram& prog,
                            const std::function<void(size_t)>& after_step = {});

}  // namespace regen
