// Offload points (offload.h).
#include "regen/remat/plan/offload.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include "regen/core/error.h"

namespace regen {

namespace {

// A tensor the offload families may offload: how long it is off the device on a timeline, its
// copy out, and (offload_families) its recompute time per byte.
struct OffloadCand {
  int32_t s;
  double gap, out_ms, cost;
};

// Taken in `order`, every tensor whose copy out still fits what the copy queue out carries in
// `budget_ms`; ascending.
std::vector<int32_t> within_copy_budget(const std::vector<OffloadCand>& order, double budget_ms) {
  std::vector<int32_t> set;
  double used = 0;
  for (const OffloadCand& c : order) {
    if (used + c.out_ms > budget_ms) continue;
    used += c.out_ms;
    set.push_back(c.s);
  }
  std::sort(set.begin(), set.end());
  return set;
}

// The profiled forward pass (to the backward_start marker).
double forward_ms_of(const Profile& p) {
  double forward_ms = 0;
  for (const Marker& m : p.markers) {
    if (m.kind == MarkerKind::backward_start) forward_ms = m.time_ms;
  }
  return forward_ms;
}

}  // namespace

StepTimeline step_timeline(const Profile& p, const Schedule& s) {
  StepTimeline t;
  t.fwd_end.assign(p.nodes.size(), -1);
  t.bwd_reach.assign(p.nodes.size(), -1);
  std::vector<double> bwd_begin(p.nodes.size(), -1);
  for (const Marker& m : p.markers) {
    if (m.node < 0) continue;
    if (m.kind == MarkerKind::fwd_end) t.fwd_end[static_cast<size_t>(m.node)] = m.time_ms;
    if (m.kind == MarkerKind::bwd_begin) bwd_begin[static_cast<size_t>(m.node)] = m.time_ms;
  }
  double programs = 0;
  for (int32_t j : p.backward_order) {
    const int32_t pi = s.program_of_node[static_cast<size_t>(j)];
    // Copies back are waited for before the node's program runs: the time it is reached is
    // before this program, after every earlier one.
    t.bwd_reach[static_cast<size_t>(j)] = bwd_begin[static_cast<size_t>(j)] + programs;
    if (pi >= 0) programs += s.programs[static_cast<size_t>(pi)].time_ms;
  }
  return t;
}

std::vector<Offload> offload_points(const Profile& p, const std::vector<Decision>& decisions,
                                    bool keep_chain, const std::vector<Regeneration>& regenerations,
                                    const TransferModel& transfer) {
  // The schedule with every copy at its latest possible point gives the programs and the waits a
  // program pulls forward; the points below only move the frees later and the copies back
  // earlier, which changes neither.
  OffloadSpec naive;
  naive.transfer = transfer;
  const Schedule s = build_schedule(p, decisions, keep_chain, regenerations, naive);
  std::vector<Offload> out;
  if (s.offloads.empty()) return out;
  const StepTimeline t = step_timeline(p, s);
  const int32_t last_forward = static_cast<int32_t>(p.nodes.size()) - 1;

  // Copies out, in the order they are issued (the schedule's per-node lists).
  std::vector<Offload> by_op(s.offloads.size());
  double queue_free = 0;
  for (int32_t n = 0; n <= last_forward; ++n) {
    for (int32_t i : s.offload_issue_after[static_cast<size_t>(n)]) {
      const OffloadOp& op = s.offloads[static_cast<size_t>(i)];
      const double start = std::max(t.fwd_end[static_cast<size_t>(n)], queue_free);
      queue_free = start + op.to_host_ms;
      int32_t free_after = last_forward;
      for (int32_t m = p.saved[static_cast<size_t>(op.saved)].last_fwd_use; m <= last_forward;
           ++m) {
        if (t.fwd_end[static_cast<size_t>(m)] >= queue_free) {
          free_after = m;
          break;
        }
      }
      by_op[static_cast<size_t>(i)].saved = op.saved;
      by_op[static_cast<size_t>(i)].free_after = free_after;
    }
  }

  // Copies back, as late as possible: by the time they are needed, latest first.
  std::vector<int32_t> order(s.offloads.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  auto need = [&](int32_t i) {
    return t.bwd_reach[static_cast<size_t>(s.offloads[static_cast<size_t>(i)].wait_before)];
  };
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const int32_t ra =
        p.nodes[static_cast<size_t>(s.offloads[static_cast<size_t>(a)].wait_before)].bwd_rank;
    const int32_t rb =
        p.nodes[static_cast<size_t>(s.offloads[static_cast<size_t>(b)].wait_before)].bwd_rank;
    return ra != rb ? ra > rb : a > b;  // the queue's reverse order
  });
  double latest = std::numeric_limits<double>::infinity();
  for (int32_t i : order) {
    const OffloadOp& op = s.offloads[static_cast<size_t>(i)];
    const double finish = std::min(need(i), latest);
    const double start = finish - op.to_device_ms;
    latest = start;
    // The latest backward node, no later than the wait, that the step reaches by `start`.
    const int32_t wait_rank = p.nodes[static_cast<size_t>(op.wait_before)].bwd_rank;
    int32_t at = p.backward_order.front();
    for (int32_t r = wait_rank; r >= 0; --r) {
      const int32_t j = p.backward_order[static_cast<size_t>(r)];
      if (t.bwd_reach[static_cast<size_t>(j)] <= start) {
        at = j;
        break;
      }
    }
    by_op[static_cast<size_t>(i)].prefetch_before = at;
  }
  out = std::move(by_op);
  std::sort(out.begin(), out.end(),
            [](const Offload& a, const Offload& b) { return a.saved < b.saved; });
  return out;
}

