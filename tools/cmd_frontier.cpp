// `regen frontier`: the memory/time frontier of every planner for one profiled model and batch.
// Budgets evenly spaced from the lower bound (memory_lower_bound) to the no-remat peak, both
// included; every policy planned at each; predicted peak against predicted step time, with the
// frontier's properties checked per policy (as the budget falls the chosen plan's peak never
// rises and its time never falls; a feasible plan fits its budget). A few distinct feasible plans
// per policy, spread along its frontier, are then trained to compare the measured peaks (exact to
// the byte) and step times with the predictions. Writes frontier.csv (and frontier.png with
// --plot, through tools/plot.py --frontier); its last column, math, is the math mode the profile's
// steps ran with (fp32 or tf32; fp32 on the CPU), which executed plans run with too.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>

#include "regen/core/io.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/execute/executor.h"
#include "regen/remat/profile/profiler.h"
#include "regen/session/plan_request.h"
#include "tools/command.h"
#include "tools/common.h"
#include "tools/distributed.h"

namespace regen::tool {
namespace {

struct Flags {
  SessionOptions m;
  std::string profile;
  std::string policies;  // empty: every policy but none and milp
  // --budget-of, --layout, --offload, --transfer and --milp-time-limit (the policies and budgets
  // are the frontier's own).
  PlanRequest plan;
  int points = 40;
  int execute = 3;
  int steps = 3;
  std::string out = "frontier";
  bool plot = false;
};

// Which of the model flags the command line named (CLI11 counts them after parsing).
struct Given {
  const CLI::Option *model = nullptr, *batch = nullptr, *device = nullptr, *threads = nullptr,
                    *execute = nullptr;
  bool has(const CLI::Option* o) const { return o != nullptr && o->count() > 0; }
};

// One (policy, budget) point of the frontier.
struct Point {
  int64_t budget = 0;
  Plan plan;
  int plan_id = -1;  // index of the distinct plan within its policy (same decisions, chain mode
                     // and regenerations: the same schedule)
  bool executed = false;
  MeasuredRun measured;
};

struct PolicyFrontier {
  PolicySpec spec;
  std::vector<Point> points;  // budgets falling
  int distinct = 0;
  double planning_ms = 0;
  std::vector<std::string> violations;
};

std::vector<std::string> planner_names() {
  std::vector<std::string> out;
  for (const std::string& n : policy_names()) {
    if (n != "none") out.push_back(n);
  }
  return out;
}

// The default: every planner but the slow ones (the MILP: minutes per budget beyond small graphs;
// name it).
std::vector<std::string> default_planners() {
  std::vector<std::string> out;
  for (const std::string& n : planner_names()) {
    if (!planner_info(n).slow) out.push_back(n);
  }
  return out;
}

// --policies: every entry a known policy (not none) with an optional chain mode, no repeats.
// The DTR policies run under the caching allocator's hard limit: by default they are left out
// of a frontier of allocated budgets or planned layouts, and naming them there is an error.
std::vector<PolicySpec> parse_policies(const std::string& text, bool reserved_caching) {
  const std::vector<std::string> known = planner_names();
  // Left out, the default set; given, its items (an empty list is refused, not the default).
  std::vector<std::string> items =
      text.empty() ? default_planners() : list_items("--policies", text);
  if (text.empty() && !reserved_caching) {
    items.erase(std::remove_if(items.begin(), items.end(),
                               [](const std::string& n) { return dtr_policy(n).has_value(); }),
                items.end());
  }
  REGEN_CHECK(!items.empty(), "--policies is empty: name one or more of ", join_names(known));
  std::vector<PolicySpec> specs;
  for (const std::string& item : items) {
    const std::string name = item.substr(0, item.find(':'));
    REGEN_CHECK(name != "none",
                "--policies: 'none' is the baseline, always measured and written "
                "as the no-remat point; name planners: ",
                join_names(known));
    REGEN_CHECK(std::count(known.begin(), known.end(), name), "--policies: unknown policy '", name,
                "'", name == item ? "" : " in '" + item + "'", ": known policies are ",
                join_names(known),
                ", each with an optional chain mode :", join_names(chain_names(), ", :"));
    PolicySpec spec;
    try {
      spec = parse_policy_spec(item);
    } catch (const Error& e) {
      REGEN_FAIL("--policies: ", e.message());
    }
    REGEN_CHECK(reserved_caching || !dtr_policy(spec.policy), "--policies: ", spec.policy,
                " evicts when the allocator's hard limit refuses a request: it needs "
                "--budget-of reserved and --layout caching");
    for (const PolicySpec& s : specs) {
      REGEN_CHECK(s.label != spec.label, "--policies: '", item, "' is named twice");
    }
    specs.push_back(spec);
  }
  return specs;
}

bool same_plan(const Plan& a, const Plan& b) {
  // DTR decides at run time: its runs differ by the limit they run under.
  if (dtr_policy(a.policy) || dtr_policy(b.policy)) {
    return a.policy == b.policy && a.limit == b.limit && a.feasible == b.feasible;
  }
  if (a.keep_chain != b.keep_chain || a.decisions != b.decisions ||
      a.regenerations.size() != b.regenerations.size() || a.optimizer_state != b.optimizer_state ||
      a.offloads.size() != b.offloads.size()) {
    return false;
  }
  for (size_t i = 0; i < a.offloads.size(); ++i) {
    if (a.offloads[i].free_after != b.offloads[i].free_after ||
        a.offloads[i].prefetch_before != b.offloads[i].prefetch_before)
      return false;
  }
  for (size_t i = 0; i < a.regenerations.size(); ++i) {
    if (a.regenerations[i].node != b.regenerations[i].node ||
        a.regenerations[i].saved != b.regenerations[i].saved) {
      return false;
    }
  }
  return true;
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string pct(double fraction) {  // 0.4567 -> "45.7%"
  return fmt("%.1f%%", 100.0 * fraction);
}

std::string signed_pct(double fraction) {  // 0.1234 -> "+12.3%"
  return fmt("%+.1f%%", 100.0 * fraction);
}

// "within 10%" or "off by +23.4%": measured step against the predicted one.
// Whether a CPU run's steps waited for other work on the machine (MeasuredRun::cpu_cores).
bool waited(const MeasuredRun& m) {
  return waited_for_other_work(m.cpu_cores, m.threads);
}

std::string time_verdict(const MeasuredRun& m, double predicted_ms) {
  if (predicted_ms <= 0) return "no prediction";
  // A step that waited for other processes measured the machine's load, not the model's error.
  if (waited(m)) {
    return "the steps had " + fmt("%.2f", m.cpu_cores) +
           " cores' CPU time over their wall time: they waited for other work, so the ratio is "
           "not the model's error";
  }
  const double r = m.ms / predicted_ms - 1.0;
  return std::fabs(r) <= 0.10 ? "within 10%" : "off by " + signed_pct(r);
}

// The highest peaks as predicted, and every step checked against the plan exact (a step whose
// peaks fell short of the prediction would not show in the highest).
bool exact(const MeasuredRun& m, const SimResult& predicted) {
  return m.peak == predicted.peak_allocated && m.reserved == predicted.peak_reserved &&
         m.host_peak == predicted.host_peak_allocated &&
         m.host_reserved == predicted.host_peak_reserved && m.steps_exact == m.steps_predicted;
}

// As the budget falls (points[i] -> points[i + 1]): the peak never rises, the time never falls,
// and a feasible plan fits its budget.
std::vector<std::string> check_properties(const std::vector<Point>& pts) {
  std::vector<std::string> v;
  auto peak = [](const Point& p) { return peak_of(p.plan.predicted, p.plan.budget_of); };
  // Monotonicity is a property of the plans that run: an infeasible point has none (its
  // "prediction" is whatever the planner last tried, for DTR the plain step), so each feasible
  // point is compared with the feasible one before it.
  const Point* a = nullptr;
  for (const Point& b : pts) {
    if (!b.plan.feasible) continue;
    if (peak(b) > b.budget) {
      v.push_back("feasible at budget " + format_bytes(b.budget) + " but the predicted peak is " +
                  format_bytes(peak(b)));
    }
    if (a != nullptr && peak(b) > peak(*a)) {
      v.push_back("peak rises " + format_bytes(peak(*a)) + " -> " + format_bytes(peak(b)) +
                  " as the budget falls " + format_bytes(a->budget) + " -> " +
                  format_bytes(b.budget));
    }
    if (a != nullptr && b.plan.predicted.time_ms < a->plan.predicted.time_ms - 1e-9) {
      v.push_back("time falls " + format_ms(a->plan.predicted.time_ms) + " -> " +
                  format_ms(b.plan.predicted.time_ms) + " as the budget falls " +
                  format_bytes(a->budget) + " -> " + format_bytes(b.budget));
    }
    a = &b;
  }
  return v;
}

// K distinct feasible plans spread along the frontier: of those that recompute something, sorted
// by predicted peak, the lowest and then evenly spaced ones towards the highest (K = 1: the
// lowest; K = 2: the lowest and the middle one).
std::vector<int> pick_plans(const PolicyFrontier& pf, int k) {
  std::map<int, const Point*> first;  // plan id -> a point with it
  for (const Point& p : pf.points) {
    if (p.plan.feasible && !first.count(p.plan_id)) first[p.plan_id] = &p;
  }
  // Plans that recompute something (no remat is measured anyway); all of them if none do.
  std::vector<const Point*> d;
  for (const auto& [id, p] : first) {
    if (p->plan.recomputed() > 0 || p->plan.predicted.evictions > 0) d.push_back(p);
  }
  if (d.empty()) {
    for (const auto& [id, p] : first) d.push_back(p);
  }
  std::sort(d.begin(), d.end(), [](const Point* a, const Point* b) {
    const int64_t pa = peak_of(a->plan.predicted, a->plan.budget_of);
    const int64_t pb = peak_of(b->plan.predicted, b->plan.budget_of);
    if (pa != pb) return pa < pb;
    return a->plan.predicted.time_ms < b->plan.predicted.time_ms;
  });
  std::vector<int> ids;
  const size_t n = d.size();
  if (n == 0 || k <= 0) return ids;
  for (int i = 0; i < k && static_cast<size_t>(i) < n; ++i) {
    const size_t j = n <= static_cast<size_t>(k)
                         ? static_cast<size_t>(i)
                         : static_cast<size_t>(i) * (n - 1) / static_cast<size_t>(k);
    const int id = d[j]->plan_id;
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

struct Context {
  const Profile* profile = nullptr;
  std::string math;  // the profile's (profile_math)
  int64_t no_remat_peak = 0, lower_bound = 0;
  Plan none;
  bool base_measured = false;
  MeasuredRun base;
};

std::string csv_text(const Context& c, const std::vector<PolicyFrontier>& frontiers) {
  const Profile& p = *c.profile;
  std::ostringstream os;
  os << "model,batch,device,threads,policy,budget_bytes,budget_fraction,feasible,"
        "predicted_peak_allocated,predicted_peak_reserved,predicted_ms,profiled_ms,overhead_pct,"
        "recompute_ms,replays,recomputed,planning_ms,executed,measured_peak_allocated,"
        "measured_peak_reserved,measured_ms,exact,chain,plan_id,measured_recompute_ms,"
        "measured_over_predicted,budget_of,limit,layout,math,offloaded,optimizer_state,"
        "predicted_host_peak_allocated,predicted_stall_ms,measured_host_peak_allocated,"
        "measured_stall_ms,measured_cpu_cores\n";
  const std::string head = p.model + "," + std::to_string(p.batch) + "," + p.device + "," +
                           std::to_string(p.threads) + ",";
  const double base_ms = c.none.predicted.time_ms;
  auto fraction = [&](int64_t b) {
    return fmt("%.6f", c.no_remat_peak > 0 ? double(b) / double(c.no_remat_peak) : 0.0);
  };
  auto row = [&](const std::string& policy, int64_t budget, const Plan& plan, int plan_id,
                 bool executed, const MeasuredRun& m) {
    const SimResult& r = plan.predicted;
    os << head << policy << "," << budget << "," << fraction(budget) << ","
       << (plan.feasible ? 1 : 0) << "," << r.peak_allocated << "," << r.peak_reserved << ","
       << fmt("%.4f", r.time_ms) << "," << fmt("%.4f", p.iteration_ms) << ","
       << fmt("%.3f", base_ms > 0 ? 100.0 * (r.time_ms / base_ms - 1.0) : 0.0) << ","
       << fmt("%.4f", r.recompute_ms) << "," << r.replays << "," << plan.recomputed() << ","
       << fmt("%.3f", plan.planning_ms) << "," << (executed ? 1 : 0) << ",";
    if (executed) {
      os << m.peak << "," << m.reserved << "," << fmt("%.4f", m.ms) << "," << (exact(m, r) ? 1 : 0);
    } else {
      os << ",,,";
    }
    os << "," << (plan.keep_chain ? "keep" : "drop") << "," << plan_id << ",";
    if (executed) {
      os << fmt("%.4f", m.regen_ms) << "," << fmt("%.4f", r.time_ms > 0 ? m.ms / r.time_ms : 0);
    } else {
      os << ",";
    }
    os << "," << budget_of_name(plan.budget_of) << "," << plan.limit << ","
       << (plan.planned_layout ? "planned" : "caching") << "," << c.math << "," << plan.offloaded()
       << "," << state_place_name(plan.optimizer_state) << "," << r.host_peak_allocated << ","
       << fmt("%.4f", r.stall_ms) << ",";
    if (executed) {
      os << m.host_peak << "," << fmt("%.4f", m.stall_ms) << ","
         << (m.cpu_cores > 0 ? fmt("%.3f", m.cpu_cores) : std::string());
    } else {
      os << ",,";
    }
    os << "\n";
  };
  row("none", c.no_remat_peak, c.none, 0, c.base_measured, c.base);
  // The lower bound: a floor, not a plan (its peak column holds the bound).
  os << head << "lower_bound," << c.lower_bound << "," << fraction(c.lower_bound) << ",,"
     << c.lower_bound << ",,,,,,,,,0,,,,,,,,,allocated,0,," << c.math << ",,,,,,,\n";
  for (const PolicyFrontier& pf : frontiers) {
    for (const Point& pt : pf.points)
      row(pf.spec.label, pt.budget, pt.plan, pt.plan_id, pt.executed, pt.measured);
  }
  return os.str();
}

void print_table(const Context& c, const std::vector<PolicyFrontier>& frontiers) {
  const double base_ms = c.none.predicted.time_ms;
  std::vector<size_t> width;
  std::printf(
      "\npredicted step time over no remat (%s) per budget; '-': the policy cannot meet "
      "it\n",
      format_ms(base_ms).c_str());
  std::printf("%-16s", "budget");
  for (const PolicyFrontier& pf : frontiers) {
    width.push_back(std::max<size_t>(pf.spec.label.size(), 7) + 2);
    std::printf("%*s", static_cast<int>(width.back()), pf.spec.label.c_str());
  }
  std::printf("\n");
  const size_t n = frontiers.empty() ? 0 : frontiers.front().points.size();
  for (size_t i = 0; i < n; ++i) {
    const int64_t b = frontiers.front().points[i].budget;
    // Fewer bytes between the ends than points: equal budgets, the same plans; shown once.
    if (i > 0 && b == frontiers.front().points[i - 1].budget) continue;
    const std::string label =
        fmt("%4.0f%%", 100.0 * double(b) / double(std::max<int64_t>(1, c.no_remat_peak))) + " " +
        format_bytes(b);
    std::printf("%-16s", label.c_str());
    for (size_t k = 0; k < frontiers.size(); ++k) {
      const Point& pt = frontiers[k].points[i];
      const std::string cell =
          pt.plan.feasible ? signed_pct(pt.plan.predicted.time_ms / base_ms - 1.0) : "-";
      std::printf("%*s", static_cast<int>(width[k]), cell.c_str());
    }
    std::printf("\n");
  }
}

void print_checks(const std::vector<PolicyFrontier>& frontiers) {
  std::printf(
      "\nfrontier checks (as the budget falls the feasible plans' peak never rises and their "
      "time never falls; a feasible plan fits its budget):\n");
  for (const PolicyFrontier& pf : frontiers) {
    if (pf.violations.empty()) {
      std::printf("  %s: monotone (%d distinct plans)\n", pf.spec.label.c_str(), pf.distinct);
      continue;
    }
    std::printf("  %s: %zu violation(s) (%d distinct plans)\n", pf.spec.label.c_str(),
                pf.violations.size(), pf.distinct);
    const size_t shown = std::min<size_t>(pf.violations.size(), 12);
    for (size_t i = 0; i < shown; ++i) std::printf("    %s\n", pf.violations[i].c_str());
    if (shown < pf.violations.size()) {
      std::printf("    ... and %zu more\n", pf.violations.size() - shown);
    }
  }
}

// "60.0%..75.0%": the budgets (of the no-remat peak) at which a policy chose plan `id` and it fits.
std::string budget_range(const PolicyFrontier& pf, int id, int64_t no_remat_peak) {
  int64_t lo = -1, hi = -1;
  for (const Point& p : pf.points) {
    if (p.plan_id != id || !p.plan.feasible) continue;
    lo = lo < 0 ? p.budget : std::min(lo, p.budget);
    hi = std::max(hi, p.budget);
  }
  const double d = double(std::max<int64_t>(1, no_remat_peak));
  return lo == hi ? pct(double(lo) / d) : pct(double(lo) / d) + ".." + pct(double(hi) / d);
}

std::string measured_line(const MeasuredRun& m, const SimResult& r) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "peak %s (predicted %s, %s), reserved %s (predicted %s, %s), step %s / "
                "predicted %s = %.3f (%s)",
                format_bytes(m.peak).c_str(), format_bytes(r.peak_allocated).c_str(),
                m.peak == r.peak_allocated ? "exact" : "DIFFERS", format_bytes(m.reserved).c_str(),
                format_bytes(r.peak_reserved).c_str(),
                m.reserved == r.peak_reserved ? "exact" : "DIFFERS", format_ms(m.ms).c_str(),
                format_ms(r.time_ms).c_str(), r.time_ms > 0 ? m.ms / r.time_ms : 0.0,
                time_verdict(m, r.time_ms).c_str());
  std::string out = buf;
  if (r.host_peak_allocated > 0 || m.host_peak > 0) {
    std::snprintf(buf, sizeof buf,
                  "; host tier peak %s (predicted %s, %s), waited %s for copies "
                  "(predicted %s)",
                  format_bytes(m.host_peak).c_str(), format_bytes(r.host_peak_allocated).c_str(),
                  m.host_peak == r.host_peak_allocated ? "exact" : "DIFFERS",
                  format_ms(m.stall_ms).c_str(), format_ms(r.stall_ms).c_str());
    out += buf;
  }
  return out;
}

void run(Flags f, const Given& given) {
  // Everything that can be checked without work, first.
  const std::vector<PolicySpec> specs =
      parse_policies(f.policies, f.plan.budget_of == "reserved" && f.plan.layout == "caching");
  // A --transfer with nothing to offload (no --offload, no policy+MODE) would time no copy.
  if (std::none_of(specs.begin(), specs.end(), [](const PolicySpec& s) {
        return s.offload_given && s.offload != OffloadMode::none;
      })) {
    check_offload_request(f.plan.offload, f.plan.transfer, /*planning=*/true);
  }
  const bool model_given = given.has(given.model) || given.has(given.batch);
  Profile profile;
  const bool loaded = !f.profile.empty();
  if (loaded) {
    struct stat st;
    REGEN_CHECK(::stat(f.profile.c_str(), &st) == 0, "--profile ", f.profile,
                ": no such file (make one with `regen profile --model M --batch N --out DIR`, or "
                "drop --profile to profile here)");
    REGEN_CHECK(S_ISREG(st.st_mode), "--profile ", f.profile, " is not a regular file");
    try {
      profile = load_profile(f.profile);
    } catch (const Error& e) {
      REGEN_FAIL("--profile ", f.profile, ": ", e.message());
    }
    const std::string its =
        "--model " + profile.model + " --batch " + std::to_string(profile.batch);
    if (!model_given && f.execute > 0) {
      REGEN_CHECK(!given.has(given.execute), "--execute ", f.execute,
                  " trains the planned model, so it needs the model flags the profile was made "
                  "with: --profile ",
                  f.profile, " is for ", profile.model, " batch ", profile.batch, " (pass ", its,
                  " and any --image-size, --seq-len, ... it used), or --execute 0 to plan only");
      std::printf(
          "plan only: --profile without --model/--batch (pass %s to execute %d plans per "
          "policy)\n",
          its.c_str(), f.execute);
      f.execute = 0;
    }
    if (model_given) {
      REGEN_CHECK(profile.model == f.m.model && profile.batch == f.m.batch, "--profile ", f.profile,
                  " is for ", profile.model, " batch ", profile.batch, ", but --model ", f.m.model,
                  " --batch ", f.m.batch,
                  " was given: the plans apply only to the profiled model and batch (pass ", its,
                  ", or profile ", f.m.model, " at --batch ", f.m.batch, ")");
      // Device and threads: the profile's unless given, and then they must match.
      if (given.has(given.device)) {
        const std::string d = resolve_device(f.m.device).str();
        REGEN_CHECK(d == profile.device, "--device ", f.m.device, " (", d, "): --profile ",
                    f.profile, " was made on ", profile.device, "; plans apply to that device");
      } else {
        f.m.device = profile.device;
      }
      if (given.has(given.threads)) {
        REGEN_CHECK(f.m.threads == profile.threads, "--threads ", f.m.threads, ": --profile ",
                    f.profile, " was made with ", profile.threads,
                    " threads; plans apply to that thread count (drop --threads to use it)");
      } else {
        f.m.threads = profile.threads;
      }
      // The other flags that shape the step (optimizer, sizes, dropout, head): as profiled.
      check_profile_run(profile, f.m, "--profile " + f.profile);
    }
  }
  if (!loaded || f.execute > 0) {
    // The model flags that build a session (a mistake fails before the folder is made).
    f.m.validate();
    math_mode(f.m, resolve_device(f.m.device));
  }
  // The output folder and every file written in it. A second frontier into the same folder
  // stops here; a failed run leaves the folder as it was (its outputs are committed together at
  // the end, and a folder it made is removed again).
  // Under mpirun rank 0 owns the folder and writes the files.
  std::optional<OutputFolder> out_folder;
  const std::string csv_path = f.out + "/frontier.csv";
  const std::string profile_path = f.out + "/profile.json";
  if (output_rank()) {
    out_folder.emplace(f.out, "--out");
    // Writable, and never an input: the --profile read (a frontier.csv named as a profile) or the
    // training data.
    std::vector<std::pair<std::string, std::string>> outputs = {{"--out", csv_path}};
    if (!loaded) outputs.emplace_back("--out", profile_path);
    if (f.plot) outputs.emplace_back("--out", f.out + "/frontier.png");
    std::vector<std::pair<std::string, std::string>> inputs = data_inputs(f.m);
    if (loaded) inputs.emplace_back("--profile", f.profile);
    check_distinct_files(outputs, inputs);
  }

  if (!loaded) {
    std::printf("profiling %s batch %lld (2 warm-up steps, 3 instrumented)\n", f.m.model.c_str(),
                static_cast<long long>(f.m.batch));
    std::fflush(stdout);
    allocator_for(resolve_device(f.m.device)).empty_cache();
    auto s = make_session(f.m);
    ProfileOptions po;
    // As regen sweep: the second step still pays first-touch costs on the CPU.
    po.warmup = 2;
    po.iterations = 3;
    po.model_name = f.m.model;
    profile = profile_training(*s->trainer, po);
    profile.run = run_flags(f.m);
  }

  const Simulator sim(profile);
  // What the planners find on this profile whatever the budget (dp's programme and simulated
  // plans, mutwo's order, lowest budgets): found once for every budget and policy.
  PlanCache cache(sim);
  Context c;
  c.profile = &profile;
  c.math = profile_precision(profile);  // fp32, tf32, bf16 or fp16
  PlanOptions none_options;
  none_options.budget_of = parse_budget_of(f.plan.budget_of);
  none_options.cache = &cache;
  c.none = make_plan(sim, "none", Budget(), none_options);
  c.no_remat_peak = peak_of(c.none.predicted, none_options.budget_of);
  // The budgets reach down to the lowest bound of the fates the policies may use.
  OffloadMode widest = parse_offload_mode(f.plan.offload);
  for (const PolicySpec& spec : specs) {
    if (spec.offload_given && spec.offload != OffloadMode::none) {
      widest =
          widest == OffloadMode::none || widest == spec.offload ? spec.offload : OffloadMode::all;
    }
  }
  c.lower_bound = memory_lower_bound(profile, widest);
  const int64_t hi = c.no_remat_peak;
  const int64_t lo = std::max<int64_t>(1, std::min(c.lower_bound, hi));
  std::vector<int64_t> budgets;  // falling, both ends included
  for (int k = 0; k < f.points; ++k) {
    budgets.push_back(hi - ((hi - lo) * k + (f.points - 1) / 2) / (f.points - 1));
  }
  std::printf(
      "frontier of %s batch %lld on %s (math %s, %d threads): %d budgets from the no-remat "
      "peak %s down to the lower bound %s (%s of it); profiled step %s\n",
      profile.model.c_str(), static_cast<long long>(profile.batch), profile.device.c_str(),
      c.math.c_str(), profile.threads, f.points, format_bytes(hi).c_str(),
      format_bytes(c.lower_bound).c_str(),
      pct(double(c.lower_bound) / double(std::max<int64_t>(1, hi))).c_str(),
      format_ms(profile.iteration_ms).c_str());
  if (c.lower_bound == hi) {
    std::printf(
        "  the lower bound equals the no-remat peak: no plan can go lower, so every budget "
        "is %s\n",
        format_bytes(hi).c_str());
  } else if (c.lower_bound > hi) {
    std::printf(
        "  the lower bound is above the no-remat peak (not a floor: a finding about "
        "memory_lower_bound), so every budget is the peak, %s\n",
        format_bytes(hi).c_str());
  }
  std::fflush(stdout);

  std::vector<PolicyFrontier> frontiers;
  for (const PolicySpec& spec : specs) {
    PolicyFrontier pf;
    pf.spec = spec;
    std::vector<const Plan*> distinct;
    const auto t0 = std::chrono::steady_clock::now();
    for (const int64_t b : budgets) {
      Budget budget;
      budget.kind = Budget::Kind::bytes;
      budget.value = static_cast<double>(b);
      Point pt;
      pt.budget = b;
      try {
        PlanOptions po = f.plan.options(&profile);
        po.chain = spec.chain;
        po.cache = &cache;
        if (spec.offload_given) po.offload = spec.offload;
        pt.plan = make_plan(sim, spec.policy, budget, po);
      } catch (const Error& e) {
        REGEN_FAIL("planning ", spec.label, " at budget ", format_bytes(b), ": ", e.message());
      }
      pf.points.push_back(std::move(pt));
    }
    // Ids after the vector is complete (pointers into it stay valid from here on).
    for (Point& pt : pf.points) {
      for (size_t i = 0; i < distinct.size() && pt.plan_id < 0; ++i) {
        if (same_plan(pt.plan, *distinct[i])) pt.plan_id = static_cast<int>(i);
      }
      if (pt.plan_id < 0) {
        pt.plan_id = static_cast<int>(distinct.size());
        distinct.push_back(&pt.plan);
      }
    }
    pf.distinct = static_cast<int>(distinct.size());
    pf.planning_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    pf.violations = check_properties(pf.points);
    int feasible = 0;
    for (const Point& pt : pf.points) feasible += pt.plan.feasible ? 1 : 0;
    std::printf("  planned %s at %d budgets in %s: %d feasible, %d distinct plans\n",
                spec.label.c_str(), f.points, format_ms(pf.planning_ms).c_str(), feasible,
                pf.distinct);
    std::fflush(stdout);
    frontiers.push_back(std::move(pf));
  }
  print_table(c, frontiers);
  print_checks(frontiers);
  std::fflush(stdout);

  if (f.execute > 0) {
    std::printf(
        "\nexecuting up to %d distinct feasible plans per policy and no remat, %d steps "
        "each on a fresh model (the first step not timed):\n",
        f.execute, f.steps);
    std::fflush(stdout);
    SessionOptions at_profile_batch = f.m;
    at_profile_batch.batch = profile.batch;
    c.base = measure_training(at_profile_batch, f.steps, nullptr);
    c.base_measured = true;
    std::printf("  no remat: %s\n", measured_line(c.base, c.none.predicted).c_str());
    std::fflush(stdout);
    if (loaded && !exact(c.base, c.none.predicted)) {
      // Nothing else can match either: the flags build another model than the profiled one.
      REGEN_FAIL("--profile ", f.profile, ": training without remat peaked at ",
                 format_bytes(c.base.peak), " allocated and ", format_bytes(c.base.reserved),
                 " reserved, but the profile predicts ",
                 format_bytes(c.none.predicted.peak_allocated), " and ",
                 format_bytes(c.none.predicted.peak_reserved),
                 ": the model flags do not build the profiled model (pass the --image-size, "
                 "--seq-len, --vocab, --num-classes, --lm-head-chunk, --optimizer, ... it was "
                 "made with)");
    }
    int n_exact = 0, n_run = 0, n_within = 0, n_waited = 0;
    for (PolicyFrontier& pf : frontiers) {
      const std::vector<int> ids = pick_plans(pf, f.execute);
      if (ids.empty()) std::printf("  %s: no feasible plan to execute\n", pf.spec.label.c_str());
      for (const int id : ids) {
        const Point* rep = nullptr;
        for (const Point& p : pf.points) {
          if (p.plan_id == id && p.plan.feasible) {
            rep = &p;
            break;
          }
        }
        const Plan& plan = rep->plan;
        MeasuredRun got;
        try {
          got = measure_training(at_profile_batch, f.steps, &profile, &plan);
        } catch (const Error& e) {
          REGEN_FAIL("executing ", pf.spec.label, " (plan of budgets ",
                     budget_range(pf, id, c.no_remat_peak), "): ", e.message());
        }
        // Every feasible point that runs exactly this: the same schedule under the same limit
        // and layout (the same predicted peaks). A point with the same schedule under another
        // budget's limit may reserve other segments, so it is not this run (it was marked
        // executed, and not exact, before this was checked).
        for (Point& p : pf.points) {
          if (p.plan_id == id && p.plan.feasible && p.plan.limit == plan.limit &&
              p.plan.predicted.peak_allocated == plan.predicted.peak_allocated &&
              p.plan.predicted.peak_reserved == plan.predicted.peak_reserved) {
            p.executed = true;
            p.measured = got;
          }
        }
        ++n_run;
        n_exact += exact(got, plan.predicted) ? 1 : 0;
        n_waited += waited(got) ? 1 : 0;
        n_within += !waited(got) && std::fabs(got.ms / plan.predicted.time_ms - 1.0) <= 0.10;
        if (dtr_policy(plan.policy)) {
          std::printf(
              "  %s @ %s of the no-remat peak (limit %s; %lld evictions and %lld replays per "
              "step predicted, %lld replays measured): %s\n",
              pf.spec.label.c_str(), budget_range(pf, id, c.no_remat_peak).c_str(),
              format_bytes(plan.limit).c_str(), static_cast<long long>(plan.predicted.evictions),
              static_cast<long long>(plan.predicted.replays), static_cast<long long>(got.replays),
              measured_line(got, plan.predicted).c_str());
        } else {
          std::printf("  %s @ %s of the no-remat peak (%lld recomputed, chain %s): %s\n",
                      pf.spec.label.c_str(), budget_range(pf, id, c.no_remat_peak).c_str(),
                      static_cast<long long>(plan.recomputed()), plan.keep_chain ? "keep" : "drop",
                      measured_line(got, plan.predicted).c_str());
        }
        std::fflush(stdout);
      }
    }
    std::printf(
        "executed %d plans: %d exact to the byte (allocated and reserved), %d within 10%% "
        "of the predicted step time%s\n",
        n_run, n_exact, n_within,
        n_waited > 0 ? (" (" + std::to_string(n_waited) +
                        " waited for other work on this machine: their times are not compared)")
                           .c_str()
                     : "");
  }
  // The outputs, committed together: a run that failed above changed nothing. Under mpirun rank 0
  // writes them (every rank planned from rank 0's profile: remat/profile/distributed.h).
  if (!output_rank()) return;
  if (loaded) {
    write_file_atomic(csv_path, csv_text(c, frontiers));
  } else {
    write_files_atomic(
        {{profile_path, profile_to_json(profile)}, {csv_path, csv_text(c, frontiers)}});
  }
  std::printf("wrote %s%s\n", csv_path.c_str(), loaded ? "" : (" and " + profile_path).c_str());

  if (f.plot) {
    run_plot({"--frontier", csv_path, "--out", f.out});
  }
}

void setup(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  auto given = std::make_shared<Given>();
  add_model_flags(app, f->m);
  given->model = app.get_option("--model");
  given->batch = app.get_option("--batch");
  given->device = app.get_option("--device");
  given->threads = app.get_option("--threads");
  app.add_option("--profile", f->profile,
                 "profile.json (regen profile, regen sweep) to plan from; without it the model "
                 "flags are profiled first (2 warm-up steps, 3 instrumented)");
  app.add_option("--policy,--policies", f->policies,
                 "comma-separated planners, each with an optional chain mode (mutwo:drop); "
                 "default: " +
                     join_names(default_planners()) +
                     " (milp only when named: it is for small graphs)")
      ->check(non_empty("one or more comma-separated planners"));
  add_budget_of_flag(app, f->plan.budget_of);
  add_layout_flag(app, f->plan.layout);
  add_offload_flags(app, f->plan.offload, f->plan.transfer);
  app.add_option("--milp-time-limit", f->plan.milp_time_limit_s,
                 "seconds the milp policy's programme may take per budget, built and solved "
                 "over every round (a solver past it is stopped)")
      ->check(number_in(0.1, 86400))
      ->capture_default_str();
  app.add_option(
         "--points", f->points,
         "budgets, evenly spaced from the lower bound to the no-remat peak (both included); "
         "at most 1000, finer than dp's 1024 budget levels can tell apart")
      ->check(integer_in(2, 1000))
      ->capture_default_str();
  given->execute =
      app.add_option("--execute", f->execute,
                     "distinct feasible plans per policy to train and compare with the "
                     "predictions (0: plan only; needs the model flags)")
          ->check(non_negative_integer(kIntMax))
          ->capture_default_str();
  app.add_option("--steps", f->steps, "steps per executed plan (the first is not timed)")
      ->check(integer_in(2, 1000))
      ->capture_default_str();
  app.add_option("--out", f->out, "output folder (created if missing)")->capture_default_str();
  app.add_flag("--plot", f->plot, "draw frontier.png with tools/plot.py (matplotlib)");
  app.callback([f, given] { run(*f, *given); });
}
REGEN_COMMAND("frontier",
              "memory/time frontier of every planner: predicted peak vs step time at "
              "budgets from the lower bound to the no-remat peak, a few points "
              "executed (frontier.csv, --plot)",
              setup);

}  // namespace
}  // namespace regen::tool
