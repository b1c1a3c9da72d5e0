// The schedule builder (schedule.h).
#include "regen/remat/execute/schedule.h"

#include <algorithm>
#include <map>
#include <set>

#include "regen/core/error.h"
#include "regen/remat/plan/compress.h"

namespace regen {

namespace {
constexpr FateInfo kFateInfo[] = {
    {Fate::retain, "RETAINED", "retain"},
    {Fate::recompute, "RECOMPUTE", "recompute"},
    {Fate::offload, "OFFLOAD", "offload"},
};
static_assert(sizeof(kFateInfo) / sizeof(kFateInfo[0]) == kNumFates,
              "one row of kFateInfo per fate");
}  // namespace

const FateInfo& fate_info(Fate f) {
  const size_t i = static_cast<size_t>(f);
  REGEN_CHECK(i < static_cast<size_t>(kNumFates) && kFateInfo[i].fate == f, "unknown fate ", i);
  return kFateInfo[i];
}

const char* decision_name(Decision d) {
  return fate_info(d).name;
}

const char* fate_word(Fate f) {
  return fate_info(f).word;
}

std::vector<std::string> fate_words() {
  std::vector<std::string> out;
  for (const FateInfo& f : kFateInfo) out.push_back(f.word);
  return out;
}

Fate parse_fate(const std::string& text) {
  for (const FateInfo& f : kFateInfo) {
    if (text == f.name || text == f.word) return f.fate;
  }
  std::vector<std::string> known;
  for (const FateInfo& f : kFateInfo) known.push_back(std::string(f.word) + " (" + f.name + ")");
  REGEN_FAIL("unknown fate '", text, "': known fates are ", join_names(known));
}

const char* state_place_name(StatePlace p) {
  return p == StatePlace::host ? "host" : "device";
}

StatePlace parse_state_place(const std::string& text) {
  if (text == "device") return StatePlace::device;
  if (text == "host") return StatePlace::host;
  REGEN_FAIL("unknown place '", text, "' for the optimizer state: device or host");
}

int64_t Schedule::offloaded_bytes() const {
  int64_t b = 0;
  for (const OffloadOp& o : offloads) b += static_cast<int64_t>(o.bytes);
  return b;
}

namespace {

using State = Residency;

// Builds one regeneration program against the current residency of saved tensors.
class ProgramBuilder {
 public:
  ProgramBuilder(const Profile& p, const std::vector<State>& state) : p_(p), state_(state) {}

  // Appends the steps that make value v available (post-order, inputs first).
  void need(int64_t v) {
    if (v < 0 || available(v)) return;
    const ProfileValue& val = p_.values[static_cast<size_t>(v)];
    REGEN_ASSERT(val.producer >= 0);
    const int32_t node = val.producer;
    if (replayed_.count(node)) return;
    const ProfileNode& n = p_.nodes[static_cast<size_t>(node)];
    for (int64_t in : n.inputs) need(in);
    replayed_.insert(node);
    ReplayStep step;
    step.node = node;
    step.inputs = n.inputs;
    step.outputs.resize(n.outputs.size());
    steps_.push_back(std::move(step));
    for (int64_t out : n.outputs) produced_.insert(out);
  }

  std::vector<ReplayStep>& steps() { return steps_; }

 private:
  bool available(int64_t v) const {
    const ProfileValue& val = p_.values[static_cast<size_t>(v)];
    if (val.leaf) return true;
    if (produced_.count(v)) return true;
    const ProfileValue& root = p_.values[static_cast<size_t>(val.root)];
    if (root.leaf) return true;
    // An offloaded tensor is there for a program: the schedule waits for its copy back first.
    return root.saved >= 0 && (state_[static_cast<size_t>(root.saved)] == State::resident ||
                               state_[static_cast<size_t>(root.saved)] == State::offloaded);
  }

