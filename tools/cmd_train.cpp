// `regen train`: trains a registered model from the command line, optionally under a memory budget
// with a rematerialization policy (profile, plan, then train with the plan). The header and the
// summary name the precision (--precision, which holds the math mode: fp32 unless asked).
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include <memory>

#include "regen/core/io.h"
#include "regen/core/numeric.h"
#include "regen/dist/data_parallel.h"
#include "regen/dist/world.h"
#include "regen/models/gpt2_llmc.h"
#include "regen/models/metrics_log.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/session/plan_request.h"
#include "regen/session/training_run.h"
#include "tools/command.h"
#include "tools/common.h"
#include "tools/distributed.h"

namespace regen::tool {
namespace {

struct TrainFlags {
  SessionOptions m;
  int64_t steps = 20;
  std::string save, load;
  PlanRequest plan;  // --policy, --budget, --budget-of, --layout, --chain, --offload, --transfer
  std::string profile_file, plan_file;
  int profile_steps = 2;
  std::string progress = "auto";
  bool layout_given = false;     // --layout on the command line (with --plan, the plan has its own)
  bool grad_norm_given = false;  // --grad-norm on the command line (else --log turns it on)
  // The training state (exact resume) and the metrics log.
  std::string save_state, resume, log;
  int64_t save_every = 0;
};

// "1h02m", "3m05s", "12s".
std::string format_eta(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%llds", s);
  }
  return buf;
}

// `eta_s`: the seconds the remaining steps should take (negative: not known yet).
void print_step(bool bar, int64_t step, int64_t steps, const StepResult& r, int64_t batch,
                int64_t peak, double eta_s) {
  const double sps = r.ms > 0 ? 1000.0 * batch / r.ms : 0;
  char extra[160] = "";
  int n = 0;
  if (r.lr > 0) n += std::snprintf(extra + n, sizeof extra - n, " lr %.3g", r.lr);
  if (r.grad_norm >= 0)
    n += std::snprintf(extra + n, sizeof extra - n, " | grad norm %.3g", r.grad_norm);
  if (r.loss_scale > 0) {
    n += std::snprintf(extra + n, sizeof extra - n, " | scale %g%s", r.loss_scale,
                       r.skipped ? " (overflow: step skipped)" : "");
  }
  const std::string eta = step == steps ? std::string("done") : format_eta(eta_s);
  if (bar) {
    const int width = 24;
    const int done = static_cast<int>(width * step / steps);
    std::printf(
        "\rstep %lld/%lld [%s%s] loss %.4f%s | %s/step | %.1f samples/s | peak %s | ETA %s ",
        static_cast<long long>(step), static_cast<long long>(steps),
        std::string(static_cast<size_t>(done), '=').c_str(),
        std::string(static_cast<size_t>(width - done), ' ').c_str(), r.loss, extra,
        format_ms(r.ms).c_str(), sps, format_bytes(peak).c_str(), eta.c_str());
    if (step == steps) std::printf("\n");
  } else {
    std::printf("step %lld/%lld loss %.4f%s time %s samples/s %.1f peak %s eta %s\n",
                static_cast<long long>(step), static_cast<long long>(steps), r.loss, extra,
                format_ms(r.ms).c_str(), sps, format_bytes(peak).c_str(), eta.c_str());
  }
  std::fflush(stdout);
}

// The job's data parallelism, under the header.
void print_data_parallel(const dist::DataParallel& dp, const SessionOptions& m,
                         const dist::World& world) {
  int64_t bytes = 0;
  for (const dist::BucketInfo& b : dp.buckets()) {
    bytes += b.elements * static_cast<int64_t>(dtype_size(b.dtype));
  }
  const dist::DataParallelOptions& o = dp.options();
  std::printf(
      "data parallel: %d ranks (%s collectives on %s), global batch %lld (%lld per rank)%s, "
      "shard %s, %zu gradient buckets of %s in all (the first up to %s, then up to %s; %d in "
      "flight)\n",
      world.size(), dp.communicator().backend(), dp.communicator().device().str().c_str(),
      static_cast<long long>(m.batch * world.size()), static_cast<long long>(m.batch),
      m.accumulate > 1
          ? (" x " + std::to_string(m.accumulate) + " micro-batches, reduced once per step").c_str()
          : "",
      dist::shard_mode_name(o.shard), dp.buckets().size(), format_bytes(bytes).c_str(),
      format_bytes(o.first_bucket_bytes).c_str(), format_bytes(o.bucket_bytes).c_str(),
      o.max_in_flight);
}

// Every rank's figures, printed by rank 0: communication and how much backward hid, peaks, and
// under a plan whether each rank's steps measured exactly the predicted peaks.
void print_rank_summary(dist::World& world, const std::vector<dist::SyncStats>& steps,
                        int64_t peak_alloc, int64_t peak_reserved, const RematPipeline& pipe,
                        int64_t profiled) {
  // Medians over the steps after the first (which pays first-touch costs), like the step time.
  std::vector<double> comm, exposed, gather;
  int64_t gathers = 0, prefetched = 0;  // ZeRO-3, the last step's
  for (size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i) {
    comm.push_back(steps[i].backward_comm_ms);
    exposed.push_back(steps[i].exposed_ms);
    gather.push_back(steps[i].optimizer_comm_ms + steps[i].optimizer_wait_ms);
    gathers = steps[i].gathers;
    prefetched = steps[i].prefetched;
  }
  const double c = comm.empty() ? 0 : median(comm), e = exposed.empty() ? 0 : median(exposed);
  const double g = gather.empty() ? 0 : median(gather);
  const std::vector<double> all_comm = world.all_gather(c), all_exposed = world.all_gather(e);
  const std::vector<double> all_gather_ms = world.all_gather(g);
  const std::vector<int64_t> all_alloc = world.all_gather(peak_alloc);
  const std::vector<int64_t> all_reserved = world.all_gather(peak_reserved);
  const std::vector<int64_t> all_checked = world.all_gather(pipe.predicted_steps());
  const std::vector<int64_t> all_exact = world.all_gather(pipe.exact_steps());
  const std::vector<int64_t> all_gathers = world.all_gather(gathers);
  const std::vector<int64_t> all_prefetched = world.all_gather(prefetched);
  const bool planned = pipe.has_plan();
  std::printf("  per rank (medians over the steps after the first%s):\n",
              profiled > 0 ? "; peaks over every step" : "");
  for (int r = 0; r < world.size(); ++r) {
    const size_t i = static_cast<size_t>(r);
    const double hidden =
        all_comm[i] > 0 ? 100.0 * std::max(0.0, 1.0 - all_exposed[i] / all_comm[i]) : 100.0;
    if (all_gathers[i] > 0) {
      // ZeRO-3: the parameters' gathers (forward's, a plan's in backward) and the gradients'
      // reductions, in the ops.
      std::printf(
          "    rank %d: parameter gathers and gradient reductions %s per step, %s of it exposed "
          "(%.0f%% hidden behind compute; %lld of the last step's %lld gathers prefetched); peak "
          "allocated %s, reserved %s",
          r, format_ms(all_comm[i]).c_str(), format_ms(all_exposed[i]).c_str(), hidden,
          static_cast<long long>(all_prefetched[i]), static_cast<long long>(all_gathers[i]),
          format_bytes(all_alloc[i]).c_str(), format_bytes(all_reserved[i]).c_str());
    } else {
      std::printf(
          "    rank %d: gradient communication %s per step, %s of it exposed (%.0f%% hidden "
          "behind backward)%s; peak allocated %s, reserved %s",
          r, format_ms(all_comm[i]).c_str(), format_ms(all_exposed[i]).c_str(), hidden,
          all_gather_ms[i] > 0 ? (", parameter gather " + format_ms(all_gather_ms[i])).c_str() : "",
          format_bytes(all_alloc[i]).c_str(), format_bytes(all_reserved[i]).c_str());
    }
    if (planned) {
      std::printf(
          "; %s",
          all_exact[i] == all_checked[i]
              ? ("exact on all " + std::to_string(all_checked[i]) + " steps under the plan").c_str()
              : ("exact on " + std::to_string(all_exact[i]) + " of " +
                 std::to_string(all_checked[i]) + " steps under the plan")
                    .c_str());
    }
    std::printf("\n");
  }
}

// The plan's identity in a training state (plan_identity), or "no plan".
std::map<std::string, std::string> state_identity(const RematPipeline& pipe) {
  return pipe.has_plan() ? plan_identity(pipe.current_plan())
                         : std::map<std::string, std::string>{{"plan", "no plan"}};
}

// The steps between progress lines of a run of `steps` steps: every one up to 50, else 20 lines.
int64_t progress_every(int64_t steps) {
  return steps <= 50 ? 1 : steps / 20;
}

// What `regen train` shows of the steps and writes of them: progress lines or a bar, evaluations,
// the metrics log (profiling steps included: they train), the training state every --save-every
// steps, and each step's communication under mpirun.
class ConsoleObserver : public TrainingObserver {
 public:
  ConsoleObserver(const TrainFlags& f, MetricsLog* log, const dist::DataParallel* dp,
                  int64_t examples, const dist::World& world)
      : f_(f), log_(log), dp_(dp), examples_(examples) {
    mode_ = f.progress;
    // Under mpirun a rank's stdout is a terminal of Open MPI's even when the job's output goes
    // to a file: plain lines there.
    if (mode_ == "auto") mode_ = stdout_is_terminal() && !world.distributed() ? "bar" : "plain";
    every_ = progress_every(f.steps);
  }
  const std::vector<dist::SyncStats>& comm_steps() const { return comm_steps_; }