LevelChange level_change(const Profile& p, const std::vector<int32_t>& saved, StatePlace state,
                         const TransferModel& transfer) {
  LevelChange c;
  c.offloaded.assign(p.saved.size(), 0);
  c.delta.assign(p.events.size() + 1, 0);
  const NodeWindows w = node_windows(p);
  auto sub = [&](int64_t from, int64_t to, int64_t bytes) {  // positions [from, to)
    for (int64_t i = std::max<int64_t>(from, 0); i < to && i < static_cast<int64_t>(c.delta.size());
         ++i)
      c.delta[static_cast<size_t>(i)] -= bytes;
  };
  if (!saved.empty()) {
    std::vector<Decision> d(p.saved.size(), Fate::retain);
    for (int32_t s : saved) d[static_cast<size_t>(s)] = Fate::offload;
    const std::vector<Offload> pts = offload_points(p, d, true, {}, transfer);
    std::unordered_map<uint64_t, int64_t> block_bytes;
    for (const ProfileEvent& e : p.events) {
      if (e.kind == MemoryEventKind::alloc) block_bytes[e.block_id] = e.bytes;
    }
    for (const Offload& o : pts) {
      c.offloaded[static_cast<size_t>(o.saved)] = 1;
      const uint64_t id =
          p.values[static_cast<size_t>(p.saved[static_cast<size_t>(o.saved)].value)].alloc_id;
      sub(w.fwd_end[static_cast<size_t>(o.free_after)],
          w.bwd_begin[static_cast<size_t>(o.prefetch_before)], block_bytes.at(id));
    }
  }
  if (state == StatePlace::host) {
    // The state's blocks, per parameter in allocation order.
    std::vector<std::pair<uint64_t, std::pair<std::string, int64_t>>> blocks;
    for (const AllocatorState::SegmentRec& seg : p.start_state.segments) {
      for (const BlockInfo& b : seg.blocks) {
        if (!b.allocated || b.category != Category::optimizer_state) continue;
        const std::string tag = tag_name(b.tag);
        blocks.push_back({b.id, {tag.substr(0, tag.rfind('.')), static_cast<int64_t>(b.size)}});
      }
    }
    std::sort(blocks.begin(), blocks.end());
    std::vector<int64_t> groups;
    int64_t total = 0;
    std::string last;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (i == 0 || blocks[i].second.first != last) groups.push_back(0);
      last = blocks[i].second.first;
      groups.back() += blocks[i].second.second;
      total += blocks[i].second.second;
    }
    int64_t streamed = 0;  // the most the update holds on the device at once
    for (size_t g = 0; g < groups.size(); ++g) {
      int64_t here = groups[g];
      if (g > 0) here += groups[g - 1];
      if (g + 1 < groups.size()) here += groups[g + 1];
      streamed = std::max(streamed, here);
    }
    sub(0, static_cast<int64_t>(c.delta.size()), total);
    for (const Marker& m : p.markers) {
      if (m.kind != MarkerKind::optimizer_begin) continue;
      for (const Marker& e : p.markers) {
        if (e.kind == MarkerKind::optimizer_end)
          sub(static_cast<int64_t>(m.position), static_cast<int64_t>(e.position) + 1, -streamed);
      }
    }
  }
  return c;
}

