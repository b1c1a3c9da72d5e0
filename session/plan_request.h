// A plan as a person asks for it: the policy and every setting that shapes its plan, as the
// command line's flags (--policy, --budget, --budget-of, --layout, --chain, --offload, --transfer,
// --milp-time-limit) or Python's keywords (policy=, budget=, ...) give them. Each value and each
// combination is checked here once (validate), naming the option as `style` says, for every
// command that plans and for Python; the planner's options are resolved against a profile here
// once (options: the transfer model is the profile's unless another is named). Tests:
// tests/test_cli.cpp, tests/python/test_errors.py, tests/python/test_offload.py.
//
//   regen::PlanRequest req;
//   req.policy = "dp";
//   req.set_budget("50%");
//   req.validate();                              // before any step or profile
//   regen::Plan plan = req.make(sim, profile);   // after profiling
#pragma once

#include <string>

#include "regen/remat/plan/planner.h"
#include "regen/remat/profile/profile.h"
#include "regen/remat/simulate/simulator.h"
#include "regen/session/options.h"

namespace regen {

struct PlanRequest {
  std::string policy = "none";  // a registered planner's name
  Budget budget;                // none unless given (set_budget)
  std::string budget_text;      // the budget as given, for messages ("" when none)
  std::string budget_of = "reserved";
  std::string layout = "caching";
  std::string chain = "auto";
  std::string offload = "none";
  std::string transfer = "profile";  // profile, step:S, gbps:B[,LATENCY_MS] or a JSON file
  double milp_time_limit_s = 60;
  int milp_threads = 1;
  OptionStyle style = OptionStyle::flag;

  // The budget as a person writes it ("60%", "2GiB", "lowest"); empty text is refused, naming
  // the option (parse_budget_option).
  void set_budget(const std::string& text);
  bool budget_given() const { return budget.kind != Budget::Kind::none; }
  // A planner that makes a plan (not "none").
  bool plans() const { return policy != "none"; }
  // The registered planner of `policy` decides at step time (DTR's engine).
  bool at_step_time() const;

  // Every value known and every combination meaningful, before a profile or a step: a known
  // policy; chain, budget-of, layout and offload among their values; a budget only with a policy
  // that plans; a planned layout only with a plan (a policy that plans, or `compress`: a run whose
  // activations are held narrow plans with none) and never with a planner that decides at step
  // time; an offload only with a policy that plans; a transfer model only with an offload.
  // `given_plan`: the caller applies a plan made before (--plan FILE, plan=), which carries its
  // own layout. Throws regen::Error naming the option as `style` says.
  void validate(bool compress = false, bool given_plan = false) const;
  // The planner's options, the transfer model resolved against `profile` (its own model, unless
  // another is named; a named one is checked without a profile when `profile` is null).
  PlanOptions options(const Profile* profile) const;
  // The plan of `profile` (simulated by `sim`) this request asks for.
  Plan make(const Simulator& sim, const Profile& profile, PlanCache* cache = nullptr) const;
};

// An offload only when a plan is made (`planning`), a transfer model only with an offload: what
// PlanRequest::validate checks of them, for commands that plan a list of policies (regen sweep,
// frontier). Throws regen::Error naming the options as `style` says.
void check_offload_request(const std::string& offload, const std::string& transfer, bool planning,
                           OptionStyle style = OptionStyle::flag);

}  // namespace regen
