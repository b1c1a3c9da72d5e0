// The three stages over one Trainer (pipeline.h).
#include "regen/remat/execute/pipeline.h"

#include "regen/autograd/tape.h"
#include "regen/core/error.h"

namespace regen {

void rethrow_with_plan(const OutOfMemory& e, const Plan& plan) {
  std::string msg = e.message();
  msg += "\n  the plan (" + plan.policy + ", budget " + plan.budget_text + " of " +
         budget_of_name(plan.budget_of) + " bytes) predicted a peak of " +
         format_bytes(plan.predicted.peak_allocated) + " allocated and " +
         format_bytes(plan.predicted.peak_reserved) + " reserved";
  if (!plan.predicted.peak_at.empty()) msg += ", reached at " + plan.predicted.peak_at;
  if (plan.limit > 0) msg += ", under the limit " + format_bytes(plan.limit);
  msg +=
      "; a step that runs out where the simulation did not is not the profiled step (another "
      "model, batch, input size, device or thread count?): profile again";
  throw OutOfMemory(msg, __FILE__, __LINE__);
}

namespace {

// Checks, at a step's canonical start, that the allocator holds exactly the live blocks the
// profiled step started from; then passes every call on to the caller's observer.
class StartCheck final : public StepObserver {
 public:
  // host: the device's host tier when the plan uses it (its cache is emptied and its peaks reset
  // at the step's start, as the device's are), with the layout it must start from.
  StartCheck(const LiveLayout& expected, int64_t step, StepObserver* next,
             CachingAllocator* host = nullptr, const LiveLayout* host_expected = nullptr)
      : expected_(expected), step_(step), next_(next), host_(host), host_expected_(host_expected) {}
  void on_iteration_begin(CachingAllocator& a) override {
    const std::string diff = describe_layout_difference(expected_, a.live_layout());
    REGEN_CHECK(diff.empty(), "step ", step_, " under the plan does not start from the allocator ",
                "state the profiled step started from: ", diff, ". Its memory cannot be ",
                "predicted: release what outlives a step (a tensor kept from an earlier step?), ",
                "or profile again");
    if (host_) {
      host_->empty_cache();
      host_->reset_peak();
      const std::string hdiff = describe_layout_difference(*host_expected_, host_->live_layout());
      REGEN_CHECK(hdiff.empty(), "step ", step_, " under the plan does not start from the host ",
                  "tier's planned state: ", hdiff,
                  ". Its memory cannot be predicted: something else keeps host-tier memory "
                  "between steps");
    }
    if (next_) next_->on_iteration_begin(a);
  }
  void on_optimizer_begin(CachingAllocator& a) override {
    if (next_) next_->on_optimizer_begin(a);
  }
  void on_optimizer_end(CachingAllocator& a) override {
    if (next_) next_->on_optimizer_end(a);
  }
  void on_iteration_end(CachingAllocator& a) override {
    if (next_) next_->on_iteration_end(a);
  }
  void on_micro_batch_end(CachingAllocator& a, int64_t index) override {
    if (next_) next_->on_micro_batch_end(a, index);
  }

 private:
  const LiveLayout& expected_;
  int64_t step_;
  StepObserver* next_;
  CachingAllocator* host_;
  const LiveLayout* host_expected_;
};

}  // namespace

RematPipeline::RematPipeline(Trainer& trainer) : trainer_(trainer) {}

RematPipeline::~RematPipeline() {
  finish();
  try {
    state_to_device();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "regen: moving the optimizer state back to the device failed: %s\n",
                 e.what());
  }
}

bool RematPipeline::uses_host_tier() const {
  return exec_ && (!exec_->schedule().offloads.empty() ||
                   exec_->schedule().optimizer_state == StatePlace::host);
}

void RematPipeline::state_to_device() {
  if (!state_on_host_) return;
  exec_->move_optimizer_state(trainer_.optimizer(), StatePlace::device);
  state_on_host_ = false;
}

const Profile& RematPipeline::profile(ProfileOptions options) {
  finish();
  clear_plan();
  if (options.model_name.empty()) options.model_name = trainer_.model().config().name;
  Profile p = profile_training(trainer_, options);
  steps_done_ += options.warmup + options.iterations;
  profile_ = std::make_unique<Profile>(std::move(p));
  sim_ = std::make_unique<Simulator>(*profile_);
  return *profile_;
}

