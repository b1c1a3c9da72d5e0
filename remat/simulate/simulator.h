// The exact memory simulator. It replays one profiled iteration's allocation and free sequence
// through a CachingAllocator on the Null arena, starting from the allocator layout the
// iteration started from, with a Schedule's evictions and regenerations inserted where the
// executor performs them. Same requests, same allocator algorithm: the predicted peaks equal the
// measured ones to the byte (tests/test_remat.cpp checks it for every planner).
// remat/simulate/ sits between stages 2 and 3: this simulator and the memory levels the
// planners' models read (docs/architecture.md, "remat").
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "regen/remat/execute/schedule.h"

namespace regen {

struct DtrOptions;  // remat/plan/planner.h
struct DtrStats;

struct LiveBlockRec {
  std::string tag;
  Category category;
  int64_t bytes;
};

struct TimelinePoint {
  double time_ms;  // profiled time of the marker (recomputation not included)
  std::string label;
  std::array<int64_t, kNumCategories> allocated_by{};
  int64_t reserved = 0;
};

struct SimResult {
  int64_t peak_allocated = 0, peak_reserved = 0, peak_requested = 0;
  std::array<int64_t, kNumCategories> allocated_by_at_peak{};
  std::array<int64_t, kNumCategories> peak_by{};  // each category's own peak
  std::vector<LiveBlockRec> live_at_peak;         // largest first (with top_live)
  std::string peak_at;  // with top_live: the last marker before the peak ("fwd_begin <op>", ...)
  double time_ms = 0;   // profiled iteration time + recomputation
  double recompute_ms = 0;
  int64_t replays = 0;
  int64_t evictions = 0;   // saved tensors evicted (a schedule's, or those DTR chose)
  int64_t narrowed = 0;    // saved tensors held narrow (compression; remat/execute/schedule.h)
  double compress_ms = 0;  // their narrowings and widenings, by the profile's time model
  std::vector<TimelinePoint> timeline;
  // With a limit: whether the step runs out of memory under it, the allocator's message and the
  // last marker before it ("bwd_begin <op>", ...); the peaks are then those reached before.
  bool oom = false;
  std::string oom_message, oom_at;
  int64_t cache_flushes = 0;  // times the allocator emptied its cache to stay under the limit
  int64_t limit = 0;          // the hard limit it was simulated under (SimOptions::limit; 0: none)
  // With a limit: the lowest limit above it under which the step could run otherwise (the lowest
  // reserved total it refused, CachingAllocator::lowest_refused); 0 when it refused nothing, and
  // then every higher limit runs the step exactly as this one did.
  int64_t next_limit = 0;
  // Offload (the schedule's offloaded tensors and optimizer state on the host tier): the host
  // tier's peaks over the step, as the device's (its allocator starts from the optimizer state
  // alone); how long the step waits for copies that are late (part of time_ms), and how long each
  // copy queue is busy; the tensors offloaded and the bytes copied each way.
  int64_t host_peak_allocated = 0, host_peak_reserved = 0, host_peak_requested = 0;
  std::array<int64_t, kNumCategories> host_peak_by{};
  double stall_ms = 0;
  double to_host_busy_ms = 0, to_device_busy_ms = 0;
  int64_t offloads = 0;
  int64_t bytes_to_host = 0, bytes_to_device = 0;
};

struct SimOptions {
  bool timeline = false;  // a point per marker
  int top_live = 0;       // list this many largest live blocks at the peak (second pass)
  // The allocator's hard limit on reserved bytes during the step (0: none), as training with
  // that budget sets it: at the limit the allocator maps the smallest segment that fits, then
  // empties its cache, then runs out of memory (docs/memory.md), and the simulation follows it.
  int64_t limit = 0;
  // A planned layout installed before the step, as training with it installs it
  // (remat/plan/layout.h).
  std::shared_ptr<const PlannedLayout> layout;
  // When given: the free blocks of the device's segments at the step's start, after the optimizer
  // state moved to the host tier when the schedule keeps it there: the holes a planned layout is
  // placed in (remat/plan/layout.h plan_layout).
  std::vector<uint64_t>* start_holes = nullptr;
  // When given: every request of the step in order, its rounded size and when it was made and
  // freed (positions in the sequence of requests and frees; end = -1: alive at the step's end).
  struct Request {
    uint64_t rounded = 0;
    int64_t begin = 0, end = -1;
  };
  std::vector<Request>* requests = nullptr;
  // DTR (remat/execute/dtr.h) decides evictions and regenerations while the step runs: its engine
  // is driven at the markers, with the allocator's eviction handler pointing at it (simulate_dtr
  // sets these; the schedule is then all-retain). dtr_stats receives what it did.
  const DtrOptions* dtr = nullptr;
  DtrStats* dtr_stats = nullptr;
};

// Per-profile index (windows of each node's forward, tag ids); build once, simulate many times.
class Simulator {
 public:
  explicit Simulator(const Profile& p);
  SimResult run(const Schedule& s, const SimOptions& opt = {}) const;
  const Profile& profile() const { return p_; }

 private:
  class Run;  // one replay of the step (simulator.cpp)
  struct WindowEvent {
    bool alloc;
    uint64_t block_id;
    int64_t requested;
    Category category;
    uint32_t tag;
  };
  const Profile& p_;
  std::vector<uint32_t> tags_;                     // per event
  std::vector<std::vector<WindowEvent>> windows_;  // per node: its forward allocations/frees
  std::vector<std::vector<size_t>> markers_at_;    // per event position: marker indices
};

// The allocator layouts a step under `s` starts from, which RematPipeline checks at every step's
// start: the device's (the profile's start state, less the optimizer state when the schedule keeps
// it on the host tier, after the step's canonical start empties the cache) and the host tier's
// (that state, allocated in order into an empty host tier; empty otherwise).
struct StartLayouts {
  LiveLayout device, host;
};
StartLayouts start_layouts(const Profile& p, const Schedule& s);

// A profile.json's text or file: parse_profile_json (remat/profile/profile.h), then its event log
// replayed: the peaks must be the ones the file records as measured, or it was edited or damaged.
// Throws regen::Error naming `origin` (the file) and the problem.
Profile profile_from_json(const std::string& text, const std::string& origin);
// Reads a profile file. A file named profile.json is one of `regen profile`'s set (profile.json,
// profile.txt, trace.json): the others carry its content's id (profile_set_files) and are renamed
// before it, so a writer killed between the renames leaves siblings with another id, and the
// profile is refused naming them (profile again). A sibling without an id (written before sets
// had them, or by hand) is not compared.
Profile load_profile(const std::string& path);
// The set `regen profile` writes for a profile.json of text `json` in `dir`, in the order they are
// renamed (profile.json last): the table `txt` and the trace `trace` marked with json's id.
std::vector<std::pair<std::string, std::string>> profile_set_files(const std::string& dir,
                                                                   const std::string& json,
                                                                   const std::string& txt,
                                                                   const std::string& trace);

}  // namespace regen
