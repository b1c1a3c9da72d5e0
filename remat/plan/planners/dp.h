// The "dp" planner's parts the milp planner and PlanCache use (dp.cpp; the programme itself is
// remat/plan/chain.h's).
#pragma once

#include <string>
#include <vector>

#include "regen/remat/plan/chain.h"
#include "regen/remat/plan/offload.h"
#include "regen/remat/plan/planner.h"

namespace regen {

// What dp computes on a profile whatever the budget: the chain model's note, the programme's
// plans for every budget level, and the exact simulation of each plan dp judges (the all-retain
// plan first). PlanCache::dp() holds it; dp.cpp fills it on first use.
// With offload (PlanOptions::offload), the programme is solved once more per offload family
// (remat/plan/offload.h offload_families): the family's tensors offloaded, the rest planned on the
// levels that leaves; every point's plan is simulated with its copies and their waits.
struct DpCache {
  struct Family {
    OffloadFamily offload;  // the base family (index 0) offloads nothing
    std::string note;
    std::vector<ChainPlan> cands;
  };
  struct Point {
    int64_t family = 0;
    int64_t cand = -1;  // index in the family's `cands`; -1: the family's offloads, nothing else
    SimResult r;        // unlimited
  };
  bool built = false;
  std::vector<Family> families;
  std::vector<Point> points;  // points[0]: all retain
  TransferModel transfer;     // what the offload families were built with
  // The lowest reserved budget (caching layout) one of the points fits, once found (-1: not yet).
  int64_t lowest_reserved = -1;
};

// The plan of one of dp's points (its decisions, regenerations, offloads and their points), and
// its schedule.
Plan dp_point_plan(const Profile& p, const DpCache& memo, const DpCache::Point& pt);
Schedule dp_schedule(const Profile& p, const DpCache& memo, const DpCache::Point& pt);

// dp's plan for the budget (options.chain must not be keep: dp decides what each regeneration
// restores itself).
Plan plan_dp(const Simulator& sim, const Budget& budget, const PlanOptions& options);
// The lowest budget (of options.budget_of) dp meets: the lowest any of its points fits.
int64_t dp_lowest(const Simulator& sim, const PlanOptions& options);

}  // namespace regen
