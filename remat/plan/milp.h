// An exact planner for small graphs: a mixed-integer linear program (after Checkmate, Jain et al.
// 2020) over the plans the executor runs, solved with CBC. It is the ground truth the heuristic
// planners are measured against.
//
// The plans it chooses from are the ones build_schedule (remat/execute/schedule.h) turns into
// programs with keep_chain = false: a RETAIN/RECOMPUTE decision per candidate saved tensor (a
// recomputed one is evicted after its last forward use), and explicit regenerations: before
// backward node j, the listed evicted tensors are regenerated and restored, and stay resident until
// their last backward use. Every evicted tensor is restored exactly once, at or before its first
// backward use; a program replays the minimal set of forward nodes from resident tensors, in
// forward order, and keeps nothing but its targets. The cost is the forward medians of the replayed
// nodes.
//
// Memory is modelled on the profiled iteration's levels (remat/simulate/liveness.h) with the
// tracked set = the candidates: at every stretch of the event log between two points where the plan
// or a candidate's allocation or free changes what is alive, the highest level of everything else
// plus the candidates the plan holds there; inside every regeneration program, before each replayed
// node, what the program holds (the targets restored so far, the replayed values a later replayed
// node still reads) plus the node's own forward peak. This is exact while every block is in the
// small pool (<= 1 MiB); a large cached block is not split when 1 MiB or less would remain, so
// large tensors' block sizes depend on the plan. The returned plan is therefore simulated exactly;
// when it is over the budget, the MILP is solved again with the internal budget lowered by the
// model's error on that plan (MilpOptions::max_rounds).
//
// The solve runs in a child process: SIGINT, SIGTERM or SIGHUP stops it at once and reaches the
// planning process as if no solver ran (by default it dies of it; plan_milp throws otherwise), and
// a crash inside CBC is an error, not the planning process's end.
//
// Environment: REGEN_MILP_LOG=1 shows CBC's log. REGEN_MILP_PARAMS, which passed any CBC
// parameter unchecked (preprocess=on crashed CBC at short time limits), is refused: the options
// are MilpOptions' (--milp-time-limit on the command line).
#pragma once

#include <cstdint>
#include <string>

#include "regen/remat/plan/offload.h"
#include "regen/remat/plan/planner.h"

namespace regen {

struct MilpOptions {
  // Seconds for the whole plan_milp call: building the programme, every round's solve and the
  // simulations between them share it (milp_round_limit); a solver that overruns its round's
  // share is stopped (milp_stop_after) and the round has no solution.
  double time_limit_s = 60;
  double relative_gap = 1e-4;   // stop when proven within this gap
  int max_rounds = 4;           // re-solves with a lower internal budget when the exact simulation
                                // exceeds the budget
  const Plan* start = nullptr;  // optional incumbent (e.g. another planner's plan) given to the
                                // solver as a MIP start (the solver checks it against the model)
  int threads = 1;
  // What the budget bounds (planner.h): for reserved bytes a plan fits when it runs under the
  // allocator's limit at the budget; the programme's rows bound allocated bytes, and a plan the
  // limit refuses is solved again with a lower internal budget.
  BudgetOf budget_of = BudgetOf::reserved;
  // Judge each plan by its run with a planned layout (PlanOptions::planned_layout).
  bool planned_layout = false;
  // Offload (the milp policy gives dp's choice): these tensors are offloaded and the optimizer
  // state lives where the family says, in every plan; the programme chooses retain or recompute
  // for the other candidates, on the levels the family changes (offload.h level_change), as dp's
  // programme does for a family. `transfer` times the copies; `mode` sets the lower bound.
  const OffloadFamily* offload = nullptr;
  TransferModel transfer;
  OffloadMode mode = OffloadMode::none;
};

struct MilpReport {
  std::string status;       // "optimal", "time limit (gap X%)", "infeasible", ...
  double objective_ms = 0;  // the model's recompute time of the returned plan
  double bound_ms = 0;      // best lower bound the solver proved (last round's model)
  double gap = 0;           // (objective - bound) / objective, 0 when proven optimal
  double solve_s = 0;       // total solver time over rounds
  double total_s = 0;       // the whole call: building, solving, simulating
  int rounds = 0;
  int64_t internal_budget = 0;                           // budget the last round's model used
  int64_t variables = 0, binaries = 0, constraints = 0;  // of the last round's model
};

// The solver's time limit for round `round` (1-based) of a plan_milp call limited to `limit_s`
// seconds, `elapsed_s` seconds after it started: what is left of the limit, at least 0.01 s for
// the first round (which always solves); negative when a later round has no time left (the call
// stops with the best plan so far).
double milp_round_limit(double limit_s, double elapsed_s, int round);
// When a solve given `limit_s` seconds is stopped (CBC checks its limit only between steps of its
// search, and its first LP relaxation can run long past a small one): twice the limit, and at
// least 2 s past it (a loaded machine's slow start is not an overrun).
double milp_stop_after(double limit_s);

// Whether regen was built with CBC (REGEN_MILP; plan_milp throws without it).
bool milp_available();

// Plans under budget_bytes (> 0) with the MILP. The returned Plan is complete like make_plan's:
// policy "milp", decisions, regenerations, keep_chain = false, predicted = exact simulation,
// feasible = predicted peak allocated <= budget, no_remat_peak, lower_bound (memory_lower_bound),
// note (status, gap, rounds). Throws regen::Error for a budget <= 0, and when regen was built
// without CBC.
Plan plan_milp(const Simulator& sim, int64_t budget_bytes, const MilpOptions& opt = {},
               MilpReport* report = nullptr);

}  // namespace regen
