// The planner registry, make_plan, lowest_plan, finish_plan and PlanCache (planner.h). The built-in
// planners are in remat/plan/planners/ (one file each), the parts they share in planner_parts.cpp,
// budgets in budget.cpp, plan files in plan_io.cpp.
#include "regen/remat/plan/planner.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "regen/core/io.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/plan/layout.h"
#include "regen/remat/plan/offload.h"
#include "regen/remat/plan/planner_parts.h"
#include "regen/remat/plan/planners/builtin.h"
#include "regen/remat/plan/planners/dp.h"

namespace regen {

void ensure_planned_layout(const Simulator& sim, Plan& plan) {
  if (plan.layout) return;
  PlanFit f =
      fit_schedule(sim, plan_schedule(sim.profile(), plan), 0, plan.budget_of, nullptr, true);
  plan.predicted = std::move(f.result);
  plan.layout = std::move(f.layout);
}

Schedule plan_schedule(const Profile& p, const Plan& plan) {
  OffloadSpec spec;
  spec.offloads = plan.offloads;
  spec.optimizer_state = plan.optimizer_state;
  spec.transfer = plan.transfer.valid() ? plan.transfer : p.transfer;
  return build_schedule(p, plan.decisions, plan.keep_chain, plan.regenerations, spec);
}

int64_t Plan::recomputed() const {
  return std::count(decisions.begin(), decisions.end(), Decision::recompute);
}

int64_t Plan::offloaded() const {
  return std::count(decisions.begin(), decisions.end(), Decision::offload);
}

int64_t Plan::offloaded_bytes(const Profile& p) const {
  int64_t b = 0;
  for (size_t i = 0; i < decisions.size(); ++i) {
    if (decisions[i] == Decision::offload) b += static_cast<int64_t>(p.saved[i].bytes);
  }
  return b;
}

bool Plan::uses_host() const {
  return offloaded() > 0 || optimizer_state == StatePlace::host;
}

std::vector<std::string> offload_mode_names() {
  return {"none", "activations", "optimizer", "all"};
}

const char* offload_mode_name(OffloadMode m) {
  switch (m) {
    case OffloadMode::none:
      return "none";
    case OffloadMode::activations:
      return "activations";
    case OffloadMode::optimizer:
      return "optimizer";
    case OffloadMode::all:
      return "all";
  }
  return "?";
}

OffloadMode parse_offload_mode(const std::string& text) {
  if (text == "none") return OffloadMode::none;
  if (text == "activations") return OffloadMode::activations;
  if (text == "optimizer") return OffloadMode::optimizer;
  if (text == "all") return OffloadMode::all;
  REGEN_FAIL("unknown offload mode '", text, "': known modes are ",
             join_names(offload_mode_names()));
}

int64_t Plan::recomputed_bytes(const Profile& p) const {
  int64_t b = 0;
  for (size_t i = 0; i < decisions.size(); ++i) {
    if (decisions[i] == Decision::recompute) b += static_cast<int64_t>(p.saved[i].bytes);
  }
  return b;
}

std::vector<std::string> chain_names() {
  return {"auto", "keep", "drop"};
}

Chain parse_chain(const std::string& text) {
  if (text == "auto") return Chain::automatic;
  if (text == "keep") return Chain::keep;
  if (text == "drop") return Chain::drop;
  REGEN_FAIL("unknown chain mode '", text, "': known modes are auto, keep, drop");
}

PolicySpec parse_policy_spec(const std::string& text) {
  PolicySpec spec;
  spec.label = text;
  const size_t plus = text.find('+');
  const std::string head = text.substr(0, plus);
  if (plus != std::string::npos) {
    spec.offload_given = true;
    try {
      spec.offload = parse_offload_mode(text.substr(plus + 1));
    } catch (const Error& e) {
      REGEN_FAIL("in '", text, "': ", e.message());
    }
  }
  const size_t colon = head.find(':');
  spec.policy = head.substr(0, colon);
  const std::vector<std::string> names = policy_names();
  if (!std::count(names.begin(), names.end(), spec.policy)) {
    REGEN_FAIL("unknown policy '", spec.policy, "' in '", text, "': known policies are ",
               join_names(names));
  }
  if (colon != std::string::npos) spec.chain = parse_chain(head.substr(colon + 1));
  return spec;
}

// ---- The registry -------------------------------------------------------------------------------

PlanCache::PlanCache(const Simulator& sim) : sim_(&sim) {}
PlanCache::~PlanCache() = default;

DpCache& PlanCache::dp(const std::string& variant) {
  std::unique_ptr<DpCache>& c = dp_[variant];
  if (!c) c = std::make_unique<DpCache>();
  return *c;
}

PlanCache& cache_for(const Simulator& sim, const PlanOptions& options) {
  REGEN_CHECK(options.cache != nullptr,
              "a planner was called without a PlanCache (make_plan hands one to every planner)");
  REGEN_CHECK(&options.cache->simulator() == &sim,
              "PlanOptions::cache was made for another simulator (a PlanCache holds what planners "
              "found on one profile)");
  return *options.cache;
}

void check_marks_blocks(const Simulator& sim, const std::string& policy) {
  REGEN_CHECK(!sim.profile().blocks.empty(), "the ", policy,
              " policy checkpoints whole blocks, and ", sim.profile().model,
              " marks none (a model marks its residual blocks or layers with BlockScope in "
              "forward): use mutwo, dp or milp");
}

std::vector<PlannerInfo> builtin_planners() {
  return {none_planner(), blocks_planner(), sqrt_planner(), mutwo_planner(),
          dp_planner(),   milp_planner(),   dtr_planner(),  dtr_coop_planner()};
}

namespace {

std::vector<PlannerInfo>& registered() {
  static std::vector<PlannerInfo> planners;
  return planners;
}

// The checks register_planner makes, then the planner joins the registry.
void add_planner(PlannerInfo info) {
  REGEN_CHECK(
      !info.name.empty() && std::all_of(info.name.begin(), info.name.end(),
                                        [](char c) {
                                          return std::isalnum(static_cast<unsigned char>(c)) ||
                                                 c == '-' || c == '_';
                                        }),
      "register_planner: the name '", info.name, "' must be letters, digits, '-' and '_'");
  REGEN_CHECK(static_cast<bool>(info.plan), "register_planner: planner '", info.name,
              "' has no function");
  for (const PlannerInfo& p : registered()) {
    REGEN_CHECK(p.name != info.name, "register_planner: a planner named '", info.name,
                "' is registered already");
  }
  registered().push_back(std::move(info));
}

// The registry, with the built-in planners registered first (builtin_planners), through the checks
// register_planner makes.
const std::vector<PlannerInfo>& planners() {
  static const bool builtins = [] {
    for (PlannerInfo& info : builtin_planners()) add_planner(std::move(info));
    return true;
  }();
  (void)builtins;
  return registered();
}

}  // namespace

std::vector<std::string> policy_names() {
  std::vector<std::string> out;
  for (const PlannerInfo& p : planners()) out.push_back(p.name);
  return out;
}

std::vector<std::string> remat_policy_names() {
  std::vector<std::string> out = policy_names();
  out.erase(std::remove(out.begin(), out.end(), "none"), out.end());
  return out;
}

void register_planner(PlannerInfo info) {
  planners();
  add_planner(std::move(info));
}

const PlannerInfo* find_planner(const std::string& name) {
  for (const PlannerInfo& p : planners()) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

const PlannerInfo& planner_info(const std::string& name) {
  const PlannerInfo* p = find_planner(name);
  REGEN_CHECK(p, "unknown policy '", name, "': known policies are ", join_names(policy_names()));
  return *p;
}

bool planner_available(const std::string& name) {
  const PlannerInfo& p = planner_info(name);
  return !p.available || p.available();
}

std::string planner_help() {
  std::string out;
  for (const PlannerInfo& p : planners()) {
    out += (out.empty() ? "" : "; ") + p.name + ": " + p.help;
  }
  return out;
}

void check_plan_decisions(const Plan& plan, const Profile& p) {
  REGEN_CHECK(plan.decisions.size() == p.saved.size(), "plan '", plan.policy, "' has ",
              plan.decisions.size(), " decisions, but the profile of ", p.model, " has ",
              p.saved.size(), " saved tensors");
}

void complete_offloads(const Profile& p, Plan& plan, const PlanOptions& options) {
  if (!plan.transfer.valid())
    plan.transfer = options.transfer.valid() ? options.transfer : p.transfer;
  if (!plan.uses_host()) return;
  REGEN_CHECK(plan.transfer.valid(), "plan '", plan.policy,
              "' copies to the host tier, and there is no transfer model to time the copies (the "
              "profile of ",
              p.model, " has none): give one (--transfer, regen bench copy)");
  if (plan.offloads.empty() && plan.offloaded() > 0) {
    plan.offloads =
        offload_points(p, plan.decisions, plan.keep_chain, plan.regenerations, plan.transfer);
  }
}

namespace {
// A plan's prediction, planned layout, feasibility and limit, from its decisions and its budget
// in bytes and kind.
void judge_against_budget(const Simulator& sim, Plan& plan, bool planned_layout) {
  PlanFit f = fit_schedule(sim, plan_schedule(sim.profile(), plan), plan.budget_bytes,
                           plan.budget_of, nullptr, planned_layout);
  plan.predicted = std::move(f.result);
  plan.layout = std::move(f.layout);
  plan.feasible = f.fits;  // fit_schedule: everything fits without a budget
  plan.limit = plan.feasible && plan.budget_of == BudgetOf::reserved
                   ? limit_for(plan.predicted, plan.budget_bytes)
                   : 0;
}

}  // namespace

int64_t no_remat_peak_of(const Simulator& sim, BudgetOf of) {
  const Profile& p = sim.profile();
  return peak_of(
      sim.run(build_schedule(p, std::vector<Decision>(p.saved.size(), Decision::retain))), of);
}

Plan finish_plan(const Simulator& sim, Plan draft, const Budget& budget,
                 const PlanOptions& options) {
  check_plan_decisions(draft, sim.profile());
  Plan plan = std::move(draft);
  complete_offloads(sim.profile(), plan, options);
  plan.budget_text = budget.str();
  plan.budget_of = options.budget_of;
  plan.no_remat_peak = no_remat_peak_of(sim, plan.budget_of);
  plan.budget_bytes = budget.resolve(plan.no_remat_peak);
  plan.lower_bound = memory_lower_bound(sim.profile(), options.offload);
  judge_against_budget(sim, plan, options.planned_layout);
  plan.lowest_peak = std::min(plan.no_remat_peak, peak_of(plan.predicted, plan.budget_of));
  if (options.planned_layout) ensure_planned_layout(sim, plan);
  return plan;
}

void judge_loaded_plan(const Simulator& sim, Plan& plan) {
  check_plan_decisions(plan, sim.profile());
  if (dtr_policy(plan.policy)) {  // decided at run time: its prediction is DTR's simulation
    judge_dtr_plan(sim, plan);
    return;
  }
  judge_against_budget(sim, plan, plan.planned_layout);
  plan.no_remat_peak = no_remat_peak_of(sim, plan.budget_of);
}

namespace {
// make_plan's last step for any planner's plan: the policy name, the note of a plan that does not
// fit, the planned-layout check and the planning time since t0.
Plan finish_policy_plan(const Simulator& sim, const std::string& policy, Plan plan,
                        const Budget& budget, const PlanOptions& options,
                        std::chrono::steady_clock::time_point t0);
}  // namespace

namespace {

// The plan at the lowest budget of a planner registered without a LowestFn: its answer to an
// impossible budget is the lowest it aims for, so the lowest budget that plan fits, if the planner
// then meets it; else the no-remat plan's.
Plan searched_lowest_plan(const PlannerInfo& planner, const Simulator& sim,
                          const PlanOptions& options) {
  const Profile& p = sim.profile();
  Plan probe = planner.plan(sim, bytes_budget(1), options);
  check_plan_decisions(probe, p);
  Plan none;
  none.decisions.assign(p.saved.size(), Decision::retain);
  Plan plan;
  for (const Plan* draft : {&probe, &none}) {
    const int64_t low = lowest_fitting_budget(sim, plan_schedule(p, *draft), options.budget_of,
                                              nullptr, options.planned_layout);
    plan = planner.plan(sim, bytes_budget(low), options);
    if (plan.feasible) break;
  }
  return plan;
}

// The lowest budget `policy` meets with `options`, for the note of a plan that does not fit;
// remembered in the cache. A planner with lowest_noted_by (milp) notes that planner's (dp's, which
// it meets: searching below it takes MILP solves; lowest_plan does). The second member says whether
// it is the policy's own lowest.
std::pair<int64_t, bool> noted_lowest(const Simulator& sim, const std::string& policy,
                                      const PlanOptions& options) {
  const PlannerInfo& planner = planner_info(policy);
  if (!planner.lowest_noted_by.empty()) {
    return {noted_lowest(sim, planner.lowest_noted_by, options).first, false};
  }
  const std::string key = policy + " " + chain_names()[static_cast<size_t>(options.chain)] + " " +
                          budget_of_name(options.budget_of) +
                          (options.planned_layout ? " planned" : " caching") +
                          (options.offload == OffloadMode::none
                               ? std::string()
                               : std::string(" offload ") + offload_mode_name(options.offload) +
                                     " " + options.transfer.str());
  std::map<std::string, int64_t>& known = cache_for(sim, options).lowest;
  auto it = known.find(key);
  if (it == known.end()) {
    const int64_t low = planner.lowest ? planner.lowest(sim, options).budget_bytes
                                       : searched_lowest_plan(planner, sim, options).budget_bytes;
    it = known.emplace(key, low).first;
  }
  return {it->second, true};
}

}  // namespace

Plan lowest_plan(const Simulator& sim, const std::string& policy, const PlanOptions& options) {
  const auto t0 = std::chrono::steady_clock::now();
  const PlannerInfo& planner = planner_info(policy);
  // The caller's cache, or one for this call.
  std::unique_ptr<PlanCache> own;
  PlanOptions o = options;
  if (!o.cache) {
    own = std::make_unique<PlanCache>(sim);
    o.cache = own.get();
  }
  cache_for(sim, o);
  Plan plan = planner.lowest ? planner.lowest(sim, o) : searched_lowest_plan(planner, sim, o);
  REGEN_CHECK(plan.feasible && plan.budget_bytes > 0, "planner '", policy,
              "' meets no budget it was asked for on ", sim.profile().model,
              ", not even the no-remat peak (its plan there: ", plan.note, ")");
  return finish_policy_plan(sim, policy, std::move(plan), Budget::parse("lowest"), o, t0);
}

Plan make_plan(const Simulator& sim, const std::string& policy, const Budget& budget,
               const PlanOptions& options) {
  if (budget.kind == Budget::Kind::lowest) return lowest_plan(sim, policy, options);
  const auto t0 = std::chrono::steady_clock::now();
  const PlannerInfo& planner = planner_info(policy);
  std::unique_ptr<PlanCache> own;
  PlanOptions o = options;
  if (!o.cache) {
    own = std::make_unique<PlanCache>(sim);
    o.cache = own.get();
  }
  cache_for(sim, o);
  return finish_policy_plan(sim, policy, planner.plan(sim, budget, o), budget, o, t0);
}

Plan make_plan(const Simulator& sim, const std::string& policy, const Budget& budget, Chain chain) {
  PlanOptions o;
  o.chain = chain;
  return make_plan(sim, policy, budget, o);
}

namespace {

Plan finish_policy_plan(const Simulator& sim, const std::string& policy, Plan plan,
                        const Budget& budget, const PlanOptions& options,
                        std::chrono::steady_clock::time_point t0) {
  REGEN_CHECK(plan.decisions.size() == sim.profile().saved.size(), "planner '", policy,
              "' returned ", plan.decisions.size(), " decisions for ", sim.profile().saved.size(),
              " saved tensors");
  plan.policy = policy;
  const BudgetOf of = plan.budget_of;
  // lowest_peak: the lowest budget the policy meets, for a plan that does not fit (what to ask
  // for instead) and a plan at that budget; 0 for any other plan that fits (lowest_plan finds it).
  plan.lowest_peak = 0;
  if (budget.kind == Budget::Kind::lowest) {
    plan.budget_text = budget.str();
    plan.lowest_peak = plan.budget_bytes;
  }
  if (!plan.feasible) {
    const auto [low, own_lowest] = noted_lowest(sim, policy, options);
    plan.lowest_peak = low;
    // A planner's own note (what it modelled) follows.
    const std::string own = plan.note;
    plan.note = "budget " + format_bytes(plan.budget_bytes) + " (" + budget_of_name(of) +
                ") cannot be met by " + policy + ": the lowest " + budget_of_name(of) +
                " budget it meets is " + (own_lowest ? "" : "at most ") + format_bytes(low) +
                (own_lowest ? "" : " (dp's lowest)") + "; lower bound " +
                format_bytes(plan.lower_bound) + " allocated (what no plan can free)" +
                (own.empty() ? "" : "; " + own);
  }
  const std::string blockers = recompute_blockers(sim.profile());
  if (!blockers.empty() && policy != "none")
    plan.note += (plan.note.empty() ? "" : "; ") + blockers;
  plan.planned_layout = options.planned_layout;
  REGEN_CHECK(!plan.planned_layout || plan.layout, "planner '", policy,
              "' was asked for a planned "
              "layout and returned none (finish_plan plans one)");
  plan.planning_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return plan;
}

}  // namespace

}  // namespace regen
