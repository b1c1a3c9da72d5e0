// The dp planner (remat/plan/chain.h): the chain model of real profiles, the frontier's properties
// (as the budget falls the planned peak never rises and the predicted time never falls; a plan
// said feasible fits), plans that fit what the model predicts, and a network with long skips
// (a U-Net-like model defined here, outside the presets) whose skips are pinned and whose plans
// execute exactly and bitwise. Execution of every planner on the presets is in
// tests/remat_suite.h.
#include <doctest/doctest.h>

#include <algorithm>

#include "regen/models/layers.h"
#include "regen/remat/plan/chain.h"
#include "tests/remat_suite.h"

using namespace regen;
using namespace regen::testing;

namespace {

// Budgets evenly spaced and falling from the no-remat peak of their kind to the lower bound
// (allocated) or, for reserved bytes, to the lowest limit dp's plans run under (segments are
// whole: tiny models reserve a few 2 MiB segments whatever they allocate).
std::vector<Budget> falling_budgets(const Simulator& sim, int n, BudgetOf of = BudgetOf::allocated,
                                    PlanCache* cache = nullptr) {
  PlanOptions po;
  po.budget_of = of;
  po.cache = cache;
  const Plan probe = make_plan(sim, "none", Budget(), po);
  const int64_t lo = of == BudgetOf::allocated
                         ? memory_lower_bound(sim.profile())
                         : make_plan(sim, "dp", Budget::parse("1"), po).lowest_peak;
  const int64_t hi = probe.no_remat_peak;
  std::vector<Budget> out;
  for (int i = n - 1; i >= 0; --i) {
    Budget b;
    b.kind = Budget::Kind::bytes;
    b.value = static_cast<double>(lo + (hi - lo) * i / (n - 1));
    out.push_back(b);
  }
  return out;
}

void check_model_structure(const Profile& p, const ChainModel& m) {
  REQUIRE_FALSE(m.stages.empty());
  CHECK(m.stages.front().first_node == 0);
  CHECK(m.stages.back().last_node == p.num_forward_nodes() - 1);
  std::vector<int> owner(p.saved.size(), 0);
  for (size_t k = 0; k < m.stages.size(); ++k) {
    const ChainStage& st = m.stages[k];
    if (k > 0) {
      CHECK(st.first_node == m.stages[k - 1].last_node + 1);
      CHECK(st.in == m.stages[k - 1].out);  // what crosses a boundary is one stage's output
    }
    for (const std::vector<int32_t>* set : {&st.out, &st.interior}) {
      for (int32_t s : *set) {
        owner[static_cast<size_t>(s)]++;
        const int32_t prod = p.saved[static_cast<size_t>(s)].producer;
        CHECK(prod >= st.first_node);
        CHECK(prod <= st.last_node);
      }
    }
    REQUIRE_FALSE(st.options.empty());
    CHECK(st.options.back().keep == st.interior);  // the last option holds everything
    for (const StageBackward& b : st.options.back().back) CHECK(b.ms == 0);
    for (size_t o = 1; o < st.options.size(); ++o) {
      CHECK(st.options[o].keep_bytes >= st.options[o - 1].keep_bytes);
    }
    REQUIRE(st.holds.size() >= 2);
    // Class 1 holds the least: nothing, unless a stage has more large tensors than are enumerated.
    for (const ChainHold& h : st.holds) CHECK(h.keep_bytes >= st.holds[1].keep_bytes);
  }
  // Every tracked tensor belongs to exactly one stage; pinned ones are recomputable but untracked.
  for (size_t s = 0; s < p.saved.size(); ++s) {
    CHECK(owner[s] == (m.tracked[s] ? 1 : 0));
    if (m.tracked[s]) CHECK(p.saved[s].candidate);
  }
  for (int32_t s : m.pinned) {
    CHECK(p.saved[static_cast<size_t>(s)].candidate);
    CHECK_FALSE(m.tracked[static_cast<size_t>(s)]);
  }
}

// The programme's plans are valid schedules whose simulated peak the model predicts closely, and
// its own recompute time is what the simulation replays.
void check_programme(const Profile& p, const ChainModel& m) {
  const Simulator sim(p);
  // At 2048 levels, as dp plans: each stage's level is rounded to the nearest unit (the no-remat
  // peak / levels), so with fewer levels the 20 stages' rounding can pass the top level by a unit
  // and the largest budget then drops a tensor or two (resnet with packed saves did at 512).
  const std::vector<ChainPlan> plans = chain_plans(p, m, 2048);
  REQUIRE(plans.size() > 3);
  CHECK(plans.front().model_ms == 0);  // the largest budget recomputes nothing
  double worst = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const ChainPlan& c = plans[i];
    if (i > 0) CHECK(c.model_ms >= plans[i - 1].model_ms);  // less memory never costs less
    const SimResult r = sim.run(build_schedule(p, c.decisions, false, c.regenerations));
    worst = std::max(worst, std::abs(double(r.peak_allocated) - double(c.model_budget)) /
                                double(p.peak_allocated));
    CHECK(r.recompute_ms == doctest::Approx(c.model_ms).epsilon(0.05));
  }
  MESSAGE("model budget vs simulated peak: worst gap ", worst * 100, "% of the no-remat peak over ",
          plans.size(), " plans");
  CHECK(worst < 0.05);
}

