// DTR simulated exactly (remat/execute/dtr.h) and the allocator's eviction handler it runs through:
//  - the handler is consulted before OutOfMemory at the same point on the CPU, Null and direct
//    arenas: one sequence with evictions decides identically on all three;
//  - the engine's heuristic (cost of the evicted neighbourhood over bytes x staleness), its
//    regenerations in forward and backward, its pins and Coop's windows, on a hand-made chain;
//  - on a ResNet and on the Transformer, at several reserved budgets, DTR and dtr-coop train
//    bitwise as without remat, and every step measures exactly the predicted allocated and
//    reserved peaks, evictions and replays;
//  - a DTR plan survives plan.json; what DTR cannot run with is refused by name.
#include <doctest/doctest.h>

#include <unistd.h>
#include <deque>
#include <random>

#include "regen/autograd/ops.h"
#include "regen/core/io.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/execute/pipeline.h"
#include "tests/remat_suite.h"
#include "tests/test_util.h"

using namespace regen;
using namespace regen::testing;

namespace {

constexpr uint64_t MiB = 1ull << 20;

// ---- The allocator's eviction handler -----------------------------------------------------------

struct HandlerRun {
  std::vector<MemoryEvent> events;
  MemoryStats stats;
  int64_t handler_calls = 0, ooms = 0;
};

// A random sequence of requests under a 24 MiB limit; the handler frees the oldest block of a
// FIFO of "evictable" ones. Everything it does depends on the allocator's answers only.
HandlerRun run_with_handler(std::unique_ptr<Arena> arena) {
  CachingAllocator a(std::move(arena));
  a.set_limit(24 * MiB);
  a.set_event_log(true);
  std::deque<Block*> evictable;
  std::vector<Block*> pinned;
  HandlerRun r;
  EvictionScope scope(a, [&](const EvictionRequest& req) {
    ++r.handler_calls;
    CHECK(req.rounded == CachingAllocator::round_size(req.bytes));
    if (evictable.empty()) return false;
    a.free(evictable.front());
    evictable.pop_front();
    return true;
  });
  std::mt19937_64 rng(7);
  for (int i = 0; i < 600; ++i) {
    const uint64_t kind = rng() % 10;
    const uint64_t bytes = kind < 5   ? 1 + rng() % (256 << 10)
                           : kind < 9 ? (1 << 20) + rng() % (6 << 20)
                                      : (10 << 20) + rng() % (4 << 20);
    try {
      Block* b = a.allocate(bytes, Category::activation, 0);
      if (rng() % 4 == 0) {
        pinned.push_back(b);
      } else {
        evictable.push_back(b);
      }
    } catch (const OutOfMemory&) {
      ++r.ooms;
    }
    if (pinned.size() > 6) {
      a.free(pinned.front());
      pinned.erase(pinned.begin());
    }
  }
  for (Block* b : evictable) a.free(b);
  for (Block* b : pinned) a.free(b);
  r.events = a.events();
  r.stats = a.stats();
  return r;
}

}  // namespace

TEST_CASE("dtr: the eviction handler decides alike on the cpu, null and direct arenas") {
  const HandlerRun cpu = run_with_handler(make_cpu_arena());
  const HandlerRun null = run_with_handler(make_null_arena());
  const HandlerRun direct = run_with_handler(make_direct_arena(Device::cpu()));
  CHECK(cpu.handler_calls > 50);  // the limit is reached often, and evicting serves most
  CHECK(cpu.ooms > 0);            // and sometimes nothing evictable is left
  for (const HandlerRun* other : {&null, &direct}) {
    CHECK(other->handler_calls == cpu.handler_calls);
    CHECK(other->ooms == cpu.ooms);
    REQUIRE(other->events.size() == cpu.events.size());
    bool same = true;
    for (size_t i = 0; i < cpu.events.size(); ++i) {
      const MemoryEvent &x = cpu.events[i], &y = other->events[i];
      same = same && x.kind == y.kind && x.bytes == y.bytes && x.block_id == y.block_id &&
             x.segment_id == y.segment_id && x.allocated_after == y.allocated_after &&
             x.reserved_after == y.reserved_after;
    }
    CHECK(same);
    CHECK(other->stats.allocated.peak == cpu.stats.allocated.peak);
    CHECK(other->stats.reserved.peak == cpu.stats.reserved.peak);
    CHECK(other->stats.num_cache_flushes == cpu.stats.num_cache_flushes);
  }
  CHECK(cpu.stats.reserved.peak <= static_cast<int64_t>(24 * MiB));
}

