// The one training loop: a TrainingRun takes a session's steps through its RematPipeline (with or
// without a plan) and makes every check a run makes once, for the command line
// (tools/cmd_train.cpp), Python (python/model.cpp Model.train) and the measured runs of regen
// sweep, frontier and choose (measure_training):
// - a plan that does not fit its budget, or whose steps reserve more than the device has, is
//   refused before the first step;
// - a loss that is not finite stops the run at once, and parameters and gradients are read for
//   values that are not finite at the run's last step (and every `scan_every` steps);
// - evaluation on the held-out split every options.eval_every steps and after the last, under the
//   plan's limit;
// - every step under a plan is checked against the plan's predicted peaks (check_predictions).
// What a caller shows or keeps of the steps is a TrainingObserver's: the command line's console and
// metrics log, Python's progress callback and log. Tests: tests/test_training.cpp (a run with an
// observer), tests/test_cli.cpp, tests/python/test_training.py.
//
//   auto s = regen::make_session(o);
//   regen::RematPipeline pipe(*s->trainer);
//   regen::TrainingRun run(*s, pipe);
//   run.observe(my_observer);
//   run.profile(profile_options);           // optional: steps without remat that profile
//   pipe.plan("dp", regen::Budget::parse("50%"));
//   run.run(100);                           // 100 steps under the plan
//   run.check_predictions();
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "regen/remat/execute/pipeline.h"
#include "regen/session/session.h"

namespace regen {

class TrainingRun;

// One step as a run's observers see it.
struct StepEvent {
  int64_t step = 0;   // the optimizer steps taken after it (a resumed run's earlier ones included)
  int64_t index = 0;  // its place among this call's steps, from 1
  int64_t count = 0;  // the steps this call runs unless an observer stops it (profile or run)
  bool profiling = false;  // a step without remat that profiles the session for its plan
  const StepResult* result = nullptr;
};

// What a caller does with a run's steps. Every hook has a default that does nothing.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // After each step, its loss checked (profiling steps included): logs, progress lines.
  virtual void on_step(const TrainingRun&, const StepEvent&) {}
  // After an evaluation on the held-out split, after step `step`.
  virtual void on_eval(const TrainingRun&, int64_t /*step*/, const EvalResult&) {}
  // After the step and its evaluation (not after profiling steps): false stops the run after
  // this step.
  virtual bool on_step_end(const TrainingRun&, const StepEvent&) { return true; }
  // Before the run throws (divergence, an evaluation out of memory): a console ends its line.
  virtual void on_abort(const TrainingRun&) {}
};

// What a run keeps of the steps it took under run() (not the profiling steps).
struct TrainingStats {
  std::vector<double> losses, ms, cpu_cores;
  int64_t peak_allocated = 0, peak_reserved = 0;
  MemoryStats at_peak;  // the statistics of the step with the highest allocated peak
  // The host tier's peaks, under a plan that offloads.
  int64_t host_peak_allocated = 0, host_peak_reserved = 0;
  // The first step under a plan whose peaks were not the predicted ones (predicted false: none).
  StepResult first_inexact;
  // The median over the steps after the first (which pays first-touch costs), or the first
  // when it is the only one: of the wall times, and of the CPU cores each step had.
  double median_ms() const;
  double median_cpu_cores() const;
};

struct TrainingRunOptions {
  // On the CPU, parameters and gradients are also read for values that are not finite every
  // `scan_every` optimizer steps (counted from the run's start, a resumed one's included; 0: at the
  // last step of run() only); on a GPU at the last step only (a copy
  // to the host).
  int64_t scan_every = 0;
  // A loss or parameter that is not finite stops the run with regen::Error (training diverged).
  // measure_training turns it off: a measurement of memory and time holds for any values.
  bool check_finite = true;
  // Evaluation every session options' eval_every steps (and after the last of run()).
  bool evaluate = true;
  // run() refuses a plan that does not fit its budget or the device (check_plan) before its first
  // step. measure_training turns it off: regen sweep measures plans that miss their budget too.
  bool check_plan = true;
};

class TrainingRun {
 public:
  TrainingRun(Session& session, RematPipeline& pipe, TrainingRunOptions options = {});
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // Observers are told of each step in the order they were added; the run does not own them.
  void observe(TrainingObserver& observer);

