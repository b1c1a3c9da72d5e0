// `regen choose`: which is cheaper under a memory budget, gradient accumulation, recomputation, or
// both? For a global batch G it profiles each micro-batch size b that divides G (or those given),
// as a step of K = G / b micro-batches, plans every policy under the budget on that profile
// (every plan simulated exactly, the K micro-batches and the optimizer included), and reports
// each split's predicted peak and step time, the fastest that fits first. --execute N trains the N
// fastest for a few steps and checks that every step's peaks are the predicted ones. Figures:
// docs/results.md ("Accumulation or recomputation").
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "regen/core/io.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/profile/profiler.h"
#include "tools/command.h"
#include "tools/common.h"

namespace regen::tool {
namespace {

struct ChooseFlags {
  SessionOptions m;
  int64_t global_batch = 0;
  std::string micro_batches;  // "" : every divisor of the global batch
  std::string policies = "none,blocks,sqrt,dp";
  std::string budget;
  std::string budget_of = "reserved";
  int profile_iterations = 1;
  int execute = 0;
  int steps = 3;
  std::string csv;
};

struct Row {
  std::string budget;
  int64_t micro = 0, accumulate = 0;
  std::string policy;
  bool fits = false;
  int64_t peak_allocated = 0, peak_reserved = 0;
  double ms = 0;  // predicted time of one optimizer step (the global batch)
  int64_t recomputed = 0;
  std::string note;
  // Executed (--execute).
  bool executed = false;
  int64_t steps_exact = 0, steps_predicted = 0;
  int64_t measured_allocated = 0, measured_reserved = 0;
  double measured_ms = 0;
};

// The divisors of n, rising, by trial division up to sqrt(n).
std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d <= n / d; ++d) {
    if (n % d != 0) continue;
    low.push_back(d);
    if (d != n / d) high.push_back(n / d);
  }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

// A session's message about its batch, told of a micro-batch: choose has no --batch flag.
std::string as_micro_batch(std::string message) {
  const std::string flag = "--batch ";
  for (size_t at = message.find(flag); at != std::string::npos; at = message.find(flag, at)) {
    message.replace(at, flag.size(), "micro-batch ");
    at += flag.size();
  }
  return message;
}

// The micro-batch sizes to profile: those given (each dividing the global batch and one the
// model can train), or every divisor of the global batch the model can train as a micro-batch
// (batch norm cannot train a micro-batch of 1 at small images), each skipped one named.
std::vector<int64_t> micro_sizes(const ChooseFlags& f) {
  const bool given = !f.micro_batches.empty();
  const std::vector<int64_t> candidates =
      given ? positive_integers("--micro-batches", f.micro_batches, SessionOptions::kMaxBatch)
            : divisors(f.global_batch);
  std::vector<int64_t> out;
  for (const int64_t b : candidates) {
    REGEN_CHECK(f.global_batch % b == 0, "--micro-batches: ", b, " does not divide --global-batch ",
                f.global_batch, " (a step is a whole number of micro-batches)");
    SessionOptions o = f.m;
    o.batch = b;
    o.accumulate = f.global_batch / b;
    try {
      o.validate();
    } catch (const Error& e) {
      if (given) REGEN_FAIL("--micro-batches: ", as_micro_batch(e.message()));
      std::printf("  micro-batch %lld skipped: %s\n", static_cast<long long>(b),
                  as_micro_batch(e.message()).c_str());
      continue;
    }
    out.push_back(b);
  }
  REGEN_CHECK(!out.empty(), "no micro-batch size of --global-batch ", f.global_batch,
              " can train model '", f.m.model, "' (see above): raise --global-batch");
  return out;
}

std::string csv_of(const std::vector<Row>& rows, const ChooseFlags& f) {
  std::ostringstream os;
  os << "model,global_batch,micro_batch,accumulate,policy,budget,fits,recomputed,"
        "predicted_peak_allocated,predicted_peak_reserved,predicted_step_ms,samples_per_s,"
        "executed,steps_exact,steps_predicted,measured_peak_allocated,measured_peak_reserved,"
        "measured_step_ms\n";
  for (const Row& r : rows) {
    os << f.m.model << "," << f.global_batch << "," << r.micro << "," << r.accumulate << ","
       << r.policy << "," << r.budget << "," << (r.fits ? 1 : 0) << "," << r.recomputed << ","
       << r.peak_allocated << "," << r.peak_reserved << "," << r.ms << ","
       << (r.ms > 0 ? 1000.0 * static_cast<double>(f.global_batch) / r.ms : 0) << ","
       << (r.executed ? 1 : 0) << "," << r.steps_exact << "," << r.steps_predicted << ","
       << r.measured_allocated << "," << r.measured_reserved << "," << r.measured_ms << "\n";
  }
  return os.str();
}

void run(const ChooseFlags& f) {
  REGEN_CHECK(f.global_batch > 0, "--global-batch is required: the examples of one optimizer step");
  {
    // The options alone, before the micro-batch sizes: a bad value is named as given.
    SessionOptions o = f.m;
    o.batch = 1;
    o.accumulate = 1;
    try {
      o.validate();
    } catch (const Error& e) {
      // The batch is choose's own to split; any other option is the user's.
      if (e.message().find("--batch ") == std::string::npos) throw;
    }
    if (f.execute > 0) o.check_steps(f.steps);
  }
  const std::vector<int64_t> micros = micro_sizes(f);
  const std::vector<std::string> policies = split_commas(f.policies);
  REGEN_CHECK(!policies.empty(), "--policies is empty");
  for (const std::string& p : policies) {
    REGEN_CHECK(std::find(policy_names().begin(), policy_names().end(), p) != policy_names().end(),
                "--policies: unknown policy '", p, "' (", join_names(policy_names()), ")");
  }
  std::vector<std::pair<std::string, Budget>> budgets;
  for (const std::string& text : split_commas(f.budget)) {
    const Budget b = parse_budget_option(text);
    REGEN_CHECK(b.kind == Budget::Kind::bytes, "--budget ", text,
                ": give the device's bytes (e.g. 4GiB): a percentage or 'lowest' means another "
                "number of bytes for every micro-batch size");
    budgets.emplace_back(text, b);
  }
  REGEN_CHECK(!budgets.empty(), "--budget is empty");
  PlanOptions po;
  po.budget_of = parse_budget_of(f.budget_of);
  if (!f.csv.empty()) check_distinct_files({{"--csv", f.csv}}, data_inputs(f.m));
  const Device device = resolve_device(f.m.device);
  std::printf(
      "choosing for %s, a global batch of %lld on %s under %s of %s bytes: %zu micro-batch "
      "size(s) x {%s}\n",
      f.m.model.c_str(), static_cast<long long>(f.global_batch), device.str().c_str(),
      f.budget.c_str(), budget_of_name(po.budget_of), micros.size(), f.policies.c_str());
  std::vector<Row> rows;
  std::vector<Profile> profiles;  // by micro-batch size, for --execute
  std::vector<SessionOptions> options;
  for (int64_t b : micros) {
    SessionOptions o = f.m;
    o.batch = b;
    o.accumulate = f.global_batch / b;
    std::printf("  micro-batch %lld x %lld: profiling %d step(s)...", static_cast<long long>(b),
                static_cast<long long>(o.accumulate), 1 + f.profile_iterations);
    std::fflush(stdout);
    Profile profile;
    try {
      allocator_for(device).empty_cache();
      auto s = make_session(o);
      ProfileOptions pro;
      pro.warmup = 1;
      pro.iterations = f.profile_iterations;
      pro.model_name = o.model;
      profile = profile_training(*s->trainer, pro);
      profile.run = run_flags(o);
    } catch (const Error& e) {
      std::printf(" skipped: %s\n", as_micro_batch(e.message()).c_str());
      continue;
    }
    std::printf(" step %s, peak %s allocated, %s reserved without remat\n",
                format_ms(profile.iteration_ms).c_str(),
                format_bytes(profile.peak_allocated).c_str(),
                format_bytes(profile.peak_reserved).c_str());
    const Simulator sim(profile);
    for (const auto& [budget_text, budget] : budgets)
      for (const std::string& policy : policies) {
        Row r;
        r.budget = budget_text;
        r.micro = b;
        r.accumulate = o.accumulate;
        r.policy = policy;
        try {
          const Plan plan = make_plan(sim, policy, budget, po);
          r.fits = plan.feasible;
          r.peak_allocated = plan.predicted.peak_allocated;
          r.peak_reserved = plan.predicted.peak_reserved;
          r.ms = plan.predicted.time_ms;
          r.recomputed = plan.recomputed();
          if (!plan.feasible) r.note = plan.note;
        } catch (const Error& e) {
          r.note = e.message();
        }
        rows.push_back(r);
      }
    profiles.push_back(std::move(profile));
    options.push_back(o);
  }
  REGEN_CHECK(!rows.empty(), "no micro-batch size could be profiled (see above)");
  std::vector<std::string> order;
  for (const auto& b : budgets) order.push_back(b.first);
  const auto rank = [&](const std::string& b) {
    return std::find(order.begin(), order.end(), b) - order.begin();
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    if (a.budget != b.budget) return rank(a.budget) < rank(b.budget);
    if (a.fits != b.fits) return a.fits;
    return a.ms < b.ms;
  });
  // Execute the fastest that fit under each budget.
  std::map<std::string, int> executed;
  for (Row& r : rows) {
    if (executed[r.budget] >= f.execute || !r.fits) continue;
    size_t i = 0;
    while (options[i].batch != r.micro) ++i;
    const Budget budget = budgets[static_cast<size_t>(rank(r.budget))].second;
    const Plan plan = make_plan(Simulator(profiles[i]), r.policy, budget, po);
    std::printf("  executing micro-batch %lld x %lld under %s: %d steps...\n",
                static_cast<long long>(r.micro), static_cast<long long>(r.accumulate),
                r.policy.c_str(), f.steps);
    std::fflush(stdout);
    const MeasuredRun m = measure_training(options[i], f.steps, &profiles[i], &plan);
    r.executed = true;
    r.steps_exact = m.steps_exact;
    r.steps_predicted = m.steps_predicted;
    r.measured_allocated = m.peak;
    r.measured_reserved = m.reserved;
    r.measured_ms = m.ms;
    ++executed[r.budget];
  }
  std::printf("\n%-8s %-6s %-5s %-7s %-5s %12s %12s %12s %10s  %s\n", "budget", "micro", "x K",
              "policy", "fits", "peak alloc", "peak resv", "step", "samples/s", "executed");
  for (const Row& r : rows) {
    std::string run = "";
    if (r.executed) {
      run = (r.steps_exact == r.steps_predicted ? "exact on " : "NOT exact on ") +
            std::to_string(r.steps_predicted) + " steps, measured " +
            format_bytes(r.measured_reserved) + " reserved, step " + format_ms(r.measured_ms);
    } else if (!r.fits) {
      run = r.note.substr(0, 90);
    }
    std::printf("%-8s %-6lld %-5lld %-7s %-5s %12s %12s %12s %10.1f  %s\n", r.budget.c_str(),
                static_cast<long long>(r.micro), static_cast<long long>(r.accumulate),
                r.policy.c_str(), r.fits ? "yes" : "no", format_bytes(r.peak_allocated).c_str(),
                format_bytes(r.peak_reserved).c_str(), format_ms(r.ms).c_str(),
                r.ms > 0 ? 1000.0 * static_cast<double>(f.global_batch) / r.ms : 0.0, run.c_str());
  }
  std::printf("\n");
  for (const std::string& b : order) {
    const Row& best =
        *std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.budget == b; });
    if (best.fits) {
      std::printf(
          "fastest that fits %s: --batch %lld --accumulate %lld --policy %s (predicted %s a step "
          "of %lld examples, %s reserved at the peak)\n",
          b.c_str(), static_cast<long long>(best.micro), static_cast<long long>(best.accumulate),
          best.policy.c_str(), format_ms(best.ms).c_str(), static_cast<long long>(f.global_batch),
          format_bytes(best.peak_reserved).c_str());
    } else {
      std::printf(
          "no split fits %s: raise the budget, add policies (dp, dtr) or smaller "
          "--micro-batches\n",
          b.c_str());
    }
  }
  if (!f.csv.empty()) write_file_atomic(f.csv, csv_of(rows, f));
  for (const Row& r : rows) {
    REGEN_CHECK(!r.executed || r.steps_exact == r.steps_predicted, "micro-batch ", r.micro, " x ",
                r.accumulate, " under ", r.policy,
                " did not measure its predicted peaks: a bug in regen, please report it");
  }
}

