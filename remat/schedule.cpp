// The schedule builder (schedule.h).
#include "regen/remat/schedule.h"

#include <algorithm>
#include <map>
#include <set>

#include "regen/core/error.h"
#include "regen/remat/compress.h"

namespace regen {

const char* decision_name(Decision d) {
  return d == Decision::retain ? "RETAINED" : "RECOMPUTE";
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
    return root.saved >= 0 && state_[static_cast<size_t>(root.saved)] == State::resident;
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
  for (size_t s = 0; s < ns; ++s) {
    if (decisions[s] != Decision::recompute) continue;
    const ProfileSaved& sv = p.saved[s];
    REGEN_CHECK(sv.candidate, "schedule: saved tensor ", s, " (", sv.name,
                ") cannot be recomputed (a leaf, never read by backward, or used until the end "
                "of the forward pass)");
    sch.evict_after[static_cast<size_t>(sv.last_fwd_use)].push_back(static_cast<int32_t>(s));
  }

  // Residency through backward, exactly as the engine and the executor will see it.
  std::vector<State> state(ns, State::resident);
  for (size_t s = 0; s < ns; ++s) {
    if (decisions[s] == Decision::recompute) state[s] = State::evicted;
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
        for (int64_t v : st.inputs) {
          if (v >= 0)
            widen(p.values[static_cast<size_t>(p.values[static_cast<size_t>(v)].root)].saved);
        }
      }
      sch.replays += static_cast<int64_t>(prog.steps.size());
      sch.recompute_ms += prog.time_ms;
      sch.program_of_node[static_cast<size_t>(j)] = static_cast<int32_t>(sch.programs.size());
      sch.programs.push_back(std::move(prog));
    }
    for (int32_t s : distinct) widen(s);
    for (int32_t s : distinct) {
      if (--uses_left[static_cast<size_t>(s)] == 0) state[static_cast<size_t>(s)] = State::released;
    }
  }
  // Every narrowed tensor is read by backward (compressible), so each was widened.
  REGEN_ASSERT(std::find(narrow.begin(), narrow.end(), 1) == narrow.end());
  return sch;
}

}  // namespace regen
