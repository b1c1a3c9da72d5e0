// The "dp" planner's parts the milp planner and PlanCache use (dp.cpp; the programme itself is
// chain.h's).
#pragma once

#include <string>
#include <vector>

#include "regen/remat/chain.h"
#include "regen/remat/planner.h"

namespace regen {

// What dp computes on a profile whatever the budget: the chain model's note, the programme's
// plans for every budget level, and the exact simulation of each plan dp judges (the all-retain
// plan first). PlanCache::dp() holds it; dp.cpp fills it on first use.
struct DpCache {
  struct Point {
    int64_t cand = -1;  // index in `cands`; -1: all retain
    SimResult r;        // unlimited
  };
  bool built = false;
  std::string note;
  std::vector<ChainPlan> cands;
  std::vector<Point> points;
  // The lowest reserved budget (caching layout) one of the points fits, once found (-1: not yet).
  int64_t lowest_reserved = -1;
};

// dp's plan for the budget (options.chain must not be keep: dp decides what each regeneration
// restores itself).
Plan plan_dp(const Simulator& sim, const Budget& budget, const PlanOptions& options);
// The lowest budget (of options.budget_of) dp meets: the lowest any of its points fits.
int64_t dp_lowest(const Simulator& sim, const PlanOptions& options);

}  // namespace regen
