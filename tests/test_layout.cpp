// The planned layout (remat/plan/layout.h, CachingAllocator::set_planned_layout): offsets that
// never overlap two blocks alive at once, on random lifetimes and on a hand-checked case; the
// allocator serving a random sequence from its layout (blocks disjoint in the randomized check of
// the allocator tests, bytes written and read back, statistics exact); a step that is not the
// planned one, a malformed layout and an arena past the limit refused with what was wrong; and
// training with planned layouts: the same losses, gradients and parameters bitwise, the predicted
// peaks to the byte, reserved bytes equal to the persistent segments plus the planned arena,
// reserved budgets met under the hard limit and one byte less refused; plan.json keeps the layout.
#include <doctest/doctest.h>

#include <unistd.h>
#include <random>

#include "regen/core/io.h"
#include "regen/remat/plan/layout.h"
#include "tests/allocator_suite.h"
#include "tests/remat_suite.h"
#include "tests/test_util.h"

using namespace regen;
using namespace regen::testing;

namespace {

using Request = SimOptions::Request;

// Every pair of requests alive at the same time lies in disjoint bytes (another hole, or the
// arena, or other offsets); every block is aligned and inside its hole or the arena, which with
// the holes holds at least the live peak.
void check_layout(const std::vector<Request>& rq, const PlannedLayout& l) {
  REQUIRE(l.rounded.size() == rq.size());
  REQUIRE(l.offset.size() == rq.size());
  REQUIRE(l.bin.size() == rq.size());
  auto end = [](const Request& r) { return r.end < 0 ? INT64_MAX : r.end; };
  uint64_t hole_bytes = 0;
  for (uint64_t h : l.holes) hole_bytes += h;
  for (size_t i = 0; i < rq.size(); ++i) {
    REQUIRE(l.rounded[i] == rq[i].rounded);
    REQUIRE(l.offset[i] % CachingAllocator::kMinBlockSize == 0);
    REQUIRE(l.bin[i] >= -1);
    REQUIRE(l.bin[i] < static_cast<int32_t>(l.holes.size()));
    const uint64_t room =
        l.bin[i] < 0 ? static_cast<uint64_t>(l.size) : l.holes[static_cast<size_t>(l.bin[i])];
    REQUIRE(l.offset[i] + l.rounded[i] <= room);
  }
  for (size_t i = 0; i < rq.size(); ++i) {
    for (size_t j = i + 1; j < rq.size(); ++j) {
      const bool together = rq[i].begin < end(rq[j]) && rq[j].begin < end(rq[i]);
      if (!together || l.bin[i] != l.bin[j]) continue;
      const bool apart =
          l.offset[i] + l.rounded[i] <= l.offset[j] || l.offset[j] + l.rounded[j] <= l.offset[i];
      if (!apart) {
        FAIL_CHECK("requests ", i, " and ", j, " are alive together and overlap");
        return;
      }
    }
  }
  CHECK(static_cast<int64_t>(hole_bytes) + l.size >= live_peak(rq));
}

// Replays `ops` as a planned step: each request where the layout puts it, the allocator's
// invariants after every step (live blocks disjoint, holes and arena tiled by blocks and gaps,
// statistics equal to sums over blocks), and on a memory-touching arena each block's bytes
// written and read back at its free. With `persistent`, blocks made and kept first leave holes
// in their segments, which the layout fills too.
void replay_planned(const ArenaFactory& make, const std::vector<Op>& ops, bool touch_memory,
                    bool persistent) {
  CachingAllocator a(make());
  std::vector<Block*> kept;
  if (persistent) {
    // Every other block of 2-700 KiB in the small pool and 1-3 MiB in a shared segment is freed,
    // and the cached tail of each segment stays free too.
    std::vector<Block*> made;
    for (int i = 0; i < 8; ++i)
      made.push_back(a.allocate((2 + 97 * i) * 1024, Category::parameter, 0));
    for (int i = 0; i < 6; ++i)
      made.push_back(a.allocate((1 + i % 3) * MiB, Category::parameter, 0));
    for (size_t i = 0; i < made.size(); ++i) {
      if (i % 2)
        kept.push_back(made[i]);
      else
        a.free(made[i]);
    }
  }
  const AllocatorState before = a.snapshot_state();
  const std::vector<uint64_t> holes = layout_holes(before);
  if (persistent) CHECK(holes.size() >= 7);  // the freed blocks, and each segment's free tail
  if (!persistent) CHECK(holes.empty());
  std::vector<uintptr_t> hole_address;
  for (const AllocatorState::SegmentRec& seg : before.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (!b.allocated) hole_address.push_back(b.address);
    }
  }
  const int64_t persistent_reserved = a.stats().reserved.current;
  const std::vector<Request> rq = requests_of(ops);
  auto layout = std::make_shared<const PlannedLayout>(place_requests(rq, holes));
  check_layout(rq, *layout);
  a.set_planned_layout(layout);
  CHECK(a.has_planned_layout());
  CHECK(a.stats().reserved.current == persistent_reserved + layout->size);
  check_invariants(a);
  a.begin_planned_step();
  const int64_t maps = a.stats().num_segment_maps;
  std::vector<Block*> live;
  size_t k = 0, in_holes = 0;
  uintptr_t arena = 0;
  for (const Op& op : ops) {
    if (op.is_alloc) {
      Block* b = a.allocate(op.bytes, op.category, 0);
      const uintptr_t at = reinterpret_cast<uintptr_t>(b->ptr());
      if (layout->bin[k] < 0) {
        if (!arena) arena = at - layout->offset[k];
        REQUIRE(at == arena + layout->offset[k]);
      } else {
        REQUIRE(at == hole_address[static_cast<size_t>(layout->bin[k])] + layout->offset[k]);
        ++in_holes;
      }
      ++k;
      if (touch_memory) fill_block(b, op.bytes);
      live.push_back(b);
    } else {
      Block* b = live[op.victim];
      if (touch_memory) check_block(b);
      a.free(b);
      live.erase(live.begin() + static_cast<long>(op.victim));
    }
    check_invariants(a);
  }
  if (persistent) CHECK(in_holes > 0);
  for (Block* b : live) a.free(b);
  int64_t kept_bytes = 0;
  for (Block* b : kept) kept_bytes += static_cast<int64_t>(b->size);
  const MemoryStats s = a.stats();
  CHECK(s.allocated.current == kept_bytes);
  // The planned blocks are exactly the rounded requests; nothing is mapped during the step.
  CHECK(s.allocated.peak == kept_bytes + live_peak(rq));
  CHECK(s.reserved.peak == persistent_reserved + layout->size);
  CHECK(s.num_segment_maps == maps);
  MESSAGE(rq.size(), " requests", std::string(persistent ? " (with holes)" : ""), ": arena ",
          format_bytes(layout->size), ", live peak ", format_bytes(live_peak(rq)), " (",
          static_cast<double>(layout->size) / static_cast<double>(live_peak(rq)), "x), ", in_holes,
          " in the holes");
  // Uninstalled: the arena unmapped, the holes back in the pools as they were.
  a.set_planned_layout(nullptr);
  CHECK_FALSE(a.has_planned_layout());
  check_invariants(a);
  CHECK(a.stats().reserved.current == persistent_reserved);
  CHECK(layout_holes(a.snapshot_state()) == holes);
  for (Block* b : kept) a.free(b);
  a.empty_cache();
  CHECK(a.stats().reserved.current == 0);
}

}  // namespace

