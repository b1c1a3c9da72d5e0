// The simulator (simulator.h).
#include "regen/remat/simulate/simulator.h"

#include <sys/stat.h>

#include "regen/remat/plan/layout.h"

#include <algorithm>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "regen/core/error.h"
#include "regen/core/io.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/plan/compress.h"

namespace regen {

namespace {

// A regeneration program's reference to a simulated block. Blocks its own replays allocated are
// counted (views share them) and freed by the last reference, as a Tensor's storage is; others
// (leaves, resident or restored saved tensors) are only borrowed.
class BlockRef {
 public:
  BlockRef() = default;
  static BlockRef owned(Block* b, std::unordered_map<Block*, int>* refs,
                        std::function<void(Block*)>* free) {
    BlockRef r;
    r.block_ = b;
    r.refs_ = refs;
    r.free_ = free;
    (*refs)[b] = 1;
    return r;
  }
  static BlockRef borrowed(Block* b) {
    BlockRef r;
    r.block_ = b;
    return r;
  }
  BlockRef(const BlockRef& o) : block_(o.block_), refs_(o.refs_), free_(o.free_) {
    if (refs_) ++(*refs_)[block_];
  }
  BlockRef(BlockRef&& o) noexcept : block_(o.block_), refs_(o.refs_), free_(o.free_) {
    o.block_ = nullptr;
    o.refs_ = nullptr;
  }
  BlockRef& operator=(BlockRef o) noexcept {
    std::swap(block_, o.block_);
    std::swap(refs_, o.refs_);
    std::swap(free_, o.free_);
    return *this;
  }
  ~BlockRef() {
    if (!refs_) return;
    auto it = refs_->find(block_);
    if (--it->second == 0) {
      refs_->erase(it);
      (*free_)(block_);
    }
  }
  bool is_owned() const { return refs_ != nullptr; }
  // The only reference to an owned block gives it up without freeing it.
  Block* adopt() {
    REGEN_ASSERT(refs_ && refs_->at(block_) == 1);
    refs_->erase(block_);
    refs_ = nullptr;
    return block_;
  }

 private:
  Block* block_ = nullptr;
  std::unordered_map<Block*, int>* refs_ = nullptr;
  std::function<void(Block*)>* free_ = nullptr;
};

// The host tier: the optimizer state moved there before the step in allocation order (the
// pipeline does the same, RematPipeline), which frees the device blocks in that order; then the
// step's canonical start empties the device's cache. `who` names the caller in errors.
void move_optimizer_state(const Schedule& s, CachingAllocator& dev, CachingAllocator& host,
                          const char* who) {
  for (const StateGroup& grp : s.state_groups) {
    for (size_t k = 0; k < grp.block.size(); ++k) {
      host.allocate(static_cast<uint64_t>(grp.requested[k]), Category::optimizer_state,
                    intern_tag(grp.tag[k]));
      Block* b = dev.block_by_id(grp.block[k]);
      REGEN_CHECK(b, who, ": optimizer state block ", grp.block[k], " is not live");
      dev.free(b);
    }
  }
  dev.empty_cache();
}

// The simulator's side of the DTR engine (remat/execute/dtr.h): simulated blocks for tensors.
class SimRuntime final : public DtrRuntime {
 public:
  using Program = std::function<void(const RegenProgram&, const std::function<void(size_t)>&)>;
  SimRuntime(const CachingAllocator& a, std::function<void(int32_t)> evict, Program program,
             std::function<uint64_t(int32_t)> block)
      : a_(a), evict_(std::move(evict)), program_(std::move(program)), block_(std::move(block)) {}
  void evict(int32_t saved) override { evict_(saved); }
  void run_program(const RegenProgram& prog,
                   const std::function<void(size_t)>& after_step) override {
    program_(prog, after_step);
  }
  uint64_t block_id(int32_t saved) const override { return block_(saved); }
  std::vector<BlockInfo> layout() const override { return a_.snapshot(); }

