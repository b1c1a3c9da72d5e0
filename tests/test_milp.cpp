// The MILP planner (remat/plan/milp.h): on a hand-made chain it finds the optimum that exhaustive
// search over every plan it can express finds; on transformer-tiny and a ResNet whose activations
// dominate, its plans meet the budget, execute bitwise identically to training without remat with
// the peaks the simulator predicted, are no slower than mutwo's, and cost no less as the budget
// falls. Without CBC, plan_milp says how to get it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>

#include "regen/remat/plan/milp.h"
#include "regen/remat/profile/transfer.h"
#include "tests/remat_suite.h"
#include "tests/test_util.h"

using namespace regen;
using namespace regen::testing;

namespace {

// A chain x0 -> n0 -> v1 -> n1 -> v2 -> ... -> n(K-1) -> vK. Node i (i >= 1) saves its input v_i
// for backward, which runs n(K-1) .. n0; so v1 .. v(K-2) are candidates, v_i read at backward rank
// K-1-i. Forward node i optionally uses a workspace, then allocates v(i+1); backward node i
// allocates the gradient of v_i (none for the leaf x0), frees the gradient of v(i+1), and frees
// v_i. All sizes stay in the small pool (< 1 MiB, multiples of 512), where the allocator's
// blocks are exactly the requested sizes, so the MILP's memory model is exact.
Profile chain_profile(const std::vector<int64_t>& size, const std::vector<int64_t>& workspace,
                      const std::vector<double>& fwd_ms) {
  const int K = static_cast<int>(fwd_ms.size());
  REQUIRE(static_cast<int>(size.size()) == K + 1);
  REQUIRE(static_cast<int>(workspace.size()) == K);
  Profile p;
  p.model = "chain";
  p.batch = 1;
  p.iterations = 1;
  p.iteration_ms = 100;
  for (int i = 0; i <= K; ++i) {
    ProfileValue v;
    v.id = i;
    v.root = i;
    v.leaf = i == 0;
    v.producer = i == 0 ? -1 : i - 1;
    v.shape = {size[static_cast<size_t>(i)] / 4};
    v.bytes = static_cast<uint64_t>(size[static_cast<size_t>(i)]);
    v.alloc_id = i == 0 ? 0 : static_cast<uint64_t>(i);
    p.values.push_back(v);
  }
  for (int i = 0; i < K; ++i) {
    ProfileNode n;
    n.index = i;
    n.op = "op";
    n.name = "chain/op#" + std::to_string(i);
    n.inputs = {i};
    n.outputs = {i + 1};
    n.num_visible_outputs = 1;
    n.fwd_ms = fwd_ms[static_cast<size_t>(i)];
    n.bwd_ms = 1;
    if (i >= 1) n.saved = {i};
    p.nodes.push_back(n);
  }
  for (int i = 1; i < K; ++i) {
    ProfileSaved s;
    s.value = i;
    s.bytes = static_cast<uint64_t>(size[static_cast<size_t>(i)]);
    s.category = Category::activation;
    p.saved.push_back(s);
  }
  for (int i = K - 1; i >= 0; --i) p.backward_order.push_back(i);
  auto event = [&](MemoryEventKind kind, uint64_t id, int64_t bytes, Category c) {
    ProfileEvent e;
    e.kind = kind;
    e.block_id = id;
    e.bytes = bytes;
    e.requested = kind == MemoryEventKind::alloc ? bytes : 0;
    e.category = c;
    e.tag = "chain";
    p.events.push_back(e);
  };
  auto marker = [&](MarkerKind k, int node) {
    p.markers.push_back({k, node, static_cast<uint64_t>(p.events.size()), 0.0});
  };
  marker(MarkerKind::iteration_begin, -1);
  for (int i = 0; i < K; ++i) {
    marker(MarkerKind::fwd_begin, i);
    if (workspace[static_cast<size_t>(i)] > 0) {
      event(MemoryEventKind::alloc, 1000 + static_cast<uint64_t>(i),
            workspace[static_cast<size_t>(i)], Category::workspace);
      event(MemoryEventKind::free, 1000 + static_cast<uint64_t>(i),
            workspace[static_cast<size_t>(i)], Category::workspace);
    }
    event(MemoryEventKind::alloc, static_cast<uint64_t>(i + 1), size[static_cast<size_t>(i) + 1],
          Category::activation);
    marker(MarkerKind::fwd_end, i);
  }
  marker(MarkerKind::backward_start, -1);
  for (int i = K - 1; i >= 0; --i) {
    marker(MarkerKind::bwd_begin, i);
    if (i >= 1)
      event(MemoryEventKind::alloc, 100 + static_cast<uint64_t>(i), size[static_cast<size_t>(i)],
            Category::gradient);
    if (i < K - 1)
      event(MemoryEventKind::free, 100 + static_cast<uint64_t>(i + 1),
            size[static_cast<size_t>(i) + 1], Category::gradient);
    if (i >= 1)
      event(MemoryEventKind::free, static_cast<uint64_t>(i), size[static_cast<size_t>(i)],
            Category::activation);
    marker(MarkerKind::bwd_end, i);
  }
  marker(MarkerKind::backward_finish, -1);
  event(MemoryEventKind::free, static_cast<uint64_t>(K), size[static_cast<size_t>(K)],
        Category::activation);
  marker(MarkerKind::iteration_end, -1);
  finalize_profile(p);
  return p;
}

// Every plan the MILP can express: each subset of candidates evicted, each evicted one restored
// before one backward rank at or before its first use.
std::vector<Plan> all_plans(const Profile& p) {
  std::vector<int32_t> cands;
  for (const ProfileSaved& s : p.saved) {
    if (s.candidate) cands.push_back(s.index);
  }
  std::vector<Plan> out;
  std::vector<int32_t> rank(cands.size(), -1);  // -1: retained
  std::function<void(size_t)> rec = [&](size_t k) {
    if (k == cands.size()) {
      Plan plan;
      plan.keep_chain = false;
      plan.decisions.assign(p.saved.size(), Decision::retain);
      std::vector<Regeneration> by_rank(p.backward_order.size());
      for (size_t i = 0; i < cands.size(); ++i) {
        if (rank[i] < 0) continue;
        plan.decisions[static_cast<size_t>(cands[i])] = Decision::recompute;
        by_rank[static_cast<size_t>(rank[i])].node = p.backward_order[static_cast<size_t>(rank[i])];
        by_rank[static_cast<size_t>(rank[i])].saved.push_back(cands[i]);
      }
      for (Regeneration& g : by_rank) {
        if (!g.saved.empty()) plan.regenerations.push_back(g);
      }
      out.push_back(plan);
      return;
    }
    for (int32_t r = -1; r <= p.saved[static_cast<size_t>(cands[k])].first_bw_rank; ++r) {
      rank[k] = r;
      rec(k + 1);
    }
  };
  rec(0);
  return out;
}

// These tests bound allocated bytes, the MILP's own rows (reserved budgets are tested with the
// other planners in tests/remat_suite.h).
MilpOptions quick(double seconds) {
  MilpOptions o;
  o.time_limit_s = seconds;
  o.budget_of = BudgetOf::allocated;
  return o;
}

PlanOptions allocated(Chain chain = Chain::automatic) {
  PlanOptions o;
  o.chain = chain;
  o.budget_of = BudgetOf::allocated;
  return o;
}

// Every plan the MILP can express on profile p, simulated: their peaks at or under the no-remat
// peak, and the fastest plan's time at each of those budgets.
struct Exhaustive {
  std::vector<int64_t> budgets;  // descending
  std::vector<double> best_ms;   // per budget: the lowest step time of the plans that fit
  size_t plans = 0;
};

Exhaustive exhaustive(const Simulator& sim) {
  const Profile& p = sim.profile();
  const std::vector<Plan> plans = all_plans(p);
  std::vector<SimResult> res;
  const int64_t none = sim.run(plan_schedule(p, plans.front())).peak_allocated;
  std::set<int64_t> peaks;
  for (const Plan& plan : plans) {
    res.push_back(sim.run(plan_schedule(p, plan)));
    if (res.back().peak_allocated <= none) peaks.insert(res.back().peak_allocated);
  }
  Exhaustive ex;
  ex.plans = plans.size();
  for (auto it = peaks.rbegin(); it != peaks.rend(); ++it) {
    double best = 1e300;
    for (const SimResult& r : res) {
      if (r.peak_allocated <= *it) best = std::min(best, r.time_ms);
    }
    ex.budgets.push_back(*it);
    ex.best_ms.push_back(best);
  }
  return ex;
}

}  // namespace

