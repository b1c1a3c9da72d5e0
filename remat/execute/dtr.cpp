// DTR: the engine, its tape runtime, its simulation and its planners (dtr.h).
#include "regen/remat/execute/dtr.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <unordered_map>

#include "regen/core/error.h"
#include "regen/remat/plan/compress.h"
#include "regen/remat/plan/planner_parts.h"

namespace regen {

std::optional<DtrOptions> dtr_policy(const std::string& policy) {
  const PlannerInfo* p = find_planner(policy);
  return p ? p->at_step_time : std::nullopt;
}

// ---- The engine ---------------------------------------------------------------------------------

DtrEngine::DtrEngine(const Profile& profile, DtrOptions options, DtrRuntime& runtime)
    : p_(profile), o_(options), rt_(runtime) {
  const Profile& p = p_;
  const size_t nn = p.nodes.size(), ns = p.saved.size(), nv = p.values.size();
  auto saved_root = [&](int64_t v) -> int32_t {
    const ProfileValue& root = p.values[static_cast<size_t>(p.values[static_cast<size_t>(v)].root)];
    return root.leaf ? -1 : root.saved;
  };
  eligible_.assign(ns, 0);
  born_after_.assign(nn, {});
  for (size_t s = 0; s < ns; ++s) {
    const ProfileSaved& sv = p.saved[s];
    const ProfileValue& root = p.values[static_cast<size_t>(sv.value)];
    REGEN_CHECK(!sv.readers.empty(), "dtr: saved tensor ", s, " has no reader in the profile");
    // The tape creates a saved record when its first reader saves it.
    if (!root.leaf) born_after_[static_cast<size_t>(sv.readers.front())].push_back(int32_t(s));
    // What a static plan may recompute (ProfileSaved::candidate) minus the need to be last read
    // before the final forward op: DTR regenerates a forward read as well.
    bool replayable = !root.leaf && root.alloc_id != 0 && sv.bytes > 0;
    if (replayable) {
      // Every leaf a regeneration could reach must stay readable (ProfileValue::available).
      std::vector<int64_t> stack{root.id};
      std::vector<char> seen(nv, 0);
      while (replayable && !stack.empty()) {
        const int64_t v = stack.back();
        stack.pop_back();
        if (seen[static_cast<size_t>(v)]) continue;
        seen[static_cast<size_t>(v)] = 1;
        const ProfileValue& val = p.values[static_cast<size_t>(v)];
        if (val.leaf) {
          replayable = val.available;
          continue;
        }
        for (int64_t in : p.nodes[static_cast<size_t>(val.producer)].inputs) {
          if (in >= 0) stack.push_back(in);
        }
      }
    }
    eligible_[s] = replayable ? 1 : 0;
  }
  forward_reads_.assign(nn, {});
  backward_reads_.assign(nn, {});
  for (size_t n = 0; n < nn; ++n) {
    auto add = [](std::vector<int32_t>& to, int32_t s) {
      if (s >= 0 && std::find(to.begin(), to.end(), s) == to.end()) to.push_back(s);
    };
    for (int64_t in : p.nodes[n].inputs) {
      if (in >= 0) add(forward_reads_[n], saved_root(in));
    }
    for (int64_t v : p.nodes[n].saved) add(backward_reads_[n], saved_root(v));
  }
  released_at_rank_.assign(p.backward_order.size(), {});
  for (size_t s = 0; s < ns; ++s) {
    const ProfileSaved& sv = p.saved[s];
    if (p.values[static_cast<size_t>(sv.value)].leaf) continue;
    if (sv.first_bw_rank < 0) {
      unread_.push_back(static_cast<int32_t>(s));
    } else {
      released_at_rank_[static_cast<size_t>(sv.last_bw_rank)].push_back(static_cast<int32_t>(s));
    }
  }
  // Neighbours in the graph of storages: the roots a value's producer reads, and the roots of
  // the outputs of the ops that read it (through any view of it).
  cost_.assign(nv, 0);
  neighbours_.assign(nv, {});
  for (const ProfileValue& v : p.values) {
    if (v.leaf || v.root != v.id) continue;
    const size_t i = static_cast<size_t>(v.id);
    cost_[i] = p.nodes[static_cast<size_t>(v.producer)].fwd_ms;
    auto add = [&](int64_t u) {
      const ProfileValue& r = p.values[static_cast<size_t>(p.values[static_cast<size_t>(u)].root)];
      if (r.leaf || r.id == v.id) return;
      std::vector<int64_t>& to = neighbours_[i];
      if (std::find(to.begin(), to.end(), r.id) == to.end()) to.push_back(r.id);
    };
    for (int64_t in : p.nodes[static_cast<size_t>(v.producer)].inputs) {
      if (in >= 0) add(in);
    }
  }
  for (const ProfileValue& w : p.values) {
    const ProfileValue& r = p.values[static_cast<size_t>(w.root)];
    if (r.leaf) continue;
    for (int32_t c : w.consumers) {
      for (int64_t out : p.nodes[static_cast<size_t>(c)].outputs) {
        const int64_t o = p.values[static_cast<size_t>(out)].root;
        if (o == r.id || p.values[static_cast<size_t>(o)].leaf) continue;
        std::vector<int64_t>& a = neighbours_[static_cast<size_t>(r.id)];
        if (std::find(a.begin(), a.end(), o) == a.end()) a.push_back(o);
        std::vector<int64_t>& b = neighbours_[static_cast<size_t>(o)];
        if (std::find(b.begin(), b.end(), r.id) == b.end()) b.push_back(r.id);
      }
    }
  }
}

void DtrEngine::begin_step() {
  active_ = true;
  clock_ = 0;
  cur_ = DtrStats{};
  state_.assign(p_.saved.size(), State::unborn);
  last_access_.assign(p_.saved.size(), 0);
  pins_.assign(p_.saved.size(), 0);
  pinned_.clear();
  absent_.assign(p_.values.size(), 0);
  parent_.assign(p_.values.size(), -1);
  class_cost_.assign(p_.values.size(), 0);
}

int64_t DtrEngine::find(int64_t v) const {
  int64_t r = v;
  while (parent_[static_cast<size_t>(r)] != r) r = parent_[static_cast<size_t>(r)];
  while (parent_[static_cast<size_t>(v)] != r) {  // path compression
    const int64_t next = parent_[static_cast<size_t>(v)];
    parent_[static_cast<size_t>(v)] = r;
    v = next;
  }
  return r;
}

void DtrEngine::unite(int64_t a, int64_t b) {
  int64_t ra = find(a), rb = find(b);
  if (ra == rb) return;
  if (rb < ra) std::swap(ra, rb);  // the smaller id is the class's root: a fixed rule
  parent_[static_cast<size_t>(rb)] = ra;
  class_cost_[static_cast<size_t>(ra)] += class_cost_[static_cast<size_t>(rb)];
}

void DtrEngine::mark_absent(int64_t v) {
  const size_t i = static_cast<size_t>(v);
  if (absent_[i]) return;
  absent_[i] = 1;
  if (parent_[i] < 0) parent_[i] = v;
  class_cost_[static_cast<size_t>(find(v))] += cost_[i];
  for (int64_t u : neighbours_[i]) {
    if (absent_[static_cast<size_t>(u)]) unite(v, u);
  }
}

void DtrEngine::mark_present(int64_t v) {
  const size_t i = static_cast<size_t>(v);
  if (!absent_[i]) return;
  absent_[i] = 0;
  double& c = class_cost_[static_cast<size_t>(find(v))];
  c = std::max(0.0, c - cost_[i]);
}

double DtrEngine::score(int32_t s) const {
  const int64_t v = p_.saved[static_cast<size_t>(s)].value;
  double cost = cost_[static_cast<size_t>(v)];
  // The evicted neighbourhood: each adjacent class once.
  int64_t seen[16];
  size_t n_seen = 0;
  std::vector<int64_t> more;
  for (int64_t u : neighbours_[static_cast<size_t>(v)]) {
    if (!absent_[static_cast<size_t>(u)]) continue;
    const int64_t r = find(u);
    bool dup = std::find(seen, seen + n_seen, r) != seen + n_seen ||
               std::find(more.begin(), more.end(), r) != more.end();
    if (dup) continue;
    if (n_seen < 16) {
      seen[n_seen++] = r;
    } else {
      more.push_back(r);
    }
    cost += class_cost_[static_cast<size_t>(r)];
  }
  const double staleness =
      static_cast<double>(std::max<int64_t>(1, clock_ - last_access_[static_cast<size_t>(s)]));
  const double bytes = static_cast<double>(p_.saved[static_cast<size_t>(s)].bytes);
  return cost / (bytes * staleness);
}

bool DtrEngine::evictable(int32_t s) const {
  const size_t i = static_cast<size_t>(s);
  return state_[i] == State::resident && eligible_[i] && pins_[i] == 0;
}

int32_t DtrEngine::cheapest() const {
  int32_t best = -1;
  double best_h = std::numeric_limits<double>::infinity();
  for (size_t s = 0; s < state_.size(); ++s) {
    if (!evictable(static_cast<int32_t>(s))) continue;
    const double h = score(static_cast<int32_t>(s));
    if (best < 0 || h < best_h) {  // ties: the lower index, a fixed rule
      best = static_cast<int32_t>(s);
      best_h = h;
    }
  }
  return best;
}

void DtrEngine::evict(int32_t s) {
  rt_.evict(s);
  state_[static_cast<size_t>(s)] = State::evicted;
  mark_absent(p_.saved[static_cast<size_t>(s)].value);
  ++cur_.evictions;
}

bool DtrEngine::evict_window(const EvictionRequest& request) {
  // The blocks of every evictable saved tensor, by allocation id.
  std::unordered_map<uint64_t, int32_t> of_block;
  for (size_t s = 0; s < state_.size(); ++s) {
    if (evictable(static_cast<int32_t>(s))) of_block[rt_.block_id(static_cast<int32_t>(s))] = s;
  }
  if (of_block.empty()) return false;
  const std::vector<BlockInfo> blocks = rt_.layout();
  // Per segment of the request's pool, runs of blocks that are free or evictable; in each run the
  // cheapest window (sum of scores) whose bytes hold the request. Segments are compared by their
  // order in the layout, never by id or address, so every arena picks the same window.
  double best_cost = std::numeric_limits<double>::infinity();
  std::vector<int32_t> best;
  size_t i = 0;
  while (i < blocks.size()) {
    size_t end = i;
    while (end < blocks.size() && blocks[end].segment_id == blocks[i].segment_id) ++end;
    if (blocks[i].small_pool == request.small) {
      // Two pointers over [lo, hi): sizes and scores are non-negative.
      size_t lo = i;
      uint64_t bytes = 0;
      double cost = 0;
      for (size_t hi = i; hi < end; ++hi) {
        const BlockInfo& b = blocks[hi];
        int32_t s = -1;
        if (b.allocated) {
          const auto it = of_block.find(b.id);
          if (it == of_block.end()) {  // a block DTR cannot free: windows stop here
            lo = hi + 1;
            bytes = 0;
            cost = 0;
            continue;
          }
          s = it->second;
        }
        bytes += b.size;
        cost += s >= 0 ? score(s) : 0.0;
        // Shrink from the left while the window still holds the request.
        while (lo < hi) {
          const BlockInfo& l = blocks[lo];
          if (bytes - l.size < request.rounded) break;
          bytes -= l.size;
          if (l.allocated) cost -= score(of_block.at(l.id));
          ++lo;
        }
        if (bytes >= request.rounded && cost < best_cost) {
          best_cost = cost;
          best.clear();
          for (size_t k = lo; k <= hi; ++k) {
            if (blocks[k].allocated) best.push_back(of_block.at(blocks[k].id));
          }
        }
      }
    }
    i = end;
  }
  if (best.empty()) return false;
  for (int32_t s : best) evict(s);
  ++cur_.windows;
  return true;
}

bool DtrEngine::evict_for(const EvictionRequest& request) {
  if (!active_) return false;
  if (o_.coop && evict_window(request)) return true;
  const int32_t s = cheapest();
  if (s < 0) return false;
  evict(s);
  return true;
}

void DtrEngine::pin(int32_t s) {
  ++pins_[static_cast<size_t>(s)];
  pinned_.push_back(s);
}

void DtrEngine::unpin(int32_t s) {
  auto it = std::find(pinned_.rbegin(), pinned_.rend(), s);
  REGEN_ASSERT(it != pinned_.rend());
  pinned_.erase(std::next(it).base());
  --pins_[static_cast<size_t>(s)];
}

void DtrEngine::unpin_all() {
  for (int32_t s : pinned_) --pins_[static_cast<size_t>(s)];
  pinned_.clear();
}

void DtrEngine::abort_op() {
  if (active_) unpin_all();
}

void DtrEngine::regenerate(std::vector<int32_t> targets) {
  RegenProgram prog;
  prog.targets = std::move(targets);
  std::vector<Residency> res(state_.size(), Residency::released);
  for (size_t s = 0; s < state_.size(); ++s) {
    if (state_[s] == State::resident) res[s] = Residency::resident;
    if (state_[s] == State::evicted) res[s] = Residency::evicted;
  }
  // DTR rematerializes every evicted tensor a replay recomputes (keep_chain).
  fill_regeneration_program(p_, res, true, prog);
  // What the program reads from outside, and what it restores, may not be evicted while a later
  // step still reads it (DTR locks an op's inputs while it runs); a restored tensor the program
  // no longer reads is evictable again at once, unless the op reads it (a target: pinned by the
  // op until it ends).
  const size_t n_steps = prog.steps.size();
  std::vector<std::vector<int32_t>> restored_at(n_steps), unpin_after(n_steps);
  std::vector<size_t> last_read(state_.size(), 0);
  std::vector<char> produced(p_.values.size(), 0), held(state_.size(), 0);
  std::vector<int32_t> held_list;
  for (size_t i = 0; i < n_steps; ++i) {
    const ReplayStep& st = prog.steps[i];
    for (int64_t in : st.inputs) {
      if (in < 0) continue;
      const ProfileValue& root =
          p_.values[static_cast<size_t>(p_.values[static_cast<size_t>(in)].root)];
      if (root.leaf || root.saved < 0) continue;
      if (produced[static_cast<size_t>(root.id)] ||
          state_[static_cast<size_t>(root.saved)] == State::resident) {
        last_read[static_cast<size_t>(root.saved)] = i;
        if (!held[static_cast<size_t>(root.saved)]) {
          held[static_cast<size_t>(root.saved)] = 1;
          held_list.push_back(root.saved);
        }
      }
    }
    const ProfileNode& n = p_.nodes[static_cast<size_t>(st.node)];
    for (size_t k = 0; k < st.outputs.size(); ++k) {
      produced[static_cast<size_t>(n.outputs[k])] = 1;
      if (st.outputs[k].fate != ReplayStep::Fate::restore) continue;
      const int32_t s = st.outputs[k].saved;
      restored_at[i].push_back(s);
      if (!held[static_cast<size_t>(s)]) {
        held[static_cast<size_t>(s)] = 1;
        held_list.push_back(s);
        last_read[static_cast<size_t>(s)] = i;
      }
    }
  }
  for (int32_t s : held_list) {
    if (std::find(prog.targets.begin(), prog.targets.end(), s) != prog.targets.end()) continue;
    pin(s);
    unpin_after[last_read[static_cast<size_t>(s)]].push_back(s);
  }
  for (int32_t s : prog.targets) pin(s);  // the op reads them: pinned until it ends
  rt_.run_program(prog, [&](size_t i) {
    ++clock_;
    for (int32_t s : restored_at[i]) {
      state_[static_cast<size_t>(s)] = State::resident;
      mark_present(p_.saved[static_cast<size_t>(s)].value);
      last_access_[static_cast<size_t>(s)] = clock_;
    }
    for (int32_t s : unpin_after[i]) {
      last_access_[static_cast<size_t>(s)] = clock_;
      unpin(s);
    }
  });
  ++cur_.programs;
  cur_.replays += static_cast<int64_t>(n_steps);
  cur_.recompute_ms += prog.time_ms;
}

void DtrEngine::before_forward(int32_t node) {
  if (node == 0) begin_step();
  REGEN_CHECK(active_ && node >= 0 && static_cast<size_t>(node) < p_.nodes.size(), "dtr: op ", node,
              " outside a step the profile describes");
  ++clock_;
  std::vector<int32_t> targets;
  for (int32_t s : forward_reads_[static_cast<size_t>(node)]) {
    const State st = state_[static_cast<size_t>(s)];
    if (st == State::unborn) continue;  // not saved yet: its owner holds it
    REGEN_CHECK(st != State::released, "dtr: op ", p_.nodes[static_cast<size_t>(node)].name,
                " reads saved tensor ", p_.saved[static_cast<size_t>(s)].name,
                " after its release");
    pin(s);
    last_access_[static_cast<size_t>(s)] = clock_;
    if (st == State::evicted) targets.push_back(s);
  }
  if (!targets.empty()) {
    ++cur_.forward_programs;
    regenerate(std::move(targets));
  }
}

void DtrEngine::after_forward(int32_t node) {
  const ProfileNode& n = p_.nodes[static_cast<size_t>(node)];
  for (int64_t out : n.outputs) {
    const ProfileValue& v = p_.values[static_cast<size_t>(out)];
    // A value no op saves can only be had again by replaying it: part of any neighbourhood.
    if (v.root == v.id && !v.leaf && v.saved < 0) mark_absent(v.id);
  }
  for (int32_t s : born_after_[static_cast<size_t>(node)]) {
    state_[static_cast<size_t>(s)] = State::resident;
    last_access_[static_cast<size_t>(s)] = clock_;
  }
  unpin_all();
}

void DtrEngine::backward_start() {
  for (int32_t s : unread_) {
    state_[static_cast<size_t>(s)] = State::released;
    mark_absent(p_.saved[static_cast<size_t>(s)].value);
  }
}

void DtrEngine::before_backward(int32_t node) {
  ++clock_;
  std::vector<int32_t> targets;
  for (int32_t s : backward_reads_[static_cast<size_t>(node)]) {
    const State st = state_[static_cast<size_t>(s)];
    REGEN_CHECK(st == State::resident || st == State::evicted, "dtr: backward of ",
                p_.nodes[static_cast<size_t>(node)].name, " reads saved tensor ",
                p_.saved[static_cast<size_t>(s)].name, ", which is not held");
    pin(s);
    last_access_[static_cast<size_t>(s)] = clock_;
    if (st == State::evicted) targets.push_back(s);
  }
  if (!targets.empty()) regenerate(std::move(targets));
}

void DtrEngine::after_backward(int32_t node) {
  const int32_t rank = p_.nodes[static_cast<size_t>(node)].bwd_rank;
  unpin_all();
  if (rank < 0) return;
  for (int32_t s : released_at_rank_[static_cast<size_t>(rank)]) {
    state_[static_cast<size_t>(s)] = State::released;
    mark_absent(p_.saved[static_cast<size_t>(s)].value);
  }
}

void DtrEngine::end_step() {
  if (!active_) return;
  unpin_all();
  active_ = false;
  last_ = cur_;
}

// ---- The executor -------------------------------------------------------------------------------

class DtrExecutor::TapeRuntime final : public DtrRuntime {
 public:
  TapeRuntime(const Profile& p, CachingAllocator& a, ReplayTimer& timer)
      : p_(p), a_(a), timer_(timer) {}
  void evict(int32_t saved) override { tape().evict(saved); }
  void run_program(const RegenProgram& prog,
                   const std::function<void(size_t)>& after_step) override {
    timer_.start();
    run_program_on_tape(tape(), p_, prog, after_step);
    timer_.stop();
  }
  uint64_t block_id(int32_t saved) const override {
    const SavedTensor& s = tape().saved_tensor(saved);
    REGEN_ASSERT(s.storage && s.storage->resident());
    return s.storage->alloc_id();
  }
  std::vector<BlockInfo> layout() const override { return a_.snapshot(); }