 private:
  const CachingAllocator& a_;
  std::function<void(int32_t)> evict_;
  Program program_;
  std::function<uint64_t(int32_t)> block_;
};

}  // namespace

Simulator::Simulator(const Profile& p) : p_(p) {
  tags_.reserve(p.events.size());
  std::unordered_map<std::string, uint32_t> cache;
  for (const ProfileEvent& e : p.events) {
    auto it = cache.find(e.tag);
    if (it == cache.end()) it = cache.emplace(e.tag, intern_tag(e.tag)).first;
    tags_.push_back(it->second);
  }
  markers_at_.assign(p.events.size() + 1, {});
  for (size_t m = 0; m < p.markers.size(); ++m) {
    REGEN_CHECK(p.markers[m].position <= p.events.size(), "profile: marker ", m,
                " points past the event log");
    markers_at_[p.markers[m].position].push_back(m);
  }
  // Each node's forward window: allocations made between its fwd_begin and fwd_end markers,
  // and frees of those allocations inside the window (workspace).
  windows_.assign(p.nodes.size(), {});
  const NodeWindows w = node_windows(p);
  for (size_t n = 0; n < p.nodes.size(); ++n) {
    REGEN_CHECK(w.fwd_begin[n] >= 0 && w.fwd_end[n] >= w.fwd_begin[n], "profile: node ", n,
                " has no forward markers");
    std::unordered_set<uint64_t> mine;  // allocated in the window and not freed yet
    for (int64_t i = w.fwd_begin[n]; i < w.fwd_end[n]; ++i) {
      const ProfileEvent& e = p.events[i];
      if (e.kind == MemoryEventKind::alloc) {
        REGEN_CHECK(mine.insert(e.block_id).second, "profile: node ", n, " (", p.nodes[n].name,
                    ") allocates block ", e.block_id, " twice during its forward");
        windows_[n].push_back({true, e.block_id, e.requested, e.category, tags_[i]});
      } else if (e.kind == MemoryEventKind::free) {
        REGEN_CHECK(mine.erase(e.block_id) == 1, "profile: node ", n, " (", p.nodes[n].name,
                    ") frees block ", e.block_id,
                    " it did not allocate during its forward (or "
                    "frees it twice)");
        windows_[n].push_back({false, e.block_id, 0, e.category, 0});
      }
    }
    // A replay makes the node's outputs from its window's allocations: each one of its own,
    // still live when the window ends. An empty output (0 bytes: a slot the op left unused, such
    // as a gradient linear_cross_entropy's forward was not asked for) has no allocation.
    const ProfileNode& node = p.nodes[n];
    for (size_t k = node.is_view ? 1 : 0; k < node.outputs.size(); ++k) {
      const ProfileValue& out = p.values[static_cast<size_t>(node.outputs[k])];
      const uint64_t id = out.alloc_id;
      if (id == 0 && out.bytes == 0) continue;
      REGEN_CHECK(mine.erase(id) == 1, "profile: output ", k, " of node ", n, " (", node.name,
                  ") is not an allocation of its own forward (block ", id, ")");
    }
  }
}

// One replay of the step under a schedule (Simulator::run): the simulated device and host
// allocators, the blocks standing for the profile's allocations, the copy queues' clocks and the
// DTR engine, with a method per concern. Made and used once, never copied (blocks' references and
// the DTR runtime point into it).
class Simulator::Run {
 public:
  Run(const Simulator& owner, const Schedule& s, const SimOptions& opt)
      : sim_owner_(owner),
        p_(owner.p_),
        s_(s),
        opt_(opt),
        sim_(make_null_arena(Device::cpu())),
        host_(make_null_arena(Device::cpu())),
        host_copy_(s.offloads.size(), nullptr),
        copy_end_(s.offloads.size(), 0) {}
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  SimResult result() {
    check_schedule();
    if (!start()) return std::move(res_);
    replay_step();
    finish();
    return std::move(res_);
  }

 private:
  void check_schedule() const;
  bool start();
  void move_state_to_host();
  void index_blocks();
  void start_dtr();
  Block* alloc(uint64_t requested, Category c, uint32_t tag);
  void free(Block* b);
  void after_change();
  Block*& live_block(int32_t saved, const char* when);
  void run_program(const RegenProgram& prog, const std::function<void(size_t)>& after_step = {});
  double issue_copy(double now, double ms, double& queue_free, double& busy);
  double wait_copy(double now, double end);
  uint32_t value_tag(int32_t saved) const;
  void run_state_stream(double t0);
  void on_marker(const Marker& m);
  void dtr_marker(const Marker& m);
  void after_forward(int32_t node, double now);
  void before_backward(int32_t node, double now);
  void record_timeline(const Marker& m);
  void replay_events(size_t from, size_t to, size_t lo, size_t hi);
  void replay_step();
  void finish();
  std::string where(int64_t marker) const;