TEST_CASE(
    "dtr: a handler with nothing to free ends in OutOfMemory, named, and one handler at a time") {
  CachingAllocator a(make_null_arena());
  a.set_limit(4 * MiB);
  int calls = 0;
  EvictionScope scope(a, [&](const EvictionRequest& r) {
    ++calls;
    CHECK(r.small == false);
    CHECK(r.category == Category::activation);
    return false;
  });
  Block* b = a.allocate(3 * MiB, Category::activation, 0);
  expect_error([&] { a.allocate(3 * MiB, Category::activation, 0); },
               {"out of memory", "the eviction handler had nothing left to evict"});
  CHECK(calls == 1);
  expect_error([&] { EvictionScope second(a, [](const EvictionRequest&) { return false; }); },
               {"an eviction handler is installed already"});
  auto layout = std::make_shared<PlannedLayout>();
  expect_error([&] { a.set_planned_layout(layout); }, {"eviction handler"});
  a.free(b);
}

// ---- The engine on a hand-made chain ------------------------------------------------------------

namespace {

// x0 -> n0 -> v1 -> n1 -> v2 -> n2 -> v3 -> n3(v3, v1) -> v4. Node i+1 saves its first input
// v(i+1); n3 also reads v1 in forward. Backward runs n3, n2, n1, n0. Every op takes 1 ms.
Profile chain_profile(const uint64_t bytes[3]) {
  Profile p;
  p.batch = 1;
  for (int i = 0; i < 4; ++i) {
    ProfileNode n;
    n.index = i;
    n.inputs = {i};
    n.outputs = {i + 1};
    n.fwd_ms = 1;
    n.name = "n" + std::to_string(i);
    if (i > 0) n.saved = {i};
    p.nodes.push_back(n);
  }
  p.nodes[3].inputs = {3, 1};
  for (int i = 0; i <= 4; ++i) {
    ProfileValue v;
    v.id = i;
    v.root = i;
    v.leaf = i == 0;
    v.producer = i == 0 ? -1 : i - 1;
    v.alloc_id = i == 0 ? 0 : static_cast<uint64_t>(i);
    v.bytes = i == 0 || i == 4 ? 64 : bytes[i - 1];
    p.values.push_back(v);
  }
  for (int i = 0; i < 3; ++i) {
    ProfileSaved s;
    s.value = i + 1;
    s.bytes = bytes[i];
    p.saved.push_back(s);
  }
  p.backward_order = {3, 2, 1, 0};
  finalize_profile(p);
  return p;
}

// Records what the engine asks for; its layout is set by the test (Coop).
struct FakeRuntime final : DtrRuntime {
  std::vector<int32_t> evicted;
  std::vector<RegenProgram> programs;
  std::vector<BlockInfo> blocks;
  void evict(int32_t s) override { evicted.push_back(s); }
  void run_program(const RegenProgram& prog,
                   const std::function<void(size_t)>& after_step) override {
    programs.push_back(prog);
    for (size_t i = 0; i < prog.steps.size(); ++i) after_step(i);
  }
  uint64_t block_id(int32_t s) const override { return 100 + static_cast<uint64_t>(s); }
  std::vector<BlockInfo> layout() const override { return blocks; }
};

EvictionRequest small_request(uint64_t rounded) {
  EvictionRequest r;
  r.bytes = r.rounded = rounded;
  r.small = true;
  return r;
}

}  // namespace

