// Choosing where an offloaded tensor's copies happen (the Offload points of schedule.h), from the
// transfer model and the profiled step's timeline. docs/remat.md ("Offload"); tests:
// tests/test_offload.cpp.
#pragma once

#include <vector>

#include "regen/remat/schedule.h"

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

}  // namespace regen