TEST_CASE("milp: a budget <= 0 is an error, and without CBC plan_milp says how to get it") {
  const Profile p = chain_profile({4096, 8192, 8192, 8192, 8192}, {0, 0, 0, 0}, {1, 1, 1, 1});
  const Simulator sim(p);
  CHECK(error_of([&] { plan_milp(sim, 0); }).find("positive") != std::string::npos);
  CHECK(error_of([&] { plan_milp(sim, -5); }).find("positive") != std::string::npos);
  if (!milp_available()) {
    CHECK(error_of([&] { plan_milp(sim, 1 << 20); }).find("coinor-libcbc-dev") !=
          std::string::npos);
  }
}

// The optimum by exhaustive search: every plan the MILP can express is simulated; at every budget
// that some plan meets exactly (every distinct peak), the MILP must find a plan that fits with the
// lowest step time any fitting plan has. All blocks are in the small pool, where the model is
// exact.
TEST_CASE("milp: on a hand-made chain, the optimum of exhaustive search at every budget") {
  if (!milp_available()) return;
  // v1..v5 are candidates (v6 is read by the last node). n0 and n2 are expensive to replay, n1
  // and n4 have workspaces, so whether, and where, to restore early both matter.
  const Profile p = chain_profile({4096, 131072, 65536, 196608, 32768, 98304, 16384, 512},
                                  {0, 65536, 0, 0, 49152, 0, 0}, {5, 1, 4, 0.5, 2, 1, 3});
  const Simulator sim(p);
  int ncand = 0;
  for (const ProfileSaved& s : p.saved) ncand += s.candidate;
  REQUIRE(ncand == 5);
  const Exhaustive ex = exhaustive(sim);
  MESSAGE(ex.plans << " plans, " << ex.budgets.size() << " distinct peaks under the no-remat peak");
  REQUIRE(ex.budgets.size() >= 10);
  double last_ms = 0;
  bool early = false;  // some optimum restores a tensor before its first backward use
  for (size_t i = 0; i < ex.budgets.size(); ++i) {
    const int64_t budget = ex.budgets[i];
    MilpReport rep;
    const Plan plan = plan_milp(sim, budget, quick(20), &rep);
    CAPTURE(budget);
    CAPTURE(rep.status);
    CHECK(plan.feasible);
    CHECK(plan.predicted.peak_allocated <= budget);
    CHECK(rep.status == "optimal");
    CHECK(rep.rounds <= 1);  // the model is exact on this chain
    CHECK(plan.predicted.time_ms == doctest::Approx(ex.best_ms[i]).epsilon(1e-9));
    CHECK(rep.objective_ms == doctest::Approx(plan.predicted.recompute_ms).epsilon(1e-9));
    CHECK(plan.predicted.time_ms >= last_ms - 1e-9);  // a lower budget never costs less
    last_ms = plan.predicted.time_ms;
    for (const Regeneration& g : plan.regenerations) {
      for (int32_t s : g.saved)
        early = early || p.nodes[static_cast<size_t>(g.node)].bwd_rank <
                             p.saved[static_cast<size_t>(s)].first_bw_rank;
    }
  }
  CHECK(early);
  // Below the lowest peak any plan reaches: reported infeasible.
  MilpReport rep;
  const Plan low = plan_milp(sim, ex.budgets.back() - 512, quick(20), &rep);
  CHECK_FALSE(low.feasible);
  CHECK(low.note.find("cannot be met") != std::string::npos);
}

