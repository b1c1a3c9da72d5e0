// The profiled iteration's memory, split the way the planners reason about it. Allocated bytes at
// every point of the event log, and the bytes of a chosen set of saved tensors ("tracked": the
// ones a planner may evict) alive at that point in the profiled run, where nothing was evicted.
// What is left, allocated minus tracked, is memory no plan over the tracked tensors changes:
// parameters, gradients, optimizer state, the batch, workspaces, activation gradients and every
// saved tensor the planner leaves alone. A plan's memory at a point is that rest plus the tracked
// tensors the plan holds there (plus what a regeneration holds while it runs). The chain DP
// (remat/plan/chain.h) and the MILP (remat/plan/milp.h) both build their cost models on it; the
// exact simulator (simulator.h) then checks their plans.
#pragma once

#include <cstdint>
#include <vector>

#include "regen/remat/profile/profile.h"

namespace regen {

struct Levels {
  // Indexed by event position i = 0..E: the state after the first i events.
  std::vector<int64_t> allocated;
  std::vector<int64_t> tracked;
  // Per saved tensor: the size of its block as the allocator holds it (0 for leaves and storage
  // allocated before the iteration), and the event positions of its allocation and free (-1 when
  // none in the iteration).
  std::vector<int64_t> block_bytes;
  std::vector<int64_t> alloc_at, free_at;
  // Per value: the size of its root storage's block (0 for leaves and storage allocated before
  // the iteration).
  std::vector<int64_t> value_block;

  int64_t rest(int64_t i) const {
    return allocated[static_cast<size_t>(i)] - tracked[static_cast<size_t>(i)];
  }
  // The highest rest over positions [begin, end] (both included; begin <= end).
  int64_t max_rest(int64_t begin, int64_t end) const;
  // The highest allocated level over [begin, end] minus the level at begin: what an op's window
  // allocates above where it started (its outputs and workspace).
  int64_t own_peak(int64_t begin, int64_t end) const;
};

// tracked[s] != 0 marks the saved tensors to track (size p.saved.size()).
Levels no_remat_levels(const Profile& p, const std::vector<char>& tracked);

}  // namespace regen