  void on_step(const TrainingRun& run, const StepEvent& e) override {
    const StepResult& r = *e.result;
    if (log_) log_->step(e.step, r, examples_);
    if (e.profiling) return;
    if (dp_ != nullptr) comm_steps_.push_back(dp_->last_step());
    if (mode_ != "none" && (e.step % every_ == 0 || e.step == f_.steps)) {
      // The time left: the median step so far (the first, which warms up, left out once there
      // are others) times the steps left.
      const std::vector<double>& times = run.stats().ms;
      const double eta =
          times.empty() ? -1
                        : run.stats().median_ms() * static_cast<double>(f_.steps - e.step) / 1000.0;
      print_step(mode_ == "bar", e.step, f_.steps, r, examples_, r.memory.allocated.peak, eta);
    }
  }

  void on_eval(const TrainingRun&, int64_t step, const EvalResult& e) override {
    if (mode_ == "bar") std::printf("\n");
    std::printf(
        "eval after step %lld: %s; %s, %.1f examples/s; peak allocated %s, reserved %s (the "
        "model's state %s; no tape, no saved tensors)\n",
        static_cast<long long>(step), eval_summary(e).c_str(), format_ms(e.ms).c_str(),
        e.ms > 0 ? 1000.0 * static_cast<double>(e.examples) / e.ms : 0.0,
        format_bytes(e.memory.allocated.peak).c_str(), format_bytes(e.memory.reserved.peak).c_str(),
        format_bytes(e.persistent).c_str());
    std::fflush(stdout);
    if (log_) log_->eval(step, e);
  }

