// The "none" planner: retain every saved tensor (the baseline). Registered as any planner is
// (builtin.h); judged by finish_plan like a planner written outside regen.
#include "regen/remat/plan/planner_parts.h"
#include "regen/remat/plan/planners/builtin.h"

namespace regen {

namespace {

Plan plan_none(const Simulator& sim, const Budget& budget, const PlanOptions& options) {
  Plan draft;
  draft.policy = "none";
  draft.decisions.assign(sim.profile().saved.size(), Decision::retain);
  draft.keep_chain = options.chain != Chain::drop;
  return finish_plan(sim, std::move(draft), budget, options);
}

}  // namespace

PlannerInfo none_planner() {
  PlannerInfo info;
  info.name = "none";
  info.help = "retain every saved tensor";
  info.plan = plan_none;
  info.lowest = [](const Simulator& sim, const PlanOptions& options) {
    const Profile& p = sim.profile();
    const Schedule all = build_schedule(p, std::vector<Decision>(p.saved.size(), Decision::retain));
    return plan_none(sim,
                     bytes_budget(lowest_fitting_budget(sim, all, options.budget_of, nullptr,
                                                        options.planned_layout)),
                     options);
  };
  return info;
}

}  // namespace regen