TEST_CASE(
    "layout: offsets by hand, and never two live requests in the same bytes (random lifetimes)") {
  constexpr uint64_t K = 1024;
  // A lives throughout; B then C take turns above it (C begins where B ends); D lives to the end.
  const std::vector<Request> hand = {{4 * K, 0, 10}, {2 * K, 2, 5}, {2 * K, 5, 8}, {K, 9, -1}};
  const PlannedLayout l = place_requests(hand);
  check_layout(hand, l);
  CHECK(l.offset == std::vector<uint64_t>{0, 4 * K, 4 * K, 4 * K});
  CHECK(l.size == static_cast<int64_t>(6 * K));
  CHECK(live_peak(hand) == static_cast<int64_t>(6 * K));

  // With holes of 2 and 4 KiB: A fills the 4 KiB one; C (the longer-lived of B and C) the 2 KiB
  // one; B, alive with both, goes to the arena.
  const std::vector<Request> holed = {{4 * K, 0, 10}, {2 * K, 2, 5}, {2 * K, 3, 8}};
  const PlannedLayout h = place_requests(holed, {2 * K, 4 * K});
  check_layout(holed, h);
  CHECK(h.bin == std::vector<int32_t>{1, -1, 0});
  CHECK(h.offset == std::vector<uint64_t>{0, 0, 0});
  CHECK(h.size == static_cast<int64_t>(2 * K));

  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 30; ++trial) {
    std::vector<Request> rq(1 + rng() % 400);
    for (Request& r : rq) {
      const uint64_t c = rng() % 10;
      const uint64_t blocks = c < 6 ? 1 + rng() % 8 : c < 9 ? 1 + rng() % 2048 : 1 + rng() % 40000;
      r.rounded = blocks * CachingAllocator::kMinBlockSize;
      r.begin = static_cast<int64_t>(rng() % 1000);
      r.end = rng() % 10 == 0 ? -1 : r.begin + 1 + static_cast<int64_t>(rng() % 300);
    }
    CAPTURE(trial);
    std::vector<uint64_t> holes(trial % 2 ? rng() % 6 : 0);
    for (uint64_t& x : holes) x = (1 + rng() % 4096) * CachingAllocator::kMinBlockSize;
    const PlannedLayout a = place_requests(rq, holes);
    check_layout(rq, a);
    // Deterministic: the same requests give the same layout.
    const PlannedLayout b = place_requests(rq, holes);
    CHECK(a.offset == b.offset);
    CHECK(a.bin == b.bin);
    CHECK(a.size == b.size);
  }
  // A size that is not a rounded request is refused.
  CHECK(error_of([] {
          place_requests({{1000, 0, 1}});
        }).find("not a rounded size") != std::string::npos);
}