  bool on_step_end(const TrainingRun& run, const StepEvent& e) override {
    if (f_.save_every > 0 && e.step % f_.save_every == 0 && e.step < f_.steps)
      save_training_state(run.session(), f_.save_state, state_identity(run.pipe()));
    return true;
  }

  void on_abort(const TrainingRun&) override {
    if (mode_ == "bar") std::printf("\n");
    std::fflush(stdout);
  }

 private:
  const TrainFlags& f_;
  MetricsLog* log_;
  const dist::DataParallel* dp_;
  int64_t examples_;
  std::string mode_;
  int64_t every_ = 1;
  std::vector<dist::SyncStats> comm_steps_;  // data parallelism: each step's communication
};

// The plan in use, under the header: what it recomputes (or evicts at step time), offloads and
// holds narrow, and what it predicts.
void print_plan(const Plan& plan, const Profile& profile, const std::string& compress) {
  const PlannerInfo* planner = find_planner(plan.policy);
  if (planner != nullptr && planner->at_step_time) {
    std::printf(
        "plan %s, budget %s (%s): no plan, the saved tensors to evict are chosen while the "
        "steps run; predicted peak allocated %s, reserved %s (no remat %s), %lld evictions "
        "and %lld op replays per step, predicted step %.3f s\n",
        plan.policy.c_str(), plan.budget_text.c_str(), budget_of_name(plan.budget_of),
        format_bytes(plan.predicted.peak_allocated).c_str(),
        format_bytes(plan.predicted.peak_reserved).c_str(),
        format_bytes(plan.no_remat_peak).c_str(), static_cast<long long>(plan.predicted.evictions),
        static_cast<long long>(plan.predicted.replays), plan.predicted.time_ms / 1000.0);
  } else {
    std::printf(
        "plan %s, budget %s (%s): recompute %lld of %zu saved tensors; predicted peak "
        "allocated %s, reserved %s (no remat %s), predicted step %.3f s\n",
        plan.policy.c_str(), plan.budget_text.c_str(), budget_of_name(plan.budget_of),
        static_cast<long long>(plan.recomputed()), profile.saved.size(),
        format_bytes(plan.predicted.peak_allocated).c_str(),
        format_bytes(plan.predicted.peak_reserved).c_str(),
        format_bytes(plan.no_remat_peak).c_str(), plan.predicted.time_ms / 1000.0);
  }
  std::printf("%s", describe_offload(plan, profile).c_str());
  if (plan.predicted.narrowed > 0) {
    std::printf(
        "  --compress %s: %lld retained activations held narrow between forward and "
        "backward, %.1f ms of conversions predicted per step\n",
        compress.c_str(), static_cast<long long>(plan.predicted.narrowed),
        plan.predicted.compress_ms);
  }
}

// Where the plan's steps run: the allocator's limit, and the planned layout's placement.
void print_plan_placement(const Plan& plan) {
  if (plan.limit > 0) {
    std::printf("  the steps run with the allocator's hard limit at %s\n",
                format_bytes(plan.limit).c_str());
  }
  if (plan.layout) {
    const PlannedLayout& l = *plan.layout;
    const size_t in_holes = static_cast<size_t>(
        std::count_if(l.bin.begin(), l.bin.end(), [](int32_t b) { return b >= 0; }));
    uint64_t hole_bytes = 0;
    for (uint64_t h : l.holes) hole_bytes += h;
    std::printf(
        "  the steps run with a planned layout: of the step's %zu requests, %zu in the %zu "
        "free blocks of the persistent segments (%s), %zu in one arena of %s\n",
        l.rounded.size(), in_holes, l.holes.size(),
        format_bytes(static_cast<int64_t>(hole_bytes)).c_str(), l.rounded.size() - in_holes,
        format_bytes(l.size).c_str());
  }
}

// The plan's predictions beside what the steps measured, in the summary.
void print_remat_summary(const RematPipeline& pipe, const TrainingStats& st, Device device,
                         int64_t profiled) {
  const RematExecutor* exec = pipe.executor();
  const Plan& plan = pipe.current_plan();
  // Every step under the plan is checked, not only the highest peak: each must measure exactly
  // the predicted peaks (RematPipeline::step).
  const int64_t checked = pipe.predicted_steps(), exact_steps = pipe.exact_steps();
  const std::string verdict =
      checked == exact_steps
          ? (checked == 1
                 ? std::string("exact on the one step under the plan")
                 : "exact on every one of the " + std::to_string(checked) + " steps under the plan")
          : "differs on " + std::to_string(checked - exact_steps) + " of " +
                std::to_string(checked) + " steps under the plan";
  std::printf(
      "  remat %s: predicted peak allocated %s, reserved %s; measured %s, %s (%s)%s; "
      "%lld evictions and %lld replays per step%s, %.3f s of recomputation\n",
      plan.policy.c_str(), format_bytes(plan.predicted.peak_allocated).c_str(),
      format_bytes(plan.predicted.peak_reserved).c_str(), format_bytes(st.peak_allocated).c_str(),
      format_bytes(st.peak_reserved).c_str(), verdict.c_str(),
      plan.limit > 0 ? (", under the limit " + format_bytes(plan.limit)).c_str() : "",
      static_cast<long long>(exec->evictions()), static_cast<long long>(exec->replays()),
      pipe.dtr_executor() ? (" (predicted " + std::to_string(plan.predicted.evictions) + " and " +
                             std::to_string(plan.predicted.replays) + ")")
                                .c_str()
                          : "",
      exec->regen_ms() / 1000.0);
  if (plan.uses_host()) {
    const OffloadCounters& c = exec->offload();
    std::printf(
        "  host tier: predicted peak allocated %s, reserved %s; measured %s, %s; last step "
        "copied %s out and %s back, waited %.1f ms for copies (predicted %.1f ms on the "
        "transfer model; %s)\n",
        format_bytes(plan.predicted.host_peak_allocated).c_str(),
        format_bytes(plan.predicted.host_peak_reserved).c_str(),
        format_bytes(st.host_peak_allocated).c_str(), format_bytes(st.host_peak_reserved).c_str(),
        format_bytes(c.bytes_to_host).c_str(), format_bytes(c.bytes_to_device).c_str(), c.stall_ms,
        plan.predicted.stall_ms,
        device.is_cpu() ? "on the CPU the copies are memcpy on helper threads: the times "
                          "say nothing of a GPU's"
                        : "measured with events on the compute stream");
  }
  if (profiled > 0) {
    std::printf(
        "  (the first %lld step(s) ran without remat to profile; pass --profile FILE from "
        "`regen profile` to plan from the start)\n",
        static_cast<long long>(profiled));
  }
}

// What the device reported before the steps (CUDA; known false on the CPU).
struct DeviceMemoryBefore {
  bool known = false;
  uint64_t free = 0, total = 0;
};

// Mistakes in the outputs fail now, not after the last step.
// --save may name the --load file: the checkpoint is read whole before the first step and
// replaced atomically after the last, so training on from a checkpoint in place is safe; so may
// --save-state name the --resume file.
void check_output_files(const TrainFlags& f) {
  std::vector<std::pair<std::string, std::string>> outputs;
  if (!f.save.empty()) outputs.emplace_back("--save", f.save);
  if (!f.save_state.empty()) outputs.emplace_back("--save-state", f.save_state);
  if (!f.log.empty()) outputs.emplace_back("--log", f.log);
  std::vector<std::pair<std::string, std::string>> inputs = data_inputs(f.m);
  inputs.insert(inputs.end(), {{"--profile", f.profile_file}, {"--plan", f.plan_file}});
  if (!outputs.empty()) check_distinct_files(outputs, inputs);
  // --load and --resume against every output but the one that may replace them in place.
  for (const auto& [input, in_place] :
       {std::make_pair(std::string("--load"), std::string("--save")),
        std::make_pair(std::string("--resume"), std::string("--save-state"))}) {
    const std::string& path = input == "--load" ? f.load : f.resume;
    if (path.empty()) continue;
    std::vector<std::pair<std::string, std::string>> others;
    for (const auto& out : outputs) {
      if (out.first != in_place) others.push_back(out);
    }
    if (!others.empty()) check_distinct_files(others, {{input, path}});
  }
}

// The run's first lines: the model, device, precision and data, then the training loop's
// settings that are not the defaults.
void print_header(const TrainFlags& f, const Session& session, int64_t examples, int threads) {
  const Session* s = &session;
  const std::string math = precision_name(s->precision);
  std::printf(
      "training %s (%lld parameters) on %s, precision %s, %d threads: batch %lld, %lld steps, "
      "%s lr %g; data: %s\n",
      f.m.model.c_str(), static_cast<long long>(s->model->num_parameters()),
      s->device.str().c_str(), math.c_str(), threads, static_cast<long long>(f.m.batch),
      static_cast<long long>(f.steps), f.m.optimizer.c_str(), f.m.lr, s->data->describe().c_str());
  {
    std::string loop;
    if (f.m.accumulate > 1) {
      loop += "  " + std::to_string(f.m.accumulate) + " micro-batches of " +
              std::to_string(f.m.batch) + " per step (" + std::to_string(examples) +
              " examples; batch norm normalizes each micro-batch)\n";
    }
    const LrSchedule& sch = *s->trainer->schedule();
    if (sch.kind != LrSchedule::Kind::constant || sch.warmup > 0) {
      char buf[200];
      std::snprintf(
          buf, sizeof buf, "  lr schedule %s%s", schedule_kind_name(sch.kind),
          sch.warmup > 0 ? (", warm-up " + std::to_string(sch.warmup) + " steps").c_str() : "");
      loop += buf;
      if (sch.kind == LrSchedule::Kind::cosine)
        loop += " to " + number_text(sch.min) + " over " + std::to_string(sch.horizon) + " steps";
      if (sch.kind == LrSchedule::Kind::step)
        loop +=
            ", x" + number_text(sch.gamma) + " every " + std::to_string(sch.step_size) + " steps";
      loop += "\n";
    }
    if (f.m.clip_grad_norm > 0)
      loop += "  gradients clipped to a global norm of " + number_text(f.m.clip_grad_norm) + "\n";
    if (s->eval_data) {
      loop += "  evaluation every " + std::to_string(f.m.eval_every) + " steps on " +
              s->eval_data->describe() + "\n";
    }
    std::printf("%s", loop.c_str());
  }
}

// Remat: a profile (measured now, or loaded from --profile) and a plan (made now, or loaded from
// --plan), installed in the pipeline and checked before the first planned step. Returns the steps
// the profiling took (0 with a loaded profile).
int64_t prepare_remat(const TrainFlags& f, const SessionOptions& options, Session& session,
                      RematPipeline& pipe, TrainingRun& training, int64_t start) {
  Session* s = &session;
  int64_t done = 0;
  REGEN_CHECK(!f.profile_file.empty() || start + std::max(1, f.profile_steps) < f.steps, "--steps ",
              f.steps, " leaves no step to run under the plan after step ", start, " and ",
              std::max(1, f.profile_steps),
              " profiling step(s): raise --steps, lower --profile-steps or pass --profile");
  if (!f.profile_file.empty()) {
    Profile loaded = load_profile(f.profile_file);
    REGEN_CHECK(
        loaded.model == f.m.model && loaded.batch == f.m.batch && loaded.device == s->device.str(),
        "--profile ", f.profile_file, " is for ", loaded.model, " batch ", loaded.batch, " on ",
        loaded.device, ", not ", f.m.model, " batch ", f.m.batch, " on ", s->device.str());
    check_profile_run(loaded, options, "--profile " + f.profile_file);
    pipe.use_profile(std::move(loaded));
  } else {
    ProfileOptions po;
    po.warmup = 0;
    po.iterations = std::max(1, f.profile_steps);
    po.model_name = f.m.model;
    // The profiling steps train too: they are in the log (not in the summary, which is the
    // plan's).
    std::printf("profiling %d step(s) without remat...\n", po.iterations);
    training.profile(po);
    done = po.iterations;
  }
  const Profile& profile = pipe.current_profile();
  if (!f.plan_file.empty()) {
    Plan loaded = load_plan(f.plan_file, profile);
    REGEN_CHECK(!f.layout_given || (f.plan.layout == "planned") == loaded.planned_layout,
                "--layout ", f.plan.layout, " contradicts --plan ", f.plan_file,
                ", which was made ", loaded.planned_layout ? "with" : "without",
                " a planned layout (regen plan --layout): leave --layout out, the plan "
                "carries its own");
    judge_loaded_plan(pipe.simulator(), loaded);
    pipe.use_plan(std::move(loaded));
  } else {
    pipe.plan(f.plan.policy, f.plan.budget, f.plan.options(&profile));
  }
  print_plan(pipe.current_plan(), profile, f.m.compress);
  // A plan that does not fit its budget, or the device, is refused now (with the simulated
  // numbers) rather than found out by an out-of-memory error in the middle of a step.
  training.check_plan();
  print_plan_placement(pipe.current_plan());
  return done;
}

// The summary: losses, the step time and the CPU cores it had, the peaks and what held them, and
// (CUDA) what the device reports beside the allocator.
void print_summary(const TrainFlags& f, const Session& session, const TrainingStats& st,
                   int64_t examples, int threads, const DeviceMemoryBefore& before) {
  const Session* s = &session;
  const std::string math = precision_name(s->precision);
  // Summary. The first timed step warms caches and the allocator: the median leaves it out
  // when there are later steps.
  std::printf("\nsummary: %s on %s, batch %lld, %lld steps, precision %s\n", f.m.model.c_str(),
              s->device.str().c_str(), static_cast<long long>(f.m.batch),
              static_cast<long long>(f.steps), math.c_str());
  if (!st.losses.empty()) {
    std::printf("  loss %.4f -> %.4f\n", st.losses.front(), st.losses.back());
    const double med = st.median_ms();
    if (st.ms.size() == 1) {
      std::printf(
          "  step time %s (a single step, warm-up included: no later steps to take a "
          "median over), %.1f samples/s\n",
          format_ms(med).c_str(), med > 0 ? 1000.0 * examples / med : 0.0);
    } else {
      const size_t steady = st.ms.size() - 1;
      const std::string which =
          steady == 1 ? "the second step; the first is left out as warm-up"
                      : "median of the " + std::to_string(steady) + " steps after the first";
      std::printf("  step time %s (%s), %.1f samples/s\n", format_ms(med).c_str(), which.c_str(),
                  med > 0 ? 1000.0 * examples / med : 0.0);
    }
    // On the CPU: did the steps have their threads' cores? A step that waited for other
    // processes measured the machine's load, not the step (nor a plan's predicted time).
    if (s->device.is_cpu()) {
      const double cores = st.median_cpu_cores();
      std::printf("  CPU time: %.2f cores over the step's wall time (median; %d threads)%s\n",
                  cores, threads,
                  waited_for_other_work(cores, threads)
                      ? ": the steps waited for other work on this machine, so their times are "
                        "the machine's load as much as the step's (not a plan's error); time on a "
                        "quiet machine"
                      : "");
    }
    std::printf("  peak memory: allocated %s, reserved %s\n",
                format_bytes(st.peak_allocated).c_str(), format_bytes(st.peak_reserved).c_str());
    std::printf("  at the peak:");
    for (int c = 0; c < kNumCategories; ++c) {
      if (st.at_peak.allocated_by_at_peak[c]) {
        std::printf(" %s %s;", category_name(static_cast<Category>(c)),
                    format_bytes(st.at_peak.allocated_by_at_peak[c]).c_str());
      }
    }
    std::printf("\n");
  }
  if (before.known) {
    uint64_t free_after = 0, total = 0;
    cuda_memory_info(s->device, free_after, total);
    const CachingAllocator& a = allocator_for(s->device);
    std::printf(
        "  device memory (cudaMemGetInfo): %s used of %s before the steps, %s after; the "
        "allocator reserves %s now (peak %s)\n",
        format_bytes(static_cast<int64_t>(before.total - before.free)).c_str(),
        format_bytes(static_cast<int64_t>(before.total)).c_str(),
        format_bytes(static_cast<int64_t>(total - free_after)).c_str(),
        format_bytes(a.stats().reserved.current).c_str(), format_bytes(st.peak_reserved).c_str());
  }
}

void run(const TrainFlags& f) {
  REGEN_CHECK(f.steps > 0, "--steps must be a positive integer, got ", f.steps);
  check_output_files(f);
  // With a loaded profile, no step without remat runs here: its plan's prediction is checked
  // against the device below; otherwise the profiling step must fit as it is.
  // --compress holds what a plan retains narrow: a run with it profiles and plans (none at least).
  const bool remat = f.plan.plans() || !f.plan_file.empty() || f.m.compress != "none" ||
                     (f.m.cuda_graph != "off" && f.plan.layout == "planned");
  const bool planned_only = remat && !f.profile_file.empty();
  SessionOptions options = f.m;
  // The cosine schedule spans the run's steps unless told otherwise.
  if (options.schedule_steps == 0 && options.lr_schedule == "cosine")
    options.schedule_steps = f.steps;
  // The log has a column for the gradient norm: computed unless --grad-norm says otherwise.
  if (!f.log.empty() && !f.grad_norm_given) options.grad_norm = true;
  auto s = make_session(options, planned_only ? Preflight::model : Preflight::step);
  const int threads = omp_get_max_threads();
  if (!f.load.empty() && is_llmc_checkpoint_path(f.load)) {
    load_llmc_checkpoint(*s->model, f.load);
    std::printf("loaded %s (llm.c checkpoint, %zu tensors)\n", f.load.c_str(),
                s->model->named_parameters().size());
  } else if (!f.load.empty()) {
    const size_t n = load_checkpoint(*s, f.load);
    std::printf("loaded %s (%zu tensors)\n", f.load.c_str(), n);
  }
  int64_t start = 0;  // optimizer steps already taken (a resumed run)
  std::string resumed_plan;
  if (!f.resume.empty()) {
    const std::map<std::string, std::string> meta = resume_training_state(*s, f.resume);
    start = s->trainer->optimizer_steps();
    REGEN_CHECK(start < f.steps, "--resume ", f.resume, " is at step ", start,
                " already: --steps (", f.steps,
                ") counts every step of the run, so it must be more");
    const auto plan = meta.find("plan");
    resumed_plan = plan == meta.end() ? "no plan" : plan->second;
    std::printf("resumed %s at step %lld (data at %s; its steps ran under %s)\n", f.resume.c_str(),
                static_cast<long long>(start),
                s->data->position().empty() ? "its start" : s->data->position().c_str(),
                resumed_plan.c_str());
  }
  std::unique_ptr<MetricsLog> log;
  // Under mpirun rank 0 writes the log.
  if (!f.log.empty() && output_rank()) {
    log = std::make_unique<MetricsLog>(f.log, /*append=*/start > 0);
  }
  // The library's training loop, through the pipeline (a profile and plan under remat below).
  RematPipeline pipe(*s->trainer);
  TrainingRunOptions ro;
  ro.scan_every = progress_every(f.steps);  // on the CPU, at each progress line
  TrainingRun training(*s, pipe, ro);
  // Per optimizer step, every rank's under mpirun.
  const int64_t examples = training.examples_per_step();
  print_header(f, *s, examples, threads);
  // Data parallelism under mpirun: each rank's batch is --batch; samples/s count every rank's.
  dist::World& world = dist::world();
  const auto* dp = dynamic_cast<const dist::DataParallel*>(s->sync.get());
  if (dp != nullptr) print_data_parallel(*dp, f.m, world);
  std::fflush(stdout);

  // What the device reports before training (CUDA): set beside the allocator's reserved bytes.
  DeviceMemoryBefore before;
  before.known = cuda_memory_info(s->device, before.free, before.total);

  // The run's console and metrics log: an observer of the library's training loop.
  ConsoleObserver console(f, log.get(), dp, examples, world);
  training.observe(console);
  // Remat: a profile (measured now, or loaded) and a plan, run by the pipeline.
  const int64_t done = remat ? prepare_remat(f, options, *s, pipe, training, start) : 0;
  training.run(f.steps - start - done);
  const TrainingStats& st = training.stats();

  print_summary(f, *s, st, examples, threads, before);
  if (pipe.executor() != nullptr) print_remat_summary(pipe, st, s->device, done);
  if (dp != nullptr) {
    print_rank_summary(world, console.comm_steps(), st.peak_allocated, st.peak_reserved, pipe,
                       done);
  }
  if (!f.save.empty() && is_llmc_checkpoint_path(f.save)) {
    if (world.rank() == 0) save_llmc_checkpoint(*s->model, f.save);  // every rank holds the same
    world.barrier();
    std::printf("  saved %s (llm.c checkpoint)\n", f.save.c_str());
  } else if (!f.save.empty()) {
    save_checkpoint(*s, f.save, f.steps);  // under mpirun, by rank 0
    std::printf("  saved %s\n", f.save.c_str());
  }
  if (!f.save_state.empty()) {
    save_training_state(*s, f.save_state, state_identity(pipe));
    if (world.distributed()) {
      std::printf(
          "  saved the training state at step %lld to %s and a file per rank beside it "
          "(%s.rank<r>-of-%d.a or .b; --resume it under mpirun -np %d)\n",
          static_cast<long long>(s->trainer->optimizer_steps()), f.save_state.c_str(),
          f.save_state.c_str(), world.size(), world.size());
    } else {
      std::printf("  saved the training state at step %lld to %s (--resume it)\n",
                  static_cast<long long>(s->trainer->optimizer_steps()), f.save_state.c_str());
    }
  }
  if (log) std::printf("  metrics in %s\n", log->path().c_str());
  // A step whose peaks (or, under DTR, evictions and replays) were not the predicted ones breaks
  // regen's promise: an error (the training itself went as it should, and its checkpoint is
  // written above).
  training.check_predictions(done + start);
}

void setup(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  add_model_flags(app, f->m);
  app.add_option("--steps", f->steps, "training steps")
      ->check(positive_integer())
      ->capture_default_str();
  app.add_option("--save", f->save,
                 "write the model's parameters and buffers to FILE.safetensors "
                 "(torchvision / torch.nn names; atomic), or a GPT-2's to FILE.bin as an llm.c "
                 "checkpoint")
      ->check(non_empty("a file name"));
  app.add_option("--load", f->load,
                 "start from FILE.safetensors, or a GPT-2 from an llm.c checkpoint FILE.bin (its "
                 "sizes must be the model's)");
  app.add_option("--policy", f->plan.policy,
                 "rematerialization policy, one of the registered planners: " + planner_help())
      ->check(CLI::IsMember(policy_names()))
      ->capture_default_str();
  app.add_option("--budget", f->plan.budget_text,
                 "memory budget: bytes (2GiB, 1.5GB), a % of the no-remat peak (60%), or lowest "
                 "(the lowest budget the policy meets)")
      ->check(budget_text());
  add_budget_of_flag(app, f->plan.budget_of);
  CLI::Option* layout = add_layout_flag(app, f->plan.layout);
  add_offload_flags(app, f->plan.offload, f->plan.transfer);
  app.add_option("--chain", f->plan.chain,
                 "regeneration chains: keep, drop (mu-TWO's model) or auto (see `regen plan`)")
      ->check(CLI::IsMember(chain_names()))
      ->capture_default_str();
  app.add_option("--profile", f->profile_file,
                 "plan from this profile.json (from `regen profile`) "
                 "instead of profiling the first steps");
  app.add_option("--plan", f->plan_file,
                 "apply this plan.json (from `regen plan`; needs --profile)");
  app.add_option("--profile-steps", f->profile_steps, "steps profiled before planning")
      ->check(positive_integer(kIntMax))
      ->capture_default_str();
  add_training_flags(app, f->m);
  app.add_option("--cuda-graph", f->m.cuda_graph,
                 "CUDA graphs: on (every step under a plan with --layout planned after the first "
                 "is one replayed graph; refused before training where the steps cannot be "
                 "captured, naming why), auto (captured where they can be, else said once) or off")
      ->check(CLI::IsMember({"on", "off", "auto"}))
      ->capture_default_str();

  app.add_option("--save-state", f->save_state,
                 "write the training state to FILE.safetensors after the last step (and every "
                 "--save-every steps): weights, optimizer state, step, RNG and data position, the "
                 "plan's identity; --resume continues it bitwise. Under mpirun -np N, a file per "
                 "rank, written together or not at all: rank 0's at FILE, rank r's at "
                 "FILE.rank<r>-of-<N>.a or .b (the slot FILE names); resume with the same rank "
                 "count and --shard")
      ->check(non_empty("a file name"));
  app.add_option("--save-every", f->save_every,
                 "with --save-state: also write it every N steps (atomically; under mpirun "
                 "every rank's file together)")
      ->check(non_negative_integer())
      ->capture_default_str();
  app.add_option("--resume", f->resume,
                 "continue the run whose --save-state wrote FILE: its step, optimizer state, "
                 "schedule position, RNG and data position; --steps counts the whole run");
  app.add_option("--log", f->log,
                 "write every step's metrics to FILE: .csv, or JSON lines for any other name "
                 "(step, loss, lr, grad norm, samples/s, peaks, evaluation); tools/plot.py curves "
                 "draws them")
      ->check(non_empty("a file name"));
  app.add_option("--progress", f->progress, "auto, bar, plain or none")
      ->check(CLI::IsMember({"auto", "bar", "plain", "none"}))
      ->capture_default_str();
  CLI::Option* grad_norm = app.get_option("--grad-norm");
  app.callback([f, layout, grad_norm] {
    // The session's own options first: a bad value is named before any combination of flags.
    f->m.validate();
    f->m.check_steps(f->steps);
    REGEN_CHECK(f->plan_file.empty() || !f->profile_file.empty(), "--plan needs --profile");
    f->layout_given = layout->count() > 0;
    f->grad_norm_given = grad_norm->count() > 0;
    // The plan asked for, checked whole (a bad budget fails now, not after the profiling steps).
    if (!f->plan.budget_text.empty()) f->plan.set_budget(f->plan.budget_text);
    // With --compress or --cuda-graph, policy none still plans (--layout planned applies).
    f->plan.validate(f->m.compress != "none" || f->m.cuda_graph != "off", !f->plan_file.empty());
    // How to evaluate, given without --eval-every (train evaluates only with it), is ignored.
    for (const auto& [flag, value] :
         {std::pair<const char*, int64_t>{"--eval-batches", f->m.eval_batches},
          {"--eval-batch", f->m.eval_batch}}) {
      REGEN_CHECK(value == 0 || f->m.eval_every > 0, flag, " ", value,
                  " sets how train evaluates, which it does only with --eval-every N");
    }
    REGEN_CHECK(f->save_every == 0 || !f->save_state.empty(),
                "--save-every needs --save-state FILE (where to write the state)");
    REGEN_CHECK(f->resume.empty() || f->load.empty(),
                "give either --resume (the whole training state) or --load (weights), not both");
    REGEN_CHECK(!f->plan.plans() || f->plan_file.empty(), "give either --policy or --plan");
    // Without --profile the first --profile-steps steps run without remat: at least one step
    // must be left to run under the plan, or its peak could not be measured.
    // --cuda-graph needs every block's address before the step: a plan with a planned layout
    // (--policy none with --layout planned plans too, without remat).
    REGEN_CHECK(f->m.cuda_graph != "on" || f->plan.layout == "planned" || !f->plan_file.empty(),
                "--cuda-graph on: the steps cannot be captured as one CUDA graph without "
                "--layout planned (a block's address is known before the step only under a "
                "planned layout)");
    const bool remat = f->plan.plans() || !f->plan_file.empty() || f->m.compress != "none" ||
                       (f->m.cuda_graph != "off" && f->plan.layout == "planned");
    // A profile is read only to plan from: without a plan it would be ignored, unread.
    REGEN_CHECK(f->profile_file.empty() || remat, "--profile ", f->profile_file,
                " is read to plan from: give --policy P (or --plan FILE) with it; without one "
                "the steps run without a plan and no profile is needed");
    REGEN_CHECK(
        !remat || !f->profile_file.empty() || f->steps > std::max<int64_t>(1, f->profile_steps),
        "--steps ", f->steps, " leaves no step to run under the plan after ",
        std::max<int64_t>(1, f->profile_steps),
        " profiling step(s): raise --steps, lower --profile-steps or pass --profile");
    run(*f);
  });
}
REGEN_COMMAND("train", "train a registered model (optionally with a rematerialization policy)",
              setup);

}  // namespace
}  // namespace regen::tool
