// Stage 3: applies a plan while training, through the tape's hooks. After each forward node it
// evicts the RECOMPUTE saved tensors whose last forward use that node was; before each backward
// node it runs the Schedule's regeneration program (replaying producer ops from retained
// tensors, recursively); the tape releases every saved tensor after its last backward use. The
// simulator replays the same Schedule, so the measured peak equals the predicted one.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "regen/remat/planner.h"

namespace regen {

class RematExecutor : public TapeHooks {
 public:
  // `profile` and the schedule must outlive the executor.
  RematExecutor(const Profile& profile, Schedule schedule);

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
  double regen_ms() const { return regen_ms_; }

 protected:
  // The DTR executor (dtr.h) is one with an empty schedule and its own counters.
  void check_node(const Tape& tape, int32_t node, const std::vector<Tensor>& outputs) const;
  const Profile& p_;
  int64_t evictions_ = 0, replays_ = 0, narrowed_ = 0;
  double regen_ms_ = 0;

 private:
  void run_program(Tape& tape, const RegenProgram& prog);
  // Compression (schedule.h): narrows saved tensor s after its last forward use / widens it back.
  void narrow(Tape& tape, int32_t s);
  void widen(Tape& tape, int32_t s);
  std::map<int32_t, Tensor> narrow_;  // the narrow forms held now, by saved tensor
  int64_t cur_narrowed_ = 0;

  Schedule schedule_;
  int64_t cur_evictions_ = 0, cur_replays_ = 0;
  double cur_regen_ms_ = 0;
};

// Runs one regeneration program on the tape (interpret_program with tensors: Tape::replay, then
// Tape::restore for each restored output) and returns the number of ops it replayed. The device
// is synchronized at the end, so a caller's timing covers the kernels.
// after_step, when given, runs after each step (interpret_program).
int64_t run_program_on_tape(Tape& tape, const Profile& p, const RegenProgram& prog,
                            const std::function<void(size_t)>& after_step = {});

}  // namespace regen
