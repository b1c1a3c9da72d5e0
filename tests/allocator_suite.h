// Allocator tests shared by every arena: tests/test_allocator.cpp runs them on the CPU and Null
// arenas, tests/cuda/test_cuda_allocator.cpp on the CUDA arena. Each function takes a factory
// for a fresh arena so each check starts from an empty allocator.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "regen/core/allocator.h"
#include "regen/core/error.h"
#include "regen/remat/simulate/simulator.h"

namespace regen::testing {

using ArenaFactory = std::function<std::unique_ptr<Arena>()>;
constexpr uint64_t MiB = 1ull << 20;

// Checks that live blocks do not overlap and that the statistics equal sums over the blocks.
inline void check_invariants(const CachingAllocator& a) {
  std::vector<BlockInfo> blocks = a.snapshot();
  MemoryStats s = a.stats();
  int64_t allocated = 0, requested = 0, live = 0;
  std::array<int64_t, kNumCategories> by_cat{}, req_by_cat{};
  std::map<uint64_t, uint64_t> segment_bytes;
  for (const BlockInfo& b : blocks) {
    segment_bytes[b.segment_id] += b.size;
    if (!b.allocated) continue;
    allocated += static_cast<int64_t>(b.size);
    requested += static_cast<int64_t>(b.requested);
    by_cat[static_cast<int>(b.category)] += static_cast<int64_t>(b.size);
    req_by_cat[static_cast<int>(b.category)] += static_cast<int64_t>(b.requested);
    ++live;
  }
  int64_t reserved = 0;
  for (auto& kv : segment_bytes) reserved += static_cast<int64_t>(kv.second);
  REQUIRE(s.allocated.current == allocated);
  REQUIRE(s.requested.current == requested);
  REQUIRE(s.reserved.current == reserved);
  REQUIRE(s.live_blocks == live);
  int64_t reserved_by_sum = 0;
  for (int i = 0; i < kNumCategories; ++i) {
    REQUIRE(s.allocated_by[i].current == by_cat[i]);
    REQUIRE(s.requested_by[i].current == req_by_cat[i]);
    reserved_by_sum += s.reserved_by[i].current;
  }
  REQUIRE(reserved_by_sum == reserved);
  // Blocks tile each segment exactly, and no two blocks (live or free) overlap.
  std::sort(blocks.begin(), blocks.end(),
            [](const BlockInfo& x, const BlockInfo& y) { return x.address < y.address; });
  for (size_t i = 1; i < blocks.size(); ++i) {
    REQUIRE(blocks[i - 1].address + blocks[i - 1].size <= blocks[i].address);
  }
}

inline void test_rounding_split_coalesce(const ArenaFactory& make) {
  CachingAllocator a(make());
  CHECK(CachingAllocator::round_size(1) == 512);
  CHECK(CachingAllocator::round_size(512) == 512);
  CHECK(CachingAllocator::round_size(513) == 1024);
  CHECK(CachingAllocator::segment_size(512) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB) == 2 * MiB);
  CHECK(CachingAllocator::segment_size(MiB + 512) == 20 * MiB);
  CHECK(CachingAllocator::segment_size(10 * MiB) == 10 * MiB);
  CHECK(CachingAllocator::segment_size(11 * MiB + 1) == 12 * MiB);

  // Three small blocks carved from one 2 MiB segment, back to back.
  Block* x = a.allocate(100, Category::activation, 0);
  Block* y = a.allocate(600, Category::activation, 0);
  Block* z = a.allocate(1500, Category::activation, 0);
  CHECK(x->size == 512);
  CHECK(y->size == 1024);
  CHECK(z->size == 1536);
  CHECK(x->segment == y->segment);
  CHECK(y->offset == 512);
  CHECK(z->offset == 1536);
  CHECK(a.stats().reserved.current == static_cast<int64_t>(2 * MiB));
  check_invariants(a);
  // Freeing x leaves a hole; z merges with the free tail; freeing y merges everything.
  a.free(x);
  a.free(z);
  CHECK(a.snapshot().size() == 3);
  a.free(y);
  std::vector<BlockInfo> snap = a.snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].size == 2 * MiB);
  CHECK_FALSE(snap[0].allocated);
  check_invariants(a);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
  CHECK(a.snapshot().empty());

  // Large pool: a 3.5 MiB free hole serving 3 MiB is not split (remainder <= 1 MiB).
  Block* big = a.allocate(20 * MiB, Category::activation, 0);  // exactly one segment
  CHECK(big->size == 20 * MiB);
  a.free(big);
  Block* p = a.allocate(16 * MiB + 512 * 1024, Category::activation, 0);  // leaves 3.5 MiB
  Block* q = a.allocate(3 * MiB, Category::activation, 0);
  CHECK(q->segment == p->segment);
  CHECK(q->size == 3 * MiB + 512 * 1024);
  CHECK(q->requested == 3 * MiB);
  CHECK(a.stats().allocated.current == static_cast<int64_t>(20 * MiB));
  CHECK(a.stats().requested.current == static_cast<int64_t>(19 * MiB + 512 * 1024));
  check_invariants(a);
  a.free(p);
  a.free(q);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
}

