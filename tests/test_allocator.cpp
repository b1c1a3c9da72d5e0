// The caching allocator on the CPU, Null and direct arenas (the shared suite is
// allocator_suite.h), the event log and its Chrome trace, CPU-vs-Null-vs-direct determinism, the
// direct mode's own mappings, and the process-wide allocators' shutdown check.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "regen/core/tensor.h"
#include "regen/remat/plan/layout.h"
#include "tests/allocator_suite.h"

#if defined(__SANITIZE_ADDRESS__)
#define REGEN_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define REGEN_TEST_ASAN 1
#endif
#endif
#ifdef REGEN_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

using namespace regen;
using namespace regen::testing;

namespace {
std::unique_ptr<Arena> cpu() {
  return make_cpu_arena();
}
std::unique_ptr<Arena> null() {
  return make_null_arena();
}
std::unique_ptr<Arena> direct() {
  return make_direct_arena(Device::cpu());
}
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

TEST_CASE("allocator: under a limit, a medium request takes a smaller segment (cpu, null)") {
  test_limit_fallback(cpu);
  test_limit_fallback(null);
}

TEST_CASE("allocator: a second free or a foreign block is refused before it is read (cpu, null)") {
  test_bad_frees(cpu);
  test_bad_frees(null);
}

TEST_CASE("allocator: requests beyond the largest size are refused, never rounded (cpu, null)") {
  test_max_request(cpu);
  test_max_request(null);
}

TEST_CASE("allocator: under a limit, fallbacks and flushes are identical on cpu and null arenas") {
  test_same_decisions_under_limit(cpu, null);
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
  CHECK(counters == 5);  // the starting level, then one per alloc and free
  CHECK(instants == 8);
  CHECK(max_activation == static_cast<int64_t>(3 * MiB));
  CHECK(a.chrome_trace(false).find("w\\\"eird\\\\tag") != std::string::npos);
}

TEST_CASE("allocator: trace counters start from what was live when the log started") {
  CachingAllocator a(make_null_arena());
  const int par = static_cast<int>(Category::parameter);
  const int grad = static_cast<int>(Category::gradient);
  const int ws = static_cast<int>(Category::workspace);
  Block* p = a.allocate(3 * MiB, Category::parameter, 0);  // 20 MiB segment
  Block* g = a.allocate(5000, Category::gradient, 0);      // 2 MiB segment
  a.set_event_log(true);
  const EventLogBaseline b0 = a.event_log_baseline();
  CHECK(b0.seq == 0);
  CHECK(b0.allocated == static_cast<int64_t>(3 * MiB + 5120));
  CHECK(b0.allocated_by[par] == static_cast<int64_t>(3 * MiB));
  CHECK(b0.allocated_by[grad] == 5120);
  CHECK(b0.reserved == static_cast<int64_t>(22 * MiB));
  CHECK(b0.reserved_by[par] == static_cast<int64_t>(20 * MiB));
  CHECK(b0.reserved_by[grad] == static_cast<int64_t>(2 * MiB));
  Block* x = a.allocate(1000, Category::activation, 0);
  a.free(p);  // both were live before the log: their frees must not go below zero
  a.free(g);
  // Paused: the 2 MiB workspace block is not in the log; resuming resyncs the counters.
  a.set_event_log(false);
  Block* hidden = a.allocate(2 * MiB, Category::workspace, 0);
  a.set_event_log(true);
  a.free(hidden);
  a.free(x);
  CHECK(a.event_log_baseline().allocated_by[par] == static_cast<int64_t>(3 * MiB));

  const auto doc = nlohmann::json::parse(a.chrome_trace(true));
  std::vector<nlohmann::json> counters;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "C" && e["name"] == "allocated by category") counters.push_back(e["args"]);
  }
  // start, alloc x, free p, free g, resume, free hidden, free x
  REQUIRE(counters.size() == 7);
  for (const auto& c : counters) {
    for (int i = 0; i < kNumCategories; ++i) {
      CHECK(c[category_name(static_cast<Category>(i))].get<int64_t>() >= 0);
    }
  }
  CHECK(counters[0]["parameter"].get<int64_t>() == static_cast<int64_t>(3 * MiB));
  CHECK(counters[0]["gradient"].get<int64_t>() == 5120);
  CHECK(counters[2]["parameter"].get<int64_t>() == 0);
  CHECK(counters[4]["workspace"].get<int64_t>() == static_cast<int64_t>(2 * MiB));
  for (int i = 0; i < kNumCategories; ++i) {
    CHECK(counters.back()[category_name(static_cast<Category>(i))].get<int64_t>() == 0);
  }
  // clear_events() starts a new log: its baseline is the state at that moment.
  Block* y = a.allocate(4096, Category::gradient, 0);
  a.clear_events();
  CHECK(a.event_log_baseline().allocated_by[grad] == 4096);
  CHECK(a.event_log_baseline().allocated_by[ws] == 0);
  a.free(y);
  const auto doc2 = nlohmann::json::parse(a.chrome_trace(true));
  int64_t last_gradient = -1;
  for (const auto& e : doc2["traceEvents"]) {
    if (e["ph"] == "C" && e["name"] == "allocated by category") {
      last_gradient = e["args"]["gradient"].get<int64_t>();
    }
  }
  CHECK(last_gradient == 0);
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