TEST_CASE("dtr: the heuristic weighs cost, bytes, staleness and the evicted neighbourhood") {
  const uint64_t bytes[3] = {500, 250, 400};
  const Profile p = chain_profile(bytes);
  FakeRuntime rt;
  DtrEngine e(p, DtrOptions{}, rt);
  CHECK_FALSE(e.evict_for(small_request(512)));  // no step yet
  for (int s = 0; s < 3; ++s) CHECK(e.eligible(s));
  e.before_forward(0);
  e.after_forward(0);
  e.before_forward(1);
  e.after_forward(1);  // v1 saved (clock 2)
  e.before_forward(2);
  e.after_forward(2);  // v2 saved (clock 3)
  // clock 3: v1 = 1 / (500 x 1), v2 = 1 / (250 x max(1, 0)): the larger and staler v1 goes.
  CHECK(e.score(0) == doctest::Approx(1.0 / 500));
  CHECK(e.score(1) == doctest::Approx(1.0 / 250));
  REQUIRE(e.evict_for(small_request(512)));
  CHECK(rt.evicted == std::vector<int32_t>{0});
  // n3 reads v1 in forward: regenerated first (n0 replayed from the leaf), and pinned.
  e.before_forward(3);
  REQUIRE(rt.programs.size() == 1);
  CHECK(rt.programs[0].targets == std::vector<int32_t>{0});
  REQUIRE(rt.programs[0].steps.size() == 1);
  CHECK(rt.programs[0].steps[0].node == 0);
  CHECK(rt.programs[0].steps[0].outputs[0].fate == ReplayStep::Fate::restore);
  CHECK(e.current().forward_programs == 1);
  // While n3 runs, v1 (its input) is pinned: v2 is the only choice.
  REQUIRE(e.evict_for(small_request(512)));
  CHECK(rt.evicted.back() == 1);
  e.after_forward(3);  // v3 saved (clock 5); v4, saved by nobody, joins the neighbourhoods
  // v3's neighbourhood: v2 (evicted) and v4 (never saved), 1 ms each, in two classes.
  CHECK(e.score(2) == doctest::Approx((1.0 + 1 + 1) / (400 * 1)));
  // v1 (restored at clock 5, neighbours v2 and v4): (1 + 1 + 1) / (500 x 1).
  CHECK(e.score(0) == doctest::Approx(3.0 / 500));
  REQUIRE(e.evict_for(small_request(512)));
  CHECK(rt.evicted.back() == 0);
  // v1 evicted joins v2's and v4's classes: v3 now sees one class of 3 ms.
  CHECK(e.score(2) == doctest::Approx((1.0 + 3) / 400));
  // Backward: n3 reads v3 (resident); n2 reads v2, evicted, whose producer reads v1, evicted: one
  // program replays n0 and n1 and restores both (DTR keeps what it recomputes).
  e.backward_start();
  e.before_backward(3);
  e.after_backward(3);  // v3's last use
  e.before_backward(2);
  REQUIRE(rt.programs.size() == 2);
  const RegenProgram& prog = rt.programs[1];
  CHECK(prog.targets == std::vector<int32_t>{1});
  REQUIRE(prog.steps.size() == 2);
  CHECK(prog.steps[0].node == 0);
  CHECK(prog.steps[1].node == 1);
  CHECK(prog.steps[0].outputs[0].fate == ReplayStep::Fate::restore);
  CHECK(prog.steps[1].outputs[0].fate == ReplayStep::Fate::restore);
  // v2, which n2 reads, stays pinned; v1, restored on the way and read by no later step of the
  // program, may go again (DTR locks only what an op reads) and is the only choice.
  REQUIRE(e.evict_for(small_request(512)));
  CHECK(rt.evicted.back() == 0);
  CHECK_FALSE(e.evict_for(small_request(512)));
  e.after_backward(2);
  e.before_backward(1);  // reads v1 again: n0 replayed once more
  REQUIRE(rt.programs.size() == 3);
  CHECK(rt.programs[2].targets == std::vector<int32_t>{0});
  e.after_backward(1);
  e.before_backward(0);
  e.after_backward(0);
  e.end_step();
  CHECK(e.last().evictions == 4);
  CHECK(e.last().programs == 3);
  CHECK(e.last().replays == 4);
  CHECK(e.last().recompute_ms == doctest::Approx(4.0));
  CHECK_FALSE(e.evict_for(small_request(512)));  // between steps nothing is tracked
}

