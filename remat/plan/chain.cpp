// The chain planner's model and dynamic programme (chain.h).
#include "regen/remat/plan/chain.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "regen/core/error.h"
#include "regen/core/io.h"

namespace regen {

namespace {

// Beyond this many stages the cubic programme gets slow; neighbours are merged (cheapest first).
constexpr size_t kMaxStages = 96;
// Interior tensors whose bytes per ms of regeneration (with the rest of the stage evicted) are
// below this share of the stage's bytes per forward ms are cheap to hold: held together or not
// at all. Of the others, the kMaxEnumerated largest are enumerated, every subset, and any further
// ones are always held.
constexpr double kCheapToHold = 1.0 / 16;
constexpr int kMaxEnumerated = 10;
// The options (held subsets) a stage offers the programme at most: its choice codes must stay
// below kCutBase (the programme's, below) with every backward mode.
constexpr int kMaxStageOptions = 80;
// Weights of bytes against time that pick the holds (classes 1..) of every stage.
constexpr double kHoldWeights[] = {0.25, 1.0, 4.0};
// Shares of a stage's bytes that pick the other holds.
constexpr double kHoldShares[] = {0.1, 0.2, 0.4};

// Replays inside one stage for many resident sets: need() of remat/execute/schedule.cpp on flat
// arrays.
class LocalReplay {
 public:
  explicit LocalReplay(const Profile& p)
      : p_(p), evicted_(p.saved.size(), 0), stamp_(p.nodes.size(), 0) {}

  std::vector<char>& evicted() { return evicted_; }

  // Forward ms of replaying what `targets` need; nodes appended to `nodes` when given.
  double time(const std::vector<int32_t>& targets, std::vector<int32_t>* nodes = nullptr) {
    ++epoch_;
    ms_ = 0;
    nodes_ = nodes;
    for (int32_t s : targets) need(p_.saved[static_cast<size_t>(s)].value);
    return ms_;
  }

 private:
  bool available(int64_t v) const {
    const ProfileValue& val = p_.values[static_cast<size_t>(v)];
    if (val.leaf) return true;
    const ProfileValue& root = p_.values[static_cast<size_t>(val.root)];
    if (root.leaf) return true;
    return root.saved >= 0 && !evicted_[static_cast<size_t>(root.saved)];
  }
  void need(int64_t v) {
    if (v < 0 || available(v)) return;
    const int32_t node = p_.values[static_cast<size_t>(v)].producer;
    REGEN_ASSERT(node >= 0);
    if (stamp_[static_cast<size_t>(node)] == epoch_) return;
    stamp_[static_cast<size_t>(node)] = epoch_;
    const ProfileNode& n = p_.nodes[static_cast<size_t>(node)];
    for (int64_t in : n.inputs) need(in);
    ms_ += n.fwd_ms;
    if (nodes_) nodes_->push_back(node);
  }

