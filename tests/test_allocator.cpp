// The caching allocator on the CPU and Null arenas (the shared suite is allocator_suite.h), the
// event log and its Chrome trace, CPU-vs-Null determinism, and the process-wide allocators'
// shutdown check.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "regen/core/tensor.h"
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

TEST_CASE("allocator: a recycling arena reuses parked segments, never holds more than its peak, "
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