  const Simulator& sim_owner_;
  const Profile& p_;
  const Schedule& s_;
  const SimOptions& opt_;
  SimResult res_;
  CachingAllocator sim_;   // the device
  CachingAllocator host_;  // the host tier
  int64_t flushes_before_ = 0;
  // Every request and free of the step, for the requests trace (and its times).
  int64_t clock_ = 0;
  std::unordered_map<const Block*, size_t> request_of_;
  std::unordered_map<uint64_t, Block*> live_;  // base allocation id -> simulated block
  std::vector<uint64_t> saved_base_;           // per saved tensor: its base allocation id
  // Compression: each narrowed tensor's narrow block while it is narrow.
  std::vector<Block*> narrow_block_;
  // The running maximum of allocated bytes and the live set there (opt.top_live).
  int64_t best_ = 0;
  std::vector<LiveBlockRec> best_live_;
  int64_t last_marker_ = -1, best_marker_ = -1;
  // A regeneration program's transient blocks: references to each.
  std::unordered_map<Block*, int> refs_;
  std::function<void(Block*)> free_block_ = [this](Block* b) { free(b); };
  // DTR: the engine decides at the markers where the executor's hooks run, and when the
  // allocator asks (its eviction handler).
  std::unique_ptr<SimRuntime> dtr_runtime_;
  std::unique_ptr<DtrEngine> dtr_;
  std::unique_ptr<EvictionScope> dtr_handler_;
  bool repeating_ = false;  // in the second or a later micro-batch of an accumulated step
  // In a micro-batch before the last of an accumulated step: the profile's micro-batch is the
  // last one, whose sync communicates; the earlier ones run without its hooks and make none of
  // its requests (category communication).
  bool no_sync_ = false;
  // Offload: the host copies, and the copy queues' timeline. The compute clock is the profiled
  // marker's time plus what the step has added so far (regeneration programs, waits for copies);
  // each queue runs its copies in issue order, one at a time.
  std::vector<Block*> host_copy_;
  std::vector<double> copy_end_;
  double shift_ = 0, to_host_free_ = 0, to_device_free_ = 0;
};

void Simulator::Run::check_schedule() const {
  REGEN_CHECK(s_.offload_issue_after.size() == p_.nodes.size() &&
                  s_.prefetch_wait_before.size() == p_.nodes.size(),
              "simulator: the schedule was not built for this profile");
  // With gradient accumulation the step replays one micro-batch's events K times (the markers'
  // times are the first micro-batch's); the copy timeline is not replayed that way yet.
  REGEN_CHECK(
      p_.accumulate == 1 || (s_.offloads.empty() && s_.optimizer_state == StatePlace::device),
      "simulator: offloading (saved tensors or optimizer state on the host tier) with "
      "gradient accumulation (",
      p_.accumulate,
      " micro-batches) is not supported yet: "
      "--offload none, or --accumulate 1");
  REGEN_CHECK(!opt_.dtr || (s_.offloads.empty() && s_.optimizer_state == StatePlace::device),
              "simulator: DTR runs without offloads");
  REGEN_CHECK(s_.narrowed == 0 || !opt_.dtr, "simulator: DTR runs without compression");
  REGEN_CHECK(!opt_.dtr || !opt_.layout, "simulator: DTR runs without a planned layout");
}

// The allocators at the step's start: the profile's state, the optimizer state on the host tier
// when the schedule puts it there, the limit and the planned layout. False when the layout does
// not fit under the limit (res_ says so).
bool Simulator::Run::start() {
  sim_.restore_state(p_.start_state);
  if (s_.optimizer_state == StatePlace::host) move_state_to_host();
  if (opt_.start_holes) *opt_.start_holes = layout_holes(sim_.snapshot_state());
  flushes_before_ = sim_.stats().num_cache_flushes;
  // The limit, as the allocator applies it: to segments it maps from here on (the persistent
  // ones may already pass it; a plan then does not fit, remat/plan/planner.h fit_schedule).
  if (opt_.limit > 0) sim_.set_limit(opt_.limit);
  res_.limit = opt_.limit;
  if (opt_.requests) opt_.requests->clear();
  if (opt_.layout) {
    try {
      sim_.set_planned_layout(opt_.layout);
    } catch (const OutOfMemory& e) {
      res_.oom = true;
      res_.oom_message = e.message();
      res_.oom_at = "iteration_begin";
      res_.peak_allocated = sim_.stats().allocated.peak;
      res_.peak_reserved = sim_.stats().reserved.peak;
      res_.next_limit = sim_.lowest_refused();
      return false;
    }
  }
  index_blocks();
  if (s_.narrowed > 0) narrow_block_.assign(p_.saved.size(), nullptr);
  best_ = sim_.stats().allocated.current;
  if (opt_.dtr) start_dtr();
  return true;
}

void Simulator::Run::move_state_to_host() {
  move_optimizer_state(s_, sim_, host_, "simulator");
  sim_.reset_peak();
  host_.reset_peak();
}

// The blocks live at the start, and each saved tensor's base allocation.
void Simulator::Run::index_blocks() {
  for (const AllocatorState::SegmentRec& seg : p_.start_state.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.allocated && sim_.block_by_id(b.id)) live_[b.id] = sim_.block_by_id(b.id);
    }
  }
  saved_base_.assign(p_.saved.size(), 0);
  for (size_t i = 0; i < p_.saved.size(); ++i) {
    saved_base_[i] = p_.values[static_cast<size_t>(p_.saved[i].value)].alloc_id;
  }
}

