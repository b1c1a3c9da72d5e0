// The "sqrt" planner (Chen et al. 2016): the chain of n blocks cut into segments of ceil(sqrt(n))
// blocks; candidates produced and read only inside one segment are recomputed, segment outputs
// retained. One plan whatever the budget, judged by finish_plan.
#include <cmath>

#include "regen/remat/plan/planner_parts.h"
#include "regen/remat/plan/planners/builtin.h"

namespace regen {

namespace {

std::vector<Decision> sqrt_segments(const Profile& p) {
  std::vector<Decision> d(p.saved.size(), Decision::retain);
  const size_t n = p.blocks.size();
  if (n == 0) return d;
  const size_t k = static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  auto segment = [&](int32_t node) -> int64_t {
    const int32_t b = p.nodes[static_cast<size_t>(node)].block;
    return b < 0 ? -1 : static_cast<int64_t>(static_cast<size_t>(b) / k);
  };
  for (const ProfileSaved& s : p.saved) {
    if (!s.candidate) continue;
    const int64_t g = segment(s.producer);
    if (g < 0) continue;
    if (contained(p, s, [&](int32_t node) { return segment(node) == g; })) {
      d[static_cast<size_t>(s.index)] = Decision::recompute;
    }
  }
  return d;
}

Plan plan_sqrt(const Simulator& sim, const Budget& budget, const PlanOptions& options) {
  check_marks_blocks(sim, "sqrt");
  const Profile& p = sim.profile();
  Plan draft;
  draft.policy = "sqrt";
  draft.decisions = sqrt_segments(p);
  draft.keep_chain = options.chain != Chain::drop;
  Plan plan = finish_plan(sim, std::move(draft), budget, options);
  // make_plan writes the note of a plan that does not fit.
  if (plan.feasible) {
    plan.note = std::to_string(p.blocks.size()) + " blocks in segments of " +
                std::to_string(static_cast<int>(std::ceil(std::sqrt(double(p.blocks.size())))));
  }
  return plan;
}

}  // namespace

PlannerInfo sqrt_planner() {
  PlannerInfo info;
  info.name = "sqrt";
  info.help = "sqrt(n) segments over the chain of blocks (Chen et al.)";
  info.plan = plan_sqrt;
  info.lowest = [](const Simulator& sim, const PlanOptions& options) {
    check_marks_blocks(sim, "sqrt");
    const Profile& p = sim.profile();
    const Schedule s = build_schedule(p, sqrt_segments(p), options.chain != Chain::drop);
    return plan_sqrt(sim,
                     bytes_budget(lowest_fitting_budget(sim, s, options.budget_of, nullptr,
                                                        options.planned_layout)),
                     options);
  };
  return info;
}

}  // namespace regen