  const Profile& p_;
  const std::vector<State>& state_;
  std::set<int32_t> replayed_;
  std::set<int64_t> produced_;
  std::vector<ReplayStep> steps_;
};

}  // namespace

std::vector<int32_t> regeneration_nodes(const Profile& p, const std::vector<char>& evicted,
                                        const std::vector<int32_t>& targets) {
  REGEN_CHECK(evicted.size() == p.saved.size(), "regeneration_nodes: ", evicted.size(),
              " flags for ", p.saved.size(), " saved tensors");
  std::vector<State> state(p.saved.size(), State::resident);
  for (size_t s = 0; s < state.size(); ++s) {
    if (evicted[s]) state[s] = State::evicted;
  }
  ProgramBuilder b(p, state);
  for (int32_t s : targets) b.need(p.saved[static_cast<size_t>(s)].value);
  std::vector<int32_t> nodes;
  for (const ReplayStep& st : b.steps()) nodes.push_back(st.node);
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

void fill_regeneration_program(const Profile& p, std::vector<Residency>& state, bool keep_chain,
                               RegenProgram& prog, std::vector<int32_t>* restores) {
  REGEN_CHECK(state.size() == p.saved.size(), "regeneration program: ", state.size(),
              " residency states for ", p.saved.size(), " saved tensors");
  prog.steps.clear();
  prog.time_ms = 0;
  ProgramBuilder b(p, state);
  for (int32_t s : prog.targets) {
    REGEN_ASSERT(state[static_cast<size_t>(s)] == State::evicted);
    b.need(p.saved[static_cast<size_t>(s)].value);
  }
  prog.steps = std::move(b.steps());
  // Forward order: every input's producer has a smaller index, so this is a valid order, and
  // the replay holds what the forward pass held at the same point.
  std::sort(prog.steps.begin(), prog.steps.end(),
            [](const ReplayStep& a, const ReplayStep& b) { return a.node < b.node; });
  // Fates: restore evicted saved roots that backward needs (targets, and with keep_chain any
  // still-needed one); keep outputs later steps read; drop the rest.
  std::map<int64_t, size_t> last_use;  // value -> last step reading it
  for (size_t i = 0; i < prog.steps.size(); ++i) {
    for (int64_t in : prog.steps[i].inputs) {
      if (in >= 0) last_use[in] = i;
    }
  }
  std::vector<int64_t> kept;
  for (size_t i = 0; i < prog.steps.size(); ++i) {
    ReplayStep& st = prog.steps[i];
    const ProfileNode& rn = p.nodes[static_cast<size_t>(st.node)];
    for (size_t k = 0; k < rn.outputs.size(); ++k) {
      const int64_t v = rn.outputs[k];
      const ProfileValue& val = p.values[static_cast<size_t>(v)];
      const int32_t s = val.root == v ? val.saved : -1;
      const bool is_target =
          s >= 0 && std::find(prog.targets.begin(), prog.targets.end(), s) != prog.targets.end();
      const bool wanted_later =
          keep_chain && s >= 0 && state[static_cast<size_t>(s)] == State::evicted;
      if (s >= 0 && (is_target || wanted_later)) {
        st.outputs[k] = {ReplayStep::Fate::restore, s};
        state[static_cast<size_t>(s)] = State::resident;
        if (restores) (*restores)[static_cast<size_t>(s)]++;
      } else if (last_use.count(v) && last_use[v] > i) {
        st.outputs[k] = {ReplayStep::Fate::keep, -1};
        kept.push_back(v);
      }
    }
    // Kept values whose last reader is this step go now.
    std::vector<int64_t> rel;
    for (int64_t v : kept) {
      if (last_use[v] == i) rel.push_back(v);
    }
    std::sort(rel.begin(), rel.end());
    for (int64_t v : rel) kept.erase(std::find(kept.begin(), kept.end(), v));
    st.release_after = std::move(rel);
    prog.time_ms += rn.fwd_ms;
  }
  REGEN_ASSERT(kept.empty());
  for (int32_t s : prog.targets) REGEN_ASSERT(state[static_cast<size_t>(s)] == State::resident);
}

Schedule without_compression(Schedule s) {
  s.compress = Compression::none;
  for (std::vector<int32_t>& v : s.narrow_after) v.clear();
  for (std::vector<int32_t>& v : s.widen_before) v.clear();
  s.narrowed = 0;
  s.compress_ms = 0;
  return s;
}

Schedule build_schedule(const Profile& p, const std::vector<Decision>& decisions, bool keep_chain,
                        const std::vector<Regeneration>& regenerations) {
  OffloadSpec spec;
  spec.transfer = p.transfer;
  return build_schedule(p, decisions, keep_chain, regenerations, spec);
}

namespace {

// The optimizer state the profiled step started with, per parameter in allocation order.
std::vector<StateGroup> state_groups(const Profile& p, const TransferModel& t) {
  std::vector<const BlockInfo*> blocks;
  for (const AllocatorState::SegmentRec& seg : p.start_state.segments) {
    for (const BlockInfo& b : seg.blocks) {
      if (b.allocated && b.category == Category::optimizer_state) blocks.push_back(&b);
    }
  }
  std::sort(blocks.begin(), blocks.end(),
            [](const BlockInfo* a, const BlockInfo* b) { return a->id < b->id; });
  std::vector<StateGroup> groups;
  int64_t total = 0;
  for (const BlockInfo* b : blocks) {
    const std::string tag = tag_name(b->tag);
    const size_t dot = tag.rfind('.');
    REGEN_CHECK(dot != std::string::npos && dot > 0, "schedule: optimizer state block ", b->id,
                " of the profile is tagged '", tag,
                "', not <parameter>.<state>: it cannot be moved to the host");
    const std::string param = tag.substr(0, dot);
    if (groups.empty() || groups.back().param != param) {
      groups.emplace_back();
      groups.back().param = param;
    }
    StateGroup& g = groups.back();
    g.block.push_back(b->id);
    g.tag.push_back(tag);
    g.requested.push_back(static_cast<int64_t>(b->requested));
    g.to_device_ms.push_back(t.to_device.ms(b->requested));
    g.to_host_ms.push_back(t.to_host.ms(b->requested));
    total += static_cast<int64_t>(b->requested);
  }
  for (StateGroup& g : groups) {
    int64_t mine = 0;
    for (int64_t r : g.requested) mine += r;
    g.update_ms = total > 0 ? p.optimizer_ms * static_cast<double>(mine) / double(total) : 0;
  }
  return groups;
}

}  // namespace

Schedule build_schedule(const Profile& p, const std::vector<Decision>& decisions, bool keep_chain,
                        const std::vector<Regeneration>& regenerations, const OffloadSpec& spec) {
  const size_t ns = p.saved.size();
  REGEN_CHECK(decisions.size() == ns, "schedule: ", decisions.size(), " decisions for ", ns,
              " saved tensors");
  Schedule sch;
  sch.evict_after.resize(p.nodes.size());
  sch.narrow_after.resize(p.nodes.size());
  sch.widen_before.resize(p.nodes.size());
  sch.compress = p.compress;
  // Compression, as a session-level mode: every compressible tensor the plan retains is held
  // narrow. (A per-tensor fate would choose this set instead; the rest follows unchanged.) A
  // narrow tensor counts as resident for the regeneration programs: it is widened before the
  // first program or backward node that reads it.
  std::vector<char> narrow(ns, 0);
  if (p.compress != Compression::none) {
    for (size_t s = 0; s < ns; ++s) {
      if (decisions[s] != Decision::retain || !compressible(p, static_cast<int32_t>(s))) continue;
      narrow[s] = 1;
      sch.narrow_after[static_cast<size_t>(p.saved[s].last_fwd_use)].push_back(
          static_cast<int32_t>(s));
      const uint64_t bytes = p.values[static_cast<size_t>(p.saved[s].value)].bytes;
      sch.compress_ms += p.compress_cost.narrow_ms(bytes) + p.compress_cost.widen_ms(bytes);
      ++sch.narrowed;
    }
  }
  sch.program_of_node.assign(p.nodes.size(), -1);
  sch.restores.assign(ns, 0);
  sch.offload_issue_after.resize(p.nodes.size());
  sch.offload_free_after.resize(p.nodes.size());
  sch.prefetch_issue_before.resize(p.nodes.size());
  sch.prefetch_wait_before.resize(p.nodes.size());
  const int32_t last_forward = static_cast<int32_t>(p.nodes.size()) - 1;
  std::vector<int32_t> op_of(ns, -1);  // saved index -> index into sch.offloads
  for (size_t s = 0; s < ns; ++s) {
    const ProfileSaved& sv = p.saved[s];
    switch (decisions[s]) {
      case Fate::retain:
        break;
      case Fate::recompute:
        REGEN_CHECK(sv.candidate, "schedule: saved tensor ", s, " (", sv.name,
                    ") cannot be recomputed (a leaf, never read by backward, or used until the "
                    "end of the forward pass)");
        sch.evict_after[static_cast<size_t>(sv.last_fwd_use)].push_back(static_cast<int32_t>(s));
        break;
      case Fate::offload: {
        REGEN_CHECK(sv.offloadable, "schedule: saved tensor ", s, " (", sv.name,
                    ") cannot be offloaded (not an activation made in the step, never read by "
                    "backward, or used until the end of the forward pass)");
        OffloadOp op;
        op.saved = static_cast<int32_t>(s);
        op.bytes = sv.bytes;
        op.issue_after = sv.producer;
        op.free_after = sv.last_fwd_use;
        op.prefetch_before = p.backward_order[static_cast<size_t>(sv.first_bw_rank)];
        op.wait_before = op.prefetch_before;
        op_of[s] = static_cast<int32_t>(sch.offloads.size());
        sch.offloads.push_back(op);
        break;
      }
      default:
        REGEN_FAIL("schedule: saved tensor ", s, " (", sv.name, ") has fate ",
                   static_cast<int>(decisions[s]), ", which this version of regen cannot run");
    }
  }
  for (const Offload& o : spec.offloads) {
    REGEN_CHECK(o.saved >= 0 && static_cast<size_t>(o.saved) < ns &&
                    op_of[static_cast<size_t>(o.saved)] >= 0,
                "schedule: an offload names saved tensor ", o.saved,
                ", which the plan does not offload");
    OffloadOp& op = sch.offloads[static_cast<size_t>(op_of[static_cast<size_t>(o.saved)])];
    const ProfileSaved& sv = p.saved[static_cast<size_t>(o.saved)];
    REGEN_CHECK(o.free_after >= sv.last_fwd_use && o.free_after <= last_forward,
                "schedule: the offload of saved tensor ", o.saved, " (", sv.name,
                ") frees its device block after forward node ", o.free_after,
                ", but it is read until node ", sv.last_fwd_use, " and forward ends at node ",
                last_forward);
    const bool active = o.prefetch_before >= 0 &&
                        static_cast<size_t>(o.prefetch_before) < p.nodes.size() &&
                        p.nodes[static_cast<size_t>(o.prefetch_before)].bwd_rank >= 0;
    REGEN_CHECK(
        active && p.nodes[static_cast<size_t>(o.prefetch_before)].bwd_rank <= sv.first_bw_rank,
        "schedule: the offload of saved tensor ", o.saved, " (", sv.name,
        ") is copied back before node ", o.prefetch_before,
        ", which is not a node that backward runs at or before its first backward reader ", "(",
        p.nodes[static_cast<size_t>(op.wait_before)].name, ")");
    op.free_after = o.free_after;
    op.prefetch_before = o.prefetch_before;
  }
  if (!sch.offloads.empty() || spec.optimizer_state == StatePlace::host) {
    REGEN_CHECK(spec.transfer.valid(),
                "schedule: the plan copies tensors to the host, and no transfer model times the "
                "copies (the profile has none: give one, regen bench copy or --transfer)");
  }
  for (OffloadOp& op : sch.offloads) {
    op.to_host_ms = spec.transfer.to_host.ms(op.bytes);
    op.to_device_ms = spec.transfer.to_device.ms(op.bytes);
  }
  sch.optimizer_state = spec.optimizer_state;
  if (spec.optimizer_state == StatePlace::host) {
    // The state is streamed through the device while the optimizer runs; a step whose optimizer
    // allocates anything else meanwhile would interleave with it in ways no profile recorded.
    for (const Marker& m : p.markers) {
      if (m.kind != MarkerKind::optimizer_begin) continue;
      for (const Marker& e : p.markers) {
        if (e.kind != MarkerKind::optimizer_end) continue;
        for (uint64_t i = m.position; i < e.position && i < p.events.size(); ++i) {
          REGEN_CHECK(p.events[i].kind != MemoryEventKind::alloc, "schedule: the optimizer of ",
                      p.model, " allocates during its step (", p.events[i].tag,
                      "), so its state cannot be streamed from the host");
        }
      }
    }
    sch.state_groups = state_groups(p, spec.transfer);
  }

  // Residency through backward, exactly as the engine and the executor will see it.
  std::vector<State> state(ns, State::resident);
  for (size_t s = 0; s < ns; ++s) {
    if (decisions[s] == Decision::recompute) state[s] = State::evicted;
    if (decisions[s] == Decision::offload) state[s] = State::offloaded;
  }
  std::vector<int> uses_left(ns, 0);
  std::vector<char> active(p.nodes.size(), 0);
  for (int32_t n : p.backward_order) active[static_cast<size_t>(n)] = 1;
  // Explicit regenerations, by backward node.
  std::vector<std::vector<int32_t>> explicit_at(p.nodes.size());
  for (const Regeneration& r : regenerations) {
    REGEN_CHECK(r.node >= 0 && static_cast<size_t>(r.node) < p.nodes.size() &&
                    active[static_cast<size_t>(r.node)],
                "schedule: a regeneration names node ", r.node,
                ", which is not a node that backward runs");
    for (int32_t s : r.saved) {
      REGEN_CHECK(s >= 0 && static_cast<size_t>(s) < ns &&
                      decisions[static_cast<size_t>(s)] == Decision::recompute,
                  "schedule: the regeneration before node ", r.node, " (",
                  p.nodes[static_cast<size_t>(r.node)].name, ") names saved tensor ", s,
                  ", which the plan does not recompute");
      explicit_at[static_cast<size_t>(r.node)].push_back(s);
    }
  }
  for (size_t s = 0; s < ns; ++s) {
    for (int32_t r : p.saved[s].readers) uses_left[s] += active[static_cast<size_t>(r)];
    if (uses_left[s] == 0) state[s] = State::released;
  }

  for (int32_t j : p.backward_order) {
    const ProfileNode& node = p.nodes[static_cast<size_t>(j)];
    std::vector<int32_t> distinct;
    for (int64_t v : node.saved) {
      const int32_t s = p.values[static_cast<size_t>(p.values[static_cast<size_t>(v)].root)].saved;
      if (std::find(distinct.begin(), distinct.end(), s) == distinct.end()) distinct.push_back(s);
    }
    RegenProgram prog;
    prog.backward_node = j;
    // Offloaded tensors this node reads are waited for before it (their first backward reader),
    // and so is any a program reads (below).
    std::vector<int32_t> waits;
    for (int32_t s : distinct) {
      if (state[static_cast<size_t>(s)] == State::offloaded) waits.push_back(s);
    }
    for (int32_t s : explicit_at[static_cast<size_t>(j)]) {
      REGEN_CHECK(
          state[static_cast<size_t>(s)] == State::evicted,
          "schedule: the regeneration before node ", j, " (", node.name, ") names saved tensor ", s,
          " (", p.saved[static_cast<size_t>(s)].name, "), which is ",
          state[static_cast<size_t>(s)] == State::resident ? "resident" : "released", " by then");
      if (std::find(prog.targets.begin(), prog.targets.end(), s) == prog.targets.end()) {
        prog.targets.push_back(s);
      }
    }
    for (int32_t s : distinct) {
      REGEN_ASSERT(state[static_cast<size_t>(s)] != State::released);
      if (state[static_cast<size_t>(s)] == State::evicted &&
          std::find(prog.targets.begin(), prog.targets.end(), s) == prog.targets.end()) {
        prog.targets.push_back(s);
      }
    }
    // The narrow tensors this node's backward or its program reads are widened first.
    auto widen = [&](int32_t s) {
      if (s >= 0 && narrow[static_cast<size_t>(s)]) {
        narrow[static_cast<size_t>(s)] = 0;
        sch.widen_before[static_cast<size_t>(j)].push_back(s);
      }
    };
    if (!prog.targets.empty()) {
      fill_regeneration_program(p, state, keep_chain, prog, &sch.restores);
      for (const ReplayStep& st : prog.steps) {
        for (int64_t in : st.inputs) {
          if (in < 0) continue;
          const ProfileValue& root =
              p.values[static_cast<size_t>(p.values[static_cast<size_t>(in)].root)];
          if (root.saved >= 0 && state[static_cast<size_t>(root.saved)] == State::offloaded &&
              std::find(waits.begin(), waits.end(), root.saved) == waits.end()) {
            waits.push_back(root.saved);
          }
          widen(root.saved);
        }
      }
      sch.replays += static_cast<int64_t>(prog.steps.size());
      sch.recompute_ms += prog.time_ms;
      sch.program_of_node[static_cast<size_t>(j)] = static_cast<int32_t>(sch.programs.size());
      sch.programs.push_back(std::move(prog));
    }
    // The copies back waited for here: issued here at the latest.
    std::sort(waits.begin(), waits.end());
    const int32_t rank = node.bwd_rank;
    for (int32_t s : waits) {
      OffloadOp& op = sch.offloads[static_cast<size_t>(op_of[static_cast<size_t>(s)])];
      op.wait_before = j;
      if (p.nodes[static_cast<size_t>(op.prefetch_before)].bwd_rank > rank) op.prefetch_before = j;
      state[static_cast<size_t>(s)] = State::resident;
    }
    for (int32_t s : distinct) widen(s);
    for (int32_t s : distinct) {
      if (--uses_left[static_cast<size_t>(s)] == 0) state[static_cast<size_t>(s)] = State::released;
    }
  }
  // Per node, in the executor's order: copies out issued in saved order; frees in saved order;
  // prefetches issued before a node in the order of their waits (then saved order), so the queue's
  // order is the order they are needed in; waits in saved order.
  std::vector<int32_t> by_wait(sch.offloads.size());
  for (size_t i = 0; i < by_wait.size(); ++i) by_wait[i] = static_cast<int32_t>(i);
  std::stable_sort(by_wait.begin(), by_wait.end(), [&](int32_t a, int32_t b) {
    return p.nodes[static_cast<size_t>(sch.offloads[static_cast<size_t>(a)].wait_before)].bwd_rank <
           p.nodes[static_cast<size_t>(sch.offloads[static_cast<size_t>(b)].wait_before)].bwd_rank;
  });
  for (size_t i = 0; i < sch.offloads.size(); ++i) {
    const OffloadOp& op = sch.offloads[i];
    REGEN_ASSERT(op.wait_before >= 0);
    sch.offload_issue_after[static_cast<size_t>(op.issue_after)].push_back(static_cast<int32_t>(i));
    sch.offload_free_after[static_cast<size_t>(op.free_after)].push_back(static_cast<int32_t>(i));
    sch.prefetch_wait_before[static_cast<size_t>(op.wait_before)].push_back(
        static_cast<int32_t>(i));
  }
  for (int32_t i : by_wait) {
    sch.prefetch_issue_before[static_cast<size_t>(
                                  sch.offloads[static_cast<size_t>(i)].prefetch_before)]
        .push_back(i);
  }
  // Every narrowed tensor is read by backward (compressible), so each was widened.
  REGEN_ASSERT(std::find(narrow.begin(), narrow.end(), 1) == narrow.end());
  return sch;
}

}  // namespace regen
