// The simulator (simulator.h).
#include "regen/remat/simulator.h"

#include "regen/remat/layout.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "regen/core/error.h"
#include "regen/core/io.h"
#include "regen/remat/compress.h"
#include "regen/remat/dtr.h"

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

// The simulator's side of the DTR engine (dtr.h): simulated blocks for tensors.
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
    // still live when the window ends.
    const ProfileNode& node = p.nodes[n];
    for (size_t k = node.is_view ? 1 : 0; k < node.outputs.size(); ++k) {
      const uint64_t id = p.values[static_cast<size_t>(node.outputs[k])].alloc_id;
      REGEN_CHECK(mine.erase(id) == 1, "profile: output ", k, " of node ", n, " (", node.name,
                  ") is not an allocation of its own forward (block ", id, ")");
    }
  }
}

SimResult Simulator::run(const Schedule& s, const SimOptions& opt) const {
  const Profile& p = p_;
  CachingAllocator sim(make_null_arena(Device::cpu()));
  sim.restore_state(p.start_state);
  SimResult res;
  REGEN_CHECK(s.offload_issue_after.size() == p.nodes.size() &&
                  s.prefetch_wait_before.size() == p.nodes.size(),
              "simulator: the schedule was not built for this profile");
  // With gradient accumulation the step replays one micro-batch's events K times (the markers'
  // times are the first micro-batch's); the copy timeline is not replayed that way yet.
  REGEN_CHECK(p.accumulate == 1 || (s.offloads.empty() && s.optimizer_state == StatePlace::device),
              "simulator: offloading (saved tensors or optimizer state on the host tier) with "
              "gradient accumulation (",
              p.accumulate,
              " micro-batches) is not supported yet: "
              "--offload none, or --accumulate 1");
  REGEN_CHECK(!opt.dtr || (s.offloads.empty() && s.optimizer_state == StatePlace::device),
              "simulator: DTR runs without offloads");
  // The host tier: the optimizer state, when it lives there, moved there before the step in
  // allocation order (the pipeline does the same, RematPipeline), which frees the device blocks in
  // that order; then the step's canonical start empties the device's cache.
  CachingAllocator host(make_null_arena(Device::cpu()));
  std::vector<std::vector<Block*>> host_state(s.state_groups.size());
  if (s.optimizer_state == StatePlace::host) {
    for (size_t g = 0; g < s.state_groups.size(); ++g) {
      const StateGroup& grp = s.state_groups[g];
      for (size_t k = 0; k < grp.block.size(); ++k) {
        host_state[g].push_back(host.allocate(static_cast<uint64_t>(grp.requested[k]),
                                              Category::optimizer_state, intern_tag(grp.tag[k])));
        Block* b = sim.block_by_id(grp.block[k]);
        REGEN_CHECK(b, "simulator: optimizer state block ", grp.block[k], " is not live");
        sim.free(b);
      }
    }
    sim.empty_cache();
    sim.reset_peak();
    host.reset_peak();
  }
  if (opt.start_holes) *opt.start_holes = layout_holes(sim.snapshot_state());
  const int64_t flushes_before = sim.stats().num_cache_flushes;
  // The limit, as the allocator applies it: to segments it maps from here on (the persistent
  // ones may already pass it; a plan then does not fit, planner.h fit_schedule).
  if (opt.limit > 0) sim.set_limit(opt.limit);
  res.limit = opt.limit;
  // Every request and free of the step, for the requests trace (and its times).
  int64_t clock = 0;
  std::unordered_map<const Block*, size_t> request_of;
  auto alloc_ = [&](uint64_t requested, Category c, uint32_t tag) {
    Block* b = sim.allocate(requested, c, tag);
    if (opt.requests) {
      request_of[b] = opt.requests->size();
      opt.requests->push_back({CachingAllocator::round_size(requested), clock, -1});
    }
    ++clock;
    return b;
  };
  auto free_ = [&](Block* b) {
    if (opt.requests) {
      auto it = request_of.find(b);
      if (it != request_of.end()) {
        (*opt.requests)[it->second].end = clock;
        request_of.erase(it);
      }
    }
    sim.free(b);
    ++clock;
  };
  if (opt.requests) opt.requests->clear();
  if (opt.layout) {
    try {
      sim.set_planned_layout(opt.layout);
    } catch (const OutOfMemory& e) {
      res.oom = true;
      res.oom_message = e.message();
      res.oom_at = "iteration_begin";
      res.peak_allocated = sim.stats().allocated.peak;
      res.peak_reserved = sim.stats().reserved.peak;
      res.next_limit = sim.lowest_refused();
      return res;
    }
  }
  std::unordered_map<uint64_t, Block*> live;  // base allocation id -> simulated block
  for (const AllocatorState::SegmentRec& seg : p.start_state.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.allocated && sim.block_by_id(b.id)) live[b.id] = sim.block_by_id(b.id);
    }
  }
  std::vector<uint64_t> saved_base(p.saved.size(), 0);
  for (size_t i = 0; i < p.saved.size(); ++i) {
    saved_base[i] = p.values[static_cast<size_t>(p.saved[i].value)].alloc_id;
  }
  // Compression: each narrowed tensor's narrow block while it is narrow.
  std::vector<Block*> narrow_block(s.narrowed > 0 ? p.saved.size() : 0, nullptr);
  REGEN_CHECK(s.narrowed == 0 || !opt.dtr, "simulator: DTR runs without compression");
  int64_t best = sim.stats().allocated.current;
  std::vector<LiveBlockRec> best_live;
  int64_t last_marker = -1, best_marker = -1;
  // With top_live, the live set is listed each time the running maximum rises (costly; reports
  // only).
  auto after_change = [&]() {
    if (!opt.top_live) return;
    const int64_t cur = sim.stats().allocated.current;
    if (cur > best) {
      best = cur;
      best_marker = last_marker;
      best_live.clear();
      for (const BlockInfo& b : sim.snapshot()) {
        if (b.allocated)
          best_live.push_back({tag_name(b.tag), b.category, static_cast<int64_t>(b.size)});
      }
    }
  };

  // The regeneration programs, interpreted by the code the executor runs (schedule.h
  // interpret_program), with blocks for tensors.
  std::unordered_map<Block*, int> refs;  // the program's transient blocks: references to each
  std::function<void(Block*)> free_block = free_;
  auto run_program = [&](const RegenProgram& prog,
                         const std::function<void(size_t)>& after_step = {}) {
    auto replay = [&](const ReplayStep& st, const auto& lookup) {
      const ProfileNode& n = p.nodes[static_cast<size_t>(st.node)];
      std::unordered_map<uint64_t, Block*> local;
      for (const WindowEvent& w : windows_[static_cast<size_t>(st.node)]) {
        if (w.alloc) {
          local[w.block_id] = alloc_(static_cast<uint64_t>(w.requested), w.category, w.tag);
          after_change();
        } else {
          free_(local.at(w.block_id));  // the constructor checked the window's frees
          local.erase(w.block_id);
        }
      }
      std::vector<BlockRef> outputs(n.outputs.size());
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        if (n.is_view && k == 0) {
          // A view shares its input's block: another reference when the program made it.
          if (const BlockRef* in = lookup(n.inputs[0])) outputs[k] = *in;
        } else {
          // The constructor checked that each output is its own allocation of the window.
          const ProfileValue& val = p.values[static_cast<size_t>(n.outputs[k])];
          outputs[k] = BlockRef::owned(local.at(val.alloc_id), &refs, &free_block);
        }
      }
      return outputs;
    };
    auto restore = [&](int32_t saved, BlockRef&& out) {
      Block* b = out.adopt();  // the saved tensor's now: its own free comes from the event log
      live[saved_base[static_cast<size_t>(saved)]] = b;
      return BlockRef::borrowed(b);
    };
    std::map<int64_t, BlockRef> left =
        interpret_program<BlockRef>(p, prog, replay, restore, [&](size_t i) {
          if (after_step) after_step(i);
        });
    for (const auto& kv : left) REGEN_ASSERT(!kv.second.is_owned());  // the program released them
    REGEN_ASSERT(refs.empty());
  };

  // DTR: the engine decides at the markers where the executor's hooks run, and when the
  // allocator asks (its eviction handler).
  std::unique_ptr<SimRuntime> dtr_runtime;
  std::unique_ptr<DtrEngine> dtr;
  std::unique_ptr<EvictionScope> dtr_handler;
  if (opt.dtr) {
    REGEN_CHECK(!opt.layout, "simulator: DTR runs without a planned layout");
    auto evict_saved = [&](int32_t sv) {
      auto it = live.find(saved_base[static_cast<size_t>(sv)]);
      REGEN_CHECK(it != live.end() && it->second, "simulator: DTR evicts saved tensor ", sv,
                  ", which is not live");
      free_(it->second);
      it->second = nullptr;  // its base free, if any, no longer frees anything
    };
    auto block_of = [&](int32_t sv) -> uint64_t {
      auto it = live.find(saved_base[static_cast<size_t>(sv)]);
      REGEN_CHECK(it != live.end() && it->second, "simulator: saved tensor ", sv, " is not live");
      return it->second->id();
    };
    dtr_runtime = std::make_unique<SimRuntime>(
        sim, evict_saved,
        [&](const RegenProgram& prog, const std::function<void(size_t)>& after_step) {
          run_program(prog, after_step);
        },
        block_of);
    dtr = std::make_unique<DtrEngine>(p, *opt.dtr, *dtr_runtime);
    DtrEngine* engine = dtr.get();
    dtr_handler = std::make_unique<EvictionScope>(
        sim, [engine](const EvictionRequest& r) { return engine->evict_for(r); });
  }

  bool repeating = false;  // in the second or a later micro-batch of an accumulated step
  // Offload: the host copies, and the copy queues' timeline. The compute clock is the profiled
  // marker's time plus what the step has added so far (regeneration programs, waits for copies);
  // each queue runs its copies in issue order, one at a time.
  std::vector<Block*> host_copy(s.offloads.size(), nullptr);
  std::vector<double> copy_end(s.offloads.size(), 0);
  double shift = 0, to_host_free = 0, to_device_free = 0;
  auto issue_copy = [&](double now, double ms, double& queue_free, double& busy) {
    const double start = std::max(now, queue_free);
    queue_free = start + ms;
    busy += ms;
    return queue_free;
  };
  auto wait_copy = [&](double now, double end) {  // the compute's clock after the wait
    if (end <= now) return now;
    res.stall_ms += end - now;
    shift += end - now;
    return end;
  };
  auto value_tag = [&](int32_t saved) {
    return intern_tag(
        p.nodes[static_cast<size_t>(p.saved[static_cast<size_t>(saved)].producer)].name);
  };
  auto after_host_change = [&]() {};
  // Optimizer state on the host tier: each parameter's state copied into device blocks, updated,
  // copied back, one parameter ahead and one behind (the executor's order, executor.cpp).
  auto run_state_stream = [&](double t0) {
    const size_t ng = s.state_groups.size();
    std::vector<std::vector<Block*>> dev(ng);
    std::vector<double> in_end(ng, 0), out_end(ng, 0);
    double t = t0, updates = 0;
    auto issue_in = [&](size_t g) {
      const StateGroup& grp = s.state_groups[g];
      for (size_t k = 0; k < grp.block.size(); ++k) {
        dev[g].push_back(alloc_(static_cast<uint64_t>(grp.requested[k]), Category::optimizer_state,
                                intern_tag(grp.tag[k])));
        after_change();
        in_end[g] = issue_copy(t, grp.to_device_ms[k], to_device_free, res.to_device_busy_ms);
        res.bytes_to_device += grp.requested[k];
      }
    };
    auto issue_out = [&](size_t g) {
      const StateGroup& grp = s.state_groups[g];
      for (size_t k = 0; k < grp.block.size(); ++k) {
        out_end[g] = issue_copy(t, grp.to_host_ms[k], to_host_free, res.to_host_busy_ms);
        res.bytes_to_host += grp.requested[k];
      }
    };
    auto finish = [&](size_t g) {
      t = std::max(t, out_end[g]);
      for (Block* b : dev[g]) free_(b);
      dev[g].clear();
    };
    for (size_t g = 0; g < ng; ++g) {
      if (g == 0) issue_in(0);
      if (g + 1 < ng) issue_in(g + 1);
      t = std::max(t, in_end[g]);
      t += s.state_groups[g].update_ms;
      updates += s.state_groups[g].update_ms;
      issue_out(g);
      if (g > 0) finish(g - 1);
    }
    if (ng > 0) finish(ng - 1);
    // The profiled step already holds the updates; what is left is waiting for copies.
    const double waited = std::max(0.0, t - t0 - updates);
    res.stall_ms += waited;
    shift += waited;
  };

  auto on_marker = [&](const Marker& m) {
    last_marker = &m - p.markers.data();
    const double now = m.time_ms + shift;
    if (dtr) {
      switch (m.kind) {
        case MarkerKind::fwd_begin:
          dtr->before_forward(m.node);
          break;
        case MarkerKind::fwd_end:
          dtr->after_forward(m.node);
          break;
        case MarkerKind::backward_start:
          dtr->backward_start();
          break;
        case MarkerKind::bwd_begin:
          dtr->before_backward(m.node);
          break;
        case MarkerKind::bwd_end:
          dtr->after_backward(m.node);
          break;
        case MarkerKind::backward_finish:
          dtr->end_step();
          break;
        default:
          break;
      }
    }
    if (m.kind == MarkerKind::iteration_begin && !repeating) {
      // The planned step's requests, like the allocator's, count from here.
      sim.begin_planned_step();
      if (opt.requests) {
        opt.requests->clear();
        request_of.clear();
      }
    }
    if (m.kind == MarkerKind::fwd_end) {
      for (int32_t sv : s.evict_after[static_cast<size_t>(m.node)]) {
        auto it = live.find(saved_base[static_cast<size_t>(sv)]);
        REGEN_CHECK(it != live.end() && it->second, "simulator: saved tensor ", sv,
                    " is not live when its eviction is scheduled");
        free_(it->second);
        it->second = nullptr;  // its base free, if any, no longer frees anything
      }
      double t = now;
      for (int32_t i : s.offload_issue_after[static_cast<size_t>(m.node)]) {
        const OffloadOp& op = s.offloads[static_cast<size_t>(i)];
        host_copy[static_cast<size_t>(i)] =
            host.allocate(op.bytes, Category::activation, value_tag(op.saved));
        after_host_change();
        copy_end[static_cast<size_t>(i)] =
            issue_copy(t, op.to_host_ms, to_host_free, res.to_host_busy_ms);
        res.bytes_to_host += static_cast<int64_t>(op.bytes);
        ++res.offloads;
      }
      for (int32_t i : s.offload_free_after[static_cast<size_t>(m.node)]) {
        const OffloadOp& op = s.offloads[static_cast<size_t>(i)];
        t = wait_copy(t, copy_end[static_cast<size_t>(i)]);
        auto it = live.find(saved_base[static_cast<size_t>(op.saved)]);
        REGEN_CHECK(it != live.end() && it->second, "simulator: saved tensor ", op.saved,
                    " is not live when its offload frees it");
        free_(it->second);
        it->second = nullptr;
      }
      // Then the narrowings, as the executor makes them: the narrow form, then the f32 block goes;
      // each takes the time model's narrowing time on the compute clock.
      for (int32_t sv : s.narrow_after[static_cast<size_t>(m.node)]) {
        auto it = live.find(saved_base[static_cast<size_t>(sv)]);
        REGEN_CHECK(it != live.end() && it->second, "simulator: saved tensor ", sv,
                    " is not live when its narrowing is scheduled");
        const ProfileSaved& saved = p.saved[static_cast<size_t>(sv)];
        const uint64_t bytes = p.values[static_cast<size_t>(saved.value)].bytes;
        narrow_block[static_cast<size_t>(sv)] =
            alloc_(narrow_bytes(bytes), Category::activation, narrow_tag(p, sv));
        after_change();
        shift += p.compress_cost.narrow_ms(bytes);
        free_(it->second);
        it->second = nullptr;
      }
    } else if (m.kind == MarkerKind::bwd_begin) {
      double t = now;
      for (int32_t i : s.prefetch_issue_before[static_cast<size_t>(m.node)]) {
        const OffloadOp& op = s.offloads[static_cast<size_t>(i)];
        // A new device block for it: the saved tensor's from here (its base free frees it).
        live[saved_base[static_cast<size_t>(op.saved)]] =
            alloc_(op.bytes, Category::activation, value_tag(op.saved));
        after_change();
        copy_end[static_cast<size_t>(i)] =
            issue_copy(t, op.to_device_ms, to_device_free, res.to_device_busy_ms);
        res.bytes_to_device += static_cast<int64_t>(op.bytes);
      }
      for (int32_t i : s.prefetch_wait_before[static_cast<size_t>(m.node)]) {
        t = wait_copy(t, copy_end[static_cast<size_t>(i)]);
        host.free(host_copy[static_cast<size_t>(i)]);
        host_copy[static_cast<size_t>(i)] = nullptr;
      }
      // Widenings after the copies back and before the program: the f32 block, then the narrow
      // form goes; the base free of the tensor frees the widened block.
      for (int32_t sv : s.widen_before[static_cast<size_t>(m.node)]) {
        const ProfileSaved& saved = p.saved[static_cast<size_t>(sv)];
        const ProfileValue& root = p.values[static_cast<size_t>(saved.value)];
        Block* wide = alloc_(root.bytes, Category::activation, widen_tag(p, sv));
        after_change();
        REGEN_CHECK(narrow_block[static_cast<size_t>(sv)] != nullptr, "simulator: saved tensor ",
                    sv, " is widened but was not narrowed");
        free_(narrow_block[static_cast<size_t>(sv)]);
        narrow_block[static_cast<size_t>(sv)] = nullptr;
        live[saved_base[static_cast<size_t>(sv)]] = wide;
        shift += p.compress_cost.widen_ms(root.bytes);
      }
      const int32_t pi = s.program_of_node[static_cast<size_t>(m.node)];
      if (pi >= 0) {
        run_program(s.programs[static_cast<size_t>(pi)]);
        shift += s.programs[static_cast<size_t>(pi)].time_ms;
      }
    } else if (m.kind == MarkerKind::optimizer_begin && !s.state_groups.empty()) {
      run_state_stream(now);
    }
    if (opt.timeline) {
      TimelinePoint tp;
      tp.time_ms = m.time_ms;
      tp.label = std::string(marker_name(m.kind)) +
                 (m.node >= 0 ? " " + p.nodes[static_cast<size_t>(m.node)].name : "");
      MemoryStats st = sim.stats();
      for (int i = 0; i < kNumCategories; ++i) tp.allocated_by[i] = st.allocated_by[i].current;
      tp.reserved = st.reserved.current;
      res.timeline.push_back(std::move(tp));
    }
  };

  // Events [from, to) with the markers at positions from..to whose indices are in [lo, hi).
  auto replay_events = [&](size_t from, size_t to, size_t lo, size_t hi) {
    for (size_t i = from; i <= to; ++i) {
      for (size_t m : markers_at_[i]) {
        if (m >= lo && m < hi) on_marker(p.markers[m]);
      }
      if (i == to) break;
      const ProfileEvent& e = p.events[i];
      if (e.kind == MemoryEventKind::alloc) {
        live[e.block_id] = alloc_(static_cast<uint64_t>(e.requested), e.category, tags_[i]);
        after_change();
      } else if (e.kind == MemoryEventKind::free) {
        auto it = live.find(e.block_id);
        REGEN_CHECK(it != live.end(), "simulator: the profile frees block ", e.block_id,
                    " that was never allocated");
        if (it->second) free_(it->second);
        live.erase(it);
      }
      // Segment events follow from the allocations; the simulated allocator makes its own.
    }
  };
  try {
    const int64_t micro = p.micro_batch_marker();
    if (micro < 0) {
      replay_events(0, p.events.size(), 0, p.markers.size());
    } else {
      // Gradient accumulation: the first micro-batch's events (and markers, the micro_batch_end
      // one included) once per micro-batch, then the optimizer's.
      const size_t end = static_cast<size_t>(p.markers[static_cast<size_t>(micro)].position);
      const size_t split = static_cast<size_t>(micro) + 1;
      for (int64_t k = 0; k < p.accumulate; ++k) {
        repeating = k > 0;
        replay_events(0, end, 0, split);
      }
      repeating = false;
      replay_events(end, p.events.size(), split, p.markers.size());
    }
  } catch (const OutOfMemory& e) {
    if (opt.limit <= 0) throw;  // the null arena never runs out without a limit
    res.oom = true;
    res.oom_message = e.message();
    if (last_marker >= 0) {
      const Marker& m = p.markers[static_cast<size_t>(last_marker)];
      res.oom_at = std::string(marker_name(m.kind)) +
                   (m.node >= 0 ? " " + p.nodes[static_cast<size_t>(m.node)].name : "");
    }
  }
  res.cache_flushes = sim.stats().num_cache_flushes - flushes_before;
  if (opt.limit > 0) res.next_limit = sim.lowest_refused();
  if (dtr) {
    if (dtr->in_step()) dtr->end_step();  // ran out of memory in the middle
    if (opt.dtr_stats) *opt.dtr_stats = dtr->last();
    dtr_handler.reset();
  }
  for (const std::vector<int32_t>& e : s.evict_after)
    res.evictions += static_cast<int64_t>(e.size());

  const MemoryStats st = sim.stats();
  res.peak_allocated = st.allocated.peak;
  res.peak_reserved = st.reserved.peak;
  res.peak_requested = st.requested.peak;
  res.allocated_by_at_peak = st.allocated_by_at_peak;
  for (int i = 0; i < kNumCategories; ++i) res.peak_by[i] = st.allocated_by[i].peak;
  std::stable_sort(best_live.begin(), best_live.end(),
                   [](const LiveBlockRec& a, const LiveBlockRec& b) { return a.bytes > b.bytes; });
  if (opt.top_live > 0 && static_cast<int>(best_live.size()) > opt.top_live) {
    best_live.resize(static_cast<size_t>(opt.top_live));
  }
  res.live_at_peak = std::move(best_live);
  if (best_marker >= 0) {
    const Marker& m = p.markers[static_cast<size_t>(best_marker)];
    res.peak_at = std::string(marker_name(m.kind)) +
                  (m.node >= 0 ? " " + p.nodes[static_cast<size_t>(m.node)].name : "");
  }
  res.recompute_ms = s.recompute_ms;
  res.replays = s.replays;
  res.narrowed = s.narrowed;
  res.compress_ms = s.compress_ms;
  // Every micro-batch recomputes, narrows and widens what the schedule says; evictions, replays
  // and narrowed tensors above are one micro-batch's, as the executor counts them (per backward).
  res.time_ms = p.iteration_ms +
                static_cast<double>(p.accumulate) * (s.recompute_ms + s.compress_ms) + res.stall_ms;
  const MemoryStats hs = host.stats();
  res.host_peak_allocated = hs.allocated.peak;
  res.host_peak_reserved = hs.reserved.peak;
  res.host_peak_requested = hs.requested.peak;
  for (int i = 0; i < kNumCategories; ++i) res.host_peak_by[i] = hs.allocated_by[i].peak;
  return res;
}

StartLayouts start_layouts(const Profile& p, const Schedule& s) {
  CachingAllocator dev(make_null_arena(Device::cpu()));
  CachingAllocator host(make_null_arena(Device::cpu()));
  dev.restore_state(p.start_state);
  if (s.optimizer_state == StatePlace::host) {
    for (const StateGroup& g : s.state_groups) {
      for (size_t k = 0; k < g.block.size(); ++k) {
        host.allocate(static_cast<uint64_t>(g.requested[k]), Category::optimizer_state,
                      intern_tag(g.tag[k]));
        Block* b = dev.block_by_id(g.block[k]);
        REGEN_CHECK(b, "start layout: optimizer state block ", g.block[k], " is not live");
        dev.free(b);
      }
    }
    dev.empty_cache();
  }
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

Profile load_profile(const std::string& path) {
  return profile_from_json(read_file(path), "profile '" + path + "'");
}

}  // namespace regen