std::vector<std::pair<std::string, std::vector<int32_t>>> plan_offload_sets(
    const Profile& p, const std::vector<Decision>& decisions,
    const std::vector<Regeneration>& regenerations, const TransferModel& transfer) {
  std::vector<std::pair<std::string, std::vector<int32_t>>> out;
  if (p.accumulate > 1 || !transfer.valid()) return out;
  REGEN_CHECK(decisions.size() == p.saved.size(), "plan_offload_sets: ", decisions.size(),
              " decisions for ", p.saved.size(), " saved tensors");
  std::vector<Decision> d = decisions;
  bool any = false;
  for (const ProfileSaved& sv : p.saved) {
    Decision& x = d[static_cast<size_t>(sv.index)];
    if (sv.offloadable && x == Decision::retain) {
      x = Decision::offload;
      any = true;
    }
  }
  if (!any) return out;
  // Every retained offloadable tensor offloaded, each copy at its latest point: the schedule's
  // timeline (with the plan's regeneration programs) says when each is needed back.
  OffloadSpec naive;
  naive.transfer = transfer;
  const Schedule s = build_schedule(p, d, false, regenerations, naive);
  const StepTimeline t = step_timeline(p, s);
  const double forward_ms = forward_ms_of(p);
  std::vector<OffloadCand> cands;
  for (const OffloadOp& op : s.offloads) {
    const ProfileSaved& sv = p.saved[static_cast<size_t>(op.saved)];
    const double gap = t.bwd_reach[static_cast<size_t>(op.wait_before)] -
                       t.fwd_end[static_cast<size_t>(sv.last_fwd_use)];
    if (gap <= op.to_host_ms + op.to_device_ms) continue;
    cands.push_back({op.saved, gap, op.to_host_ms, 0});
  }
  std::stable_sort(cands.begin(), cands.end(),
                   [](const OffloadCand& a, const OffloadCand& b) { return a.gap > b.gap; });
  // Each larger copy budget keeps what the smaller one chose and adds to it, longest off first, so
  // the sets are nested. (Chosen afresh at each budget, a long copy that fits only the larger one
  // could crowd out many small ones the smaller budget took: the sets then depended on the
  // profile's timings in a way no budget order explains.)
  std::vector<char> taken(cands.size(), 0);
  std::vector<int32_t> chosen;
  double used = 0;
  for (double f : {0.25, 0.5, 1.0, 2.0, std::numeric_limits<double>::infinity()}) {
    const double budget = std::isinf(f) ? f : f * forward_ms;
    for (size_t i = 0; i < cands.size(); ++i) {
      if (taken[i] || used + cands[i].out_ms > budget) continue;
      taken[i] = 1;
      used += cands[i].out_ms;
      chosen.push_back(cands[i].s);
    }
    std::vector<int32_t> set = chosen;
    std::sort(set.begin(), set.end());
    if (set.empty() || (!out.empty() && out.back().second == set)) continue;
    out.emplace_back(std::isinf(f) ? std::string("what the plan retains, off long enough")
                                   : "the plan's longest off first, " +
                                         std::to_string(f).substr(0, 4) + " forward pass of copies",
                     std::move(set));
  }
  return out;
}