TEST_CASE(
    "layout: the allocator serves a random sequence where planned, in holes and arena, blocks "
    "disjoint, stats exact (cpu, null)") {
  const ArenaFactory cpu = [] { return make_cpu_arena(); };
  const ArenaFactory null = [] { return make_null_arena(); };
  replay_planned(cpu, random_sequence(31, 1500), /*touch_memory=*/true, /*persistent=*/false);
  replay_planned(null, random_sequence(32, 3000), /*touch_memory=*/false, /*persistent=*/false);
  replay_planned(cpu, random_sequence(33, 1500), /*touch_memory=*/true, /*persistent=*/true);
  replay_planned(null, random_sequence(34, 3000), /*touch_memory=*/false, /*persistent=*/true);
}

TEST_CASE(
    "layout: a step that is not the planned one, a malformed layout, an arena past the limit") {
  auto layout = std::make_shared<PlannedLayout>();
  layout->size = 8192;
  layout->rounded = {4096, 4096};
  layout->offset = {0, 4096};
  {
    CachingAllocator a(make_null_arena());
    a.set_planned_layout(layout);
    a.begin_planned_step();
    Block* first = a.allocate(4000, Category::activation, 0);
    CHECK(first->offset == 0);
    // The second request is not the size planned there: refused, naming both sizes.
    const std::string e = error_of([&] { a.allocate(9000, Category::activation, 0); });
    CHECK(e.find("planned layout: request 1") != std::string::npos);
    CHECK(e.find("9.00 KiB") != std::string::npos);
    CHECK(e.find("4.00 KiB") != std::string::npos);
    // A layout is not replaced, nor a step begun, while its blocks are live.
    CHECK(error_of([&] { a.begin_planned_step(); }).find("are live") != std::string::npos);
    CHECK(error_of([&] { a.set_planned_layout(nullptr); }).find("still live") != std::string::npos);
    a.free(first);
    // After the layout's last request, requests go to the pools.
    a.begin_planned_step();
    Block* x = a.allocate(4096, Category::activation, 0);
    Block* y = a.allocate(4096, Category::activation, 0);
    Block* z = a.allocate(4096, Category::activation, 0);
    CHECK(x->segment == y->segment);
    CHECK(z->segment != x->segment);
    CHECK(a.stats().reserved.current ==
          8192 + static_cast<int64_t>(CachingAllocator::kSmallBuffer));
    for (Block* b : {x, y, z}) a.free(b);
    a.set_planned_layout(nullptr);
    a.empty_cache();
    CHECK(a.stats().reserved.current == 0);
  }
  {
    CachingAllocator a(make_null_arena());
    auto bad = std::make_shared<PlannedLayout>(*layout);
    bad->offset[1] = 6000;  // not aligned, and past the arena's end
    CHECK(error_of([&] { a.set_planned_layout(bad); }).find("does not lie aligned inside") !=
          std::string::npos);
    bad->offset.pop_back();
    CHECK(error_of([&] { a.set_planned_layout(bad); }).find("malformed") != std::string::npos);
    CHECK_FALSE(a.has_planned_layout());
    // A layout planned with holes this allocator does not have.
    auto holed = std::make_shared<PlannedLayout>(*layout);
    holed->holes = {4096};
    const std::string e = error_of([&] { a.set_planned_layout(holed); });
    CHECK(e.find("planned with 1 free block(s) of 4.00 KiB in the persistent segments, but they "
                 "hold 0") != std::string::npos);
    CHECK_FALSE(a.has_planned_layout());
    // Cached segments are released before the arena is mapped; under a limit the arena must fit.
    a.free(a.allocate(100, Category::other, 0));
    CHECK(a.stats().reserved.current > 0);
    a.set_limit(8191);
    CHECK_THROWS_AS(a.set_planned_layout(layout), OutOfMemory);
    CHECK(a.stats().reserved.current == 0);
    CHECK(error_of([&] { a.set_planned_layout(layout); }).find("the planned layout's arena") !=
          std::string::npos);
    a.set_limit(8192);
    a.set_planned_layout(layout);
    CHECK(a.stats().reserved.current == 8192);
    a.set_planned_layout(nullptr);
  }
}