  const Profile& p_;
  std::vector<char> evicted_;
  std::vector<uint64_t> stamp_;
  uint64_t epoch_ = 0;
  double ms_ = 0;
  std::vector<int32_t>* nodes_ = nullptr;
};

int64_t sum_bytes(const std::vector<int32_t>& set, const Levels& L) {
  int64_t b = 0;
  for (int32_t s : set) b += L.block_bytes[static_cast<size_t>(s)];
  return b;
}

std::vector<int32_t> minus(const std::vector<int32_t>& a,
                           const std::vector<int32_t>& b) {  // b sorted
  std::vector<int32_t> r;
  for (int32_t x : a) {
    if (!std::binary_search(b.begin(), b.end(), x)) r.push_back(x);
  }
  return r;
}

std::vector<int32_t> join(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  return a;
}

// Fills a stage's options, holds and memory terms (its nodes, in, out and interior are set).
void describe_stage(const Profile& p, const Levels& L, const NodeWindows& W,
                    const std::vector<int32_t>& rank_of, LocalReplay& replay, ChainStage& st) {
  std::vector<char>& evicted = replay.evicted();
  std::vector<int32_t> marked;
  // Evicts exactly `set` for the next replay.time() calls.
  auto evict_only = [&](const std::vector<int32_t>& set) {
    for (int32_t s : marked) evicted[static_cast<size_t>(s)] = 0;
    marked = set;
    for (int32_t s : marked) evicted[static_cast<size_t>(s)] = 1;
  };
  auto bytes = [&](int32_t s) { return L.block_bytes[static_cast<size_t>(s)]; };
  std::sort(st.interior.begin(), st.interior.end());
  std::sort(st.out.begin(), st.out.end());
  std::sort(st.in.begin(), st.in.end());
  st.in_bytes = sum_bytes(st.in, L);
  st.out_bytes = sum_bytes(st.out, L);
  st.interior_bytes = sum_bytes(st.interior, L);
  const std::vector<int32_t> all = join(st.interior, st.out);
  st.program_rest =
      st.program_node >= 0 ? L.rest(W.bwd_begin[static_cast<size_t>(st.program_node)]) : 0;

  // The stage's backward nodes, in the order backward runs them.
  std::vector<int32_t> back_nodes;
  for (int32_t i = st.last_node; i >= st.first_node; --i) {
    if (rank_of[static_cast<size_t>(i)] >= 0) back_nodes.push_back(i);
  }
  // The node after whose backward a saved tensor is released.
  auto last_reader = [&](int32_t s) {
    const int32_t r = p.saved[static_cast<size_t>(s)].last_bw_rank;
    return r >= 0 ? p.backward_order[static_cast<size_t>(r)] : -1;
  };
  auto reads = [&](int32_t node) {  // distinct saved indices node's backward reads
    std::vector<int32_t> r;
    for (int64_t v : p.nodes[static_cast<size_t>(node)].saved) {
      const int32_t s = p.values[static_cast<size_t>(p.values[static_cast<size_t>(v)].root)].saved;
      if (s >= 0 && std::find(r.begin(), r.end(), s) == r.end()) r.push_back(s);
    }
    return r;
  };
  // The stage's tensors alive through its backward as profiled: everything resident.
  int64_t full_backward_peak = 0;
  if (!back_nodes.empty()) {
    const int64_t bb = W.bwd_begin[static_cast<size_t>(back_nodes.front())];
    const int64_t be = W.bwd_end[static_cast<size_t>(back_nodes.back())];
    for (int64_t i = bb; i <= be; ++i) {
      int64_t alive = 0;
      for (int32_t s : all) {
        const int64_t f = L.free_at[static_cast<size_t>(s)];
        if (L.alloc_at[static_cast<size_t>(s)] < i && (f < 0 || i <= f)) alive += bytes(s);
      }
      full_backward_peak = std::max(full_backward_peak, L.rest(i) + alive);
    }
  }

  // Memory of the first pass over the stage's forward window. keep (sorted): held to the
  // window's end, the others go after their last forward use; transient_in: so does the input.
  const int64_t fb = W.fwd_begin[static_cast<size_t>(st.first_node)];
  const int64_t fe = W.fwd_end[static_cast<size_t>(st.last_node)];
  auto evict_pos = [&](int32_t s) {
    return W.fwd_end[static_cast<size_t>(p.saved[static_cast<size_t>(s)].last_fwd_use)];
  };
  auto pass = [&](const std::vector<int32_t>& keep, bool transient_in) {
    std::vector<int64_t> diff(static_cast<size_t>(fe - fb + 2), 0);
    auto add = [&](int64_t from, int64_t to, int64_t b) {  // positions [from, to]
      from = std::max(from, fb);
      to = std::min(to, fe);
      if (from > to) return;
      diff[static_cast<size_t>(from - fb)] += b;
      diff[static_cast<size_t>(to - fb + 1)] -= b;
    };
    for (int32_t s : all) {
      const bool held = std::binary_search(keep.begin(), keep.end(), s);
      add(L.alloc_at[static_cast<size_t>(s)] + 1, held ? fe : evict_pos(s), bytes(s));
    }
    if (transient_in) {
      for (int32_t s : st.in) add(fb, evict_pos(s), bytes(s));
    }
    int64_t level = 0, peak = std::numeric_limits<int64_t>::min();
    for (int64_t i = fb; i <= fe; ++i) {
      level += diff[static_cast<size_t>(i - fb)];
      peak = std::max(peak, L.rest(i) + level);
    }
    return peak;
  };

  // A replay's own peak above the level it starts from: `nodes` (sorted) in forward order, each
  // node's window (outputs and workspace) on top of what was replayed before it and is still
  // read by a later replayed node, or restored (`restore`, sorted saved indices); with
  // transient_in the stage's input is held until its last replayed reader, else it is resident.
  auto replay_peak = [&](const std::vector<int32_t>& nodes, const std::vector<int32_t>& restore,
                         bool transient_in) {
    std::unordered_map<int64_t, int32_t> last_use;  // root value -> last replayed reader
    for (int32_t n : nodes) {
      for (int64_t in : p.nodes[static_cast<size_t>(n)].inputs) {
        if (in >= 0) last_use[p.values[static_cast<size_t>(in)].root] = n;
      }
    }
    std::vector<std::pair<int64_t, int64_t>> held;  // (root value, bytes) released at last use
    int64_t alive = 0, peak = 0;
    if (transient_in) {
      for (int32_t s : st.in) {
        const int64_t v = p.saved[static_cast<size_t>(s)].value;
        if (!last_use.count(v)) continue;
        held.push_back({v, bytes(s)});
        alive += bytes(s);
      }
    }
    for (int32_t n : nodes) {
      const ProfileNode& nd = p.nodes[static_cast<size_t>(n)];
      peak = std::max(peak, alive + L.own_peak(W.fwd_begin[static_cast<size_t>(n)],
                                               W.fwd_end[static_cast<size_t>(n)]));
      for (int64_t out : nd.outputs) {
        const ProfileValue& v = p.values[static_cast<size_t>(out)];
        if (v.root != out) continue;  // a view: its root's bytes are counted already
        const int64_t b = L.value_block[static_cast<size_t>(out)];
        if (v.saved >= 0 && std::binary_search(restore.begin(), restore.end(), v.saved)) {
          alive += b;  // restored: held from here on
        } else if (last_use.count(out) && last_use[out] > n) {
          held.push_back({out, b});
          alive += b;
        }
      }
      for (size_t i = 0; i < held.size();) {
        if (last_use[held[i].first] == n) {
          alive -= held[i].second;
          held[i] = held.back();
          held.pop_back();
        } else {
          ++i;
        }
      }
    }
    return peak;
  };

  // The stage's backward with `held` (sorted interior) and the output resident, the rest of the
  // interior evicted. At once: one program before its first backward node restores the rest.
  // Just in time: before each backward node, a program restores what the node reads, and (not in
  // the drop variant) what it replays on the way that a later node of the stage reads.
  auto backward = [&](const std::vector<int32_t>& held) {
    std::array<StageBackward, kBackwardModes> b;
    const std::vector<int32_t> rest = minus(st.interior, held);
    evict_only(rest);
    std::vector<int32_t> at_once;
    b[kAtOnce].ms = replay.time(rest, &at_once);
    std::sort(at_once.begin(), at_once.end());
    b[kAtOnce].peak = full_backward_peak;
    if (!rest.empty()) {
      const int64_t resident = sum_bytes(held, L) + st.out_bytes;
      b[kAtOnce].peak =
          std::max(b[kAtOnce].peak, st.program_rest + resident + replay_peak(at_once, rest, false));
      b[kAtOnce].regenerations.push_back({st.program_node, rest});
    }
    // Bytes per replayed ms below which a kJustInTimeSome variant holds a tensor: the stage's own
    // ratio times 1/4, 1 and 4.
    double stage_ms = 0;
    for (int32_t n : back_nodes) stage_ms += p.nodes[static_cast<size_t>(n)].fwd_ms;
    const double ratio = double(st.interior_bytes + st.out_bytes) / std::max(stage_ms, 1e-9);
    for (int mode = kJustInTime; mode < kBackwardModes; ++mode) {
      const double hold_below = mode == kJustInTime ? std::numeric_limits<double>::infinity()
                                : mode == kJustInTimeDrop
                                    ? -1.0
                                    : ratio * std::pow(4.0, mode - kJustInTimeSome - 1);
      StageBackward& j = b[static_cast<size_t>(mode)];
      evict_only(rest);
      std::vector<char> resident(p.saved.size(), 0);
      int64_t alive = 0;
      for (int32_t s : all) {
        if (!std::binary_search(rest.begin(), rest.end(), s)) {
          resident[static_cast<size_t>(s)] = 1;
          alive += bytes(s);
        }
      }
      std::vector<int32_t> nodes;
      for (int32_t node : back_nodes) {
        std::vector<int32_t> targets;
        for (int32_t s : reads(node)) {
          if (std::binary_search(rest.begin(), rest.end(), s) && !resident[static_cast<size_t>(s)])
            targets.push_back(s);
        }
        if (!targets.empty()) {
          nodes.clear();
          j.ms += replay.time(targets, &nodes);
          std::sort(nodes.begin(), nodes.end());
          std::vector<int32_t> restored = targets;
          std::vector<int32_t> on_the_way;
          for (int32_t rn : nodes) {
            for (int64_t out : p.nodes[static_cast<size_t>(rn)].outputs) {
              const ProfileValue& v = p.values[static_cast<size_t>(out)];
              const int32_t s = v.root == out ? v.saved : -1;
              if (s < 0 || !std::binary_search(rest.begin(), rest.end(), s) ||
                  resident[static_cast<size_t>(s)])
                continue;
              if (p.saved[static_cast<size_t>(s)].last_bw_rank >=
                      rank_of[static_cast<size_t>(node)] &&
                  std::find(restored.begin(), restored.end(), s) == restored.end()) {
                on_the_way.push_back(s);
              }
            }
          }
          if (mode != kJustInTime && mode != kJustInTimeDrop) {
            // What replaying each again would cost from what is resident now.
            std::vector<double> again(on_the_way.size());
            for (size_t i = 0; i < on_the_way.size(); ++i) again[i] = replay.time({on_the_way[i]});
            for (size_t i = 0; i < on_the_way.size(); ++i) {
              if (double(bytes(on_the_way[i])) <= hold_below * again[i])
                restored.push_back(on_the_way[i]);
            }
          } else if (mode == kJustInTime) {
            restored.insert(restored.end(), on_the_way.begin(), on_the_way.end());
          }
          std::sort(restored.begin(), restored.end());
          j.peak = std::max(j.peak, L.rest(W.bwd_begin[static_cast<size_t>(node)]) + alive +
                                        replay_peak(nodes, restored, false));
          for (int32_t s : restored) {
            resident[static_cast<size_t>(s)] = 1;
            evicted[static_cast<size_t>(s)] = 0;
            alive += bytes(s);
          }
          j.regenerations.push_back({node, std::move(restored)});
        }
        // The window, with what this node releases gone from its free on.
        std::vector<int32_t> released;
        for (int32_t s : all) {
          if (resident[static_cast<size_t>(s)] && last_reader(s) == node) released.push_back(s);
        }
        for (int64_t i = W.bwd_begin[static_cast<size_t>(node)];
             i <= W.bwd_end[static_cast<size_t>(node)]; ++i) {
          int64_t gone = 0;
          for (int32_t s : released) {
            const int64_t f = L.free_at[static_cast<size_t>(s)];
            if (f >= 0 && f < i) gone += bytes(s);
          }
          j.peak = std::max(j.peak, L.rest(i) + alive - gone);
        }
        for (int32_t s : released) {
          resident[static_cast<size_t>(s)] = 0;
          alive -= bytes(s);
          evicted[static_cast<size_t>(s)] = 1;  // released: a later replay recomputes it
        }
      }
      for (int32_t s : all) evicted[static_cast<size_t>(s)] = 0;
    }
    evict_only({});
    for (int32_t s : all) evicted[static_cast<size_t>(s)] = 0;
    marked.clear();
    return b;
  };

  // Interior subsets: tensors that are small, or cheap to hold for what regenerating them
  // costs (an attention's row statistics), are always held; subsets of the largest others are
  // enumerated.
  double stage_fwd_ms = 0;
  for (int32_t n = st.first_node; n <= st.last_node; ++n)
    stage_fwd_ms += p.nodes[static_cast<size_t>(n)].fwd_ms;
  const double stage_ratio =
      double(st.interior_bytes + st.out_bytes) / std::max(stage_fwd_ms, 1e-9);
  std::vector<int32_t> small, big, always;
  evict_only(all);
  for (int32_t s : st.interior) {
    const bool cheap_to_hold = double(bytes(s)) < replay.time({s}) * stage_ratio * kCheapToHold;
    (cheap_to_hold ? small : big).push_back(s);
  }
  evict_only({});
  std::sort(big.begin(), big.end(), [&](int32_t a, int32_t b) { return bytes(a) > bytes(b); });
  if (big.size() > static_cast<size_t>(kMaxEnumerated)) {
    always.assign(big.begin() + kMaxEnumerated, big.end());  // held in every subset
    big.resize(static_cast<size_t>(kMaxEnumerated));
  }
  struct Subset {
    std::vector<int32_t> keep;
    int64_t bytes;
    double keep_ms, regen_ms, out_ms;
  };
  // Every subset of `big`, with the small ones held, then (when there are any) without them:
  // subsets.front() holds exactly what is cheap to hold.
  std::vector<Subset> subsets;
  const uint32_t masks = 1u << big.size();
  for (uint32_t code = 0; code < (small.empty() ? masks : 2 * masks); ++code) {
    const uint32_t mask = code % masks;
    Subset x;
    x.keep = always;
    if (code < masks) x.keep.insert(x.keep.end(), small.begin(), small.end());
    for (size_t i = 0; i < big.size(); ++i) {
      if (mask & (1u << i)) x.keep.push_back(big[i]);
    }
    std::sort(x.keep.begin(), x.keep.end());
    x.bytes = sum_bytes(x.keep, L);
    const std::vector<int32_t> rest = minus(st.interior, x.keep);
    evict_only(rest);  // the stage's backward: input, output and keep resident
    x.regen_ms = replay.time(rest);
    evict_only(all);  // restoring keep and the output from the input
    x.keep_ms = replay.time(join(x.keep, st.out));
    evict_only(minus(all, x.keep));  // re-running to the output with keep resident
    x.out_ms = replay.time(st.out);
    subsets.push_back(std::move(x));
  }
  evict_only({});
  // Options: Pareto in (bytes held, regeneration time); the last holds the whole interior.
  std::vector<const Subset*> order;
  for (const Subset& x : subsets) order.push_back(&x);
  std::sort(order.begin(), order.end(), [](const Subset* a, const Subset* b) {
    if (a->bytes != b->bytes) return a->bytes < b->bytes;
    if (a->regen_ms != b->regen_ms) return a->regen_ms < b->regen_ms;
    return a->keep_ms < b->keep_ms;
  });
  std::vector<const Subset*> chosen;
  for (const Subset* x : order) {
    const bool whole = x->keep.size() == st.interior.size();
    if (!chosen.empty() && x->regen_ms >= chosen.back()->regen_ms - 1e-9) {
      if (!whole) continue;
      chosen.pop_back();
    }
    chosen.push_back(x);
  }
  // The programme codes a choice as option * kBackwardModes + mode below kCutBase: a long front
  // (a large merged stage) is thinned to evenly spaced options, the first (fewest bytes held) and
  // the last (the whole interior) always kept.
  const size_t max_options = static_cast<size_t>(kMaxStageOptions);
  if (chosen.size() > max_options) {
    std::vector<const Subset*> thin;
    for (size_t i = 0; i < max_options; ++i) {
      thin.push_back(chosen[i * (chosen.size() - 1) / (max_options - 1)]);
    }
    chosen = std::move(thin);
  }
  for (const Subset* x : chosen) {
    ChainOption o;
    o.keep = x->keep;
    o.keep_bytes = x->bytes;
    o.keep_ms = x->keep_ms;
    o.back = backward(o.keep);
    st.pass_keep.push_back(pass(join(o.keep, st.out), false));
    st.options.push_back(std::move(o));
  }

  // Holds: the always-held tensors (class 0), then for each weight the subset with the least
  // bytes / stage bytes * weight + (re-run + regeneration time) / the slowest subset's.
  std::vector<const Subset*> hold_sets = {&subsets.front()};
  hold_sets.push_back(small.empty() ? &subsets.front()
                                    : &subsets[masks]);  // not even the cheap ones
  const double stage_bytes = double(std::max<int64_t>(1, st.interior_bytes + st.out_bytes));
  double stage_ms = 1e-9;
  for (const Subset& x : subsets) stage_ms = std::max(stage_ms, x.out_ms + x.regen_ms);
  for (double w : kHoldWeights) {
    const Subset* best = nullptr;
    double best_score = std::numeric_limits<double>::infinity();
    for (const Subset& x : subsets) {
      const double score = double(x.bytes) / stage_bytes * w + (x.out_ms + x.regen_ms) / stage_ms;
      if (score < best_score) {
        best_score = score;
        best = &x;
      }
    }
    hold_sets.push_back(best);
  }
  // ... and for each share of the stage's bytes, the fastest subset (re-run + regeneration) that
  // holds at most that much beyond what is always held.
  // Both ways: the least re-run and regeneration time, and the least re-run time (a segment's
  // stages are re-run more often than their backward regenerates them).
  for (double f : kHoldShares) {
    for (int re_run_only = 0; re_run_only < 2; ++re_run_only) {
      const Subset* best = &subsets.front();
      auto key = [&](const Subset* x) {
        return re_run_only ? std::make_pair(x->out_ms, x->regen_ms)
                           : std::make_pair(x->out_ms + x->regen_ms, 0.0);
      };
      for (const Subset& x : subsets) {
        if (double(x.bytes - subsets.front().bytes) > f * stage_bytes) continue;  // beyond class 0
        const auto a = key(&x), b = key(best);
        if (a.first < b.first - 1e-12 ||
            (a.first <= b.first + 1e-12 &&
             (a.second < b.second - 1e-12 ||
              (a.second <= b.second + 1e-12 && x.bytes < best->bytes)))) {
          best = &x;
        }
      }
      hold_sets.push_back(best);
    }
  }
  for (const Subset* h : hold_sets) {
    ChainHold hold;
    hold.keep = h->keep;
    hold.keep_bytes = sum_bytes(hold.keep, L);
    std::vector<int32_t> nodes;
    evict_only(minus(all, hold.keep));
    hold.out_ms = replay.time(st.out, &nodes);
    std::sort(nodes.begin(), nodes.end());
    hold.replay_out = replay_peak(nodes, st.out, false);
    hold.replay_out_transient_in = replay_peak(nodes, st.out, true);
    hold.replay_none = replay_peak(nodes, {}, false);
    hold.replay_none_transient_in = replay_peak(nodes, {}, true);
    evict_only({});
    hold.base = backward(hold.keep);
    for (const ChainOption& o : st.options) {
      const std::vector<int32_t> held = join(o.keep, hold.keep);
      hold.option_extra.push_back(sum_bytes(held, L) - hold.keep_bytes);
      evict_only(minus(all, hold.keep));
      const std::vector<int32_t> targets = join(minus(held, hold.keep), st.out);
      nodes.clear();
      hold.option_ms.push_back(replay.time(targets, &nodes));
      std::sort(nodes.begin(), nodes.end());
      hold.option_replay.push_back(replay_peak(nodes, targets, false));
      evict_only({});
      hold.option_back.push_back(backward(held));
    }
    const std::vector<int32_t> keep_out = join(hold.keep, st.out);
    hold.pass_out = pass(keep_out, false);
    hold.pass_out_transient_in = pass(keep_out, true);
    hold.pass_none = pass(hold.keep, false);
    hold.pass_none_transient_in = pass(hold.keep, true);
    st.holds.push_back(std::move(hold));
  }
}

}  // namespace

ChainModel build_chain_model(const Profile& p, const LevelChange* change) {
  REGEN_CHECK(
      !change || ((change->offloaded.empty() || change->offloaded.size() == p.saved.size()) &&
                  (change->delta.empty() || change->delta.size() == p.events.size() + 1)),
      "chain model: a level change made for another profile");
  ChainModel m;
  m.no_remat_peak = p.peak_allocated;
  const size_t nn = p.nodes.size(), nv = p.values.size(), ns = p.saved.size();
  if (nn == 0) return m;
  // Each root value's producer and last forward consumer.
  std::vector<int32_t> last_consumer(nv, -1);
  for (const ProfileValue& v : p.values) {
    for (int32_t c : v.consumers) {
      int32_t& lc = last_consumer[static_cast<size_t>(v.root)];
      lc = std::max(lc, c);
    }
  }
  auto crossing_root = [&](const ProfileValue& r) {
    return r.id == r.root && !r.leaf && r.alloc_id != 0 && r.producer >= 0;
  };

  // Units: a block's consecutive nodes, or one node outside blocks. Stage starts are unit starts
  // whose boundary only saved tensors cross.
  // A view (reshape) allocates nothing and stays with the op before it.
  std::vector<int32_t> starts;
  bool pending = false;  // a unit starts at the next op that is not a view
  for (size_t n = 0; n < nn; ++n) {
    const int32_t b = p.nodes[n].block;
    if (!(n == 0 || b < 0 || b != p.nodes[n - 1].block || pending)) continue;
    pending = n > 0 && p.nodes[n].is_view;
    if (!pending) starts.push_back(static_cast<int32_t>(n));
  }
  // Per boundary (before node a): whether an unsaved value crosses it, how many values do, and
  // the saved tensor of the last one counted (the only one where one crosses).
  std::vector<char> bad(nn + 1, 0);
  std::vector<int32_t> crossing(nn + 1, 0), only(nn + 1, -1);
  for (const ProfileValue& r : p.values) {
    if (!crossing_root(r)) continue;
    for (int32_t a = r.producer + 1; a <= last_consumer[static_cast<size_t>(r.id)]; ++a) {
      if (r.saved < 0) bad[static_cast<size_t>(a)] = 1;
      ++crossing[static_cast<size_t>(a)];
      only[static_cast<size_t>(a)] = r.saved;
    }
  }
  // The stage of every node, for stage starts (ascending, the first 0).
  auto stages_of = [nn](const std::vector<int32_t>& starts) {
    std::vector<int32_t> of(nn, 0);
    for (size_t k = 0; k < starts.size(); ++k) {
      const int32_t e = k + 1 < starts.size() ? starts[k + 1] : static_cast<int32_t>(nn);
      for (int32_t i = starts[k]; i < e; ++i) of[static_cast<size_t>(i)] = static_cast<int32_t>(k);
    }
    return of;
  };
  std::vector<int32_t> stage_starts;
  for (int32_t a : starts) {
    if (a == 0 || !bad[static_cast<size_t>(a)]) {
      stage_starts.push_back(a);
    } else {
      ++m.merged;
    }
  }
  // Cuts inside blocks: before a node (not a view) that exactly one value crosses, a saved tensor
  // that may be recomputed (a transformer layer's residual stream between its sublayers). A stage
  // boundary there lets the programme keep that tensor as a checkpoint, or drop a block's first
  // half and keep its second. A cut that would make a tracked tensor cross two boundaries is
  // taken back (below), so cutting never pins anything.
  std::vector<char> inner_cut(nn + 1, 0);
  {
    std::vector<char> is_start(nn + 1, 0);
    for (int32_t a : stage_starts) is_start[static_cast<size_t>(a)] = 1;
    for (size_t a = 1; a < nn; ++a) {
      if (is_start[a] || p.nodes[a].is_view || p.nodes[a].block < 0 || crossing[a] != 1 ||
          only[a] < 0)
        continue;
      if (!p.saved[static_cast<size_t>(only[a])].candidate) continue;
      inner_cut[a] = 1;
      stage_starts.push_back(static_cast<int32_t>(a));
    }
    std::sort(stage_starts.begin(), stage_starts.end());
    // Take back the cuts a candidate would cross beyond its first boundary.
    for (bool changed = true; changed;) {
      changed = false;
      const std::vector<int32_t> stage = stages_of(stage_starts);
      for (const ProfileSaved& sv : p.saved) {
        if (!sv.candidate) continue;
        const int32_t lc = last_consumer[static_cast<size_t>(sv.value)];
        if (lc < 0 || stage[static_cast<size_t>(lc)] - stage[static_cast<size_t>(sv.producer)] <= 1)
          continue;
        for (int32_t a = sv.producer + 1; a <= lc; ++a) {
          if (!inner_cut[static_cast<size_t>(a)]) continue;
          inner_cut[static_cast<size_t>(a)] = 0;
          stage_starts.erase(std::find(stage_starts.begin(), stage_starts.end(), a));
          changed = true;
        }
        if (changed) break;
      }
    }
  }
  // Too many stages: merge the neighbouring pair with the least forward time, repeatedly.
  auto stage_ms = [&](size_t i) {
    const int32_t e = i + 1 < stage_starts.size() ? stage_starts[i + 1] : static_cast<int32_t>(nn);
    double ms = 0;
    for (int32_t n = stage_starts[i]; n < e; ++n) ms += p.nodes[static_cast<size_t>(n)].fwd_ms;
    return ms;
  };
  while (stage_starts.size() > kMaxStages) {
    size_t best = 1;
    double best_ms = std::numeric_limits<double>::infinity();
    for (size_t i = 1; i < stage_starts.size(); ++i) {
      const double ms = stage_ms(i - 1) + stage_ms(i);
      if (ms < best_ms) {
        best_ms = ms;
        best = i;
      }
    }
    stage_starts.erase(stage_starts.begin() + static_cast<std::ptrdiff_t>(best));
  }
  m.cuts = static_cast<int>(std::count_if(stage_starts.begin(), stage_starts.end(), [&](int32_t a) {
    return inner_cut[static_cast<size_t>(a)] != 0;
  }));
  const size_t n = stage_starts.size();
  const std::vector<int32_t> stage_of = stages_of(stage_starts);

  // Tracked tensors: candidates read across at most one stage boundary.
  m.tracked.assign(ns, 0);
  std::vector<int32_t> crossings(ns, 0);
  for (size_t s = 0; s < ns; ++s) {
    const ProfileSaved& sv = p.saved[s];
    if (!sv.candidate) continue;
    if (change && !change->offloaded.empty() && change->offloaded[s]) continue;
    const int32_t lc = last_consumer[static_cast<size_t>(sv.value)];
    crossings[s] =
        lc < 0 ? 0 : stage_of[static_cast<size_t>(lc)] - stage_of[static_cast<size_t>(sv.producer)];
    if (crossings[s] > 1) {
      m.pinned.push_back(static_cast<int32_t>(s));
    } else {
      m.tracked[s] = 1;
    }
  }
  Levels L = no_remat_levels(p, m.tracked);
  if (change && !change->delta.empty()) {
    for (size_t i = 0; i < L.allocated.size(); ++i) L.allocated[i] += change->delta[i];
  }
  const NodeWindows W = node_windows(p);

  m.stages.resize(n);
  for (size_t k = 0; k < n; ++k) {
    ChainStage& st = m.stages[k];
    st.first_node = stage_starts[k];
    st.last_node = k + 1 < n ? stage_starts[k + 1] - 1 : static_cast<int32_t>(nn) - 1;
  }
  for (size_t s = 0; s < ns; ++s) {
    if (!m.tracked[s]) continue;
    const size_t k = static_cast<size_t>(stage_of[static_cast<size_t>(p.saved[s].producer)]);
    if (crossings[s] == 1) {
      m.stages[k].out.push_back(static_cast<int32_t>(s));
      m.stages[k + 1].in.push_back(static_cast<int32_t>(s));
    } else {
      m.stages[k].interior.push_back(static_cast<int32_t>(s));
    }
  }
  // The first node (in backward order) of each stage that backward runs; the latest earlier one
  // for a stage without any.
  int32_t program = -1;
  std::vector<char> active(nn, 0);
  for (int32_t j : p.backward_order) active[static_cast<size_t>(j)] = 1;
  for (size_t k = 0; k < n; ++k) {
    for (int32_t i = m.stages[k].first_node; i <= m.stages[k].last_node; ++i) {
      if (active[static_cast<size_t>(i)]) program = i;
    }
    m.stages[k].program_node = program;
  }

  LocalReplay replay(p);
  std::vector<int32_t> rank_of(nn, -1);
  for (size_t r = 0; r < p.backward_order.size(); ++r)
    rank_of[static_cast<size_t>(p.backward_order[r])] = static_cast<int32_t>(r);
  for (size_t k = 0; k < n; ++k) describe_stage(p, L, W, rank_of, replay, m.stages[k]);
  // Hold classes that pick the same tensors in every stage as an earlier class are one class.
  const size_t classes = m.stages.front().holds.size();
  std::vector<size_t> unique;
  for (size_t q = 0; q < classes; ++q) {
    bool same = false;
    for (size_t u : unique) {
      same = std::all_of(m.stages.begin(), m.stages.end(), [&](const ChainStage& st) {
        return st.holds[q].keep == st.holds[u].keep;
      });
      if (same) break;
    }
    if (!same) unique.push_back(q);
  }
  for (ChainStage& st : m.stages) {
    std::vector<ChainHold> kept;
    for (size_t q : unique) kept.push_back(std::move(st.holds[q]));
    st.holds = std::move(kept);
  }

  if (m.merged > 0 || m.cuts > 0 || !m.pinned.empty()) {
    int64_t pinned_bytes = 0;
    for (int32_t s : m.pinned)
      pinned_bytes += static_cast<int64_t>(p.saved[static_cast<size_t>(s)].bytes);
    m.note = std::to_string(n) + " stages";
    if (m.merged > 0) {
      m.note += " (" + std::to_string(m.merged) +
                " block boundaries merged: a value no saved tensor holds crosses them)";
    }
    if (m.cuts > 0) {
      m.note += " (" + std::to_string(m.cuts) + " inside blocks, where one saved tensor crosses)";
    }
    if (!m.pinned.empty()) {
      m.note += "; " + std::to_string(m.pinned.size()) +
                " tensors read across stages (long skips, " + format_bytes(pinned_bytes) +
                ") stay resident";
    }
  } else {
    m.note = std::to_string(n) + " stages";
  }
  return m;
}

// ---- The programme ----------------------------------------------------------------------------

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int16_t kNone = -1;
constexpr int16_t kCutBase =
    512;  // choice codes: option * kBackwardModes + backward mode (< kCutBase), or cuts
static_assert(kMaxStageOptions * static_cast<int>(kBackwardModes) < kCutBase,
              "a stage's options must fit the programme's choice codes");

class Programme {
 public:
  Programme(const ChainModel& m, int levels)
      : m_(m), n_(m.stages.size()), Q_(m.stages.front().holds.size()) {
    int64_t top = std::max<int64_t>(1, m.no_remat_peak);
    for (const ChainStage& st : m.stages) {
      REGEN_CHECK(st.holds.size() == Q_, "chain planner: stages with different hold classes");
      REGEN_CHECK(kBackwardModes * st.options.size() < static_cast<size_t>(kCutBase),
                  "dp planner: too many options");
      for (int64_t v : st.pass_keep) top = std::max(top, v);
      for (const ChainOption& o : st.options) top = std::max({top, o.back[0].peak, o.back[1].peak});
      for (const ChainHold& h : st.holds) {
        top = std::max({top, h.pass_out, h.pass_out_transient_in, h.pass_none,
                        h.pass_none_transient_in, h.base[0].peak, h.base[1].peak});
      }
    }
    REGEN_CHECK(kCutBase + Q_ * (n_ + 1) < 32767, "chain planner: too many stages");
    M_ = levels;
    unit_ = std::max<int64_t>(1, (top + levels - 1) / levels);
    hold_prefix_.assign(Q_, std::vector<int64_t>(n_ + 1, 0));
    out_ms_prefix_.assign(Q_, std::vector<double>(n_ + 1, 0));
    for (size_t q = 0; q < Q_; ++q) {
      for (size_t k = 0; k < n_; ++k) {
        hold_prefix_[q][k + 1] = hold_prefix_[q][k] + st(k).holds[q].keep_bytes;
        out_ms_prefix_[q][k + 1] = out_ms_prefix_[q][k] + st(k).holds[q].out_ms;
      }
    }
    solve();
  }

