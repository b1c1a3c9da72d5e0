// libFuzzer: profile.json as `regen plan --profile` reads it (profile_from_json validates every
// field), then planned and simulated when it is accepted: an accepted profile must be one the
// planners and the simulator can run.
#include <cstdint>
#include <string>

#include "regen/remat/plan/planner.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  regen::fuzz::refuse_or_accept([&] {
    const regen::Profile p = regen::profile_from_json(text, "fuzz input");
    const regen::Simulator sim(p);
    regen::PlanOptions o;
    o.budget_of = regen::BudgetOf::allocated;
    regen::make_plan(sim, "mutwo", regen::Budget::parse("60%"), o);
  });
  return 0;
}
