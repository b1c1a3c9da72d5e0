// The "blocks" planner: torch.utils.checkpoint per residual block or encoder layer (BlockScope).
// Checkpointing block b recomputes every candidate produced inside it whose every reader is inside
// it; its output is read by the next block and stays. With a budget, the first k blocks in forward
// order, k the smallest that fits (plan_prefix); without one, every block.
#include "regen/remat/plan/planner_parts.h"
#include "regen/remat/plan/planners/builtin.h"

namespace regen {

namespace {

std::vector<Decision> blocks_prefix(const Profile& p, size_t k) {
  std::vector<Decision> d(p.saved.size(), Decision::retain);
  for (const ProfileSaved& s : p.saved) {
    if (!s.candidate) continue;
    const int32_t b = p.nodes[static_cast<size_t>(s.producer)].block;
    if (b < 0 || static_cast<size_t>(b) >= k) continue;
    if (contained(p, s, [&](int32_t n) { return p.nodes[static_cast<size_t>(n)].block == b; })) {
      d[static_cast<size_t>(s.index)] = Decision::recompute;
    }
  }
  return d;
}

PrefixPolicy blocks_order(const Profile& p) {
  PrefixPolicy order;
  order.n = p.blocks.size();
  order.make = [&p](size_t k) { return blocks_prefix(p, k); };
  order.what = "checkpointed the first";
  order.unit = "blocks";
  return order;
}

Plan plan_blocks(const Simulator& sim, const Budget& budget, const PlanOptions& options) {
  check_marks_blocks(sim, "blocks");
  const Profile& p = sim.profile();
  const bool keep = options.chain != Chain::drop;
  if (budget.kind == Budget::Kind::none) {
    // torch.utils.checkpoint on every block.
    Plan draft;
    draft.policy = "blocks";
    draft.decisions = blocks_prefix(p, p.blocks.size());
    draft.keep_chain = keep;
    Plan plan = finish_plan(sim, std::move(draft), budget, options);
    plan.note = "checkpointed all " + std::to_string(p.blocks.size()) + " blocks";
    return plan;
  }
  Plan plan = plan_prefix(sim, budget, options, keep, blocks_order(p));
  plan.policy = "blocks";
  return plan;
}

}  // namespace

PlannerInfo blocks_planner() {
  PlannerInfo info;
  info.name = "blocks";
  info.help = "checkpoint residual blocks / encoder layers in forward order until the peak fits";
  info.plan = plan_blocks;
  info.lowest = [](const Simulator& sim, const PlanOptions& options) {
    check_marks_blocks(sim, "blocks");
    const int64_t low =
        prefix_lowest(sim, options, options.chain != Chain::drop, blocks_order(sim.profile()));
    return plan_blocks(sim, bytes_budget(low), options);
  };
  return info;
}

}  // namespace regen
