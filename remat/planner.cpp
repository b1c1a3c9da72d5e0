// The policies, the planner registry and make_plan (planner.h). Budgets are in budget.cpp, plan
// files in plan_io.cpp.
#include "regen/remat/planner.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <set>

#include "regen/core/io.h"
#include "regen/remat/chain.h"
#include "regen/remat/layout.h"
#include "regen/remat/milp.h"

namespace regen {

void ensure_planned_layout(const Simulator& sim, Plan& plan) {
  if (plan.layout) return;
  PlanFit f =
      fit_schedule(sim, plan_schedule(sim.profile(), plan), 0, plan.budget_of, nullptr, true);
  plan.predicted = std::move(f.result);
  plan.layout = std::move(f.layout);
}

Schedule plan_schedule(const Profile& p, const Plan& plan) {
  return build_schedule(p, plan.decisions, plan.keep_chain, plan.regenerations);
}

int64_t Plan::recomputed() const {
  return std::count(decisions.begin(), decisions.end(), Decision::recompute);
}

int64_t Plan::recomputed_bytes(const Profile& p) const {
  int64_t b = 0;
  for (size_t i = 0; i < decisions.size(); ++i) {
    if (decisions[i] == Decision::recompute) b += static_cast<int64_t>(p.saved[i].bytes);
  }
  return b;
}

std::vector<std::string> chain_names() {
  return {"auto", "keep", "drop"};
}

Chain parse_chain(const std::string& text) {
  if (text == "auto") return Chain::automatic;
  if (text == "keep") return Chain::keep;
  if (text == "drop") return Chain::drop;
  REGEN_FAIL("unknown chain mode '", text, "': known modes are auto, keep, drop");
}

PolicySpec parse_policy_spec(const std::string& text) {
  PolicySpec spec;
  spec.label = text;
  const size_t colon = text.find(':');
  spec.policy = text.substr(0, colon);
  const std::vector<std::string> names = policy_names();
  if (!std::count(names.begin(), names.end(), spec.policy)) {
    REGEN_FAIL("unknown policy '", spec.policy, "' in '", text, "': known policies are ",
               join_names(names));
  }
  if (colon != std::string::npos) spec.chain = parse_chain(text.substr(colon + 1));
  return spec;
}

// ---- Policies -----------------------------------------------------------------------------------

namespace {

using Decisions = std::vector<Decision>;

// Whether saved tensor s lives entirely inside the node set `inside` (its producer and every
// reader of any value sharing its storage).
bool contained(const Profile& p, const ProfileSaved& s,
               const std::function<bool(int32_t)>& inside) {
  if (!inside(s.producer)) return false;
  for (const ProfileValue& v : p.values) {
    if (v.root != s.value) continue;
    for (int32_t c : v.consumers) {
      if (!inside(c)) return false;
    }
  }
  return true;
}

Decisions blocks_prefix(const Profile& p, size_t k) {
  Decisions d(p.saved.size(), Decision::retain);
  for (const ProfileSaved& s : p.saved) {
    if (!s.candidate) continue;
    const int32_t b = p.nodes[static_cast<size_t>(s.producer)].block;
    if (b < 0 || static_cast<size_t>(b) >= k) continue;
    if (contained(p, s, [&](int32_t n) { return p.nodes[static_cast<size_t>(n)].block == b; })) {
      d[static_cast<size_t>(s.index)] = Decision::recompute;
    }
  }
  return d;
}

Decisions sqrt_segments(const Profile& p) {
  Decisions d(p.saved.size(), Decision::retain);
  const size_t n = p.blocks.size();
  if (n == 0) return d;
  const size_t k = static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  auto segment = [&](int32_t node) -> int64_t {
    const int32_t b = p.nodes[static_cast<size_t>(node)].block;
    return b < 0 ? -1 : static_cast<int64_t>(static_cast<size_t>(b) / k);
  };
  for (const ProfileSaved& s : p.saved) {
    if (!s.candidate) continue;
    const int64_t g = segment(s.producer);
    if (g < 0) continue;
    if (contained(p, s, [&](int32_t node) { return segment(node) == g; })) {
      d[static_cast<size_t>(s.index)] = Decision::recompute;
    }
  }
  return d;
}

}  // namespace

// mu-TWO's greedy (after Capuchin). Returns the full pick order with each pick's bookkeeping as
// it stood when it was picked.
std::vector<MutwoPick> mutwo_picks(const Profile& p) {
  struct Cand {
    std::vector<int32_t> srcs;  // saved tensors its recomputation reads (sorted)
    double rp_ms = 0;           // one recomputation from srcs
    double count = 1;           // times it will be recomputed
    bool chosen = false, alive = false;
  };
  std::vector<Cand> c(p.saved.size());
  // Initial sources: the saved tensors met walking back from t's producer, all retained.
  for (const ProfileSaved& s : p.saved) {
    if (!s.candidate) continue;
    Cand& x = c[static_cast<size_t>(s.index)];
    x.alive = true;
    x.rp_ms = s.recompute_ms;
    std::set<int32_t> srcs, seen_nodes;
    std::function<void(int64_t)> walk = [&](int64_t v) {
      if (v < 0) return;
      const ProfileValue& val = p.values[static_cast<size_t>(v)];
      const ProfileValue& root = p.values[static_cast<size_t>(val.root)];
      if (val.leaf || root.leaf) return;
      if (root.saved >= 0 && root.saved != s.index) {
        srcs.insert(root.saved);
        return;
      }
      if (!seen_nodes.insert(val.producer).second) return;
      for (int64_t in : p.nodes[static_cast<size_t>(val.producer)].inputs) walk(in);
    };
    for (int64_t in : p.nodes[static_cast<size_t>(s.producer)].inputs) walk(in);
    x.srcs.assign(srcs.begin(), srcs.end());
  }
  auto has = [](const std::vector<int32_t>& v, int32_t x) {
    return std::binary_search(v.begin(), v.end(), x);
  };
  auto replace = [](std::vector<int32_t>& v, int32_t x, const std::vector<int32_t>& with) {
    std::set<int32_t> s(v.begin(), v.end());
    s.erase(x);
    s.insert(with.begin(), with.end());
    v.assign(s.begin(), s.end());
  };
  std::vector<MutwoPick> order;
  std::vector<int32_t> chosen;
  while (true) {
    int32_t best = -1;
    double best_ratio = -1;
    for (size_t i = 0; i < c.size(); ++i) {
      if (!c[i].alive || c[i].chosen) continue;
      const double total = c[i].rp_ms * c[i].count;
      const double ratio = total > 0 ? static_cast<double>(p.saved[i].bytes) / total
                                     : std::numeric_limits<double>::infinity();
      if (ratio > best_ratio) {
        best_ratio = ratio;
        best = static_cast<int32_t>(i);
      }
    }
    if (best < 0) break;
    Cand& t = c[static_cast<size_t>(best)];
    t.chosen = true;
    order.push_back({best, t.count, t.rp_ms, best_ratio, t.srcs});
    // Earlier picks that read t now recompute it on the way: their sources become t's sources
    // and their recompute time grows by t's. t's count needs no update here: when each of them
    // was picked, t was a remaining candidate among its sources and got its count then (the
    // third loop below); adding it again would count those recomputations twice.
    for (int32_t r : chosen) {
      Cand& rp = c[static_cast<size_t>(r)];
      if (!has(rp.srcs, best)) continue;
      replace(rp.srcs, best, t.srcs);
      rp.rp_ms += t.rp_ms;
    }
    // Remaining candidates that read t: same source and time update.
    for (size_t i = 0; i < c.size(); ++i) {
      Cand& x = c[i];
      if (!x.alive || x.chosen || !has(x.srcs, best)) continue;
      replace(x.srcs, best, t.srcs);
      x.rp_ms += t.rp_ms;
    }
    // Remaining candidates t reads: if picked later, each of t's recomputations recomputes them.
    for (int32_t src : t.srcs) {
      Cand& x = c[static_cast<size_t>(src)];
      if (x.alive && !x.chosen) x.count += t.count;
    }
    chosen.push_back(best);
  }
  return order;
}

namespace {

Decisions prefix_of(const Profile& p, const std::vector<int32_t>& order, size_t k) {
  Decisions d(p.saved.size(), Decision::retain);
  for (size_t i = 0; i < k && i < order.size(); ++i)
    d[static_cast<size_t>(order[i])] = Decision::recompute;
  return d;
}

// When no plan meets the budget, plans whose peak is within this fraction of the lowest peak
// count as reaching it, and the fastest of them is chosen.
constexpr double kNearLowest = 0.01;

bool near_lowest(int64_t peak, int64_t lowest) {
  return static_cast<double>(peak) <= static_cast<double>(lowest) * (1.0 + kNearLowest);
}

struct Evaluated {
  size_t k;
  Decisions d;
  SimResult r;
  bool fits = false;
  std::shared_ptr<const PlannedLayout> layout;
};

// The prefixes search_prefix scans first: up to 33 evenly spaced k in [0, n], 0 and n included.
// Bisection only ever starts from one that fits, so a budget is met exactly when one of these
// fits it (the lowest budget a prefix policy meets is the lowest over these).
std::vector<size_t> coarse_prefixes(size_t n) {
  constexpr size_t kCoarse = 32;
  std::vector<size_t> points;
  for (size_t i = 0; i <= kCoarse; ++i) points.push_back(n * i / kCoarse);
  points.erase(std::unique(points.begin(), points.end()), points.end());
  return points;
}

// The smallest k in [0, n] whose plan `make(k)` fits the budget. The peak usually falls as k
// grows but not always (long regeneration chains can raise it again), so the search first scans
// up to kCoarse evenly spaced k, then bisects between the last point that did not fit and the
// first that did. Every evaluation is an exact simulation; `lowest` tracks the lowest peak seen.
Evaluated search_prefix(const Simulator& sim, size_t n, int64_t budget, BudgetOf of, bool planned,
                        bool keep_chain, const std::function<Decisions(size_t)>& make,
                        int64_t& lowest) {
  auto eval = [&](size_t k) {
    Evaluated e{k, make(k), {}, false, nullptr};
    PlanFit f = fit_schedule(sim, build_schedule(sim.profile(), e.d, keep_chain),
                             budget > 0 ? budget : 0, of, nullptr, planned);
    e.r = std::move(f.result);
    e.layout = std::move(f.layout);
    e.fits = budget > 0 && f.fits;
    lowest = std::min(lowest, peak_of(e.r, of));
    return e;
  };
  const std::vector<size_t> points = coarse_prefixes(n);
  std::vector<Evaluated> misses;
  size_t prev_k = 0;
  for (size_t k : points) {
    Evaluated e = eval(k);
    if (e.fits) {
      // Bisect (prev_k, k]: prev_k did not fit.
      size_t a = prev_k, b = k;
      Evaluated fit = std::move(e);
      while (b - a > 1) {
        const size_t mid = a + (b - a) / 2;
        Evaluated m = eval(mid);
        if (m.fits) {
          b = mid;
          fit = std::move(m);
        } else {
          a = mid;
        }
      }
      return fit;
    }
    misses.push_back(std::move(e));
    prev_k = k;
  }
  // Nothing fits: the fastest of the plans that come within kNearLowest of the lowest peak seen
  // (a plan that recomputes everything is often only a few MiB lower than a far cheaper one).
  const int64_t floor_peak = lowest;
  size_t pick = 0;
  for (size_t i = 0; i < misses.size(); ++i) {
    const SimResult& r = misses[i].r;
    if (!near_lowest(peak_of(r, of), floor_peak)) continue;
    const SimResult& b = misses[pick].r;
    if (!near_lowest(peak_of(b, of), floor_peak) || r.time_ms < b.time_ms) pick = i;
  }
  return std::move(misses[pick]);
}

}  // namespace

namespace {

// One policy in one chain mode (the mutwo order is computed once by the caller).
Plan plan_in_mode(const Simulator& sim, const std::string& policy, const Budget& budget,
                  BudgetOf of, bool planned, bool keep_chain, const std::vector<int32_t>& picks) {
  const Profile& p = sim.profile();
  Plan plan;
  plan.policy = policy;
  plan.budget_text = budget.str();
  plan.budget_of = of;
  plan.keep_chain = keep_chain;
  const Decisions all_retain(p.saved.size(), Decision::retain);
  const SimResult none = sim.run(build_schedule(p, all_retain));
  plan.no_remat_peak = peak_of(none, of);
  plan.budget_bytes = budget.resolve(peak_of(none, of));
  plan.lower_bound = memory_lower_bound(p);
  // The lowest peak seen, of the step as it runs: with a planned layout, the planned runs only.
  int64_t lowest =
      planned
          ? peak_of(fit_schedule(sim, build_schedule(p, all_retain), 0, of, nullptr, true).result,
                    of)
          : peak_of(none, of);
  bool fits = true;

  if (policy == "none") {
    plan.decisions = all_retain;
    PlanFit f = fit_schedule(sim, plan_schedule(p, plan), plan.budget_bytes, of, &none, planned);
    plan.predicted = std::move(f.result);
    plan.layout = std::move(f.layout);
    fits = f.fits;
  } else if (policy == "sqrt") {
    plan.decisions = sqrt_segments(p);
    PlanFit f = fit_schedule(sim, plan_schedule(p, plan), plan.budget_bytes, of, nullptr, planned);
    plan.predicted = std::move(f.result);
    plan.layout = std::move(f.layout);
    fits = f.fits;
    lowest = std::min(lowest, peak_of(plan.predicted, of));
    plan.note = std::to_string(p.blocks.size()) + " blocks in segments of " +
                std::to_string(static_cast<int>(std::ceil(std::sqrt(double(p.blocks.size())))));
  } else {
    size_t n = 0;
    std::function<Decisions(size_t)> make;
    if (policy == "blocks") {
      n = p.blocks.size();
      make = [&](size_t k) { return blocks_prefix(p, k); };
    } else {
      n = picks.size();
      make = [&](size_t k) { return prefix_of(p, picks, k); };
    }
    if (plan.budget_bytes == 0 && policy == "blocks") {
      // torch.utils.checkpoint on every block.
      plan.decisions = make(n);
      PlanFit f = fit_schedule(sim, plan_schedule(p, plan), 0, of, nullptr, planned);
      plan.predicted = std::move(f.result);
      plan.layout = std::move(f.layout);
      lowest = std::min(lowest, peak_of(plan.predicted, of));
      plan.note = "checkpointed all " + std::to_string(n) + " blocks";
    } else {
      // mutwo without a budget aims for the lowest peak: no prefix "fits" a target of -1, so the
      // search returns the fastest plan near the lowest peak it saw.
      const int64_t goal = plan.budget_bytes > 0 ? plan.budget_bytes : -1;
      Evaluated e = search_prefix(sim, n, goal, of, planned, plan.keep_chain, make, lowest);
      fits = plan.budget_bytes == 0 || e.fits;
      plan.decisions = std::move(e.d);
      plan.predicted = std::move(e.r);
      plan.layout = std::move(e.layout);
      plan.note =
          std::string(policy == "blocks" ? "checkpointed the first " : "recomputes the first ") +
          std::to_string(e.k) + " of " + std::to_string(n) +
          (policy == "blocks" ? " blocks" : " greedy picks");
    }
  }
  plan.lowest_peak = std::min(lowest, peak_of(plan.predicted, of));
  plan.feasible = plan.budget_bytes == 0 || fits;
  if (plan.feasible && of == BudgetOf::reserved)
    plan.limit = limit_for(plan.predicted, plan.budget_bytes);
  if (planned) {
    ensure_planned_layout(sim, plan);
    plan.lowest_peak = std::min(plan.lowest_peak, peak_of(plan.predicted, of));
  }
  return plan;  // make_plan writes the note of an infeasible plan
}

// The chain DP (chain.h): every distinct plan the programme yields over all budget levels is
// simulated exactly, with the all-retain plan; the answer is the fastest that fits. The set does
// not depend on the budget, so as the budget falls the chosen peak never rises and the predicted
// time never falls.
// The dp planner simulates at most this many of the programme's plans (planning time).
constexpr size_t kDpSimulated = 192;
// Budget levels of the programme (its memory resolution is the no-remat peak over this).
constexpr int kDpLevels = 1024;

// The model, the programme's plans and their simulations do not depend on the budget: computed
// once per simulator.
struct DpPoint {
  int64_t cand;  // -1: all retain
  SimResult r;
};
struct DpMemo {
  std::string note;
  std::vector<ChainPlan> cands;
  std::vector<DpPoint> points;
  // The lowest reserved budget one of the points fits (lowest_fitting_budget), once computed.
  int64_t lowest_reserved = -1;
};

DpMemo& dp_memo(const Simulator& sim) {
  const Profile& p = sim.profile();
  std::shared_ptr<void>& slot = sim.planner_memo("dp");
  if (!slot) {
    auto memo = std::make_shared<DpMemo>();
    const ChainModel model = build_chain_model(p);
    memo->note = model.note;
    memo->cands = chain_plans(p, model, kDpLevels);
    memo->points = {{-1, sim.run(build_schedule(p, Decisions(p.saved.size(), Decision::retain)))}};
    // At most kDpSimulated of them, evenly spread from the largest budget level to the lowest.
    const std::vector<ChainPlan>& cands = memo->cands;
    const size_t nc = cands.size(), take = std::min(nc, kDpSimulated);
    for (size_t k = 0; k < take; ++k) {
      const size_t i = take == 1 ? 0 : k * (nc - 1) / (take - 1);
      if (memo->points.back().cand == static_cast<int64_t>(i)) continue;
      memo->points.push_back(
          {static_cast<int64_t>(i),
           sim.run(build_schedule(p, cands[i].decisions, false, cands[i].regenerations))});
    }
    slot = memo;
  }
  return *static_cast<DpMemo*>(slot.get());
}

Schedule dp_schedule(const Profile& p, const DpMemo& memo, const DpPoint& pt) {
  if (pt.cand < 0) return build_schedule(p, Decisions(p.saved.size(), Decision::retain));
  const ChainPlan& c = memo.cands[static_cast<size_t>(pt.cand)];
  return build_schedule(p, c.decisions, false, c.regenerations);
}

// The lowest budget of kind `of` one of dp's plans fits: exactly the lowest budget dp meets (it
// tries every point against the budget).
int64_t dp_lowest(const Simulator& sim, BudgetOf of, bool planned) {
  DpMemo& memo = dp_memo(sim);
  const bool cached = of == BudgetOf::reserved && !planned;
  if (cached && memo.lowest_reserved >= 0) return memo.lowest_reserved;
  // Each point's lowest budget is at least its allocated peak (a planned run: its requested
  // peak): the most aggressive first, and the search for each stops at the lowest found so far.
  auto floor_of = [&](const DpPoint& pt) {
    return planned ? pt.r.peak_requested : pt.r.peak_allocated;
  };
  std::vector<const DpPoint*> order;
  for (const DpPoint& pt : memo.points) order.push_back(&pt);
  std::stable_sort(order.begin(), order.end(),
                   [&](const DpPoint* a, const DpPoint* b) { return floor_of(*a) < floor_of(*b); });
  int64_t low = std::numeric_limits<int64_t>::max();
  for (const DpPoint* pt : order) {
    if (floor_of(*pt) >= low) break;
    low = std::min(low, lowest_fitting_budget(sim, dp_schedule(sim.profile(), memo, *pt), of,
                                              &pt->r, planned, low));
  }
  if (cached) memo.lowest_reserved = low;
  return low;
}

Plan plan_dp(const Simulator& sim, const Budget& budget, BudgetOf of, bool planned) {
  const Profile& p = sim.profile();
  Plan plan;
  plan.policy = "dp";
  plan.budget_text = budget.str();
  plan.budget_of = of;
  plan.keep_chain = false;
  const Decisions all_retain(p.saved.size(), Decision::retain);
  const DpMemo& memo = dp_memo(sim);
  const SimResult& none = memo.points.front().r;
  plan.no_remat_peak = peak_of(none, of);
  plan.budget_bytes = budget.resolve(peak_of(none, of));
  plan.lower_bound = memory_lower_bound(p);
  using Point = DpPoint;
  const std::vector<ChainPlan>& cands = memo.cands;
  const std::vector<Point>& points = memo.points;
  auto schedule_of = [&](const Point& pt) { return dp_schedule(p, memo, pt); };
  // Fastest first (ties: the lower peak, then the earlier, larger-budget plan).
  std::vector<const Point*> order;
  for (const Point& pt : points) order.push_back(&pt);
  std::stable_sort(order.begin(), order.end(), [&](const Point* x, const Point* y) {
    if (x->r.time_ms != y->r.time_ms) return x->r.time_ms < y->r.time_ms;
    return peak_of(x->r, of) < peak_of(y->r, of);
  });
  // The lowest peak seen; with a planned layout, of the planned runs evaluated below only (the
  // points' peaks are the caching allocator's).
  int64_t caching_low = peak_of(none, of);
  for (const Point& pt : points) caching_low = std::min(caching_low, peak_of(pt.r, of));
  int64_t lowest = planned ? std::numeric_limits<int64_t>::max() : caching_low;
  // The fastest that fits (for a reserved budget, a plan whose unlimited run passes it may still
  // run under the limit: simulated with it). When none fits, the lowest peak (the fastest of
  // those): then as the budget falls the chosen peak never rises and the time never falls, also
  // past the lowest peak. Without a budget, like mutwo, the fastest within kNearLowest of the
  // lowest peak.
  const Point* best = nullptr;
  SimResult chosen;
  bool fits = true;
  if (plan.budget_bytes == 0) {
    for (const Point* pt : order) {
      if (near_lowest(peak_of(pt->r, of), caching_low)) {
        best = pt;
        break;
      }
    }
    chosen = best->r;
  } else {
    // A planned run allocates at least the bytes the step requests, which do not depend on the
    // layout: a point whose requested peak passes the budget is not run with one.
    for (const Point* pt : order) {
      if (planned && pt->r.peak_requested > plan.budget_bytes) continue;
      PlanFit f = fit_schedule(sim, schedule_of(*pt), plan.budget_bytes, of, &pt->r, planned);
      if (planned) lowest = std::min(lowest, peak_of(f.result, of));
      if (f.fits) {
        best = pt;
        chosen = std::move(f.result);
        plan.layout = std::move(f.layout);
        lowest = std::min(lowest, peak_of(chosen, of));
        break;
      }
    }
    if (!best) {
      fits = false;
      if (planned) {
        // A planned step maps nothing but its arena, so it runs under exactly its reserved peak:
        // the lowest planned peak is the answer, for either kind of budget (the faster on a
        // tie). Points by requested peak, a bound on their planned peak: past the lowest found,
        // none can be lower.
        std::vector<const Point*> by_requested(order);
        std::stable_sort(by_requested.begin(), by_requested.end(),
                         [](const Point* a, const Point* b) {
                           return a->r.peak_requested < b->r.peak_requested;
                         });
        PlanFit low;
        for (const Point* pt : by_requested) {
          if (best && pt->r.peak_requested > peak_of(low.result, of)) break;
          PlanFit f = fit_schedule(sim, schedule_of(*pt), 0, of, &pt->r, true);
          const int64_t peak = peak_of(f.result, of);
          if (!best || peak < peak_of(low.result, of) ||
              (peak == peak_of(low.result, of) && f.result.time_ms < low.result.time_ms)) {
            best = pt;
            low = std::move(f);
          }
        }
        chosen = std::move(low.result);
        plan.layout = std::move(low.layout);
        lowest = std::min(lowest, peak_of(chosen, of));
        if (of == BudgetOf::reserved) plan.limit = peak_of(chosen, of);
      } else if (of == BudgetOf::allocated) {
        for (const Point* pt : order) {
          if (peak_of(pt->r, of) == caching_low) {
            best = pt;
            break;
          }
        }
        chosen = best->r;
      } else {
        // Under a limit a plan can reserve far less than it does unlimited, so the lowest peak
        // is the lowest limit any plan runs under. The answer is the one for that limit (the
        // same plan and peak), which keeps the frontier monotone past it.
        const int64_t low = dp_lowest(sim, of, false);
        for (const Point* pt : order) {
          PlanFit f = fit_schedule(sim, schedule_of(*pt), low, of, &pt->r);
          if (f.fits) {
            best = pt;
            chosen = std::move(f.result);
            break;
          }
        }
        REGEN_ASSERT(best);
        lowest = peak_of(chosen, of);
        plan.limit = low;
      }
    }
  }
  REGEN_ASSERT(best);
  if (best->cand < 0) {
    plan.decisions = all_retain;
    plan.keep_chain = true;
  } else {
    plan.decisions = cands[static_cast<size_t>(best->cand)].decisions;
    plan.regenerations = cands[static_cast<size_t>(best->cand)].regenerations;
  }
  plan.predicted = std::move(chosen);
  plan.lowest_peak = lowest;
  plan.feasible = fits;
  if (planned) {
    ensure_planned_layout(sim, plan);
    plan.lowest_peak = std::min(plan.lowest_peak, peak_of(plan.predicted, of));
  }
  if (fits && of == BudgetOf::reserved) plan.limit = limit_for(plan.predicted, plan.budget_bytes);
  plan.note = memo.note + "; the programme yields " + std::to_string(cands.size()) + " plans, " +
              std::to_string(points.size() - 1) + " simulated";
  return plan;
}

// Whether plan a is the better answer to the budget than plan b.
// Both infeasible (or no budget): the lower peak, unless the two peaks are within kNearLowest
// of each other, when the faster plan wins.
bool better(const Plan& a, const Plan& b) {
  if (a.feasible != b.feasible) return a.feasible;
  const bool aim_low = !a.feasible || a.budget_bytes == 0;
  if (aim_low) {
    const int64_t pa = peak_of(a.predicted, a.budget_of), pb = peak_of(b.predicted, b.budget_of);
    const int64_t low = std::min(pa, pb);
    if (!near_lowest(pa, low) || !near_lowest(pb, low)) return pa < pb;
  }
  return a.predicted.time_ms < b.predicted.time_ms;
}

// The lowest budget (of options.budget_of) a built-in policy meets: the lowest over the plans its
// search tries at every budget of that budget's fit (search_prefix's coarse prefixes for blocks
// and mutwo, in each chain mode it plans; sqrt's and none's one plan; every dp point).
int64_t builtin_lowest(const Simulator& sim, const std::string& policy,
                       const PlanOptions& options) {
  const Profile& p = sim.profile();
  const BudgetOf of = options.budget_of;
  const bool planned = options.planned_layout;
  if (policy == "dp" || policy == "milp") return dp_lowest(sim, of, planned);
  const Decisions all_retain(p.saved.size(), Decision::retain);
  if (policy == "none")
    return lowest_fitting_budget(sim, build_schedule(p, all_retain), of, nullptr, planned);
  const bool keep = options.chain != Chain::drop;
  if (policy == "sqrt")
    return lowest_fitting_budget(sim, build_schedule(p, sqrt_segments(p), keep), of, nullptr,
                                 planned);
  REGEN_ASSERT(policy == "blocks" || policy == "mutwo");
  std::vector<int32_t> picks;
  if (policy == "mutwo") {
    for (const MutwoPick& m : mutwo_picks(p)) picks.push_back(m.saved);
  }
  const size_t n = policy == "blocks" ? p.blocks.size() : picks.size();
  std::vector<bool> modes = {keep};
  if (policy == "mutwo" && options.chain == Chain::automatic) modes = {true, false};
  int64_t low = std::numeric_limits<int64_t>::max();
  for (const bool keep_chain : modes) {
    for (const size_t k : coarse_prefixes(n)) {
      const Decisions d = policy == "blocks" ? blocks_prefix(p, k) : prefix_of(p, picks, k);
      const Schedule s = build_schedule(p, d, keep_chain);
      const SimResult r = sim.run(s);
      // A plan's lowest budget is at least its allocated peak (a planned run: its requested one).
      if ((planned ? r.peak_requested : r.peak_allocated) >= low) continue;
      low = std::min(low, lowest_fitting_budget(sim, s, of, &r, planned, low));
    }
  }
  return low;
}

}  // namespace

Plan make_plan(const Simulator& sim, const std::string& policy, const Budget& budget, Chain chain) {
  PlanOptions o;
  o.chain = chain;
  return make_plan(sim, policy, budget, o);
}

namespace {

void check_blocks(const Simulator& sim, const std::string& policy) {
  REGEN_CHECK(
      (policy != "blocks" && policy != "sqrt") || !sim.profile().blocks.empty(), "the ", policy,
      " policy checkpoints whole blocks, and ", sim.profile().model,
      " marks none "
      "(a model marks its residual blocks or layers with BlockScope in forward): use mutwo, "
      "dp or milp");
}

// The built-in planners (the header's list), registered below.
Plan plan_builtin(const Simulator& sim, const std::string& policy, const Budget& budget,
                  const PlanOptions& options) {
  const Chain chain = options.chain;
  const BudgetOf of = options.budget_of;
  const bool planned = options.planned_layout;
  check_blocks(sim, policy);
  std::vector<int32_t> picks;
  if (policy == "mutwo") {
    for (const MutwoPick& m : mutwo_picks(sim.profile())) picks.push_back(m.saved);
  }
  Plan plan;
  std::string chain_note;
  if (policy == "dp" || policy == "milp") {
    REGEN_CHECK(chain != Chain::keep, "the ", policy,
                " policy decides what each regeneration "
                "restores itself; it takes no chain mode (got keep)");
    plan = plan_dp(sim, budget, of, planned);
    if (policy == "milp") {
      REGEN_CHECK(plan.budget_bytes > 0,
                  "the milp policy needs a budget (--budget): it minimizes "
                  "the recomputation time under one");
      MilpOptions mo;
      mo.time_limit_s = options.milp_time_limit_s;
      mo.threads = options.milp_threads;
      mo.budget_of = of;
      mo.planned_layout = planned;
      // The dp plan as the solver's first incumbent: the answer is never slower than dp's when
      // the model accepts it.
      if (plan.feasible) mo.start = &plan;
      MilpReport report;
      Plan milp = plan_milp(sim, plan.budget_bytes, mo, &report);
      milp.budget_text = plan.budget_text;
      char buf[256];
      std::snprintf(buf, sizeof buf,
                    "MILP %s in %.1f s (%d round%s; %lld variables, %lld binary, "
                    "%lld rows)",
                    report.status.c_str(), report.solve_s, report.rounds,
                    report.rounds == 1 ? "" : "s", static_cast<long long>(report.variables),
                    static_cast<long long>(report.binaries),
                    static_cast<long long>(report.constraints));
      // The answer is never worse than dp's, from which the solver starts: where the MILP's
      // memory model refuses dp's plan (large blocks land where the plan puts them), or proves
      // the budget out of its reach while dp's plan fits, or the MILP returns nothing that fits
      // and dp's lowest plan is lower, dp's plan is the answer.
      if (better(plan, milp)) {
        char why[240];
        std::snprintf(
            why, sizeof why,
            "; dp's plan kept (%s %s, step %.3f s; the MILP's: %s %s, step %.3f s)%s",
            plan.feasible ? "fits at" : "peak", format_bytes(peak_of(plan.predicted, of)).c_str(),
            plan.predicted.time_ms / 1000.0, milp.feasible ? "fits at" : "peak",
            format_bytes(peak_of(milp.predicted, of)).c_str(), milp.predicted.time_ms / 1000.0,
            plan.feasible ? ": the MILP's memory model did not accept it" : "");
        plan.note = buf;
        plan.note += why;
        plan.lowest_peak = std::min(plan.lowest_peak, milp.lowest_peak);
      } else {
        milp.note = buf;
        milp.lowest_peak = std::min(plan.lowest_peak, milp.lowest_peak);
        plan = std::move(milp);
      }
    }
  } else if (chain == Chain::automatic && policy == "mutwo") {
    Plan keep = plan_in_mode(sim, policy, budget, of, planned, true, picks);
    Plan drop = plan_in_mode(sim, policy, budget, of, planned, false, picks);
    const bool take_keep = !better(drop, keep);
    plan = take_keep ? std::move(keep) : std::move(drop);
    const Plan& other = take_keep ? drop : keep;
    plan.lowest_peak = std::min(plan.lowest_peak, other.lowest_peak);
    char buf[200];
    std::snprintf(buf, sizeof buf, "chain %s chosen (chain %s: peak %s, step %.3f s%s)",
                  take_keep ? "keep" : "drop", take_keep ? "drop" : "keep",
                  format_bytes(peak_of(other.predicted, of)).c_str(),
                  other.predicted.time_ms / 1000.0, other.feasible ? "" : ", over budget");
    chain_note = buf;
  } else {
    plan = plan_in_mode(sim, policy, budget, of, planned, chain != Chain::drop, picks);
  }
  // make_plan writes the note of a plan that does not fit; dp's and milp's own notes (what they
  // modelled) and the chain choice follow it.
  if (!plan.feasible && policy != "dp" && policy != "milp") plan.note.clear();
  if (!chain_note.empty()) plan.note += (plan.note.empty() ? "" : "; ") + chain_note;
  return plan;
}

Budget bytes_budget(int64_t bytes) {
  Budget b;
  b.kind = Budget::Kind::bytes;
  b.value = static_cast<double>(bytes);
  return b;
}

// A built-in policy's plan at its lowest budget. milp meets every budget dp meets (its answer is
// never worse than dp's); below dp's lowest it bisects towards the lower bound with up to
// kMilpLowestSolves solves (the MILP's model admits more plans as the budget grows), each answer
// judged by exact simulation, and keeps the lowest budget it met.
constexpr int kMilpLowestSolves = 6;
Plan builtin_lowest_plan(const Simulator& sim, const std::string& policy,
                         const PlanOptions& options) {
  check_blocks(sim, policy);
  Plan best =
      plan_builtin(sim, policy, bytes_budget(builtin_lowest(sim, policy, options)), options);
  if (policy != "milp" || !best.feasible) return best;
  int64_t lo = memory_lower_bound(sim.profile()) - 1, hi = best.budget_bytes;  // lo never fits
  for (int i = 0; i < kMilpLowestSolves && hi - lo > std::max<int64_t>(4096, hi / 1000); ++i) {
    const int64_t mid = lo + (hi - lo) / 2;
    Plan at = plan_builtin(sim, policy, bytes_budget(mid), options);
    if (at.feasible) {
      hi = mid;
      best = std::move(at);
    } else {
      lo = mid;
    }
  }
  return best;
}

struct PlannerRegistry {
  std::vector<PlannerInfo> planners;
  size_t builtin = 0;
};

PlannerRegistry& planners() {
  static PlannerRegistry r = [] {
    PlannerRegistry reg;
    const std::pair<const char*, const char*> builtin[] = {
        {"none", "retain every saved tensor"},
        {"blocks",
         "checkpoint residual blocks / encoder layers in forward order until the peak fits"},
        {"sqrt", "sqrt(n) segments over the chain of blocks (Chen et al.)"},
        {"mutwo", "mu-TWO's greedy recomputation by bytes per recompute time"},
        {"dp",
         "dynamic programme over the chain of blocks (Rotor, Rockmate): the fastest plan that "
         "fits"},
        {"milp",
         "exact mixed-integer programme over the executor's plans (Checkmate), CBC, from dp's "
         "plan"},
    };
    for (const auto& [name, help] : builtin) {
      const std::string n = name;
      reg.planners.push_back({n, help,
                              [n](const Simulator& sim, const Budget& b, const PlanOptions& o) {
                                return plan_builtin(sim, n, b, o);
                              },
                              [n](const Simulator& sim, const PlanOptions& o) {
                                return builtin_lowest_plan(sim, n, o);
                              }});
    }
    reg.builtin = reg.planners.size();
    return reg;
  }();
  return r;
}

}  // namespace

std::vector<std::string> policy_names() {
  std::vector<std::string> out;
  for (const PlannerInfo& p : planners().planners) out.push_back(p.name);
  return out;
}

void register_planner(PlannerInfo info) {
  REGEN_CHECK(
      !info.name.empty() && std::all_of(info.name.begin(), info.name.end(),
                                        [](char c) {
                                          return std::isalnum(static_cast<unsigned char>(c)) ||
                                                 c == '-' || c == '_';
                                        }),
      "register_planner: the name '", info.name, "' must be letters, digits, '-' and '_'");
  REGEN_CHECK(static_cast<bool>(info.plan), "register_planner: planner '", info.name,
              "' has no function");
  for (const PlannerInfo& p : planners().planners) {
    REGEN_CHECK(p.name != info.name, "register_planner: a planner named '", info.name,
                "' is registered already");
  }
  planners().planners.push_back(std::move(info));
}

const PlannerInfo& planner_info(const std::string& name) {
  for (const PlannerInfo& p : planners().planners) {
    if (p.name == name) return p;
  }
  REGEN_FAIL("unknown policy '", name, "': known policies are ", join_names(policy_names()));
}

std::string planner_help() {
  std::string out;
  for (const PlannerInfo& p : planners().planners) {
    out += (out.empty() ? "" : "; ") + p.name + ": " + p.help;
  }
  return out;
}

void check_plan_decisions(const Plan& plan, const Profile& p) {
  REGEN_CHECK(plan.decisions.size() == p.saved.size(), "plan '", plan.policy, "' has ",
              plan.decisions.size(), " decisions, but the profile of ", p.model, " has ",
              p.saved.size(), " saved tensors");
}

namespace {
// A plan's prediction, planned layout, feasibility and limit, from its decisions and its budget
// in bytes and kind.
void judge_against_budget(const Simulator& sim, Plan& plan, bool planned_layout) {
  PlanFit f = fit_schedule(sim, plan_schedule(sim.profile(), plan), plan.budget_bytes,
                           plan.budget_of, nullptr, planned_layout);
  plan.predicted = std::move(f.result);
  plan.layout = std::move(f.layout);
  plan.feasible = f.fits;  // fit_schedule: everything fits without a budget
  plan.limit = plan.feasible && plan.budget_of == BudgetOf::reserved
                   ? limit_for(plan.predicted, plan.budget_bytes)
                   : 0;
}

}  // namespace

int64_t no_remat_peak_of(const Simulator& sim, BudgetOf of) {
  const Profile& p = sim.profile();
  return peak_of(sim.run(build_schedule(p, Decisions(p.saved.size(), Decision::retain))), of);
}

Plan finish_plan(const Simulator& sim, Plan draft, const Budget& budget,
                 const PlanOptions& options) {
  check_plan_decisions(draft, sim.profile());
  Plan plan = std::move(draft);
  plan.budget_text = budget.str();
  plan.budget_of = options.budget_of;
  plan.no_remat_peak = no_remat_peak_of(sim, plan.budget_of);
  plan.budget_bytes = budget.resolve(plan.no_remat_peak);
  plan.lower_bound = memory_lower_bound(sim.profile());
  judge_against_budget(sim, plan, options.planned_layout);
  plan.lowest_peak = std::min(plan.no_remat_peak, peak_of(plan.predicted, plan.budget_of));
  if (options.planned_layout) ensure_planned_layout(sim, plan);
  return plan;
}

void judge_loaded_plan(const Simulator& sim, Plan& plan) {
  check_plan_decisions(plan, sim.profile());
  judge_against_budget(sim, plan, plan.planned_layout);
  plan.no_remat_peak = no_remat_peak_of(sim, plan.budget_of);
}

namespace {
// make_plan's last step for any planner's plan: the policy name, the note of a plan that does not
// fit, the planned-layout check and the planning time since t0.
Plan finish_policy_plan(const Simulator& sim, const std::string& policy, Plan plan,
                        const Budget& budget, const PlanOptions& options,
                        std::chrono::steady_clock::time_point t0);
}  // namespace

namespace {

// The plan at the lowest budget of a planner registered without a LowestFn: its answer to an
// impossible budget is the lowest it aims for, so the lowest budget that plan fits, if the planner
// then meets it; else the no-remat plan's.
Plan searched_lowest_plan(const PlannerInfo& planner, const Simulator& sim,
                          const PlanOptions& options) {
  const Profile& p = sim.profile();
  Plan probe = planner.plan(sim, bytes_budget(1), options);
  check_plan_decisions(probe, p);
  Plan none;
  none.decisions.assign(p.saved.size(), Decision::retain);
  Plan plan;
  for (const Plan* draft : {&probe, &none}) {
    const int64_t low = lowest_fitting_budget(sim, plan_schedule(p, *draft), options.budget_of,
                                              nullptr, options.planned_layout);
    plan = planner.plan(sim, bytes_budget(low), options);
    if (plan.feasible) break;
  }
  return plan;
}

// The lowest budget `policy` meets with `options`, for the note of a plan that does not fit;
// remembered on the simulator. milp: dp's, which it meets (searching below it takes MILP solves;
// lowest_plan does). The second member says whether it is the policy's own lowest.
std::pair<int64_t, bool> noted_lowest(const Simulator& sim, const std::string& policy,
                                      const PlanOptions& options) {
  const PlannerInfo& planner = planner_info(policy);
  const bool milp = policy == "milp" && planner.lowest;
  const std::string key = "lowest " + (milp ? std::string("dp") : policy) + " " +
                          chain_names()[static_cast<size_t>(options.chain)] + " " +
                          budget_of_name(options.budget_of) +
                          (options.planned_layout ? " planned" : " caching");
  std::shared_ptr<void>& slot = sim.planner_memo(key);
  if (!slot) {
    int64_t low = 0;
    if (milp) {
      low = builtin_lowest(sim, "dp", options);
    } else if (planner.lowest) {
      low = planner.lowest(sim, options).budget_bytes;
    } else {
      low = searched_lowest_plan(planner, sim, options).budget_bytes;
    }
    slot = std::make_shared<int64_t>(low);
  }
  return {*static_cast<const int64_t*>(slot.get()), !milp};
}

}  // namespace

Plan lowest_plan(const Simulator& sim, const std::string& policy, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const PlannerInfo& planner = planner_info(policy);
  Plan plan =
      planner.lowest ? planner.lowest(sim, options) : searched_lowest_plan(planner, sim, options);
  REGEN_CHECK(plan.feasible && plan.budget_bytes > 0, "planner '", policy,
              "' meets no budget it was asked for on ", sim.profile().model,
              ", not even the no-remat peak (its plan there: ", plan.note, ")");
  return finish_policy_plan(sim, policy, std::move(plan), Budget::parse("lowest"), options, t0);
}

Plan make_plan(const Simulator& sim, const std::string& policy, const Budget& budget,
               const PlanOptions& options) {
  if (budget.kind == Budget::Kind::lowest) return lowest_plan(sim, policy, options);
  const auto t0 = std::chrono::steady_clock::now();
  const PlannerInfo& planner = planner_info(policy);
  return finish_policy_plan(sim, policy, planner.plan(sim, budget, options), budget, options, t0);
}

namespace {

Plan finish_policy_plan(const Simulator& sim, const std::string& policy, Plan plan,
                        const Budget& budget, const PlanOptions& options,
                        std::chrono::steady_clock::time_point t0) {
  REGEN_CHECK(plan.decisions.size() == sim.profile().saved.size(), "planner '", policy,
              "' returned ", plan.decisions.size(), " decisions for ", sim.profile().saved.size(),
              " saved tensors");
  plan.policy = policy;
  const BudgetOf of = plan.budget_of;
  // lowest_peak: the lowest budget the policy meets, for a plan that does not fit (what to ask
  // for instead) and a plan at that budget; 0 for any other plan that fits (lowest_plan finds it).
  plan.lowest_peak = 0;
  if (budget.kind == Budget::Kind::lowest) {
    plan.budget_text = budget.str();
    plan.lowest_peak = plan.budget_bytes;
  }
  if (!plan.feasible) {
    const auto [low, own_lowest] = noted_lowest(sim, policy, options);
    plan.lowest_peak = low;
    // A planner's own note (what it modelled) follows.
    const std::string own = plan.note;
    plan.note = "budget " + format_bytes(plan.budget_bytes) + " (" + budget_of_name(of) +
                ") cannot be met by " + policy + ": the lowest " + budget_of_name(of) +
                " budget it meets is " + (own_lowest ? "" : "at most ") + format_bytes(low) +
                (own_lowest ? "" : " (dp's lowest)") + "; lower bound " +
                format_bytes(plan.lower_bound) + " allocated (what no plan can free)" +
                (own.empty() ? "" : "; " + own);
  }
  const std::string blockers = recompute_blockers(sim.profile());
  if (!blockers.empty() && policy != "none")
    plan.note += (plan.note.empty() ? "" : "; ") + blockers;
  plan.planned_layout = options.planned_layout;
  REGEN_CHECK(!plan.planned_layout || plan.layout, "planner '", policy,
              "' was asked for a planned "
              "layout and returned none (finish_plan plans one)");
  plan.planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

}  // namespace

}  // namespace regen
