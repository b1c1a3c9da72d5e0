// `regen plan`: stage 2. Plans a profile under a budget with one policy and writes plan.json and
// decisions.csv; the prediction comes from the exact simulator.
#include <cstdio>
#include <string>

#include "regen/core/io.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/plan/planner.h"
#include "regen/remat/report.h"
#include "regen/session/plan_request.h"
#include "tools/command.h"
#include "tools/common.h"
#include "tools/distributed.h"

namespace regen::tool {
namespace {

struct Flags {
  std::string profile = "profile.json";
  PlanRequest plan = [] {
    PlanRequest r;
    r.policy = "mutwo";
    return r;
  }();
  std::string out = "plan.json";
  std::string decisions = "decisions.csv";
};

void setup(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  app.add_option("--profile", f->profile, "profile.json from `regen profile`")
      ->capture_default_str();
  app.add_option("--policy", f->plan.policy,
                 "rematerialization policy, one of the registered planners: " + planner_help())
      ->check(CLI::IsMember(policy_names()))
      ->capture_default_str();
  app.add_option("--budget", f->plan.budget_text,
                 "bytes (2GiB, 1.5GB), a % of the no-remat peak (60%), or lowest (the lowest "
                 "budget the policy meets)")
      ->check(budget_text());
  app.add_option(
         "--chain", f->plan.chain,
         "what a regeneration keeps of the evicted tensors it recomputes on the way: keep "
         "(those backward still needs), drop (mu-TWO's and Capuchin's model) or auto "
         "(each planner's own: mutwo plans both and keeps the better; blocks, sqrt keep; dp "
         "and milp decide what each regeneration keeps and take no keep)")
      ->check(CLI::IsMember(chain_names()))
      ->capture_default_str();
  add_budget_of_flag(app, f->plan.budget_of);
  add_layout_flag(app, f->plan.layout);
  add_offload_flags(app, f->plan.offload, f->plan.transfer);
  app.add_option(
         "--milp-time-limit", f->plan.milp_time_limit_s,
         "seconds the milp policy's programme may take, built and solved over every round "
         "(dp's plan, its start, comes first; with --budget lowest, each of its budgets gets "
         "this); a solver past it is stopped; the plan's note says whether it proved the "
         "optimum and the time taken")
      ->check(number_in(0.1, 86400))
      ->capture_default_str();
  app.add_option("--out", f->out, "where to write the plan")->capture_default_str();
  app.add_option("--decisions", f->decisions, "where to write decisions.csv")
      ->capture_default_str();
  app.callback([f] {
    if (!f->plan.budget_text.empty()) f->plan.set_budget(f->plan.budget_text);
    f->plan.validate();
    // Outputs checked before any work: writable, distinct, and never the profile read.
    check_distinct_files({{"--out", f->out}, {"--decisions", f->decisions}},
                         {{"--profile", f->profile}});
    const Profile p = load_profile(f->profile);
    const Simulator sim(p);
    const Plan plan = f->plan.make(sim, p);
    // Both outputs written in full before either replaces its file.
    const std::string decisions = decisions_csv(p, plan);
    if (output_rank()) {  // under mpirun rank 0 writes
      AtomicFileWriter csv(f->decisions);
      csv.write(decisions.data(), decisions.size());
      save_plan(plan, p, f->out);
      csv.commit();
    }
    std::printf("plan %s for %s batch %d on %s, budget %s (%s %s)\n", plan.policy.c_str(),
                p.model.c_str(), static_cast<int>(p.batch), p.device.c_str(),
                plan.budget_text.c_str(),
                plan.budget_bytes ? format_bytes(plan.budget_bytes).c_str() : "none",
                budget_of_name(plan.budget_of));
    std::printf("  %s\n", plan.feasible ? "feasible" : plan.note.c_str());
    if (plan.feasible && !plan.note.empty()) std::printf("  %s\n", plan.note.c_str());
    if (dtr_policy(plan.policy)) {
      std::printf(
          "  no plan: the saved tensors to evict are chosen while the step runs; predicted "
          "%lld evictions and %lld op replays per step (decisions.csv retains everything)\n",
          static_cast<long long>(plan.predicted.evictions),
          static_cast<long long>(plan.predicted.replays));
    } else {
      std::printf("  recompute %lld of %zu saved tensors (%s of %s)\n",
                  static_cast<long long>(plan.recomputed()), p.saved.size(),
                  format_bytes(plan.recomputed_bytes(p)).c_str(),
                  format_bytes([&] {
                    int64_t b = 0;
                    for (const ProfileSaved& s : p.saved)
                      b += s.candidate ? static_cast<int64_t>(s.bytes) : 0;
                    return b;
                  }())
                      .c_str());
    }
    std::printf("%s", describe_offload(plan, p).c_str());
    std::printf(
        "  predicted peak allocated %s, reserved %s (no remat %s %s); limit %s; lower bound "
        "%s allocated\n",
        format_bytes(plan.predicted.peak_allocated).c_str(),
        format_bytes(plan.predicted.peak_reserved).c_str(), budget_of_name(plan.budget_of),
        format_bytes(plan.no_remat_peak).c_str(),
        plan.limit > 0 ? format_bytes(plan.limit).c_str() : "none",
        format_bytes(plan.lower_bound).c_str());
    if (plan.predicted.cache_flushes > 0) {
      std::printf("  at the limit the allocator empties its cache %lld time(s) per step\n",
                  static_cast<long long>(plan.predicted.cache_flushes));
    }
    // A static plan's replays run in one program per backward node that needs them (DTR decides
    // its own at run time).
    const std::string programs =
        dtr_policy(plan.policy)
            ? std::string()
            : " in " + std::to_string(plan_schedule(p, plan).programs.size()) + " programs";
    std::printf(
        "  predicted step %.3f s (profiled %.3f s + %.3f s of recomputation in %lld op "
        "replays%s + %.3f s waiting for copies); planned in %.1f ms\n",
        plan.predicted.time_ms / 1000, p.iteration_ms / 1000, plan.predicted.recompute_ms / 1000,
        static_cast<long long>(plan.predicted.replays), programs.c_str(),
        plan.predicted.stall_ms / 1000, plan.planning_ms);
    std::printf("wrote %s and %s\n", f->out.c_str(), f->decisions.c_str());
  });
}
REGEN_COMMAND("plan",
              "decide which activations to recompute under a budget (writes plan.json "
              "and decisions.csv)",
              setup);

}  // namespace
}  // namespace regen::tool