namespace {

// Trains `cfg` with plans of each policy at a few budgets of both kinds with planned layouts, and
// checks them against training without remat (bitwise) and against their predictions (exact).
void check_planned_training(const ModelConfig& cfg, int64_t batch,
                            const std::vector<std::string>& policies) {
  const Device cpu = Device::cpu();
  const Profile profile = profile_of(cfg, batch, 2);
  const Simulator sim(profile);
  PlanCache cache(sim);
  Trace ref;
  {
    fresh_allocator(cpu);
    Run r = make_run(cfg, batch, cpu);
    ref = train(r, 3, nullptr);
  }
  int executed = 0, recomputing = 0, reserved_met = 0;
  for (BudgetOf of : {BudgetOf::allocated, BudgetOf::reserved}) {
    for (const std::string& policy : policies) {
      PlanOptions po;
      po.budget_of = of;
      po.planned_layout = true;
      po.cache = &cache;
      const Plan probe = make_plan(sim, policy, Budget::parse("1"), po);
      REQUIRE(probe.layout);
      CHECK_FALSE(probe.feasible);
      // No budget; the lowest peak the policy reaches (met by construction); halfway up from it.
      std::vector<Budget> budgets = {Budget()};
      Budget lowest;
      lowest.kind = Budget::Kind::bytes;
      lowest.value = static_cast<double>(probe.lowest_peak);
      Budget mid = lowest;
      // (A small model's planned peak may pass its no-remat caching peak: its arena comes on top
      // of the persistent segments' slack.)
      mid.value = static_cast<double>(
          probe.lowest_peak + std::max<int64_t>(0, probe.no_remat_peak - probe.lowest_peak) / 2);
      budgets.push_back(lowest);
      budgets.push_back(mid);
      for (const Budget& budget : budgets) {
        const std::string btext = budget.str();
        CAPTURE(policy);
        CAPTURE(btext);
        CAPTURE(std::string(budget_of_name(of)));
        const Plan plan = make_plan(sim, policy, budget, po);
        REQUIRE(plan.layout);
        CHECK(plan.planned_layout);
        if (budget.kind == Budget::Kind::bytes) CHECK(plan.feasible);
        if (plan.recomputed() > 0) ++recomputing;
        const Schedule s = plan_schedule(profile, plan);
        // The layout is the one the schedule's requests give.
        std::vector<Request> rq;
        SimOptions so;
        so.requests = &rq;
        sim.run(s, so);
        check_layout(rq, *plan.layout);
        CHECK(plan.layout->holes == layout_holes(profile.start_state));
        CHECK(plan.layout->offset == place_requests(rq, plan.layout->holes).offset);

        fresh_allocator(cpu);
        Run run = make_run(cfg, batch, cpu);
        RematExecutor exec(profile, s);
        run.trainer->prepare();
        allocator_for(cpu).empty_cache();
        const int64_t persistent = allocator_for(cpu).stats().reserved.current;
        const LimitScope limit(allocator_for(cpu), plan.limit);
        const LayoutScope layout(allocator_for(cpu), plan.layout);
        const Trace got = train(run, 3, &exec);
        check_same_training(got, ref);
        for (const MemoryStats& m : got.memory) {
          CHECK(m.allocated.peak == plan.predicted.peak_allocated);
          CHECK(m.reserved.peak == plan.predicted.peak_reserved);
          // Reserved: the persistent segments and the arena, nothing mapped during the step.
          CHECK(m.reserved.peak == persistent + plan.layout->size);
          if (plan.feasible && plan.budget_bytes > 0) {
            CHECK(peak_of(plan.predicted, of) <= plan.budget_bytes);
            CHECK(m.allocated.peak <= plan.budget_bytes);
            if (of == BudgetOf::reserved) CHECK(m.reserved.peak <= plan.budget_bytes);
          }
        }
        CHECK(exec.replays() == plan.predicted.replays);
        if (of == BudgetOf::reserved && plan.feasible && plan.budget_bytes > 0) {
          ++reserved_met;
          // The reserved peak is a limit the plan runs under; one byte less is refused.
          CHECK(fit_schedule(sim, s, plan.predicted.peak_reserved, of, nullptr, true).fits);
          CHECK_FALSE(
              fit_schedule(sim, s, plan.predicted.peak_reserved - 1, of, nullptr, true).fits);
        }
        MESSAGE(cfg.name, " ", policy, " ", btext, " (", budget_of_name(of), "): allocated ",
                format_bytes(plan.predicted.peak_allocated), ", reserved ",
                format_bytes(plan.predicted.peak_reserved), " = persistent ",
                format_bytes(persistent), " + arena ", format_bytes(plan.layout->size));
        ++executed;
      }
    }
  }
  CHECK(executed == static_cast<int>(policies.size()) * 6);
  CHECK(recomputing > 0);
  CHECK(reserved_met >= static_cast<int>(policies.size()));
}

}  // namespace

