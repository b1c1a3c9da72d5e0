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

#include <nlohmann/json.hpp>

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

Run make_run(const ModelConfig& cfg, int64_t batch) {
  manual_seed(1234);
  Run r;
  r.model = make_model(cfg, Device::cpu());
  SGDOptions so;
  so.lr = 0.05;
  so.momentum = 0.9;
  r.opt = std::make_unique<SGD>(r.model->parameters(), so);
  r.data = make_data_source("", cfg, 99);
  r.trainer = std::make_unique<Trainer>(*r.model, *r.opt, *r.data, batch, Device::cpu());
  return r;
}

// resnet-tiny's own peak is the stem convolution's workspace at the start of the forward pass,
// which no plan can lower; with ResNet-50's block counts at 1/8 width on 64x64 images (batch 8),
// activations dominate and every planner has room to work.
ModelConfig remat_resnet() {
  ModelConfig cfg = model_preset("resnet-tiny");
  cfg.blocks = {3, 4, 6, 3};
  cfg.image_size = 64;
  return cfg;
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

Profile profile_of(const ModelConfig& cfg, int64_t batch, int iterations) {
  fresh_allocator();
  Run base = make_run(cfg, batch);
  ProfileOptions po;
  po.warmup = 1;
  po.iterations = iterations;
  po.model_name = cfg.name;
  return profile_training(*base.trainer, po);
}

// Budgets for one policy: no budget, 70% and 50% of the no-remat peak (feasible or not), and
// two that the policy can meet by construction: the lowest peak it reaches, and halfway between
// that and the no-remat peak. The last two make every planner's budget compliance a real check.
std::vector<Budget> budgets_for(const Simulator& sim, const PolicySpec& spec) {
  std::vector<Budget> out = {Budget(), Budget::parse("70%"), Budget::parse("50%")};
  if (spec.policy == "none") return out;
  const Plan probe = make_plan(sim, spec.policy, Budget::parse("1"), spec.chain);
  CHECK_FALSE(probe.feasible);
  const int64_t none_peak = probe.no_remat_peak;
  if (probe.lowest_peak < none_peak) {
    Budget lowest;
    lowest.kind = Budget::Kind::bytes;
    lowest.value = static_cast<double>(probe.lowest_peak);
    Budget mid = lowest;
    mid.value = static_cast<double>(probe.lowest_peak + (none_peak - probe.lowest_peak) / 2);
    out.push_back(lowest);
    out.push_back(mid);
  }
  return out;
}

void check_model(const ModelConfig& cfg, int64_t batch, const std::vector<std::string>& labels) {
  const std::string& name = cfg.name;
  const Profile profile = profile_of(cfg, batch, 2);
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
    Run ref_run = make_run(cfg, batch);
    ref = train(ref_run, 3, nullptr);
  }
  for (const MemoryStats& m : ref.memory) {
    CHECK(m.allocated.peak == profile.peak_allocated);
    CHECK(m.reserved.peak == profile.peak_reserved);
  }

  int recomputing_plans = 0, budgets_checked = 0;
  for (const std::string& label : labels) {
    const PolicySpec spec = parse_policy_spec(label);
    const std::string& policy = spec.policy;
    const std::vector<Budget> budgets = budgets_for(sim, spec);
    if (policy != "none") CHECK(budgets.size() == 5);  // every policy lowers this model's peak
    for (const Budget& budget : budgets) {
      const std::string btext = budget.str();
      CAPTURE(name);
      CAPTURE(label);
      CAPTURE(btext);
      const Plan plan = make_plan(sim, policy, budget, spec.chain);
      if (budget.kind == Budget::Kind::bytes) CHECK(plan.feasible);  // budgets_for's own two
      if (spec.chain == Chain::automatic && policy == "mutwo") {
        // auto is the better of the two modes: it fits whenever one fits, and is then no slower
        // than a mode that fits; without a budget (or when neither fits) it is within 1% of the
        // lower peak and, if both are, no slower.
        for (Chain c : {Chain::keep, Chain::drop}) {
          const Plan other = make_plan(sim, policy, budget, c);
          if (other.feasible && plan.budget_bytes > 0) {
            CHECK(plan.feasible);
            CHECK(plan.predicted.time_ms <= other.predicted.time_ms);
          } else {
            CHECK(static_cast<double>(plan.predicted.peak_allocated) <=
                  1.01 * static_cast<double>(other.predicted.peak_allocated));
          }
          CHECK(plan.lowest_peak <= other.lowest_peak);
        }
      }
      if (spec.chain == Chain::drop) CHECK_FALSE(plan.keep_chain);
      if (spec.chain == Chain::keep) CHECK(plan.keep_chain);
      if (plan.recomputed() > 0) ++recomputing_plans;
      fresh_allocator();
      Run run = make_run(cfg, batch);
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
        ++budgets_checked;
        for (const MemoryStats& m : got.memory) CHECK(m.allocated.peak <= plan.budget_bytes);
      }
      if (policy == "none") CHECK(plan.recomputed() == 0);
    }
  }
  if (labels.size() > 1 || labels[0] != "none") {
    CHECK(recomputing_plans > 0);
    CHECK(budgets_checked >= 2);
  }
}

}  // namespace

// One test case per model and planner (ctest runs them in parallel). mutwo runs in both chain
// modes too; auto picks one of them per budget.
TEST_CASE("remat: transformer-tiny: exact peaks, bitwise training, budgets met (none, blocks, sqrt)") {
  check_model(model_preset("transformer-tiny"), 4, {"none", "blocks", "sqrt"});
}

