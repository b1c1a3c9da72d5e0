// The "mutwo" planner: the recomputation branch of mu-TWO's Algorithm B, after Capuchin: greedy by
// recompute ratio = bytes / (recompute time x times recomputed), with sources, times and counts
// updated after every pick (docs/remat.md). The plan is the shortest prefix of the picks whose
// simulated peak fits (plan_prefix), in both chain modes unless one is asked for
// (in_both_chain_modes). Tests: tests/test_remat.cpp (the counts on a hand-made chain).
#include <algorithm>
#include <functional>
#include <limits>
#include <set>

#include "regen/remat/plan/planner_parts.h"
#include "regen/remat/plan/planners/builtin.h"

namespace regen {

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

// The greedy order, computed once per cache.
const std::vector<MutwoPick>& picks_of(const Simulator& sim, const PlanOptions& options) {
  PlanCache& cache = cache_for(sim, options);
  if (!cache.mutwo_picks) cache.mutwo_picks = mutwo_picks(sim.profile());
  return *cache.mutwo_picks;
}

PrefixPolicy mutwo_order(const Profile& p, const std::vector<MutwoPick>& picks) {
  PrefixPolicy order;
  order.n = picks.size();
  order.make = [&p, &picks](size_t k) {
    std::vector<Decision> d(p.saved.size(), Decision::retain);
    for (size_t i = 0; i < k && i < picks.size(); ++i)
      d[static_cast<size_t>(picks[i].saved)] = Decision::recompute;
    return d;
  };
  order.what = "recomputes the first";
  order.unit = "greedy picks";
  return order;
}

// In the chain mode options.chain says (keep or drop).
Plan plan_mutwo(const Simulator& sim, const Budget& budget, const PlanOptions& options) {
  Plan plan = plan_prefix(sim, budget, options, options.chain != Chain::drop,
                          mutwo_order(sim.profile(), picks_of(sim, options)));
  plan.policy = "mutwo";
  return plan;
}

}  // namespace

PlannerInfo mutwo_planner() {
  PlannerInfo info;
  info.name = "mutwo";
  info.help = "mu-TWO's greedy recomputation by bytes per recompute time";
  info.plan = in_both_chain_modes(plan_mutwo);
  info.lowest = lowest_in_both_chain_modes(
      [](const Simulator& sim, const PlanOptions& options) {
        return prefix_lowest(sim, options, options.chain != Chain::drop,
                             mutwo_order(sim.profile(), picks_of(sim, options)));
      },
      plan_mutwo);
  return info;
}

}  // namespace regen