const Profile& RematPipeline::use_profile(Profile profile) {
  const std::string& model = trainer_.model().config().name;
  const std::string device = trainer_.device().str();
  REGEN_CHECK(profile.model == model, "the profile is for model ", profile.model, ", not ", model);
  REGEN_CHECK(profile.batch == trainer_.batch_size(), "the profile of ", model, " is for batch ",
              profile.batch, ", not ", trainer_.batch_size());
  REGEN_CHECK(profile.device == device, "the profile of ", model, " was recorded on ",
              profile.device, ", not ", device);
  REGEN_CHECK(profile.accumulate == trainer_.accumulation(), "the profile of ", model, " is of ",
              profile.accumulate, " micro-batch(es) per step, not ", trainer_.accumulation(),
              " (--accumulate): profile again");
  finish();
  clear_plan();
  profile_ = std::make_unique<Profile>(std::move(profile));
  sim_ = std::make_unique<Simulator>(*profile_);
  return *profile_;
}

const Profile& RematPipeline::current_profile() const {
  REGEN_CHECK(profile_ != nullptr,
              "the pipeline has no profile yet: call profile() or use_profile()");
  return *profile_;
}

const Simulator& RematPipeline::simulator() const {
  current_profile();
  return *sim_;
}

const Plan& RematPipeline::plan(const std::string& policy, const Budget& budget,
                                const PlanOptions& options) {
  set_plan(make_plan(simulator(), policy, budget, options));
  return *plan_;
}

const Plan& RematPipeline::use_plan(Plan plan) {
  check_plan_decisions(plan, current_profile());
  set_plan(std::move(plan));
  return *plan_;
}

void RematPipeline::set_plan(Plan plan) {
  finish();
  state_to_device();
  exec_.reset();
  dtr_ = nullptr;
  plan_ = std::make_unique<Plan>(std::move(plan));
  plan_steps_ = 0;
  const std::optional<DtrOptions> dtr = dtr_policy(plan_->policy);
  if (plan_->predicted.peak_at.empty()) {  // where the peak is, for an out-of-memory report
    SimOptions so;
    so.limit = plan_->limit;
    so.layout = plan_->layout;
    so.top_live = 1;
    plan_->predicted.peak_at = dtr ? simulate_dtr(*sim_, *dtr, plan_->limit, so).peak_at
                                   : sim_->run(plan_schedule(*profile_, *plan_), so).peak_at;
  }
  if (dtr) {
    auto exec = std::make_unique<DtrExecutor>(*profile_, *dtr, trainer_.allocator());
    dtr_ = exec.get();
    exec_ = std::move(exec);
  } else {
    exec_ = std::make_unique<RematExecutor>(*profile_, plan_schedule(*profile_, *plan_));
  }
  const StartLayouts starts = start_layouts(*profile_, exec_->schedule());
  start_ = starts.device;
  host_start_ = starts.host;
  predicted_steps_ = exact_steps_ = first_inexact_step_ = 0;
}

const Plan& RematPipeline::current_plan() const {
  REGEN_CHECK(plan_ != nullptr, "the pipeline has no plan yet: call plan() or use_plan()");
  return *plan_;
}

void RematPipeline::clear_plan() {
  finish();
  state_to_device();
  dtr_ = nullptr;
  exec_.reset();
  plan_.reset();
}

void RematPipeline::set_limit(int64_t limit) {
  finish();
  limit_override_ = limit;
}

void RematPipeline::install() {
  if (hooks_ || !exec_) return;
  // The persistent tensors (gradients, optimizer state) exist before the limit applies, as they
  // did when the step was profiled.
  trainer_.prepare();
  CachingAllocator& a = trainer_.allocator();
  // Optimizer state on the host tier: moved there once, before the first step under the plan
  // (start_layouts predicts the layouts it leaves).
  if (exec_->schedule().optimizer_state == StatePlace::host && !state_on_host_) {
    exec_->move_optimizer_state(trainer_.optimizer(), StatePlace::host);
    state_on_host_ = true;
  }
  optimizer_hooks_ = std::make_unique<OptimizerHooksScope>(
      trainer_.optimizer(), exec_->optimizer_hooks(trainer_.optimizer()));
  limit_ = std::make_unique<LimitScope>(a, limit_override_ >= 0 ? limit_override_ : plan_->limit);
  layout_ = std::make_unique<LayoutScope>(a, plan_->layout);
  if (dtr_) {
    DtrEngine* engine = &dtr_->engine();
    eviction_ = std::make_unique<EvictionScope>(
        a, [engine](const EvictionRequest& r) { return engine->evict_for(r); });
  }
  hooks_ = std::make_unique<HooksScope>(exec_.get());
}

