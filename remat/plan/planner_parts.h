// The parts the built-in planners are made of, for planners registered outside regen too
// (register_planner, planner.h): comparing two answers to one budget, the prefix search blocks and
// mutwo share, and planning in both chain modes to keep the better answer. Each built-in planner
// sits in its own file under remat/plan/planners/ and is registered through the same PlannerInfo an
// outside planner gives register_planner. Tests: tests/test_remat.cpp, tests/test_pipeline.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "regen/remat/plan/planner.h"

namespace regen {

// When no plan meets the budget, plans whose peak is within this fraction of the lowest peak
// count as reaching it, and the fastest of them is chosen.
constexpr double kNearLowest = 0.01;
bool near_lowest(int64_t peak, int64_t lowest);

// Whether plan a is the better answer to their (common) budget than plan b: the one that fits;
// both fitting, the faster; neither fitting (or no budget), the lower peak, unless the two peaks
// are within kNearLowest of each other, when the faster.
bool better_plan(const Plan& a, const Plan& b);

// Whether saved tensor s lives entirely inside the node set `inside` (its producer and every
// reader of any value sharing its storage).
bool contained(const Profile& p, const ProfileSaved& s, const std::function<bool(int32_t)>& inside);

// A policy whose plans come in an order: plan k (k = 0..n) is `make(k)`, and more recomputes
// more (blocks: the first k blocks checkpointed; mutwo: the first k greedy picks recomputed).
struct PrefixPolicy {
  size_t n = 0;
  std::function<std::vector<Decision>(size_t)> make;
  // The note: "<what> <k> of <n> <unit>", e.g. "checkpointed the first 3 of 16 blocks".
  std::string what, unit;
};

// The prefixes the search scans first: up to 33 evenly spaced k in [0, n], 0 and n included.
// Bisection only ever starts from one that fits, so a budget is met exactly when one of these
// fits it.
std::vector<size_t> coarse_prefixes(size_t n);

// The plan for the budget in chain mode `keep_chain`: the smallest k whose plan fits. The peak
// usually falls as k grows but not always (long regeneration chains can raise it again), so the
// search simulates the coarse prefixes, then bisects between the last that did not fit and the
// first that did. When none fits (and without a budget, which no plan "fits"), the fastest of the
// plans it simulated whose peak is within kNearLowest of the lowest. Every evaluation is an exact
// simulation (fit_schedule). The note of a plan that does not fit is left to make_plan.
Plan plan_prefix(const Simulator& sim, const Budget& budget, const PlanOptions& options,
                 bool keep_chain, const PrefixPolicy& policy);
// The lowest budget (of options.budget_of) such a policy meets in chain mode `keep_chain`: the
// lowest over the coarse prefixes of the budget each fits (lowest_fitting_budget).
int64_t prefix_lowest(const Simulator& sim, const PlanOptions& options, bool keep_chain,
                      const PrefixPolicy& policy);

// A planner that plans in both chain modes and keeps the better answer (better_plan) when
// options.chain is auto, and in the mode asked otherwise. The note says which mode was chosen,
// with the other's peak and step time. mutwo is registered through it: Capuchin's cost model
// assumes the drop chain, and executed that way a block whose inside is evicted reruns once per
// backward op; keeping what backward still needs is often much faster at a slightly different
// peak (docs/remat.md, "Chain modes").
PlannerFn in_both_chain_modes(PlannerFn plan);
// The lowest budget in bytes a planner meets with the options, in their chain mode.
using LowestBudgetFn = std::function<int64_t(const Simulator&, const PlanOptions&)>;
// The LowestFn of in_both_chain_modes(plan): with chain auto, the lower of the two modes' lowest
// budgets (a budget is met when either mode meets it), planned there in both modes.
LowestFn lowest_in_both_chain_modes(LowestBudgetFn lowest_in_mode, PlannerFn plan);

// A budget of `bytes` bytes.
Budget bytes_budget(int64_t bytes);

}  // namespace regen