// Held by a global so LeakSanitizer sees it as reachable in the child processes below; volatile
// so the compiler cannot drop the never-read store (the tensor would then count as leaked).
Tensor* volatile g_held_at_exit = nullptr;

namespace {

// Runs `body` in a child process with the exit check in fail mode and returns its exit status;
// the child's stderr goes to `err_path`.
int exit_status_of_child(const std::function<void()>& body, const std::string& err_path) {
  std::cout.flush();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!std::freopen(err_path.c_str(), "w", stderr)) std::_Exit(90);
    set_exit_check(ExitCheck::fail);
    body();
    std::exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string file_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST_CASE("allocator: at shutdown no bytes are live on the process-wide allocators") {
  CachingAllocator& a = allocator_for(Device::cpu());
  {
    // Tensors (and scratch) of every category, the way the layers above create them.
    std::vector<Tensor> held;
    Generator g(1);
    for (int i = 0; i < kNumCategories; ++i) {
      const Category c = static_cast<Category>(i);
      CategoryScope scope(c);
      TagScope tag(std::string("shutdown.") + category_name(c));
      held.push_back(zeros({1000 + i}));
      held.push_back(randint({10}, 5, g, DType::i32));
      held.push_back(held.front().reshape({-1}));  // a view: no bytes of its own
    }
    Workspace scratch(Device::cpu(), 1 << 20);
    const MemoryStats s = a.stats();
    for (int i = 0; i < kNumCategories; ++i) CHECK(s.allocated_by[i].current > 0);
    const std::string report = live_allocations_report();
    CHECK(report.find("cpu") != std::string::npos);
    CHECK(report.find("shutdown.optimizer_state") != std::string::npos);
  }
  const MemoryStats s = a.stats();
  for (int i = 0; i < kNumCategories; ++i) {
    INFO("category " << category_name(static_cast<Category>(i)));
    CHECK(s.allocated_by[i].current == 0);
    CHECK(s.requested_by[i].current == 0);
  }
  CHECK(s.allocated.current == 0);
  CHECK(s.requested.current == 0);
  CHECK(s.live_blocks == 0);
  CHECK(live_allocations_report().empty());

  // The exit check itself, at a real process exit: a child that keeps a tensor alive past exit
  // fails with status 3 and names it; one that released everything exits cleanly; a block whose
  // tag is declared persistent is not reported.
  const std::string err = "/tmp/regen_test_exit_" + std::to_string(::getpid()) + ".txt";
  const int leaked = exit_status_of_child(
      [] {
        TagScope tag("leaked.on.purpose");
        g_held_at_exit = new Tensor(zeros({4096}));
      },
      err);
  CHECK(leaked == 3);
  const std::string text = file_text(err);
  CHECK(text.find("at exit, memory is still allocated") != std::string::npos);
  CHECK(text.find("leaked.on.purpose") != std::string::npos);
  CHECK(text.find("16.00 KiB") != std::string::npos);
  CHECK(exit_status_of_child(
            [] {
              Tensor t = zeros({4096});
              Tensor u = ones({3}, DType::i64);
            },
            err) == 0);
  CHECK(exit_status_of_child(
            [] {
              exit_check_ignore_tag("persistent.by.design");
              TagScope tag("persistent.by.design");
              g_held_at_exit = new Tensor(zeros({4096}));
            },
            err) == 0);
  std::remove(err.c_str());
}

namespace {
// Counts what reaches the system arena behind a recycling one.
struct CountingArena final : Arena {
  explicit CountingArena(int64_t capacity) : capacity(capacity) {}
  void* map(size_t bytes) override {
    if (held + static_cast<int64_t>(bytes) > capacity) return nullptr;  // "out of memory"
    ++maps;
    held += static_cast<int64_t>(bytes);
    void* p = inner->map(bytes);
    return p;
  }
  void unmap(void* base, size_t bytes) override {
    ++unmaps;
    held -= static_cast<int64_t>(bytes);
    inner->unmap(base, bytes);
  }
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "counting"; }
  std::unique_ptr<Arena> inner = make_null_arena();
  int64_t capacity;
  int maps = 0, unmaps = 0;
  int64_t held = 0;
};
}  // namespace

