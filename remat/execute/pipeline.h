// The three stages as one object over a Trainer: profile one iteration (or take a profile made
// earlier), plan under a budget with any registered planner (or take a plan made elsewhere), and
// train under the plan. `regen train`, `regen sweep`, `regen frontier` and the remat test suites
// all run plans through it, so a program that links regen trains exactly as they do:
//
//   Trainer trainer(*model, *optimizer, *data, batch, device);
//   RematPipeline pipe(trainer);
//   pipe.profile();                                   // stage 1: measured steps (they train)
//   pipe.plan("dp", Budget::parse("50%"));            // stage 2
//   for (int i = 0; i < 100; ++i) pipe.step();        // stage 3: steps under the plan
//
// While steps run, the plan is installed: the executor's hooks on the calling thread's tape, the
// allocator's hard limit (a reserved budget) and the planned layout (PlanOptions::planned_layout).
// It stays installed between steps, so the step layout and the reserved segments carry over as
// they would in one loop, and it is removed by finish(), by a new profile or plan, and by the
// destructor, also when a step's exception unwinds the stack: no destroyed executor stays
// registered on the tape. Use a pipeline on one thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "regen/remat/execute/cuda_graph.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/execute/executor.h"
#include "regen/remat/plan/planner.h"
#include "regen/remat/profile/profiler.h"

namespace regen {

// A step that ran out of memory under `plan`: the allocator's report with what the plan
// predicted (peaks, where the peak is, the limit) and what to check. Thrown as OutOfMemory.
[[noreturn]] void rethrow_with_plan(const OutOfMemory& e, const Plan& plan);

class RematPipeline {
 public:
  explicit RematPipeline(Trainer& trainer);
  ~RematPipeline();
  RematPipeline(const RematPipeline&) = delete;
  RematPipeline& operator=(const RematPipeline&) = delete;

  // ---- Stage 1 -------------------------------------------------------------------------------
  // Runs options.warmup plain steps and options.iterations instrumented ones (they train the
  // model, as any step does) and keeps the profile. Drops any plan.
  const Profile& profile(ProfileOptions options = {});
  // A profile recorded earlier (load_profile). Refused, naming the field, when it was recorded for
  // another model, batch or device than the trainer's. Drops any plan.
  const Profile& use_profile(Profile profile);
  bool has_profile() const { return profile_ != nullptr; }
  const Profile& current_profile() const;  // throws regen::Error without one
  const Simulator& simulator() const;      // over the current profile

  // ---- Stage 2 -------------------------------------------------------------------------------
  // Any registered planner (remat/plan/planner.h policy_names()). The plan is kept even when it
  // does not fit its budget (Plan::feasible says so); step() runs it without a limit then.
  const Plan& plan(const std::string& policy, const Budget& budget,
                   const PlanOptions& options = {});
  // A plan made elsewhere for this profile: by make_plan, by judge_loaded_plan, or by hand (its
  // decisions one per saved tensor; finish_plan fills in its prediction).
  const Plan& use_plan(Plan plan);
  bool has_plan() const { return plan_ != nullptr; }
  const Plan& current_plan() const;  // throws regen::Error without one
  // Drops the plan: later steps run without remat.
  void clear_plan();

  // ---- Stage 3 -------------------------------------------------------------------------------
  // One training step, under the plan when there is one. An out-of-memory error under a plan
  // carries what the plan predicted (rethrow_with_plan). Under a plan the step must start from
  // the allocator state the profiled step started from (the same live blocks in the same places):
  // otherwise no prediction holds, and the step is refused with a regen::Error naming the first
  // block that differs, before its batch is made. At the plan's own limit the result carries the
  // predicted peaks (StepResult::predicted), and the counters below say how many steps matched.
  StepResult step(StepObserver* observer = nullptr);
  // `steps` steps; `progress` (may be empty) sees each one (1-based index) and returns false to
  // stop early. Returns every step's result.
  std::vector<StepResult> train(
      int64_t steps, const std::function<bool(int64_t, const StepResult&)>& progress = {});
  // Removes the installed plan (hooks, limit, layout) until the next step.
  void finish();
  // The allocator's hard limit the steps run under instead of the plan's (0: none; a negative
  // value: the plan's). For experiments that run a plan under a tighter limit than it was made for.
  void set_limit(int64_t limit);

