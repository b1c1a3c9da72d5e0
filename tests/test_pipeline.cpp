// The library's pipeline and registries: a planner and a model registered by the program run
// through RematPipeline like the built-in ones (exact peaks, bitwise training); names are checked;
// blocks and sqrt refuse a model that marks no blocks; a step that throws under a plan leaves no
// hooks behind on the tape.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"
#include "regen/models/layers.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/remat/plan/planner_parts.h"
#include "regen/remat/plan/planners/builtin.h"
#include "regen/remat/plan/planners/dp.h"
#include "tests/remat_suite.h"
#include "tests/test_util.h"

using namespace regen;
using namespace regen::testing;

namespace {

// A planner written outside regen: recompute every other candidate, judged by finish_plan.
Plan every_other(const Simulator& sim, const Budget& budget, const PlanOptions& options) {
  const Profile& p = sim.profile();
  Plan draft;
  draft.policy = "every-other";
  draft.decisions.assign(p.saved.size(), Decision::retain);
  bool pick = true;
  for (const ProfileSaved& s : p.saved) {
    if (!s.candidate) continue;
    if (pick) draft.decisions[static_cast<size_t>(s.index)] = Decision::recompute;
    pick = !pick;
  }
  return finish_plan(sim, std::move(draft), budget, options);
}

// A network with no blocks marked: `layers` 3x3 convolutions of `width` channels with relu,
// pooling, a linear head. With `constant`, forward makes a constant (zeros, no gradient) and adds
// it after the first convolution, so everything after reads it.
class ConvNet : public Model {
 public:
  ConvNet(const ModelConfig& c, Device device, int layers, int64_t width, bool constant)
      : Model(c), constant_(constant) {
    Generator gen(c.seed);
    for (int i = 0; i < layers; ++i) {
      const std::string n = "conv" + std::to_string(i);
      conv_.push_back(&register_module(
          n, std::make_unique<Conv2d>(n, i == 0 ? 3 : width, width, 3, 1, 1, false, gen, device)));
    }
    fc_ = &register_module("fc",
                           std::make_unique<Linear>("fc", width, c.num_classes, true, gen, device));
    assign_full_names();
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (size_t i = 0; i < conv_.size(); ++i) {
      h = relu(conv_[i]->forward(h));
      if (i == 0 && constant_) {
        const Tensor z = zeros(h.shape(), h.dtype(), h.device());  // dropped when forward returns
        h = add(h, z);
      }
    }
    return fc_->forward(flatten(global_avg_pool(h), 1));
  }
  Tensor loss(const Tensor& logits, const Tensor& target) const override {
    return cross_entropy(logits, target);
  }
  void check_batch(const Batch&) const override {}

 private:
  bool constant_;
  std::vector<Conv2d*> conv_;
  Linear* fc_;
};

void register_once() {
  static const bool done = [] {
    register_planner(
        {"every-other", "recompute every other candidate (a test planner)", every_other});
    ModelConfig preset;
    preset.image_size = 32;
    preset.num_classes = 10;
    register_model({"plain-test", "conv, relu, pooling, linear (no blocks)", preset,
                    [](const ModelConfig& c, Device d) {
                      return std::make_unique<ConvNet>(c, d, 4, 16, false);
                    },
                    image_classifier_input()});
    register_model(
        {"constant-test", "a constant made in forward", preset,
         [](const ModelConfig& c, Device d) { return std::make_unique<ConvNet>(c, d, 3, 8, true); },
         image_classifier_input()});
    return true;
  }();
  (void)done;
}

}  // namespace

TEST_CASE(
    "pipeline: a registered planner runs like a built-in one: exact peaks, bitwise training") {
  register_once();
  const std::vector<std::string> names = policy_names();
  CHECK(names.back() == "every-other");
  CHECK(std::count(names.begin(), names.end(), "dp") == 1);
  check_model(model_preset("transformer-tiny"), 4, {"every-other"});
}

TEST_CASE("pipeline: a registered model is profiled, planned and trained by name") {
  register_once();
  const ModelConfig cfg = model_preset("plain-test");
  CHECK(cfg.name == "plain-test");
  CHECK(cfg.image_size == 32);
  {
    std::unique_ptr<Model> m = make_model(cfg);
    CHECK(dynamic_cast<ConvNet*>(m.get()) != nullptr);
  }
  // mutwo and dp plan it; blocks and sqrt say it has no blocks instead of an empty plan.
  check_model(cfg, 8, {"none", "mutwo", "dp", "every-other"});
  const Profile p = profile_of(cfg, 4, 1);
  CHECK(p.blocks.empty());
  const Simulator sim(p);
  for (const char* policy : {"blocks", "sqrt"}) {
    const std::string e = error_of([&] { make_plan(sim, policy, Budget::parse("80%")); });
    CAPTURE(e);
    CHECK(e.find(std::string("the ") + policy + " policy checkpoints whole blocks") !=
          std::string::npos);
    CHECK(e.find("plain-test marks none") != std::string::npos);
  }
}