  int64_t unit() const { return unit_; }
  int levels() const { return M_; }
  float top_cost(int m) const { return top_[idx_top(0, m)]; }
  void extract(int m, std::vector<Decision>& d, std::vector<std::set<int32_t>>& regen) const {
    extract_top(0, m, d, regen);
  }

 private:
  int u(int64_t bytes) const { return static_cast<int>((bytes + unit_ / 2) / unit_); }
  // The smallest level at which `bytes` fits.
  int need(int64_t bytes) const {
    return bytes <= 0 ? 0 : static_cast<int>((bytes + unit_ - 1) / unit_);
  }
  int64_t held(size_t q, size_t s, size_t t) const {
    return hold_prefix_[q][t + 1] - hold_prefix_[q][s];
  }                                                                      // [s, t]
  size_t pair(size_t s, size_t t) const { return t * (t + 1) / 2 + s; }  // s <= t
  size_t idx_opt(size_t q, size_t s, size_t t, int m) const {
    return ((q * (n_ * (n_ + 1) / 2)) + pair(s, t)) * static_cast<size_t>(M_ + 1) +
           static_cast<size_t>(m);
  }
  size_t idx_top(size_t s, int m) const {
    return s * static_cast<size_t>(M_ + 1) + static_cast<size_t>(m);
  }
  float opt(size_t q, size_t s, size_t t, int m) const {
    return m < 0 ? kInf : opt_[idx_opt(q, s, t, m)];
  }
  float top(size_t s, int m) const { return m < 0 ? kInf : top_[idx_top(s, m)]; }
  const ChainStage& st(size_t k) const { return m_.stages[k]; }