TEST_CASE(
    "allocator: a recycling arena reuses parked segments, never holds more than its peak, "
    "and gives memory back") {
  auto counting = std::make_unique<CountingArena>(int64_t{64} << 20);
  CountingArena* sys = counting.get();
  CachingAllocator a(make_recycling_arena(std::move(counting)));
  const MemoryStats none = a.stats();
  CHECK(none.reserved.current == 0);
  // A step: two large blocks, freed, cache emptied (the trainer's canonical start), repeated.
  for (int step = 0; step < 5; ++step) {
    Block* x = a.allocate(12u << 20);
    Block* y = a.allocate(6u << 20);
    a.free(x);
    a.free(y);
    a.empty_cache();
    CHECK(a.stats().reserved.current == 0);  // the allocator's view is unchanged
  }
  CHECK(sys->maps == 2);  // the first step's segments, parked and taken back ever since
  CHECK(sys->unmaps == 0);
  CHECK(a.arena().retained_bytes() == static_cast<uint64_t>(sys->held));
  const int64_t peak_reserved = a.stats().reserved.peak;
  CHECK(sys->held <= peak_reserved);
  // A different size: the parked segments that would push the footprint past the high-water
  // mark go back first.
  Block* big = a.allocate(30u << 20);
  CHECK(sys->held <= std::max<int64_t>(peak_reserved, a.stats().reserved.current));
  a.free(big);
  a.empty_cache();
  // Out of memory in the system arena: everything parked is released, then the map is retried.
  Block* huge = a.allocate(60u << 20);
  CHECK(huge != nullptr);
  CHECK(a.arena().retained_bytes() == 0);
  a.free(huge);
  a.release_memory();
  CHECK(a.arena().retained_bytes() == 0);
  CHECK(sys->held == 0);
  CHECK(sys->maps == sys->unmaps);
}

// ---- Direct mode ------------------------------------------------------------------------------

TEST_CASE(
    "allocator: the shared suite on the direct arena: rounding, statistics, scopes, limits, "
    "bad frees, huge requests") {
  test_rounding_split_coalesce(direct);
  test_hand_computed_stats(direct);
  test_category_scopes(direct);
  test_limit_and_oom(direct);
  test_limit_fallback(direct);
  test_bad_frees(direct);
  test_max_request(direct);
}

