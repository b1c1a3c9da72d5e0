// Stage 1 data: one profiled training iteration (forward, backward, optimizer step).
// The Profile holds the tape's graph (nodes, values, saved tensors), the allocator's exact event
// sequence for the iteration with node markers, the allocator layout the iteration started from,
// and timings (medians over several instrumented iterations). The simulator replays it; the
// planners read it; profile.json stores it. docs/remat.md describes every field.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "regen/autograd/tape.h"
#include "regen/core/allocator.h"
#include "regen/kernels/half.h"
#include "regen/remat/profile/transfer.h"

namespace regen {

struct ProfileNode {
  int32_t index = -1;
  std::string op;  // op name (op_name(kind))
  OpKind kind = kNoOpKind;
  std::string name;    // allocation tag: "<module path>/<op>#<index>"
  std::string scope;   // module path
  int32_t block = -1;  // enclosing block index, -1 if none
  bool is_view = false;
  int num_visible_outputs = 0;
  std::vector<int64_t> inputs, outputs, saved;  // value ids
  double fwd_ms = 0, bwd_ms = 0;                // medians (bwd_ms = 0 when it has no backward)
  int64_t fwd_alloc_bytes = 0, fwd_free_bytes = 0, bwd_alloc_bytes = 0, bwd_free_bytes = 0;
  int32_t bwd_rank = -1;  // position in the backward order, -1 if backward does not run it
  // It saves the packed form its op offers (autograd/tape.h PackedSaves): a relu's 1-bit mask, a
  // max_pool2d's window positions. "packed" in profile.json, written only when true.
  bool packed = false;
};

struct ProfileValue {
  int64_t id = -1;
  int32_t producer = -1, slot = 0;
  int64_t root = -1;
  Shape shape;
  DType dtype = DType::f32;
  uint64_t bytes = 0;
  bool leaf = false;
  bool available = true;  // leaves: still readable when backward ran (a replay may read it)
  uint64_t alloc_id = 0;  // the allocation of its root storage in the profiled iteration (0: leaf
                          // or storage allocated before the iteration)
  std::vector<int32_t> consumers;
  int32_t saved = -1;
};

struct ProfileSaved {
  int32_t index = -1;
  int64_t value = -1;  // root value
  int32_t producer = -1;
  uint64_t bytes = 0;  // storage bytes
  Category category = Category::other;
  std::vector<int32_t> readers;                   // nodes whose backward reads it (forward order)
  int32_t last_fwd_use = -1;                      // last forward node reading it (or its producer)
  int32_t first_bw_rank = -1, last_bw_rank = -1;  // positions in the backward order (-1: unused)
  double recompute_ms = 0;                        // replaying its producers from retained tensors
  bool candidate = false;    // may be evicted and recomputed (also: every leaf its
                             // regeneration could reach is available)
  bool offloadable = false;  // may be offloaded: an activation allocated in the iteration, read
                             // by backward, last used before the final forward op
  std::string name;          // "<producer tag>:<slot>"
};

enum class MarkerKind : uint8_t {
  iteration_begin,  // after the canonical start (cache emptied, peaks reset), before the batch
  fwd_begin,
  fwd_end,
  backward_start,
  bwd_begin,
  bwd_end,
  backward_finish,
  optimizer_begin,
  optimizer_end,
  iteration_end,
  // With gradient accumulation: the end of the profiled micro-batch (the last; its batch gone).
  // The events before it are one micro-batch's, which the step repeats Profile::accumulate times
  // (Profile::accumulate); the events after it are the optimizer's.
  micro_batch_end,
};
const char* marker_name(MarkerKind k);

struct Marker {
  MarkerKind kind;
  int32_t node = -1;
  uint64_t position = 0;  // number of allocator events recorded before it
  double time_ms = 0;     // since iteration_begin (first instrumented iteration)
};

struct ProfileEvent {
  MemoryEventKind kind;
  uint64_t block_id = 0;
  int64_t bytes = 0;      // block size (alloc/free) or segment size
  int64_t requested = 0;  // alloc: requested bytes
  Category category = Category::other;
  std::string tag;
  double time_ms = 0;
};

// The time model of narrowing and widening saved activations (--compress): milliseconds as
// fixed + per_mib * MiB of f32, per direction, measured on the profiled device
// (remat/plan/compress.h measure_compress_cost).
struct CompressCost {
  double narrow_fixed_ms = 0, narrow_ms_per_mib = 0;
  double widen_fixed_ms = 0, widen_ms_per_mib = 0;
  double narrow_ms(uint64_t bytes) const {
    return narrow_fixed_ms + narrow_ms_per_mib * static_cast<double>(bytes) / (1 << 20);
  }
  double widen_ms(uint64_t bytes) const {
    return widen_fixed_ms + widen_ms_per_mib * static_cast<double>(bytes) / (1 << 20);
  }
};

// How a profile's op times were taken (ProfileOptions::op_timing). sync: the device is waited
// for at every marker and the host clock read, so an op's time is its own with nothing queued
// before it; on an asynchronous device (CUDA) that adds a launch and a drain to every op, and the
// profiled step runs slower than training's. device: the markers are points on the device's own
// clock (kernels::DeviceTimeline: events on the compute stream) and nothing waits, so the step
// runs as in training and an op's time is the device's time between its points, or its wait for
// the host. On the CPU both read the host clock (sync waits for nothing there).
enum class OpTiming { sync, device };
const char* op_timing_name(OpTiming t);
// Throws regen::Error naming `origin` and the two names for anything else.
OpTiming parse_op_timing(const std::string& text, const std::string& origin);

struct Profile {
  // What was profiled.
  std::string model;
  int64_t batch = 0;
  std::string device;
  int threads = 1;
  std::string date;
  int iterations = 0;  // instrumented iterations the timings are medians of
  // Micro-batches per step (Trainer::set_accumulation). Above 1, the graph, events and markers up
  // to the micro_batch_end marker are one micro-batch's, and the simulator replays them
  // `accumulate` times before the rest. They are the last micro-batch's: under data parallelism
  // it alone runs backward under the sync's hooks, and its requests of category communication
  // (the collectives' scratch) are the sync's, which the simulator leaves out of the micro-batches
  // before it; the profiler checks that every micro-batch made the first one's requests besides
  // those. (Profiles written before kept the first micro-batch, which has none: the same replay.)
  int64_t accumulate = 1;
  // The flags besides model, batch and device that shape the step, with the values it ran with
  // ("--optimizer": "adamw", ...); a run planned from the profile must match them. Empty in
  // profiles made before they were recorded.
  std::map<std::string, std::string> run;
  // How the run holds retained activations between forward and backward (--compress; the
  // trainer's setting): every plan's schedule narrows the compressible ones it retains
  // (remat/execute/schedule.h). The event log is of the step without it. compress_cost: its time
  // model.
  Compression compress = Compression::none;
  CompressCost compress_cost;
  OpTiming op_timing = OpTiming::sync;  // "op_timing" in profile.json when device
  // The graph.
  std::vector<ProfileNode> nodes;
  std::vector<ProfileValue> values;
  std::vector<ProfileSaved> saved;
  std::vector<int32_t> backward_order;
  std::vector<std::string> blocks;  // block names, by index
  // Memory: the layout the iteration started from and its exact event sequence.
  AllocatorState start_state;
  std::vector<ProfileEvent> events;
  std::vector<Marker> markers;
  // Measured on the profiled iterations (medians for times).
  int64_t peak_allocated = 0, peak_reserved = 0;
  std::array<int64_t, kNumCategories> allocated_by_at_peak{};
  std::array<int64_t, kNumCategories> persistent_by{};  // allocated at iteration start
  double iteration_ms = 0, forward_ms = 0, backward_ms = 0, optimizer_ms = 0;
  // How long copies to and from the device's host tier take (transfer.h): measured by the
  // profiler (regen bench copy's measurement, short), absent (not valid) in profiles from before.
  TransferModel transfer;

