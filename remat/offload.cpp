// Offload points (offload.h).
#include "regen/remat/offload.h"

#include <algorithm>
#include <limits>

#include "regen/core/error.h"

namespace regen {

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

}  // namespace regen