  void solve() {
    const size_t M1 = static_cast<size_t>(M_ + 1);
    opt_.assign(Q_ * (n_ * (n_ + 1) / 2) * M1, kInf);
    opt_choice_.assign(opt_.size(), kNone);
    for (size_t q = 0; q < Q_; ++q) {
      for (size_t len = 0; len < n_; ++len) {
        for (size_t s = 0; s + len < n_; ++s) solve_opt(q, s, s + len);
      }
    }
    top_.assign((n_ + 1) * M1, kInf);
    top_choice_.assign(top_.size(), kNone);
    for (int m = 0; m <= M_; ++m) top_[idx_top(n_, m)] = 0;
    for (size_t s = n_; s-- > 0;) solve_top(s);
  }

  template <class Rest>
  void relax(std::vector<float>& cost, std::vector<int16_t>& choice, size_t base, int from,
             float fixed, int16_t code, const Rest& rest) {
    for (int m = std::max(from, 0); m <= M_; ++m) {
      const float c = fixed + rest(m);
      if (c < cost[base + static_cast<size_t>(m)]) {
        cost[base + static_cast<size_t>(m)] = c;
        choice[base + static_cast<size_t>(m)] = code;
      }
    }
  }

  // Backward of stages [s, t] from a program before stage t's backward. Resident: the input of s,
  // the output of t, and hold class q of every stage in [s, t] (which m does not count: m is the
  // budget left after everything outside [s, t]).
  void solve_opt(size_t q, size_t s, size_t t) {
    const size_t base = idx_opt(q, s, t, 0);
    const ChainStage& S = st(s);
    const ChainHold& H = S.holds[q];
    const int64_t prog = st(t).program_rest;
    const int64_t holds = held(q, s, t);
    if (s == t) {
      for (int v = 0; v < kBackwardModes; ++v) {
        relax(opt_, opt_choice_, base, need(H.base[v].peak - S.out_bytes),
              static_cast<float>(H.base[v].ms), static_cast<int16_t>(v), [](int) { return 0.0f; });
      }
      return;
    }
    // Stage s restores option o and its output, then [s+1, t]; then s's backward (mode v).
    for (size_t o = 0; o < S.options.size(); ++o) {
      const int keep = u(H.keep_bytes + H.option_extra[o] + S.out_bytes);
      for (int v = 0; v < kBackwardModes; ++v) {
        // s's backward runs after t's, which released t's output.
        const StageBackward& b = H.option_back[o][static_cast<size_t>(v)];
        const int from =
            std::max(need(prog + holds + H.option_replay[o]), need(b.peak) - u(st(t).out_bytes));
        relax(opt_, opt_choice_, base, from, static_cast<float>(H.option_ms[o] + b.ms),
              static_cast<int16_t>(kBackwardModes * o + static_cast<size_t>(v)),
              [&](int m) { return opt(q, s + 1, t, m - keep); });
      }
    }
    // Re-run s..i-1 restoring only the input of i; [i, t] first, then [s, i-1].
    int64_t transit = 0;  // the highest replay excess of the stages strictly inside the run
    for (size_t i = s + 1; i <= t; ++i) {
      const ChainStage& L = st(i - 1);
      const int64_t last = i - 1 == s ? L.holds[q].replay_out : L.holds[q].replay_out_transient_in;
      const int64_t first = i - 1 == s ? 0 : H.replay_none;
      const int from = need(prog + holds + std::max({last, first, transit}));
      // [s, i-1] runs after t's backward released t's output.
      const int keep_right = u(L.out_bytes + held(q, s, i - 1)),
                keep_left = u(L.out_bytes) - u(st(t).out_bytes);
      const float fixed = static_cast<float>(out_ms_prefix_[q][i] - out_ms_prefix_[q][s]);
      relax(opt_, opt_choice_, base, from, fixed, static_cast<int16_t>(kCutBase + i), [&](int m) {
        return opt(q, i, t, m - keep_right) + opt(q, s, i - 1, std::min(m - keep_left, M_));
      });
      if (i - 1 > s) transit = std::max(transit, L.holds[q].replay_none_transient_in);
    }
  }