  int32_t num_forward_nodes() const { return static_cast<int32_t>(nodes.size()); }
  // The index of the micro_batch_end marker, or -1 (accumulate == 1).
  int64_t micro_batch_marker() const;
  const ProfileSaved* saved_of_value(int64_t value) const;
};

// Event positions of each node's forward and backward markers (-1 where a node has none).
struct NodeWindows {
  std::vector<int64_t> fwd_begin, fwd_end, bwd_begin, bwd_end;
};
NodeWindows node_windows(const Profile& p);

// JSON (profile.json). save is atomic. parse_profile_json checks structure and cross-references
// and throws regen::Error naming `origin` and the first problem; load_profile and
// profile_from_json (remat/simulate/simulator.h) also replay its event log against its recorded
// peaks.
void save_profile(const Profile& p, const std::string& path);
std::string profile_to_json(const Profile& p);
Profile parse_profile_json(const std::string& text, const std::string& origin);

// Fills derived fields (saved-tensor lifetimes, candidates, recompute times, node byte counts,
// names) from the graph, markers and events. Called by the profiler and after loading.
void finalize_profile(Profile& p);
// Forward time of regenerating saved tensor `s` when every other saved tensor is resident: its
// producer, and recursively the producers of inputs nothing keeps (the per-activation recompute
// time of the profile, ProfileSaved::recompute_ms; the schedule's regeneration programs replay
// the same nodes).
double standalone_recompute_ms(const Profile& p, int32_t s);
// Saved tensors that could be recomputed but for a leaf freed before backward (a tensor made in
// forward without a gradient and larger than Value::kHeldLeafBytes, which the tape does not hold):
// "" when there are none, else one sentence per such leaf naming it, what it blocks and what to do.
std::string recompute_blockers(const Profile& p);
// Checks cross-references; throws regen::Error(origin + first problem).
void validate_profile(const Profile& p, const std::string& origin);

}  // namespace regen
