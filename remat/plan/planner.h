// Stage 2: planners behind one interface. Each returns a Plan: a RETAIN/RECOMPUTE decision per
// saved tensor, checked against the budget with the exact simulator. Planners are registered by
// name (register_planner); the built-in ones sit in remat/plan/planners/, one file each, registered
// through the same PlannerInfo, and share the parts in planner_parts.h:
//   none    retain everything
//   blocks  torch.utils.checkpoint per residual block / encoder layer: keep each block's input,
//           recompute its inside; with a budget, blocks are checkpointed in forward order until
//           the simulated peak fits
//   sqrt    Chen et al.: sqrt(n) segments over the chain of blocks, segment inputs kept
//   mutwo   the recomputation branch of mu-TWO's Algorithm B (after Capuchin): greedy by recompute
//           ratio = bytes / total recompute time, with sources, times and counts updated after
//           every pick; stops at the first prefix of picks whose simulated peak fits
//   dp      a dynamic programme over the chain of blocks (after Rotor and Rockmate, chain.h) for
//           every budget level at once; the fastest of its plans that fits, simulated exactly
//   milp    the exact mixed-integer programme over the executor's plans (after Checkmate,
//           milp.h), solved with CBC from the dp plan; for small graphs (a ground truth)
// Chain mode (how a regeneration treats evicted tensors it recomputes on the way to its target):
//   keep    keep those that backward still needs (torch.utils.checkpoint reruns a block once)
//   drop    keep only the targets; each evicted tensor is recomputed from retained ones every time
//           it is needed (Capuchin's and mu-TWO's cost model)
//   auto    blocks and sqrt: keep; mutwo: plan both and take the better one (fits the budget, then
//           the lower predicted step time; when neither fits, the lower peak)
// docs/remat.md describes each one on the real data structures.
// remat/plan/ is stage 2: this interface, the planners' models and parts, plan files; the
// built-in planners are in remat/plan/planners/ (docs/architecture.md, "remat").
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "regen/remat/simulate/simulator.h"