TEST_CASE("allocator: randomized stress keeps blocks disjoint and stats exact (direct)") {
  test_stress(direct, /*touch_memory=*/true, 3000);
}

TEST_CASE(
    "allocator: a recorded sequence gives identical decisions on cpu and direct arenas, "
    "with and without a limit") {
  test_same_decisions(cpu, direct);
  test_same_decisions_under_limit(null, direct);
}

namespace {
// The memory behind a direct arena's blocks, with what it has mapped now (pointer -> bytes), so a
// test sees every block's own mapping made and released. `capacity` bounds the bytes mapped at
// once (a map past it returns nullptr, the arena's "out of memory").
struct TrackingBlockArena final : Arena {
  void* map(size_t bytes) override {
    if (held + static_cast<int64_t>(bytes) > capacity) return nullptr;
    void* p = nullptr;
    if (posix_memalign(&p, 64, bytes) != 0) return nullptr;
    mapped[p] = bytes;
    held += static_cast<int64_t>(bytes);
    ++maps;
    return p;
  }
  void unmap(void* p, size_t bytes) override {  // CHECK, not REQUIRE: called from destructors
    auto it = mapped.find(p);
    CHECK(it != mapped.end());
    if (it == mapped.end()) return;
    CHECK(it->second == bytes);
    held -= static_cast<int64_t>(it->second);
    mapped.erase(it);
    std::free(p);
    ++unmaps;
  }
  Device device() const override { return Device::cpu(); }
  std::string name() const override { return "tracked"; }
  std::map<void*, size_t> mapped;
  int64_t held = 0, capacity = INT64_MAX;
  int64_t maps = 0, unmaps = 0;
};

// Every field of the statistics.
void check_same_stats(const MemoryStats& x, const MemoryStats& y) {
  auto same = [](const Stat& a, const Stat& b) {
    CHECK(a.current == b.current);
    CHECK(a.peak == b.peak);
  };
  same(x.requested, y.requested);
  same(x.allocated, y.allocated);
  same(x.reserved, y.reserved);
  for (int i = 0; i < kNumCategories; ++i) {
    CAPTURE(category_name(static_cast<Category>(i)));
    same(x.requested_by[i], y.requested_by[i]);
    same(x.allocated_by[i], y.allocated_by[i]);
    same(x.reserved_by[i], y.reserved_by[i]);
    CHECK(x.allocated_by_at_peak[i] == y.allocated_by_at_peak[i]);
  }
  CHECK(x.num_allocs == y.num_allocs);
  CHECK(x.num_frees == y.num_frees);
  CHECK(x.num_segment_maps == y.num_segment_maps);
  CHECK(x.num_segment_unmaps == y.num_segment_unmaps);
  CHECK(x.num_cache_flushes == y.num_cache_flushes);
  CHECK(x.live_blocks == y.live_blocks);
}

// Every field of every event but its time, and every block of the layout but its address.
void check_same_log_and_layout(const CachingAllocator& x, const CachingAllocator& y) {
  const std::vector<MemoryEvent> ex = x.events(), ey = y.events();
  REQUIRE(ex.size() == ey.size());
  for (size_t i = 0; i < ex.size(); ++i) {
    CAPTURE(i);
    REQUIRE(ex[i].seq == ey[i].seq);
    REQUIRE(ex[i].kind == ey[i].kind);
    REQUIRE(ex[i].bytes == ey[i].bytes);
    REQUIRE(ex[i].requested == ey[i].requested);
    REQUIRE(ex[i].category == ey[i].category);
    REQUIRE(ex[i].tag == ey[i].tag);
    REQUIRE(ex[i].block_id == ey[i].block_id);
    REQUIRE(ex[i].segment_id == ey[i].segment_id);
    REQUIRE(ex[i].allocated_after == ey[i].allocated_after);
    REQUIRE(ex[i].reserved_after == ey[i].reserved_after);
  }
  const std::vector<BlockInfo> nx = x.snapshot(), ny = y.snapshot();
  REQUIRE(nx.size() == ny.size());
  for (size_t i = 0; i < nx.size(); ++i) {
    REQUIRE(nx[i].segment_id == ny[i].segment_id);
    REQUIRE(nx[i].offset == ny[i].offset);
    REQUIRE(nx[i].size == ny[i].size);
    REQUIRE(nx[i].requested == ny[i].requested);
    REQUIRE(nx[i].allocated == ny[i].allocated);
    REQUIRE(nx[i].small_pool == ny[i].small_pool);
    REQUIRE(nx[i].category == ny[i].category);
    REQUIRE(nx[i].tag == ny[i].tag);
    REQUIRE(nx[i].id == ny[i].id);
  }
}

// An OutOfMemory message with the arena's name taken out (the one thing that differs).
std::string without_arena_name(std::string msg, const CachingAllocator& a) {
  const std::string name = a.arena().name();
  const size_t at = msg.find(name);
  if (at != std::string::npos) msg.replace(at, name.size(), "<arena>");
  return msg;
}

// One replay of `ops` on several allocators in lockstep (an OutOfMemory leaves a null entry, so
// the sequence stays aligned; its message must be the same on every allocator). On `direct`
// (with its tracking arena `mem`), after every step: each live block has a pointer of its own,
// mapped for exactly its requested bytes; each new block is written over those bytes and read
// back at its free; the mappings are exactly the live blocks'. Returns the OutOfMemory count.
int replay_in_lockstep(const std::vector<Op>& ops, std::vector<CachingAllocator*> all,
                       CachingAllocator& direct, const TrackingBlockArena& mem,
                       std::vector<std::vector<Block*>>& live) {
  all.push_back(&direct);
  live.resize(all.size());
  int ooms = 0;
  for (const Op& op : ops) {
    if (op.is_alloc) {
      std::vector<std::string> errors;
      for (size_t i = 0; i < all.size(); ++i) {
        Block* b = nullptr;
        try {
          b = all[i]->allocate(op.bytes, op.category, 0);
        } catch (const OutOfMemory& e) {
          errors.push_back(without_arena_name(e.what(), *all[i]));
        }
        live[i].push_back(b);
      }
      REQUIRE((errors.empty() || errors.size() == all.size()));
      for (const std::string& e : errors) CHECK(e == errors.front());
      if (!errors.empty()) {
        ++ooms;
        continue;
      }
      Block* b = live.back().back();
      const auto it = mem.mapped.find(b->ptr());
      REQUIRE(it != mem.mapped.end());
      REQUIRE(it->second == op.bytes);
      fill_block(b, op.bytes);
    } else {
      Block* b = live.back()[op.victim];
      if (b) check_block(b);
      for (size_t i = 0; i < all.size(); ++i) {
        all[i]->free(live[i][op.victim]);
        live[i].erase(live[i].begin() + static_cast<long>(op.victim));
      }
    }
    REQUIRE(mem.mapped.size() == static_cast<size_t>(direct.stats().live_blocks));
  }
  return ooms;
}

void free_all(std::vector<CachingAllocator*> all, CachingAllocator& direct,
              std::vector<std::vector<Block*>>& live) {
  all.push_back(&direct);
  for (size_t i = 0; i < all.size(); ++i) {
    for (Block* b : live[i]) all[i]->free(b);
    live[i].clear();
  }
}

}  // namespace

