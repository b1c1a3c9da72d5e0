// The "dp" planner: a dynamic programme over the chain of blocks (after Rotor and Rockmate; the
// programme is remat/plan/chain.h's) for every budget level at once. Every distinct plan it yields
// (up to kDpSimulated, spread from the largest budget to the lowest) is simulated exactly with the
// all-retain plan; the answer is the fastest that fits. The set does not depend on the budget, so
// as the budget falls the chosen peak never rises and the predicted time never falls
// (tests/test_chain.cpp). The programme and the simulations are kept in the caller's PlanCache: a
// frontier of 40 budgets builds them once.
#include "regen/remat/plan/planners/dp.h"

#include <algorithm>
#include <limits>

#include "regen/remat/plan/planner_parts.h"
#include "regen/remat/plan/planners/builtin.h"

namespace regen {

namespace {

using Decisions = std::vector<Decision>;

// The dp planner simulates at most this many of the programme's plans (planning time), and this
// many more of each offload family's.
constexpr size_t kDpSimulated = 192;
constexpr size_t kDpSimulatedPerFamily = 48;
// Budget levels of the programme (its memory resolution is the no-remat peak over this).
constexpr int kDpLevels = 1024;

TransferModel transfer_of(const Simulator& sim, const PlanOptions& options) {
  return options.transfer.valid() ? options.transfer : sim.profile().transfer;
}

// The families derived from plans (remat/plan/offload.h plan_offload_sets): the kDpDerivedSources
// lowest distinct peaks among the points of the families that offload no activation (no offload,
// and the optimizer state alone), each with the tensors it retains offloaded as well, in the sets
// plan_offload_sets gives: one family per set, its only candidate the source's plan. Low budgets
// are where they matter: there dp holds checkpoints through most of backward, and the families
// ranked on the step without recomputation offload other tensors. (Planning each set afresh, on
// the levels it changes, found nothing lower on ResNet-152 at batches 8 and 32, from the CPU's
// profiles and an H100's, and cost a third more planning time.)
constexpr size_t kDpDerivedSources = 4;

void add_derived_families(const Simulator& sim, DpCache& memo) {
  const Profile& p = sim.profile();
  std::vector<size_t> sources;  // indices in memo.points
  for (size_t k = 1; k < memo.points.size(); ++k) {
    const DpCache::Point& pt = memo.points[k];
    if (pt.cand >= 0 && memo.families[static_cast<size_t>(pt.family)].offload.saved.empty())
      sources.push_back(k);
  }
  std::stable_sort(sources.begin(), sources.end(), [&](size_t a, size_t b) {
    return memo.points[a].r.peak_allocated < memo.points[b].r.peak_allocated;
  });
  std::vector<int64_t> peaks;
  const size_t first_new = memo.points.size();
  for (size_t k : sources) {
    if (peaks.size() == kDpDerivedSources) break;
    // By value: the loop below grows memo.points and memo.families.
    const int64_t peak = memo.points[k].r.peak_allocated;
    if (std::find(peaks.begin(), peaks.end(), peak) != peaks.end()) continue;
    peaks.push_back(peak);
    const DpCache::Family& from = memo.families[static_cast<size_t>(memo.points[k].family)];
    const ChainPlan c = from.cands[static_cast<size_t>(memo.points[k].cand)];
    const StatePlace state = from.offload.optimizer_state;
    const std::string from_note = from.note;
    for (auto& [name, set] : plan_offload_sets(p, c.decisions, c.regenerations, memo.transfer)) {
      DpCache::Family fam;
      fam.note = from_note;
      fam.cands = {c};
      fam.offload.name = name + (state == StatePlace::host ? ", optimizer state" : "");
      fam.offload.saved = std::move(set);
      fam.offload.optimizer_state = state;
      memo.families.push_back(std::move(fam));
      memo.points.push_back({static_cast<int64_t>(memo.families.size() - 1), 0, SimResult()});
    }
  }
  for (size_t k = first_new; k < memo.points.size(); ++k) {
    DpCache::Point& pt = memo.points[k];
    pt.r = sim.run(dp_schedule(p, memo, pt));
  }
}

DpCache& dp_cache(const Simulator& sim, const PlanOptions& options) {
  const TransferModel transfer = transfer_of(sim, options);
  const bool offload = options.offload != OffloadMode::none;
  if (offload) {
    REGEN_CHECK(transfer.valid(), "dp with offload (", offload_mode_name(options.offload),
                ") needs a transfer model to time the copies, and the profile of ",
                sim.profile().model, " has none: give one (--transfer, regen bench copy)");
  }
  const std::string variant =
      offload ? std::string(offload_mode_name(options.offload)) + " " + transfer.str() : "";
  DpCache& memo = cache_for(sim, options).dp(variant);
  if (memo.built) return memo;
  const Profile& p = sim.profile();
  memo.transfer = transfer;
  {
    DpCache::Family base;
    base.offload.name = "no offload";
    const ChainModel model = build_chain_model(p);
    base.note = model.note;
    base.cands = chain_plans(p, model, kDpLevels);
    memo.families.push_back(std::move(base));
  }
  if (offload) {
    for (OffloadFamily& f : offload_families(p, offloads_activations(options.offload),
                                             offloads_optimizer(options.offload), transfer)) {
      DpCache::Family fam;
      const ChainModel model = build_chain_model(p, &f.change);
      fam.note = model.note;
      fam.cands = chain_plans(p, model, kDpLevels);
      fam.offload = std::move(f);
      memo.families.push_back(std::move(fam));
    }
  }
  memo.points = {{0, -1, sim.run(build_schedule(p, Decisions(p.saved.size(), Decision::retain)))}};
  for (size_t fi = 0; fi < memo.families.size(); ++fi) {
    // At most kDpSimulated of the family's plans (kDpSimulatedPerFamily for an offload family),
    // evenly spread from the largest budget level to the lowest; an offload family's own plan
    // (nothing recomputed) first.
    const std::vector<ChainPlan>& cands = memo.families[fi].cands;
    if (fi > 0) memo.points.push_back({static_cast<int64_t>(fi), -1, SimResult()});
    const size_t nc = cands.size(),
                 take = std::min(nc, fi == 0 ? kDpSimulated : kDpSimulatedPerFamily);
    for (size_t k = 0; k < take; ++k) {
      const size_t i = take == 1 ? 0 : k * (nc - 1) / (take - 1);
      if (memo.points.back().family == static_cast<int64_t>(fi) &&
          memo.points.back().cand == static_cast<int64_t>(i))
        continue;
      memo.points.push_back({static_cast<int64_t>(fi), static_cast<int64_t>(i), SimResult()});
    }
  }
  for (size_t k = 1; k < memo.points.size(); ++k) {
    DpCache::Point& pt = memo.points[k];
    pt.r = sim.run(dp_schedule(p, memo, pt));
  }
  if (offload && offloads_activations(options.offload)) add_derived_families(sim, memo);
  memo.built = true;
  return memo;
}

}  // namespace

Plan dp_point_plan(const Profile& p, const DpCache& memo, const DpCache::Point& pt) {
  const DpCache::Family& fam = memo.families[static_cast<size_t>(pt.family)];
  Plan plan;
  plan.decisions.assign(p.saved.size(), Decision::retain);
  plan.keep_chain = true;
  if (pt.cand >= 0) {
    const ChainPlan& c = fam.cands[static_cast<size_t>(pt.cand)];
    plan.decisions = c.decisions;
    plan.regenerations = c.regenerations;
    plan.keep_chain = false;
  }
  for (int32_t s : fam.offload.saved) {
    REGEN_ASSERT(plan.decisions[static_cast<size_t>(s)] == Decision::retain);
    plan.decisions[static_cast<size_t>(s)] = Decision::offload;
  }
  plan.optimizer_state = fam.offload.optimizer_state;
  plan.transfer = memo.transfer;
  if (plan.offloaded() > 0) {
    plan.offloads =
        offload_points(p, plan.decisions, plan.keep_chain, plan.regenerations, memo.transfer);
  }
  return plan;
}

Schedule dp_schedule(const Profile& p, const DpCache& memo, const DpCache::Point& pt) {
  if (pt.family == 0 && pt.cand < 0)
    return build_schedule(p, Decisions(p.saved.size(), Decision::retain));
  return plan_schedule(p, dp_point_plan(p, memo, pt));
}

namespace {}  // namespace

int64_t dp_lowest(const Simulator& sim, const PlanOptions& options) {
  const BudgetOf of = options.budget_of;
  const bool planned = options.planned_layout;
  DpCache& memo = dp_cache(sim, options);
  const bool cached = of == BudgetOf::reserved && !planned;
  if (cached && memo.lowest_reserved >= 0) return memo.lowest_reserved;
  // Each point's lowest budget is at least its allocated peak (a planned run: its requested
  // peak): the most aggressive first, and the search for each stops at the lowest found so far.
  auto floor_of = [&](const DpCache::Point& pt) {
    return planned ? pt.r.peak_requested : pt.r.peak_allocated;
  };
  std::vector<const DpCache::Point*> order;
  for (const DpCache::Point& pt : memo.points) order.push_back(&pt);
  std::stable_sort(order.begin(), order.end(),
                   [&](const DpCache::Point* a, const DpCache::Point* b) {
                     return floor_of(*a) < floor_of(*b);
                   });
  int64_t low = std::numeric_limits<int64_t>::max();
  for (const DpCache::Point* pt : order) {
    if (floor_of(*pt) >= low) break;
    low = std::min(low, lowest_fitting_budget(sim, dp_schedule(sim.profile(), memo, *pt), of,
                                              &pt->r, planned, low));
  }
  if (cached) memo.lowest_reserved = low;
  return low;
}

Plan plan_dp(const Simulator& sim, const Budget& budget, const PlanOptions& options) {
  REGEN_CHECK(options.chain != Chain::keep,
              "the dp policy decides what each regeneration restores itself; it takes no chain "
              "mode (got keep)");
  const BudgetOf of = options.budget_of;
  const bool planned = options.planned_layout;
  const Profile& p = sim.profile();
  Plan plan;
  plan.policy = "dp";
  plan.budget_text = budget.str();
  plan.budget_of = of;
  plan.keep_chain = false;
  const DpCache& memo = dp_cache(sim, options);
  const SimResult& none = memo.points.front().r;
  plan.no_remat_peak = peak_of(none, of);
  plan.budget_bytes = budget.resolve(peak_of(none, of));
  plan.lower_bound = memory_lower_bound(p, options.offload);
  using Point = DpCache::Point;
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
        const int64_t low = dp_lowest(sim, options);
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
  {
    Plan chosen_plan = dp_point_plan(p, memo, *best);
    plan.decisions = std::move(chosen_plan.decisions);
    plan.regenerations = std::move(chosen_plan.regenerations);
    plan.keep_chain = chosen_plan.keep_chain;
    plan.offloads = std::move(chosen_plan.offloads);
    plan.optimizer_state = chosen_plan.optimizer_state;
    plan.transfer = chosen_plan.transfer;
  }
  plan.predicted = std::move(chosen);
  plan.lowest_peak = lowest;
  plan.feasible = fits;
  if (planned) {
    ensure_planned_layout(sim, plan);
    plan.lowest_peak = std::min(plan.lowest_peak, peak_of(plan.predicted, of));
  }
  if (fits && of == BudgetOf::reserved) plan.limit = limit_for(plan.predicted, plan.budget_bytes);
  const DpCache::Family& fam = memo.families[static_cast<size_t>(best->family)];
  size_t yielded = 0;
  for (const DpCache::Family& f : memo.families) yielded += f.cands.size();
  plan.note = fam.note + "; the programme yields " + std::to_string(yielded) + " plans" +
              (memo.families.size() > 1
                   ? " over " + std::to_string(memo.families.size()) + " offload families"
                   : std::string()) +
              ", " + std::to_string(points.size() - 1) + " simulated";
  if (best->family > 0) plan.note += "; offloads: " + fam.offload.name;
  return plan;
}

PlannerInfo dp_planner() {
  PlannerInfo info;
  info.name = "dp";
  info.help =
      "dynamic programme over the chain of blocks (Rotor, Rockmate): the fastest plan that fits";
  info.plan = plan_dp;
  info.offloads = true;
  info.lowest = [](const Simulator& sim, const PlanOptions& options) {
    return plan_dp(sim, bytes_budget(dp_lowest(sim, options)), options);
  };
  return info;
}

}  // namespace regen