  // The first pass from stage s on (its input resident), then the whole backward of [s, n).
  void solve_top(size_t s) {
    const size_t base = idx_top(s, 0);
    const ChainStage& S = st(s);
    for (size_t o = 0; o < S.options.size(); ++o) {
      const ChainOption& op = S.options[o];
      const int keep = u(op.keep_bytes + S.out_bytes);
      for (int v = 0; v < kBackwardModes; ++v) {
        const StageBackward& b = op.back[static_cast<size_t>(v)];
        const int from = std::max(need(S.pass_keep[o]), need(b.peak));
        relax(top_, top_choice_, base, from, static_cast<float>(b.ms),
              static_cast<int16_t>(kBackwardModes * o + static_cast<size_t>(v)),
              [&](int m) { return top(s + 1, m - keep); });
      }
    }
    // A dropped segment s..i-1 holding class q, then the output of i-1.
    for (size_t q = 0; q < Q_; ++q) {
      int64_t transit = 0;  // the highest first-pass level of the stages strictly inside
      for (size_t i = s + 1; i <= n_; ++i) {
        const ChainStage& L = st(i - 1);
        const int64_t before = held(q, s, i - 1) - L.holds[q].keep_bytes;  // holds of s..i-2
        const int64_t last =
            before + (i - 1 == s ? L.holds[q].pass_out : L.holds[q].pass_out_transient_in);
        const int64_t first = i - 1 == s ? 0 : S.holds[q].pass_none;
        const int from = need(std::max({last, first, transit}));
        const int keep_right = u(held(q, s, i - 1) + L.out_bytes), keep_left = u(L.out_bytes);
        relax(top_, top_choice_, base, from, 0.0f,
              static_cast<int16_t>(kCutBase + q * (n_ + 1) + i),
              [&](int m) { return top(i, m - keep_right) + opt(q, s, i - 1, m - keep_left); });
        if (i - 1 > s) transit = std::max(transit, before + L.holds[q].pass_none_transient_in);
      }
    }
  }

