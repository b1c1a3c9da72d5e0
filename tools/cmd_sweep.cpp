// `regen sweep`: the seed experiments. For each batch size it profiles the model, measures
// training without rematerialization, then plans and trains with each policy and budget, and
// writes the seed-format summary table, decisions.csv per run, a CSV of every figure and the
// memory timelines; with --plot it draws the PNGs through tools/plot.py. The summary CSV and the
// timelines end with a math column (fp32 or tf32, --math; fp32 on the CPU), the tables' titles
// name it; each profile.json records it with the other run flags.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>

#include "regen/core/io.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/execute/executor.h"
#include "regen/remat/profile/profiler.h"
#include "regen/remat/report.h"
#include "regen/session/plan_request.h"
#include "tools/command.h"
#include "tools/common.h"
#include "tools/distributed.h"

namespace regen::tool {
namespace {

struct Flags {
  SessionOptions m;
  std::string batches = "4,8";
  std::string policies = "mutwo";
  std::string budgets = "50%";
  PlanRequest plan;  // --budget-of, --layout, --offload, --transfer (the policies are the sweep's)
  int steps = 3;
  std::string out = "sweep";
  bool plot = false;
  std::string op_timing = "sync";
};

// `csv` with a last column `name` holding `value` on every row (a column added at the end leaves
// the others where readers that count columns expect them).
std::string with_column(const std::string& csv, const std::string& name, const std::string& value) {
  std::ostringstream os;
  std::istringstream in(csv);
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    os << line << "," << (header ? name : value) << "\n";
    header = false;
  }
  return os.str();
}

std::string timeline_csv(const Profile& p, const SimResult& r, const std::string& variant) {
  std::ostringstream os;
  for (const TimelinePoint& t : r.timeline) {
    os << variant << "," << t.time_ms << ",\"" << t.label << "\"";
    for (int c = 0; c < kNumCategories; ++c) os << "," << t.allocated_by[c];
    os << "," << t.reserved << "\n";
  }
  (void)p;
  return os.str();
}

// The session options with `batch`.
SessionOptions at_batch(SessionOptions o, int64_t batch) {
  o.batch = batch;
  return o;
}

void run(const Flags& f) {
  const std::vector<int64_t> batches =
      positive_integers("--batches", f.batches, SessionOptions::kMaxBatch);
  const std::vector<std::string> policies = list_items("--policies", f.policies);
  const std::vector<std::string> budgets = list_items("--budgets", f.budgets);
  for (const std::string& p : policies) {
    REGEN_CHECK(parse_policy_spec(p).policy != "none", "--policies: '", p,
                "' is the baseline every batch runs anyway (use ", join_names(remat_policy_names()),
                ", each with an optional :", join_names(chain_names(), ", :"), " chain mode)");
  }
  // A --transfer with nothing to offload (no --offload, no policy+MODE) would time no copy.
  if (std::none_of(policies.begin(), policies.end(), [](const std::string& p) {
        const PolicySpec spec = parse_policy_spec(p);
        return spec.offload_given && spec.offload != OffloadMode::none;
      })) {
    check_offload_request(f.plan.offload, f.plan.transfer, /*planning=*/true);
  }
  for (const std::string& b : budgets) Budget::parse(b);  // fails early on a bad budget
  // Every batch's session options checked before any work (make_session checks them again).
  for (int64_t batch : batches) at_batch(f.m, batch).validate();
  // The precision (fp32 or tf32: the math mode; or bf16, fp16), in the tables' math column.
  const std::string math = precision_name(resolve_precision(f.m, resolve_device(f.m.device)));
  // The flags are right: the folder now. A second sweep into it stops here; a failed sweep leaves
  // it as it was (every output is committed together at the end, and a folder it made is removed).
  std::optional<OutputFolder> out_folder;  // under mpirun, rank 0's
  if (output_rank()) {
    out_folder.emplace(f.out, "--out");
    // The folder takes files, and none of the tables is the training data.
    const std::string stem = f.out + "/" + f.m.model;
    check_distinct_files({{"--out", stem + "_summary.txt"},
                          {"--out", stem + "_summary.csv"},
                          {"--out", stem + "_timeline.csv"}},
                         data_inputs(f.m));
  }
  std::vector<std::pair<std::string, std::string>> outputs;
  std::vector<SweepRow> rows;
  std::string tables;
  std::string timelines = "variant,time_ms,label";
  for (int c = 0; c < kNumCategories; ++c)
    timelines += std::string(",") + category_name(static_cast<Category>(c));
  timelines += ",reserved\n";
  const std::string stem = f.out + "/" + f.m.model;
  for (int64_t batch : batches) {
    std::printf("== %s batch %lld (math %s): profiling\n", f.m.model.c_str(),
                static_cast<long long>(batch), math.c_str());
    std::fflush(stdout);
    Profile profile;
    {
      allocator_for(resolve_device(f.m.device)).empty_cache();
      auto s = make_session(at_batch(f.m, batch));
      ProfileOptions po;
      // Two warm-up steps: the second step still pays first-touch costs on the CPU (its
      // forward ran ~2.5x slower than later ones on ResNet-50), which would inflate every
      // predicted time.
      po.warmup = 2;
      po.iterations = 3;
      po.model_name = f.m.model;
      po.op_timing = parse_op_timing(f.op_timing, "--op-timing");
      profile = profile_training(*s->trainer, po);
      profile.run = run_flags(f.m);
    }
    outputs.emplace_back(stem + "_b" + std::to_string(batch) + "_profile.json",
                         profile_to_json(profile));
    const Simulator sim(profile);
    PlanCache cache(sim);  // dp's programme, mutwo's order, lowest budgets: once per batch
    const MeasuredRun base = measure_training(at_batch(f.m, batch), f.steps, nullptr);
    std::printf("   no remat: peak allocated %s, reserved %s, step %.3f s\n",
                format_bytes(base.peak).c_str(), format_bytes(base.reserved).c_str(),
                base.ms / 1000);
    if (batch == batches.front()) {
      SimOptions so;
      so.timeline = true;
      timelines += timeline_csv(
          profile,
          sim.run(build_schedule(profile,
                                 std::vector<Decision>(profile.saved.size(), Decision::retain)),
                  so),
          "none");
    }
    for (const std::string& policy : policies) {
      const PolicySpec spec = parse_policy_spec(policy);
      PlanOptions po = f.plan.options(&profile);
      po.chain = spec.chain;
      po.cache = &cache;
      if (spec.offload_given) po.offload = spec.offload;
      for (const std::string& btext : budgets) {
        Plan plan;
        if (btext == "lowest") {
          // The lowest budget the policy meets, plus 1% (the very lowest often costs many times
          // the step time for a few MiB): the fastest plan that fits that. A reserved budget's
          // feasibility is not monotone, so 1% more may not be met: then the lowest itself.
          const Plan lowest = make_plan(sim, spec.policy, Budget::parse("lowest"), po);
          Budget b;
          b.kind = Budget::Kind::bytes;
          b.value = std::floor(static_cast<double>(lowest.budget_bytes) * 1.01);
          plan = make_plan(sim, spec.policy, b, po);
          if (!plan.feasible || plan.predicted.time_ms > lowest.predicted.time_ms) plan = lowest;
          plan.budget_text = "lowest";
          plan.lowest_peak = lowest.budget_bytes;
        } else {
          plan = make_plan(sim, spec.policy, Budget::parse(btext), po);
        }
        const MeasuredRun got = measure_training(at_batch(f.m, batch), f.steps, &profile, &plan);
        SweepRow row;
        row.batch = batch;
        row.policy = policy;
        row.budget = plan.budget_text;
        row.budget_gb = static_cast<double>(plan.budget_bytes) / (1ull << 30);
        row.feasible = plan.feasible;
        row.initial_peak_gb = static_cast<double>(base.peak) / (1ull << 30);
        row.final_peak_gb = static_cast<double>(got.peak) / (1ull << 30);
        row.predicted_peak_gb = static_cast<double>(plan.predicted.peak_allocated) / (1ull << 30);
        row.budget_of = budget_of_name(plan.budget_of);
        row.limit_gb = static_cast<double>(plan.limit) / (1ull << 30);
        row.initial_reserved_gb = static_cast<double>(base.reserved) / (1ull << 30);
        row.final_reserved_gb = static_cast<double>(got.reserved) / (1ull << 30);
        row.predicted_reserved_gb =
            static_cast<double>(plan.predicted.peak_reserved) / (1ull << 30);
        row.initial_time_s = base.ms / 1000;
        row.final_time_s = got.ms / 1000;
        row.predicted_time_s = plan.predicted.time_ms / 1000;
        row.recompute_s = got.regen_ms / 1000;
        for (const ProfileSaved& s : profile.saved) {
          if (!is_activation(profile, s)) continue;
          const bool rc = plan.decisions[static_cast<size_t>(s.index)] == Decision::recompute;
          (rc ? row.recomputed : row.retained) += 1;
          (rc ? row.saved_gb : row.retained_gb) += static_cast<double>(s.bytes) / (1ull << 30);
        }
        rows.push_back(row);
        std::string file_policy = policy;
        std::replace(file_policy.begin(), file_policy.end(), ':', '-');
        const std::string tag = "_b" + std::to_string(batch) + "_" + file_policy + "_" +
                                (btext == "lowest"     ? "lowest"
                                 : btext.back() == '%' ? btext.substr(0, btext.size() - 1) + "pct"
                                                       : btext);
        outputs.emplace_back(stem + tag + "_decisions.csv", decisions_csv(profile, plan));
        const bool exact = got.peak == plan.predicted.peak_allocated &&
                           got.reserved == plan.predicted.peak_reserved &&
                           got.steps_exact == got.steps_predicted;
        std::printf(
            "   %s @ %s: peak allocated %s, reserved %s (predicted %s, %s%s)%s, step %.3f s%s, "
            "recompute %.3f s, %s%s\n",
            policy.c_str(), plan.budget_text.c_str(), format_bytes(got.peak).c_str(),
            format_bytes(got.reserved).c_str(), format_bytes(plan.predicted.peak_allocated).c_str(),
            format_bytes(plan.predicted.peak_reserved).c_str(), exact ? ", exact" : ", DIFFERS",
            plan.limit > 0 ? (" under the limit " + format_bytes(plan.limit)).c_str() : "",
            got.ms / 1000,
            // A CPU run that waited for other processes: its time is not the step's own.
            waited_for_other_work(got.cpu_cores, got.threads)
                ? (" (the steps had " + std::to_string(got.cpu_cores).substr(0, 4) +
                   " cores' CPU time over their wall time: they waited for other work; predicted " +
                   format_ms(plan.predicted.time_ms) + ")")
                      .c_str()
                : "",
            got.regen_ms / 1000,
            (dtr_policy(plan.policy)
                 ? std::to_string(plan.predicted.evictions) + " evictions and " +
                       std::to_string(got.replays) + " replays per step at run time (predicted " +
                       std::to_string(plan.predicted.replays) + ")"
                 : std::to_string(row.recomputed) + " of " +
                       std::to_string(row.recomputed + row.retained) + " activations recomputed")
                .c_str(),
            plan.feasible ? "" : " (budget not met: lowest this policy reaches)");
        std::fflush(stdout);
        // Memory timelines of the first batch: no remat and every policy at the first budget.
        if (batch == batches.front() && btext == budgets.front()) {
          SimOptions so;
          so.timeline = true;
          const std::optional<DtrOptions> dtr = dtr_policy(plan.policy);
          timelines += timeline_csv(profile,
                                    dtr ? simulate_dtr(sim, *dtr, plan.limit, so)
                                        : sim.run(plan_schedule(profile, plan), so),
                                    policy + "@" + plan.budget_text);
        }
      }
    }
  }
  for (const std::string& policy : policies) {
    for (const std::string& btext : budgets) {
      std::vector<SweepRow> sel;
      for (const SweepRow& r : rows) {
        if (r.policy == policy &&
            (r.budget == btext || (btext != "lowest" && r.budget == Budget::parse(btext).str())))
          sel.push_back(r);
      }
      std::string upper = f.m.model;
      std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
      tables += summary_table(upper + " ACTIVATION CHECKPOINTING SUMMARY (" + policy + ", budget " +
                                  btext + ", math " + math + ", GB = 2^30 bytes)",
                              sel) +
                "\n";
    }
  }
  // Every output together (the tables, the profiles, the decisions): all written and synced before
  // the first replaces an old one.
  outputs.emplace_back(stem + "_summary.txt", tables);
  outputs.emplace_back(stem + "_summary.csv", with_column(summary_csv(rows), "math", math));
  outputs.emplace_back(stem + "_timeline.csv", with_column(timelines, "math", math));
  if (!output_rank()) return;  // under mpirun rank 0 writes
  {
    // The profiles' and decisions' names follow the batches and budgets: never the data's.
    std::vector<std::pair<std::string, std::string>> paths;
    for (const auto& o : outputs) paths.emplace_back("--out", o.first);
    check_distinct_files(paths, data_inputs(f.m));
  }
  write_files_atomic(outputs);
  std::printf("\n%s", tables.c_str());
  std::printf(
      "wrote %s_summary.txt, %s_summary.csv, %s_timeline.csv, per-run decisions CSVs and "
      "profiles in %s/\n",
      stem.c_str(), stem.c_str(), stem.c_str(), f.out.c_str());
  if (f.plot) {
    // Debian's python3 (with python3-matplotlib) rather than whatever python3 is first on PATH.
    run_plot({"--summary", stem + "_summary.csv", "--timeline", stem + "_timeline.csv", "--model",
              f.m.model, "--out", f.out});
  }
}

void setup(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  add_model_flags(app, f->m, false);
  app.add_option("--batches", f->batches, "comma-separated batch sizes")->capture_default_str();
  app.add_option("--policy,--policies", f->policies,
                 "comma-separated registered planners (" + join_names(remat_policy_names()) +
                     "), each with an optional chain mode :" + join_names(chain_names(), ", :") +
                     " (mutwo:drop is mu-TWO's own: no regenerated tensor kept on the way; "
                     "default auto)")
      ->capture_default_str();
  app.add_option("--budget,--budgets", f->budgets,
                 "comma-separated budgets: bytes, % of the no-remat peak, or lowest (the lowest "
                 "budget the policy meets, within 1%, at the least recomputation)")
      ->capture_default_str();
  add_budget_of_flag(app, f->plan.budget_of);
  add_layout_flag(app, f->plan.layout);
  add_offload_flags(app, f->plan.offload, f->plan.transfer);
  app.add_option("--steps", f->steps, "measured steps per run (the first is not timed)")
      ->check(integer_in(2, 1000))
      ->capture_default_str();
  app.add_option("--out", f->out, "output folder (created if missing)")->capture_default_str();
  app.add_flag("--plot", f->plot, "draw PNG plots with tools/plot.py (matplotlib)");
  add_op_timing_flag(app, f->op_timing);
  app.callback([f] { run(*f); });
}
REGEN_COMMAND("sweep",
              "the seed experiments: batches x policies x budgets, with and without "
              "remat (tables, CSV, plots)",
              setup);

}  // namespace
}  // namespace regen::tool