TEST_CASE(
    "allocator: direct mode gives every block its own mapping of exactly its request, and "
    "statistics, events, layouts and OutOfMemory equal the cpu and null arenas'") {
  auto tracking = std::make_unique<TrackingBlockArena>();
  TrackingBlockArena& mem = *tracking;
  CachingAllocator d(make_direct_arena(std::move(tracking)));
  CHECK(d.direct());
  CHECK(d.arena().touches_memory());
  CHECK(d.arena().name() == "tracked (direct)");
  CachingAllocator c(make_cpu_arena()), n(make_null_arena());
  CHECK_FALSE(c.direct());
  CHECK_FALSE(n.direct());
  const std::vector<CachingAllocator*> others{&c, &n};
  for (CachingAllocator* a : {&c, &n, &d}) a->set_event_log(true);
  std::vector<std::vector<Block*>> live;

  // Without a limit: mixed sizes, both pools, shared and own segments; a persistent part is kept.
  const std::vector<Op> ops = random_sequence(7, 2000);
  CHECK(replay_in_lockstep(ops, others, d, mem, live) == 0);
  check_invariants(d);
  check_same_stats(d.stats(), c.stats());
  check_same_stats(d.stats(), n.stats());
  check_same_log_and_layout(d, c);
  check_same_log_and_layout(d, n);
  CHECK(mem.maps == d.stats().num_allocs);
  CHECK(static_cast<int64_t>(mem.mapped.size()) == d.stats().live_blocks);
  CHECK(d.stats().live_blocks > 10);

  // A planned layout over what is live now (its holes) and an arena, for the next 600 requests;
  // the blocks it places at the same offsets at different times still get mappings of their own.
  for (CachingAllocator* a : {&c, &n, &d}) a->reset_peak();
  const std::vector<Op> step = random_sequence(8, 900);
  const std::vector<uint64_t> holes = layout_holes(d.snapshot_state());
  CHECK(holes == layout_holes(c.snapshot_state()));
  CHECK(holes.size() > 2);
  auto layout = std::make_shared<const PlannedLayout>(place_requests(requests_of(step), holes));
  {
    LayoutScope lc(c, layout), ln(n, layout), ld(d, layout);
    for (CachingAllocator* a : {&c, &n, &d}) a->begin_planned_step();
    std::vector<std::vector<Block*>> step_live;
    CHECK(replay_in_lockstep(step, others, d, mem, step_live) == 0);
    check_invariants(d);
    free_all(others, d, step_live);
    CHECK(static_cast<int64_t>(mem.mapped.size()) == d.stats().live_blocks);
  }
  check_same_stats(d.stats(), c.stats());
  check_same_stats(d.stats(), n.stats());
  check_same_log_and_layout(d, c);
  check_same_log_and_layout(d, n);

  // Under a limit: fallback segments, cache flushes and OutOfMemory errors, with the same messages
  // (a request the limit refuses maps nothing).
  for (CachingAllocator* a : {&c, &n, &d}) {
    a->set_limit(a->stats().reserved.current + static_cast<int64_t>(48 * MiB));
  }
  const int64_t flushes = d.stats().num_cache_flushes;
  const int ooms = replay_in_lockstep(random_sequence(99, 2000), others, d, mem, live);
  CHECK(ooms > 0);
  CHECK(d.stats().num_cache_flushes > flushes);
  check_same_stats(d.stats(), c.stats());
  check_same_stats(d.stats(), n.stats());
  check_same_log_and_layout(d, c);
  check_same_log_and_layout(d, n);
  CHECK(mem.maps == d.stats().num_allocs);

  // Freeing releases every mapping.
  free_all(others, d, live);
  CHECK(mem.mapped.empty());
  CHECK(mem.held == 0);
  CHECK(mem.unmaps == mem.maps);
  for (CachingAllocator* a : {&c, &n, &d}) a->empty_cache();
  check_same_stats(d.stats(), c.stats());
  check_same_log_and_layout(d, n);
}