  static void add(std::vector<std::set<int32_t>>& regen, int32_t node,
                  const std::vector<int32_t>& saved) {
    if (saved.empty()) return;
    REGEN_CHECK(node >= 0, "dp planner: a regeneration with no backward node to run before");
    regen[static_cast<size_t>(node)].insert(saved.begin(), saved.end());
  }
  static void add(std::vector<std::set<int32_t>>& regen, const StageBackward& b) {
    for (const Regeneration& r : b.regenerations) add(regen, r.node, r.saved);
  }

  void extract_top(size_t s, int m, std::vector<Decision>& d,
                   std::vector<std::set<int32_t>>& regen) const {
    if (s == n_) return;
    const int16_t c = top_choice_[idx_top(s, m)];
    REGEN_ASSERT(c != kNone);
    const ChainStage& S = st(s);
    if (c < kCutBase) {
      const ChainOption& op = S.options[static_cast<size_t>(c / kBackwardModes)];
      for (int32_t x : minus(S.interior, op.keep)) d[static_cast<size_t>(x)] = Decision::recompute;
      add(regen, op.back[static_cast<size_t>(c % kBackwardModes)]);
      extract_top(s + 1, m - u(op.keep_bytes + S.out_bytes), d, regen);
      return;
    }
    const size_t q = static_cast<size_t>(c - kCutBase) / (n_ + 1),
                 i = static_cast<size_t>(c - kCutBase) % (n_ + 1);
    for (size_t k = s; k < i; ++k) {
      for (int32_t x : minus(st(k).interior, st(k).holds[q].keep))
        d[static_cast<size_t>(x)] = Decision::recompute;
      if (k + 1 < i) {
        for (int32_t x : st(k).out) d[static_cast<size_t>(x)] = Decision::recompute;
      }
    }
    const int64_t out = st(i - 1).out_bytes;
    extract_top(i, m - u(held(q, s, i - 1) + out), d, regen);
    extract_opt(q, s, i - 1, m - u(out), regen);
  }

