// The planned layout of a step (layout.h).
#include "regen/remat/plan/layout.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "regen/core/error.h"

namespace regen {

namespace {

int64_t end_of(const SimOptions::Request& r) {
  return r.end < 0 ? std::numeric_limits<int64_t>::max() : r.end;
}

}  // namespace

int64_t live_peak(const std::vector<SimOptions::Request>& requests) {
  // Sweep the begins and ends in time order (a free at t happens before a request at t).
  std::vector<std::pair<int64_t, int64_t>> changes;  // (time, +bytes / -bytes)
  changes.reserve(2 * requests.size());
  for (const SimOptions::Request& r : requests) {
    changes.push_back({r.begin, static_cast<int64_t>(r.rounded)});
    if (r.end >= 0) changes.push_back({r.end, -static_cast<int64_t>(r.rounded)});
  }
  std::sort(changes.begin(), changes.end());
  int64_t live = 0, peak = 0;
  for (const auto& c : changes) {
    live += c.second;
    peak = std::max(peak, live);
  }
  return peak;
}

namespace {

// One greedy placement: the requests in `order`, each in the first place that overlaps no block
// placed before it whose lifetime overlaps its own: at the lowest such offset of the smallest
// hole that has one, else of the arena, which grows to hold it.
PlannedLayout place_in_order(const std::vector<SimOptions::Request>& requests,
                             const std::vector<uint64_t>& holes, const std::vector<size_t>& order) {
  const size_t n = requests.size();
  PlannedLayout layout;
  layout.holes = holes;
  layout.rounded.resize(n);
  layout.offset.assign(n, 0);
  layout.bin.assign(n, -1);
  std::vector<int32_t> bins(holes.size());
  std::iota(bins.begin(), bins.end(), 0);
  std::stable_sort(bins.begin(), bins.end(), [&](int32_t a, int32_t b) {
    return holes[static_cast<size_t>(a)] < holes[static_cast<size_t>(b)];
  });
  bins.push_back(-1);
  std::vector<std::vector<size_t>> placed(holes.size() + 1);  // per bin, by offset
  int64_t size = 0;
  for (size_t i : order) {
    const SimOptions::Request& r = requests[i];
    const int64_t b = r.begin, e = end_of(r);
    for (int32_t bin : bins) {
      const uint64_t room = bin < 0 ? UINT64_MAX : holes[static_cast<size_t>(bin)];
      if (r.rounded > room) continue;
      std::vector<size_t>& in = placed[bin < 0 ? holes.size() : static_cast<size_t>(bin)];
      uint64_t at = 0;
      for (size_t j : in) {
        const SimOptions::Request& q = requests[j];
        if (!(q.begin < e && b < end_of(q))) continue;  // not alive at the same time
        if (at + r.rounded <= layout.offset[j]) break;  // fits below this one
        at = std::max(at, layout.offset[j] + q.rounded);
      }
      if (at + r.rounded > room) continue;
      layout.rounded[i] = r.rounded;
      layout.offset[i] = at;
      layout.bin[i] = bin;
      if (bin < 0) size = std::max(size, static_cast<int64_t>(at + r.rounded));
      const auto pos = std::upper_bound(
          in.begin(), in.end(), at, [&](uint64_t off, size_t j) { return off < layout.offset[j]; });
      in.insert(pos, i);
      break;
    }
  }
  layout.size = size;  // 0: the holes hold the whole step, no arena
  return layout;
}

}  // namespace

PlannedLayout place_requests(const std::vector<SimOptions::Request>& requests,
                             const std::vector<uint64_t>& holes) {
  const size_t n = requests.size();
  for (size_t i = 0; i < n; ++i) {
    const SimOptions::Request& r = requests[i];
    REGEN_CHECK(r.rounded > 0 && r.rounded % CachingAllocator::kMinBlockSize == 0,
                "planned layout: request ", i, " has ", r.rounded, " bytes, not a rounded size");
  }
  auto life = [&](size_t i) { return end_of(requests[i]) - requests[i].begin; };
  // Orders to try; ties go to the larger, then the longer-lived, then the earlier request.
  auto tie = [&](size_t a, size_t b) {
    const SimOptions::Request &x = requests[a], &y = requests[b];
    if (x.rounded != y.rounded) return x.rounded > y.rounded;
    if (life(a) != life(b)) return life(a) > life(b);
    return x.begin < y.begin;
  };
  const std::vector<std::function<bool(size_t, size_t)>> orders = {
      tie,                       // the largest first
      [&](size_t a, size_t b) {  // the longest-lived first
        return life(a) != life(b) ? life(a) > life(b) : tie(a, b);
      },
      [&](size_t a, size_t b) {  // the most bytes x time first
        const long double x = static_cast<long double>(requests[a].rounded) *
                              static_cast<long double>(std::min<int64_t>(life(a), INT64_MAX / 4));
        const long double y = static_cast<long double>(requests[b].rounded) *
                              static_cast<long double>(std::min<int64_t>(life(b), INT64_MAX / 4));
        return x != y ? x > y : tie(a, b);
      },
      [&](size_t a, size_t b) {  // in the order they are made (what the caching allocator sees)
        return requests[a].begin != requests[b].begin ? requests[a].begin < requests[b].begin
                                                      : tie(a, b);
      },
  };
  PlannedLayout best;
  bool have = false;
  for (const auto& less : orders) {
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), less);
    PlannedLayout l = place_in_order(requests, holes, order);
    if (!have || l.size < best.size) best = std::move(l);
    have = true;
  }
  return best;
}

std::vector<uint64_t> layout_holes(const AllocatorState& state) {
  std::vector<uint64_t> holes;
  for (const AllocatorState::SegmentRec& seg : state.segments) {
    // A segment that is one free block is released when the layout is installed.
    if (seg.blocks.size() == 1 && !seg.blocks[0].allocated) continue;
    for (const BlockInfo& b : seg.blocks) {
      if (!b.allocated) holes.push_back(b.size);
    }
  }
  return holes;
}

std::shared_ptr<const PlannedLayout> plan_layout(const Simulator& sim, const Schedule& s,
                                                 int64_t* peak) {
  std::vector<SimOptions::Request> requests;
  std::vector<uint64_t> holes;  // the profile's start, less the optimizer state a plan moves out
  SimOptions o;
  o.requests = &requests;
  o.start_holes = &holes;
  sim.run(s, o);
  if (peak) *peak = live_peak(requests);
  return std::make_shared<const PlannedLayout>(place_requests(requests, holes));
}

}  // namespace regen