TEST_CASE(
    "allocator: direct mode: a block the arena cannot map is an OutOfMemory, the block "
    "back in its pool") {
  auto tracking = std::make_unique<TrackingBlockArena>();
  TrackingBlockArena& mem = *tracking;
  mem.capacity = 10000;
  CachingAllocator a(make_direct_arena(std::move(tracking)));
  a.set_event_log(true);
  Block* x = a.allocate(6000, Category::parameter, 0);
  const MemoryStats before = a.stats();
  const uint64_t events = a.event_count();
  std::string msg;
  try {
    a.allocate(5000, Category::activation, intern_tag("too.much"));
  } catch (const OutOfMemory& e) {
    msg = e.what();
  }
  CAPTURE(msg);
  CHECK(msg.find("out of memory on tracked (direct)") != std::string::npos);
  CHECK(msg.find("4.88 KiB") != std::string::npos);
  CHECK(msg.find("too.much") != std::string::npos);
  CHECK(msg.find("REGEN_ALLOC_DIRECT") != std::string::npos);
  check_same_stats(a.stats(), before);
  CHECK(a.event_count() == events);
  check_invariants(a);
  a.free(x);
  Block* y = a.allocate(5000, Category::activation, 0);  // room again
  CHECK(mem.mapped.size() == 1);
  a.free(y);
  CHECK(mem.mapped.empty());
  // A request that mapped a segment of its own: the segment stays cached, nothing is allocated.
  CHECK_THROWS_AS(a.allocate(12 * MiB, Category::activation, 0), OutOfMemory);
  CHECK(a.stats().reserved.current == static_cast<int64_t>(14 * MiB));
  CHECK(a.stats().allocated.current == 0);
  CHECK(a.stats().live_blocks == 0);
  check_invariants(a);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
  // A planned layout's request whose size is not the planned one maps nothing either.
  auto layout = std::make_shared<PlannedLayout>();
  layout->size = 4096;
  layout->rounded = {1024};
  layout->offset = {0};
  LayoutScope scope(a, layout);
  a.begin_planned_step();
  CHECK_THROWS_AS(a.allocate(3000, Category::activation, 0), Error);
  CHECK(mem.mapped.empty());
  CHECK(mem.maps == mem.unmaps);
}