TEST_CASE("dtr: Coop evicts the cheapest address-contiguous window that holds the request") {
  const uint64_t bytes[3] = {512, 256, 512};
  const Profile p = chain_profile(bytes);
  FakeRuntime rt;
  DtrEngine e(p, DtrOptions{true}, rt);
  for (int n = 0; n < 4; ++n) {
    e.before_forward(n);
    e.after_forward(n);
  }
  // Segment 1: [v1 512][a block DTR cannot free]. Segment 2: [v2 256][v3 512][free 128].
  // A 700-byte request: v1 alone is too small and walled in, v3 and the free block hold 640
  // bytes; the window v2 + v3 holds it.
  auto block = [](uint64_t seg, uint64_t off, uint64_t size, bool alloc, uint64_t id) {
    BlockInfo b{};
    b.segment_id = seg;
    b.offset = off;
    b.size = size;
    b.allocated = alloc;
    b.small_pool = true;
    b.id = id;
    return b;
  };
  rt.blocks = {block(1, 0, 512, true, 100), block(1, 512, 1024, true, 7),
               block(2, 0, 256, true, 101), block(2, 256, 512, true, 102),
               block(2, 768, 128, false, 0)};
  REQUIRE(e.evict_for(small_request(700)));
  CHECK(rt.evicted == std::vector<int32_t>{1, 2});
  CHECK(e.current().windows == 1);
  // A large request has no window in small segments: DTR's own choice, one tensor (v1).
  EvictionRequest large = small_request(2 * MiB);
  large.small = false;
  REQUIRE(e.evict_for(large));
  CHECK(rt.evicted.back() == 0);
  CHECK(e.current().windows == 1);
}

// ---- Training under DTR ------------------------------------------------------------------------

namespace {

// Steps per run: the second starts from the state the first left, and must repeat it exactly.
constexpr int kSteps = 2;

// DTR at `budgets` (bytes) through the pipeline: bitwise training, and every step exactly the
// predicted peaks, evictions and replays. Returns how many budgets made DTR evict and replay.
int check_dtr_training(const ModelConfig& cfg, int64_t batch, const Profile& profile,
                       const Trace& ref, const std::string& policy,
                       const std::vector<int64_t>& budgets) {
  const Simulator sim(profile);
  int working = 0;
  for (const int64_t bytes : budgets) {
    Budget budget;
    budget.kind = Budget::Kind::bytes;
    budget.value = static_cast<double>(bytes);
    CAPTURE(policy);
    CAPTURE(bytes);
    const Plan plan = make_plan(sim, policy, budget, PlanOptions{});
    REQUIRE(plan.feasible);
    CHECK(plan.predicted.peak_reserved <= bytes);
    CHECK(plan.limit > 0);
    CHECK(plan.recomputed() == 0);  // nothing is decided ahead of time
    // The simulation is deterministic: planning again predicts the same step.
    const Plan again = make_plan(sim, policy, budget, PlanOptions{});
    CHECK(again.predicted.peak_allocated == plan.predicted.peak_allocated);
    CHECK(again.predicted.evictions == plan.predicted.evictions);
    fresh_allocator(Device::cpu());
    Run run = make_run(cfg, batch, Device::cpu());
    RematPipeline pipe(*run.trainer);
    pipe.use_profile(profile);
    pipe.use_plan(plan);
    REQUIRE(pipe.dtr_executor() != nullptr);
    Trace got;
    const std::vector<StepResult> steps = pipe.train(kSteps);
    // The last step's regeneration time: its programs alone, on the device's clock.
    if (plan.predicted.replays > 0) CHECK(pipe.dtr_executor()->regen_ms() > 0);
    CHECK(pipe.dtr_executor()->regen_ms() < steps.back().ms);
    for (const StepResult& s : steps) {
      got.losses.push_back(s.loss);
      got.memory.push_back(s.memory);
      CHECK(s.memory.allocated.peak == plan.predicted.peak_allocated);
      CHECK(s.memory.reserved.peak == plan.predicted.peak_reserved);
      CHECK(s.memory.reserved.peak <= bytes);
      CHECK(pipe.dtr_executor()->evictions() == plan.predicted.evictions);
      CHECK(pipe.dtr_executor()->replays() == plan.predicted.replays);
    }
    CHECK(pipe.exact_steps() == kSteps);
    CHECK(pipe.predicted_steps() == kSteps);
    pipe.finish();
    CHECK_FALSE(run.trainer->allocator().has_eviction_handler());
    check_same_training(trace_of(run, std::move(got)), ref);
    if (plan.predicted.evictions > 0 && plan.predicted.replays > 0) ++working;
  }
  return working;
}

Trace reference(const ModelConfig& cfg, int64_t batch) {
  fresh_allocator(Device::cpu());
  Run ref_run = make_run(cfg, batch, Device::cpu());
  RematPipeline plain(*ref_run.trainer);
  return train(plain, ref_run, kSteps);
}

// Reserved budgets: DTR's lowest reserved peak, a third and two thirds of the way from it to
// the no-remat allocated peak (every budget below that peak makes DTR evict: the step's tensors
// do not fit otherwise, and a budget at or above its lowest is met by construction), and one
// halfway from that peak to the no-remat reserved one.
//
// DTR's choices follow the profile's op times (cost / (bytes x staleness)), and on some profiles
// of the ResNet below (about one run in three on a loaded machine) its lowest reserved peak is
// above the no-remat allocated peak: every lower budget makes it evict in an order that runs out
// of memory anyway, and the lowest it meets needs no eviction (the limit alone makes the
// allocator reuse its cache). Then the budgets run from that lowest to the no-remat reserved
// peak, each is still checked exact and bitwise, and the count of budgets that evict is not
// required (evicts_below is false).
struct DtrBudgets {
  std::vector<int64_t> bytes;
  bool evicts_below = true;  // DTR met a budget under the no-remat allocated peak
};
DtrBudgets dtr_budgets(const Profile& profile, const std::string& policy) {
  const Simulator sim(profile);
  const Plan probe = make_plan(sim, policy, Budget::parse("1"), PlanOptions{});
  CHECK_FALSE(probe.feasible);
  const int64_t lo = probe.lowest_peak, alloc = profile.peak_allocated;
  const int64_t hi = probe.no_remat_peak;
  REQUIRE(alloc < hi);
  if (lo < alloc)
    return {{lo, lo + (alloc - lo) / 3, lo + 2 * (alloc - lo) / 3, alloc + (hi - alloc) / 2}, true};
  MESSAGE(policy, ": the lowest reserved budget DTR meets on this profile, ", lo,
          " bytes, is above the no-remat allocated peak, ", alloc, " bytes");
  REQUIRE(lo < hi);
  return {{lo, lo + (hi - lo) / 4, lo + (hi - lo) / 2, lo + 3 * (hi - lo) / 4}, false};
}

// One test case per model and policy (ctest runs them in parallel).
void check_model(const ModelConfig& cfg, int64_t batch, const char* policy) {
  const Profile profile = profile_of(cfg, batch, 1);
  const Trace ref = reference(cfg, batch);
  const DtrBudgets b = dtr_budgets(profile, policy);
  const int working = check_dtr_training(cfg, batch, profile, ref, policy, b.bytes);
  if (b.evicts_below) CHECK(working >= 3);
}

void check_resnet(const char* policy) {
  check_model(remat_resnet(), 8, policy);
}

void check_transformer(const char* policy) {
  ModelConfig cfg = model_preset("transformer-tiny");
  cfg.seq_len = 64;
  check_model(cfg, 16, policy);
}

}  // namespace

