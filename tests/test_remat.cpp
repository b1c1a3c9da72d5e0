// The remat requirements on tiny configurations, for every planner and several budgets:
//  - the simulator's predicted peaks (allocated and reserved) equal the measured ones to the byte;
//  - training with the plan gives bitwise the same losses, gradients and parameters as without,
//    dropout included;
//  - the measured peak is at or under the budget whenever the planner said it was feasible.
// Plus: a budget that cannot be met is reported; malformed profile and plan files are errors.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <unistd.h>

#include "core/io.h"
#include "models/optim.h"
#include "models/train.h"
#include "remat/executor.h"
#include "remat/profiler.h"
#include "remat/report.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::error_of;

namespace {

struct Run {
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<Trainer> trainer;
};

Run make_run(const std::string& name, int64_t batch) {
  manual_seed(1234);
  Run r;
  ModelConfig cfg = model_preset(name);
  r.model = make_model(cfg, Device::cpu());
  SGDOptions so;
  so.lr = 0.05;
  so.momentum = 0.9;
  r.opt = std::make_unique<SGD>(r.model->parameters(), so);
  r.data = make_data_source("", cfg, 99);
  r.trainer = std::make_unique<Trainer>(*r.model, *r.opt, *r.data, batch, Device::cpu());
  return r;
}

struct Trace {
  std::vector<double> losses;
  std::vector<std::vector<float>> params, grads;
  std::vector<MemoryStats> memory;
};

Trace train(Run& r, int steps, TapeHooks* hooks) {
  Trace t;
  if (hooks) Tape::current().add_hooks(hooks);
  for (int i = 0; i < steps; ++i) {
    StepResult s = r.trainer->step();
    t.losses.push_back(s.loss);
    t.memory.push_back(s.memory);
  }
  if (hooks) Tape::current().remove_hooks(hooks);
  for (const Tensor& p : r.model->parameters()) {
    t.params.push_back(p.to_vector<float>());
    t.grads.push_back(p.grad().to_vector<float>());
  }
  return t;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every run builds its model from an empty allocator, as a fresh process would: the canonical
// step start then gives each run the same layout.
void fresh_allocator() {
  CachingAllocator& a = allocator_for(Device::cpu());
  a.empty_cache();
  REQUIRE(a.stats().live_blocks == 0);
}

Profile profile_of(const std::string& name, int64_t batch, int iterations) {
  fresh_allocator();
  Run base = make_run(name, batch);
  ProfileOptions po;
  po.warmup = 1;
  po.iterations = iterations;
  po.model_name = name;
  return profile_training(*base.trainer, po);
}

void check_model(const std::string& name, int64_t batch, const std::vector<std::string>& budgets) {
  const Profile profile = profile_of(name, batch, 2);
  const Simulator sim(profile);
  // The profiled iteration itself: the simulator reproduces it exactly.
  const SimResult none = sim.run(build_schedule(profile, std::vector<Decision>(profile.saved.size(), Decision::retain)));
  CHECK(none.peak_allocated == profile.peak_allocated);
  CHECK(none.peak_reserved == profile.peak_reserved);
  // The profile survives a JSON round trip.
  const Profile again = profile_from_json(profile_to_json(profile), "round trip");
  CHECK(Simulator(again).run(build_schedule(again, std::vector<Decision>(again.saved.size(), Decision::retain))).peak_allocated ==
        profile.peak_allocated);

  // Reference training without remat: every step, the first included, peaks where profiled.
  Trace ref;
  {
    fresh_allocator();
    Run ref_run = make_run(name, batch);
    ref = train(ref_run, 3, nullptr);
  }
  for (const MemoryStats& m : ref.memory) {
    CHECK(m.allocated.peak == profile.peak_allocated);
    CHECK(m.reserved.peak == profile.peak_reserved);
  }

  int recomputing_plans = 0;
  // Every policy, and mutwo in both chain modes too (auto picks one of them per budget).
  for (const char* label : {"none", "blocks", "sqrt", "mutwo", "mutwo:keep", "mutwo:drop"}) {
    const PolicySpec spec = parse_policy_spec(label);
    const std::string& policy = spec.policy;
    for (const std::string& btext : budgets) {
      CAPTURE(name);
      CAPTURE(label);
      CAPTURE(btext);
      const Plan plan = make_plan(sim, policy, Budget::parse(btext), spec.chain);
      if (spec.chain == Chain::automatic && policy == "mutwo") {
        // auto is the better of the two modes: never over budget when one fits, never slower
        // than a mode that fits.
        for (Chain c : {Chain::keep, Chain::drop}) {
          const Plan other = make_plan(sim, policy, Budget::parse(btext), c);
          if (other.feasible) {
            CHECK(plan.feasible);
            CHECK(plan.predicted.time_ms <= other.predicted.time_ms);
          }
          CHECK(plan.lowest_peak <= other.lowest_peak);
        }
      }
      if (spec.chain == Chain::drop) CHECK_FALSE(plan.keep_chain);
      if (spec.chain == Chain::keep) CHECK(plan.keep_chain);
      if (plan.recomputed() > 0) ++recomputing_plans;
      fresh_allocator();
      Run run = make_run(name, batch);
      RematExecutor exec(profile, build_schedule(profile, plan.decisions, plan.keep_chain));
      const Trace got = train(run, 3, &exec);
      // Bitwise identical training.
      REQUIRE(got.losses.size() == ref.losses.size());
      for (size_t i = 0; i < got.losses.size(); ++i) CHECK(got.losses[i] == ref.losses[i]);
      bool same = true;
      for (size_t i = 0; i < ref.params.size(); ++i) {
        same = same && bitwise_equal(got.params[i], ref.params[i]) &&
               bitwise_equal(got.grads[i], ref.grads[i]);
      }
      CHECK(same);
      // Exact prediction, every step.
      for (size_t i = 0; i < got.memory.size(); ++i) {
        CHECK(got.memory[i].allocated.peak == plan.predicted.peak_allocated);
        CHECK(got.memory[i].reserved.peak == plan.predicted.peak_reserved);
      }
      CHECK(exec.replays() == plan.predicted.replays);
      if (plan.feasible && plan.budget_bytes > 0) {
        CHECK(got.memory[2].allocated.peak <= plan.budget_bytes);
      }
      if (policy == "none") CHECK(plan.recomputed() == 0);
    }
  }
  CHECK(recomputing_plans > 0);
}

}  // namespace

TEST_CASE("remat: transformer-tiny: exact peaks, bitwise training, budgets met (every planner)") {
  check_model("transformer-tiny", 4, {"none", "70%", "50%"});
}

TEST_CASE("remat: a budget below the lower bound is reported as infeasible") {
  const Profile profile = profile_of("transformer-tiny", 4, 1);
  const Simulator sim(profile);
  for (const char* policy : {"blocks", "sqrt", "mutwo"}) {
    const Plan plan = make_plan(sim, policy, Budget::parse("1KiB"));
    CHECK_FALSE(plan.feasible);
    CHECK(plan.lowest_peak > 1024);
    CHECK(plan.lower_bound > 1024);
    CHECK(plan.lower_bound <= plan.lowest_peak);
    CHECK(plan.note.find("cannot be met") != std::string::npos);
    CHECK(plan.note.find("lower bound") != std::string::npos);
  }
  // mutwo reaches at least as low as blocks at no budget.
  const Plan m = make_plan(sim, "mutwo", Budget::parse("1KiB"));
  const Plan b = make_plan(sim, "blocks", Budget());
  CHECK(m.lowest_peak <= b.predicted.peak_allocated);
}

TEST_CASE("remat: malformed profile and plan files give clear errors") {
  const std::string dir = "/tmp/regen_remat_" + std::to_string(::getpid());
  const Profile profile = profile_of("transformer-tiny", 2, 1);
  const std::string path = dir + "_profile.json";
  write_file_atomic(path, "{\"format\": \"regen-profile-1\", \"model\": 3}");
  CHECK(error_of([&] { load_profile(path); }).find(path) != std::string::npos);
  write_file_atomic(path, "not json at all");
  CHECK(error_of([&] { load_profile(path); }).find("not valid JSON") != std::string::npos);
  write_file_atomic(path, "{\"format\": \"something-else\"}");
  CHECK(error_of([&] { load_profile(path); }).find("not a regen profile") != std::string::npos);
  // A structurally valid file with a broken cross-reference.
  std::string text = profile_to_json(profile);
  const size_t at = text.find("\"root\":");
  REQUIRE(at != std::string::npos);
  text.replace(at, text.find(',', at) - at, "\"root\": 999999");
  write_file_atomic(path, text);
  CHECK(error_of([&] { load_profile(path); }).find("out of range") != std::string::npos);
  CHECK(error_of([&] { load_profile(dir + "_missing.json"); }).find("cannot open") != std::string::npos);

  const Simulator sim(profile);
  const Plan plan = make_plan(sim, "mutwo", Budget::parse("60%"));
  const std::string plan_path = dir + "_plan.json";
  save_plan(plan, profile, plan_path);
  const Plan loaded = load_plan(plan_path, profile);
  CHECK(loaded.decisions == plan.decisions);
  std::string ptext = read_file(plan_path);
  const size_t d = ptext.find("\"RETAINED\"");
  REQUIRE(d != std::string::npos);
  ptext.replace(d, 10, "\"MAYBE\"");
  write_file_atomic(plan_path, ptext);
  CHECK(error_of([&] { load_plan(plan_path, profile); }).find("bad decision") != std::string::npos);
  write_file_atomic(plan_path, "[1, 2]");
  CHECK(error_of([&] { load_plan(plan_path, profile); }).find("not a regen plan") != std::string::npos);
  CHECK_THROWS_AS(Budget::parse("150%"), Error);
  CHECK_THROWS_AS(Budget::parse("lots"), Error);
  CHECK_THROWS_AS(make_plan(sim, "magic", Budget()), Error);
  CHECK(error_of([] { parse_policy_spec("mutwo:sometimes"); }).find("sometimes") != std::string::npos);
  CHECK(error_of([] { parse_policy_spec("greedy"); }).find("greedy") != std::string::npos);
  CHECK(error_of([] { parse_chain("maybe"); }).find("keep") != std::string::npos);
  std::remove(path.c_str());
  std::remove(plan_path.c_str());
}

TEST_CASE("remat: resnet-tiny: exact peaks, bitwise training, budgets met (every planner)") {
  check_model("resnet-tiny", 4, {"none", "70%", "50%"});
}
