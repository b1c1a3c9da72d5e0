// Choosing where an offloaded tensor's copies happen (the Offload points of
// remat/execute/schedule.h), from the transfer model and the profiled step's timeline.
// docs/remat.md ("Offload"); tests: tests/test_offload.cpp.
#pragma once

#include <string>
#include <vector>

#include "regen/remat/execute/schedule.h"
#include "regen/remat/plan/chain.h"

namespace regen {

// The points of every offloaded tensor of `decisions` (with the plan's chain mode and explicit
// regenerations), in saved order. On the profiled timeline (forward ends and backward begins at
// their profiled times, each regeneration program adding its replayed ops' forward medians):
//  - the copies out run on one queue in the order their producers end; a tensor's device block is
//    freed at the end of the first forward node, at or after its last forward use, that ends after
//    its copy does (the last forward node when none does: the step waits there);
//  - the copies back run on the other queue as late as they can while ending before the step
//    needs each (its first backward reader, or a program that reads it), one at a time: each is
//    issued before the latest backward node that begins before its copy must start (the first
//    backward node when none does: the step waits). A copy back issued later holds its device
//    block for less time.
std::vector<Offload> offload_points(const Profile& p, const std::vector<Decision>& decisions,
                                    bool keep_chain, const std::vector<Regeneration>& regenerations,
                                    const TransferModel& transfer);

// The profiled compute timeline the points are chosen on: per node, the time its forward ends and
// the time the executor reaches it in backward (its backward begin plus every regeneration program
// run before it, this one's included) in ms from the step's start; -1 where there is none.
struct StepTimeline {
  std::vector<double> fwd_end, bwd_reach;
};
StepTimeline step_timeline(const Profile& p, const Schedule& s);

// What offloading `saved` (at the points offload_points gives them when nothing is recomputed) and,
// with `state` host, the optimizer state changes in the profiled levels the chain model is built on
// (chain.h LevelChange): each offloaded tensor's block is off the device from its free to its copy
// back; the optimizer state is off it for the whole step, except for the blocks the update streams
// through it (three parameters' worth at most).
LevelChange level_change(const Profile& p, const std::vector<int32_t>& saved, StatePlace state,
                         const TransferModel& transfer);

// A set of tensors dp offloads, and what that changes in the levels its programme plans on.
struct OffloadFamily {
  std::string name;            // for the plan's note: "gap 0.5", "cost 1", "optimizer state", ...
  std::vector<int32_t> saved;  // offloaded (ascending)
  StatePlace optimizer_state = StatePlace::device;
  LevelChange change;
};
// The families dp plans around (docs/remat.md, "dp with offload"). With `activations`: the
// offloadable tensors whose time off the device (from their last forward use to the first
// backward op that needs them, on the profiled timeline) is longer than their two copies, taken in
// two orders, the longest time off first and the most expensive to recompute per byte first (those
// no plan can recompute before all), each up to what the copy queue out carries in 1/4, 1/2, 1 and
// 2 forward passes, and all of them. With `optimizer`: each of those (and none) with the optimizer
// state on the host tier as well. Identical sets are listed once.
std::vector<OffloadFamily> offload_families(const Profile& p, bool activations, bool optimizer,
                                            const TransferModel& transfer);

// Offload sets derived from a plan that recomputes (one of dp's, from a family that offloads no
// activation): the offloadable tensors it retains, longest off the device first under that plan's
// own schedule (a checkpoint that a regeneration reads is needed when that program runs, not at
// its own backward), each up to what the copy queue out carries in 1/4, 1/2, 1 and 2 forward
// passes, and all of them off for longer than their two copies; each set holds the one before it
// (a larger budget adds to what the smaller one chose). These are the sets the families
// above miss at low budgets: they are ranked on the step without recomputation, where a
// checkpoint dp holds through most of backward looks like any other tensor. (name, ascending set)
// pairs; identical sets once; none when nothing qualifies.
std::vector<std::pair<std::string, std::vector<int32_t>>> plan_offload_sets(
    const Profile& p, const std::vector<Decision>& decisions,
    const std::vector<Regeneration>& regenerations, const TransferModel& transfer);

}  // namespace regen