// The same chain with blocks over 1 MiB. The allocator does not split a cached large block when
// 1 MiB or less would remain, so where a tensor lands, and the bytes it holds, depend on the plan:
// the profiled block sizes the model uses are not exact. When the simulated peak of the MILP's plan
// is over the budget, it solves again with the budget lowered by the model's error; the plans it
// returns then fit, within a few percent of the exhaustive optimum.
TEST_CASE("milp: on a chain of large blocks, re-solving brings the plan under the budget") {
  if (!milp_available()) return;
  const int64_t M = 1 << 20;
  const Profile p = chain_profile(
      {4096, 3 * M / 2, 5 * M / 2 + 4096, 2 * M, 3 * M / 2 + 1536, 5 * M / 2, M + 512, 512},
      {0, 3 * M, 0, 0, 2 * M, 0, 0}, {5, 1, 4, 0.5, 2, 1, 3});
  const Simulator sim(p);
  const Exhaustive ex = exhaustive(sim);
  int resolved = 0, over = 0, off = 0;
  for (size_t i = 0; i < ex.budgets.size(); ++i) {
    const int64_t budget = ex.budgets[i];
    MilpReport rep;
    const Plan plan = plan_milp(sim, budget, quick(20), &rep);
    CAPTURE(budget);
    CAPTURE(plan.note);
    CHECK(plan.feasible == (plan.predicted.peak_allocated <= budget));
    if (!plan.feasible) {
      ++over;
      continue;
    }
    if (rep.rounds >= 2) ++resolved;
    CHECK(plan.predicted.time_ms >= ex.best_ms[i] - 1e-9);  // it is one of the plans enumerated
    CHECK(plan.predicted.time_ms <= ex.best_ms[i] * 1.1);
    off += plan.predicted.time_ms > ex.best_ms[i] + 1e-9;
  }
  MESSAGE(ex.budgets.size() << " budgets: " << resolved << " met after re-solving, " << over
                            << " not met, " << off << " met above the optimum");
  CHECK(resolved >= 5);
  CHECK(over * 20 <= static_cast<int>(ex.budgets.size()));  // at most 5% are missed
}

