// DTR, dynamic tensor rematerialization (after Kirisame et al.), simulated exactly: no plan. Under
// the allocator's hard limit (the budget), a request the allocator cannot serve asks the DTR
// engine to evict resident saved tensors (the allocator's eviction handler), chosen by DTR's
// heuristic; a saved tensor read while evicted (an op's input in forward, a saved tensor in
// backward) is regenerated first, by a regeneration program (schedule.h) replayed as the static
// plans' are. Coop (Zhang et al.) is the variant that evicts a window of address-contiguous
// blocks instead (`dtr-coop`).
//
// The engine is deterministic: a logical clock (one tick per op and per replayed op), costs from
// the profile's forward times, decisions that depend only on the allocator's state and the
// engine's own. The simulator (Null arena) and the executor (the tape's hooks, the device's
// allocator) drive the same engine at the same points of the step, through a DtrRuntime each, so
// the simulation predicts DTR's peaks (allocated and reserved), evictions and replays exactly.
// docs/remat.md ("DTR") has the details. Tests: tests/test_dtr.cpp.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "regen/remat/execute/executor.h"
#include "regen/remat/plan/planner.h"

namespace regen {

// The DTR options of a registered policy that decides at step time (PlannerInfo::at_step_time:
// "dtr", "dtr-coop"); nullopt for any other policy, or a name no planner has.
std::optional<DtrOptions> dtr_policy(const std::string& policy);

// What one step of DTR did.
struct DtrStats {
  int64_t evictions = 0;         // saved tensors evicted
  int64_t programs = 0;          // regenerations run (one per op that found an input evicted)
  int64_t forward_programs = 0;  // of them, before a forward op
  int64_t replays = 0;           // ops replayed
  double recompute_ms = 0;       // the replayed ops' profiled forward times
  int64_t windows = 0;           // Coop: windows evicted (each one eviction handler call)
};

// What the engine acts through: the simulator's blocks, or the executor's tape and allocator.
// An offload fate would add its own action here (copy out, and back before a read).
class DtrRuntime {
 public:
  virtual ~DtrRuntime() = default;
  // Frees saved tensor `saved`'s bytes (it must be resident).
  virtual void evict(int32_t saved) = 0;
  // Runs a regeneration program (interpret_program): replays, restores its targets; after_step(i)
  // once step i is done.
  virtual void run_program(const RegenProgram& prog,
                           const std::function<void(size_t)>& after_step) = 0;
  // The allocation id of a resident saved tensor's block, and the allocator's blocks in segment
  // and address order (Coop's windows).
  virtual uint64_t block_id(int32_t saved) const = 0;
  virtual std::vector<BlockInfo> layout() const = 0;
};

// The policy's state over a step. Driven at these points, in this order, by both runtimes:
// before_forward(n) / after_forward(n) around every forward op (node 0 starts the step),
// backward_start(), before_backward(j) / after_backward(j) around every backward op,
// end_step(); evict_for() whenever the allocator asks.
class DtrEngine {
 public:
  DtrEngine(const Profile& profile, DtrOptions options, DtrRuntime& runtime);

  void before_forward(int32_t node);
  void after_forward(int32_t node);
  void backward_start();
  void before_backward(int32_t node);
  void after_backward(int32_t node);
  void end_step();
  // An op threw: its pins go (the step is over; the next one starts afresh).
  void abort_op();
  // The allocator's eviction handler: evicts one saved tensor (or a Coop window); false when
  // nothing is evictable (no step running, or every resident saved tensor pinned or ineligible).
  bool evict_for(const EvictionRequest& request);

  bool in_step() const { return active_; }
  const DtrStats& current() const { return cur_; }  // the step in progress
  const DtrStats& last() const { return last_; }    // the last finished step
  const DtrOptions& options() const { return o_; }
  // Whether DTR may evict saved tensor `s` at all: produced in the step and recomputable from
  // what stays readable (remat/profile/profile.h ProfileSaved: not a leaf, every leaf it needs
  // available).
  bool eligible(int32_t s) const { return eligible_[static_cast<size_t>(s)] != 0; }
  // DTR's score of a resident saved tensor now: the cost of recomputing it and its evicted
  // neighbourhood over (bytes x staleness); the lowest is evicted first.
  double score(int32_t s) const;

 private:
  enum class State : uint8_t { unborn, resident, evicted, released };
  void begin_step();
  void pin(int32_t s);
  void unpin(int32_t s);  // one of this op's pins of s
  void unpin_all();
  void evict(int32_t s);
  void regenerate(std::vector<int32_t> targets);
  void mark_absent(int64_t v);
  void mark_present(int64_t v);
  int64_t find(int64_t v) const;
  void unite(int64_t a, int64_t b);
  bool evictable(int32_t s) const;
  int32_t cheapest() const;
  bool evict_window(const EvictionRequest& request);