TEST_CASE("remat: transformer-tiny: exact peaks, bitwise training, budgets met (mutwo, every chain mode)") {
  check_model(model_preset("transformer-tiny"), 4, {"mutwo", "mutwo:keep", "mutwo:drop"});
}

TEST_CASE("remat: resnet (ResNet-50 blocks at 1/8 width, 64x64): exact peaks, bitwise training, budgets met (none, blocks, sqrt)") {
  check_model(remat_resnet(), 8, {"none", "blocks", "sqrt"});
}

TEST_CASE("remat: resnet (ResNet-50 blocks at 1/8 width, 64x64): exact peaks, bitwise training, budgets met (mutwo, every chain mode)") {
  check_model(remat_resnet(), 8, {"mutwo", "mutwo:keep", "mutwo:drop"});
}

TEST_CASE("remat: resnet-tiny, whose peak is a workspace no plan can lower: plans stay exact and bitwise") {
  check_model(model_preset("resnet-tiny"), 4, {"none"});
  const Profile profile = profile_of(model_preset("resnet-tiny"), 4, 1);
  const Simulator sim(profile);
  const Plan plan = make_plan(sim, "mutwo", Budget::parse("50%"));
  CHECK_FALSE(plan.feasible);
  CHECK(plan.lower_bound == plan.no_remat_peak);
  CHECK(plan.note.find("cannot be met") != std::string::npos);
}

// A hand-made chain x0 -> n0 -> v1 -> n1 -> v2 -> n2 -> v3 -> n3 -> v4, with v1, v2, v3 saved
// and recomputable at 1 ms each. Sizes make the greedy pick v3, then v2, then v1. With every one
// evicted (mu-TWO's drop chain), n0 runs 3 times and n1 twice during backward, so the counts are
// 1, 2, 3; the sources of each pick are the retained tensors its regeneration starts from.
TEST_CASE("remat: mutwo's recompute counts and sources on a chain") {
  Profile p;
  p.batch = 1;
  for (int i = 0; i < 4; ++i) {
    ProfileNode n;
    n.index = i;
    n.inputs = {i};
    n.outputs = {i + 1};
    n.fwd_ms = 1;
    p.nodes.push_back(n);
  }
  for (int i = 0; i <= 4; ++i) {
    ProfileValue v;
    v.id = i;
    v.root = i;
    v.leaf = i == 0;
    v.producer = i == 0 ? -1 : i - 1;
    p.values.push_back(v);
  }
  const uint64_t bytes[3] = {100, 250, 300};
  for (int i = 0; i < 3; ++i) {
    ProfileSaved s;
    s.index = i;
    s.value = i + 1;
    s.producer = i;
    s.bytes = bytes[i];
    s.candidate = true;
    s.recompute_ms = 1;
    p.values[static_cast<size_t>(i + 1)].saved = i;
    p.saved.push_back(s);
  }
  const std::vector<MutwoPick> picks = mutwo_picks(p);
  REQUIRE(picks.size() == 3);
  CHECK(picks[0].saved == 2);
  CHECK(picks[0].count == 1);
  CHECK(picks[0].srcs == std::vector<int32_t>{1});
  CHECK(picks[1].saved == 1);
  CHECK(picks[1].count == 2);
  CHECK(picks[1].ratio == doctest::Approx(125.0));
  CHECK(picks[1].srcs == std::vector<int32_t>{0});
  CHECK(picks[2].saved == 0);
  CHECK(picks[2].count == 3);
  CHECK(picks[2].ratio == doctest::Approx(100.0 / 3.0));
  CHECK(picks[2].srcs.empty());
}

TEST_CASE("remat: a budget below the lower bound is reported as infeasible") {
  const Profile profile = profile_of(model_preset("transformer-tiny"), 4, 1);
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
  const Profile profile = profile_of(model_preset("transformer-tiny"), 2, 1);
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
  // Damage the checks on structure alone would miss: each is named.
  auto damaged = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(profile_to_json(profile));
    edit(j);
    write_file_atomic(path, j.dump());
    return error_of([&] { load_profile(path); });
  };
  CHECK(damaged([](nlohmann::json& j) { j["measured"]["peak_allocated"] = j["measured"]["peak_allocated"].get<int64_t>() - 512; })
            .find("replays to a peak") != std::string::npos);
  CHECK(damaged([](nlohmann::json& j) { j["backward_order"].push_back(j["backward_order"][0]); })
            .find("twice") != std::string::npos);
  CHECK(damaged([](nlohmann::json& j) { j["events"][0][3] = -5; }).find("requested") != std::string::npos);
  CHECK(damaged([](nlohmann::json& j) { j["nodes"][0]["fwd_ms"] = -1.0; }).find("finite and >= 0") != std::string::npos);
  CHECK(damaged([](nlohmann::json& j) { j["start_state"]["segments"][0]["size"] = 12345; }).find("tiled") != std::string::npos);
  CHECK(damaged([](nlohmann::json& j) { j["start_state"]["segments"] = nlohmann::json::array(); }).find(path) != std::string::npos);
  // The derived fields are written for readers.
  {
    const nlohmann::json j = nlohmann::json::parse(profile_to_json(profile));
    const nlohmann::json& s0 = j.at("saved").at(0);
    CHECK(s0.at("name").get<std::string>() == profile.saved[0].name);
    CHECK(s0.at("creation_rank").get<int32_t>() == profile.saved[0].producer);
    CHECK(s0.at("first_bw_rank").get<int32_t>() == profile.saved[0].first_bw_rank);
    CHECK(j.at("nodes").at(0).at("fwd_alloc_bytes").get<int64_t>() == profile.nodes[0].fwd_alloc_bytes);
  }

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