// A hand-computed sequence: every statistic below is worked out in the comments.
inline void test_hand_computed_stats(const ArenaFactory& make) {
  CachingAllocator a(make());
  Block* b1 = a.allocate(1000, Category::activation, 0);    // 1024 in a new 2 MiB segment
  Block* b2 = a.allocate(3 * MiB, Category::parameter, 0);  // 3 MiB in a new 20 MiB segment
  Block* b3 = a.allocate(200, Category::gradient, 0);       // 512 after b1
  MemoryStats s = a.stats();
  CHECK(s.requested.current == 1000 + 3 * MiB + 200);
  CHECK(s.allocated.current == 1024 + 3 * MiB + 512);
  CHECK(s.reserved.current == 22 * MiB);
  CHECK(s.reserved_by[static_cast<int>(Category::activation)].current == 2 * MiB);
  CHECK(s.reserved_by[static_cast<int>(Category::parameter)].current == 20 * MiB);
  CHECK(s.num_segment_maps == 2);
  a.free(b1);
  Block* b4 = a.allocate(700, Category::workspace, 0);  // reuses b1's 1024 hole exactly
  CHECK(b4->segment == b3->segment);
  CHECK(b4->offset == 0);
  CHECK(a.stats().num_segment_maps == 2);
  // 12 MiB fits the 17 MiB left in b2's segment: best fit splits it, no new segment.
  Block* b6 = a.allocate(12 * MiB, Category::activation, 0);
  CHECK(b6->segment == b2->segment);
  CHECK(a.stats().reserved.current == 22 * MiB);
  a.free(b6);
  // 18 MiB does not fit anywhere: its own segment of 18 MiB (>= 10 MiB rounds to 2 MiB).
  Block* b5 = a.allocate(18 * MiB, Category::activation, 0);
  s = a.stats();
  CHECK(s.reserved.current == 40 * MiB);
  CHECK(s.allocated.current == 1024 + 3 * MiB + 512 + 18 * MiB);
  CHECK(s.allocated.peak == 1024 + 3 * MiB + 512 + 18 * MiB);
  CHECK(s.allocated_by[static_cast<int>(Category::activation)].current == 18 * MiB);
  CHECK(s.allocated_by[static_cast<int>(Category::activation)].peak == 18 * MiB);
  CHECK(s.allocated_by[static_cast<int>(Category::workspace)].current == 1024);
  CHECK(s.allocated_by_at_peak[static_cast<int>(Category::parameter)] == 3 * MiB);
  a.free(b5);
  s = a.stats();
  CHECK(s.reserved.current == 40 * MiB);  // cached, not returned
  CHECK(s.allocated.current == 1024 + 3 * MiB + 512);
  CHECK(s.allocated.peak == 1024 + 3 * MiB + 512 + 18 * MiB);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 22 * MiB);  // b2's and b3's segments stay
  a.reset_peak();
  s = a.stats();
  CHECK(s.allocated.peak == s.allocated.current);
  CHECK(s.reserved.peak == 22 * MiB);
  check_invariants(a);
  a.free(b2);
  a.free(b3);
  a.free(b4);
  s = a.stats();
  CHECK(s.allocated.current == 0);
  CHECK(s.requested.current == 0);
  CHECK(s.num_allocs == 6);
  CHECK(s.num_frees == 6);
  CHECK(s.live_blocks == 0);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
}