namespace {

struct BudgetPoint {
  double fraction;  // of the way from the lower bound to the no-remat peak
  double time_limit_s;
};

// The remat requirements for MILP plans on one model: at budgets spread between the lower bound
// and the no-remat peak, each plan that says it fits has a simulated peak within the budget;
// executing it for 3 steps trains bitwise identically to training without remat with the
// measured peaks equal to the predicted ones every step; it is no slower than mutwo's plan at the
// same budget when both fit and the MILP is proven optimal; the optimal cost does not fall with
// the budget.
void check_milp(const ModelConfig& cfg, int64_t batch, const std::vector<BudgetPoint>& budgets) {
  const Profile profile = profile_of(cfg, batch, 2);
  const Simulator sim(profile);
  Trace ref;
  {
    fresh_allocator(Device::cpu());
    Run ref_run = make_run(cfg, batch, Device::cpu());
    ref = train(ref_run, 3, nullptr);
  }
  const int64_t lower = memory_lower_bound(profile);
  const int64_t none = profile.peak_allocated;
  REQUIRE(lower < none);
  struct Point {
    int64_t budget;
    MilpReport rep;
    Plan plan;
  };
  std::vector<Point> points;
  int executed = 0, compared = 0;
  for (const BudgetPoint& bp : budgets) {
    const int64_t budget =
        lower + static_cast<int64_t>(bp.fraction * static_cast<double>(none - lower));
    MilpReport rep;
    const Plan plan = plan_milp(sim, budget, quick(bp.time_limit_s), &rep);
    const Plan mutwo = make_plan(sim, "mutwo", Budget::parse(std::to_string(budget)), allocated());
    CAPTURE(cfg.name);
    CAPTURE(budget);
    CAPTURE(rep.status);
    CAPTURE(plan.note);
    MESSAGE(
        cfg.name << " batch " << batch << ", budget " << format_bytes(budget) << " (" << bp.fraction
                 << " of the way from the lower bound " << format_bytes(lower)
                 << " to the no-remat peak " << format_bytes(none) << "): milp " << rep.status
                 << ", " << rep.rounds << " round(s), " << rep.solve_s << " s, " << rep.variables
                 << " vars (" << rep.binaries << " binary), " << rep.constraints << " rows; peak "
                 << format_bytes(plan.predicted.peak_allocated) << ", recompute "
                 << plan.predicted.recompute_ms << " ms (model " << rep.objective_ms << ", bound "
                 << rep.bound_ms << ") | mutwo " << (mutwo.feasible ? "fits" : "over") << ", peak "
                 << format_bytes(mutwo.predicted.peak_allocated) << ", recompute "
                 << mutwo.predicted.recompute_ms << " ms");
    CHECK(plan.policy == "milp");
    CHECK_FALSE(plan.keep_chain);
    CHECK(plan.no_remat_peak == none);
    CHECK(plan.lower_bound == lower);
    CHECK(plan.feasible == (plan.predicted.peak_allocated <= budget));
    const bool optimal = rep.status == "optimal";
    const bool solved = rep.status.find("no solution") == std::string::npos;
    if (plan.feasible) {
      // The executor's replays are the ones the model paid for, or fewer.
      CHECK(plan.predicted.recompute_ms <= rep.objective_ms + 1e-6);
      if (optimal)
        CHECK(plan.predicted.recompute_ms == doctest::Approx(rep.objective_ms).epsilon(1e-6));
    }
    if (plan.feasible && mutwo.feasible && optimal) {
      ++compared;
      CHECK(plan.predicted.time_ms <= mutwo.predicted.time_ms * (1 + 1e-4) + 1e-6);
    }
    if (mutwo.feasible && solved) CHECK(plan.feasible);
    points.push_back({budget, rep, plan});

    // Execute it.
    fresh_allocator(Device::cpu());
    Run run = make_run(cfg, batch, Device::cpu());
    RematExecutor exec(profile, plan_schedule(profile, plan));
    const Trace got = train(run, 3, &exec);
    check_same_training(got, ref);
    for (const MemoryStats& m : got.memory) {
      CHECK(m.allocated.peak == plan.predicted.peak_allocated);
      CHECK(m.reserved.peak == plan.predicted.peak_reserved);
      if (plan.feasible) CHECK(m.allocated.peak <= budget);
    }
    CHECK(exec.replays() == plan.predicted.replays);
    if (plan.recomputed() > 0) ++executed;
  }
  // A lower budget never costs less: compare optimal solves whose models used nested budgets.
  for (const Point& lo : points) {
    for (const Point& hi : points) {
      if (lo.budget >= hi.budget || lo.rep.status != "optimal" || hi.rep.status != "optimal")
        continue;
      if (lo.rep.internal_budget > hi.rep.internal_budget || !lo.plan.feasible || !hi.plan.feasible)
        continue;
      CHECK(lo.rep.objective_ms >= hi.rep.objective_ms * (1 - 2e-4) - 1e-6);
    }
  }
  CHECK(executed >= 2);  // plans that recompute were executed
  CHECK(compared >= 1);
}

// resnet-tiny's bottleneck blocks on 64x64 images at batch 16: activations dominate (at batch 4
// the no-remat peak is the lower bound: parameters, their gradients and momentum, the stem).
ModelConfig resnet64() {
  ModelConfig cfg = model_preset("resnet-tiny");
  cfg.image_size = 64;
  return cfg;
}

}  // namespace