void check_frontier(const Simulator& sim, int min_feasible, BudgetOf of);

// For budgets of both kinds (reserved: the allocator's limit at the budget).
void check_frontier(const Simulator& sim, int min_feasible) {
  for (BudgetOf of : {BudgetOf::reserved, BudgetOf::allocated}) {
    CAPTURE(std::string(budget_of_name(of)));
    check_frontier(sim, min_feasible, of);
  }
}

void check_frontier(const Simulator& sim, int min_feasible, BudgetOf of) {
  PlanCache cache(sim);  // dp's programme, built once for the 24 budgets
  const std::vector<Budget> budgets = falling_budgets(sim, 24, of, &cache);
  int64_t prev_peak = -1;
  double prev_ms = 0;
  int feasible = 0;
  for (const Budget& b : budgets) {
    PlanOptions po;
    po.budget_of = of;
    po.cache = &cache;
    const Plan plan = make_plan(sim, "dp", b, po);
    CAPTURE(b.str());
    const int64_t peak = peak_of(plan.predicted, plan.budget_of);
    if (plan.feasible) {
      ++feasible;
      CHECK(peak <= plan.budget_bytes);
      CHECK_FALSE(plan.predicted.oom);
    }
    if (prev_peak >= 0) {
      CHECK(peak <= prev_peak);
      CHECK(plan.predicted.time_ms >= prev_ms);
    }
    prev_peak = peak;
    prev_ms = plan.predicted.time_ms;
  }
  CHECK(feasible >= min_feasible);  // the lowest budgets may be out of reach
}

// A U-Net-like network defined outside the presets: a stem and four blocks at one resolution,
// the third and fourth adding a skip from far back (the stem's and the first block's outputs),
// then a pooled head. Long skips cross several block boundaries.
class SkipNet : public Model {
 public:
  SkipNet(const ModelConfig& c, Device device) : Model(c) {
    Generator gen(c.seed);
    stem_ = &register_module(
        "stem", std::make_unique<Conv2d>("stem", 3, kWidth, 3, 1, 1, false, gen, device));
    for (int i = 0; i < 4; ++i) {
      const std::string n = "block" + std::to_string(i);
      conv_.push_back(&register_module(
          n, std::make_unique<Conv2d>(n, kWidth, kWidth, 3, 1, 1, false, gen, device)));
      bn_.push_back(
          &register_module(n + "_bn", std::make_unique<BatchNorm2d>(n + "_bn", kWidth, device)));
    }
    fc_ = &register_module(
        "fc", std::make_unique<Linear>("fc", kWidth, c.num_classes, true, gen, device));
    assign_full_names();
  }
  Tensor forward(const Tensor& input) override {
    Tensor a0 = relu(stem_->forward(input));
    std::vector<Tensor> outs = {a0};
    for (int i = 0; i < 4; ++i) {
      BlockScope block("");
      Tensor h =
          bn_[static_cast<size_t>(i)]->forward(conv_[static_cast<size_t>(i)]->forward(outs.back()));
      if (i >= 2) h = add(h, outs[static_cast<size_t>(i - 2)]);  // the long skips
      outs.push_back(relu(h));
    }
    return fc_->forward(flatten(global_avg_pool(outs.back()), 1));
  }
  Tensor loss(const Tensor& logits, const Tensor& target) const override {
    return cross_entropy(logits, target);
  }
  void check_batch(const Batch&) const override {}