void Simulator::Run::start_dtr() {
  auto evict_saved = [this](int32_t sv) {
    Block*& b = live_block(sv, "when DTR evicts it");
    free(b);
    b = nullptr;  // its base free, if any, no longer frees anything
  };
  auto block_of = [this](int32_t sv) -> uint64_t {
    return live_block(sv, "when DTR looks it up")->id();
  };
  dtr_runtime_ = std::make_unique<SimRuntime>(
      sim_, evict_saved,
      [this](const RegenProgram& prog, const std::function<void(size_t)>& after_step) {
        run_program(prog, after_step);
      },
      block_of);
  dtr_ = std::make_unique<DtrEngine>(p_, *opt_.dtr, *dtr_runtime_);
  DtrEngine* engine = dtr_.get();
  dtr_handler_ = std::make_unique<EvictionScope>(
      sim_, [engine](const EvictionRequest& r) { return engine->evict_for(r); });
}

Block* Simulator::Run::alloc(uint64_t requested, Category c, uint32_t tag) {
  Block* b = sim_.allocate(requested, c, tag);
  if (opt_.requests) {
    request_of_[b] = opt_.requests->size();
    opt_.requests->push_back({CachingAllocator::round_size(requested), clock_, -1});
  }
  ++clock_;
  after_change();
  return b;
}

void Simulator::Run::free(Block* b) {
  if (opt_.requests) {
    auto it = request_of_.find(b);
    if (it != request_of_.end()) {
      (*opt_.requests)[it->second].end = clock_;
      request_of_.erase(it);
    }
  }
  sim_.free(b);
  ++clock_;
}

// With top_live, the live set is listed each time the running maximum rises (costly; reports
// only).
void Simulator::Run::after_change() {
  if (!opt_.top_live) return;
  const int64_t cur = sim_.stats().allocated.current;
  if (cur <= best_) return;
  best_ = cur;
  best_marker_ = last_marker_;
  best_live_.clear();
  for (const BlockInfo& b : sim_.snapshot()) {
    if (b.allocated)
      best_live_.push_back({tag_name(b.tag), b.category, static_cast<int64_t>(b.size)});
  }
}

// The block of a saved tensor that must be live now (`when` says at what point, for the error).
Block*& Simulator::Run::live_block(int32_t saved, const char* when) {
  auto it = live_.find(saved_base_[static_cast<size_t>(saved)]);
  REGEN_CHECK(it != live_.end() && it->second, "simulator: saved tensor ", saved, " is not live ",
              when);
  return it->second;
}

// A regeneration program, interpreted by the code the executor runs (remat/execute/schedule.h
// interpret_program), with blocks for tensors.
void Simulator::Run::run_program(const RegenProgram& prog,
                                 const std::function<void(size_t)>& after_step) {
  auto replay = [&](const ReplayStep& st, const auto& lookup) {
    const ProfileNode& n = p_.nodes[static_cast<size_t>(st.node)];
    std::unordered_map<uint64_t, Block*> local;
    for (const WindowEvent& w : sim_owner_.windows_[static_cast<size_t>(st.node)]) {
      if (w.alloc) {
        local[w.block_id] = alloc(static_cast<uint64_t>(w.requested), w.category, w.tag);
      } else {
        free(local.at(w.block_id));  // the constructor checked the window's frees
        local.erase(w.block_id);
      }
    }
    std::vector<BlockRef> outputs(n.outputs.size());
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      if (n.is_view && k == 0) {
        // A view shares its input's block: another reference when the program made it.
        if (const BlockRef* in = lookup(n.inputs[0])) outputs[k] = *in;
      } else {
        // The constructor checked that each output is its own allocation of the window, or empty
        // (no block: nothing reads it).
        const ProfileValue& val = p_.values[static_cast<size_t>(n.outputs[k])];
        if (val.alloc_id == 0 && val.bytes == 0) continue;
        outputs[k] = BlockRef::owned(local.at(val.alloc_id), &refs_, &free_block_);
      }
    }
    return outputs;
  };
  auto restore = [&](int32_t saved, BlockRef&& out) {
    Block* b = out.adopt();  // the saved tensor's now: its own free comes from the event log
    live_[saved_base_[static_cast<size_t>(saved)]] = b;
    return BlockRef::borrowed(b);
  };
  std::map<int64_t, BlockRef> left =
      interpret_program<BlockRef>(p_, prog, replay, restore, [&](size_t i) {
        if (after_step) after_step(i);
      });
  for (const auto& kv : left) REGEN_ASSERT(!kv.second.is_owned());  // the program released them
  REGEN_ASSERT(refs_.empty());
}

