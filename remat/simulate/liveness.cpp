// The profiled iteration's memory levels (liveness.h).
#include "regen/remat/simulate/liveness.h"

#include <algorithm>
#include <unordered_map>

#include "regen/core/error.h"

namespace regen {

int64_t Levels::max_rest(int64_t begin, int64_t end) const {
  REGEN_ASSERT(begin >= 0 && begin <= end && static_cast<size_t>(end) < allocated.size());
  int64_t m = rest(begin);
  for (int64_t i = begin + 1; i <= end; ++i) m = std::max(m, rest(i));
  return m;
}

int64_t Levels::own_peak(int64_t begin, int64_t end) const {
  REGEN_ASSERT(begin >= 0 && begin <= end && static_cast<size_t>(end) < allocated.size());
  int64_t m = 0;
  for (int64_t i = begin; i <= end; ++i) {
    m = std::max(m, allocated[static_cast<size_t>(i)] - allocated[static_cast<size_t>(begin)]);
  }
  return m;
}

Levels no_remat_levels(const Profile& p, const std::vector<char>& tracked) {
  REGEN_CHECK(tracked.size() == p.saved.size(), "no_remat_levels: ", tracked.size(), " flags for ",
              p.saved.size(), " saved tensors");
  const size_t ne = p.events.size(), ns = p.saved.size();
  Levels l;
  l.block_bytes.assign(ns, 0);
  l.alloc_at.assign(ns, -1);
  l.free_at.assign(ns, -1);
  std::unordered_map<uint64_t, int32_t> saved_of_block;
  for (size_t s = 0; s < ns; ++s) {
    const uint64_t id = p.values[static_cast<size_t>(p.saved[s].value)].alloc_id;
    if (id != 0) saved_of_block[id] = static_cast<int32_t>(s);
  }
  int64_t allocated = 0;
  for (const AllocatorState::SegmentRec& seg : p.start_state.segments) {
    for (const BlockInfo& b : seg.blocks)
      allocated += b.allocated ? static_cast<int64_t>(b.size) : 0;
  }
  int64_t live_tracked = 0;
  l.allocated.resize(ne + 1);
  l.tracked.resize(ne + 1);
  l.allocated[0] = allocated;
  l.tracked[0] = 0;
  for (size_t i = 0; i < ne; ++i) {
    const ProfileEvent& e = p.events[i];
    if (e.kind == MemoryEventKind::alloc || e.kind == MemoryEventKind::free) {
      const bool alloc = e.kind == MemoryEventKind::alloc;
      allocated += alloc ? e.bytes : -e.bytes;
      auto it = saved_of_block.find(e.block_id);
      if (it != saved_of_block.end()) {
        const size_t s = static_cast<size_t>(it->second);
        if (alloc) {
          l.alloc_at[s] = static_cast<int64_t>(i);
          l.block_bytes[s] = e.bytes;
        } else {
          l.free_at[s] = static_cast<int64_t>(i);
        }
        if (tracked[s]) live_tracked += alloc ? e.bytes : -e.bytes;
      }
    }
    l.allocated[i + 1] = allocated;
    l.tracked[i + 1] = live_tracked;
  }
  std::unordered_map<uint64_t, int64_t> block_size;
  for (const ProfileEvent& e : p.events) {
    if (e.kind == MemoryEventKind::alloc) block_size[e.block_id] = e.bytes;
  }
  l.value_block.assign(p.values.size(), 0);
  for (const ProfileValue& v : p.values) {
    const uint64_t id = p.values[static_cast<size_t>(v.root)].alloc_id;
    auto it = id ? block_size.find(id) : block_size.end();
    if (it != block_size.end()) l.value_block[static_cast<size_t>(v.id)] = it->second;
  }
  return l;
}

}  // namespace regen
