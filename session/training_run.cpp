// The one training loop (training_run.h).
#include "regen/session/training_run.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "regen/core/numeric.h"
#include "regen/dist/world.h"
#include "regen/session/checkpoint.h"

namespace regen {

// ---------------------------------------------------------------------------------------------
// What a run keeps

namespace {
// The median of `v` past its first value (the first step pays first-touch costs), or of all of it
// when it has one value; 0 when empty.
double median_after_first(const std::vector<double>& v) {
  if (v.empty()) return 0;
  if (v.size() == 1) return v[0];
  return median(std::vector<double>(v.begin() + 1, v.end()));
}
}  // namespace

double TrainingStats::median_ms() const {
  return median_after_first(ms);
}

double TrainingStats::median_cpu_cores() const {
  return median_after_first(cpu_cores);
}

// ---------------------------------------------------------------------------------------------
// The run

TrainingRun::TrainingRun(Session& session, RematPipeline& pipe, TrainingRunOptions options)
    : session_(session), pipe_(pipe), options_(options) {
  pipe_.set_cuda_graph(
      parse_cuda_graph_mode(session_.options.cuda_graph, session_.options.name("cuda_graph")));
}

std::string TrainingRun::cuda_graph_setting() const {
  const SessionOptions& o = session_.options;
  return option_setting("cuda_graph",
                        o.style == OptionStyle::keyword ? "'" + o.cuda_graph + "'" : o.cuda_graph,
                        o.style);
}

std::string TrainingRun::cuda_graph_refusal() const {
  if (pipe_.cuda_graph_mode() == CudaGraphMode::off) return "";
  return pipe_.cuda_graph_refusal();
}

void TrainingRun::observe(TrainingObserver& observer) {
  observers_.push_back(&observer);
}

int64_t TrainingRun::examples_per_step() const {
  const SessionOptions& o = session_.options;
  return o.batch * o.accumulate * dist::world().size();
}

void TrainingRun::notify_step(const StepEvent& e) {
  for (TrainingObserver* o : observers_) o->on_step(*this, e);
}

bool TrainingRun::notify_step_end(const StepEvent& e) {
  bool go_on = true;
  // Every observer hears of the step, whether or not one before it stops the run.
  for (TrainingObserver* o : observers_) go_on = o->on_step_end(*this, e) && go_on;
  return go_on;
}

void TrainingRun::abort_with(const std::string& message) {
  for (TrainingObserver* o : observers_) o->on_abort(*this);
  REGEN_FAIL(message);
}

void TrainingRun::check_loss(const StepResult& r) {
  // An fp16 step that overflowed was skipped (the loss scale halved): not a divergence.
  if (!options_.check_finite || std::isfinite(r.loss) || r.skipped) return;
  const SessionOptions& o = session_.options;
  abort_with(detail::str_cat("training diverged: the loss of step ", r.optimizer_step, " is ",
                             r.loss, " (not finite); try a lower ", o.name("lr"),
                             " (this run used ", option_setting("lr", number_text(o.lr), o.style),
                             ")"));
}

void TrainingRun::scan_parameters(int64_t step, bool skipped) {
  if (!options_.check_finite) return;
  // A skipped fp16 step's gradients hold what overflowed (its update was not applied).
  const std::string bad = first_non_finite(*session_.model, !skipped);
  if (bad.empty()) return;
  const SessionOptions& o = session_.options;
  abort_with(detail::str_cat("training diverged: after step ", step, " the ", bad,
                             " (not finite); try a lower ", o.name("lr"), " (this run used ",
                             option_setting("lr", number_text(o.lr), o.style), ")"));
}

void TrainingRun::record(const StepResult& r) {
  TrainingStats& s = stats_;
  if (r.predicted && !r.exact() && !s.first_inexact.predicted) s.first_inexact = r;
  s.losses.push_back(r.loss);
  s.ms.push_back(r.ms);
  s.cpu_cores.push_back(r.cpu_cores());
  if (r.memory.allocated.peak > s.peak_allocated) s.at_peak = r.memory;
  s.peak_allocated = std::max(s.peak_allocated, r.memory.allocated.peak);
  s.peak_reserved = std::max(s.peak_reserved, r.memory.reserved.peak);
  if (r.host_predicted) {
    s.host_peak_allocated = std::max(s.host_peak_allocated, r.host_memory.allocated.peak);
    s.host_peak_reserved = std::max(s.host_peak_reserved, r.host_memory.reserved.peak);
  }
}

const Profile& TrainingRun::profile(ProfileOptions options) {
  // --cuda-graph on where no plan could be captured is refused before the profiling steps train.
  if (pipe_.cuda_graph_mode() == CudaGraphMode::on) {
    const std::string refusal = cuda_graph_step_refusal(pipe_.trainer());
    REGEN_CHECK(refusal.empty(), cuda_graph_setting(),
                ": the steps cannot be captured as one CUDA graph: ", refusal);
  }
  const auto theirs = options.on_step;
  int64_t index = 0;
  const int64_t count = int64_t{options.warmup} + options.iterations;
  options.on_step = [&, theirs](const StepResult& r) {
    check_loss(r);
    if (theirs) theirs(r);
    StepEvent e;
    e.step = session_.trainer->optimizer_steps();
    e.index = ++index;
    e.count = count;
    e.profiling = true;
    e.result = &r;
    notify_step(e);
  };
  return pipe_.profile(options);
}

void TrainingRun::check_plan() const {
  if (!pipe_.has_plan()) return;
  const Plan& plan = pipe_.current_plan();
  const SessionOptions& o = session_.options;
  const bool keyword = o.style == OptionStyle::keyword;
  // A plan that does not fit its budget is refused now, with the simulated numbers, rather than
  // found out by an out-of-memory error in the middle of a step.
  if (!plan.feasible) {
    // A planner that evicts at step time has no budget-of to change.
    const PlannerInfo* planner = find_planner(plan.policy);
    const bool at_step_time = planner != nullptr && planner->at_step_time.has_value();
    std::string what_to_do;
    if (keyword) {
      what_to_do = at_step_time ? "Use a larger budget or another policy"
                                : "Use a larger budget, another policy, or budget_of='allocated'";
    } else {
      what_to_do = at_step_time
                       ? "Pass a larger --budget or another --policy"
                       : "Pass a larger --budget, another --policy, or --budget-of allocated";
    }
    // A fused LM head making its gradients in the forward holds its weight's f32 gradient across
    // the step, where no plan can free it: recomputing its logits holds less.
    const ModelConfig c = o.model_config();
    const auto& options = model_info(o.model).input.options;
    const bool head_option = std::any_of(options.begin(), options.end(), [](const ModelOption& m) {
      return m.key == "lm_head_recompute";
    });
    if (head_option && c.head_chunk_rows >= 0 && c.head_recompute == 0) {
      what_to_do += std::string("; or let the fused LM head recompute its logits in backward (") +
                    option_setting("lm_head_recompute", "1", o.style) +
                    "), which holds no f32 gradient of its weight across the step";
    }
    REGEN_FAIL("the plan does not fit its budget, so training stops before it starts: ", plan.note,
               plan.predicted.oom ? "; under the limit the simulated step runs out of memory at " +
                                        plan.predicted.oom_at
                                  : std::string(),
               ". ", what_to_do);
  }
  const int64_t have = available_memory(session_.device);
  REGEN_CHECK(have <= 0 || plan.predicted.peak_reserved <= have, "the plan's steps reserve ",
              format_bytes(plan.predicted.peak_reserved), " (exact, simulated), but ",
              session_.device.str(), " has ", format_bytes(have), " available; ",
              keyword ? "plan with a budget of at most that, or use a smaller batch"
                      : "pass a --budget of at most that, or a smaller --batch");
}

EvalResult TrainingRun::evaluate(int64_t step) {
  // Without the plan's hooks and layout (they are the training step's), under its limit.
  pipe_.finish();
  const int64_t limit = pipe_.has_plan() ? pipe_.current_plan().limit : 0;
  EvalResult e;
  {
    LimitScope scope(session_.trainer->allocator(), limit);
    try {
      e = evaluate_session(session_);
    } catch (const OutOfMemory& oom) {
      const SessionOptions& o = session_.options;
      abort_with(detail::str_cat("evaluation after step ", step,
                                 " ran out of memory under the plan's limit ", format_bytes(limit),
                                 ": ", oom.message(), "; ",
                                 o.style == OptionStyle::keyword ? "use" : "pass", " a smaller ",
                                 o.name("eval_batch"), " (now ", o.evaluation_batch(), ")"));
    }
  }
  for (TrainingObserver* obs : observers_) obs->on_eval(*this, step, e);
  return e;
}

std::vector<StepResult> TrainingRun::run(int64_t steps) {
  REGEN_CHECK(steps >= 1, "a training run takes at least one step, got ", steps);
  if (options_.check_plan) check_plan();
  // CUDA graphs: `on` that cannot capture is refused now, `auto` says once why it does not.
  const std::string refusal = cuda_graph_refusal();
  if (!refusal.empty()) {
    REGEN_CHECK(pipe_.cuda_graph_mode() != CudaGraphMode::on, cuda_graph_setting(),
                ": the steps cannot be captured as one CUDA graph: ", refusal);
    if (!graph_note_said_) {
      std::fprintf(stderr, "regen: %s: the steps run uncaptured: %s\n",
                   cuda_graph_setting().c_str(), refusal.c_str());
      graph_note_said_ = true;
    }
  }
  const SessionOptions& o = session_.options;
  const bool on_cpu = session_.device.is_cpu();
  std::vector<StepResult> out;
  out.reserve(static_cast<size_t>(std::min<int64_t>(steps, 1 << 16)));
  for (int64_t i = 1; i <= steps; ++i) {
    // Under the plan, from the first step on; an out-of-memory error names what it predicted.
    const StepResult r = pipe_.step();
    check_loss(r);
    // A step can leave a parameter or gradient not finite while its loss still is (the next
    // step's loss then is not): on the CPU they are read in place every scan_every steps, and on
    // either device after the last step, so a model that is not finite is never handed back.
    bool scanned = false;
    if (i == steps ||
        (on_cpu && options_.scan_every > 0 && r.optimizer_step % options_.scan_every == 0)) {
      scan_parameters(r.optimizer_step, r.skipped);
      scanned = true;
    }
    record(r);
    out.push_back(r);
    StepEvent e;
    e.step = r.optimizer_step;
    e.index = i;
    e.count = steps;
    e.result = &out.back();
    notify_step(e);
    if (options_.evaluate && o.eval_every > 0 &&
        (r.optimizer_step % o.eval_every == 0 || i == steps))
      evaluate(r.optimizer_step);
    if (!notify_step_end(e) && i < steps) {
      if (!scanned) scan_parameters(r.optimizer_step, r.skipped);
      break;
    }
  }
  pipe_.finish();
  return out;
}

void TrainingRun::check_predictions(int64_t offset) const {
  const TrainingStats& s = stats_;
  // A step whose peaks were not the predicted ones breaks regen's promise.
  REGEN_CHECK(
      !s.first_inexact.predicted, "step ", pipe_.first_inexact_step() + offset,
      " under the plan measured a peak of ", format_bytes(s.first_inexact.memory.allocated.peak),
      " allocated and ", format_bytes(s.first_inexact.memory.reserved.peak),
      " reserved where the plan predicted ", format_bytes(s.first_inexact.predicted_allocated),
      " and ", format_bytes(s.first_inexact.predicted_reserved),
      ": the prediction did not hold (a bug in regen: please report it with the command)");
  // Under DTR the evictions and replays are predicted as well (RematPipeline::step counts a step
  // exact only when they were the predicted ones).
  REGEN_CHECK(pipe_.first_inexact_step() == 0, "step ", pipe_.first_inexact_step() + offset,
              " under the ", pipe_.has_plan() ? pipe_.current_plan().policy : std::string(),
              " plan made other evictions or replays than the simulation predicted: the "
              "prediction did not hold (a bug in regen: please report it with the command)");
}

// ---------------------------------------------------------------------------------------------
// Measured runs

MeasuredRun measure_training(const SessionOptions& o, int steps, const Profile* profile,
                             const Plan* plan, int64_t limit) {
  REGEN_CHECK(plan == nullptr || profile != nullptr, "measure_training: a plan needs its profile");
  allocator_for(resolve_device(o.device, o.style)).empty_cache();
  auto s = make_session(o);
  RematPipeline pipe(*s->trainer);
  if (plan) {
    pipe.use_profile(*profile);
    pipe.use_plan(*plan);
    pipe.set_limit(limit);
  }
  TrainingRunOptions ro;
  ro.check_finite = false;
  ro.evaluate = false;
  ro.check_plan = false;
  TrainingRun run(*s, pipe, ro);
  run.run(steps);
  const TrainingStats& st = run.stats();
  MeasuredRun r;
  r.peak = st.peak_allocated;
  r.reserved = st.peak_reserved;
  r.host_peak = st.host_peak_allocated;
  r.host_reserved = st.host_peak_reserved;
  if (const RematExecutor* exec = pipe.executor()) {
    r.regen_ms = exec->regen_ms();
    r.replays = exec->replays();
    r.stall_ms = exec->offload().stall_ms;
  }
  r.steps_predicted = pipe.predicted_steps();
  r.steps_exact = pipe.exact_steps();
  // Under mpirun: the highest peaks of any rank, and a step exact only when it was on every rank.
  dist::World& world = dist::world();
  if (world.distributed()) {
    for (int64_t v : world.all_gather(r.peak)) r.peak = std::max(r.peak, v);
    for (int64_t v : world.all_gather(r.reserved)) r.reserved = std::max(r.reserved, v);
    for (int64_t v : world.all_gather(r.steps_exact)) r.steps_exact = std::min(r.steps_exact, v);
  }
  r.ms = st.median_ms();
  if (s->device.is_cpu()) {
    r.cpu_cores = st.median_cpu_cores();
    r.threads = omp_get_max_threads();
  }
  return r;
}

}  // namespace regen