  void extract_opt(size_t q, size_t s, size_t t, int m,
                   std::vector<std::set<int32_t>>& regen) const {
    const int16_t c = opt_choice_[idx_opt(q, s, t, m)];
    REGEN_ASSERT(c != kNone);
    const ChainStage& S = st(s);
    const ChainHold& H = S.holds[q];
    const int32_t program = st(t).program_node;
    if (s == t) {
      add(regen, H.base[static_cast<size_t>(c)]);
      return;
    }
    if (c < kCutBase) {
      const size_t o = static_cast<size_t>(c / kBackwardModes);
      std::vector<int32_t> restore = minus(S.options[o].keep, H.keep);
      restore.insert(restore.end(), S.out.begin(), S.out.end());
      add(regen, program, restore);
      add(regen, H.option_back[o][static_cast<size_t>(c % kBackwardModes)]);
      extract_opt(q, s + 1, t, m - u(H.keep_bytes + H.option_extra[o] + S.out_bytes), regen);
      return;
    }
    const size_t i = static_cast<size_t>(c - kCutBase);
    add(regen, program, st(i - 1).out);
    const int64_t out = st(i - 1).out_bytes;
    extract_opt(q, i, t, m - u(out + held(q, s, i - 1)), regen);
    extract_opt(q, s, i - 1, std::min(m - u(out) + u(st(t).out_bytes), M_), regen);
  }

