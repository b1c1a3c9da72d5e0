// A plan's decisions turned into the exact sequence of evictions and regenerations of one
// iteration. The simulator (remat/simulate/simulator.h) and the executor (executor.h) both consume
// this one Schedule, and both run its regeneration programs through one interpreter
// (interpret_program below), so the allocations they make come in the same order: that is what
// makes the predicted peak equal the measured one. docs/remat.md ("Schedule") walks through an
// example.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "regen/remat/profile/profile.h"
#include "regen/remat/profile/transfer.h"

namespace regen {

// A saved tensor's fate between its last forward use and its backward uses: one per saved tensor
// in a plan (Plan::decisions), the planners' choice.
//   retain     it stays on the device
//   recompute  its block is freed after its last forward use and a regeneration program replays
//              its producer before backward reads it (only candidates: ProfileSaved::candidate)
//   offload    it is copied to the host tier after its producer runs, its block is freed once the
//              copy is done, and it is copied back into a new block before backward reads it
//              (only offloadable ones: ProfileSaved::offloadable; its points are an Offload)
// The list is kFateInfo (schedule.cpp): a new fate is an enumerator here, a row there, and its
// handling in build_schedule (which refuses a fate it does not know).
enum class Fate : uint8_t { retain, recompute, offload };
using Decision = Fate;
constexpr int kNumFates = 3;
struct FateInfo {
  Fate fate;
  const char* name;  // in plan.json and decisions.csv: "RETAINED", "RECOMPUTE", "OFFLOAD"
  const char* word;  // in flags, Python and messages: "retain", "recompute", "offload"
};
const FateInfo& fate_info(Fate f);
const char* decision_name(Decision d);  // fate_info(d).name
const char* fate_word(Fate f);          // fate_info(f).word
// Either spelling of a fate; throws regen::Error naming the known fates otherwise.
Fate parse_fate(const std::string& text);
std::vector<std::string> fate_words();  // "retain", "recompute", "offload"

// Where an offloaded saved tensor's copies happen. Its copy to the host tier is issued when its
// producer's forward ends. When forward node `free_after` ends (its last forward use or later) the
// step waits for that copy, then frees the device block. Before backward node `prefetch_before`
// runs, a new device block is allocated and the copy back issued; the step waits for it before the
// first backward node that reads the tensor (or a regeneration program that does) runs, restores
// it into the saved tensor and frees the host copy. Planners choose the points from the transfer
// model (offload_points, remat/plan/offload.h) so that copies end before they are waited for.
struct Offload {
  int32_t saved = -1;
  int32_t free_after = -1;       // a forward node
  int32_t prefetch_before = -1;  // a node that backward runs
};

// Where the optimizer state (momentum, Adam's moments) lives between steps. host: on the host
// tier; each parameter's update copies its state into device blocks, updates there and copies it
// back, one parameter ahead and one behind on the copy queues.
enum class StatePlace : uint8_t { device, host };
const char* state_place_name(StatePlace p);  // "device", "host"
StatePlace parse_state_place(const std::string& text);

// One node replayed during a regeneration.
struct ReplayStep {
  enum class Fate : uint8_t { drop, keep, restore };
  struct Output {
    Fate fate = Fate::drop;
    int32_t saved = -1;  // restore: the saved tensor that adopts this output's bytes
  };
  int32_t node = -1;
  std::vector<int64_t> inputs;         // value ids in the node's input order (-1: absent)
  std::vector<Output> outputs;         // one per output slot
  std::vector<int64_t> release_after;  // kept values dropped after this step (ascending)
};

// Run just before a backward node: regenerates every saved tensor it reads that is evicted.
struct RegenProgram {
  int32_t backward_node = -1;
  std::vector<int32_t> targets;  // saved indices the node needs
  std::vector<ReplayStep> steps;
  double time_ms = 0;  // sum of the replayed nodes' forward medians
};

// An explicit regeneration chosen by a planner: just before backward node `node` runs, the saved
// tensors in `saved` (all evicted at that point) are regenerated and restored; like any restored
// tensor they then stay resident until their last backward use. Planners that decide where the
// chain of blocks is re-run (checkpoints restored early, a block's inside restored at once) say
// it this way; without them, each evicted tensor is regenerated just before the first backward
// node that reads it.
struct Regeneration {
  int32_t node = -1;           // a node that backward runs (forward index)
  std::vector<int32_t> saved;  // saved indices
};

// An offloaded tensor's copies as the schedule runs them (its Offload, with any wait a program
// pulled earlier) and their times by the transfer model.
struct OffloadOp {
  int32_t saved = -1;
  uint64_t bytes = 0;
  int32_t issue_after = -1;      // forward node (its producer): the copy out is issued at its end
  int32_t free_after = -1;       // forward node: wait for the copy, free the device block
  int32_t prefetch_before = -1;  // backward node: allocate a device block, issue the copy back
  int32_t wait_before = -1;      // backward node: wait for it, restore, free the host copy
  double to_host_ms = 0, to_device_ms = 0;
};

// One parameter's optimizer state streamed through the device when it lives on the host tier:
// its state blocks in the order they were allocated (the start state's optimizer_state blocks).
struct StateGroup {
  std::string param;             // the parameter's name
  std::vector<uint64_t> block;   // the blocks' allocation ids in the profile's start state
  std::vector<std::string> tag;  // "<param>.<key>", per block
  std::vector<int64_t> requested;
  double update_ms = 0;  // its share of the profiled optimizer step (by bytes)
  std::vector<double> to_device_ms, to_host_ms;  // per block, by the transfer model
};

struct Schedule {
  std::vector<std::vector<int32_t>> evict_after;  // per forward node: saved indices to evict
  std::vector<RegenProgram> programs;             // in backward order
  std::vector<int32_t> program_of_node;           // node index -> program index, or -1
  std::vector<int32_t> restores;                  // per saved tensor: times it was regenerated
  int64_t replays = 0;
  double recompute_ms = 0;
  // Offload: the copies, and per node the indices into `offloads` of those issued, freed,
  // prefetched and waited for there, in the order the executor handles them (ops issued at one
  // point in the order of their waits; at a forward node's end, the copies out are issued after
  // its evictions and before its frees; before a backward node, prefetches are issued, then waited
  // for, then the widenings below are made, then its program runs).
  std::vector<OffloadOp> offloads;
  std::vector<std::vector<int32_t>> offload_issue_after, offload_free_after;  // per forward node
  std::vector<std::vector<int32_t>> prefetch_issue_before, prefetch_wait_before;  // per node
  // Optimizer state on the host tier: the groups streamed through the device, in update order.
  StatePlace optimizer_state = StatePlace::device;
  std::vector<StateGroup> state_groups;
  // Compression (remat/plan/compress.h; the profile's mode): the retained saved tensors held narrow
  // (an offloaded tensor is copied in full; a recomputed one is not held at all). At the end of
  // forward node n, after its evictions and its offloads' copies and frees, each of narrow_after[n]
  // is narrowed (its narrow form allocated, converted, its f32 block freed); before backward node
  // j's program, after its copies back, each of widen_before[j] is widened (its f32 block
  // allocated, converted, restored, the narrow form freed): where backward or a regeneration
  // program first reads it. Empty without compression.
  Compression compress = Compression::none;
  std::vector<std::vector<int32_t>> narrow_after;  // per forward node
  std::vector<std::vector<int32_t>> widen_before;  // per node (forward index) that backward runs
  int64_t narrowed = 0;
  double compress_ms = 0;  // the time model's narrowings and widenings (Profile::compress_cost)
  int64_t offloaded_bytes() const;
};

// What a plan says beyond its decisions that its schedule follows: the offloads' points (an
// offloaded tensor without an entry gets offload_points' default), where the optimizer state
// lives, and the transfer model that times the copies (needed only when something is copied).
struct OffloadSpec {
  std::vector<Offload> offloads;
  StatePlace optimizer_state = StatePlace::device;
  TransferModel transfer;
};

// The same schedule with every saved tensor held in full: what the step does without compression
// (the profiled step; budgets' no-remat peak).
Schedule without_compression(Schedule s);

// Builds the schedule of `decisions` (one per saved tensor; only candidates may be recompute).
// keep_chain: a saved tensor regenerated on the way to another is kept when backward still
// needs it (what torch.utils.checkpoint does for a block), instead of being recomputed again.
// regenerations: explicit ones (above); each names a backward node and saved tensors that are
// evicted when that node is reached (throws regen::Error naming the first that is not).
// A program replays its nodes in forward order, as the forward pass ran them.
// Offloaded tensors (fate offload) get their points from `offload` (offload_points' default for
// those it does not list); without it, from offload_points on the profile's transfer model. A
// point out of range, a fate a tensor cannot have or an Offload for a tensor that is not
// offloaded throws regen::Error naming them.
Schedule build_schedule(const Profile& p, const std::vector<Decision>& decisions,
                        bool keep_chain = true,
                        const std::vector<Regeneration>& regenerations = {});
Schedule build_schedule(const Profile& p, const std::vector<Decision>& decisions, bool keep_chain,
                        const std::vector<Regeneration>& regenerations, const OffloadSpec& offload);

// Where a saved tensor's bytes are while a step runs, as the engine sees them (a tensor not saved
// yet counts as released: nothing can read it back through the tape). offloaded: on the host tier,
// copied back on time (a program may read it: it is waited for first).
enum class Residency : uint8_t { resident, evicted, released, offloaded };

// Fills `prog.steps` (and its time) for `prog.targets`, saved tensors that are all evicted in
// `state`: the producers to replay in forward order, from leaves and resident saved tensors,
// recursively, with each output's fate. The targets are restored; with keep_chain so is every
// other evicted saved tensor a replay recomputes on the way. `state` is updated (what the program
// restores becomes resident) and `restores`, when given, counts each restore. build_schedule
// makes every program with it, and so does the DTR runtime (dtr.h) at run time.
void fill_regeneration_program(const Profile& p, std::vector<Residency>& state, bool keep_chain,
                               RegenProgram& prog, std::vector<int32_t>* restores = nullptr);

// One regeneration program, interpreted: the only place that decides in which order a program's
// outputs are restored, kept or dropped and its kept values released, for the executor (tensors)
// and the simulator (blocks) alike, so their allocations and frees come in one order.
//   Handle    what holds a value's memory while the program uses it (a Tensor; the simulator's
//             reference-counted block), default-constructible: destroying or overwriting one is
//             how a value is let go
//   replay    (const ReplayStep&, lookup) -> std::vector<Handle>, one per output slot; lookup(v)
//             is the program's own kept handle of value v, or null when v is not one (a leaf or a
//             resident saved tensor)
//   restore   (int32_t saved, Handle&& out) -> Handle: hands an output to saved tensor `saved`
//             and returns what the program may still read it through
//   after_step (size_t i) -> void, optional: step i is done (the DTR engine's bookkeeping)
// Outputs are handled in slot order: restored, kept, or let go at once; then the step's
// release_after values go. Returns the handles still kept when the program ends.
template <class Handle, class Replay, class Restore, class AfterStep>
std::map<int64_t, Handle> interpret_program(const Profile& p, const RegenProgram& prog,
                                            Replay&& replay, Restore&& restore,
                                            AfterStep&& after_step) {
  std::map<int64_t, Handle> kept;
  auto lookup = [&](int64_t v) -> const Handle* {
    auto it = kept.find(v);
    return it == kept.end() ? nullptr : &it->second;
  };
  for (const ReplayStep& st : prog.steps) {
    const ProfileNode& n = p.nodes[static_cast<size_t>(st.node)];
    std::vector<Handle> outputs = replay(st, lookup);
    for (size_t k = 0; k < outputs.size(); ++k) {
      const ReplayStep::Output& out = st.outputs[k];
      if (out.fate == ReplayStep::Fate::restore) {
        kept[n.outputs[k]] = restore(out.saved, std::move(outputs[k]));
      } else if (out.fate == ReplayStep::Fate::keep) {
        kept[n.outputs[k]] = std::move(outputs[k]);
      }
      outputs[k] = Handle();  // a dropped output goes here, in slot order
    }
    for (int64_t v : st.release_after) {
      REGEN_ASSERT(kept.count(v) == 1);
      kept.erase(v);
    }
    after_step(static_cast<size_t>(&st - prog.steps.data()));
  }
  return kept;
}

template <class Handle, class Replay, class Restore>
std::map<int64_t, Handle> interpret_program(const Profile& p, const RegenProgram& prog,
                                            Replay&& replay, Restore&& restore) {
  return interpret_program<Handle>(p, prog, std::forward<Replay>(replay),
                                   std::forward<Restore>(restore), [](size_t) {});
}

// The forward nodes (in forward order) one regeneration of `targets` replays when exactly the
// saved tensors marked in `evicted` are not resident: what build_schedule's program would run.
std::vector<int32_t> regeneration_nodes(const Profile& p, const std::vector<char>& evicted,
                                        const std::vector<int32_t>& targets);

}  // namespace regen
