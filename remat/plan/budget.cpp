// Budgets: parsing, what they bound, how a schedule is judged against one, and the lower bound
// no plan goes below (planner.h).
#include "regen/remat/plan/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "regen/core/error.h"
#include "regen/remat/plan/layout.h"

namespace regen {

// ---- Budget -------------------------------------------------------------------------------------

Budget Budget::parse(const std::string& text) {
  Budget b;
  if (text.empty() || text == "none") return b;
  if (text == "lowest") {
    b.kind = Kind::lowest;
    return b;
  }
  if (text.back() == '%') {
    double v = 0;
    size_t used = 0;
    try {
      const std::string number = text.substr(0, text.size() - 1);
      if (number.find_first_not_of("0123456789.") == std::string::npos)
        v = std::stod(number, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    REGEN_CHECK(used == text.size() - 1, "bad budget '", text,
                "': a percentage is written as decimal digits (and a point) before the %, e.g. "
                "60% or 12.5%");
    REGEN_CHECK(v > 0 && v <= 100, "bad budget '", text, "': a percentage must be in (0, 100]");
    b.kind = Kind::fraction;
    b.value = v / 100.0;
    return b;
  }
  int64_t bytes = 0;
  try {
    bytes = parse_bytes(text);
  } catch (const Error& e) {
    REGEN_FAIL("bad budget '", text,
               "': expected bytes (2GiB, 1.5GB, 1048576), a percentage of "
               "the no-remat peak (60%) or lowest (",
               e.what(), ")");
  }
  REGEN_CHECK(bytes > 0, "bad budget '", text, "': must be positive");
  b.kind = Kind::bytes;
  b.value = static_cast<double>(bytes);
  return b;
}

std::string Budget::str() const {
  switch (kind) {
    case Kind::none:
      return "none";
    case Kind::bytes:
      return format_bytes(static_cast<int64_t>(value));
    case Kind::fraction: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%g%%", value * 100.0);
      return buf;
    }
    case Kind::lowest:
      return "lowest";
  }
  return "?";
}

int64_t Budget::resolve(int64_t no_remat_peak) const {
  switch (kind) {
    case Kind::none:
      return 0;
    case Kind::bytes:
      return static_cast<int64_t>(value);
    // At least one byte: a tiny percentage is a budget no plan meets, never no budget at all.
    case Kind::fraction:
      return std::max<int64_t>(1, static_cast<int64_t>(std::floor(value * no_remat_peak)));
    case Kind::lowest:
      REGEN_FAIL(
          "the budget 'lowest' is the lowest a policy meets: make_plan (regen plan, train, sweep) "
          "finds it with the planner; it is not a number of bytes by itself");
  }
  return 0;
}

const char* budget_of_name(BudgetOf of) {
  return of == BudgetOf::reserved ? "reserved" : "allocated";
}

BudgetOf parse_budget_of(const std::string& text) {
  if (text == "reserved") return BudgetOf::reserved;
  if (text == "allocated") return BudgetOf::allocated;
  REGEN_FAIL("unknown budget kind '", text,
             "': a budget bounds reserved bytes (what the device "
             "sees; the default) or allocated bytes");
}

int64_t peak_of(const SimResult& r, BudgetOf of) {
  return of == BudgetOf::reserved ? r.peak_reserved : r.peak_allocated;
}

PlanFit fit_schedule(const Simulator& sim, const Schedule& s, int64_t budget, BudgetOf of,
                     const SimResult* unlimited, bool planned_layout) {
  PlanFit f;
  if (planned_layout) {
    // Judged by the planned run itself, fitting or not (a planner's lowest peak is then the
    // lowest planned peak). Nothing is mapped during a planned step but the arena, so a run
    // whose reserved peak is within the budget runs the same under the limit; one past it would
    // not get its arena.
    f.layout = plan_layout(sim, s);
    SimOptions o;
    o.layout = f.layout;
    f.result = sim.run(s, o);
    f.fits = budget <= 0 || peak_of(f.result, of) <= budget;
    return f;
  }
  f.result = unlimited ? *unlimited : sim.run(s);
  if (budget <= 0) return f;
  if (of == BudgetOf::allocated) {
    f.fits = f.result.peak_allocated <= budget;
    return f;
  }
  if (f.result.peak_reserved <= budget) return f;  // the limit is never reached
  if (f.result.peak_allocated > budget) {
    f.fits = false;
    return f;
  }
  // The budget's own limit first, then lower ones (the header says why), spaced at least 2 MiB
  // apart (the allocator's segment granularity for large requests).
  const int64_t floor = f.result.peak_allocated;
  const int64_t step = std::max<int64_t>(int64_t{2} << 20, (budget - floor) / kLimitProbes);
  for (int64_t limit = budget, k = 0; k <= kLimitProbes && limit >= floor; limit -= step, ++k) {
    SimOptions o;
    o.limit = limit;
    SimResult limited = sim.run(s, o);
    if (!limited.oom && limited.peak_reserved <= budget) {
      f.result = std::move(limited);
      f.fits = true;
      return f;
    }
  }
  f.fits = false;
  return f;
}

int64_t lowest_fitting_budget(const Simulator& sim, const Schedule& s, BudgetOf of,
                              const SimResult* unlimited, bool planned_layout, int64_t below) {
  if (planned_layout) return peak_of(fit_schedule(sim, s, 0, of, nullptr, true).result, of);
  const SimResult r = unlimited ? *unlimited : sim.run(s);
  if (of == BudgetOf::allocated) return r.peak_allocated;
  // fit_schedule refuses a budget under the unlimited allocated peak before trying a limit, and
  // a limit at the unlimited reserved peak runs the step exactly as without one.
  const int64_t highest = r.peak_reserved;
  int64_t limit = r.peak_allocated;
  while (limit < highest) {
    if (below > 0 && limit >= below) return limit;
    SimOptions o;
    o.limit = limit;
    const SimResult at = sim.run(s, o);
    if (!at.oom && at.peak_reserved <= limit) return limit;
    if (at.next_limit <= limit) break;  // refused nothing: every higher limit runs it alike
    limit = at.next_limit;
  }
  return highest;
}

// ---- Lower bound ------------------------------------------------------------------------------

// Every plan replays the profiled iteration's events in order, with its evictions and regeneration
// programs inserted between them (remat/simulate/simulator.h), so at the point where the profiled
// run had made its first i events a plan's step holds at least:
//  - the blocks of the start state not freed yet, at their exact sizes (every run restores them);
//  - every block allocated by those events and not freed by them that no plan can evict (all but
//    the storages of candidate saved tensors; build_schedule refuses to evict anything else);
//  - the candidates that every plan must hold there: from their allocation to the end of the
//    forward op that last reads them (where an eviction happens at the earliest), and during the
//    backward window of each node that reads them (a regeneration restores them before it runs).
// A block holds at least its request rounded by the allocator, whatever the plan (the size the
// profiled run gave it can be more: a cached block is not split when 1 MiB or less would remain,
// and which block serves a request depends on the plan). The bound is the highest such level.
int64_t memory_lower_bound(const Profile& p, OffloadMode offload) {
  const size_t ne = p.events.size();
  std::vector<int64_t> delta(ne + 2, 0);  // per state i = 0..ne (after the first i events)
  auto hold = [&](int64_t from, int64_t to, int64_t bytes) {  // states [from, to]
    if (from > to) return;
    delta[static_cast<size_t>(from)] += bytes;
    delta[static_cast<size_t>(to) + 1] -= bytes;
  };
  std::unordered_map<uint64_t, int64_t> persistent;  // start-state block id -> size
  for (const AllocatorState::SegmentRec& s : p.start_state.segments) {
    for (const BlockInfo& b : s.blocks) {
      // Optimizer state a plan may keep on the host tier counts nothing (while the update
      // streams it through the device, some of it is there: left out, the bound stays a bound).
      if (b.allocated && !(offloads_optimizer(offload) && b.category == Category::optimizer_state))
        persistent[b.id] = static_cast<int64_t>(b.size);
    }
  }
  std::unordered_map<uint64_t, int32_t> candidate_of;  // storage block id -> candidate
  for (const ProfileSaved& s : p.saved) {
    const uint64_t id = p.values[static_cast<size_t>(s.value)].alloc_id;
    // An offloaded tensor is on the device at least where a recomputed one must be.
    if ((s.candidate || (offloads_activations(offload) && s.offloadable)) && id != 0)
      candidate_of[id] = s.index;
  }
  struct Alloc {
    int64_t at = -1, free_at = -1, bytes = 0;
  };
  std::unordered_map<uint64_t, Alloc> allocs;
  for (size_t i = 0; i < ne; ++i) {
    const ProfileEvent& e = p.events[i];
    if (e.kind == MemoryEventKind::alloc) {
      allocs[e.block_id] = {
          static_cast<int64_t>(i), -1,
          static_cast<int64_t>(CachingAllocator::round_size(static_cast<uint64_t>(e.requested)))};
    } else if (e.kind == MemoryEventKind::free) {
      auto it = allocs.find(e.block_id);
      if (it != allocs.end()) {
        it->second.free_at = static_cast<int64_t>(i);
      } else {
        auto pt = persistent.find(e.block_id);
        if (pt != persistent.end()) {
          hold(0, static_cast<int64_t>(i), pt->second);
          persistent.erase(pt);
        }
      }
    }
  }
  for (const auto& [id, bytes] : persistent) hold(0, static_cast<int64_t>(ne), bytes);
  const NodeWindows w = node_windows(p);
  for (const auto& [id, a] : allocs) {
    const int64_t last = a.free_at < 0 ? static_cast<int64_t>(ne) : a.free_at;
    auto c = candidate_of.find(id);
    if (c == candidate_of.end()) {
      hold(a.at + 1, last, a.bytes);
      continue;
    }
    const ProfileSaved& s = p.saved[static_cast<size_t>(c->second)];
    std::vector<std::pair<int64_t, int64_t>> spans;
    if (s.last_fwd_use >= 0)
      spans.push_back({a.at + 1, std::min(last, w.fwd_end[static_cast<size_t>(s.last_fwd_use)])});
    for (int32_t r : s.readers) {
      const int64_t b = w.bwd_begin[static_cast<size_t>(r)], e = w.bwd_end[static_cast<size_t>(r)];
      if (b >= 0 && e >= b) spans.push_back({std::max(b, a.at + 1), std::min(e, last)});
    }
    // One block: overlapping spans count it once.
    std::sort(spans.begin(), spans.end());
    int64_t from = -1, to = -2;
    for (const auto& [b, e] : spans) {
      if (b > to + 1) {
        hold(from, to, a.bytes);
        from = b;
      }
      to = std::max(to, e);
    }
    hold(from, to, a.bytes);
  }
  int64_t level = 0, bound = 0;
  for (size_t i = 0; i <= ne; ++i) {
    level += delta[i];
    bound = std::max(bound, level);
  }
  return bound;
}

}  // namespace regen
