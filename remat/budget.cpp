// Budgets: parsing, what they bound, how a schedule is judged against one, and the lower bound
// no plan goes below (planner.h).
#include "regen/remat/planner.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <string>

#include "regen/core/error.h"
#include "regen/remat/layout.h"

namespace regen {

// ---- Budget -------------------------------------------------------------------------------------

Budget Budget::parse(const std::string& text) {
  Budget b;
  if (text.empty() || text == "none") return b;
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
    REGEN_CHECK(used == text.size() - 1 && v > 0 && v <= 100, "bad budget '", text,
                "': a percentage must be in (0, 100]");
    b.kind = Kind::fraction;
    b.value = v / 100.0;
    return b;
  }
  int64_t bytes = 0;
  try {
    bytes = parse_bytes(text);
  } catch (const Error& e) {
    REGEN_FAIL("bad budget '", text,
               "': expected bytes (2GiB, 1.5GB, 1048576) or a percentage of "
               "the no-remat peak (60%) (",
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

// ---- Lower bound ------------------------------------------------------------------------------

int64_t memory_lower_bound(const Profile& p) {
  int64_t persistent = 0;
  for (const AllocatorState::SegmentRec& s : p.start_state.segments) {
    for (const BlockInfo& b : s.blocks)
      persistent += b.allocated ? static_cast<int64_t>(b.size) : 0;
  }
  int64_t inputs = 0;
  for (const ProfileEvent& e : p.events) {
    if (e.kind == MemoryEventKind::alloc && e.category == Category::input) inputs += e.bytes;
  }
  // Each node's own peak allocation inside its forward or backward window.
  const NodeWindows w = node_windows(p);
  auto window_peak = [&](int64_t b, int64_t e) {
    int64_t cur = 0, peak = 0;
    for (int64_t i = b; b >= 0 && i < e; ++i) {
      const ProfileEvent& ev = p.events[static_cast<size_t>(i)];
      if (ev.kind == MemoryEventKind::alloc) cur += ev.bytes;
      if (ev.kind == MemoryEventKind::free) cur -= ev.bytes;
      peak = std::max(peak, cur);
    }
    return peak;
  };
  auto root_bytes = [&](int64_t v, std::set<int64_t>& seen) -> int64_t {
    if (v < 0) return 0;
    const ProfileValue& root = p.values[static_cast<size_t>(p.values[static_cast<size_t>(v)].root)];
    if (root.leaf || root.alloc_id == 0 || !seen.insert(root.id).second) return 0;
    return static_cast<int64_t>(CachingAllocator::round_size(root.bytes));
  };
  int64_t working = 0;
  for (const ProfileNode& n : p.nodes) {
    std::set<int64_t> seen;
    int64_t fwd = window_peak(w.fwd_begin[n.index], w.fwd_end[n.index]);
    for (int64_t in : n.inputs) fwd += root_bytes(in, seen);
    working = std::max(working, fwd);
    if (n.bwd_rank < 0) continue;
    std::set<int64_t> seen_b;
    int64_t bwd = window_peak(w.bwd_begin[n.index], w.bwd_end[n.index]);
    for (int64_t v : n.saved) bwd += root_bytes(v, seen_b);
    for (int k = 0; k < n.num_visible_outputs; ++k) {
      bwd += static_cast<int64_t>(
          CachingAllocator::round_size(p.values[static_cast<size_t>(n.outputs[k])].bytes));
    }
    working = std::max(working, bwd);
  }
  return persistent + inputs + working;
}

}  // namespace regen