// Another planner's plan as the MIP start: it maps onto the model exactly (the drop-chain plan as
// it is, the keep-chain plan with its kept tensors restored where its programs restore them), the
// solver accepts it, so even a solve stopped almost at once returns a plan no slower than it.
TEST_CASE("milp: mutwo's plans as MIP starts (keep and drop chains)") {
  if (!milp_available()) return;
  const Profile profile = profile_of(model_preset("transformer-tiny"), 4, 1);
  const Simulator sim(profile);
  const int64_t lower = memory_lower_bound(profile), none = profile.peak_allocated;
  int checked = 0;
  for (double f : {0.3, 0.6}) {
    const int64_t budget = lower + static_cast<int64_t>(f * static_cast<double>(none - lower));
    for (Chain chain : {Chain::keep, Chain::drop}) {
      const Plan mutwo =
          make_plan(sim, "mutwo", Budget::parse(std::to_string(budget)), allocated(chain));
      if (!mutwo.feasible) continue;
      MilpOptions opt = quick(0.5);
      opt.start = &mutwo;
      MilpReport rep;
      const Plan plan = plan_milp(sim, budget, opt, &rep);
      CAPTURE(budget);
      CAPTURE(plan.note);
      CHECK(plan.note.find("does not map") == std::string::npos);
      CHECK(plan.feasible);
      CHECK(plan.predicted.time_ms <= mutwo.predicted.time_ms + 1e-9);
      ++checked;
    }
  }
  CHECK(checked >= 2);
}