TEST_CASE("pipeline: registry names are checked, unknown ones listed") {
  register_once();
  CHECK(error_of([] {
          register_planner({"dp", "again", every_other});
        }).find("registered already") != std::string::npos);
  CHECK(error_of([] {
          register_planner({"bad name", "x", every_other});
        }).find("must be letters") != std::string::npos);
  CHECK(error_of([] {
          register_planner({"no-function", "x", {}});
        }).find("has no function") != std::string::npos);
  const std::string unknown = error_of([] { planner_info("nosuch"); });
  CHECK(unknown.find("unknown policy 'nosuch'") != std::string::npos);
  CHECK(unknown.find("every-other") != std::string::npos);
  ModelConfig c;
  CHECK(error_of([&] {
          register_model({"resnet50", "again", c, make_model, image_classifier_input()});
        }).find("registered already") != std::string::npos);
  CHECK(error_of([&] {
          register_model({"x y", "bad", c, make_model, image_classifier_input()});
        }).find("must be letters") != std::string::npos);
  const std::string um = error_of([] { model_preset("nosuch"); });
  CHECK(um.find("unknown model 'nosuch'") != std::string::npos);
  CHECK(um.find("plain-test") != std::string::npos);
  // A planner that returns the wrong number of decisions is refused by make_plan.
  register_planner(
      {"short-test", "too few decisions", [](const Simulator&, const Budget&, const PlanOptions&) {
         Plan p;
         p.decisions.resize(1);
         return p;
       }});
  const Profile p = profile_of(model_preset("transformer-tiny"), 2, 1);
  const std::string e = error_of([&] { make_plan(Simulator(p), "short-test", Budget()); });
  CHECK(e.find("returned 1 decisions for") != std::string::npos);
}

// The built-in planners are PlannerInfos like an outside planner's: registered first and in order
// through register_planner's checks, each with its LowestFn. Planning in both chain modes and
// keeping the better is a wrapper an outside planner uses too. A PlanCache the caller owns carries
// dp's programme and mutwo's order from one plan to the next (the plans are those made without
// one) and is refused for another simulator.
TEST_CASE("pipeline: built-in planners are peers, the chain-mode wrapper, a caller's PlanCache") {
  register_once();
  const std::vector<PlannerInfo> builtin = builtin_planners();
  const std::vector<std::string> names = policy_names();
  REQUIRE(builtin.size() == 8);  // none, blocks, sqrt, mutwo, dp, milp, dtr, dtr-coop
  for (size_t i = 0; i < builtin.size(); ++i) {
    CAPTURE(builtin[i].name);
    CHECK(names[i] == builtin[i].name);
    CHECK(planner_info(builtin[i].name).help == builtin[i].help);
    CHECK(static_cast<bool>(builtin[i].lowest));
    CHECK(error_of([&] { register_planner(builtin[i]); }).find("registered already") !=
          std::string::npos);
  }
  static const bool both = [] {
    register_planner({"every-other-both", "every other candidate, in the better chain mode",
                      in_both_chain_modes(every_other)});
    return true;
  }();
  (void)both;
  const Profile p = profile_of(model_preset("transformer-tiny"), 4, 1);
  const Simulator sim(p);
  auto options = [](Chain chain) {
    PlanOptions o;
    o.chain = chain;
    o.budget_of = BudgetOf::allocated;
    return o;
  };
  int kept = 0, dropped = 0;
  for (const char* b : {"", "95%", "85%", "1"}) {
    CAPTURE(b);
    const Plan keep = make_plan(sim, "every-other", Budget::parse(b), options(Chain::keep));
    const Plan drop = make_plan(sim, "every-other", Budget::parse(b), options(Chain::drop));
    const Plan a = make_plan(sim, "every-other-both", Budget::parse(b), options(Chain::automatic));
    const Plan& better = better_plan(drop, keep) ? drop : keep;
    CHECK(a.keep_chain == better.keep_chain);
    CHECK(a.predicted.peak_allocated == better.predicted.peak_allocated);
    CHECK(a.predicted.time_ms == better.predicted.time_ms);
    CHECK(a.note.find(std::string("chain ") + (a.keep_chain ? "keep" : "drop") + " chosen") !=
          std::string::npos);
    (a.keep_chain ? kept : dropped) += 1;
  }
  CHECK(kept + dropped == 4);
  // The lowest budget of a planner registered without a LowestFn: the one its answer to an
  // impossible budget fits, met.
  const Plan low = make_plan(sim, "every-other", Budget::parse("lowest"), options(Chain::keep));
  CHECK(low.feasible);
  CHECK(low.budget_text == "lowest");
  CHECK(low.budget_bytes >= memory_lower_bound(p));
  CHECK(low.predicted.peak_allocated <= low.budget_bytes);

  PlanCache cache(sim);
  PlanOptions o = options(Chain::automatic);
  o.cache = &cache;
  const Plan first = make_plan(sim, "dp", Budget::parse("80%"), o);
  REQUIRE(cache.dp().built);
  const size_t points = cache.dp().points.size();
  CHECK(points >= 2);
  const Plan again = make_plan(sim, "dp", Budget::parse("80%"), o);
  const Plan fresh = make_plan(sim, "dp", Budget::parse("80%"), options(Chain::automatic));
  CHECK(cache.dp().points.size() == points);
  for (const Plan* x : {&again, &fresh}) {
    CHECK(x->decisions == first.decisions);
    REQUIRE(x->regenerations.size() == first.regenerations.size());
    for (size_t i = 0; i < first.regenerations.size(); ++i) {
      CHECK(x->regenerations[i].node == first.regenerations[i].node);
      CHECK(x->regenerations[i].saved == first.regenerations[i].saved);
    }
    CHECK(x->predicted.peak_allocated == first.predicted.peak_allocated);
  }
  const Plan m = make_plan(sim, "mutwo", Budget::parse("80%"), o);
  REQUIRE(cache.mutwo_picks.has_value());
  CHECK(cache.mutwo_picks->size() == mutwo_picks(p).size());
  CHECK(m.decisions ==
        make_plan(sim, "mutwo", Budget::parse("80%"), options(Chain::automatic)).decisions);
  const Simulator other(p);
  CHECK(error_of([&] {
          make_plan(other, "dp", Budget::parse("80%"), o);
        }).find("PlanOptions::cache was made for another simulator") != std::string::npos);
}