TEST_CASE(
    "allocator: direct mode on the cpu: blocks of their own, byte-exact for "
    "AddressSanitizer") {
  CachingAllocator a(make_direct_arena(Device::cpu()));
  CHECK(a.direct());
  CHECK(a.arena().name() == "cpu (direct)");
  CHECK(a.arena().touches_memory());
  CHECK(a.device() == Device::cpu());
  // Three blocks that share a segment, a medium one and an own-segment one: five mappings, each
  // 64-byte aligned and writable over its request.
  std::vector<Block*> blocks;
  for (uint64_t bytes : {uint64_t{1}, uint64_t{1000}, uint64_t{4097}, 3 * MiB + 5, 12 * MiB + 3}) {
    blocks.push_back(a.allocate(bytes, Category::activation, 0));
  }
  CHECK(blocks[0]->segment == blocks[2]->segment);
  for (Block* b : blocks) {
    CHECK(reinterpret_cast<uintptr_t>(b->ptr()) % 64 == 0);
    fill_block(b, b->requested);
    check_block(b);
  }
  for (size_t i = 0; i < blocks.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const auto lo = reinterpret_cast<uintptr_t>(blocks[i]->ptr());
      const auto lj = reinterpret_cast<uintptr_t>(blocks[j]->ptr());
      CHECK((lo + blocks[i]->requested <= lj || lj + blocks[j]->requested <= lo));
    }
  }
  // The snapshot keeps the segments' synthetic addresses (a tiling, as on every arena).
  check_invariants(a);
#ifdef REGEN_TEST_ASAN
  // The byte after each request is poisoned: an overrun is reported, even inside the rounded
  // block. After a free the block's bytes are poisoned too (a use after free is reported).
  for (Block* b : blocks) {
    const char* p = static_cast<const char*>(b->ptr());
    CHECK_FALSE(__asan_address_is_poisoned(p + b->requested - 1));
    CHECK(__asan_address_is_poisoned(p + b->requested));
  }
  const char* first = static_cast<const char*>(blocks[1]->ptr());
  a.free(blocks[1]);
  CHECK(__asan_address_is_poisoned(first));
  blocks.erase(blocks.begin() + 1);
  // On the plain cpu arena the same overrun lands in the segment, unseen.
  CachingAllocator plain(make_cpu_arena());
  Block* b = plain.allocate(1000, Category::activation, 0);
  CHECK_FALSE(__asan_address_is_poisoned(static_cast<const char*>(b->ptr()) + 1000));
  plain.free(b);
