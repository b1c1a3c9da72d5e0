// The remat requirements, shared by the CPU suite (tests/test_remat.cpp) and the CUDA suite
// (tests/cuda/test_cuda_remat.cpp): for a model, batch, device and list of planners,
//  - the simulator's predicted peaks (allocated and reserved) equal the measured ones to the byte,
//    every step;
//  - training with each plan gives bitwise the same losses, gradients and parameters as without,
//    dropout included;
//  - the measured peak is at or under the budget whenever the planner said it was feasible, at
//    budgets every planner can meet (its lowest peak and halfway to it) as well as 70% and 50%.
#pragma once

#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "regen/kernels/kernels.h"
#include "regen/models/optim.h"
#include "regen/models/train.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/session/session.h"

namespace regen::testing {

// A training run's parts (the trainer refers to the others: they go after it).
struct Run {
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<Trainer> trainer;
};

// The session of a run of `cfg` (a registered model's configuration, possibly with sizes no option
// sets): SGD with momentum, synthetic data, one seed.
inline SessionOptions run_options(const ModelConfig& cfg, int64_t batch, Device device) {
  SessionOptions o;
  o.model = cfg.name;
  o.config = cfg;
  o.batch = batch;
  o.device = device.str();
  o.lr = 0.05;
  o.momentum = 0.9;
  o.seed = 1234;
  return o;
}

// A run made by the library's session (session/session.h), as `regen train` makes one.
inline Run make_run(const ModelConfig& cfg, int64_t batch, Device device) {
  std::unique_ptr<Session> s = make_session(run_options(cfg, batch, device), Preflight::none);
  Run r;
  r.model = std::move(s->model);
  r.opt = std::move(s->optimizer);
  r.data = std::move(s->data);
  r.trainer = std::move(s->trainer);
  return r;
}

// resnet-tiny's own peak is the stem convolution's workspace at the start of the forward pass,
// which no plan can lower; with ResNet-50's block counts at 1/8 width on 64x64 images (batch 8),
// activations dominate and every planner has room to work.
inline ModelConfig remat_resnet() {
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

inline Trace trace_of(Run& r, Trace t) {
  for (const Tensor& p : r.model->parameters()) {
    t.params.push_back(p.to_vector<float>());
    t.grads.push_back(p.grad().to_vector<float>());
  }
  return t;
}

// `steps` steps with `hooks` (may be null) on the tape: for schedules that are not a Plan's.
inline Trace train(Run& r, int steps, TapeHooks* hooks) {
  Trace t;
  {
    const HooksScope scope(hooks);
    for (int i = 0; i < steps; ++i) {
      StepResult s = r.trainer->step();
      t.losses.push_back(s.loss);
      t.memory.push_back(s.memory);
    }
  }
  return trace_of(r, std::move(t));
}

// `steps` steps through `pipe` (over r's trainer): under its plan when it has one.
inline Trace train(RematPipeline& pipe, Run& r, int steps) {
  Trace t;
  for (const StepResult& s : pipe.train(steps)) {
    t.losses.push_back(s.loss);
    t.memory.push_back(s.memory);
  }
  pipe.finish();
  return trace_of(r, std::move(t));
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Training that went exactly as `ref` did: the same losses, and bitwise the same parameters and
// gradients at the end.
inline void check_same_training(const Trace& got, const Trace& ref) {
  REQUIRE(got.losses.size() == ref.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i) CHECK(got.losses[i] == ref.losses[i]);
  REQUIRE(got.params.size() == ref.params.size());
  bool same = true;
  for (size_t i = 0; i < ref.params.size(); ++i) {
    same = same && bitwise_equal(got.params[i], ref.params[i]) &&
           bitwise_equal(got.grads[i], ref.grads[i]);
  }
  CHECK(same);
}

// Every run builds its model from the same allocator state, as a fresh process would: the
// canonical step start then gives each run the same layout. The device's persistent blocks are
// made first (on CUDA the cuBLAS workspace, one block held for the life of the process;
// kernels/cuda/blas.cpp), so the first run starts like the later ones, and they are the only
// live blocks.
inline void fresh_allocator(Device device) {
  kernels::prepare_device(device);
  CachingAllocator& a = allocator_for(device);
  a.empty_cache();
  REQUIRE(a.stats().live_blocks == (device.is_cuda() ? 1 : 0));
}

inline Profile profile_of(const ModelConfig& cfg, int64_t batch, int iterations,
                          Device device = Device::cpu()) {
  fresh_allocator(device);
  Run base = make_run(cfg, batch, device);
  ProfileOptions po;
  po.warmup = 1;
  po.iterations = iterations;
  po.model_name = cfg.name;
  return profile_training(*base.trainer, po);
}

// Budgets for one policy: no budget, 70% and 50% of the no-remat peak (feasible or not), and
// two that the policy can meet by construction: the lowest peak it reaches, and halfway between
// that and the no-remat peak. The last two make every planner's budget compliance a real check.
// `cache`: what the planners found on the simulator, kept across its plans (PlanCache).
inline PlanOptions options_for(const PolicySpec& spec, BudgetOf of, PlanCache* cache = nullptr) {
  PlanOptions o;
  o.chain = spec.chain;
  o.budget_of = of;
  o.cache = cache;
  return o;
}

inline std::vector<Budget> budgets_for(const Simulator& sim, const PolicySpec& spec, BudgetOf of,
                                       PlanCache* cache = nullptr) {
  std::vector<Budget> out = {Budget(), Budget::parse("70%"), Budget::parse("50%")};
  if (spec.policy == "none") return out;
  const Plan probe = make_plan(sim, spec.policy, Budget::parse("1"), options_for(spec, of, cache));
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

inline void check_model(const ModelConfig& cfg, int64_t batch,
                        const std::vector<std::string>& labels, Device device = Device::cpu()) {
  const std::string& name = cfg.name;
  const Profile profile = profile_of(cfg, batch, 2, device);
  const Simulator sim(profile);
  PlanCache cache(sim);
  // The profiled iteration itself: the simulator reproduces it exactly.
  const SimResult none = sim.run(
      build_schedule(profile, std::vector<Decision>(profile.saved.size(), Decision::retain)));
  CHECK(none.peak_allocated == profile.peak_allocated);
  CHECK(none.peak_reserved == profile.peak_reserved);
  // The profile survives a JSON round trip.
  const Profile again = profile_from_json(profile_to_json(profile), "round trip");
  CHECK(Simulator(again)
            .run(build_schedule(again, std::vector<Decision>(again.saved.size(), Decision::retain)))
            .peak_allocated == profile.peak_allocated);

  // Reference training without remat: every step, the first included, peaks where profiled.
  Trace ref;
  {
    fresh_allocator(device);
    Run ref_run = make_run(cfg, batch, device);
    RematPipeline plain(*ref_run.trainer);
    ref = train(plain, ref_run, 3);
  }
  for (const MemoryStats& m : ref.memory) {
    CHECK(m.allocated.peak == profile.peak_allocated);
    CHECK(m.reserved.peak == profile.peak_reserved);
  }

  // Budgets of both kinds: allocated bytes (every policy lowers them on these models), and
  // reserved bytes, the default, run under the allocator's limit (a small model reserves a few
  // whole segments whatever its plan, so there the reserved budgets may all be out of reach).
  int recomputing_plans = 0, budgets_checked = 0, reserved_checked = 0, reserved_reachable = 0;
  for (BudgetOf of : {BudgetOf::allocated, BudgetOf::reserved}) {
    for (const std::string& label : labels) {
      const PolicySpec spec = parse_policy_spec(label);
      const std::string& policy = spec.policy;
      const std::vector<Budget> budgets = budgets_for(sim, spec, of, &cache);
      if (policy != "none" && of == BudgetOf::allocated) CHECK(budgets.size() == 5);
      if (of == BudgetOf::reserved && budgets.size() == 5) ++reserved_reachable;
      for (const Budget& budget : budgets) {
        const std::string btext = budget.str();
        CAPTURE(name);
        CAPTURE(label);
        CAPTURE(btext);
        CAPTURE(std::string(budget_of_name(of)));
        const Plan plan = make_plan(sim, policy, budget, options_for(spec, of, &cache));
        if (budget.kind == Budget::Kind::bytes) CHECK(plan.feasible);  // budgets_for's own two
        if (spec.chain == Chain::automatic && policy == "mutwo") {
          // auto is the better of the two modes: it fits whenever one fits, and is then no slower
          // than a mode that fits; without a budget (or when neither fits) it is within 1% of the
          // lower peak and, if both are, no slower.
          for (Chain c : {Chain::keep, Chain::drop}) {
            PlanOptions oc = options_for(spec, of, &cache);
            oc.chain = c;
            const Plan other = make_plan(sim, policy, budget, oc);
            if (other.feasible && plan.budget_bytes > 0) {
              CHECK(plan.feasible);
              CHECK(plan.predicted.time_ms <= other.predicted.time_ms);
            } else {
              CHECK(static_cast<double>(peak_of(plan.predicted, plan.budget_of)) <=
                    1.01 * static_cast<double>(peak_of(other.predicted, other.budget_of)));
            }
            CHECK(plan.lowest_peak <= other.lowest_peak);
          }
        }
        if (spec.chain == Chain::drop) CHECK_FALSE(plan.keep_chain);
        if (spec.chain == Chain::keep) CHECK(plan.keep_chain);
        if (plan.recomputed() > 0) ++recomputing_plans;
        fresh_allocator(device);
        Run run = make_run(cfg, batch, device);
        // Through the pipeline, as `regen train` runs a plan: a feasible plan under its limit (a
        // reserved budget), the persistent tensors made before the limit applies.
        RematPipeline pipe(*run.trainer);
        pipe.use_profile(profile);
        pipe.use_plan(plan);
        const Trace got = train(pipe, run, 3);
        // Bitwise identical training.
        check_same_training(got, ref);
        // Exact prediction, every step.
        for (size_t i = 0; i < got.memory.size(); ++i) {
          CHECK(got.memory[i].allocated.peak == plan.predicted.peak_allocated);
          CHECK(got.memory[i].reserved.peak == plan.predicted.peak_reserved);
          // No plan goes below the lower bound (docs/remat.md).
          CHECK(got.memory[i].allocated.peak >= plan.lower_bound);
        }
        CHECK(pipe.executor()->replays() == plan.predicted.replays);
        if (plan.feasible && plan.budget_bytes > 0) {
          ++budgets_checked;
          if (of == BudgetOf::reserved && plan.predicted.peak_reserved < none.peak_reserved)
            ++reserved_checked;
          for (const MemoryStats& m : got.memory) {
            CHECK(m.allocated.peak <= plan.budget_bytes);
            if (plan.budget_of == BudgetOf::reserved) CHECK(m.reserved.peak <= plan.budget_bytes);
          }
        }
        if (policy == "none") CHECK(plan.recomputed() == 0);
      }
    }
  }
  MESSAGE(name, ": ", budgets_checked, " budgets met, ", reserved_checked,
          " of them reserved "
          "budgets below the no-remat reserved peak");
  if (labels.size() > 1 || labels[0] != "none") {
    CHECK(recomputing_plans > 0);
    CHECK(budgets_checked >= 2);
  }
  // Where a policy lowers the reserved peak, its reserved budgets are met under the limit.
  if (reserved_reachable > 0) CHECK(reserved_checked > 0);
}

}  // namespace regen::testing
