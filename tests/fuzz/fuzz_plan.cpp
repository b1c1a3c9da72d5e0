// libFuzzer: plan.json as `regen train --plan` reads it, against a fixed profile (the seed
// corpus's transformer-tiny profile, REGEN_FUZZ_PROFILE): load_plan checks the decisions, chain
// mode, regenerations and layout against the profile; an accepted plan is simulated.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "regen/remat/plan/planner.h"
#include "tests/fuzz/fuzz_util.h"

namespace {
std::unique_ptr<regen::Profile> g_profile;
}

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("REGEN_FUZZ_PROFILE");
  if (!path) {
    std::fprintf(stderr, "fuzz_plan: set REGEN_FUZZ_PROFILE to a profile.json\n");
    std::abort();
  }
  g_profile = std::make_unique<regen::Profile>(regen::load_profile(path));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = regen::fuzz::write_input("plan.json", data, size);
  regen::fuzz::refuse_or_accept([&] {
    const regen::Plan plan = regen::load_plan(path, *g_profile);
    const regen::Simulator sim(*g_profile);
    sim.run(regen::plan_schedule(*g_profile, plan));
  });
  return 0;
}
