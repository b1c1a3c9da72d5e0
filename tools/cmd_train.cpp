// `regen train`: trains a registered model from the command line, optionally under a memory budget
// with a rematerialization policy (profile, plan, then train with the plan). The header and the
// summary name the math mode (--math: fp32 unless asked; always fp32 on the CPU).
#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "regen/core/numeric.h"
#include "regen/remat/pipeline.h"
#include "tools/command.h"
#include "tools/common.h"

namespace regen::tool {
namespace {

struct TrainFlags {
  SessionOptions m;
  int64_t steps = 20;
  std::string save, load;
  std::string policy = "none";
  std::string budget;
  std::string budget_of = "reserved";
  std::string layout = "caching";
  std::string chain = "auto";
  std::string offload = "none";
  std::string transfer = "profile";
  std::string profile_file, plan_file;
  int profile_steps = 2;
  std::string progress = "auto";
};

void print_step(bool bar, int64_t step, int64_t steps, const StepResult& r, int64_t batch,
                int64_t peak) {
  const double sps = r.ms > 0 ? 1000.0 * batch / r.ms : 0;
  if (bar) {
    const int width = 24;
    const int done = static_cast<int>(width * step / steps);
    std::printf("\rstep %lld/%lld [%s%s] loss %.4f | %s/step | %.1f samples/s | peak %s ",
                static_cast<long long>(step), static_cast<long long>(steps),
                std::string(static_cast<size_t>(done), '=').c_str(),
                std::string(static_cast<size_t>(width - done), ' ').c_str(), r.loss,
                format_ms(r.ms).c_str(), sps, format_bytes(peak).c_str());
    if (step == steps) std::printf("\n");
  } else {
    std::printf("step %lld/%lld loss %.4f time %s samples/s %.1f peak %s\n",
                static_cast<long long>(step), static_cast<long long>(steps), r.loss,
                format_ms(r.ms).c_str(), sps, format_bytes(peak).c_str());
  }
  std::fflush(stdout);
}

void run(const TrainFlags& f) {
  REGEN_CHECK(f.steps > 0, "--steps must be a positive integer, got ", f.steps);
  // Mistakes in the outputs fail now, not after the last step.
  if (!f.save.empty()) {
    check_distinct_files(
        {{"--save", f.save}},
        {{"--load", f.load}, {"--profile", f.profile_file}, {"--plan", f.plan_file}});
  }
  // With a loaded profile, no step without remat runs here: its plan's prediction is checked
  // against the device below; otherwise the profiling step must fit as it is.
  // --compress holds what a plan retains narrow: a run with it profiles and plans (none at least).
  const bool remat = f.policy != "none" || !f.plan_file.empty() || f.m.compress != "none";
  const bool planned_only = remat && !f.profile_file.empty();
  auto s = make_session(f.m, planned_only ? Preflight::model : Preflight::step);
  const int threads = omp_get_max_threads();
  const std::string math = math_mode(f.m, s->device);
  if (!f.load.empty()) {
    const size_t n = load_checkpoint(*s, f.load);
    std::printf("loaded %s (%zu tensors)\n", f.load.c_str(), n);
  }
  std::printf(
      "training %s (%lld parameters) on %s, math %s, %d threads: batch %lld, %lld steps, "
      "%s lr %g; data: %s\n",
      f.m.model.c_str(), static_cast<long long>(s->model->num_parameters()),
      s->device.str().c_str(), math.c_str(), threads, static_cast<long long>(f.m.batch),
      static_cast<long long>(f.steps), f.m.optimizer.c_str(), f.m.lr, s->data->describe().c_str());

  // What the device reports before training (CUDA): set beside the allocator's reserved bytes.
  uint64_t free_before = 0, total_mem = 0;
  const bool device_info = cuda_memory_info(s->device, free_before, total_mem);

  // Remat: a profile (measured now, or loaded) and a plan, run by the pipeline.
  RematPipeline pipe(*s->trainer);
  int64_t done = 0;
  std::vector<double> losses, times;
  int64_t peak_alloc = 0, peak_reserved = 0;
  int64_t host_alloc = 0, host_reserved = 0;  // the host tier's, under an offload plan
  MemoryStats peak_stats;
  StepResult first_inexact;  // the first step under the plan whose peaks were not the predicted
  auto record = [&](const StepResult& r) {
    if (r.predicted && !r.exact() && !first_inexact.predicted) first_inexact = r;
    losses.push_back(r.loss);
    times.push_back(r.ms);
    if (r.memory.allocated.peak > peak_alloc) peak_stats = r.memory;
    peak_alloc = std::max(peak_alloc, r.memory.allocated.peak);
    peak_reserved = std::max(peak_reserved, r.memory.reserved.peak);
    if (r.host_predicted) {
      host_alloc = std::max(host_alloc, r.host_memory.allocated.peak);
      host_reserved = std::max(host_reserved, r.host_memory.reserved.peak);
    }
  };
  if (remat) {
    if (!f.profile_file.empty()) {
      Profile loaded = load_profile(f.profile_file);
      REGEN_CHECK(loaded.model == f.m.model && loaded.batch == f.m.batch &&
                      loaded.device == s->device.str(),
                  "--profile ", f.profile_file, " is for ", loaded.model, " batch ", loaded.batch,
                  " on ", loaded.device, ", not ", f.m.model, " batch ", f.m.batch, " on ",
                  s->device.str());
      check_profile_run(loaded, f.m, "--profile " + f.profile_file);
      pipe.use_profile(std::move(loaded));
    } else {
      ProfileOptions po;
      po.warmup = 0;
      po.iterations = std::max(1, f.profile_steps);
      po.model_name = f.m.model;
      std::printf("profiling %d step(s) without remat...\n", po.iterations);
      pipe.profile(po);
      done = po.iterations;
    }
    const Profile& profile = pipe.current_profile();
    if (!f.plan_file.empty()) {
      Plan loaded = load_plan(f.plan_file, profile);
      judge_loaded_plan(pipe.simulator(), loaded);
      pipe.use_plan(std::move(loaded));
    } else {
      PlanOptions po;
      po.chain = parse_chain(f.chain);
      po.budget_of = parse_budget_of(f.budget_of);
      po.planned_layout = f.layout == "planned";
      apply_offload_flags(po, f.offload, f.transfer, profile);
      pipe.plan(f.policy, Budget::parse(f.budget), po);
    }
    const Plan& plan = pipe.current_plan();
    if (dtr_policy(plan.policy)) {
      std::printf(
          "plan %s, budget %s (%s): no plan, the saved tensors to evict are chosen while the "
          "steps run; predicted peak allocated %s, reserved %s (no remat %s), %lld evictions "
          "and %lld op replays per step, predicted step %.3f s\n",
          plan.policy.c_str(), plan.budget_text.c_str(), budget_of_name(plan.budget_of),
          format_bytes(plan.predicted.peak_allocated).c_str(),
          format_bytes(plan.predicted.peak_reserved).c_str(),
          format_bytes(plan.no_remat_peak).c_str(),
          static_cast<long long>(plan.predicted.evictions),
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
          f.m.compress.c_str(), static_cast<long long>(plan.predicted.narrowed),
          plan.predicted.compress_ms);
    }
    // A plan that does not fit its budget is refused now, with the simulated numbers, rather
    // than found out by an out-of-memory error in the middle of a step.
    REGEN_CHECK(plan.feasible,
                "the plan does not fit its budget, so training stops before it "
                "starts: ",
                plan.note,
                plan.predicted.oom ? "; under the limit the simulated step "
                                     "runs out of memory at " +
                                         plan.predicted.oom_at
                                   : std::string(),
                dtr_policy(plan.policy) ? ". Pass a larger --budget or another --policy"
                                        : ". Pass a larger --budget, another --policy, or "
                                          "--budget-of allocated");
    {
      const int64_t have = available_memory(s->device);
      REGEN_CHECK(have <= 0 || plan.predicted.peak_reserved <= have, "the plan's steps reserve ",
                  format_bytes(plan.predicted.peak_reserved), " (exact, simulated), but ",
                  s->device.str(), " has ", format_bytes(have),
                  " available; pass a --budget of at most that, or a smaller --batch");
    }
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

  std::string mode = f.progress;
  if (mode == "auto") mode = stdout_is_terminal() ? "bar" : "plain";
  const int64_t every = f.steps <= 50 ? 1 : f.steps / 20;
  for (int64_t i = done; i < f.steps; ++i) {
    // Under the plan, from the first step on; an out-of-memory error names what it predicted.
    const StepResult r = pipe.step();
    // A step can leave a parameter or gradient not finite while its loss still is (the next
    // step's loss then is not): every parameter and gradient is read, on the CPU in place, at
    // each progress line (every step up to 50 steps) and after the last step, so a model that
    // is not finite is never saved; on a GPU after the last step only (a copy to the host).
    const bool at_line = (i + 1) % every == 0 || i + 1 == f.steps;
    const bool scan = std::isfinite(r.loss) && (s->device.is_cpu() ? at_line : i + 1 == f.steps);
    const std::string bad = scan ? first_non_finite(*s->model) : std::string();
    if (!std::isfinite(r.loss) || !bad.empty()) {
      if (mode == "bar") std::printf("\n");
      std::fflush(stdout);
      check_finite_loss(r.loss, i + 1, f.m.lr);
      REGEN_FAIL("training diverged: after step ", i + 1, " the ", bad,
                 " (not finite); try a "
                 "lower --lr (this run used ",
                 f.m.lr, ")");
    }
    record(r);
    if (mode != "none" && ((i + 1) % every == 0 || i + 1 == f.steps)) {
      print_step(mode == "bar", i + 1, f.steps, r, f.m.batch, r.memory.allocated.peak);
    }
  }
  pipe.finish();

  // Summary. The first timed step warms caches and the allocator: the median leaves it out
  // when there are later steps.
  std::printf("\nsummary: %s on %s, batch %lld, %lld steps, math %s\n", f.m.model.c_str(),
              s->device.str().c_str(), static_cast<long long>(f.m.batch),
              static_cast<long long>(f.steps), math.c_str());
  if (!losses.empty()) {
    std::printf("  loss %.4f -> %.4f\n", losses.front(), losses.back());
    if (times.size() == 1) {
      std::printf(
          "  step time %s (a single step, warm-up included: no later steps to take a "
          "median over), %.1f samples/s\n",
          format_ms(times[0]).c_str(), times[0] > 0 ? 1000.0 * f.m.batch / times[0] : 0.0);
    } else {
      const std::vector<double> steady(times.begin() + 1, times.end());
      const double med = median(steady);
      const std::string which =
          steady.size() == 1
              ? "the second step; the first is left out as warm-up"
              : "median of the " + std::to_string(steady.size()) + " steps after the first";
      std::printf("  step time %s (%s), %.1f samples/s\n", format_ms(med).c_str(), which.c_str(),
                  med > 0 ? 1000.0 * f.m.batch / med : 0.0);
    }
    std::printf("  peak memory: allocated %s, reserved %s\n", format_bytes(peak_alloc).c_str(),
                format_bytes(peak_reserved).c_str());
    std::printf("  at the peak:");
    for (int c = 0; c < kNumCategories; ++c) {
      if (peak_stats.allocated_by_at_peak[c]) {
        std::printf(" %s %s;", category_name(static_cast<Category>(c)),
                    format_bytes(peak_stats.allocated_by_at_peak[c]).c_str());
      }
    }
    std::printf("\n");
  }
  if (device_info) {
    uint64_t free_after = 0, total = 0;
    cuda_memory_info(s->device, free_after, total);
    const CachingAllocator& a = allocator_for(s->device);
    std::printf(
        "  device memory (cudaMemGetInfo): %s used of %s before the steps, %s after; the "
        "allocator reserves %s now (peak %s)\n",
        format_bytes(static_cast<int64_t>(total_mem - free_before)).c_str(),
        format_bytes(static_cast<int64_t>(total_mem)).c_str(),
        format_bytes(static_cast<int64_t>(total - free_after)).c_str(),
        format_bytes(a.stats().reserved.current).c_str(), format_bytes(peak_reserved).c_str());
  }
  if (const RematExecutor* exec = pipe.executor()) {
    const Plan& plan = pipe.current_plan();
    // Every step under the plan is checked, not only the highest peak: each must measure exactly
    // the predicted peaks (RematPipeline::step).
    const int64_t checked = pipe.predicted_steps(), exact_steps = pipe.exact_steps();
    const std::string verdict =
        checked == exact_steps
            ? (checked == 1 ? std::string("exact on the one step under the plan")
                            : "exact on every one of the " + std::to_string(checked) +
                                  " steps under the plan")
            : "differs on " + std::to_string(checked - exact_steps) + " of " +
                  std::to_string(checked) + " steps under the plan";
    std::printf(
        "  remat %s: predicted peak allocated %s, reserved %s; measured %s, %s (%s)%s; "
        "%lld evictions and %lld replays per step%s, %.3f s of recomputation\n",
        plan.policy.c_str(), format_bytes(plan.predicted.peak_allocated).c_str(),
        format_bytes(plan.predicted.peak_reserved).c_str(), format_bytes(peak_alloc).c_str(),
        format_bytes(peak_reserved).c_str(), verdict.c_str(),
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
          format_bytes(plan.predicted.host_peak_reserved).c_str(), format_bytes(host_alloc).c_str(),
          format_bytes(host_reserved).c_str(), format_bytes(c.bytes_to_host).c_str(),
          format_bytes(c.bytes_to_device).c_str(), c.stall_ms, plan.predicted.stall_ms,
          s->device.is_cpu() ? "on the CPU the copies are memcpy on helper threads: the times "
                               "say nothing of a GPU's"
                             : "measured with events on the compute stream");
    }
    if (done > 0) {
      std::printf(
          "  (the first %lld step(s) ran without remat to profile; pass --profile FILE from "
          "`regen profile` to plan from the start)\n",
          static_cast<long long>(done));
    }
  }
  if (!f.save.empty()) {
    save_checkpoint(*s, f.save, f.steps);
    std::printf("  saved %s\n", f.save.c_str());
  }
  // A step whose peaks were not the predicted ones breaks regen's promise: an error (the
  // training itself went as it should, and its checkpoint is written above).
  REGEN_CHECK(
      !first_inexact.predicted, "step ", pipe.first_inexact_step() + done,
      " under the plan measured a peak of ", format_bytes(first_inexact.memory.allocated.peak),
      " allocated and ", format_bytes(first_inexact.memory.reserved.peak),
      " reserved where the plan predicted ", format_bytes(first_inexact.predicted_allocated),
      " and ", format_bytes(first_inexact.predicted_reserved),
      ": the prediction did not hold (a bug in regen: please report it with the command)");
  // Under DTR the evictions and replays are predicted as well (RematPipeline::step counts a
  // step exact only when they were the predicted ones).
  REGEN_CHECK(pipe.first_inexact_step() == 0, "step ", pipe.first_inexact_step() + done,
              " under the ", pipe.has_plan() ? pipe.current_plan().policy : std::string(),
              " plan made other evictions or replays than the simulation predicted: the "
              "prediction did not hold (a bug in regen: please report it with the command)");
}

void setup(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  add_model_flags(app, f->m);
  app.add_option("--steps", f->steps, "training steps")
      ->check(positive_integer())
      ->capture_default_str();
  app.add_option("--save", f->save,
                 "write the model's parameters and buffers to FILE.safetensors "
                 "(torchvision / torch.nn names; atomic)")
      ->check(non_empty("a file name"));
  app.add_option("--load", f->load, "start from FILE.safetensors");
  app.add_option("--policy", f->policy,
                 "rematerialization policy, one of the registered planners: " + planner_help())
      ->check(CLI::IsMember(policy_names()))
      ->capture_default_str();
  app.add_option("--budget", f->budget,
                 "memory budget: bytes (2GiB, 1.5GB), a % of the no-remat peak (60%), or lowest "
                 "(the lowest budget the policy meets)")
      ->check(budget_text());
  add_budget_of_flag(app, f->budget_of);
  add_layout_flag(app, f->layout);
  add_offload_flags(app, f->offload, f->transfer);
  app.add_option("--chain", f->chain,
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
  app.add_option("--progress", f->progress, "auto, bar, plain or none")
      ->check(CLI::IsMember({"auto", "bar", "plain", "none"}))
      ->capture_default_str();
  app.callback([f] {
    REGEN_CHECK(f->plan_file.empty() || !f->profile_file.empty(), "--plan needs --profile");
    REGEN_CHECK(f->policy == "none" || f->plan_file.empty(), "give either --policy or --plan");
    // A bad budget fails now, not after the profiling steps.
    if (!f->budget.empty()) {
      REGEN_CHECK(f->policy != "none", "--budget ", f->budget,
                  " needs a rematerialization --policy (", join_names(remat_policy_names()), ")");
      Budget::parse(f->budget);
    }
    // Without --profile the first --profile-steps steps run without remat: at least one step
    // must be left to run under the plan, or its peak could not be measured.
    const bool remat = f->policy != "none" || !f->plan_file.empty() || f->m.compress != "none";
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
