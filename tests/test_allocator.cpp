// The caching allocator on the CPU and Null arenas (the shared suite is allocator_suite.h), the
// event log and its Chrome trace, and CPU-vs-Null determinism.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "tests/allocator_suite.h"

using namespace regen;
using namespace regen::testing;

namespace {
std::unique_ptr<Arena> cpu() { return make_cpu_arena(); }
std::unique_ptr<Arena> null() { return make_null_arena(); }
}  // namespace

TEST_CASE("allocator: rounding, splitting and coalescing (cpu, null)") {
  test_rounding_split_coalesce(cpu);
  test_rounding_split_coalesce(null);
}

TEST_CASE("allocator: statistics of a hand-computed sequence (cpu, null)") {
  test_hand_computed_stats(cpu);
  test_hand_computed_stats(null);
}

TEST_CASE("allocator: categories and tags come from RAII scopes (cpu, null)") {
  test_category_scopes(cpu);
  test_category_scopes(null);
}

TEST_CASE("allocator: hard limit and the OutOfMemory report (cpu, null)") {
  test_limit_and_oom(cpu);
  test_limit_and_oom(null);
}

TEST_CASE("allocator: randomized stress keeps blocks disjoint and stats exact (cpu)") {
  test_stress(cpu, /*touch_memory=*/true, 3000);
}

TEST_CASE("allocator: randomized stress keeps blocks disjoint and stats exact (null)") {
  test_stress(null, /*touch_memory=*/false, 3000);
}

TEST_CASE("allocator: a recorded sequence gives identical decisions on cpu and null arenas") {
  test_same_decisions(cpu, null);
}

TEST_CASE("allocator: null arena addresses are synthetic and never reused") {
  CachingAllocator a(make_null_arena());
  CHECK_FALSE(a.arena().touches_memory());
  Block* x = a.allocate(30 * MiB, Category::activation, 0);
  const uintptr_t first = reinterpret_cast<uintptr_t>(x->ptr());
  a.free(x);
  a.empty_cache();
  Block* y = a.allocate(30 * MiB, Category::activation, 0);
  CHECK(reinterpret_cast<uintptr_t>(y->ptr()) != first);
  a.free(y);
}

TEST_CASE("allocator: event log exports a Chrome trace with per-category counters") {
  CachingAllocator a(make_cpu_arena());
  a.set_event_log(true);
  Block* p = a.allocate(1000, Category::parameter, intern_tag("w\"eird\\tag"));
  Block* q = a.allocate(3 * MiB, Category::activation, intern_tag("act"));
  a.free(q);
  a.free(p);
  a.empty_cache();
  std::vector<MemoryEvent> ev = a.events();
  // segment_map, alloc, segment_map, alloc, free, free, segment_unmap x2
  REQUIRE(ev.size() == 8);
  CHECK(ev[0].kind == MemoryEventKind::segment_map);
  CHECK(ev[1].kind == MemoryEventKind::alloc);
  CHECK(ev[1].requested == 1000);
  CHECK(ev[1].bytes == 1024);
  CHECK(ev[1].category == Category::parameter);
  CHECK(ev[3].allocated_after == 1024 + 3 * MiB);
  CHECK(ev[4].kind == MemoryEventKind::free);
  CHECK(ev[4].block_id == ev[3].block_id);
  CHECK(ev[7].kind == MemoryEventKind::segment_unmap);
  for (size_t i = 0; i < ev.size(); ++i) CHECK(ev[i].seq == i);

  auto doc = nlohmann::json::parse(a.chrome_trace(true));
  int counters = 0, instants = 0;
  int64_t max_activation = 0;
  for (auto& e : doc["traceEvents"]) {
    if (e["ph"] == "C" && e["name"] == "allocated by category") {
      ++counters;
      max_activation = std::max<int64_t>(max_activation, e["args"]["activation"].get<int64_t>());
    }
    if (e["ph"] == "i") ++instants;
  }
  CHECK(counters == 4);
  CHECK(instants == 8);
  CHECK(max_activation == static_cast<int64_t>(3 * MiB));
  CHECK(a.chrome_trace(false).find("w\\\"eird\\\\tag") != std::string::npos);
}