// A solve stopped in its first milliseconds (CBC's time limit landing in its preprocessing, which
// once crashed inside CBC and reported a feasible model infeasible) still returns the start's plan
// or a better one, at every limit from 10 ms to 200 ms.
TEST_CASE("milp: a time limit of milliseconds returns a plan no slower than the MIP start") {
  if (!milp_available()) return;
  const Profile profile = profile_of(model_preset("transformer-tiny"), 4, 1);
  const Simulator sim(profile);
  const int64_t lower = memory_lower_bound(profile), none = profile.peak_allocated;
  const int64_t budget = lower + (none - lower) * 3 / 10;
  const Plan mutwo =
      make_plan(sim, "mutwo", Budget::parse(std::to_string(budget)), allocated(Chain::drop));
  REQUIRE(mutwo.feasible);
  for (double seconds : {0.01, 0.02, 0.03, 0.05, 0.07, 0.1, 0.2}) {
    MilpOptions opt = quick(seconds);
    opt.start = &mutwo;
    MilpReport rep;
    const Plan plan = plan_milp(sim, budget, opt, &rep);
    CAPTURE(seconds);
    CAPTURE(plan.note);
    CHECK(rep.status != "infeasible");
    CHECK(plan.feasible);
    CHECK(plan.predicted.time_ms <= mutwo.predicted.time_ms + 1e-9);
  }
}

// milp at a budget no plan meets says so (not feasible, the note names the budget and the lowest
// budget dp meets, which milp meets too), and its plan is the lowest it has, dp's answer there,
// not the no-remat plan it used to return when the MILP proved the budget out of reach. Its
// answer is never worse than dp's, and `lowest` gives a budget it meets, at most dp's lowest.
TEST_CASE("milp with offload: dp's family offloaded, the rest decided, never worse than dp") {
  if (!milp_available()) return;
  const Profile p = profile_of(remat_resnet(), 8, 1);
  const Simulator sim(p);
  PlanCache cache(sim);
  PlanOptions o;
  o.budget_of = BudgetOf::allocated;
  o.offload = OffloadMode::all;
  o.transfer = transfer_for("step:0.4", p);
  o.milp_time_limit_s = 10;
  o.cache = &cache;
  const Plan low = lowest_plan(sim, "dp", o);
  REQUIRE(low.uses_host());
  int decided_by_milp = 0;
  for (int k = 1; k <= 3; ++k) {
    // Budgets between dp's lowest and the no-remat peak, where dp offloads.
    const int64_t b = low.budget_bytes + (low.no_remat_peak - low.budget_bytes) * k / 8;
    const Plan d = make_plan(sim, "dp", Budget::parse(std::to_string(b)), o);
    const Plan m = make_plan(sim, "milp", Budget::parse(std::to_string(b)), o);
    CAPTURE(b);
    CAPTURE(m.note);
    REQUIRE(d.feasible);
    CHECK(m.feasible);
    CHECK(m.predicted.peak_allocated <= b);
    CHECK(m.predicted.time_ms <= d.predicted.time_ms + 1e-9);
    CHECK(m.no_remat_peak == d.no_remat_peak);
    if (m.policy != "milp" || !d.uses_host()) continue;
    ++decided_by_milp;
    // The MILP's own plan: dp's offloads and optimizer state, its own recomputation, and the
    // copies' points for its regenerations; the simulation of it is what it predicts.
    CHECK(m.optimizer_state == d.optimizer_state);
    for (size_t s = 0; s < p.saved.size(); ++s) {
      CHECK((m.decisions[s] == Fate::offload) == (d.decisions[s] == Fate::offload));
    }
    const std::vector<Offload> pts =
        offload_points(p, m.decisions, false, m.regenerations, m.transfer);
    REQUIRE(m.offloads.size() == pts.size());
    for (size_t i = 0; i < pts.size(); ++i) {
      CHECK(m.offloads[i].saved == pts[i].saved);
      CHECK(m.offloads[i].free_after == pts[i].free_after);
      CHECK(m.offloads[i].prefetch_before == pts[i].prefetch_before);
    }
    CHECK(sim.run(plan_schedule(p, m)).peak_allocated == m.predicted.peak_allocated);
  }
  MESSAGE(decided_by_milp, " of 3 budgets answered by the MILP's own plan (the others: dp's kept)");
  // A family naming a tensor that cannot be offloaded is refused, by index.
  OffloadFamily bad;
  for (const ProfileSaved& s : p.saved) {
    if (!s.offloadable) {
      bad.saved.push_back(s.index);
      break;
    }
  }
  if (!bad.saved.empty()) {
    MilpOptions mo;
    mo.offload = &bad;
    mo.transfer = o.transfer;
    CHECK(error_of([&] { plan_milp(sim, low.no_remat_peak, mo); }).find("not an offloadable one") !=
          std::string::npos);
  }
}