  // Profiles the session with `options.iterations` steps without remat (they train: observers see
  // them, with StepEvent::profiling set) and installs the profile in the pipeline.
  const Profile& profile(ProfileOptions options);
  // The plan in use, refused before a step runs under it: one that does not fit its budget (with
  // the simulated numbers), and one whose steps reserve more than the device has available.
  // Refusals name the options as the session's options.style says. Nothing without a plan.
  void check_plan() const;
  // `steps` steps under the pipeline's plan (or none), fewer when an observer stops the run.
  // Checks the plan first (check_plan, unless the options turn it off). Returns the steps' results.
  std::vector<StepResult> run(int64_t steps);
  // Evaluates the session's model on its held-out split now, under the plan's limit (the budget
  // holds for evaluation too), and tells the observers; `step` is the step it follows.
  EvalResult evaluate(int64_t step);
  // Throws regen::Error when a step under the plan did not measure the predicted peaks, or under
  // DTR made other evictions or replays than predicted: the prediction did not hold. `offset`: the
  // steps before the pipeline's first (profiling, or a resumed run's), to name the step.
  void check_predictions(int64_t offset = 0) const;
  // Why the session's --cuda-graph on or auto cannot capture the steps of the pipeline's plan ("":
  // they can be, or the option is off). run() refuses `on` with it before the first step; under
  // `auto` it says it once on stderr and the steps run uncaptured.
  std::string cuda_graph_refusal() const;
  // "--cuda-graph on" or "cuda_graph='on'", as the session's options name it.
  std::string cuda_graph_setting() const;

  Session& session() const { return session_; }
  RematPipeline& pipe() const { return pipe_; }
  const TrainingStats& stats() const { return stats_; }
  // The examples of an optimizer step: batch x micro-batches x ranks (samples/s).
  int64_t examples_per_step() const;

 private:
  void notify_step(const StepEvent& e);
  bool notify_step_end(const StepEvent& e);
  [[noreturn]] void abort_with(const std::string& message);
  void check_loss(const StepResult& r);
  void scan_parameters(int64_t step, bool skipped);  // skipped: the step's update was not applied
  void record(const StepResult& r);

  Session& session_;
  RematPipeline& pipe_;
  TrainingRunOptions options_;
  std::vector<TrainingObserver*> observers_;
  TrainingStats stats_;
  bool graph_note_said_ = false;
};

// One measured training run (regen sweep, regen frontier): peaks over every step, the median step
// time of all steps but the first (which pays first-touch costs), and the executor's figures of
// its last iteration.
struct MeasuredRun {
  double ms = 0;
  int64_t peak = 0, reserved = 0;  // peak allocated and reserved bytes
  double regen_ms = 0;             // regeneration time of the last step (with an executor)
  int64_t replays = 0;
  // Under a plan at its own limit: the steps whose peaks were checked against the prediction, and
  // how many measured it exactly (RematPipeline::step checks every step).
  int64_t steps_predicted = 0, steps_exact = 0;
  // Under a plan that uses the host tier (offload): its peaks over every step, and the time the
  // last step waited for copies.
  int64_t host_peak = 0, host_reserved = 0;
  double stall_ms = 0;
  // On the CPU, the median over the timed steps of their CPU time over wall time, in cores
  // (StepResult::cpu_cores), and the threads they ran with; when waited_for_other_work says so,
  // their times are not the step's own. 0 on a GPU.
  double cpu_cores = 0;
  int threads = 0;
};
// The share of each thread's core, in CPU time over wall time (StepResult::cpu_cores), a CPU step
// must reach to count as having run undisturbed (MeasuredRun, regen train's summary): below it,
// its time is the machine's load as much as the step's, and is not compared with a prediction as
// its error (as tools/torch_baseline.py reports the CPU time of PyTorch's steps). Measured on this
// project's 2-core machine (2026-11-28, the main job's executed plans): undisturbed 2-thread steps
// of ResNet-152 and the Transformer ran at 1.70-1.91 cores; one that another job's build shared
// the cores with, at 1.34, took 2.09x its predicted time.
inline constexpr double kBusyCores = 0.75;
inline bool waited_for_other_work(double cpu_cores, int threads) {
  return cpu_cores > 0 && cpu_cores < kBusyCores * (threads > 1 ? threads : 1);
}
// A fresh session (make_session) on an emptied allocator and `steps` steps of a TrainingRun (with
// no finite-value checks, no evaluation, and a plan that misses its budget run all the same):
// without `plan`, no rematerialization; with it (made for `profile`), every step under the plan,
// its limit (or `limit` when >= 0) and its planned layout. An out-of-memory error names what the
// plan predicted.
MeasuredRun measure_training(const SessionOptions& o, int steps, const Profile* profile = nullptr,
                             const Plan* plan = nullptr, int64_t limit = -1);

}  // namespace regen