std::vector<OffloadFamily> offload_families(const Profile& p, bool activations, bool optimizer,
                                            const TransferModel& transfer) {
  std::vector<OffloadFamily> out;
  // A step of several micro-batches offloads nothing yet (the simulator refuses it).
  if (p.accumulate > 1) return out;
  std::vector<std::vector<int32_t>> sets;
  std::vector<std::string> names;
  if (activations && transfer.valid()) {
    const Schedule none = build_schedule(p, std::vector<Decision>(p.saved.size(), Fate::retain));
    const StepTimeline t = step_timeline(p, none);
    const double forward_ms = forward_ms_of(p);
    std::vector<OffloadCand> cands;
    for (const ProfileSaved& sv : p.saved) {
      if (!sv.offloadable) continue;
      const int32_t reader = p.backward_order[static_cast<size_t>(sv.first_bw_rank)];
      const double gap = t.bwd_reach[static_cast<size_t>(reader)] -
                         t.fwd_end[static_cast<size_t>(sv.last_fwd_use)];
      const double out_ms = transfer.to_host.ms(sv.bytes), in_ms = transfer.to_device.ms(sv.bytes);
      if (gap <= out_ms + in_ms) continue;  // it could not be off the device for long
      const double cost = sv.candidate ? sv.recompute_ms / double(std::max<uint64_t>(sv.bytes, 1))
                                       : std::numeric_limits<double>::infinity();
      cands.push_back({sv.index, gap, out_ms, cost});
    }
    std::vector<OffloadCand> by_gap = cands, by_cost = cands;
    std::stable_sort(by_gap.begin(), by_gap.end(),
                     [](const OffloadCand& a, const OffloadCand& b) { return a.gap > b.gap; });
    std::stable_sort(by_cost.begin(), by_cost.end(),
                     [](const OffloadCand& a, const OffloadCand& b) {
                       return a.cost != b.cost ? a.cost > b.cost : a.gap > b.gap;
                     });
    for (const auto& [order, label] : {std::make_pair(&by_gap, "longest off first"),
                                       std::make_pair(&by_cost, "costliest first")}) {
      for (double f : {0.25, 0.5, 1.0, 2.0}) {
        sets.push_back(within_copy_budget(*order, f * forward_ms));
        names.push_back(std::string(label) + ", " + std::to_string(f).substr(0, 4) +
                        " forward pass of copies");
      }
    }
    sets.push_back(within_copy_budget(by_gap, std::numeric_limits<double>::infinity()));
    names.push_back("every offloadable tensor off long enough");
  }
  for (int st = optimizer ? 0 : 1; st < 2; ++st) {
    const StatePlace place = st == 0 ? StatePlace::host : StatePlace::device;
    std::vector<std::vector<int32_t>> done;
    if (place == StatePlace::host) {  // the state alone
      OffloadFamily f;
      f.name = "optimizer state";
      f.optimizer_state = place;
      f.change = level_change(p, {}, place, transfer);
      out.push_back(std::move(f));
    }
    for (size_t i = 0; i < sets.size(); ++i) {
      if (sets[i].empty() || std::find(done.begin(), done.end(), sets[i]) != done.end()) continue;
      done.push_back(sets[i]);
      OffloadFamily f;
      f.name = names[i] + (place == StatePlace::host ? ", optimizer state" : "");
      f.saved = sets[i];
      f.optimizer_state = place;
      f.change = level_change(p, sets[i], place, transfer);
      out.push_back(std::move(f));
    }
  }
  return out;
}

}  // namespace regen