TEST_CASE("milp: an infeasible budget is reported, with the lowest plan, never worse than dp") {
  if (!milp_available()) return;
  const Profile profile = profile_of(model_preset("transformer-tiny"), 4, 1);
  const Simulator sim(profile);
  PlanCache cache(sim);
  for (const BudgetOf of : {BudgetOf::allocated, BudgetOf::reserved}) {
    PlanOptions o;
    o.budget_of = of;
    o.milp_time_limit_s = 2;
    o.cache = &cache;
    CAPTURE(std::string(budget_of_name(of)));
    const Plan dp = make_plan(sim, "dp", Budget::parse("1"), o);
    const Plan milp = make_plan(sim, "milp", Budget::parse("1"), o);
    CAPTURE(milp.note);
    CHECK_FALSE(milp.feasible);
    CHECK(milp.policy == "milp");
    CHECK(milp.note.find("cannot be met by milp") != std::string::npos);
    CHECK(milp.note.find("at most " + format_bytes(dp.lowest_peak) + " (dp's lowest)") !=
          std::string::npos);
    CHECK(milp.lowest_peak == dp.lowest_peak);
    CHECK(peak_of(milp.predicted, of) <= peak_of(dp.predicted, of));
    if (of == BudgetOf::allocated) {
      CHECK(milp.recomputed() > 0);
      CHECK(milp.predicted.peak_allocated < milp.no_remat_peak);
    }
    const Plan low = make_plan(sim, "milp", Budget::parse("lowest"), o);
    CHECK(low.feasible);
    CHECK(low.budget_text == "lowest");
    CHECK(low.budget_bytes <= dp.lowest_peak);
    CHECK(peak_of(low.predicted, of) <= low.budget_bytes);
    // Budgets dp meets, milp meets no slower.
    for (const char* b : {"95%", "80%"}) {
      const Plan d = make_plan(sim, "dp", Budget::parse(b), o);
      const Plan m = make_plan(sim, "milp", Budget::parse(b), o);
      CAPTURE(b);
      if (d.feasible) {
        CHECK(m.feasible);
        CHECK(m.predicted.time_ms <= d.predicted.time_ms + 1e-9);
      }
    }
  }
}

TEST_CASE(
    "milp: transformer-tiny (batch 4): budgets met, bitwise training, exact peaks, no slower than "
    "mutwo") {
  if (!milp_available()) return;
  check_milp(model_preset("transformer-tiny"), 4, {{0.15, 8}, {0.35, 15}, {0.6, 15}, {0.85, 15}});
}

TEST_CASE(
    "milp: resnet-tiny blocks at 64x64 (batch 16): budgets met, bitwise training, exact peaks, no "
    "slower than mutwo") {
  if (!milp_available()) return;
  check_milp(resnet64(), 16, {{0.1, 8}, {0.5, 15}, {0.7, 15}, {0.9, 15}});
}

