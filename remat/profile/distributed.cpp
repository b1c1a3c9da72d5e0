// Profiles under mpirun (distributed.h).
#include "regen/remat/profile/distributed.h"

#include "regen/core/error.h"
#include "regen/dist/world.h"

namespace regen {

namespace {
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  }
};
}  // namespace

uint64_t profile_memory_fingerprint(const Profile& p) {
  Fnv f;
  for (const AllocatorState::SegmentRec& s : p.start_state.segments) {
    f.add(s.size);
    f.add(s.small);
    for (const BlockInfo& b : s.blocks) {
      f.add(b.offset);
      f.add(b.size);
      f.add(b.requested);
      f.add(b.allocated);
      f.add(static_cast<uint64_t>(b.category));
    }
  }
  for (const ProfileEvent& e : p.events) {
    f.add(static_cast<uint64_t>(e.kind));
    f.add(static_cast<uint64_t>(e.bytes));
    f.add(static_cast<uint64_t>(e.requested));
    f.add(static_cast<uint64_t>(e.category));
  }
  for (const Marker& m : p.markers) {
    f.add(static_cast<uint64_t>(m.kind));
    f.add(static_cast<uint64_t>(m.node));
    f.add(m.position);
  }
  return f.h;
}

Profile agree_on_profile(Profile mine) {
  dist::World& w = dist::world();
  if (!w.distributed()) return mine;
  const std::vector<int64_t> prints =
      w.all_gather(static_cast<int64_t>(profile_memory_fingerprint(mine)));
  const std::vector<int64_t> events = w.all_gather(static_cast<int64_t>(mine.events.size()));
  const std::vector<int64_t> peaks = w.all_gather(mine.peak_allocated);
  const std::vector<int64_t> reserved = w.all_gather(mine.peak_reserved);
  for (size_t r = 1; r < prints.size(); ++r) {
    if (prints[r] == prints[0]) continue;
    if (w.rank() != 0) w.barrier();  // rank 0 ends the job with the difference
    REGEN_FAIL("the profiled step of rank ", r, " of ", prints.size(),
               " made other allocations than rank 0's (", events[r], " allocator events, peak ",
               format_bytes(peaks[r]), " allocated and ", format_bytes(reserved[r]),
               " reserved, against ", events[0], ", ", format_bytes(peaks[0]), " and ",
               format_bytes(reserved[0]),
               "): the ranks do not run the same step, so no one plan predicts them all (do all "
               "ranks have the same device kind, threads and options?)");
  }
  const std::string text = w.broadcast(w.rank() == 0 ? profile_to_json(mine) : std::string(), 0);
  return parse_profile_json(text, "rank 0's profile");
}

}  // namespace regen