  // CUDA graphs (cuda_graph.h): with `on` or `auto`, the steps under a plan that can be captured
  // are: the first after the plan was set runs uncaptured (the warm-up), the next is captured, and
  // the later ones replay it. Steps with an observer run uncaptured. `off` (the default) drops any
  // graph.
  void set_cuda_graph(CudaGraphMode mode);
  CudaGraphMode cuda_graph_mode() const { return graph_mode_; }
  // Why the steps under the current plan (or without one) cannot be captured, "" when they can
  // (cuda_graph_refusal).
  std::string cuda_graph_refusal() const;
  // The captured step, once there is one (null before, with the mode off, and after a new plan).
  const CudaGraphStep* cuda_graph() const;

  // Steps run under the plan at its own limit since it was set, and how many of them measured
  // exactly the predicted peaks (StepResult::exact) and, under a DTR plan (dtr.h), made exactly
  // the predicted evictions and replays; the first step that did not (1-based, among those steps;
  // 0 when every one did).
  int64_t predicted_steps() const { return predicted_steps_; }
  int64_t exact_steps() const { return exact_steps_; }
  int64_t first_inexact_step() const { return first_inexact_step_; }

  // Null until a plan is in use. Its counters are those of the last finished step. Under a DTR
  // plan it is a DtrExecutor (dtr_executor() then returns it too; null otherwise).
  const RematExecutor* executor() const { return exec_.get(); }
  const DtrExecutor* dtr_executor() const { return dtr_; }
  Trainer& trainer() { return trainer_; }
  // Steps run so far: profiling steps and step()'s.
  int64_t steps_done() const { return steps_done_; }

 private:
  void install();
  void set_plan(Plan plan);
  // Whether the current plan keeps anything on the device's host tier (offload).
  bool uses_host_tier() const;
  // Moves optimizer state a plan placed on the host tier back to the device (not necessarily where
  // it was profiled: a later plan's step may then be refused by the start check).
  void state_to_device();

  Trainer& trainer_;
  std::unique_ptr<Profile> profile_;
  std::unique_ptr<Simulator> sim_;
  std::unique_ptr<Plan> plan_;
  std::unique_ptr<RematExecutor> exec_;
  DtrExecutor* dtr_ = nullptr;  // exec_, when the plan is DTR's
  int64_t limit_override_ = -1;
  int64_t steps_done_ = 0;
  int64_t predicted_steps_ = 0, exact_steps_ = 0, first_inexact_step_ = 0;
  LiveLayout start_;       // the profiled step's start, which every step under the plan must repeat
  LiveLayout host_start_;  // the host tier's (start_layouts)
  bool state_on_host_ = false;  // the optimizer state was moved to the host tier for the plan
  CudaGraphMode graph_mode_ = CudaGraphMode::off;
  int64_t plan_steps_ = 0;  // steps run under the current plan (the first is the graph's warm-up)
#ifdef REGEN_WITH_CUDA
  std::unique_ptr<CudaGraphStep> graph_;
#endif
  // Drops the captured step (a new plan, a layout removed: its addresses no longer hold).
  void drop_graph();
  // The installed plan, removed in reverse order.
  std::unique_ptr<LimitScope> limit_;
  std::unique_ptr<LayoutScope> layout_;
  std::unique_ptr<EvictionScope> eviction_;  // DTR: the engine answers the allocator
  std::unique_ptr<HooksScope> hooks_;
  std::unique_ptr<OptimizerHooksScope> optimizer_hooks_;
};

}  // namespace regen