 private:
  static Tape& tape() { return Tape::current(); }
  const Profile& p_;
  CachingAllocator& a_;
  ReplayTimer& timer_;  // the executor's
};

namespace {
Schedule all_retain(const Profile& p) {
  // DTR evicts whole saved tensors; it does not run with narrowed ones (remat/plan/compress.h).
  REGEN_CHECK(p.compress == Compression::none, "dtr and dtr-coop do not run with --compress ",
              compression_name(p.compress),
              ": they evict saved tensors as they are; use another --policy, or --compress none");
  return build_schedule(p, std::vector<Decision>(p.saved.size(), Decision::retain));
}
}  // namespace

DtrExecutor::DtrExecutor(const Profile& profile, DtrOptions options, CachingAllocator& allocator)
    : RematExecutor(profile, all_retain(profile)),
      allocator_(allocator),
      runtime_(std::make_unique<TapeRuntime>(profile, allocator, timer_)),
      engine_(std::make_unique<DtrEngine>(profile, options, *runtime_)) {
  saved_upto_.assign(p_.nodes.size(), 0);
  std::vector<size_t> born(p_.nodes.size(), 0);
  for (const ProfileSaved& s : p_.saved) born[static_cast<size_t>(s.readers.front())]++;
  size_t total = 0;
  for (size_t n = 0; n < p_.nodes.size(); ++n) saved_upto_[n] = total += born[n];
}

DtrExecutor::~DtrExecutor() = default;

void DtrExecutor::on_forward_begin(Tape& tape, int32_t node) {
  REGEN_CHECK(static_cast<size_t>(node) < p_.nodes.size(), "remat: the iteration records more ",
              "ops than the profiled one (", p_.nodes.size(),
              "): the model or batch changed since profiling; profile again");
  const Node& got = tape.node(node);
  const ProfileNode& want = p_.nodes[static_cast<size_t>(node)];
  REGEN_CHECK(got.kind == want.kind, "remat: op ", node, " is ", op_name(got.kind), " '",
              tag_name(got.tag), "' but the profile has ", want.op, " '", want.name,
              "': the model changed since profiling; profile again");
  if (node == 0) timer_.restart();
  engine_->before_forward(node);
}

void DtrExecutor::on_forward_abort(Tape&, int32_t) {
  engine_->abort_op();
}

void DtrExecutor::on_forward_end(Tape& tape, int32_t node, const std::vector<Tensor>& outputs) {
  check_node(tape, node, outputs);
  // The saved records the tape made so far are the profile's (the engine tracks them by index).
  const size_t want = saved_upto_[static_cast<size_t>(node)];
  REGEN_CHECK(tape.saved().size() == want, "remat: after op ", node, " the tape holds ",
              tape.saved().size(), " saved tensors where the profile has ", want,
              ": the model changed since profiling; profile again");
  engine_->after_forward(node);
}

void DtrExecutor::on_backward_start(Tape& tape) {
  RematExecutor::on_backward_start(tape);
  engine_->backward_start();
}

void DtrExecutor::on_backward_begin(Tape&, int32_t node) {
  engine_->before_backward(node);
}

void DtrExecutor::on_backward_end(Tape&, int32_t node) {
  engine_->after_backward(node);
}

void DtrExecutor::on_backward_finish(Tape&) {
  engine_->end_step();
  evictions_ = engine_->last().evictions;
  replays_ = engine_->last().replays;
  timer_.finish();
}

bool DtrExecutor::regenerate(Tape&, int32_t saved) {
  REGEN_FAIL("dtr: backward read saved tensor ", saved, " ('",
             p_.saved[static_cast<size_t>(saved)].name,
             "') while it was evicted, outside the op the engine prepared");
}

// ---- Simulation and planning --------------------------------------------------------------------

SimResult simulate_dtr(const Simulator& sim, const DtrOptions& options, int64_t limit,
                       SimOptions so, DtrStats* stats) {
  const Profile& p = sim.profile();
  so.limit = limit;
  so.dtr = &options;
  DtrStats got;
  so.dtr_stats = &got;
  REGEN_CHECK(so.layout == nullptr,
              "dtr: a planned layout serves every request without "
              "evicting; DTR runs on the caching allocator's own placement");
  SimResult r = sim.run(all_retain(p), so);
  r.replays = got.replays;
  r.recompute_ms = got.recompute_ms;
  // With accumulation the figures are the last micro-batch's (as the executor counts them); every
  // micro-batch is taken to recompute as much.
  r.time_ms = p.iteration_ms + static_cast<double>(p.accumulate) * got.recompute_ms;
  r.evictions = got.evictions;
  if (stats) *stats = got;
  return r;
}

namespace {

std::string dtr_note(const DtrStats& st, const DtrOptions& o) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s at run time: %lld evictions, %lld regenerations (%lld in forward), %lld op "
                "replays per step (predicted)",
                o.coop ? "Coop windows" : "DTR's heuristic", static_cast<long long>(st.evictions),
                static_cast<long long>(st.programs), static_cast<long long>(st.forward_programs),
                static_cast<long long>(st.replays));
  std::string out = buf;
  if (o.coop) out += ", " + std::to_string(st.windows) + " windows";
  return out;
}

