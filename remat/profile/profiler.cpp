// The profiler (profiler.h).
#include "regen/remat/profile/profiler.h"
#include "regen/remat/profile/transfer.h"

#include <omp.h>
#include <algorithm>
#include <chrono>
#include <ctime>
#include <map>

#include "regen/core/numeric.h"
#include "regen/kernels/kernels.h"
#include "regen/remat/plan/compress.h"
#include "regen/remat/profile/distributed.h"

namespace regen {
namespace {

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

// Records one instrumented iteration.
class Recorder final : public TapeHooks, public StepObserver {
 public:
  Recorder(Device device, bool device_timing)
      : device_(device), device_timing_(device_timing), timeline_(device) {}

  // StepObserver
  void on_iteration_begin(CachingAllocator& a) override {
    alloc_ = &a;
    state_ = a.snapshot_state();
    start_ = live_layout(state_);
    const MemoryStats st = a.stats();
    for (int i = 0; i < kNumCategories; ++i) persistent_[i] = st.allocated_by[i].current;
    a.clear_events();
    a.set_event_log(true);
    t0_ = std::chrono::steady_clock::now();
    mark(MarkerKind::iteration_begin, -1);
  }
  void on_optimizer_begin(CachingAllocator&) override { mark(MarkerKind::optimizer_begin, -1); }
  void on_optimizer_end(CachingAllocator&) override { mark(MarkerKind::optimizer_end, -1); }
  void on_iteration_end(CachingAllocator& a) override {
    mark(MarkerKind::iteration_end, -1);
    if (device_timing_) {  // every marker's point, now that the device has passed the last
      const std::vector<double> ms = timeline_.elapsed();
      REGEN_ASSERT(ms.size() == markers_.size());
      for (size_t i = 0; i < ms.size(); ++i) markers_[i].time_ms = ms[i];
    }
    events_ = a.events();
    a.set_event_log(false);
    stats_ = a.stats();
  }
  void on_micro_batch_end(CachingAllocator& a, int64_t index) override {
    // The graph and allocation ids are the last micro-batch's (each one records them over the
    // one before): under data parallelism only the last one communicates, and the profile keeps
    // it.
    mark(MarkerKind::micro_batch_end, -1);
    micro_ends_.push_back({a.event_count(), markers_.size()});
    micro_ = index + 1;
  }

  // TapeHooks
  void on_forward_begin(Tape&, int32_t node) override { mark(MarkerKind::fwd_begin, node); }
  void on_forward_end(Tape& tape, int32_t node, const std::vector<Tensor>& outputs) override {
    mark(MarkerKind::fwd_end, node);
    const Node& n = tape.node(node);
    for (size_t k = 0; k < outputs.size(); ++k) {
      const auto& storage = outputs[k].impl()->storage;
      alloc_ids_.resize(std::max<size_t>(alloc_ids_.size(), static_cast<size_t>(n.outputs[k]) + 1),
                        0);
      alloc_ids_[static_cast<size_t>(n.outputs[k])] = storage ? storage->alloc_id() : 0;
    }
  }
  void on_backward_start(Tape& tape) override {
    mark(MarkerKind::backward_start, -1);
    // The graph as plain records, with no reference to any storage: a copy of the tape's Values
    // would hold what they hold (a small leaf's `held` storage, a leaf's tensor), keep it alive
    // into the next step and shift that step's allocator state.
    nodes_.clear();
    for (const Node& n : tape.nodes()) {
      ProfileNode pn;
      pn.index = n.index;
      pn.kind = n.kind;
      pn.op = op_name(n.kind);
      pn.name = tag_name(n.tag);
      pn.scope = tag_name(n.scope);
      pn.block = n.block;
      pn.is_view = op_def(n.kind).is_view;
      pn.num_visible_outputs = n.num_visible_outputs;
      pn.inputs = n.inputs;
      pn.outputs = n.outputs;
      pn.saved = n.saved;
      pn.packed = n.packed;
      nodes_.push_back(std::move(pn));
    }
    values_.clear();
    for (const Value& v : tape.values()) {
      ProfileValue pv;
      pv.id = v.id;
      pv.producer = v.producer;
      pv.slot = v.slot;
      pv.root = v.root;
      pv.shape = v.shape;
      pv.dtype = v.dtype;
      pv.bytes = v.bytes;
      pv.leaf = v.producer < 0;
      // Whether a leaf can still be read when backward runs (a replay reads leaves directly):
      // parameters and saved leaves always; an input the tape holds only weakly while its owner
      // keeps it.
      pv.available = !pv.leaf || tape.value_resident(v.id);
      values_.push_back(std::move(pv));
    }
    saved_.clear();
    for (const SavedTensor& st : tape.saved()) {
      ProfileSaved ps;
      ps.value = st.value;
      ps.bytes = st.bytes;
      ps.category = st.category;
      saved_.push_back(std::move(ps));
    }
    backward_order_ = tape.backward_order();
    blocks_.clear();
    for (const BlockInfoRec& b : tape.blocks()) blocks_.push_back(tag_name(b.name));
  }
  void on_backward_begin(Tape&, int32_t node) override { mark(MarkerKind::bwd_begin, node); }
  void on_backward_end(Tape&, int32_t node) override { mark(MarkerKind::bwd_end, node); }
  void on_backward_finish(Tape&) override { mark(MarkerKind::backward_finish, -1); }

