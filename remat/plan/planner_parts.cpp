// The parts the built-in planners share (planner_parts.h).
#include "regen/remat/plan/planner_parts.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <utility>

#include "regen/core/io.h"

namespace regen {

using Decisions = std::vector<Decision>;

bool near_lowest(int64_t peak, int64_t lowest) {
  return static_cast<double>(peak) <= static_cast<double>(lowest) * (1.0 + kNearLowest);
}

bool better_plan(const Plan& a, const Plan& b) {
  if (a.feasible != b.feasible) return a.feasible;
  const bool aim_low = !a.feasible || a.budget_bytes == 0;
  if (aim_low) {
    const int64_t pa = peak_of(a.predicted, a.budget_of), pb = peak_of(b.predicted, b.budget_of);
    const int64_t low = std::min(pa, pb);
    if (!near_lowest(pa, low) || !near_lowest(pb, low)) return pa < pb;
  }
  return a.predicted.time_ms < b.predicted.time_ms;
}

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

Budget bytes_budget(int64_t bytes) {
  Budget b;
  b.kind = Budget::Kind::bytes;
  b.value = static_cast<double>(bytes);
  return b;
}

std::vector<size_t> coarse_prefixes(size_t n) {
  constexpr size_t kCoarse = 32;
  std::vector<size_t> points;
  for (size_t i = 0; i <= kCoarse; ++i) points.push_back(n * i / kCoarse);
  points.erase(std::unique(points.begin(), points.end()), points.end());
  return points;
}

namespace {

struct Evaluated {
  size_t k;
  Decisions d;
  SimResult r;
  bool fits = false;
  std::shared_ptr<const PlannedLayout> layout;
};

// The smallest k in [0, n] whose plan `make(k)` fits the budget (planner_parts.h plan_prefix);
// `lowest` tracks the lowest peak seen.
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

Plan plan_prefix(const Simulator& sim, const Budget& budget, const PlanOptions& options,
                 bool keep_chain, const PrefixPolicy& policy) {
  const Profile& p = sim.profile();
  const BudgetOf of = options.budget_of;
  const bool planned = options.planned_layout;
  Plan plan;
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
  // Without a budget the search aims for the lowest peak: no prefix "fits" a target of -1, so it
  // returns the fastest plan near the lowest peak it saw.
  const int64_t goal = plan.budget_bytes > 0 ? plan.budget_bytes : -1;
  Evaluated e = search_prefix(sim, policy.n, goal, of, planned, keep_chain, policy.make, lowest);
  const bool fits = plan.budget_bytes == 0 || e.fits;
  plan.decisions = std::move(e.d);
  plan.predicted = std::move(e.r);
  plan.layout = std::move(e.layout);
  plan.note = policy.what + " " + std::to_string(e.k) + " of " + std::to_string(policy.n) + " " +
              policy.unit;
  plan.lowest_peak = std::min(lowest, peak_of(plan.predicted, of));
  plan.feasible = plan.budget_bytes == 0 || fits;
  if (plan.feasible && of == BudgetOf::reserved)
    plan.limit = limit_for(plan.predicted, plan.budget_bytes);
  if (planned) {
    ensure_planned_layout(sim, plan);
    plan.lowest_peak = std::min(plan.lowest_peak, peak_of(plan.predicted, of));
  }
  // make_plan writes the note of a plan that does not fit.
  if (!plan.feasible) plan.note.clear();
  return plan;
}

int64_t prefix_lowest(const Simulator& sim, const PlanOptions& options, bool keep_chain,
                      const PrefixPolicy& policy) {
  const Profile& p = sim.profile();
  const bool planned = options.planned_layout;
  int64_t low = std::numeric_limits<int64_t>::max();
  for (const size_t k : coarse_prefixes(policy.n)) {
    const Schedule s = build_schedule(p, policy.make(k), keep_chain);
    const SimResult r = sim.run(s);
    // A plan's lowest budget is at least its allocated peak (a planned run: its requested one).
    if ((planned ? r.peak_requested : r.peak_allocated) >= low) continue;
    low = std::min(low, lowest_fitting_budget(sim, s, options.budget_of, &r, planned, low));
  }
  return low;
}

PlannerFn in_both_chain_modes(PlannerFn plan) {
  return [plan](const Simulator& sim, const Budget& budget, const PlanOptions& options) {
    if (options.chain != Chain::automatic) return plan(sim, budget, options);
    PlanOptions in_keep = options, in_drop = options;
    in_keep.chain = Chain::keep;
    in_drop.chain = Chain::drop;
    Plan keep = plan(sim, budget, in_keep);
    Plan drop = plan(sim, budget, in_drop);
    const bool take_keep = !better_plan(drop, keep);
    Plan out = take_keep ? std::move(keep) : std::move(drop);
    const Plan& other = take_keep ? drop : keep;
    out.lowest_peak = std::min(out.lowest_peak, other.lowest_peak);
    char buf[200];
    std::snprintf(buf, sizeof buf, "chain %s chosen (chain %s: peak %s, step %.3f s%s)",
                  take_keep ? "keep" : "drop", take_keep ? "drop" : "keep",
                  format_bytes(peak_of(other.predicted, other.budget_of)).c_str(),
                  other.predicted.time_ms / 1000.0, other.feasible ? "" : ", over budget");
    out.note += (out.note.empty() ? "" : "; ") + std::string(buf);
    return out;
  };
}

LowestFn lowest_in_both_chain_modes(LowestBudgetFn lowest_in_mode, PlannerFn plan) {
  PlannerFn both = in_both_chain_modes(plan);
  return [lowest_in_mode, both](const Simulator& sim, const PlanOptions& options) {
    int64_t low = 0;
    if (options.chain == Chain::automatic) {
      PlanOptions in_keep = options, in_drop = options;
      in_keep.chain = Chain::keep;
      in_drop.chain = Chain::drop;
      low = std::min(lowest_in_mode(sim, in_keep), lowest_in_mode(sim, in_drop));
    } else {
      low = lowest_in_mode(sim, options);
    }
    return both(sim, bytes_budget(low), options);
  };
}

}  // namespace regen