// A copy issued at `now` on a queue that is free from `queue_free`: when it ends.
double Simulator::Run::issue_copy(double now, double ms, double& queue_free, double& busy) {
  const double start = std::max(now, queue_free);
  queue_free = start + ms;
  busy += ms;
  return queue_free;
}

// The compute's clock after waiting at `now` for a copy that ends at `end`.
double Simulator::Run::wait_copy(double now, double end) {
  if (end <= now) return now;
  res_.stall_ms += end - now;
  shift_ += end - now;
  return end;
}

uint32_t Simulator::Run::value_tag(int32_t saved) const {
  return intern_tag(
      p_.nodes[static_cast<size_t>(p_.saved[static_cast<size_t>(saved)].producer)].name);
}

// Optimizer state on the host tier: each parameter's state copied into device blocks, updated,
// copied back, one parameter ahead and one behind (the executor's order,
// remat/execute/executor.cpp).
void Simulator::Run::run_state_stream(double t0) {
  const size_t ng = s_.state_groups.size();
  std::vector<std::vector<Block*>> dev(ng);
  std::vector<double> in_end(ng, 0), out_end(ng, 0);
  double t = t0, updates = 0;
  auto issue_in = [&](size_t g) {
    const StateGroup& grp = s_.state_groups[g];
    for (size_t k = 0; k < grp.block.size(); ++k) {
      dev[g].push_back(alloc(static_cast<uint64_t>(grp.requested[k]), Category::optimizer_state,
                             intern_tag(grp.tag[k])));
      in_end[g] = issue_copy(t, grp.to_device_ms[k], to_device_free_, res_.to_device_busy_ms);
      res_.bytes_to_device += grp.requested[k];
    }
  };
  auto issue_out = [&](size_t g) {
    const StateGroup& grp = s_.state_groups[g];
    for (size_t k = 0; k < grp.block.size(); ++k) {
      out_end[g] = issue_copy(t, grp.to_host_ms[k], to_host_free_, res_.to_host_busy_ms);
      res_.bytes_to_host += grp.requested[k];
    }
  };
  auto finish_group = [&](size_t g) {
    t = std::max(t, out_end[g]);
    for (Block* b : dev[g]) free(b);
    dev[g].clear();
  };
  for (size_t g = 0; g < ng; ++g) {
    if (g == 0) issue_in(0);
    if (g + 1 < ng) issue_in(g + 1);
    t = std::max(t, in_end[g]);
    t += s_.state_groups[g].update_ms;
    updates += s_.state_groups[g].update_ms;
    issue_out(g);
    if (g > 0) finish_group(g - 1);
  }
  if (ng > 0) finish_group(ng - 1);
  // The profiled step already holds the updates; what is left is waiting for copies.
  const double waited = std::max(0.0, t - t0 - updates);
  res_.stall_ms += waited;
  shift_ += waited;
}

void Simulator::Run::on_marker(const Marker& m) {
  last_marker_ = &m - p_.markers.data();
  const double now = m.time_ms + shift_;
  if (dtr_) dtr_marker(m);
  if (m.kind == MarkerKind::iteration_begin && !repeating_) {
    // The planned step's requests, like the allocator's, count from here.
    sim_.begin_planned_step();
    if (opt_.requests) {
      opt_.requests->clear();
      request_of_.clear();
    }
  }
  if (m.kind == MarkerKind::fwd_end) {
    after_forward(m.node, now);
  } else if (m.kind == MarkerKind::bwd_begin) {
    before_backward(m.node, now);
  } else if (m.kind == MarkerKind::optimizer_begin && !s_.state_groups.empty()) {
    run_state_stream(now);
  }
  if (opt_.timeline) record_timeline(m);
}

void Simulator::Run::dtr_marker(const Marker& m) {
  switch (m.kind) {
    case MarkerKind::fwd_begin:
      dtr_->before_forward(m.node);
      break;
    case MarkerKind::fwd_end:
      dtr_->after_forward(m.node);
      break;
    case MarkerKind::backward_start:
      dtr_->backward_start();
      break;
    case MarkerKind::bwd_begin:
      dtr_->before_backward(m.node);
      break;
    case MarkerKind::bwd_end:
      dtr_->after_backward(m.node);
      break;
    case MarkerKind::backward_finish:
      dtr_->end_step();
      break;
    default:
      break;
  }
}