  void mark(MarkerKind kind, int32_t node) {
    Marker m;
    m.kind = kind;
    m.node = node;
    m.position = alloc_ ? alloc_->event_count() : 0;
    if (device_timing_) {
      timeline_.mark();  // its time once the iteration ends
    } else {
      kernels::synchronize(device_);  // op timings on an asynchronous device
      m.time_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    }
    markers_.push_back(m);
  }

  Device device_;
  bool device_timing_ = false;
  kernels::DeviceTimeline timeline_;
  CachingAllocator* alloc_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
  AllocatorState state_;
  std::array<int64_t, kNumCategories> persistent_{};
  std::vector<Marker> markers_;
  std::vector<MemoryEvent> events_;
  MemoryStats stats_;
  LiveLayout start_;
  std::vector<uint64_t> alloc_ids_;
  std::vector<ProfileNode> nodes_;
  std::vector<ProfileValue> values_;
  std::vector<ProfileSaved> saved_;
  std::vector<int32_t> backward_order_;
  std::vector<std::string> blocks_;
  // With accumulation: per micro-batch, the event count and marker count at its end (its
  // micro_batch_end marker included).
  struct MicroEnd {
    uint64_t events;
    size_t markers;
  };
  std::vector<MicroEnd> micro_ends_;
  int64_t micro_ = 0;  // micro-batches finished
};

// A request or free as the comparison of two micro-batches or iterations sees it.
bool same_request(const MemoryEvent& a, const MemoryEvent& b) {
  return a.kind == b.kind && a.requested == b.requested && a.category == b.category;
}

// From the first marker of kind a to the first of kind b after it.
double span(const std::vector<Marker>& ms, MarkerKind a, MarkerKind b) {
  double ta = 0;
  bool seen = false;
  for (const Marker& m : ms) {
    if (!seen && m.kind == a) {
      ta = m.time_ms;
      seen = true;
    } else if (seen && m.kind == b) {
      return m.time_ms - ta;
    }
  }
  return 0;
}

}  // namespace

Profile profile_training(Trainer& trainer, const ProfileOptions& options) {
  REGEN_CHECK(options.iterations >= 1, "profile: needs at least one instrumented iteration, got ",
              options.iterations);
  REGEN_CHECK(options.warmup >= 0, "profile: warm-up iterations must be non-negative");
  for (int i = 0; i < options.warmup; ++i) {
    const StepResult r = trainer.step();
    if (options.on_step) options.on_step(r);
  }
  const bool device_timing = options.op_timing == OpTiming::device && !dry_run_active();
  std::vector<Recorder> runs;
  runs.reserve(static_cast<size_t>(options.iterations));
  for (int i = 0; i < options.iterations; ++i) {
    runs.emplace_back(trainer.device(), device_timing);
    Recorder& r = runs.back();
    const HooksScope hooks(&r);
    const StepResult result = trainer.step(&r);
    if (options.on_step) options.on_step(result);
  }
  const Recorder& first = runs.front();
  // Every instrumented iteration must start from the same allocator state (Trainer::step's
  // canonical start) and make the same requests: the plan made from the first holds for the
  // others, and for every later step, only then.
  for (size_t i = 1; i < runs.size(); ++i) {
    const std::string diff = describe_layout_difference(first.start_, runs[i].start_);
    REGEN_CHECK(diff.empty(), "profile: iteration ", i + 1,
                " did not start from the allocator state iteration 1 started from: ", diff,
                ". Something outlives a training step (a tensor kept from the step before?), so "
                "no step's memory can be predicted from another's");
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    const Recorder& r = runs[i];
    const std::vector<MemoryEvent>& a = first.events_;
    const std::vector<MemoryEvent>& b = r.events_;
    size_t e = 0;
    while (e < a.size() && e < b.size() && a[e].kind == b[e].kind && a[e].bytes == b[e].bytes &&
           a[e].requested == b[e].requested) {
      ++e;
    }
    if (e == a.size() && e == b.size() && r.markers_.size() == first.markers_.size()) continue;
    auto describe = [](const std::vector<MemoryEvent>& ev, size_t k) {
      if (k >= ev.size()) return std::string("no event (the iteration had ended)");
      const MemoryEvent& m = ev[k];
      std::string d =
          std::string(memory_event_name(m.kind)) + " of " + std::to_string(m.bytes) + " bytes";
      if (m.kind == MemoryEventKind::alloc || m.kind == MemoryEventKind::free) {
        d += " (" + std::to_string(m.requested) + " requested, " + category_name(m.category);
        const std::string tag = tag_name(m.tag);
        if (!tag.empty()) d += ", '" + tag + "'";
        d += ")";
      }
      return d;
    };
    REGEN_FAIL("profile: iteration ", i + 1, " made different allocations than iteration 1: at ",
               "event ", e + 1, " it made ", describe(b, e), " where iteration 1 made ",
               describe(a, e), " (from the same allocator state): the model is not static ",
               "(data-dependent shapes?) and cannot be planned");
  }

  Profile p;
  p.model = options.model_name;
  p.run = options.run;
  p.batch = trainer.batch_size();
  p.device = trainer.device().str();
  p.threads = omp_get_max_threads();
  p.date = today();
  p.iterations = options.iterations;
  p.op_timing = device_timing ? OpTiming::device : OpTiming::sync;
  p.start_state = first.state_;
  p.markers = first.markers_;
  p.accumulate = trainer.accumulation();
  std::vector<MemoryEvent> events = first.events_;
  if (p.accumulate > 1) {
    const std::vector<Recorder::MicroEnd>& ends = first.micro_ends_;
    REGEN_CHECK(static_cast<int64_t>(ends.size()) == p.accumulate, "profile: ", ends.size(),
                " micro-batches ended in a step of ", p.accumulate);
    // Each micro-batch must make the first one's requests and frees, in order (their segments
    // differ: the later ones find the first one's in the cache), except that under data
    // parallelism the last one also makes the sync's (category communication: its collectives'
    // scratch), which the earlier ones, run without the sync's hooks, do not.
    auto requests = [&](uint64_t from, uint64_t to, bool with_communication) {
      std::vector<MemoryEvent> out;
      for (uint64_t i = from; i < to; ++i) {
        const MemoryEvent& e = first.events_[i];
        if (e.kind != MemoryEventKind::alloc && e.kind != MemoryEventKind::free) continue;
        if (!with_communication && e.category == Category::communication) continue;
        out.push_back(e);
      }
      return out;
    };
    const std::vector<MemoryEvent> one = requests(0, ends[0].events, true);
    std::map<uint64_t, std::string> open;  // blocks the first micro-batch leaves allocated
    for (const MemoryEvent& e : one) {
      REGEN_CHECK(e.category != Category::communication, "profile: the first micro-batch of an ",
                  "accumulated step communicates ('", tag_name(e.tag),
                  "'): only the last one may, under data parallelism");
      if (e.kind == MemoryEventKind::alloc) open[e.block_id] = tag_name(e.tag);
      if (e.kind == MemoryEventKind::free) open.erase(e.block_id);
    }
    REGEN_CHECK(open.empty(), "profile: the first micro-batch of an accumulated step leaves ",
                open.size(), " block(s) allocated (the first '",
                open.empty() ? "" : open.begin()->second,
                "'), so the micro-batches do not repeat: release what a micro-batch makes");
    for (size_t k = 1; k < ends.size(); ++k) {
      const bool last = k + 1 == ends.size();
      const std::vector<MemoryEvent> other = requests(ends[k - 1].events, ends[k].events, !last);
      size_t e = 0;
      while (e < one.size() && e < other.size() && same_request(one[e], other[e])) ++e;
      REGEN_CHECK(e == one.size() && e == other.size(), "profile: micro-batch ", k + 1,
                  " made other requests than micro-batch 1 (at request ", e + 1,
                  "): the model is not static and cannot be planned");
      // The same markers too (iteration_begin is the first micro-batch's besides its own).
      REGEN_CHECK(ends[k].markers - ends[k - 1].markers == ends[0].markers - 1,
                  "profile: micro-batch ", k + 1, " ran another graph than micro-batch 1 (",
                  ends[k].markers - ends[k - 1].markers, " markers, not ", ends[0].markers - 1,
                  "): the model is not static and cannot be planned");
    }
    // The profile keeps the last micro-batch (the graph and allocation ids are its own) and what
    // follows it, behind the iteration_begin marker. Its markers' times are moved back by the
    // earlier micro-batches', so that they are one micro-batch's from the start; the optimizer's
    // keep theirs (the step's).
    const size_t last_events = static_cast<size_t>(ends[ends.size() - 2].events);
    const size_t last_markers = ends[ends.size() - 2].markers;
    const size_t tail_markers = ends.back().markers;
    events.assign(first.events_.begin() + static_cast<int64_t>(last_events), first.events_.end());
    const double shift = first.markers_[last_markers].time_ms - first.markers_[1].time_ms;
    p.markers.assign(first.markers_.begin(), first.markers_.begin() + 1);
    for (size_t m = last_markers; m < first.markers_.size(); ++m) {
      Marker mk = first.markers_[m];
      mk.position -= last_events;
      if (m < tail_markers) mk.time_ms -= shift;
      p.markers.push_back(mk);
    }
  }
  for (const MemoryEvent& e : events) {
    ProfileEvent pe;
    pe.kind = e.kind;
    pe.block_id = e.block_id;
    pe.bytes = e.bytes;
    pe.requested = e.requested;
    pe.category = e.category;
    pe.tag = tag_name(e.tag);
    pe.time_ms = e.time_ns / 1e6;
    p.events.push_back(std::move(pe));
  }
  p.peak_allocated = first.stats_.allocated.peak;
  p.peak_reserved = first.stats_.reserved.peak;
  p.allocated_by_at_peak = first.stats_.allocated_by_at_peak;
  p.persistent_by = first.persistent_;
  // The graph.
  p.nodes = first.nodes_;
  p.values = first.values_;
  for (ProfileValue& pv : p.values) {
    const uint64_t root = static_cast<uint64_t>(pv.root);
    pv.alloc_id = (!pv.leaf && root < first.alloc_ids_.size()) ? first.alloc_ids_[root] : 0;
  }
  p.saved = first.saved_;
  p.backward_order = first.backward_order_;
  p.blocks = first.blocks_;

  // Timings: medians over the instrumented iterations.
  const size_t nn = p.nodes.size();
  std::vector<std::vector<double>> fwd(nn), bwd(nn);
  std::vector<double> iter, fw, bw, opt;
  for (const Recorder& r : runs) {
    std::vector<double> fb(nn, -1), bb(nn, -1);
    for (const Marker& m : r.markers_) {
      if (m.node < 0 || static_cast<size_t>(m.node) >= nn) continue;
      const size_t n = static_cast<size_t>(m.node);
      if (m.kind == MarkerKind::fwd_begin) fb[n] = m.time_ms;
      if (m.kind == MarkerKind::fwd_end) fwd[n].push_back(m.time_ms - fb[n]);
      if (m.kind == MarkerKind::bwd_begin) bb[n] = m.time_ms;
      if (m.kind == MarkerKind::bwd_end) bwd[n].push_back(m.time_ms - bb[n]);
    }
    iter.push_back(span(r.markers_, MarkerKind::iteration_begin, MarkerKind::iteration_end));
    // One micro-batch's forward and backward (the first's: span takes the first markers).
    fw.push_back(span(r.markers_, MarkerKind::iteration_begin, MarkerKind::backward_start));
    bw.push_back(span(r.markers_, MarkerKind::backward_start, MarkerKind::backward_finish));
    opt.push_back(span(r.markers_, MarkerKind::optimizer_begin, MarkerKind::optimizer_end));
  }
  for (size_t n = 0; n < nn; ++n) {
    p.nodes[n].fwd_ms = median(fwd[n]);
    p.nodes[n].bwd_ms = median(bwd[n]);
  }
  p.iteration_ms = median(iter);
  p.forward_ms = median(fw);
  p.backward_ms = median(bw);
  p.optimizer_ms = median(opt);
  // The trainer's compression: its plans' schedules narrow what they retain
  // (remat/plan/compress.h); the conversions' time model is measured now, after the instrumented
  // steps.
  p.compress = trainer.compression();
  p.compress_cost = measure_compress_cost(trainer.device(), p.compress);
  validate_profile(p, "profile of " + p.model);
  finalize_profile(p);
  if (options.measure_transfer && !dry_run_active()) {
    p.transfer = measure_transfer(trainer.device(), {1ull << 20, 4ull << 20, 16ull << 20}, 3);
    p.transfer.source = "measured by regen profile on " + p.device + ", " + p.date;
    // The host tier keeps nothing: the measurement's segments go back to the system.
    host_allocator_for(trainer.device()).release_memory();
  }
  // Under mpirun, the job's profile: rank 0's, once every rank's memory record matched it.
  if (trainer.gradient_sync() != nullptr) return agree_on_profile(std::move(p));
  return p;
}

}  // namespace regen