TEST_CASE("allocator: zero-byte requests and double frees are errors") {
  CachingAllocator a(make_null_arena());
  CHECK_THROWS_AS(a.allocate(0, Category::other, 0), Error);
  Block* b = a.allocate(10, Category::other, 0);  // the head block of its segment survives frees
  a.free(b);
  CHECK_THROWS_AS(a.free(b), Error);
  CHECK(a.stats().live_blocks == 0);
}

TEST_CASE("allocator: the process-wide cpu allocator holds no live bytes after tensors die") {
  CachingAllocator& a = allocator_for(Device::cpu());
  const int64_t before = a.stats().allocated.current;
  {
    Tensor t = zeros({1024, 1024});
    Tensor u = t.reshape({1024 * 1024});
    Tensor v = ones({7});
    CHECK(a.stats().allocated.current > before);
  }
  CHECK(a.stats().allocated.current == before);
  CHECK(a.stats().live_blocks == 0);
}

TEST_CASE("allocator: a snapshot restored on the null arena continues with identical decisions") {
  const std::vector<Op> ops = random_sequence(2024, 3000);
  CachingAllocator real(make_cpu_arena());
  std::vector<Block*> live;
  const size_t half = ops.size() / 2;
  for (size_t i = 0; i < half; ++i) {
    if (ops[i].is_alloc) {
      live.push_back(real.allocate(ops[i].bytes, ops[i].category, 0));
    } else {
      real.free(live[ops[i].victim]);
      live.erase(live.begin() + static_cast<long>(ops[i].victim));
    }
  }
  real.reset_peak();
  const AllocatorState state = real.snapshot_state();
  CachingAllocator sim(make_null_arena());
  sim.restore_state(state);
  CHECK(sim.stats().allocated.current == real.stats().allocated.current);
  CHECK(sim.stats().reserved.current == real.stats().reserved.current);
  CHECK(sim.stats().live_blocks == real.stats().live_blocks);
  check_invariants(sim);
  // Continue on both: frees of blocks allocated before the snapshot go through their ids.
  std::vector<uint64_t> ids;
  for (Block* b : live) ids.push_back(b->id());
  real.set_event_log(true);
  sim.set_event_log(true);
  for (size_t i = half; i < ops.size(); ++i) {
    if (ops[i].is_alloc) {
      Block* a = real.allocate(ops[i].bytes, ops[i].category, 0);
      Block* b = sim.allocate(ops[i].bytes, ops[i].category, 0);
      REQUIRE(a->id() == b->id());
      ids.push_back(a->id());
    } else {
      const uint64_t id = ids[ops[i].victim];
      real.free(real.block_by_id(id));
      sim.free(sim.block_by_id(id));
      ids.erase(ids.begin() + static_cast<long>(ops[i].victim));
    }
  }
  const std::vector<MemoryEvent> er = real.events(), es = sim.events();
  REQUIRE(er.size() == es.size());
  for (size_t i = 0; i < er.size(); ++i) {
    REQUIRE(er[i].kind == es[i].kind);
    REQUIRE(er[i].segment_id == es[i].segment_id);
    REQUIRE(er[i].allocated_after == es[i].allocated_after);
    REQUIRE(er[i].reserved_after == es[i].reserved_after);
  }
  CHECK(sim.stats().allocated.peak == real.stats().allocated.peak);
  CHECK(sim.stats().reserved.peak == real.stats().reserved.peak);
  for (uint64_t id : ids) {
    real.free(real.block_by_id(id));
    sim.free(sim.block_by_id(id));
  }
  CHECK_THROWS_AS(sim.restore_state(state), Error);  // only into an empty allocator
}