// DTR under a limit: its run, and whether it ran out of memory.
struct DtrRun {
  SimResult r;
  DtrStats st;
};

DtrRun run_at(const Simulator& sim, const DtrOptions& d, int64_t limit) {
  DtrRun out;
  out.r = simulate_dtr(sim, d, limit, {}, &out.st);
  return out;
}

// Whether the step ran under the limit and within the budget (the persistent segments may
// already pass a budget: the limit applies to what is mapped after them).
bool runs(const DtrRun& run, int64_t budget) {
  return !run.r.oom && run.r.peak_reserved <= budget;
}

// The lowest limit under which DTR was found to run, and its reserved peak. A limit is not
// monotonic, so no search is sure to find the lowest: bisection between the lower bound and the
// no-remat peak (as if it were monotonic), then 16 limits evenly spaced below what it found, the
// lowest that runs kept. Remembered in the caller's PlanCache (a frontier asks at many budgets).
using LowestLimit = PlanCache::DtrLowest;

LowestLimit lowest_limit(const Simulator& sim, const DtrOptions& d, PlanCache* cache) {
  if (cache) {
    auto it = cache->dtr_lowest.find(d.coop);
    if (it != cache->dtr_lowest.end()) return it->second;
  }
  const int64_t floor = memory_lower_bound(sim.profile());
  LowestLimit best;
  best.limit = best.peak = no_remat_peak_of(sim, BudgetOf::reserved);  // runs, evicting nothing
  int64_t lo = floor, hi = best.limit;
  auto try_limit = [&](int64_t limit) {
    const DtrRun run = run_at(sim, d, limit);
    if (!runs(run, limit)) return false;
    if (limit < best.limit) best = {limit, run.r.peak_reserved};
    return true;
  };
  while (hi - lo > (int64_t{512} << 10)) {
    const int64_t mid = lo + (hi - lo) / 2;
    (try_limit(mid) ? hi : lo) = mid;
  }
  const int64_t top = best.limit;
  constexpr int kProbes = 16;
  const int64_t step = std::max<int64_t>(int64_t{512} << 10, (top - floor) / kProbes);
  for (int64_t limit = floor; limit < top; limit += step) {
    if (try_limit(limit)) break;  // ascending: the first that runs is the lowest probed
  }
  if (cache) cache->dtr_lowest[d.coop] = best;
  return best;
}

}  // namespace