inline void test_category_scopes(const ArenaFactory& make) {
  CachingAllocator a(make());
  Block* p;
  Block* q;
  {
    CategoryScope cat(Category::optimizer_state);
    TagScope tag("adam.exp_avg");
    p = a.allocate(4096);
    {
      CategoryScope inner(Category::workspace);
      q = a.allocate(4096);
    }
  }
  CHECK(p->category == Category::optimizer_state);
  CHECK(tag_name(p->tag) == "adam.exp_avg");
  CHECK(q->category == Category::workspace);
  CHECK(tag_name(q->tag) == "adam.exp_avg");
  Block* r = a.allocate(4096);
  CHECK(r->category == Category::other);
  CHECK(r->tag == 0);
  MemoryStats s = a.stats();
  CHECK(s.allocated_by[static_cast<int>(Category::optimizer_state)].current == 4096);
  CHECK(s.allocated_by[static_cast<int>(Category::workspace)].current == 4096);
  CHECK(s.allocated_by[static_cast<int>(Category::other)].current == 4096);
  a.free(p);
  a.free(q);
  a.free(r);
}

inline void test_limit_and_oom(const ArenaFactory& make) {
  CachingAllocator a(make());
  a.set_limit(static_cast<int64_t>(30 * MiB));
  Block* x = a.allocate(12 * MiB, Category::activation, intern_tag("layer1.conv1:out"));
  Block* y = a.allocate(12 * MiB, Category::parameter, intern_tag("fc.weight"));
  a.free(y);  // cached: reserved stays 24 MiB
  // 14 MiB needs a new segment: 24 + 14 > 30, so the cache is emptied and the request fits.
  Block* z = a.allocate(14 * MiB, Category::activation, 0);
  CHECK(a.stats().num_cache_flushes == 1);
  CHECK(a.stats().reserved.current == 26 * MiB);
  // 8 MiB more cannot fit under 30 MiB even with an empty cache.
  bool thrown = false;
  try {
    a.allocate(8 * MiB, Category::workspace, intern_tag("conv.workspace"));
  } catch (const OutOfMemory& e) {
    thrown = true;
    const std::string msg = e.what();
    CHECK(msg.find("out of memory") != std::string::npos);
    CHECK(msg.find("8.00 MiB") != std::string::npos);
    CHECK(msg.find("workspace") != std::string::npos);
    CHECK(msg.find("conv.workspace") != std::string::npos);
    CHECK(msg.find("limit 30.00 MiB") != std::string::npos);
    CHECK(msg.find("activation 26.00 MiB") != std::string::npos);
    CHECK(msg.find("layer1.conv1:out") != std::string::npos);
  }
  CHECK(thrown);
  // The failed request changed nothing.
  CHECK(a.stats().allocated.current == static_cast<int64_t>(26 * MiB));
  check_invariants(a);
  a.free(x);
  a.free(z);
  a.set_limit(0);

  // Nothing allocated or reserved: the report says so rather than printing empty lists.
  CachingAllocator empty(make());
  empty.set_limit(static_cast<int64_t>(MiB));
  thrown = false;
  try {
    empty.allocate(1000, Category::activation, 0);
  } catch (const OutOfMemory& e) {
    thrown = true;
    const std::string msg = e.what();
    CHECK(msg.find("allocated by category: none") != std::string::npos);
    CHECK(msg.find("reserved by category: none") != std::string::npos);
    CHECK(msg.find("largest live blocks: none") != std::string::npos);
  }
  CHECK(thrown);
}