TEST_CASE(
    "dtr: resnet (ResNet-50 blocks at 1/8 width, 64x64): bitwise training, exact peaks, "
    "evictions and replays at four reserved budgets (dtr)") {
  check_resnet("dtr");
}

TEST_CASE(
    "dtr: resnet (ResNet-50 blocks at 1/8 width, 64x64): bitwise training, exact peaks, "
    "evictions and replays at four reserved budgets (dtr-coop)") {
  check_resnet("dtr-coop");
}

TEST_CASE(
    "dtr: transformer-tiny (sequences of 64, batch 16, dropout): bitwise training, exact peaks, "
    "evictions and replays at four reserved budgets (dtr)") {
  check_transformer("dtr");
}

TEST_CASE(
    "dtr: transformer-tiny (sequences of 64, batch 16, dropout): bitwise training, exact peaks, "
    "evictions and replays at four reserved budgets (dtr-coop)") {
  check_transformer("dtr-coop");
}

TEST_CASE("dtr: a plan survives plan.json, and what DTR cannot run with is refused by name") {
  ModelConfig cfg = model_preset("transformer-tiny");
  cfg.seq_len = 64;
  const Profile profile = profile_of(cfg, 16, 1);
  const Simulator sim(profile);
  const Plan plan = make_plan(sim, "dtr", Budget::parse("70%"), PlanOptions{});
  REQUIRE(plan.feasible);
  const std::string path = "test_dtr_plan_" + std::to_string(::getpid()) + ".json";
  save_plan(plan, profile, path);
  Plan loaded = load_plan(path, profile);
  std::remove(path.c_str());
  judge_loaded_plan(sim, loaded);
  CHECK(loaded.policy == "dtr");
  CHECK(loaded.feasible);
  CHECK(loaded.limit == plan.limit);
  CHECK(loaded.predicted.peak_allocated == plan.predicted.peak_allocated);
  CHECK(loaded.predicted.peak_reserved == plan.predicted.peak_reserved);
  CHECK(loaded.predicted.evictions == plan.predicted.evictions);
  CHECK(loaded.predicted.replays == plan.predicted.replays);
  // A plan written as not fitting (no limit: its step runs, above the budget) stays that way when
  // read back, so --plan refuses it as --policy does, for either policy.
  for (const char* policy : {"dtr", "dtr-coop"}) {
    CAPTURE(policy);
    const Plan low = make_plan(sim, policy, Budget::parse("1KiB"), PlanOptions{});
    REQUIRE(!low.feasible);
    CHECK(low.limit == 0);
    const std::string low_path = "test_dtr_low_" + std::to_string(::getpid()) + ".json";
    save_plan(low, profile, low_path);
    Plan back = load_plan(low_path, profile);
    std::remove(low_path.c_str());
    judge_loaded_plan(sim, back);
    CHECK(!back.feasible);
    CHECK(back.predicted.peak_reserved > back.budget_bytes);
    CHECK(back.note.find("above the budget 1.00 KiB (the plan sets no limit") != std::string::npos);
  }
  // A DTR plan edited to recompute something is not a DTR plan.
  Plan edited = plan;
  for (size_t s = 0; s < profile.saved.size(); ++s) {
    if (profile.saved[s].candidate) {
      edited.decisions[s] = Decision::recompute;
      break;
    }
  }
  expect_error([&] { judge_loaded_plan(sim, edited); }, {"decides nothing ahead of time"});

  PlanOptions allocated;
  allocated.budget_of = BudgetOf::allocated;
  expect_error([&] { make_plan(sim, "dtr", Budget::parse("60%"), allocated); },
               {"dtr", "--budget-of reserved"});
  PlanOptions planned;
  planned.planned_layout = true;
  expect_error([&] { make_plan(sim, "dtr-coop", Budget::parse("60%"), planned); },
               {"dtr-coop", "--layout caching"});
  PlanOptions chain;
  chain.chain = Chain::drop;
  expect_error([&] { make_plan(sim, "dtr", Budget::parse("60%"), chain); }, {"no chain mode"});
  // Below what DTR reaches: infeasible, with the lowest reserved peak it runs at and the reason.
  const Plan low = make_plan(sim, "dtr", Budget::parse("1"), PlanOptions{});
  CHECK_FALSE(low.feasible);
  CHECK(low.lowest_peak > 0);
  CHECK(low.lowest_peak < low.no_remat_peak);
  CHECK(low.limit == 0);
  CHECK(low.note.find("cannot be met by dtr") != std::string::npos);
}