// The pipeline refuses a profile of another batch, and a step that throws under a plan leaves
// nothing registered on the tape once the pipeline is gone: the next plain step trains as
// without remat, its peak the profiled one.
TEST_CASE(
    "pipeline: a profile of another batch is refused, and an exception in a step leaves no hooks") {
  const ModelConfig cfg = remat_resnet();
  const Profile profile = profile_of(cfg, 8, 1);
  {
    fresh_allocator(Device::cpu());
    Run r = make_run(cfg, 4, Device::cpu());
    RematPipeline pipe(*r.trainer);
    const std::string e = error_of([&] { pipe.use_profile(profile); });
    CHECK(e.find("is for batch 8, not 4") != std::string::npos);
    CHECK_FALSE(pipe.has_profile());
  }
  const Simulator sim(profile);
  PlanOptions po;
  po.budget_of = BudgetOf::allocated;
  // Halfway between the lowest peak dp reaches and the no-remat peak: a budget it meets.
  const Plan probe = make_plan(sim, "dp", Budget::parse("1"), po);
  Budget mid;
  mid.kind = Budget::Kind::bytes;
  mid.value =
      static_cast<double>(probe.lowest_peak + (probe.no_remat_peak - probe.lowest_peak) / 2);
  const Plan plan = make_plan(sim, "dp", mid, po);
  REQUIRE(plan.feasible);
  REQUIRE(plan.recomputed() > 0);
  {
    fresh_allocator(Device::cpu());
    Run r = make_run(cfg, 8, Device::cpu());
    RematPipeline pipe(*r.trainer);
    pipe.use_profile(profile);
    pipe.use_plan(plan);
    pipe.set_limit(plan.predicted.peak_allocated / 2);  // far below what the plan needs
    const std::string e = error_of([&] { pipe.step(); });
    CHECK(e.find("the plan (dp, budget ") != std::string::npos);
    CHECK(e.find("out of memory") != std::string::npos);
  }
  fresh_allocator(Device::cpu());
  Run r = make_run(cfg, 8, Device::cpu());
  const StepResult s = r.trainer->step();
  CHECK(s.memory.allocated.peak == profile.peak_allocated);
  CHECK(Tape::current().num_hooks() == 0);
}

// A constant made in forward (zeros) no longer hides what reads it from the planners: a small one
// (8x8 images: 8 KiB per tensor at batch 4) is held by the tape, so everything after it stays
// recomputable and plans run exact and bitwise; a large one (64x64: 512 KiB) is not held, and the
// plan's note names it and says what to do.
TEST_CASE("pipeline: a constant made in forward: small ones held for replays, large ones named") {
  register_once();
  ModelConfig cfg = model_preset("constant-test");
  cfg.image_size = 8;
  const Profile small = profile_of(cfg, 4, 1);
  int64_t candidates = 0;
  for (const ProfileSaved& sv : small.saved) candidates += sv.candidate;
  CHECK(candidates >= 4);  // every relu and convolution output after the constant
  CHECK(recompute_blockers(small).empty());
  check_model(cfg, 4, {"mutwo", "dp"});

  cfg.image_size = 64;
  const Profile large = profile_of(cfg, 4, 1);
  int64_t large_candidates = 0;
  for (const ProfileSaved& sv : large.saved) large_candidates += sv.candidate;
  CHECK(large_candidates < candidates);
  const std::string why = recompute_blockers(large);
  CAPTURE(why);
  CHECK(why.find("cannot be recomputed: they depend on a [4, 8, 64, 64] leaf read by") !=
        std::string::npos);
  CHECK(why.find("make it once outside forward") != std::string::npos);
  const Plan plan = make_plan(Simulator(large), "dp", Budget::parse("90%"));
  CHECK(plan.note.find(why) != std::string::npos);
}