namespace regen {

// "2GiB", "1.5GB", "123456" (bytes) or "60%" (of the no-remat peak); "" or "none" for none;
// "lowest": the lowest budget the policy meets (make_plan finds it: lowest_plan).
struct Budget {
  enum class Kind { none, bytes, fraction, lowest } kind = Kind::none;
  double value = 0;
  static Budget parse(const std::string& text);
  std::string str() const;
  // Bytes for a given no-remat peak (0 for none). Throws regen::Error for lowest, which only a
  // planner can resolve (make_plan).
  int64_t resolve(int64_t no_remat_peak) const;
};

// What a budget bounds. reserved (the default): what the device sees. The step runs with the
// allocator's hard limit at the budget (training sets it, the simulator replays it: at the limit
// the allocator maps the smallest segment that fits, then empties its cache), and a plan fits
// when it runs under that limit; reserved bytes then never pass the budget. allocated: the bytes
// tensors occupy, the sum other planners bound, with the allocator unlimited (reserved bytes may
// be more). A percentage is of the no-remat peak of the same kind.
enum class BudgetOf { reserved, allocated };
const char* budget_of_name(BudgetOf of);  // "reserved", "allocated"
// Throws regen::Error naming the two for anything else.
BudgetOf parse_budget_of(const std::string& text);
// A simulation's peak of that kind.
int64_t peak_of(const SimResult& r, BudgetOf of);
// The peak of that kind of the profile's iteration without remat, simulated: what a percentage
// budget is of.
int64_t no_remat_peak_of(const Simulator& sim, BudgetOf of);

// A schedule judged against a budget in bytes (0: none; everything fits). Simulated without a
// limit; for a reserved budget that its reserved peak passes but its allocated peak does not,
// simulated again under the limit, and it fits when it runs there. A limit is not monotonic: one
// close above the step's allocated peak can run out of memory where a lower one does not (the
// allocator maps a shared 20 MiB segment early while it has room, then cannot map the next
// segment it needs; under the lower limit it mapped right-sized segments from the start). So a
// step that runs out of memory under the budget's limit is tried under up to kLimitProbes lower
// limits, evenly spaced down towards its allocated peak, and fits under the first that runs.
// `result` is what training with that budget sees (the limited run when a limit was needed, with
// the limit it ran under in result.limit; else the unlimited one).
// `unlimited` passes a simulation the caller already has.
// With planned_layout, the step runs with the schedule's planned layout (layout.h: every block at
// an offset decided from the schedule, in one arena), judged by that run.
struct PlanFit {
  SimResult result;
  bool fits = true;
  std::shared_ptr<const PlannedLayout> layout;  // with planned_layout
};
PlanFit fit_schedule(const Simulator& sim, const Schedule& s, int64_t budget, BudgetOf of,
                     const SimResult* unlimited = nullptr, bool planned_layout = false);
constexpr int kLimitProbes = 8;
// The lowest budget of kind `of` under which fit_schedule finds that `s` fits, exactly (feasibility
// is not monotone in a reserved budget, so no bisection): its allocated peak for an allocated
// budget, its planned run's peak with planned_layout, and for a reserved budget the lowest limit
// at or above its allocated peak under which it runs, found by stepping from each limit that runs
// out of memory to the lowest reserved total that limit refused (SimResult::next_limit): every
// limit between the two runs the step the same way. A budget there fits (fit_schedule tries the
// budget's own limit first), one byte less does not. With `below` > 0 the search stops at `below`
// and returns a value >= below when the schedule fits nothing lower. `unlimited`: the schedule's
// run without a limit, when the caller has it.
int64_t lowest_fitting_budget(const Simulator& sim, const Schedule& s, BudgetOf of,
                              const SimResult* unlimited = nullptr, bool planned_layout = false,
                              int64_t below = 0);
// The allocator limit a plan that fits a reserved budget runs under: the one its prediction was
// simulated under (fit_schedule), else the budget itself (the step never reaches it).
inline int64_t limit_for(const SimResult& predicted, int64_t budget) {
  return predicted.limit > 0 ? predicted.limit : budget;
}

struct Plan {
  std::string policy;
  std::string budget_text;
  int64_t budget_bytes = 0;  // 0: no budget
  BudgetOf budget_of = BudgetOf::reserved;
  // Whether the plan runs with a planned layout (layout.h), and that layout (nullptr: the caching
  // allocator's own placement). plan.json stores only the flag ("layout": "planned"): the layout
  // follows from the schedule and the profile, and whoever runs a loaded plan plans it again.
  bool planned_layout = false;
  std::shared_ptr<const PlannedLayout> layout;
  // The allocator's hard limit the plan runs under (0: none): a reserved budget the plan fits, or
  // the lower limit fit_schedule found when the budget's own runs out of memory; for dp's answer
  // to a reserved budget below every plan, the lowest limit its plan runs under.
  // `predicted` is the simulation under it, and training must set it to run as predicted.
  int64_t limit = 0;
  std::vector<Decision> decisions;  // one fate per saved tensor (remat/execute/schedule.h Fate)
  bool keep_chain = true;
  // Explicit regenerations (remat/execute/schedule.h); most planners have none.
  std::vector<Regeneration> regenerations;
  // Offload: the points of every tensor whose fate is offload (remat/execute/schedule.h Offload;
  // finish_plan chooses them with offload_points when a draft has none), where the optimizer state
  // lives between steps, and the transfer model that times the copies (the profile's, unless the
  // planner was given another: PlanOptions::transfer). plan.json stores all three.
  std::vector<Offload> offloads;
  StatePlace optimizer_state = StatePlace::device;
  TransferModel transfer;
  bool feasible = true;       // fits the budget (always true without a budget)
  SimResult predicted;        // exact simulation of this plan (under `limit`)
  int64_t no_remat_peak = 0;  // of the budget's kind, as the peaks below
  // For a plan that does not fit, and a plan for the budget "lowest": the lowest budget of its
  // kind the policy meets (lowest_plan; milp: dp's, which it meets); 0 for other plans. Inside a
  // planner, before make_plan sets it, the lowest peak of the plans it tried.
  int64_t lowest_peak = 0;
  int64_t lower_bound = 0;  // memory_lower_bound: no plan's peak goes below it
  double planning_ms = 0;
  std::string note;  // why infeasible, or what was chosen
  int64_t recomputed() const;
  int64_t recomputed_bytes(const Profile& p) const;
  int64_t offloaded() const;
  int64_t offloaded_bytes(const Profile& p) const;
  // Whether the plan keeps anything on the host tier (an offloaded tensor or the optimizer state).
  bool uses_host() const;
};

// The schedule a plan runs: its decisions, chain mode and explicit regenerations. Everything that
// simulates or executes a plan goes through this, so the two cannot disagree.
Schedule plan_schedule(const Profile& p, const Plan& plan);

// For a plan chosen from runs without a planned layout (no budget, or nothing fits): unless it
// has a layout already, plans one for its schedule and makes its prediction the run with it.
void ensure_planned_layout(const Simulator& sim, Plan& plan);

enum class Chain { automatic, keep, drop };
std::vector<std::string> chain_names();  // "auto", "keep", "drop"
// Throws regen::Error naming the known modes for an unknown one.
Chain parse_chain(const std::string& text);

// The registered planners' names, built-in ones first (planners/builtin.h builtin_planners(), in
// its order), then those a program registered, in registration order (register_planner below).
std::vector<std::string> policy_names();
// The same without "none": the policies that rematerialize (for help texts and error messages).
std::vector<std::string> remat_policy_names();

// The fates beyond retain and recompute a planner may choose (dp and milp do; the others leave
// offload alone): none; activations (saved activations offloaded to the host tier); optimizer
// (the optimizer state on the host tier between steps); all (both).
enum class OffloadMode : uint8_t { none, activations, optimizer, all };
std::vector<std::string> offload_mode_names();  // "none", "activations", "optimizer", "all"
// Throws regen::Error naming the modes for anything else.
OffloadMode parse_offload_mode(const std::string& text);
const char* offload_mode_name(OffloadMode m);
inline bool offloads_activations(OffloadMode m) {
  return m == OffloadMode::activations || m == OffloadMode::all;
}
inline bool offloads_optimizer(OffloadMode m) {
  return m == OffloadMode::optimizer || m == OffloadMode::all;
}

// "policy" or "policy:chain" (as `regen sweep --policies` takes them, e.g. mutwo:drop for
// mu-TWO's own chain semantics). Throws regen::Error naming the bad part.
// "policy[:chain][+offload]", where offload is an offload mode (activations, optimizer, all):
// dp+all is dp with every fate (regen frontier and sweep set it beside dp).
struct PolicySpec {
  std::string policy;
  Chain chain = Chain::automatic;
  bool offload_given = false;
  OffloadMode offload = OffloadMode::none;
  std::string label;  // the text given
};
PolicySpec parse_policy_spec(const std::string& text);

// One pick of mu-TWO's greedy, with its bookkeeping at the moment it was picked: the saved
// tensors its regeneration reads, the time of one regeneration from them, how many times it will
// be regenerated (1 for its own backward use, plus one per regeneration of an earlier pick that
// now passes through it), and the ranking key bytes / (rp_ms * count).
struct MutwoPick {
  int32_t saved = -1;
  double count = 1;
  double rp_ms = 0;
  double ratio = 0;
  std::vector<int32_t> srcs;
};
// The full greedy order over every candidate (make_plan then takes the shortest prefix whose
// simulated peak fits the budget).
std::vector<MutwoPick> mutwo_picks(const Profile& p);

// What planners compute on one profile whatever the budget, kept between their calls: dp's
// programme and the simulations of its plans, mu-TWO's greedy order, the lowest budgets found for
// the notes of plans that do not fit. The caller makes one for a simulator and passes it in
// PlanOptions::cache to every plan it makes on that simulator (a frontier of 40 budgets builds dp's
// programme once); make_plan makes one for the call when none is given. Not thread-safe: one
// planner call at a time per cache.
struct DpCache;  // remat/plan/planners/dp.h
class PlanCache {
 public:
  explicit PlanCache(const Simulator& sim);
  ~PlanCache();
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;
  const Simulator& simulator() const { return *sim_; }
  // Made on first use; dp fills it. One per variant (dp with an offload mode and transfer model).
  DpCache& dp(const std::string& variant = "");
  std::optional<std::vector<MutwoPick>> mutwo_picks;
  std::map<std::string, int64_t> lowest;  // by policy, chain mode, budget kind and layout
  // DTR's lowest limit found (remat/execute/dtr.cpp) and the reserved peak under it, by variant
  // (true: dtr-coop); a frontier asks at many budgets and the search runs dozens of simulations.
  struct DtrLowest {
    int64_t limit = 0, peak = 0;
  };
  std::map<bool, DtrLowest> dtr_lowest;