  const ChainModel& m_;
  size_t n_, Q_;
  int M_ = 0;
  int64_t unit_ = 1;
  std::vector<std::vector<int64_t>> hold_prefix_;
  std::vector<std::vector<double>> out_ms_prefix_;
  std::vector<float> opt_, top_;
  std::vector<int16_t> opt_choice_, top_choice_;
};

}  // namespace

std::vector<ChainPlan> chain_plans(const Profile& p, const ChainModel& model, int levels) {
  REGEN_CHECK(levels >= 2, "chain planner: needs at least 2 budget levels");
  std::vector<ChainPlan> out;
  if (model.stages.empty()) return out;
  const Programme prog(model, levels);
  std::unordered_set<std::string> seen;
  for (int m = prog.levels(); m >= 0; --m) {
    if (!(prog.top_cost(m) < kInf)) break;  // costs only grow as the level falls
    ChainPlan plan;
    plan.decisions.assign(p.saved.size(), Decision::retain);
    std::vector<std::set<int32_t>> regen(p.nodes.size());
    prog.extract(m, plan.decisions, regen);
    std::string key(plan.decisions.size(), '0');
    for (size_t s = 0; s < plan.decisions.size(); ++s) {
      if (plan.decisions[s] == Decision::recompute) key[s] = '1';
    }
    // Regenerations in backward order.
    for (int32_t j : p.backward_order) {
      const std::set<int32_t>& r = regen[static_cast<size_t>(j)];
      if (r.empty()) continue;
      plan.regenerations.push_back({j, std::vector<int32_t>(r.begin(), r.end())});
      key += "|" + std::to_string(j) + ":";
      for (int32_t s : r) key += std::to_string(s) + ",";
    }
    if (!seen.insert(key).second) continue;
    plan.model_ms = prog.top_cost(m);
    plan.model_budget = static_cast<int64_t>(m) * prog.unit();
    out.push_back(std::move(plan));
  }
  return out;
}

}  // namespace regen
