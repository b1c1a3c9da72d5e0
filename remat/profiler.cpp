// The profiler (profiler.h).
#include "regen/remat/profiler.h"

#include <omp.h>
#include <algorithm>
#include <chrono>
#include <ctime>

#include "regen/core/numeric.h"
#include "regen/kernels/kernels.h"

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
  explicit Recorder(Device device) : device_(device) {}

  // StepObserver
  void on_iteration_begin(CachingAllocator& a) override {
    alloc_ = &a;
    state_ = a.snapshot_state();
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
    events_ = a.events();
    a.set_event_log(false);
    stats_ = a.stats();
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
    // Copies without the tape's references: the profile must not keep tensors alive.
    graph_nodes_ = tape.nodes();
    graph_values_ = tape.values();
    // Whether each leaf can still be read when backward runs (a replay reads leaves directly):
    // parameters and saved leaves always; an input the tape holds only weakly while its owner
    // keeps it.
    leaf_available_.assign(graph_values_.size(), 1);
    for (const Value& v : graph_values_) {
      if (v.producer < 0) leaf_available_[static_cast<size_t>(v.id)] = tape.value_resident(v.id);
    }
    for (Value& v : graph_values_) {
      v.leaf.reset();
      v.leaf_storage.reset();
      v.held.reset();
    }
    graph_saved_ = tape.saved();
    for (SavedTensor& s : graph_saved_) s.storage.reset();
    backward_order_ = tape.backward_order();
    blocks_.clear();
    for (const BlockInfoRec& b : tape.blocks()) blocks_.push_back(tag_name(b.name));
  }
  void on_backward_begin(Tape&, int32_t node) override { mark(MarkerKind::bwd_begin, node); }
  void on_backward_end(Tape&, int32_t node) override { mark(MarkerKind::bwd_end, node); }
  void on_backward_finish(Tape&) override { mark(MarkerKind::backward_finish, -1); }

  void mark(MarkerKind kind, int32_t node) {
    kernels::synchronize(device_);  // op timings on an asynchronous device
    Marker m;
    m.kind = kind;
    m.node = node;
    m.position = alloc_ ? alloc_->event_count() : 0;
    m.time_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    markers_.push_back(m);
  }

  Device device_;
  CachingAllocator* alloc_ = nullptr;
  std::chrono::steady_clock::time_point t0_;
  AllocatorState state_;
  std::array<int64_t, kNumCategories> persistent_{};
  std::vector<Marker> markers_;
  std::vector<MemoryEvent> events_;
  MemoryStats stats_;
  std::vector<uint64_t> alloc_ids_;
  std::vector<Node> graph_nodes_;
  std::vector<Value> graph_values_;
  std::vector<char> leaf_available_;
  std::vector<SavedTensor> graph_saved_;
  std::vector<int32_t> backward_order_;
  std::vector<std::string> blocks_;
};

double span(const std::vector<Marker>& ms, MarkerKind a, MarkerKind b) {
  double ta = 0, tb = 0;
  for (const Marker& m : ms) {
    if (m.kind == a) ta = m.time_ms;
    if (m.kind == b) tb = m.time_ms;
  }
  return tb - ta;
}

}  // namespace

Profile profile_training(Trainer& trainer, const ProfileOptions& options) {
  REGEN_CHECK(options.iterations >= 1, "profile: needs at least one instrumented iteration, got ",
              options.iterations);
  REGEN_CHECK(options.warmup >= 0, "profile: warm-up iterations must be non-negative");
  for (int i = 0; i < options.warmup; ++i) trainer.step();
  std::vector<Recorder> runs;
  runs.reserve(static_cast<size_t>(options.iterations));
  for (int i = 0; i < options.iterations; ++i) {
    runs.emplace_back(trainer.device());
    Recorder& r = runs.back();
    const HooksScope hooks(&r);
    trainer.step(&r);
  }
  const Recorder& first = runs.front();
  // Every instrumented iteration must make the same requests: the models are static.
  for (size_t i = 1; i < runs.size(); ++i) {
    const Recorder& r = runs[i];
    bool same =
        r.events_.size() == first.events_.size() && r.markers_.size() == first.markers_.size();
    for (size_t e = 0; same && e < r.events_.size(); ++e) {
      same = r.events_[e].kind == first.events_[e].kind &&
             r.events_[e].bytes == first.events_[e].bytes &&
             r.events_[e].requested == first.events_[e].requested;
    }
    REGEN_CHECK(same, "profile: iteration ", i + 1,
                " made different allocations than iteration 1: ",
                "the model is not static (data-dependent shapes?) and cannot be planned");
  }

  Profile p;
  p.model = options.model_name;
  p.run = options.run;
  p.batch = trainer.batch_size();
  p.device = trainer.device().str();
  p.threads = omp_get_max_threads();
  p.date = today();
  p.iterations = options.iterations;
  p.start_state = first.state_;
  p.markers = first.markers_;
  for (const MemoryEvent& e : first.events_) {
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
  for (const Node& n : first.graph_nodes_) {
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
    p.nodes.push_back(std::move(pn));
  }
  for (const Value& v : first.graph_values_) {
    ProfileValue pv;
    pv.id = v.id;
    pv.producer = v.producer;
    pv.slot = v.slot;
    pv.root = v.root;
    pv.shape = v.shape;
    pv.dtype = v.dtype;
    pv.bytes = v.bytes;
    pv.leaf = v.producer < 0;
    pv.available = !pv.leaf || first.leaf_available_[static_cast<size_t>(v.id)];
    const int64_t root = v.root;
    pv.alloc_id = (!pv.leaf && static_cast<size_t>(root) < first.alloc_ids_.size())
                      ? first.alloc_ids_[static_cast<size_t>(root)]
                      : 0;
    p.values.push_back(std::move(pv));
  }
  for (const SavedTensor& s : first.graph_saved_) {
    ProfileSaved ps;
    ps.value = s.value;
    ps.bytes = s.bytes;
    ps.category = s.category;
    p.saved.push_back(std::move(ps));
  }
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
  validate_profile(p, "profile of " + p.model);
  finalize_profile(p);
  return p;
}

}  // namespace regen