  const Profile& p_;
  DtrOptions o_;
  DtrRuntime& rt_;
  // From the profile.
  std::vector<char> eligible_;                          // per saved tensor
  std::vector<std::vector<int32_t>> born_after_;        // per node: saved records it creates
  std::vector<std::vector<int32_t>> forward_reads_;     // per node: saved roots of its inputs
  std::vector<std::vector<int32_t>> backward_reads_;    // per node: saved roots backward reads
  std::vector<std::vector<int32_t>> released_at_rank_;  // per backward rank: last uses
  std::vector<int32_t> unread_;                         // released when backward starts
  std::vector<std::vector<int64_t>> neighbours_;  // per root value: producer-side and consumer-side
  std::vector<double> cost_;                      // per value: its producer's forward time
  // The step.
  bool active_ = false;
  int64_t clock_ = 0;
  std::vector<State> state_;
  std::vector<int64_t> last_access_;
  std::vector<int32_t> pins_;
  std::vector<int32_t> pinned_;  // this op's pins
  // The evicted neighbourhood, approximated as DTR's prototype does: a union-find over the
  // values that are not resident (evicted, released, never saved), each class with the sum of
  // its members' costs; a value made resident again leaves its cost, not its class.
  std::vector<char> absent_;
  mutable std::vector<int64_t> parent_;
  std::vector<double> class_cost_;
  DtrStats cur_, last_;
};

// The DTR runtime of a training step: RematExecutor's checks (the op sequence against the
// profile) with an engine that decides at run time; its evictions(), replays() and regen_ms()
// are the last finished step's. The pipeline (pipeline.h) installs it with the allocator's
// eviction handler pointing at engine().evict_for while steps run.
class DtrExecutor : public RematExecutor {
 public:
  DtrExecutor(const Profile& profile, DtrOptions options, CachingAllocator& allocator);
  ~DtrExecutor() override;

  void on_forward_begin(Tape& tape, int32_t node) override;
  void on_forward_abort(Tape& tape, int32_t node) override;
  void on_forward_end(Tape& tape, int32_t node, const std::vector<Tensor>& outputs) override;
  void on_backward_start(Tape& tape) override;
  void on_backward_begin(Tape& tape, int32_t node) override;
  void on_backward_end(Tape& tape, int32_t node) override;
  void on_backward_finish(Tape& tape) override;
  bool regenerate(Tape& tape, int32_t saved) override;

  DtrEngine& engine() { return *engine_; }
  const DtrStats& stats() const { return engine_->last(); }
  CachingAllocator& allocator() const { return allocator_; }

 private:
  class TapeRuntime;
  CachingAllocator& allocator_;
  std::unique_ptr<TapeRuntime> runtime_;
  std::unique_ptr<DtrEngine> engine_;
  std::vector<size_t> saved_upto_;  // per node: saved records the profile has after its forward
};

// One step of DTR under an allocator limit (0: none), simulated: the same engine on the Null
// arena. SimResult's replays, recompute_ms, time_ms and evictions are DTR's; stats, when given,
// gets the rest.
SimResult simulate_dtr(const Simulator& sim, const DtrOptions& options, int64_t limit,
                       SimOptions so = {}, DtrStats* stats = nullptr);

// The dtr and dtr-coop planners (registered as such): a plan with no recompute decisions, whose
// prediction is DTR's simulated step under the budget's limit (or a lower one when that runs out
// of memory: a limit is not monotonic, remat/plan/planner.h fit_schedule). A reserved budget only:
// DTR evicts when the allocator's hard limit refuses a request; an allocated budget or a planned
// layout gives an infeasible plan that says so.
Plan plan_dtr(const Simulator& sim, const Budget& budget, const PlanOptions& options,
              const DtrOptions& dtr);
// The lowest limit under which DTR was found to run and its plan there, with budget_bytes that
// limit (the planners' LowestFn): a limit is not monotonic, so this is the lowest found, not
// proven (see dtr.cpp). Remembered in options.cache.
Plan lowest_dtr_plan(const Simulator& sim, const PlanOptions& options, const DtrOptions& dtr);
// A DTR plan read from plan.json, judged again on `sim`'s profile (judge_loaded_plan calls it).
void judge_dtr_plan(const Simulator& sim, Plan& plan);

}  // namespace regen