// The dp planner against the ground truth: on the three small graphs, at five budgets from 10% to
// 90% of the way from the lower bound to the no-remat peak, dp's predicted step is within 3% of
// the MILP's wherever the MILP proved its plan optimal (within a 20 s limit per solve; where it
// did not, both are reported). The MILP starts from dp's plan, so it is never slower.
TEST_CASE(
    "milp: dp is within 3% of the MILP's optimum on transformer-tiny, resnet-tiny 64x64 and a "
    "reduced ResNet-18") {
  if (!milp_available()) {
    MESSAGE("built without CBC: nothing to compare against");
    return;
  }
  ModelConfig rt = model_preset("resnet-tiny");
  rt.image_size = 64;
  ModelConfig r18 = model_preset("resnet18");
  r18.base_width = 8;
  r18.num_classes = 10;
  r18.image_size = 64;
  struct Case {
    ModelConfig cfg;
    int64_t batch;
  };
  int proven = 0, compared = 0;
  for (const Case& c : {Case{model_preset("transformer-tiny"), 4}, Case{rt, 16}, Case{r18, 32}}) {
    // Five profiled iterations, each op's time their median: dp is a heuristic over measured
    // times, and on some timings it is more than 3% from the optimum (transformer-tiny at 10%,
    // with every op's time scaled by noise of 50%: 4.8% in one draw of eight; a profile of two
    // iterations taken beside a run of the CUDA emulation, hundreds of threads: 49%). With two, one
    // burst of load on the machine moved an op's time by half of it.
    const Profile p = profile_of(c.cfg, c.batch, 5);
    const Simulator sim(p);
    PlanCache cache(sim);  // dp's programme, for dp and for the MILP's start, built once
    const int64_t lo = memory_lower_bound(p),
                  hi = make_plan(sim, "none", Budget(), allocated()).no_remat_peak;
    REQUIRE(lo < hi);
    for (double f : {0.1, 0.3, 0.5, 0.7, 0.9}) {
      Budget b;
      b.kind = Budget::Kind::bytes;
      b.value = static_cast<double>(lo + static_cast<int64_t>(f * static_cast<double>(hi - lo)));
      PlanOptions po = allocated();
      po.cache = &cache;
      const Plan dp = make_plan(sim, "dp", b, po);
      po.milp_time_limit_s = 20;
      const Plan milp = make_plan(sim, "milp", b, po);
      CAPTURE(c.cfg.name);
      CAPTURE(f);
      ++compared;
      MESSAGE(c.cfg.name, " lo ", lo, " hi ", hi, " at ", f * 100, "%: dp ", dp.predicted.time_ms,
              " ms", std::string(dp.feasible ? "" : " (infeasible)"), ", milp ",
              milp.predicted.time_ms, " ms", std::string(milp.feasible ? "" : " (infeasible)"),
              " (", milp.note, ")");
      if (dp.feasible && milp.feasible)
        CHECK(milp.predicted.time_ms <= dp.predicted.time_ms * (1 + 1e-9));
      if (milp.feasible && milp.note.find("MILP optimal") != std::string::npos) {
        ++proven;
        CHECK(dp.feasible);
        CHECK(dp.predicted.time_ms <= 1.03 * milp.predicted.time_ms);
      }
    }
  }
  CHECK(compared == 15);
  // How many of the harder points CBC proves within the time limit depends on the machine's load
  // (9 to 12 of 15 on 2 busy cores, the sanitizer build included); the comparison above is only
  // made against proven optima, and the points that prove in seconds (transformer-tiny from 30%,
  // the ResNets at 70% and 90%) keep it from being vacuous.
  CHECK(proven >= 6);
}

// The time limit holds for the whole plan_milp call: each round's solver gets what is left of it
// (the first at least 10 ms), a later round with nothing left is not started, and a solver that
// runs past its share is stopped at twice it (2 s past it at least). The mechanism, not timings.
TEST_CASE("milp: rounds share one time limit, and an overrunning solve is stopped") {
  CHECK(milp_round_limit(1.0, 0.25, 1) == doctest::Approx(0.75));
  CHECK(milp_round_limit(0.1, 0.5, 1) == doctest::Approx(0.01));  // the first round always runs
  CHECK(milp_round_limit(1.0, 0.6, 2) == doctest::Approx(0.4));
  CHECK(milp_round_limit(1.0, 1.2, 2) < 0);  // no time left: the call stops
  CHECK(milp_round_limit(1.0, 0.995, 3) < 0);
  CHECK(milp_stop_after(0.1) == doctest::Approx(2.1));
  CHECK(milp_stop_after(60) == doctest::Approx(120));
  if (!milp_available()) return;
  const Profile profile = profile_of(model_preset("transformer-tiny"), 4, 1);
  const Simulator sim(profile);
  const int64_t lower = memory_lower_bound(profile), none = profile.peak_allocated;
  MilpOptions opt = quick(0.05);
  MilpReport rep;
  const Plan plan = plan_milp(sim, lower + (none - lower) / 4, opt, &rep);
  CAPTURE(plan.note);
  CHECK(rep.total_s >= rep.solve_s);
  CHECK(plan.note.find("s in all (limit 0.05 s)") != std::string::npos);
}