#endif
  for (Block* b : blocks) a.free(b);
  CHECK(a.stats().live_blocks == 0);
#ifndef REGEN_WITH_CUDA
  CHECK_THROWS_AS(make_direct_arena(Device::cuda(0)), Error);
#endif
}

// The process-wide allocator follows REGEN_ALLOC_DIRECT (read when it is created): direct for
// "1", cached (behind a recycling arena) when it is unset, "0" or anything else. Run on its own by
// the next test case, in child processes with each value, and by ctest in whatever environment
// it has.
TEST_CASE(
    "allocator: the process-wide cpu allocator is direct exactly when "
    "REGEN_ALLOC_DIRECT is 1") {
  const char* env = std::getenv("REGEN_ALLOC_DIRECT");
  const bool want = env && std::string(env) == "1";
  CachingAllocator& a = allocator_for(Device::cpu());
  CHECK(a.direct() == want);
  CHECK(a.arena().name() == (want ? "cpu (direct)" : "cpu (recycling)"));
  CHECK(a.arena().touches_memory());
  // A tensor's bytes lie in its block's segment, or in direct mode in a mapping of their own
  // (the segments' addresses are then synthetic).
  Tensor t = ones({1000});
  bool in_a_segment = false;
  for (const BlockInfo& b : a.snapshot()) {
    const bool here = b.address == reinterpret_cast<uintptr_t>(t.data<float>());
    in_a_segment = in_a_segment || (b.allocated && here);
  }
  CHECK(in_a_segment == !want);
  CHECK(t.data<float>()[999] == 1.0f);
}

namespace {
// Runs this test binary's case above in a child process with REGEN_ALLOC_DIRECT=`value` (unset
// when nullptr); returns its exit status and its stderr in `err`.
int run_mode_case(const char* value, std::string& err) {
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(len > 0);
  self[len] = '\0';
  const std::string err_path = "/tmp/regen_test_direct_" + std::to_string(::getpid()) + ".txt";
  std::cout.flush();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (!std::freopen(err_path.c_str(), "w", stderr) || !std::freopen("/dev/null", "w", stdout)) {
      std::_Exit(90);
    }
    if (value)
      ::setenv("REGEN_ALLOC_DIRECT", value, 1);
    else
      ::unsetenv("REGEN_ALLOC_DIRECT");
    ::execl(self, self,
            "--test-case=allocator: the process-wide cpu allocator is direct exactly when "
            "REGEN_ALLOC_DIRECT is 1",
            static_cast<char*>(nullptr));
    std::_Exit(91);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  err = file_text(err_path);
  std::remove(err_path.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}
}  // namespace

TEST_CASE(
    "allocator: REGEN_ALLOC_DIRECT: 1 and 0 are taken silently, another value is named once "
    "and ignored") {
  std::string err;
  for (const char* value : {static_cast<const char*>(nullptr), "0", "1"}) {
    CAPTURE((value ? value : "unset"));
    CHECK(run_mode_case(value, err) == 0);
    CHECK(err.find("REGEN_ALLOC_DIRECT") == std::string::npos);
  }
  for (const char* value : {"yes", "", "2"}) {
    CAPTURE(value);
    CHECK(run_mode_case(value, err) == 0);  // the case checks that the allocator is not direct
    const std::string warning =
        std::string("REGEN_ALLOC_DIRECT='") + value + "' is not 0 or 1; ignored";
    CHECK(count_of(err, warning) == 1);
  }
}