 private:
  const Simulator* sim_;
  std::map<std::string, std::unique_ptr<DpCache>> dp_;
};

// What a policy may be told beyond the budget.
struct PlanOptions {
  Chain chain = Chain::automatic;
  // What may go to the host tier (dp and milp choose per tensor, and where the optimizer state
  // lives; docs/remat.md "Offload").
  OffloadMode offload = OffloadMode::none;
  // The transfer model that times copies; not valid(): the profile's (Profile::transfer).
  TransferModel transfer;
  BudgetOf budget_of = BudgetOf::reserved;
  // Run the plan with a planned layout (layout.h) and judge it by that run.
  bool planned_layout = false;
  // milp: the solver's time limit per solve (the plan's note says whether it proved the optimum
  // and with what gap), and its threads.
  double milp_time_limit_s = 60;
  int milp_threads = 1;
  // The caller's cache for the simulator planned on (PlanCache); nullptr: make_plan makes one for
  // the call. A planner is always handed one.
  PlanCache* cache = nullptr;
};

// ---- The planner registry ---------------------------------------------------------------------
// A planner makes a Plan for a profile (through its simulator), a budget and the options. It may
// fill the decisions only (and keep_chain, regenerations) and hand the draft to finish_plan,
// which simulates it exactly and fills in the rest; make_plan then adds the planning time, and a
// note for a plan that does not fit. It never sees the budget "lowest" (make_plan resolves it).
using PlannerFn = std::function<Plan(const Simulator&, const Budget&, const PlanOptions&)>;
// The planner's plan at the lowest budget (of options.budget_of) it meets with those options, with
// budget_bytes that budget (lowest_plan).
using LowestFn = std::function<Plan(const Simulator&, const PlanOptions&)>;
// DTR's engine options (remat/execute/dtr.h): a planner that decides at step time runs the engine
// with them.
struct DtrOptions {
  // Coop: evict the cheapest window of address-contiguous blocks (free ones and evictable saved
  // tensors) that frees room for the request in one piece; DTR's own choice when no window can.
  bool coop = false;
};
struct PlannerInfo {
  std::string name;  // what --policy takes: letters, digits, '-' and '_'
  std::string help;  // one line, for --help and error messages
  PlannerFn plan;
  LowestFn lowest = nullptr;  // optional: without it lowest_plan searches (see there)
  // What callers ask of a planner, instead of its name:
  // - it decides at step time (DTR), its engine with these options: its plan carries no
  //   decisions to place ahead (no planned layout), and the step runs the engine (dtr_policy);
  std::optional<DtrOptions> at_step_time = std::nullopt;
  // - it may take minutes per budget beyond small graphs (a solver): left out of frontiers and
  //   sweeps unless named;
  bool slow = false;
  // - whether this build can run it (null: always; milp: when built with CBC);
  bool (*available)() = nullptr;
  // - the planner whose lowest budget make_plan notes beside this one's plans that do not fit
  //   ("": its own; milp: dp's, which it meets, since searching below that takes solves).
  std::string lowest_noted_by = "";
  // - it plans offloads (PlanOptions::offload; dp and milp): --offload other than none is refused
  //   for a planner that would ignore it.
  bool offloads = false;
};
// Adds a planner under its name: make_plan, RematPipeline::plan and every --policy flag then
// know it. Throws regen::Error for a name already taken or not of the form above.
void register_planner(PlannerInfo info);
const PlannerInfo& planner_info(const std::string& name);  // throws listing the names
const PlannerInfo* find_planner(const std::string& name);  // nullptr for a name no planner has
// planner_info(name).available, or true when it has no such test.
bool planner_available(const std::string& name);
// "none: retain everything; blocks: ..." for help texts.
std::string planner_help();

// A draft plan's decisions (keep_chain, regenerations) judged on `sim`'s profile against the
// budget: the budget fields, the exact prediction (under the limit a reserved budget sets), the
// planned layout with options.planned_layout, feasibility, the no-remat and lowest peaks and the
// lower bound. Throws regen::Error when the decisions are not one per saved tensor.
Plan finish_plan(const Simulator& sim, Plan draft, const Budget& budget,
                 const PlanOptions& options);

// Throws regen::Error listing the policies for an unknown name. A budget of kind lowest plans at
// the lowest budget the policy meets (lowest_plan).
Plan make_plan(const Simulator& sim, const std::string& policy, const Budget& budget,
               const PlanOptions& options);

// The policy's plan at the lowest budget (of options.budget_of) it meets: budget_text "lowest",
// budget_bytes that budget, feasible. A reserved budget's feasibility is not monotone (a limit
// close above a step's allocated peak can run out of memory where a lower one does not;
// docs/memory.md), so no search by bisection finds it: none, blocks, sqrt, mutwo and dp compute it
// exactly from the plans their search tries at any budget (the lowest budget each fits,
// lowest_fitting_budget); one byte less and the policy returns no plan that fits. milp meets every
// budget dp meets and searches below dp's lowest with a few solves: the lowest it found. A planner
// registered without a LowestFn is asked for a plan at an impossible budget, and the answer is the
// lowest budget that plan fits, if the planner then meets it (else the no-remat plan's): the
// lowest found, not proven. Throws regen::Error when the policy meets none of those.
Plan lowest_plan(const Simulator& sim, const std::string& policy, const PlanOptions& options);
Plan make_plan(const Simulator& sim, const std::string& policy, const Budget& budget,
               Chain chain = Chain::automatic);

// Allocated bytes no plan of the profiled iteration goes below, whatever its budget, chain mode,
// regenerations or layout: the highest level, over the points of the event log, of what every plan
// holds there (the persistent blocks, every block no plan can evict, and the candidates every plan
// must have resident: through the forward pass until their last forward reader, during the
// backward of each node reading them), each block at its rounded request (docs/remat.md).
// With offload, tensors a plan may offload count as candidates do, and optimizer state it may keep
// on the host tier not at all.
int64_t memory_lower_bound(const Profile& p, OffloadMode offload = OffloadMode::none);

// plan.json (atomic write); load checks it against the profile it is used with.
void save_plan(const Plan& plan, const Profile& p, const std::string& path);
Plan load_plan(const std::string& path, const Profile& p);
// A plan read from a file, judged again on `sim`'s profile: its prediction, planned layout,
// feasibility, limit and no-remat peak follow from its decisions and budget (finish_plan does the
// same for a planner's draft, from a Budget).
void judge_loaded_plan(const Simulator& sim, Plan& plan);
// Throws regen::Error naming the plan and the profile unless the plan has one decision per saved
// tensor.
void check_plan_decisions(const Plan& plan, const Profile& p);
// A plan's transfer model (the options', else the profile's, when it has none) and, when it
// offloads tensors without points, their points (offload_points). Throws regen::Error when the
// plan copies to the host tier and no transfer model is known.
void complete_offloads(const Profile& p, Plan& plan, const PlanOptions& options);

}  // namespace regen
