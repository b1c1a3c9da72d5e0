// The dp planner's model and dynamic programme: Rotor's and Rockmate's idea on regen's exact
// machinery. docs/remat.md ("The dp planner") walks through it; tests: tests/test_chain.cpp.
//
// The forward pass is cut into a chain of stages: each residual block or encoder layer
// (BlockScope) is one, and so is each op outside a block, except that neighbours are merged
// wherever a value crosses their boundary that no saved tensor holds (it could not be kept as a
// checkpoint). What crosses a boundary is the next stage's input: saved tensors the previous
// stage produced (its output). A saved tensor read across more than one boundary (a long skip)
// is pinned: left resident, outside the chain. Every other recomputable saved tensor is
// "tracked" and belongs to the stage that produced it: its output, or its interior.
//
// Per stage the model lists
//  - options: interior subsets to hold, with the output, through the first pass (Pareto in bytes
//    held against the time of getting the rest back in the stage's backward);
//  - holds: what a stage inside a dropped segment keeps (its output is dropped): only what is
//    always held (tiny tensors, and those cheap to hold for what regenerating them costs), or
//    interior that makes re-running it cheap; a segment's stages all hold the same class;
//  - three ways of getting its evicted interior back when its backward runs: all of it at once
//    when the backward begins, or each tensor just before the first backward op reading it,
//    holding what later ops read of what was replayed on the way or not (less memory, more time).
// The programme then decides, for every budget level at once, where the chain is cut and re-run:
//   first pass   each stage keeps an option (with its output), or starts a dropped segment that
//                keeps only holds until the segment's last stage, which keeps its output;
//   backward     a dropped segment [s, t] is re-run from its input when backward reaches t:
//                stage s restores an option and [s+1, t] follows, or s..i-1 are re-run to
//                restore the input of i only, [i, t] is solved, then [s, i-1] (Rotor's recursion).
// Memory comes from the profiled iteration's levels (remat/simulate/liveness.h): what no decision
// over the tracked tensors changes, plus the tracked tensors a plan holds. Every plan the programme
// yields is then simulated exactly; the dp policy (planner.h) keeps the fastest one that fits.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "regen/remat/execute/schedule.h"
#include "regen/remat/simulate/liveness.h"

namespace regen {

// How a stage's backward gets back the interior it does not hold.
struct StageBackward {
  double ms = 0;     // forward time replayed
  int64_t peak = 0;  // absolute level while the stage's backward (and its regeneration) runs,
                     // with the stage's own tensors and nothing else of the chain
  std::vector<Regeneration> regenerations;
};
// At once: everything when the stage's backward begins. Just in time: each tensor before the
// first backward op reading it; of what a program replays on the way and a later op reads, it
// holds everything (kJustInTime), nothing (kJustInTimeDrop: replayed again when needed), or what
// is cheap to hold for what replaying it again would cost (the kJustInTimeSome variants, from
// fewer bytes per ms to more).
enum BackwardMode : int {
  kAtOnce = 0,
  kJustInTime = 1,
  kJustInTimeDrop = 2,
  kJustInTimeSome = 3,
  kBackwardModes = 6
};

struct ChainOption {
  std::vector<int32_t> keep;  // interior held (sorted)
  int64_t keep_bytes = 0;
  double keep_ms = 0;  // restoring `keep` and the output from the stage's input
  std::array<StageBackward, kBackwardModes> back;
};

struct ChainHold {
  std::vector<int32_t> keep;  // sorted
  int64_t keep_bytes = 0;
  double out_ms = 0;  // re-running the stage up to its output, `keep` and the input resident
  std::array<StageBackward, kBackwardModes>
      base;  // the stage's backward with `keep` and the output held
  // Restoring option o and the output in one program, `keep` resident: time, bytes beyond
  // `keep`, and the stage's backward afterwards.
  std::vector<double> option_ms;
  std::vector<int64_t> option_extra, option_replay;  // option_replay: that program's own peak
  std::vector<std::array<StageBackward, kBackwardModes>> option_back;
  // First pass, absolute, `keep` held: keeping the output too, or not (the input held only until
  // its last forward use when `transient_in`).
  int64_t pass_out = 0, pass_out_transient_in = 0, pass_none = 0, pass_none_transient_in = 0;
  // A re-run's own peak (above the level it starts from: the nodes it replays, the values it
  // holds between them and what it restores), restoring the output or not.
  int64_t replay_out = 0, replay_out_transient_in = 0, replay_none = 0,
          replay_none_transient_in = 0;
};

struct ChainStage {
  int32_t first_node = -1, last_node = -1;
  std::vector<int32_t> in, out, interior;  // tracked saved tensors (sorted)
  int64_t in_bytes = 0, out_bytes = 0, interior_bytes = 0;
  // The backward node before which this stage's regenerations run: the first node of the stage
  // that backward runs, or of an earlier stage when it has none (-1: no backward at all).
  int32_t program_node = -1;
  std::vector<ChainOption> options;  // ascending keep_bytes; the last holds the whole interior
  std::vector<ChainHold> holds;      // holds[0] keeps only what every option keeps
  // First pass with option o and the output held (absolute).
  std::vector<int64_t> pass_keep;
  int64_t program_rest = 0;  // the level a program at program_node starts from (untracked)
};

struct ChainModel {
  std::vector<ChainStage> stages;
  std::vector<char> tracked;    // per saved tensor
  std::vector<int32_t> pinned;  // recomputable, but resident: read across stage boundaries
  int merged = 0;               // boundaries merged because an unsaved value crosses them
  int cuts = 0;                 // boundaries inside blocks (one saved tensor crosses them)
  int64_t no_remat_peak = 0;    // the profiled peak: the programme's budget levels reach it
  std::string note;             // what the model left out, for the plan's note
};

// What offloading changes in the profiled levels the chain model is built on (dp with offload,
// offload.h level_change): tensors that are offloaded are not tracked (no decision of the
// programme touches them; a replay finds them there, copied back first), and the allocated level
// at each event position moves by `delta` (negative while an offloaded tensor or the optimizer
// state is off the device).
struct LevelChange {
  std::vector<char> offloaded;  // per saved tensor
  std::vector<int64_t> delta;   // per event position (events + 1), or empty
};

ChainModel build_chain_model(const Profile& p, const LevelChange* change = nullptr);

// One plan the programme yields, with its model cost (recompute ms).
struct ChainPlan {
  std::vector<Decision> decisions;
  std::vector<Regeneration> regenerations;
  double model_ms = 0;
  int64_t model_budget = 0;  // the budget level it was extracted at
};

// Solves the programme once for every budget level (levels evenly spaced up to the highest level
// any stage needs) and returns the distinct plans it yields, from the largest budget down.
std::vector<ChainPlan> chain_plans(const Profile& p, const ChainModel& m, int levels = 2048);

}  // namespace regen