void setup(CLI::App& app) {
  auto f = std::make_shared<ChooseFlags>();
  add_model_flags(app, f->m, /*with_batch=*/false);
  add_training_flags(app, f->m, /*with_eval=*/false);
  app.add_option("--global-batch", f->global_batch,
                 "examples per optimizer step, split into micro-batches x accumulation steps")
      ->required()
      ->check(positive_integer(SessionOptions::kMaxBatch));
  app.add_option("--micro-batches", f->micro_batches,
                 "micro-batch sizes to try, each dividing --global-batch (default: every divisor)");
  app.add_option("--policies", f->policies,
                 "policies to plan at each size (none: no remat), from: " + planner_help())
      ->capture_default_str();
  app.add_option("--budget", f->budget,
                 "the device's memory budget in bytes (4GiB, 512MiB), or several separated by "
                 "commas (the profiles are shared)")
      ->required()
      ->check(non_empty("a budget in bytes"));
  add_budget_of_flag(app, f->budget_of);
  app.add_option("--profile-iterations", f->profile_iterations,
                 "instrumented steps per micro-batch size (after one warm-up step); times are "
                 "their medians")
      ->check(positive_integer(kIntMax))
      ->capture_default_str();
  app.add_option("--execute", f->execute,
                 "train the N fastest splits that fit for --steps steps each and check every "
                 "step's peaks against the prediction")
      ->check(non_negative_integer(kIntMax))
      ->capture_default_str();
  app.add_option("--steps", f->steps, "steps of each executed split")
      ->check(positive_integer(kIntMax))
      ->capture_default_str();
  app.add_option("--csv", f->csv, "also write every row to FILE.csv")->check(non_empty("a file"));
  app.callback([f] { run(*f); });
}
REGEN_COMMAND("choose",
              "for a global batch and a budget: every micro-batch x accumulation x policy "
              "simulated, the fastest that fits",
              setup);

}  // namespace
}  // namespace regen::tool