// A medium request normally maps a 20 MiB segment; when that would pass the limit it falls back
// to the smallest segment that holds it (the request rounded to 2 MiB), and only then empties the
// cache; worked out step by step below.
inline void test_limit_fallback(const ArenaFactory& make) {
  CachingAllocator a(make());
  a.set_limit(static_cast<int64_t>(30 * MiB));
  Block* x = a.allocate(12 * MiB, Category::parameter, 0);  // own 12 MiB segment
  // 12 + 20 > 30, but 12 + 2 fits: a 2 MiB segment, no cache flush.
  Block* y = a.allocate(2 * MiB, Category::activation, 0);
  CHECK(y->size == 2 * MiB);
  CHECK(a.stats().reserved.current == static_cast<int64_t>(14 * MiB));
  CHECK(a.stats().num_segment_maps == 2);
  CHECK(a.stats().num_cache_flushes == 0);
  // 3 MiB + 1: 14 + 20 > 30; the smallest segment is 4 MiB. The rest, 1 MiB - 512 B, is not
  // worth a block in the large pool, so the whole 4 MiB is handed out.
  Block* z = a.allocate(3 * MiB + 1, Category::activation, 0);
  CHECK(z->segment != y->segment);
  CHECK(a.stats().reserved.current == static_cast<int64_t>(18 * MiB));
  CHECK(z->size == 4 * MiB);
  check_invariants(a);
  // Freed, y's segment stays cached. 13 MiB needs its own 14 MiB segment: 18 + 14 > 30 and there
  // is nothing smaller, so the cache is emptied (y's 2 MiB) and 16 + 14 = 30 fits exactly.
  a.free(y);
  Block* w = a.allocate(13 * MiB, Category::activation, 0);
  CHECK(a.stats().num_cache_flushes == 1);
  CHECK(a.stats().reserved.current == static_cast<int64_t>(30 * MiB));
  // With no room left even for 2 MiB, the request fails and changes nothing.
  CHECK_THROWS_AS(a.allocate(600 * 1024, Category::activation, 0), OutOfMemory);
  CHECK(a.stats().reserved.current == static_cast<int64_t>(30 * MiB));
  check_invariants(a);
  // Without a limit the same medium request takes the normal 20 MiB segment.
  a.set_limit(0);
  Block* v = a.allocate(2 * MiB, Category::activation, 0);
  CHECK(a.stats().reserved.current == static_cast<int64_t>(50 * MiB));
  for (Block* b : {x, z, w, v}) a.free(b);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
}

// free() checks its argument against the live blocks before reading it: a second free of a
// block that coalescing deleted (a use-after-free before), or a block of another allocator, is a
// regen::Error naming the handle, and nothing changes.
inline void test_bad_frees(const ArenaFactory& make) {
  CachingAllocator a(make());
  Block* head = a.allocate(1000, Category::activation, 0);
  Block* mid = a.allocate(1000, Category::activation, 0);  // not the segment's head
  Block* keep = a.allocate(1000, Category::activation, 0);
  REQUIRE(mid->offset == 1024);
  a.free(head);
  a.free(mid);  // merges into head's free block: the Block object `mid` is deleted
  const MemoryStats before = a.stats();
  bool thrown = false;
  try {
    a.free(mid);
  } catch (const Error& e) {
    thrown = true;
    char handle[32];
    std::snprintf(handle, sizeof handle, "%p", static_cast<const void*>(mid));
    CHECK(std::string(e.what()).find(handle) != std::string::npos);
    CHECK(std::string(e.what()).find("not a live block") != std::string::npos);
  }
  CHECK(thrown);
  CHECK_THROWS_AS(a.free(head), Error);  // the head survives the merge, but it is free
  CHECK(a.stats().live_blocks == before.live_blocks);
  CHECK(a.stats().num_frees == before.num_frees);
  check_invariants(a);
  // A block of another allocator (or a made-up one) is refused before it is read.
  CachingAllocator other(make());
  Block* foreign = other.allocate(1000, Category::activation, 0);
  CHECK_THROWS_AS(a.free(foreign), Error);
  Block fake;
  fake.allocated = true;  // would have passed the old check and corrupted the statistics
  CHECK_THROWS_AS(a.free(&fake), Error);
  CHECK(a.stats().allocated.current == before.allocated.current);
  check_invariants(a);
  other.free(foreign);
  a.free(keep);
  CHECK(a.stats().live_blocks == 0);
}

// Requests too large to round: rejected with OutOfMemory naming the size, before any rounding
// (which wrapped ~0 - 10 to a block of 0 bytes).
inline void test_max_request(const ArenaFactory& make) {
  CachingAllocator a(make());
  const uint64_t huge = ~0ull - 10;
  bool thrown = false;
  try {
    a.allocate(huge, Category::workspace, intern_tag("im2col"));
  } catch (const OutOfMemory& e) {
    thrown = true;
    const std::string msg = e.what();
    CHECK(msg.find("18446744073709551605") != std::string::npos);
    CHECK(msg.find("workspace") != std::string::npos);
    CHECK(msg.find("im2col") != std::string::npos);
    CHECK(msg.find("256.00 TiB") != std::string::npos);
  }
  CHECK(thrown);
  CHECK_THROWS_AS(a.allocate(CachingAllocator::kMaxRequestSize + 1, Category::other, 0),
                  OutOfMemory);
  CHECK_THROWS_AS(CachingAllocator::round_size(huge), Error);
  CHECK(CachingAllocator::round_size(CachingAllocator::kMaxRequestSize) ==
        CachingAllocator::kMaxRequestSize);
  const MemoryStats s = a.stats();
  CHECK(s.num_allocs == 0);
  CHECK(s.reserved.current == 0);
}

