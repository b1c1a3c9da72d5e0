// The planned layout of a training step (docs/memory.md, "The planned layout"). A plan fixes the
// step's exact sequence of requests and frees, so where every block goes can be decided before
// the step runs, as XLA's heap simulator and TFLite's arena planner do for inference: each request
// gets an offset in one arena that no block alive at the same time overlaps. The allocator then
// serves the step from that layout (CachingAllocator::set_planned_layout): the blocks go into the
// free space the persistent segments leave (their holes) and one arena, so reserved bytes are the
// persistent segments plus the arena, which comes within a few percent of the step's peak of live
// bytes, and nothing is mapped or unmapped during the step. Tests: tests/test_layout.cpp.
#pragma once

#include <memory>
#include <vector>

#include "regen/remat/simulate/simulator.h"

namespace regen {

// Where requests with lifetimes (SimOptions::Request: begin, end; end -1 lives to the end) go,
// by offline greedy placement: in some order, each request takes the first place that overlaps
// no block placed before it whose lifetime overlaps its own: the lowest such offset of the
// smallest hole (a free block of the persistent segments, `holes` their sizes) that has one,
// else of the arena, which grows to hold it. Four orders are tried (the largest first, the
// longest-lived first, the most bytes x time first, the order of requests) and the smallest
// arena kept (the first on a tie).
PlannedLayout place_requests(const std::vector<SimOptions::Request>& requests,
                             const std::vector<uint64_t>& holes = {});

// The holes a layout installed on an allocator in `state` finds (CachingAllocator::
// set_planned_layout): the free blocks of its segments, except the segments that are one free
// block (released first).
std::vector<uint64_t> layout_holes(const AllocatorState& state);

// The most bytes the requests hold at once: no layout can be smaller.
int64_t live_peak(const std::vector<SimOptions::Request>& requests);

// The layout of schedule `s` on the simulator's profile: its requests recorded by an exact
// simulation (without a limit), then placed. `peak` (optional) receives live_peak of them.
std::shared_ptr<const PlannedLayout> plan_layout(const Simulator& sim, const Schedule& s,
                                                 int64_t* peak = nullptr);

}  // namespace regen