// After a node's forward: its scheduled evictions, the offload copies it issues and the blocks
// whose copies it waits for, then the narrowings, as the executor makes them.
void Simulator::Run::after_forward(int32_t node, double now) {
  const size_t n = static_cast<size_t>(node);
  for (int32_t sv : s_.evict_after[n]) {
    Block*& b = live_block(sv, "when its eviction is scheduled");
    free(b);
    b = nullptr;  // its base free, if any, no longer frees anything
  }
  double t = now;
  for (int32_t i : s_.offload_issue_after[n]) {
    const OffloadOp& op = s_.offloads[static_cast<size_t>(i)];
    host_copy_[static_cast<size_t>(i)] =
        host_.allocate(op.bytes, Category::activation, value_tag(op.saved));
    copy_end_[static_cast<size_t>(i)] =
        issue_copy(t, op.to_host_ms, to_host_free_, res_.to_host_busy_ms);
    res_.bytes_to_host += static_cast<int64_t>(op.bytes);
    ++res_.offloads;
  }
  for (int32_t i : s_.offload_free_after[n]) {
    const OffloadOp& op = s_.offloads[static_cast<size_t>(i)];
    t = wait_copy(t, copy_end_[static_cast<size_t>(i)]);
    Block*& b = live_block(op.saved, "when its offload frees it");
    free(b);
    b = nullptr;
  }
  // The narrow form, then the f32 block goes; each takes the time model's narrowing time on the
  // compute clock.
  for (int32_t sv : s_.narrow_after[n]) {
    Block*& b = live_block(sv, "when its narrowing is scheduled");
    const ProfileSaved& saved = p_.saved[static_cast<size_t>(sv)];
    const uint64_t bytes = p_.values[static_cast<size_t>(saved.value)].bytes;
    narrow_block_[static_cast<size_t>(sv)] =
        alloc(narrow_bytes(bytes), Category::activation, narrow_tag(p_, sv));
    shift_ += p_.compress_cost.narrow_ms(bytes);
    free(b);
    b = nullptr;
  }
}

// Before a node's backward: the copies back it issues and waits for, the widenings (after the
// copies, before the program), then its regeneration program.
void Simulator::Run::before_backward(int32_t node, double now) {
  const size_t n = static_cast<size_t>(node);
  double t = now;
  for (int32_t i : s_.prefetch_issue_before[n]) {
    const OffloadOp& op = s_.offloads[static_cast<size_t>(i)];
    // A new device block for it: the saved tensor's from here (its base free frees it).
    live_[saved_base_[static_cast<size_t>(op.saved)]] =
        alloc(op.bytes, Category::activation, value_tag(op.saved));
    copy_end_[static_cast<size_t>(i)] =
        issue_copy(t, op.to_device_ms, to_device_free_, res_.to_device_busy_ms);
    res_.bytes_to_device += static_cast<int64_t>(op.bytes);
  }
  for (int32_t i : s_.prefetch_wait_before[n]) {
    t = wait_copy(t, copy_end_[static_cast<size_t>(i)]);
    host_.free(host_copy_[static_cast<size_t>(i)]);
    host_copy_[static_cast<size_t>(i)] = nullptr;
  }
  // The f32 block, then the narrow form goes; the base free of the tensor frees the widened block.
  for (int32_t sv : s_.widen_before[n]) {
    const ProfileSaved& saved = p_.saved[static_cast<size_t>(sv)];
    const ProfileValue& root = p_.values[static_cast<size_t>(saved.value)];
    Block* wide = alloc(root.bytes, Category::activation, widen_tag(p_, sv));
    REGEN_CHECK(narrow_block_[static_cast<size_t>(sv)] != nullptr, "simulator: saved tensor ", sv,
                " is widened but was not narrowed");
    free(narrow_block_[static_cast<size_t>(sv)]);
    narrow_block_[static_cast<size_t>(sv)] = nullptr;
    live_[saved_base_[static_cast<size_t>(sv)]] = wide;
    shift_ += p_.compress_cost.widen_ms(root.bytes);
  }
  const int32_t pi = s_.program_of_node[n];
  if (pi >= 0) {
    run_program(s_.programs[static_cast<size_t>(pi)]);
    shift_ += s_.programs[static_cast<size_t>(pi)].time_ms;
  }
}

void Simulator::Run::record_timeline(const Marker& m) {
  TimelinePoint tp;
  tp.time_ms = m.time_ms;
  tp.label = where(&m - p_.markers.data());
  MemoryStats st = sim_.stats();
  for (int i = 0; i < kNumCategories; ++i) tp.allocated_by[i] = st.allocated_by[i].current;
  tp.reserved = st.reserved.current;
  res_.timeline.push_back(std::move(tp));
}