void RematPipeline::set_cuda_graph(CudaGraphMode mode) {
  graph_mode_ = mode;
  if (mode == CudaGraphMode::off) drop_graph();
}

std::string RematPipeline::cuda_graph_refusal() const {
  return regen::cuda_graph_refusal(trainer_, plan_.get(), plan_ && uses_host_tier());
}

const CudaGraphStep* RematPipeline::cuda_graph() const {
#ifdef REGEN_WITH_CUDA
  return graph_.get();
#else
  return nullptr;
#endif
}

void RematPipeline::drop_graph() {
#ifdef REGEN_WITH_CUDA
  graph_.reset();
#endif
}

void RematPipeline::finish() {
  drop_graph();  // its addresses go with the layout
  hooks_.reset();
  eviction_.reset();
  layout_.reset();
  limit_.reset();
  optimizer_hooks_.reset();
}

StepResult RematPipeline::step(StepObserver* observer) {
  install();
  StepResult r;
  const bool host = plan_ && uses_host_tier();
  CachingAllocator* host_tier = host ? &host_allocator_for(trainer_.device()) : nullptr;
  StartCheck check(start_, steps_done_ + 1, observer, host_tier, &host_start_);
#ifdef REGEN_WITH_CUDA
  // Under a plan that can be captured: the first step warms up, the second is captured, the
  // later ones replay it (a replay allocates nothing, so the start check has nothing to check).
  const bool graphed = graph_mode_ != CudaGraphMode::off && plan_ && observer == nullptr &&
                       cuda_graph_refusal().empty();
  const bool replay = graphed && graph_ && graph_->captured();
  if (graphed && !replay && plan_steps_ >= 1) {
    graph_ = std::make_unique<CudaGraphStep>(trainer_);
    trainer_.set_step_capture(graph_.get());
  }
#endif
  try {
#ifdef REGEN_WITH_CUDA
    if (replay) {
      r = graph_->replay();
    } else {
      r = trainer_.step(plan_ ? &check : observer);
      if (graph_ && graph_->captured() && graph_->replays() == 0) graph_->set_memory(r.memory);
    }
#else
    r = trainer_.step(plan_ ? &check : observer);
#endif
  } catch (const OutOfMemory& e) {
    trainer_.set_step_capture(nullptr);
    drop_graph();
    hooks_.reset();  // the rest of the plan goes with the pipeline (its tensors may still be live)
    eviction_.reset();
    if (plan_) rethrow_with_plan(e, *plan_);
    throw;
  } catch (...) {
    trainer_.set_step_capture(nullptr);
#ifdef REGEN_WITH_CUDA
    if (graph_ && !graph_->captured()) {
      // A capture that failed half-way: the step's tensors (on the tape, in the executor) are
      // planned blocks, which must go before the layout can.
      Tape::current().clear();
      hooks_.reset();
      eviction_.reset();
    }
#endif
    drop_graph();
    throw;
  }
  ++steps_done_;
  if (plan_) ++plan_steps_;
  if (plan_ && limit_override_ < 0) {
    r.predicted = true;
    r.predicted_allocated = plan_->predicted.peak_allocated;
    r.predicted_reserved = plan_->predicted.peak_reserved;
    if (host_tier) {
      r.host_predicted = true;
      r.host_memory = host_tier->stats();
      r.predicted_host_allocated = plan_->predicted.host_peak_allocated;
      r.predicted_host_reserved = plan_->predicted.host_peak_reserved;
    }
    ++predicted_steps_;
    // DTR decides at run time: its evictions and replays are predicted too.
    const bool same_work = !dtr_ || (dtr_->evictions() == plan_->predicted.evictions &&
                                     dtr_->replays() == plan_->predicted.replays);
    if (r.exact() && same_work) {
      ++exact_steps_;
    } else if (first_inexact_step_ == 0) {
      first_inexact_step_ = predicted_steps_;
    }
  }
  return r;
}

std::vector<StepResult> RematPipeline::train(
    int64_t steps, const std::function<bool(int64_t, const StepResult&)>& progress) {
  std::vector<StepResult> out;
  for (int64_t i = 0; i < steps; ++i) {
    out.push_back(step());
    if (progress && !progress(i + 1, out.back())) break;
  }
  return out;
}

}  // namespace regen