Plan plan_dtr(const Simulator& sim, const Budget& budget, const PlanOptions& options,
              const DtrOptions& d) {
  const Profile& p = sim.profile();
  REGEN_CHECK(options.chain == Chain::automatic, "the ", d.coop ? "dtr-coop" : "dtr",
              " policy takes no chain mode: a regeneration restores every evicted tensor it "
              "recomputes");
  Plan plan;
  plan.decisions.assign(p.saved.size(), Decision::retain);
  plan.keep_chain = true;
  plan.budget_text = budget.str();
  plan.budget_of = options.budget_of;
  plan.no_remat_peak = no_remat_peak_of(sim, plan.budget_of);
  plan.budget_bytes = budget.resolve(plan.no_remat_peak);
  plan.lower_bound = memory_lower_bound(p);
  plan.lowest_peak = plan.no_remat_peak;
  REGEN_CHECK(!options.planned_layout, "the ", d.coop ? "dtr-coop" : "dtr",
              " policy evicts when the caching allocator cannot serve a request; a planned "
              "layout (--layout planned) serves every request where it was placed, so the two do "
              "not mix: use --layout caching");
  REGEN_CHECK(plan.budget_of == BudgetOf::reserved || plan.budget_bytes == 0, "the ",
              d.coop ? "dtr-coop" : "dtr",
              " policy evicts when the allocator's hard limit refuses a request, and that limit "
              "bounds reserved bytes: use --budget-of reserved");
  if (plan.budget_bytes == 0) {  // no limit: nothing is ever evicted
    const DtrRun run = run_at(sim, d, 0);
    plan.predicted = run.r;
    plan.note = dtr_note(run.st, d);
    return plan;
  }
  // The budget's limit first; when the step runs out of memory there, lower limits (a limit is
  // not monotonic: fit_schedule), evenly spaced down towards the lower bound.
  std::vector<int64_t> limits{plan.budget_bytes};
  const int64_t floor = std::min(plan.budget_bytes, plan.lower_bound);
  const int64_t step =
      std::max<int64_t>(int64_t{2} << 20, (plan.budget_bytes - floor) / (kLimitProbes + 1));
  for (int k = 1; k <= kLimitProbes && plan.budget_bytes - k * step > floor; ++k) {
    limits.push_back(plan.budget_bytes - k * step);
  }
  DtrRun first;
  for (size_t i = 0; i < limits.size(); ++i) {
    DtrRun run = run_at(sim, d, limits[i]);
    if (i == 0) first = run;
    if (runs(run, plan.budget_bytes)) {
      plan.limit = limits[i];
      plan.predicted = run.r;
      plan.feasible = true;
      plan.lowest_peak = std::min(plan.lowest_peak, run.r.peak_reserved);
      plan.note = dtr_note(run.st, d);
      if (i > 0) {
        plan.note += "; under the budget's own limit the step runs out of memory, under " +
                     format_bytes(limits[i]) + " it runs";
      }
      return plan;
    }
  }
  // None of those: the lowest limit DTR is known to run under, when the budget holds it.
  const LowestLimit lowest = lowest_limit(sim, d, options.cache);
  if (lowest.limit <= plan.budget_bytes) {
    const DtrRun run = run_at(sim, d, lowest.limit);
    plan.limit = lowest.limit;
    plan.predicted = run.r;
    plan.feasible = true;
    plan.lowest_peak = std::min(plan.lowest_peak, run.r.peak_reserved);
    plan.note = dtr_note(run.st, d) + "; under the budget's own limit and " +
                std::to_string(limits.size() - 1) +
                " lower ones the step runs out of memory, under " + format_bytes(lowest.limit) +
                " (the lowest limit found) it runs";
    return plan;
  }
  // Infeasible: what runs is the step without a limit (as for a static plan that does not fit,
  // fit_schedule), where DTR never evicts.
  plan.feasible = false;
  plan.predicted = run_at(sim, d, 0).r;
  plan.lowest_peak = std::min(plan.lowest_peak, lowest.peak);
  plan.note = first.r.oom
                  ? dtr_note(first.st, d) + " before the step runs out of memory at " +
                        (first.r.oom_at.empty() ? std::string("its start") : first.r.oom_at) +
                        " under the limit " + format_bytes(plan.budget_bytes)
                  : "the step reserves " + format_bytes(first.r.peak_reserved) +
                        " before anything can be evicted (the persistent segments)";
  return plan;
}