TEST_CASE(
    "layout: planned training on transformer-tiny is bitwise, exact, and meets its budgets (dp, "
    "mutwo, blocks)") {
  check_planned_training(model_preset("transformer-tiny"), 4, {"dp", "mutwo", "blocks"});
}

TEST_CASE(
    "layout: planned training on a ResNet is bitwise, exact, and meets its budgets (dp, mutwo, "
    "sqrt)") {
  check_planned_training(remat_resnet(), 8, {"dp", "mutwo", "sqrt"});
}

TEST_CASE(
    "layout: on the ResNet the arena is within 3% of a lower bound, and plan.json keeps the "
    "layout") {
  const Profile profile = profile_of(remat_resnet(), 8, 2);
  const Simulator sim(profile);
  PlanOptions po;
  po.planned_layout = true;
  po.budget_of = BudgetOf::allocated;
  for (const std::string b : {"90%", "70%"}) {
    const Plan plan = make_plan(sim, "dp", Budget::parse(b), po);
    int64_t peak = 0;
    const auto l = plan_layout(sim, plan_schedule(profile, plan), &peak);
    CHECK(l->size == plan.layout->size);
    CHECK(l->offset == plan.layout->offset);
    CHECK(l->holes == plan.layout->holes);
    // The arena is within 3% of a lower bound: the live peak less all the holes, or the largest
    // request no hole can take.
    std::vector<Request> rq;
    SimOptions so;
    so.requests = &rq;
    sim.run(plan_schedule(profile, plan), so);
    CHECK(live_peak(rq) == peak);
    uint64_t holes = 0, largest_hole = 0, too_large = 0;
    for (uint64_t h : l->holes) {
      holes += h;
      largest_hole = std::max(largest_hole, h);
    }
    for (const Request& r : rq) {
      if (r.rounded > largest_hole) too_large = std::max(too_large, r.rounded);
    }
    const int64_t bound =
        std::max(peak - static_cast<int64_t>(holes), static_cast<int64_t>(too_large));
    CHECK(l->size >= bound);
    CHECK(static_cast<double>(l->size) <= 1.03 * static_cast<double>(bound));
    const double ratio = static_cast<double>(plan.predicted.peak_reserved) /
                         static_cast<double>(plan.predicted.peak_allocated);
    MESSAGE(b, ": arena ", format_bytes(l->size), " (bound ", format_bytes(bound), ") and ",
            l->holes.size(), " holes of ", format_bytes(static_cast<int64_t>(holes)),
            " for a live peak of ", format_bytes(peak), "; reserved ",
            format_bytes(plan.predicted.peak_reserved), " for ",
            format_bytes(plan.predicted.peak_allocated), " allocated (", ratio, "x)");
  }
  const Plan plan = make_plan(sim, "dp", Budget::parse("70%"), po);
  const std::string path = "/tmp/regen_layout_" + std::to_string(::getpid()) + "_plan.json";
  save_plan(plan, profile, path);
  const std::string text = read_file(path);
  CHECK(text.find("\"layout\": \"planned\"") != std::string::npos);
  const Plan loaded = load_plan(path, profile);
  CHECK(loaded.planned_layout);
  CHECK(loaded.decisions == plan.decisions);
  std::string bad = text;
  bad.replace(bad.find("\"layout\": \"planned\""), 19, "\"layout\": \"tiled\"");
  write_file_atomic(path, bad);
  const std::string e = error_of([&] { load_plan(path, profile); });
  CHECK(e.find("\"layout\" is 'tiled'") != std::string::npos);
  CHECK(e.find(path) != std::string::npos);
  std::remove(path.c_str());
}