TEST_CASE(
    "dtr: an op recorded without grad cannot read an evicted tensor, and a recorded one asks") {
  Tape& tape = Tape::current();
  tape.clear();
  Tensor w = full({4, 4}, 0.5f, DType::f32, Device::cpu());
  w.set_requires_grad(true);
  Tensor x = full({2, 4}, 1.0f, DType::f32, Device::cpu());
  Tensor h = relu(linear(x, w, Tensor()));  // relu saves its output
  int32_t saved = -1;
  for (size_t s = 0; s < tape.saved().size(); ++s) {
    if (!tape.saved_tensor(static_cast<int32_t>(s)).is_leaf() &&
        tape.saved_tensor(static_cast<int32_t>(s)).value == tape.value(h.impl()->tape_value).root) {
      saved = static_cast<int32_t>(s);
    }
  }
  REQUIRE(saved >= 0);
  tape.evict(saved);
  CHECK_FALSE(h.has_storage());
  {
    NoGradScope no_grad;
    expect_error([&] { relu(h); }, {"evicted by the remat runtime"});
  }
  // Recorded, with no runtime to regenerate it: named after the op, nothing recorded.
  const size_t nodes = tape.nodes().size();
  expect_error([&] { relu(h); }, {"evicted and no remat runtime regenerated it"});
  CHECK(tape.nodes().size() == nodes);
  tape.clear();
}
