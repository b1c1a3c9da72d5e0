// The "dtr" and "dtr-coop" planners: DTR at run time, no plan (remat/execute/dtr.h holds the engine
// and plan_dtr). Registered as every built-in planner is (builtin.h); tests/test_dtr.cpp.
#include "regen/remat/execute/dtr.h"
#include "regen/remat/plan/planners/builtin.h"

namespace regen {

namespace {

// A DTR planner: it plans (simulates the engine) and runs at step time with the same options.
PlannerInfo dtr_info(std::string name, std::string help, DtrOptions d) {
  PlannerInfo info;
  info.name = std::move(name);
  info.help = std::move(help);
  info.plan = [d](const Simulator& sim, const Budget& b, const PlanOptions& o) {
    return plan_dtr(sim, b, o, d);
  };
  info.lowest = [d](const Simulator& sim, const PlanOptions& o) {
    return lowest_dtr_plan(sim, o, d);
  };
  info.at_step_time = d;
  return info;
}

}  // namespace

PlannerInfo dtr_planner() {
  return dtr_info("dtr",
                  "DTR at run time, no plan: evicts the saved tensor with the lowest cost / (bytes "
                  "x staleness) when the limit refuses a request (simulated exactly)",
                  DtrOptions{});
}

PlannerInfo dtr_coop_planner() {
  return dtr_info("dtr-coop",
                  "DTR with Coop's windows: evicts the cheapest run of address-contiguous blocks "
                  "that frees room for the request",
                  DtrOptions{true});
}

}  // namespace regen
