// The built-in planners, each in its own file of this folder and each a PlannerInfo like the one a
// program gives register_planner (remat/plan/planner.h): the registry registers these first, in
// this order, through the same checks. builtin_planners() lists them.
#pragma once

#include <vector>

#include "regen/remat/plan/planner.h"

namespace regen {

PlannerInfo none_planner();      // none.cpp
PlannerInfo blocks_planner();    // blocks.cpp
PlannerInfo sqrt_planner();      // sqrt.cpp
PlannerInfo mutwo_planner();     // mutwo.cpp
PlannerInfo dp_planner();        // dp.cpp
PlannerInfo milp_planner();      // milp.cpp
PlannerInfo dtr_planner();       // dtr.cpp
PlannerInfo dtr_coop_planner();  // dtr.cpp

// none, blocks, sqrt, mutwo, dp, milp, dtr, dtr-coop.
std::vector<PlannerInfo> builtin_planners();

// The cache a planner was handed (make_plan always hands one; PlanOptions::cache), checked to be
// for `sim`.
PlanCache& cache_for(const Simulator& sim, const PlanOptions& options);

// blocks and sqrt checkpoint whole blocks: a model that marks none is refused, naming the others.
void check_marks_blocks(const Simulator& sim, const std::string& policy);

}  // namespace regen