 private:
  static constexpr int64_t kWidth = 8;
  Conv2d* stem_;
  std::vector<Conv2d*> conv_;
  std::vector<BatchNorm2d*> bn_;
  Linear* fc_;
};

// A run of SkipNet, registered as "skipnet" (an image classifier) the first time.
Run skipnet_run(const ModelConfig& cfg, int64_t batch) {
  static const bool registered = [] {
    ModelConfig preset;
    preset.image_size = 32;
    preset.num_classes = 10;
    register_model({"skipnet", "a stem and four blocks with long skips (a test model)", preset,
                    [](const ModelConfig& c, Device d) { return std::make_unique<SkipNet>(c, d); },
                    image_classifier_input()});
    return true;
  }();
  (void)registered;
  return make_run(cfg, batch, Device::cpu());
}

}  // namespace

TEST_CASE(
    "dp: the chain model of transformer-tiny and a ResNet, the programme's plans, the frontier") {
  for (const ModelConfig& cfg : {model_preset("transformer-tiny"), remat_resnet()}) {
    CAPTURE(cfg.name);
    const bool resnet = cfg.name != "transformer-tiny";
    const Profile p = profile_of(cfg, resnet ? 8 : 4, 2);
    const ChainModel m = build_chain_model(p);
    check_model_structure(p, m);
    // Every block is one stage: the blocks plus the ops around them (a view joins the op before
    // it), merged where an unsaved value crosses (the Transformer's token and position
    // embeddings into their sum), and cut inside a block where one saved tensor crosses: an
    // encoder layer (post-norm) at its attention sum, its first norm's output, and its second
    // sum, so four stages; a bottleneck's identity path crosses all of it, so none.
    const size_t outside =
        static_cast<size_t>(std::count_if(p.nodes.begin(), p.nodes.end(), [](const ProfileNode& n) {
          return n.block < 0 && !n.is_view;
        }));
    CHECK(m.stages.size() ==
          p.blocks.size() + outside - static_cast<size_t>(m.merged) + static_cast<size_t>(m.cuts));
    CHECK(m.cuts == (resnet ? 0 : 3 * cfg.layers));
    for (size_t k = 1; k < m.stages.size(); ++k) {
      const ChainStage& st = m.stages[k];
      if (p.nodes[static_cast<size_t>(st.first_node)].block < 0 ||
          p.nodes[static_cast<size_t>(st.first_node)].block !=
              p.nodes[static_cast<size_t>(st.first_node - 1)].block) {
        continue;  // a block's own boundary
      }
      CAPTURE(k);
      CHECK(st.in.size() == 1);  // the one saved tensor crossing the cut is the stage's input
      CHECK(m.stages[k - 1].out == st.in);
    }
    CHECK(m.pinned.empty());
    check_programme(p, m);
    const Simulator sim(p);
    check_frontier(sim, 20);
  }
}