// Events [from, to) with the markers at positions from..to whose indices are in [lo, hi).
void Simulator::Run::replay_events(size_t from, size_t to, size_t lo, size_t hi) {
  for (size_t i = from; i <= to; ++i) {
    for (size_t m : sim_owner_.markers_at_[i]) {
      if (m >= lo && m < hi) on_marker(p_.markers[m]);
    }
    if (i == to) break;
    const ProfileEvent& e = p_.events[i];
    if (no_sync_ && e.category == Category::communication) continue;
    if (e.kind == MemoryEventKind::alloc) {
      live_[e.block_id] =
          alloc(static_cast<uint64_t>(e.requested), e.category, sim_owner_.tags_[i]);
    } else if (e.kind == MemoryEventKind::free) {
      auto it = live_.find(e.block_id);
      REGEN_CHECK(it != live_.end(), "simulator: the profile frees block ", e.block_id,
                  " that was never allocated");
      if (it->second) free(it->second);
      live_.erase(it);
    }
    // Segment events follow from the allocations; the simulated allocator makes its own.
  }
}

// The step's events and markers: once, or with gradient accumulation the profiled micro-batch's
// events (and markers, the micro_batch_end one included) once per micro-batch, the ones before the
// last without the data-parallel sync's requests (Profile::accumulate), then the optimizer's.
// Under a limit, running out of memory ends the replay and is the result.
void Simulator::Run::replay_step() {
  try {
    const int64_t micro = p_.micro_batch_marker();
    if (micro < 0) {
      replay_events(0, p_.events.size(), 0, p_.markers.size());
    } else {
      const size_t end = static_cast<size_t>(p_.markers[static_cast<size_t>(micro)].position);
      const size_t split = static_cast<size_t>(micro) + 1;
      for (int64_t k = 0; k < p_.accumulate; ++k) {
        repeating_ = k > 0;
        no_sync_ = k + 1 < p_.accumulate;
        replay_events(0, end, 0, split);
      }
      repeating_ = false;
      no_sync_ = false;
      replay_events(end, p_.events.size(), split, p_.markers.size());
    }
  } catch (const OutOfMemory& e) {
    if (opt_.limit <= 0) throw;  // the null arena never runs out without a limit
    res_.oom = true;
    res_.oom_message = e.message();
    if (last_marker_ >= 0) res_.oom_at = where(last_marker_);
  }
}

// The result: peaks of both tiers, what ran, and the step's time.
void Simulator::Run::finish() {
  res_.cache_flushes = sim_.stats().num_cache_flushes - flushes_before_;
  if (opt_.limit > 0) res_.next_limit = sim_.lowest_refused();
  if (dtr_) {
    if (dtr_->in_step()) dtr_->end_step();  // ran out of memory in the middle
    if (opt_.dtr_stats) *opt_.dtr_stats = dtr_->last();
    dtr_handler_.reset();
  }
  for (const std::vector<int32_t>& e : s_.evict_after)
    res_.evictions += static_cast<int64_t>(e.size());
  const MemoryStats st = sim_.stats();
  res_.peak_allocated = st.allocated.peak;
  res_.peak_reserved = st.reserved.peak;
  res_.peak_requested = st.requested.peak;
  res_.allocated_by_at_peak = st.allocated_by_at_peak;
  for (int i = 0; i < kNumCategories; ++i) res_.peak_by[i] = st.allocated_by[i].peak;
  std::stable_sort(best_live_.begin(), best_live_.end(),
                   [](const LiveBlockRec& a, const LiveBlockRec& b) { return a.bytes > b.bytes; });
  if (opt_.top_live > 0 && static_cast<int>(best_live_.size()) > opt_.top_live) {
    best_live_.resize(static_cast<size_t>(opt_.top_live));
  }
  res_.live_at_peak = std::move(best_live_);
  if (best_marker_ >= 0) res_.peak_at = where(best_marker_);
  res_.recompute_ms = s_.recompute_ms;
  res_.replays = s_.replays;
  res_.narrowed = s_.narrowed;
  res_.compress_ms = s_.compress_ms;
  // Every micro-batch recomputes, narrows and widens what the schedule says; evictions, replays
  // and narrowed tensors above are one micro-batch's, as the executor counts them (per backward).
  res_.time_ms = p_.iteration_ms +
                 static_cast<double>(p_.accumulate) * (s_.recompute_ms + s_.compress_ms) +
                 res_.stall_ms;
  const MemoryStats hs = host_.stats();
  res_.host_peak_allocated = hs.allocated.peak;
  res_.host_peak_reserved = hs.reserved.peak;
  res_.host_peak_requested = hs.requested.peak;
  for (int i = 0; i < kNumCategories; ++i) res_.host_peak_by[i] = hs.allocated_by[i].peak;
}