// A recorded sequence of requests, replayable on any allocator.
struct Op {
  bool is_alloc;
  uint64_t bytes;  // alloc
  size_t victim;   // free: index into the list of live allocations
  Category category;
};

// The requests of a recorded allocator sequence (Op, above), as the simulator and the layout
// planner take them: positions count allocations and frees; blocks still live at the end live to
// the end.
inline std::vector<SimOptions::Request> requests_of(const std::vector<Op>& ops) {
  std::vector<SimOptions::Request> rq;
  std::vector<size_t> live;  // request index of each live allocation, in the ops' order
  int64_t clock = 0;
  for (const Op& op : ops) {
    if (op.is_alloc) {
      live.push_back(rq.size());
      rq.push_back({CachingAllocator::round_size(op.bytes), clock, -1});
    } else {
      rq[live[op.victim]].end = clock;
      live.erase(live.begin() + static_cast<long>(op.victim));
    }
    ++clock;
  }
  return rq;
}

inline std::vector<Op> random_sequence(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<Op> ops;
  size_t live = 0;
  for (int i = 0; i < n; ++i) {
    const bool alloc = live == 0 || (rng() % 100) < 55;
    Op op{alloc, 0, 0, static_cast<Category>(rng() % kNumCategories)};
    if (alloc) {
      const uint64_t r = rng() % 100;
      if (r < 60)
        op.bytes = 1 + rng() % (64 * 1024);  // small
      else if (r < 85)
        op.bytes = 1 + rng() % (2 * MiB);  // around the pool boundary
      else if (r < 97)
        op.bytes = MiB + rng() % (9 * MiB);  // large, shared segments
      else
        op.bytes = 10 * MiB + rng() % (20 * MiB);  // large, own segments
      ++live;
    } else {
      op.victim = static_cast<size_t>(rng() % live);
      --live;
    }
    ops.push_back(op);
  }
  return ops;
}

// A byte pattern from the block's id written over its requested bytes, and read back (first,
// middle, last byte) before it is freed: a block that shared bytes with another shows it.
inline void fill_block(Block* b, uint64_t bytes) {
  std::memset(b->ptr(), static_cast<int>(b->id() & 0xff), bytes);
}
inline void check_block(const Block* b) {
  const unsigned char* p = static_cast<const unsigned char*>(b->ptr());
  const unsigned char want = static_cast<unsigned char>(b->id() & 0xff);
  REQUIRE(p[0] == want);
  REQUIRE(p[b->requested - 1] == want);
  REQUIRE(p[b->requested / 2] == want);
}

// Replays ops; optionally checks invariants after every step and writes/verifies a byte pattern
// in each live block (only on arenas that touch memory).
inline void replay(CachingAllocator& a, const std::vector<Op>& ops, bool check_each_step,
                   bool touch_memory) {
  std::vector<Block*> live;
  for (const Op& op : ops) {
    if (op.is_alloc) {
      Block* b = a.allocate(op.bytes, op.category, 0);
      if (touch_memory) fill_block(b, op.bytes);
      live.push_back(b);
    } else {
      Block* b = live[op.victim];
      if (touch_memory) check_block(b);
      a.free(b);
      live.erase(live.begin() + static_cast<long>(op.victim));
    }
    if (check_each_step) check_invariants(a);
  }
  for (Block* b : live) a.free(b);
}

inline void test_stress(const ArenaFactory& make, bool touch_memory, int n) {
  CachingAllocator a(make());
  replay(a, random_sequence(1234, n), true, touch_memory);
  CHECK(a.stats().allocated.current == 0);
  CHECK(a.stats().live_blocks == 0);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
}

// Replays ops under a hard limit: a request that throws OutOfMemory leaves a null entry (its later
// free is a no-op), so the sequence stays aligned. Returns the number of OutOfMemory errors.
inline int replay_under_limit(CachingAllocator& a, const std::vector<Op>& ops) {
  std::vector<Block*> live;
  int ooms = 0;
  for (const Op& op : ops) {
    if (op.is_alloc) {
      Block* b = nullptr;
      try {
        b = a.allocate(op.bytes, op.category, 0);
      } catch (const OutOfMemory&) {
        ++ooms;
      }
      live.push_back(b);
    } else {
      a.free(live[op.victim]);
      live.erase(live.begin() + static_cast<long>(op.victim));
    }
  }
  for (Block* b : live) a.free(b);
  return ooms;
}

