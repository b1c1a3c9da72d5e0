// The offload requirements, shared by the CPU suite (tests/test_offload.cpp) and the CUDA suite
// (tests/cuda/test_cuda_offload.cpp): plans that offload saved tensors and keep the optimizer state
// on the host tier train bitwise as without remat, and every step measures the predicted peaks of
// the device and of its host tier.
#pragma once

#include "tests/remat_suite.h"

namespace regen::testing {

// Every offloadable tensor offloaded (the rest retained), optimizer state where `place` says.
inline Plan offload_everything(const Simulator& sim, StatePlace place, const TransferModel& t,
                               const Budget& budget = Budget()) {
  const Profile& p = sim.profile();
  Plan draft;
  draft.decisions.assign(p.saved.size(), Fate::retain);
  for (const ProfileSaved& s : p.saved) {
    if (s.offloadable) draft.decisions[static_cast<size_t>(s.index)] = Fate::offload;
  }
  draft.optimizer_state = place;
  draft.transfer = t;
  PlanCache cache(sim);
  PlanOptions o;
  o.cache = &cache;
  Plan plan = finish_plan(sim, draft, budget, o);
  plan.policy = "offload-everything";  // a hand-made plan's name (plan.json needs one)
  return plan;
}

// Training under `plan` is bitwise the run without remat, and every step's peaks, on the device and
// on its host tier, are the predicted ones. `device`: the one `o` names (the CUDA suite's cuda:0).
inline void check_exact_training(const ModelConfig& cfg, int64_t batch, const Profile& p,
                                 const Plan& plan, const Trace& ref, SessionOptions o,
                                 Device device = Device::cpu()) {
  fresh_allocator(device);
  host_allocator_for(device).empty_cache();
  std::unique_ptr<Session> s = make_session(o, Preflight::none);
  Run run;
  run.model = std::move(s->model);
  run.opt = std::move(s->optimizer);
  run.data = std::move(s->data);
  run.trainer = std::move(s->trainer);
  (void)cfg;
  (void)batch;
  RematPipeline pipe(*run.trainer);
  pipe.use_profile(p);
  pipe.use_plan(plan);
  std::vector<StepResult> steps = pipe.train(3);
  REQUIRE(steps.size() == 3);
  for (const StepResult& r : steps) {
    CHECK(r.host_predicted == plan.uses_host());
    CHECK(r.memory.allocated.peak == plan.predicted.peak_allocated);
    CHECK(r.memory.reserved.peak == plan.predicted.peak_reserved);
    CHECK(r.host_memory.allocated.peak == plan.predicted.host_peak_allocated);
    CHECK(r.host_memory.reserved.peak == plan.predicted.host_peak_reserved);
  }
  CHECK(pipe.exact_steps() == 3);
  CHECK(pipe.executor()->offload().offloads == plan.offloaded());
  CHECK(pipe.executor()->offload().bytes_to_host == plan.predicted.bytes_to_host);
  CHECK(pipe.executor()->offload().bytes_to_device == plan.predicted.bytes_to_device);
  CHECK(pipe.executor()->replays() == plan.predicted.replays);
  Trace got;
  for (const StepResult& r : steps) got.losses.push_back(r.loss);
  pipe.finish();
  got = trace_of(run, std::move(got));
  check_same_training(got, ref);
}

inline Trace reference(SessionOptions o, Device device = Device::cpu()) {
  fresh_allocator(device);
  std::unique_ptr<Session> s = make_session(o, Preflight::none);
  Run run;
  run.model = std::move(s->model);
  run.opt = std::move(s->optimizer);
  run.data = std::move(s->data);
  run.trainer = std::move(s->trainer);
  RematPipeline plain(*run.trainer);
  return train(plain, run, 3);
}

}  // namespace regen::testing