// A marker as reports name it: "fwd_end layer1.0.conv1".
std::string Simulator::Run::where(int64_t marker) const {
  const Marker& m = p_.markers[static_cast<size_t>(marker)];
  return std::string(marker_name(m.kind)) +
         (m.node >= 0 ? " " + p_.nodes[static_cast<size_t>(m.node)].name : "");
}

SimResult Simulator::run(const Schedule& s, const SimOptions& opt) const {
  return Run(*this, s, opt).result();
}

StartLayouts start_layouts(const Profile& p, const Schedule& s) {
  CachingAllocator dev(make_null_arena(Device::cpu()));
  CachingAllocator host(make_null_arena(Device::cpu()));
  dev.restore_state(p.start_state);
  if (s.optimizer_state == StatePlace::host) move_optimizer_state(s, dev, host, "start layout");
  return {dev.live_layout(), host.live_layout()};
}

Profile profile_from_json(const std::string& text, const std::string& origin) {
  Profile p = parse_profile_json(text, origin);
  std::unique_ptr<Simulator> sim;
  try {
    sim = std::make_unique<Simulator>(p);  // checks each node's forward window and outputs
  } catch (const Error& e) {
    REGEN_FAIL(origin, ": ", e.message(), ": the file was edited or is damaged; profile again");
  }
  // The event log must replay to the peaks the file says were measured: a file edited by hand
  // or damaged in a way the structural checks miss would otherwise give plans whose predictions
  // are silently wrong.
  const SimResult replay = sim->run(without_compression(
      build_schedule(p, std::vector<Decision>(p.saved.size(), Decision::retain))));
  REGEN_CHECK(replay.peak_allocated == p.peak_allocated && replay.peak_reserved == p.peak_reserved,
              origin, ": its event log replays to a peak of ", replay.peak_allocated,
              " allocated and ", replay.peak_reserved, " reserved bytes, but it records ",
              p.peak_allocated, " and ", p.peak_reserved,
              " as measured: the file was edited or is damaged; profile again");
  return p;
}

namespace {

// How the set's other files carry profile.json's id: the table's first line, the trace's first key.
const char kSetLine[] = "# regen profile set ";
const char kSetKey[] = "{\"regen_profile_set\":\"";

// The id a sibling carries ("" when it carries none), from its first bytes only: a trace runs to
// megabytes, and the id is at its start.
std::string sibling_set_id(const std::string& path, const std::string& head) {
  std::ifstream f(path, std::ios::binary);
  std::string text(head.size() + 128, '\0');
  f.read(&text[0], static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(f.gcount()));
  if (text.compare(0, head.size(), head) != 0) return "";
  const size_t end = text.find_first_of(" \"\n", head.size());
  return text.substr(head.size(), end == std::string::npos ? std::string::npos : end - head.size());
}

}  // namespace

std::vector<std::pair<std::string, std::string>> profile_set_files(const std::string& dir,
                                                                   const std::string& json,
                                                                   const std::string& txt,
                                                                   const std::string& trace) {
  const std::string id = content_id(json);
  REGEN_CHECK(!trace.empty() && trace[0] == '{', "profile_set_files: the trace is not an object");
  return {
      {dir + "/profile.txt",
       kSetLine + id + " (the id of profile.json beside it: regen refuses a mixed set)\n" + txt},
      {dir + "/trace.json", kSetKey + id + "\"," + trace.substr(1)},
      {dir + "/profile.json", json}};
}

Profile load_profile(const std::string& path) {
  const std::string text = read_file(path);
  const auto slash = path.find_last_of('/');
  if ((slash == std::string::npos ? path : path.substr(slash + 1)) == "profile.json") {
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
    const std::string id = content_id(text);
    for (const auto& [name, head] : {std::make_pair(std::string("profile.txt"), kSetLine),
                                     std::make_pair(std::string("trace.json"), kSetKey)}) {
      const std::string sibling = (slash == std::string::npos ? "" : dir) + name;
      struct stat st;
      if (::stat(sibling.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      const std::string theirs = sibling_set_id(sibling, head);
      REGEN_CHECK(theirs.empty() || theirs == id, "profile '", path, "' and ", sibling,
                  " beside it are not one set (", sibling, " is of profile ", theirs, ", this is ",
                  id,
                  "): a run of `regen profile` was stopped while it replaced them; profile again");
    }
  }
  return profile_from_json(text, "profile '" + path + "'");
}

}  // namespace regen