// The limit's fallback segments and cache flushes are decided alike on every arena.
inline void test_same_decisions_under_limit(const ArenaFactory& make_a,
                                            const ArenaFactory& make_b) {
  // Seed and limit chosen so that fallback segments, cache flushes and OutOfMemory all occur.
  const std::vector<Op> ops = random_sequence(99, 3000);
  CachingAllocator a(make_a()), b(make_b());
  for (CachingAllocator* x : {&a, &b}) {
    x->set_limit(static_cast<int64_t>(64 * MiB));
    x->set_event_log(true);
  }
  const int ooms_a = replay_under_limit(a, ops), ooms_b = replay_under_limit(b, ops);
  CHECK(ooms_a == ooms_b);
  CHECK(ooms_a > 0);
  const MemoryStats sa = a.stats(), sb = b.stats();
  CHECK(sa.num_cache_flushes == sb.num_cache_flushes);
  CHECK(sa.num_cache_flushes > 0);
  CHECK(sa.allocated.peak == sb.allocated.peak);
  CHECK(sa.reserved.peak == sb.reserved.peak);
  CHECK(sa.reserved.peak <= static_cast<int64_t>(64 * MiB));
  const std::vector<MemoryEvent> ea = a.events(), eb = b.events();
  REQUIRE(ea.size() == eb.size());
  int fallback_segments = 0;  // 4, 6 or 8 MiB: only the fallback maps these
  for (size_t i = 0; i < ea.size(); ++i) {
    REQUIRE(ea[i].kind == eb[i].kind);
    REQUIRE(ea[i].bytes == eb[i].bytes);
    REQUIRE(ea[i].segment_id == eb[i].segment_id);
    REQUIRE(ea[i].reserved_after == eb[i].reserved_after);
    const int64_t mib = ea[i].bytes / static_cast<int64_t>(MiB);
    if (ea[i].kind == MemoryEventKind::segment_map && (mib == 4 || mib == 6 || mib == 8)) {
      ++fallback_segments;
    }
  }
  CHECK(fallback_segments > 0);
}

// The same sequence on two arenas gives the same decisions, event log and statistics.
inline void test_same_decisions(const ArenaFactory& make_a, const ArenaFactory& make_b) {
  const std::vector<Op> ops = random_sequence(99, 4000);
  CachingAllocator a(make_a()), b(make_b());
  a.set_event_log(true);
  b.set_event_log(true);
  replay(a, ops, false, false);
  replay(b, ops, false, false);
  MemoryStats sa = a.stats(), sb = b.stats();
  CHECK(sa.allocated.peak == sb.allocated.peak);
  CHECK(sa.reserved.peak == sb.reserved.peak);
  CHECK(sa.requested.peak == sb.requested.peak);
  CHECK(sa.num_segment_maps == sb.num_segment_maps);
  for (int i = 0; i < kNumCategories; ++i) {
    CHECK(sa.allocated_by[i].peak == sb.allocated_by[i].peak);
    CHECK(sa.reserved_by[i].peak == sb.reserved_by[i].peak);
  }
  std::vector<MemoryEvent> ea = a.events(), eb = b.events();
  REQUIRE(ea.size() == eb.size());
  for (size_t i = 0; i < ea.size(); ++i) {
    REQUIRE(ea[i].kind == eb[i].kind);
    REQUIRE(ea[i].bytes == eb[i].bytes);
    REQUIRE(ea[i].segment_id == eb[i].segment_id);
    REQUIRE(ea[i].block_id == eb[i].block_id);
    REQUIRE(ea[i].allocated_after == eb[i].allocated_after);
    REQUIRE(ea[i].reserved_after == eb[i].reserved_after);
  }
  std::vector<BlockInfo> na = a.snapshot(), nb = b.snapshot();
  REQUIRE(na.size() == nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    CHECK(na[i].segment_id == nb[i].segment_id);
    CHECK(na[i].offset == nb[i].offset);
    CHECK(na[i].size == nb[i].size);
  }
}

}  // namespace regen::testing
