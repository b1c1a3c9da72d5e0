// The "dtr" and "dtr-coop" planners: DTR at run time, no plan (remat/dtr.h holds the engine and
// plan_dtr). Registered as every built-in planner is (builtin.h); tests/test_dtr.cpp.
#include "regen/remat/dtr.h"
#include "regen/remat/planners/builtin.h"

namespace regen {

PlannerInfo dtr_planner() {
  return {"dtr",
          "DTR at run time, no plan: evicts the saved tensor with the lowest cost / (bytes x "
          "staleness) when the limit refuses a request (simulated exactly)",
          [](const Simulator& sim, const Budget& b, const PlanOptions& o) {
            return plan_dtr(sim, b, o, DtrOptions{});
          },
          [](const Simulator& sim, const PlanOptions& o) {
            return lowest_dtr_plan(sim, o, DtrOptions{});
          }};
}

PlannerInfo dtr_coop_planner() {
  return {"dtr-coop",
          "DTR with Coop's windows: evicts the cheapest run of address-contiguous blocks that "
          "frees room for the request",
          [](const Simulator& sim, const Budget& b, const PlanOptions& o) {
            return plan_dtr(sim, b, o, DtrOptions{true});
          },
          [](const Simulator& sim, const PlanOptions& o) {
            return lowest_dtr_plan(sim, o, DtrOptions{true});
          }};
}

}  // namespace regen
