// The "milp" planner: the exact mixed-integer programme over the executor's plans
// (remat/plan/milp.h, after Checkmate), solved with CBC from dp's plan. Its answer is never worse
// than dp's: where the MILP's memory model refuses dp's plan, proves the budget out of its reach
// while dp's plan fits, or returns nothing that reaches as low, dp's plan is kept and the note says
// so.
#include <algorithm>
#include <cstdio>

#include "regen/core/io.h"
#include "regen/remat/plan/milp.h"
#include "regen/remat/plan/planner_parts.h"
#include "regen/remat/plan/planners/builtin.h"
#include "regen/remat/plan/planners/dp.h"

namespace regen {

namespace {

Plan plan_milp_policy(const Simulator& sim, const Budget& budget, const PlanOptions& options) {
  REGEN_CHECK(options.chain != Chain::keep,
              "the milp policy decides what each regeneration restores itself; it takes no chain "
              "mode (got keep)");
  const BudgetOf of = options.budget_of;
  Plan plan = plan_dp(sim, budget, options);
  REGEN_CHECK(plan.budget_bytes > 0,
              "the milp policy needs a budget (--budget): it minimizes the recomputation time "
              "under one");
  MilpOptions mo;
  mo.time_limit_s = options.milp_time_limit_s;
  mo.threads = options.milp_threads;
  mo.budget_of = of;
  mo.planned_layout = options.planned_layout;
  // dp's plan as the solver's first incumbent.
  if (plan.feasible) mo.start = &plan;
  // With offload: dp's choice of what to offload (its plan's family), and the programme's choice
  // of what to recompute around it.
  OffloadFamily family;
  if (options.offload != OffloadMode::none && plan.uses_host()) {
    for (const ProfileSaved& s : sim.profile().saved) {
      if (plan.decisions[static_cast<size_t>(s.index)] == Decision::offload)
        family.saved.push_back(s.index);
    }
    family.optimizer_state = plan.optimizer_state;
    family.change =
        level_change(sim.profile(), family.saved, family.optimizer_state, plan.transfer);
    mo.offload = &family;
    mo.transfer = plan.transfer;
  }
  mo.mode = options.offload;
  MilpReport report;
  Plan milp = plan_milp(sim, plan.budget_bytes, mo, &report);
  milp.budget_text = plan.budget_text;
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "MILP %s in %.1f s of solving, %.1f s in all with building and simulating "
                "(limit %g s; %d round%s; %lld variables, %lld binary, %lld rows)",
                report.status.c_str(), report.solve_s, report.total_s, mo.time_limit_s,
                report.rounds, report.rounds == 1 ? "" : "s",
                static_cast<long long>(report.variables), static_cast<long long>(report.binaries),
                static_cast<long long>(report.constraints));
  if (better_plan(plan, milp)) {
    char why[240];
    std::snprintf(
        why, sizeof why, "; dp's plan kept (%s %s, step %.3f s; the MILP's: %s %s, step %.3f s)%s",
        plan.feasible ? "fits at" : "peak", format_bytes(peak_of(plan.predicted, of)).c_str(),
        plan.predicted.time_ms / 1000.0, milp.feasible ? "fits at" : "peak",
        format_bytes(peak_of(milp.predicted, of)).c_str(), milp.predicted.time_ms / 1000.0,
        plan.feasible ? ": the MILP's memory model did not accept it" : "");
    plan.note = buf;
    plan.note += why;
    plan.lowest_peak = std::min(plan.lowest_peak, milp.lowest_peak);
    return plan;
  }
  milp.note = buf;
  milp.lowest_peak = std::min(plan.lowest_peak, milp.lowest_peak);
  return milp;
}

// milp meets every budget dp meets; below dp's lowest it bisects towards the lower bound with up
// to kMilpLowestSolves solves (the MILP's model admits more plans as the budget grows), each answer
// judged by exact simulation, and keeps the lowest budget it met.
constexpr int kMilpLowestSolves = 6;

Plan milp_lowest(const Simulator& sim, const PlanOptions& options) {
  Plan best = plan_milp_policy(sim, bytes_budget(dp_lowest(sim, options)), options);
  if (!best.feasible) return best;
  int64_t lo = memory_lower_bound(sim.profile()) - 1, hi = best.budget_bytes;  // lo never fits
  for (int i = 0; i < kMilpLowestSolves && hi - lo > std::max<int64_t>(4096, hi / 1000); ++i) {
    const int64_t mid = lo + (hi - lo) / 2;
    Plan at = plan_milp_policy(sim, bytes_budget(mid), options);
    if (at.feasible) {
      hi = mid;
      best = std::move(at);
    } else {
      lo = mid;
    }
  }
  return best;
}

}  // namespace

PlannerInfo milp_planner() {
  PlannerInfo info;
  info.name = "milp";
  info.help =
      "exact mixed-integer programme over the executor's plans (Checkmate), CBC, from dp's plan";
  info.plan = plan_milp_policy;
  info.lowest = milp_lowest;
  info.slow = true;
  info.available = milp_available;
  info.lowest_noted_by = "dp";
  info.offloads = true;
  return info;
}

}  // namespace regen
