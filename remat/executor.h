// Stage 3: applies a plan while training, through the tape's hooks. After each forward node it
// evicts the RECOMPUTE saved tensors whose last forward use that node was; before each backward
// node it runs the Schedule's regeneration program (replaying producer ops from retained
// tensors, recursively); the tape releases every saved tensor after its last backward use. The
// simulator replays the same Schedule, so the measured peak equals the predicted one.
#pragma once

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
  int64_t replays() const { return replays_; }
  double regen_ms() const { return regen_ms_; }

 private:
  void check_node(const Tape& tape, int32_t node, const std::vector<Tensor>& outputs) const;
  void run_program(Tape& tape, const RegenProgram& prog);

  const Profile& p_;
  Schedule schedule_;
  int64_t evictions_ = 0, replays_ = 0;
  double regen_ms_ = 0;
  int64_t cur_evictions_ = 0, cur_replays_ = 0;
  double cur_regen_ms_ = 0;
};

}  // namespace regen