TEST_CASE(
    "dp: a network with long skips: skips pinned, plans exact and bitwise, frontier monotone") {
  ModelConfig cfg = model_preset("resnet-tiny");
  cfg.name = "skipnet";
  cfg.image_size = 32;
  cfg.num_classes = 10;
  const int64_t batch = 8;
  fresh_allocator(Device::cpu());
  Profile p;
  {
    Run base = skipnet_run(cfg, batch);
    ProfileOptions po;
    po.warmup = 1;
    po.iterations = 2;
    po.model_name = cfg.name;
    p = profile_training(*base.trainer, po);
  }
  const ChainModel m = build_chain_model(p);
  check_model_structure(p, m);
  CHECK(m.pinned.size() == 2);  // the stem's and the first block's outputs
  CHECK(m.note.find("long skips") != std::string::npos);
  const Simulator sim(p);
  check_frontier(sim, 8);  // the lower bound does not count the pinned skips

  Trace ref;
  {
    fresh_allocator(Device::cpu());
    Run r = skipnet_run(cfg, batch);
    ref = train(r, 3, nullptr);
  }
  int recomputing = 0;
  for (BudgetOf of : {BudgetOf::allocated, BudgetOf::reserved}) {
    PlanCache cache(sim);
    for (const Budget& b : falling_budgets(sim, 5, of, &cache)) {
      PlanOptions po;
      po.budget_of = of;
      po.cache = &cache;
      const Plan plan = make_plan(sim, "dp", b, po);
      CAPTURE(b.str());
      CAPTURE(std::string(budget_of_name(of)));
      if (plan.recomputed() > 0) ++recomputing;
      CHECK(plan.note.find("long skips") != std::string::npos);
      fresh_allocator(Device::cpu());
      Run run = skipnet_run(cfg, batch);
      RematExecutor exec(p, plan_schedule(p, plan));
      run.trainer->prepare();
      const LimitScope limit(allocator_for(Device::cpu()), plan.limit);
      const Trace got = train(run, 3, &exec);
      check_same_training(got, ref);
      for (const MemoryStats& s : got.memory) {
        CHECK(s.allocated.peak == plan.predicted.peak_allocated);
        CHECK(s.reserved.peak == plan.predicted.peak_reserved);
        if (plan.limit > 0) CHECK(s.reserved.peak <= plan.limit);
      }
    }
  }
  CHECK(recomputing >= 4);
}

// A budget of reserved bytes is a hard limit, exactly: for plans of dp's at three budgets, the
// lowest limit each runs under (found by bisection on the simulation) is one it runs under in
// training too, without running out, with the predicted peaks; one byte less and the simulation
// runs out of memory, so fit_schedule calls it infeasible.
TEST_CASE(
    "budgets: a plan runs under the lowest limit the simulation finds, and not one byte below it") {
  const ModelConfig cfg = remat_resnet();
  const int64_t batch = 8;
  const Profile p = profile_of(cfg, batch, 2);
  const Simulator sim(p);
  PlanOptions po;
  po.budget_of = BudgetOf::allocated;
  int checked = 0;
  for (const std::string b : {"95%", "90%", "80%"}) {
    const Plan plan = make_plan(sim, "dp", Budget::parse(b), po);
    CAPTURE(b);
    REQUIRE(plan.feasible);
    const Schedule s = plan_schedule(p, plan);
    const SimResult unlimited = sim.run(s);
    auto fits = [&](int64_t limit) {
      return fit_schedule(sim, s, limit, BudgetOf::reserved, &unlimited).fits;
    };
    int64_t lo = unlimited.peak_allocated - 1, hi = unlimited.peak_reserved;  // lo never fits
    REQUIRE(fits(hi));
    REQUIRE_FALSE(fits(lo));
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (fits(mid) ? hi : lo) = mid;
    }
    CHECK(fits(hi));
    CHECK_FALSE(fits(hi - 1));
    SimOptions so;
    so.limit = hi;
    const SimResult at_limit = sim.run(s, so);
    CHECK_FALSE(at_limit.oom);
    CHECK(at_limit.peak_reserved <= hi);
    MESSAGE(b, ": unlimited ", format_bytes(unlimited.peak_allocated), " allocated, ",
            format_bytes(unlimited.peak_reserved), " reserved; runs under a limit of ",
            format_bytes(hi), " (reserved ", format_bytes(at_limit.peak_reserved), ", ",
            at_limit.cache_flushes, " cache flushes)");
    // Training under that limit: no out-of-memory error, the predicted peaks, bitwise the same.
    fresh_allocator(Device::cpu());
    Run run = make_run(cfg, batch, Device::cpu());
    RematExecutor exec(p, s);
    run.trainer->prepare();
    const LimitScope limit(allocator_for(Device::cpu()), hi);
    const Trace got = train(run, 2, &exec);
    for (const MemoryStats& m : got.memory) {
      CHECK(m.allocated.peak == at_limit.peak_allocated);
      CHECK(m.reserved.peak == at_limit.peak_reserved);
      CHECK(m.reserved.peak <= hi);
    }
    ++checked;
  }
  CHECK(checked == 3);
}
