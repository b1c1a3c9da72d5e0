// The session layer's plan requests (session/plan_request.h): every check made once for the
// command line and Python, its messages naming flags or keywords, and the planner options it
// resolves against a profile. The training loop itself: tests/test_training.cpp.
#include <doctest/doctest.h>

#include <string>

#include "regen/remat/execute/pipeline.h"
#include "regen/session/plan_request.h"
#include "regen/session/session.h"
#include "test_util.h"

using namespace regen;
using regen::testing::error_of;

namespace {

PlanRequest request(const std::string& policy, OptionStyle style) {
  PlanRequest r;
  r.policy = policy;
  r.style = style;
  return r;
}

bool has(const std::string& text, const std::string& piece) {
  return text.find(piece) != std::string::npos;
}

}  // namespace

TEST_CASE("session: a plan request refuses what would be ignored, naming flags or keywords") {
  for (const OptionStyle style : {OptionStyle::flag, OptionStyle::keyword}) {
    const bool kw = style == OptionStyle::keyword;
    CAPTURE(kw);
    // A budget needs a policy that plans.
    PlanRequest r = request("none", style);
    r.set_budget("50%");
    std::string e = error_of([&] { r.validate(); });
    CHECK(has(e, kw ? "budget='50%' needs a rematerialization policy="
                    : "--budget 50% needs a rematerialization --policy"));
    // ...and is accepted with one.
    r.policy = "dp";
    CHECK(error_of([&] { r.validate(); }).empty());
    // A planned layout needs a plan, and a planner that plans ahead.
    r = request("none", style);
    r.layout = "planned";
    e = error_of([&] { r.validate(); });
    CHECK(has(e, kw ? "layout='planned' places the blocks" : "--layout planned places the blocks"));
    CHECK(error_of([&] { r.validate(/*compress=*/true); }).empty());
    CHECK(error_of([&] { r.validate(false, /*given_plan=*/true); }).empty());
    r.policy = "dtr";
    e = error_of([&] { r.validate(); });
    CHECK(has(e, kw ? "layout='planned': policy='dtr' evicts at run time"
                    : "--layout planned: --policy dtr evicts at run time"));
    // An offload needs a policy; a transfer model needs an offload.
    r = request("none", style);
    r.offload = "all";
    e = error_of([&] { r.validate(); });
    CHECK(has(e, kw ? "offload='all' is what a planner may move" : "--offload all is what"));
    r = request("dp", style);
    r.transfer = "gbps:10";
    e = error_of([&] { r.validate(); });
    CHECK(has(e, kw ? "transfer='gbps:10' times copies" : "--transfer gbps:10 times copies"));
    r.offload = "activations";
    CHECK(error_of([&] { r.validate(); }).empty());
    // Unknown values, each named with its option.
    r = request("greedy", style);
    CHECK(has(error_of([&] { r.validate(); }), "unknown policy 'greedy'"));
    r = request("dp", style);
    r.offload = "disk";
    CHECK(has(error_of([&] { r.validate(); }), kw ? "offload='disk': " : "--offload disk: "));
    r = request("dp", style);
    r.chain = "both";
    CHECK(has(error_of([&] { r.validate(); }), kw ? "chain='both': " : "--chain both: "));
    r = request("dp", style);
    r.budget_of = "device";
    CHECK(
        has(error_of([&] { r.validate(); }), kw ? "budget_of='device': " : "--budget-of device: "));
    r = request("dp", style);
    r.layout = "tight";
    CHECK(has(error_of([&] { r.validate(); }), kw ? "layout='tight': must be caching or planned"
                                                  : "--layout tight: must be caching or planned"));
    CHECK(has(error_of([&] { r.set_budget("fifty"); }), "fifty"));
    CHECK(has(error_of([&] { r.set_budget(""); }), "is empty"));
  }
}

TEST_CASE("session: a plan request resolves its options against a profile and plans with them") {
  SessionOptions o;
  o.model = "resnet-tiny";
  o.batch = 2;
  o.threads = 1;
  auto s = make_session(o);
  RematPipeline pipe(*s->trainer);
  const Profile& p = pipe.profile();
  PlanRequest r;
  r.policy = "dp";
  r.set_budget("lowest");
  r.budget_of = "allocated";
  r.layout = "planned";
  r.offload = "activations";
  r.transfer = "gbps:10";
  r.milp_time_limit_s = 5;
  r.validate();
  const PlanOptions po = r.options(&p);
  CHECK(po.budget_of == BudgetOf::allocated);
  CHECK(po.chain == Chain::automatic);
  CHECK(po.planned_layout);
  CHECK(po.offload == OffloadMode::activations);
  CHECK(po.transfer.valid());
  CHECK(po.transfer.to_host.bytes_per_ms == doctest::Approx(10e6));
  CHECK(po.milp_time_limit_s == 5);
  // The request's plan is the planner's own plan with those options.
  const Plan a = r.make(pipe.simulator(), p);
  const Plan b = make_plan(pipe.simulator(), "dp", Budget::parse("lowest"), po);
  CHECK(a.decisions == b.decisions);
  CHECK(a.predicted.peak_allocated == b.predicted.peak_allocated);
  CHECK(a.budget_of == BudgetOf::allocated);
  CHECK(a.planned_layout);
  // Chain modes, for a planner that takes one.
  PlanRequest blocks;
  blocks.policy = "blocks";
  blocks.chain = "keep";
  CHECK(blocks.options(&p).chain == Chain::keep);
  blocks.chain = "drop";
  CHECK(blocks.options(&p).chain == Chain::drop);
  // Without a profile a named transfer model is not read; the profile's own is the default.
  r.transfer = "profile";
  CHECK(!r.options(nullptr).transfer.valid());
}

TEST_CASE("session: a model's state past the memory is refused with its size and options") {
  // Parameters that fit with gradients and optimizer state that do not: the check after the
  // step's dry run (make_session refuses parameters alone past the memory before it:
  // tests/test_cli.cpp). A state of 2^60 bytes passes any machine's memory.
  for (const OptionStyle style : {OptionStyle::flag, OptionStyle::keyword}) {
    Session s;
    s.options.model = "transformer-tiny";
    s.options.style = style;
    s.options.model_options["vocab"] = 5000;
    s.device = Device::cpu();
    s.config = s.options.model_config();
    s.preflight.persistent = int64_t{1} << 60;
    for (const Preflight p : {Preflight::model, Preflight::step}) {
      const std::string e = error_of([&] { check_preflight(s, p); });
      CHECK(has(e,
                "transformer-tiny does not fit in memory: its parameters, gradients and "
                "optimizer state take "));
      CHECK(has(e, " (exact, from a dry run), but cpu has "));
      CHECK(
          has(e, style == OptionStyle::flag
                     ? "use a smaller preset or a smaller --seq-len (now 16) or --vocab (now 5000)"
                     : "use a smaller preset or a smaller seq_len (now 16) or vocab (now 5000)"));
    }
    CHECK(error_of([&] { check_preflight(s, Preflight::none); }).empty());
  }
}