void judge_dtr_plan(const Simulator& sim, Plan& plan) {
  const std::optional<DtrOptions> d = dtr_policy(plan.policy);
  REGEN_CHECK(d.has_value(), "judge_dtr_plan: '", plan.policy, "' is not a DTR policy");
  REGEN_CHECK(plan.budget_of == BudgetOf::reserved && !plan.planned_layout, "plan '", plan.policy,
              "': a DTR plan bounds reserved bytes on the caching allocator's placement");
  for (Decision x : plan.decisions) {
    REGEN_CHECK(x == Decision::retain, "plan '", plan.policy,
                "': a DTR plan decides nothing ahead of time (every decision RETAINED)");
  }
  REGEN_CHECK(plan.regenerations.empty(), "plan '", plan.policy,
              "': a DTR plan has no explicit regenerations");
  DtrStats st;
  plan.predicted = simulate_dtr(sim, *d, plan.limit, {}, &st);
  // As when the plan was made (runs): the step runs under the plan's limit and within its budget.
  // A plan written as not fitting has no limit (limit 0): its step runs, above the budget.
  plan.feasible = runs(DtrRun{plan.predicted, st}, plan.budget_bytes);
  plan.no_remat_peak = no_remat_peak_of(sim, plan.budget_of);
  plan.lower_bound = memory_lower_bound(sim.profile());
  plan.note = dtr_note(st, *d);
  if (!plan.predicted.oom && !plan.feasible) {
    plan.note += "; the step reserves " + format_bytes(plan.predicted.peak_reserved) +
                 ", above the budget " + format_bytes(plan.budget_bytes) +
                 (plan.limit == 0 ? " (the plan sets no limit: it was written as not fitting)"
                                  : std::string());
  }
}

Plan lowest_dtr_plan(const Simulator& sim, const PlanOptions& options, const DtrOptions& d) {
  REGEN_CHECK(options.budget_of == BudgetOf::reserved, "the ", d.coop ? "dtr-coop" : "dtr",
              " policy evicts when the allocator's hard limit refuses a request, and that limit "
              "bounds reserved bytes: use --budget-of reserved");
  const LowestLimit lowest = lowest_limit(sim, d, options.cache);
  return plan_dtr(sim, bytes_budget(lowest.limit), options, d);
}

}  // namespace regen
