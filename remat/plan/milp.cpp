// The MILP planner (milp.h). The formulation, in the profile's terms (C = the candidates; for s in
// C: prod(s) its producer, lastfwd(s) its last forward use, first(s) and last(s) its first and last
// backward ranks, b(s) its block size; r = 0..B-1 are backward ranks, j_r = backward_order[r]):
//
//   e[s]     binary   s is evicted (RECOMPUTE)
//   Q[r][s]  binary   s is restored by the program before rank r (r <= first(s)); sum_r Q = e
//   R[r][n]  binary   forward node n is replayed by that program; created only where some
//                     regeneration could need it (n leads to a candidate needed at or after r
//                     through values that are not certainly resident) and where n can be replayed
//   objective: sum R[r][n] * fwd_ms(n)
//
// Residency before the program at r: S_pre[r][s] = 1 - sum_{r' >= r} Q[r'][s] for r <= first(s),
// 1 after (until released). A replayed node needs each input: a leaf (or a view of one) is
// there; a saved tensor that is certainly resident is there; a candidate whose residency is
// variable is there or its producer is replayed (R[r][n] <= S_pre + R[r][producer]); anything
// else (a value no saved tensor holds, a released saved tensor) is replayed
// (R[r][n] <= R[r][producer]). The replay set that build_schedule computes is the smallest set
// satisfying these rows, so the model's cost is the executor's whenever the solution is minimal,
// which an optimum is (every replay costs; 1e-7 ms is added to nodes whose median is 0).
//
// Memory (B' = the internal budget, bytes scaled to MiB in the rows):
//  - the event log's levels (0..E) are cut into pieces at every forward node's end (evictions),
//    every program (bwd_begin of j_r), and every candidate's allocation and free; within a piece
//    the candidates alive in the profiled run are fixed, and the plan holds each of them:
//    forward node n: always if n <= lastfwd(s), else 1 - e[s]; after the forward pass: 1 - e[s];
//    in backward rank r: S_post[r][s] if r < first(s), else 1 (a regenerated block is freed by the
//    same event that freed the original). Row: max rest(piece) + held candidates <= B'.
//  - inside the program at rank r, before each replayed node n (in forward order): rest at
//    bwd_begin(j_r) + candidates certainly held there + the variable residency before the
//    program (Mvar[r-1]) + targets restored by earlier replayed nodes (T) + n's own forward peak
//    (own_peak of its window) * R[r][n] + every replayed value produced by m < n that a replayed
//    node c >= n still reads (A >= R[m] + R[c] - 1 - Q[r][its saved tensor]) <= B'.
// Mvar[r] = sum_{s: r < first(s)} b(s) S_post[r][s] is one continuous variable per rank defined by
// a recurrence, and so are the running sums T and the suffix sums of Q, which keeps the model
// sparse. When c's replay forces m's (c reads v through a value never resident at r, or through an
// evicted candidate restored only later), A >= R[c] (+ U[r+1] - 1) tightens the same bound.
//
// Exactness: the plan space is the executor's, and the cost is exact. Memory is exact as long as
// every tensor gets the same block size in every plan, which holds in the small pool (requests up
// to 1 MiB, blocks split to the rounded size); a large block is not split when 1 MiB or less
// would remain, so there block sizes depend on the plan, and the model can be off either way. The
// round loop handles the optimistic side; see plan_milp.
#include "regen/remat/plan/milp.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <unordered_map>

#include "regen/core/error.h"
#include "regen/core/types.h"
#include "regen/remat/simulate/liveness.h"

#if defined(REGEN_WITH_MILP)
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <iterator>
#include <mutex>

#include "Cbc_C_Interface.h"
#endif

namespace regen {

double milp_round_limit(double limit_s, double elapsed_s, int round) {
  const double left = limit_s - elapsed_s;
  if (round <= 1) return std::max(left, 0.01);
  return left >= 0.01 ? left : -1.0;
}

double milp_stop_after(double limit_s) {
  return limit_s + std::max(2.0, limit_s);
}

#if !defined(REGEN_WITH_MILP)

bool milp_available() {
  return false;
}

Plan plan_milp(const Simulator&, int64_t budget_bytes, const MilpOptions&, MilpReport*) {
  REGEN_CHECK(budget_bytes > 0, "plan_milp: the budget must be positive, got ", budget_bytes,
              " bytes");
  REGEN_FAIL(
      "the milp policy needs regen built with CBC (coinor-libcbc-dev): install it "
      "(scripts/install-deps.sh) and configure again (cmake -DREGEN_MILP=ON)");
}

#else

bool milp_available() {
  return true;
}

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kInf = std::numeric_limits<double>::max();
// The objective is in microseconds: forward medians of small ops are fractions of a millisecond,
// close to the solver's tolerances in ms.
constexpr double kObjScale = 1000.0;
constexpr double kFreeNodeMs = 1e-7;  // cost of replaying a node whose forward median is 0

double mib(int64_t bytes) {
  return static_cast<double>(bytes) / kMiB;
}

// A linear program in row form. Rows that bound memory are "budget rows": their upper bound is
// B' (MiB) minus a constant, set per solve.
struct Lp {
  std::vector<double> lb, ub, obj;
  std::vector<char> integer;
  struct Row {
    std::vector<std::pair<int, double>> terms;
    double lo = -kInf, hi = kInf;
    bool budget = false;  // hi = B' - hi_const
    double hi_const = 0;
  };
  std::vector<Row> rows;
  int64_t binaries = 0;

  int col(double l, double u, double o, bool is_int) {
    lb.push_back(l);
    ub.push_back(u);
    obj.push_back(o);
    integer.push_back(is_int ? 1 : 0);
    binaries += is_int ? 1 : 0;
    return static_cast<int>(lb.size()) - 1;
  }
  int binary(double o = 0) { return col(0, 1, o, true); }
  int continuous(double l = -kInf, double u = kInf) { return col(l, u, 0, false); }

  static void merge(std::vector<std::pair<int, double>>& t) {
    std::sort(t.begin(), t.end());
    size_t k = 0;
    for (size_t i = 0; i < t.size(); ++i) {
      if (k > 0 && t[k - 1].first == t[i].first) {
        t[k - 1].second += t[i].second;
      } else {
        t[k++] = t[i];
      }
    }
    t.resize(k);
    t.erase(std::remove_if(t.begin(), t.end(), [](const auto& x) { return x.second == 0; }),
            t.end());
  }
  void row(std::vector<std::pair<int, double>> t, double lo, double hi) {
    merge(t);
    Row r;
    r.terms = std::move(t);
    r.lo = lo;
    r.hi = hi;
    rows.push_back(std::move(r));
  }
  // terms <= B' - c (MiB)
  void budget_row(std::vector<std::pair<int, double>> t, double c) {
    merge(t);
    Row r;
    r.terms = std::move(t);
    r.budget = true;
    r.hi_const = c;
    rows.push_back(std::move(r));
  }
};

enum class Need { none, replay, maybe };

// The MILP for one profile; the budget only enters through the budget rows' bounds.
struct Model {
  Lp lp;
  std::vector<int32_t> cands;
  std::vector<int> e;                         // per saved tensor: column, -1 for non-candidates
  std::vector<std::vector<int>> q;            // per saved tensor: per rank 0..first: column or -1
  std::vector<std::vector<int>> rcol;         // per rank: per node: column or -1
  std::vector<std::vector<int32_t>> closure;  // per rank: nodes with a column, ascending
  // A budget row without variables whose constant alone decides feasibility: the highest one.
  double fixed_need = 0;
  std::string fixed_where;
};

// Whether the programme decides s: a candidate that no offload family offloads (an offloaded
// tensor is there whenever something reads it, copied back first, as a non-candidate is).
bool decided(const ProfileSaved& s, const LevelChange* change) {
  return s.candidate &&
         !(change && !change->offloaded.empty() && change->offloaded[static_cast<size_t>(s.index)]);
}

// Builds the Model: the columns and rows in a fixed order (column indices follow it), a method per
// family of them.
class Builder {
 public:
  Builder(const Profile& p, const LevelChange* change)
      : p_(p),
        change_(change),
        ns_(p.saved.size()),
        nn_(p.nodes.size()),
        nb_(static_cast<int32_t>(p.backward_order.size())) {}

  Model build() {
    track_candidates();
    index_profile();
    // e.
    m_.e.assign(ns_, -1);
    for (int32_t s : m_.cands) m_.e[static_cast<size_t>(s)] = m_.lp.binary();
    add_replay_columns();
    add_restore_columns();
    add_replay_inputs();
    add_forward_sums();
    add_backward_sums();
    add_phase_rows();
    for (int32_t r = 0; r < nb_; ++r) add_program_rows(r);
    return std::move(m_);
  }

 private:
  int64_t bs(int32_t s) const { return L_.block_bytes[static_cast<size_t>(s)]; }
  const ProfileSaved& sv(int32_t s) const { return p_.saved[static_cast<size_t>(s)]; }

  // The candidates the programme decides, and the no-remat levels with them tracked (moved by the
  // offload family's change).
  void track_candidates() {
    std::vector<char> tracked(ns_, 0);
    for (const ProfileSaved& s : p_.saved) {
      if (decided(s, change_)) {
        tracked[static_cast<size_t>(s.index)] = 1;
        m_.cands.push_back(s.index);
      }
    }
    L_ = no_remat_levels(p_, tracked);
    if (change_ && !change_->delta.empty()) {
      REGEN_ASSERT(change_->delta.size() == L_.allocated.size());
      for (size_t i = 0; i < L_.allocated.size(); ++i) L_.allocated[i] += change_->delta[i];
    }
  }

  // What the rows read of the profile: node windows, block sizes, which nodes can be replayed, and
  // the nodes reading each root's storage.
  void index_profile() {
    w_ = node_windows(p_);
    ne_ = static_cast<int64_t>(p_.events.size());
    for (const ProfileEvent& ev : p_.events) {
      if (ev.kind == MemoryEventKind::alloc) block_bytes_[ev.block_id] = ev.bytes;
    }
    // Values recomputable from leaves still readable in backward (as finalize_profile derives).
    std::vector<char> replayable(p_.values.size(), 1);
    for (const ProfileValue& v : p_.values) {
      if (v.leaf) {
        replayable[static_cast<size_t>(v.id)] = v.available;
        continue;
      }
      for (int64_t in : p_.nodes[static_cast<size_t>(v.producer)].inputs) {
        if (in >= 0 && !replayable[static_cast<size_t>(in)])
          replayable[static_cast<size_t>(v.id)] = 0;
      }
    }
    node_ok_.assign(nn_, 1);
    for (const ProfileNode& n : p_.nodes) {
      for (int64_t in : n.inputs) {
        if (in >= 0 && !replayable[static_cast<size_t>(in)])
          node_ok_[static_cast<size_t>(n.index)] = 0;
      }
    }
    root_readers_.assign(p_.values.size(), {});
    for (const ProfileValue& v : p_.values) {
      for (int32_t c : v.consumers) root_readers_[static_cast<size_t>(v.root)].push_back(c);
    }
    for (auto& r : root_readers_) {
      std::sort(r.begin(), r.end());
      r.erase(std::unique(r.begin(), r.end()), r.end());
    }
  }

  // What a replay at rank r must do about input v.
  Need need(int64_t v, int32_t r, int32_t& s_out) const {
    const ProfileValue& val = p_.values[static_cast<size_t>(v)];
    if (val.leaf) return Need::none;
    const ProfileValue& root = p_.values[static_cast<size_t>(val.root)];
    if (root.leaf) return Need::none;
    if (root.saved >= 0) {
      const ProfileSaved& s = sv(root.saved);
      if (decided(s, change_)) {
        if (r <= s.first_bw_rank) {
          s_out = s.index;
          return Need::maybe;
        }
        return r <= s.last_bw_rank ? Need::none : Need::replay;
      }
      return r <= s.last_bw_rank ? Need::none : Need::replay;
    }
    return Need::replay;
  }

  // R: per rank, the nodes a regeneration might replay, then those that can be replayed.
  void add_replay_columns() {
    m_.rcol.assign(static_cast<size_t>(nb_), std::vector<int>(nn_, -1));
    m_.closure.assign(static_cast<size_t>(nb_), {});
    for (int32_t r = 0; r < nb_; ++r) {
      std::vector<char> seen(nn_, 0);
      std::vector<int32_t> stack;
      for (int32_t s : m_.cands) {
        if (sv(s).first_bw_rank >= r && !seen[static_cast<size_t>(sv(s).producer)]) {
          seen[static_cast<size_t>(sv(s).producer)] = 1;
          stack.push_back(sv(s).producer);
        }
      }
      while (!stack.empty()) {
        const int32_t n = stack.back();
        stack.pop_back();
        for (int64_t in : p_.nodes[static_cast<size_t>(n)].inputs) {
          if (in < 0) continue;
          int32_t s2 = -1;
          if (need(in, r, s2) == Need::none) continue;
          const int32_t prod = p_.values[static_cast<size_t>(in)].producer;
          if (!seen[static_cast<size_t>(prod)]) {
            seen[static_cast<size_t>(prod)] = 1;
            stack.push_back(prod);
          }
        }
      }
      std::vector<int>& rc = m_.rcol[static_cast<size_t>(r)];
      for (size_t n = 0; n < nn_; ++n) {
        if (!seen[n] || !node_ok_[n]) continue;
        bool ok = true;
        for (int64_t in : p_.nodes[n].inputs) {
          int32_t s2 = -1;
          if (in >= 0 && need(in, r, s2) == Need::replay &&
              rc[static_cast<size_t>(p_.values[static_cast<size_t>(in)].producer)] < 0) {
            ok = false;
          }
        }
        if (!ok) continue;
        const double cost = kObjScale * (std::max(p_.nodes[n].fwd_ms, 0.0) + kFreeNodeMs);
        rc[n] = m_.lp.binary(cost);
        m_.closure[static_cast<size_t>(r)].push_back(static_cast<int32_t>(n));
      }
    }
  }

  // Q, with sum_r Q[r][s] = e[s] and Q[r][s] <= R[r][prod(s)].
  void add_restore_columns() {
    m_.q.assign(ns_, {});
    for (int32_t s : m_.cands) {
      const ProfileSaved& x = sv(s);
      std::vector<int>& qs = m_.q[static_cast<size_t>(s)];
      qs.assign(static_cast<size_t>(x.first_bw_rank) + 1, -1);
      std::vector<std::pair<int, double>> sum = {{m_.e[static_cast<size_t>(s)], -1.0}};
      for (int32_t r = 0; r <= x.first_bw_rank; ++r) {
        const int rp = m_.rcol[static_cast<size_t>(r)][static_cast<size_t>(x.producer)];
        if (rp < 0) continue;
        const int c = m_.lp.binary();
        qs[static_cast<size_t>(r)] = c;
        sum.push_back({c, 1.0});
        m_.lp.row({{c, 1.0}, {rp, -1.0}}, -kInf, 0);
      }
      m_.lp.row(std::move(sum), 0, 0);
    }
  }

  // Suffix sums U[r][s] = sum_{r' >= r} Q[r'][s] (1 - S_pre[r][s]), made on demand.
  int U(int32_t r, int32_t s) {
    const std::vector<int>& qs = m_.q[static_cast<size_t>(s)];
    if (r >= static_cast<int32_t>(qs.size())) return -1;
    auto it = ucache_.find({r, s});
    if (it != ucache_.end()) return it->second;
    const int rest = U(r + 1, s);
    const int here = qs[static_cast<size_t>(r)];
    int c = -1;
    if (rest < 0) {
      c = here;
    } else if (here < 0) {
      c = rest;
    } else {
      c = m_.lp.continuous();
      m_.lp.row({{c, 1.0}, {here, -1.0}, {rest, -1.0}}, 0, 0);
    }
    ucache_[{r, s}] = c;
    return c;
  }

  // Replays need their inputs.
  void add_replay_inputs() {
    for (int32_t r = 0; r < nb_; ++r) {
      const std::vector<int>& rc = m_.rcol[static_cast<size_t>(r)];
      for (int32_t n : m_.closure[static_cast<size_t>(r)]) {
        const int rn = rc[static_cast<size_t>(n)];
        std::vector<int64_t> ins;
        for (int64_t in : p_.nodes[static_cast<size_t>(n)].inputs) {
          if (in >= 0) ins.push_back(in);
        }
        std::sort(ins.begin(), ins.end());
        ins.erase(std::unique(ins.begin(), ins.end()), ins.end());
        for (int64_t in : ins) {
          int32_t s2 = -1;
          const Need k = need(in, r, s2);
          if (k == Need::none) continue;
          const int rp = rc[static_cast<size_t>(p_.values[static_cast<size_t>(in)].producer)];
          if (k == Need::replay) {
            REGEN_ASSERT(rp >= 0);
            m_.lp.row({{rn, 1.0}, {rp, -1.0}}, -kInf, 0);
          } else {
            const int u = U(r, s2);
            if (u < 0) continue;  // never restored at or after r: resident if evicted
            std::vector<std::pair<int, double>> t = {{rn, 1.0}, {u, 1.0}};
            if (rp >= 0) t.push_back({rp, -1.0});
            m_.lp.row(std::move(t), -kInf, 1);
          }
        }
      }
    }
  }

  // Forward: Ecum[n] = sum_{s: lastfwd(s) < n} b(s) e[s], a running sum.
  void add_forward_sums() {
    ecum_.assign(nn_ + 1, -1);
    std::vector<std::vector<int32_t>> by_last(nn_);
    for (int32_t s : m_.cands) by_last[static_cast<size_t>(sv(s).last_fwd_use)].push_back(s);
    for (size_t n = 1; n <= nn_; ++n) {
      ecum_[n] = ecum_[n - 1];
      if (by_last[n - 1].empty()) continue;
      const int c = m_.lp.continuous();
      std::vector<std::pair<int, double>> t = {{c, 1.0}};
      if (ecum_[n - 1] >= 0) t.push_back({ecum_[n - 1], -1.0});
      for (int32_t s : by_last[n - 1]) t.push_back({m_.e[static_cast<size_t>(s)], -mib(bs(s))});
      m_.lp.row(std::move(t), 0, 0);
      ecum_[n] = c;
    }
  }

  // Mvar[r] (index r + 1; Mvar[-1] at 0) = sum_{s: r < first(s)} b(s) S_post[r][s].
  void add_backward_sums() {
    mvar_.assign(static_cast<size_t>(nb_) + 1, -1);
    int64_t total = 0;
    for (int32_t s : m_.cands) total += bs(s);
    mvar_[0] = m_.lp.continuous();
    std::vector<std::pair<int, double>> t = {{mvar_[0], 1.0}};
    if (ecum_[nn_] >= 0) t.push_back({ecum_[nn_], 1.0});
    m_.lp.row(std::move(t), mib(total), mib(total));
    for (int32_t r = 0; r < nb_; ++r) {
      const int c = m_.lp.continuous();
      mvar_[static_cast<size_t>(r) + 1] = c;
      std::vector<std::pair<int, double>> row = {{c, 1.0}, {mvar_[static_cast<size_t>(r)], -1.0}};
      int64_t leaving = 0;
      for (int32_t s : m_.cands) {
        const ProfileSaved& x = sv(s);
        if (r > x.first_bw_rank) continue;
        const int qc = m_.q[static_cast<size_t>(s)][static_cast<size_t>(r)];
        if (qc >= 0) row.push_back({qc, -mib(bs(s))});
        if (x.first_bw_rank == r) leaving += bs(s);
      }
      m_.lp.row(std::move(row), -mib(leaving), -mib(leaving));
    }
  }

  bool alive(int32_t s, int64_t level) const {
    const int64_t a = L_.alloc_at[static_cast<size_t>(s)], f = L_.free_at[static_cast<size_t>(s)];
    return a >= 0 && a < level && (f < 0 || level <= f);
  }

  // Budget rows over the event log: per forward node, after the forward pass, per backward rank,
  // each cut into pieces where a candidate is allocated or freed.
  void add_phase_rows() {
    for (int32_t s : m_.cands) {
      if (L_.alloc_at[static_cast<size_t>(s)] >= 0)
        cuts_.push_back(L_.alloc_at[static_cast<size_t>(s)] + 1);
      if (L_.free_at[static_cast<size_t>(s)] >= 0)
        cuts_.push_back(L_.free_at[static_cast<size_t>(s)] + 1);
    }
    std::sort(cuts_.begin(), cuts_.end());
    cuts_.erase(std::unique(cuts_.begin(), cuts_.end()), cuts_.end());
    for (size_t n = 0; n < nn_; ++n) {
      const int64_t a = n == 0 ? 0 : w_.fwd_end[n - 1] + 1;
      phase_rows(a, w_.fwd_end[n], Phase::forward, static_cast<int32_t>(n));
    }
    {
      const int64_t a = w_.fwd_end[nn_ - 1] + 1;
      const int64_t b = nb_ > 0 ? w_.bwd_begin[static_cast<size_t>(p_.backward_order[0])] : ne_;
      phase_rows(a, b, Phase::between, -1);
    }
    for (int32_t r = 0; r < nb_; ++r) {
      const int64_t a =
          w_.bwd_begin[static_cast<size_t>(p_.backward_order[static_cast<size_t>(r)])] + 1;
      const int64_t b =
          r + 1 < nb_
              ? w_.bwd_begin[static_cast<size_t>(p_.backward_order[static_cast<size_t>(r) + 1])]
              : ne_;
      phase_rows(a, b, Phase::backward, r);
    }
  }

  // forward: idx is the forward node; between: after the forward pass; backward: idx is the rank.
  enum class Phase { forward, between, backward };
  void phase_rows(int64_t a, int64_t b, Phase kind, int32_t idx) {
    if (a > b) return;
    std::vector<int64_t> starts = {a};
    for (auto it = std::upper_bound(cuts_.begin(), cuts_.end(), a); it != cuts_.end() && *it <= b;
         ++it) {
      starts.push_back(*it);
    }
    for (size_t k = 0; k < starts.size(); ++k) {
      const int64_t pa = starts[k], pb = k + 1 < starts.size() ? starts[k + 1] - 1 : b;
      int64_t fixed = L_.max_rest(pa, pb);
      std::vector<std::pair<int, double>> t;
      for (int32_t s : m_.cands) {
        if (!alive(s, pa)) continue;
        const ProfileSaved& x = sv(s);
        if (kind == Phase::backward && idx < x.first_bw_rank) continue;  // in Mvar[idx]
        fixed += bs(s);
      }
      if (kind == Phase::forward && ecum_[static_cast<size_t>(idx)] >= 0) {
        // Candidates whose last forward use is before idx are alive here (allocated in
        // forward, freed in backward) and evicted with e: -b e.
        t.push_back({ecum_[static_cast<size_t>(idx)], -1.0});
      }
      if (kind == Phase::between && ecum_[nn_] >= 0) t.push_back({ecum_[nn_], -1.0});
      if (kind == Phase::backward) t.push_back({mvar_[static_cast<size_t>(idx) + 1], 1.0});
      add_budget_row(std::move(t), fixed, pa, pb);
    }
  }

  // The regeneration program at rank r: the replayed values it holds at each of its nodes, then a
  // budget row per node.
  void add_program_rows(int32_t r) {
    const std::vector<int32_t>& cl = m_.closure[static_cast<size_t>(r)];
    if (cl.empty()) return;
    const std::vector<int>& rc = m_.rcol[static_cast<size_t>(r)];
    const int64_t at = w_.bwd_begin[static_cast<size_t>(p_.backward_order[static_cast<size_t>(r)])];
    int64_t fixed = L_.rest(at);
    for (int32_t s : m_.cands) {
      if (sv(s).first_bw_rank < r && alive(s, at)) fixed += bs(s);
    }
    const std::vector<std::vector<std::pair<int, double>>> held = held_values(r);
    int tcol = -1;  // targets restored by the replayed nodes so far
    for (size_t k = 0; k < cl.size(); ++k) {
      const int32_t n = cl[k];
      std::vector<std::pair<int, double>> t = {{mvar_[static_cast<size_t>(r)], 1.0}};
      if (tcol >= 0) t.push_back({tcol, 1.0});
      const int64_t own =
          L_.own_peak(w_.fwd_begin[static_cast<size_t>(n)], w_.fwd_end[static_cast<size_t>(n)]);
      t.push_back({rc[static_cast<size_t>(n)], mib(own)});
      for (const auto& h : held[k]) t.push_back(h);
      add_budget_row(std::move(t), fixed, at, at);
      // Targets n produces.
      std::vector<std::pair<int, double>> adds;
      for (int32_t s : m_.cands) {
        if (sv(s).producer != n) continue;
        const std::vector<int>& qs = m_.q[static_cast<size_t>(s)];
        if (static_cast<size_t>(r) < qs.size() && qs[static_cast<size_t>(r)] >= 0) {
          adds.push_back({qs[static_cast<size_t>(r)], -mib(bs(s))});
        }
      }
      if (!adds.empty() && k + 1 < cl.size()) {
        const int c = m_.lp.continuous();
        adds.push_back({c, 1.0});
        if (tcol >= 0) adds.push_back({tcol, -1.0});
        m_.lp.row(std::move(adds), 0, 0);
        tcol = c;
      }
    }
  }

  // Per position in rank r's program: the replayed values held there, as (column, MiB) terms.
  std::vector<std::vector<std::pair<int, double>>> held_values(int32_t r) {
    const std::vector<int32_t>& cl = m_.closure[static_cast<size_t>(r)];
    const std::vector<int>& rc = m_.rcol[static_cast<size_t>(r)];
    std::vector<size_t> pos(p_.nodes.size(), 0);
    for (size_t k = 0; k < cl.size(); ++k) pos[static_cast<size_t>(cl[k])] = k;
    std::vector<std::vector<std::pair<int, double>>> held(cl.size());
    for (size_t k = 0; k < cl.size(); ++k) {
      const int32_t mnode = cl[k];
      for (int64_t v : p_.nodes[static_cast<size_t>(mnode)].outputs) {
        const ProfileValue& val = p_.values[static_cast<size_t>(v)];
        if (val.root != v || val.alloc_id == 0) continue;
        auto bb = block_bytes_.find(val.alloc_id);
        if (bb == block_bytes_.end() || bb->second <= 0) continue;
        std::vector<int32_t> readers;
        for (int32_t c : root_readers_[static_cast<size_t>(v)]) {
          if (c > mnode && rc[static_cast<size_t>(c)] >= 0) readers.push_back(c);
        }
        if (readers.empty()) continue;
        const size_t last = pos[static_cast<size_t>(readers.back())];
        std::vector<int> a(cl.size(), -1);
        for (size_t i = k + 1; i <= last; ++i) {
          a[i] = m_.lp.continuous(0, 1);
          held[i].push_back({a[i], mib(bb->second)});
          if (i > k + 1) m_.lp.row({{a[i - 1], 1.0}, {a[i], -1.0}}, 0, kInf);
        }
        int qc = -1;
        if (val.saved >= 0 && decided(sv(val.saved), change_)) {
          const std::vector<int>& qs = m_.q[static_cast<size_t>(val.saved)];
          if (static_cast<size_t>(r) < qs.size()) qc = qs[static_cast<size_t>(r)];
        }
        for (int32_t c : readers) {
          std::vector<std::pair<int, double>> t = {{a[pos[static_cast<size_t>(c)]], 1.0},
                                                   {rc[static_cast<size_t>(mnode)], -1.0},
                                                   {rc[static_cast<size_t>(c)], -1.0}};
          if (qc >= 0) t.push_back({qc, 1.0});
          m_.lp.row(std::move(t), -1, kInf);
          tighten_held(r, v, c, a[pos[static_cast<size_t>(c)]]);
        }
      }
    }
    return held;
  }

  // Tighter, when c's replay forces the held value's: c reads v's storage through a value that is
  // never resident at r (A >= R[c]), or through a candidate's that is evicted and restored only
  // after r (A >= R[c] + U[r+1] - 1).
  void tighten_held(int32_t r, int64_t v, int32_t c, int ac) {
    const int rcc = m_.rcol[static_cast<size_t>(r)][static_cast<size_t>(c)];
    for (int64_t in : p_.nodes[static_cast<size_t>(c)].inputs) {
      if (in < 0 || p_.values[static_cast<size_t>(in)].root != v) continue;
      int32_t s2 = -1;
      const Need k2 = need(in, r, s2);
      if (k2 == Need::replay) {
        m_.lp.row({{ac, 1.0}, {rcc, -1.0}}, 0, kInf);
      } else if (k2 == Need::maybe) {
        const int u = U(r + 1, s2);
        if (u >= 0) m_.lp.row({{ac, 1.0}, {rcc, -1.0}, {u, -1.0}}, -1, kInf);
      }
    }
  }

  void add_budget_row(std::vector<std::pair<int, double>> t, int64_t fixed, int64_t a, int64_t b) {
    Lp::merge(t);
    if (t.empty()) {
      if (mib(fixed) > m_.fixed_need) {
        m_.fixed_need = mib(fixed);
        m_.fixed_where = "event levels " + std::to_string(a) + ".." + std::to_string(b);
      }
      return;
    }
    m_.lp.budget_row(std::move(t), mib(fixed));
  }

  const Profile& p_;
  const LevelChange* change_;
  const size_t ns_, nn_;  // saved tensors, nodes
  const int32_t nb_;      // backward ranks
  Model m_;
  Levels L_;
  NodeWindows w_;
  int64_t ne_ = 0;                                     // events
  std::unordered_map<uint64_t, int64_t> block_bytes_;  // allocation id -> block size
  std::vector<char> node_ok_;                          // per node: replayable from its inputs
  std::vector<std::vector<int32_t>> root_readers_;     // per root: nodes reading its storage
  std::map<std::pair<int32_t, int32_t>, int> ucache_;  // U's columns
  std::vector<int> ecum_, mvar_;                       // the running sums' columns
  std::vector<int64_t> cuts_;  // event levels where a candidate is allocated or freed
};

struct Solved {
  bool has_solution = false, optimal = false, infeasible = false, time_limit = false;
  double objective = 0, bound = 0, seconds = 0;
  std::vector<double> x;
  std::string status;
};

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

Solved solve_here(const Lp& lp, int64_t budget, const MilpOptions& opt,
                  const std::vector<std::pair<int, double>>& start) {
  const int nc = static_cast<int>(lp.lb.size()), nr = static_cast<int>(lp.rows.size());
  // Column-major copy.
  std::vector<int> count(static_cast<size_t>(nc) + 1, 0);
  for (const Lp::Row& r : lp.rows) {
    for (const auto& t : r.terms) count[static_cast<size_t>(t.first) + 1]++;
  }
  for (int c = 0; c < nc; ++c) count[static_cast<size_t>(c) + 1] += count[static_cast<size_t>(c)];
  std::vector<CoinBigIndex> begin(count.begin(), count.end());
  std::vector<int> index(static_cast<size_t>(count.back()));
  std::vector<double> value(static_cast<size_t>(count.back()));
  std::vector<int> fill(count.begin(), count.end() - 1);
  std::vector<double> rlo(static_cast<size_t>(nr)), rhi(static_cast<size_t>(nr));
  for (int i = 0; i < nr; ++i) {
    const Lp::Row& r = lp.rows[static_cast<size_t>(i)];
    for (const auto& t : r.terms) {
      const int k = fill[static_cast<size_t>(t.first)]++;
      index[static_cast<size_t>(k)] = i;
      value[static_cast<size_t>(k)] = t.second;
    }
    rlo[static_cast<size_t>(i)] = r.lo;
    rhi[static_cast<size_t>(i)] = r.budget ? mib(budget) - r.hi_const : r.hi;
  }
  Cbc_Model* model = Cbc_newModel();
  Cbc_loadProblem(model, nc, nr, begin.data(), index.data(), value.data(), lp.lb.data(),
                  lp.ub.data(), lp.obj.data(), rlo.data(), rhi.data());
  for (int c = 0; c < nc; ++c) {
    if (lp.integer[static_cast<size_t>(c)]) Cbc_setInteger(model, c);
  }
  const char* log = std::getenv("REGEN_MILP_LOG");
  const bool verbose = log && std::string(log) == "1";
  Cbc_setParameter(model, "log", verbose ? "1" : "0");
  Cbc_setParameter(model, "timeMode", "elapsed");  // the limit is wall-clock time
  Cbc_setParameter(model, "sec", num(std::max(opt.time_limit_s, 0.01)).c_str());
  Cbc_setParameter(model, "ratio", num(std::max(opt.relative_gap, 0.0)).c_str());
  if (opt.threads > 1) Cbc_setParameter(model, "threads", std::to_string(opt.threads).c_str());
  // CBC's preprocessing stays off. Debian's CBC 2.10.8 dereferences a null pointer in
  // CglPreProcess::postProcess when the time limit falls inside the preprocessed solve (a limit of
  // 0.03-0.1 s on transformer-tiny with a MIP start crashed every time; 0.5 s did on a loaded
  // machine), and a solve stopped there can report "infeasible" for a feasible model. Without it
  // the small graphs prove the same optima in about the same time (test_milp).
  Cbc_setParameter(model, "preprocess", "off");
  if (!start.empty()) {
    std::vector<int> idx;
    std::vector<double> val;
    for (const auto& s : start) {
      idx.push_back(s.first);
      val.push_back(s.second);
    }
    Cbc_setMIPStartI(model, static_cast<int>(idx.size()), idx.data(), val.data());
  }
  const auto t0 = std::chrono::steady_clock::now();
  Cbc_solve(model);
  Solved out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.infeasible = Cbc_isProvenInfeasible(model) != 0;
  out.time_limit = Cbc_isSecondsLimitReached(model) != 0;
  const double* best = Cbc_bestSolution(model);
  if (!best && lp.binaries == 0 && Cbc_isProvenOptimal(model)) best = Cbc_getColSolution(model);
  out.has_solution = best != nullptr && !out.infeasible;
  out.optimal = out.has_solution && Cbc_isProvenOptimal(model) != 0;
  if (out.has_solution) {
    out.x.assign(best, best + nc);
    out.objective = Cbc_getObjValue(model) / kObjScale;
  }
  out.bound = Cbc_getBestPossibleObjValue(model) / kObjScale;
  if (out.optimal) {
    out.status = "optimal";
  } else if (out.infeasible) {
    out.status = "infeasible";
  } else if (out.time_limit) {
    out.status = out.has_solution ? "time limit" : "time limit (no solution)";
  } else {
    out.status = std::string(out.has_solution ? "stopped" : "stopped (no solution)") + " (status " +
                 std::to_string(Cbc_status(model)) + "/" +
                 std::to_string(Cbc_secondaryStatus(model)) + ")";
  }
  Cbc_deleteModel(model);
  return out;
}

// ---- The solve in a child process ----------------------------------------------------------
// CBC and Clp install their own SIGINT handlers while they run (they stop the branch and bound at
// its next node, or nothing at all before it starts), so in the process that runs them Ctrl-C was
// swallowed: a solve ran to its time limit and its plan was written. The solve runs in a child
// process instead, and the planning process keeps its signals: SIGINT, SIGTERM or SIGHUP during a
// solve kills the child, puts the process's own handling back and raises the signal again (by
// default the process dies of it, before anything is written; a program that handles it, such as
// Python, gets it), then plan_milp throws. A crash inside CBC ends the child only, and becomes an
// error naming the signal.

volatile sig_atomic_t g_stop_signal = 0;
extern "C" void note_stop_signal(int sig) {
  g_stop_signal = sig;
}

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Catches the stop signals while a solve runs; the previous handling comes back when it ends.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = note_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < std::size(kStopSignals); ++i) {
      ::sigaction(kStopSignals[i], &sa, &old_[i]);
      // A signal the process ignores (nohup, a background job) stays ignored.
      if (!(old_[i].sa_flags & SA_SIGINFO) && old_[i].sa_handler == SIG_IGN)
        ::sigaction(kStopSignals[i], &old_[i], nullptr);
    }
  }
  ~StopSignals() { restore(); }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  void restore() {
    if (restored_) return;
    for (size_t i = 0; i < std::size(kStopSignals); ++i)
      ::sigaction(kStopSignals[i], &old_[i], nullptr);
    restored_ = true;
  }

 private:
  struct sigaction old_[std::size(kStopSignals)]{};
  bool restored_ = false;
};

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

struct SolvedHeader {
  int32_t has_solution, optimal, infeasible, time_limit;
  double objective, bound, seconds;
  uint64_t status_size, x_size;
};

// The child's side: solve, send the answer, and leave without running the parent's exit handlers.
[[noreturn]] void solve_in_child(int fd, pid_t parent, const Lp& lp, int64_t budget,
                                 const MilpOptions& opt,
                                 const std::vector<std::pair<int, double>>& start) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a parent that dies takes the solve with it
  if (::getppid() != parent) ::_exit(3);
  for (int sig : kStopSignals) ::signal(sig, SIG_DFL);
  int code = 0;
  try {
    const Solved s = solve_here(lp, budget, opt, start);
    const SolvedHeader h{s.has_solution, s.optimal, s.infeasible,    s.time_limit, s.objective,
                         s.bound,        s.seconds, s.status.size(), s.x.size()};
    const bool ok = write_all(fd, &h, sizeof h) &&
                    write_all(fd, s.status.data(), s.status.size()) &&
                    write_all(fd, s.x.data(), s.x.size() * sizeof(double));
    code = ok ? 0 : 4;
  } catch (...) {
    code = 5;
  }
  ::_exit(code);
}

// One solve at a time: the stop signals' handling is the process's.
std::mutex g_solve_mutex;

Solved solve(const Lp& lp, int64_t budget, const MilpOptions& opt,
             const std::vector<std::pair<int, double>>& start) {
  const std::lock_guard<std::mutex> lock(g_solve_mutex);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return solve_here(lp, budget, opt, start);
  StopSignals signals;
  const pid_t parent = ::getpid();
  // What the process has buffered would otherwise be written by the child too.
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) {  // no process to spare: solve here (a signal then stops nothing early)
    ::close(fds[0]);
    ::close(fds[1]);
    signals.restore();
    return solve_here(lp, budget, opt, start);
  }
  if (pid == 0) {
    ::close(fds[0]);
    solve_in_child(fds[1], parent, lp, budget, opt, start);
  }
  ::close(fds[1]);
  std::string bytes;
  char buf[1 << 16];
  // CBC checks its limit between steps of its search: a long first LP relaxation overruns a
  // small one. Past milp_stop_after the child is stopped, and the round has no solution.
  const auto stop_at = std::chrono::steady_clock::now() +
                       std::chrono::duration<double>(milp_stop_after(opt.time_limit_s));
  bool overran = false;
  while (g_stop_signal == 0) {
    if (std::chrono::steady_clock::now() >= stop_at) {
      overran = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int r = ::poll(&p, 1, 100);
    if (r < 0 && errno != EINTR) break;
    if (r <= 0) continue;
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) break;  // the child is done (or gone)
    bytes.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  const int stop = g_stop_signal;
  if (stop != 0 || overran) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (overran && stop == 0) {
    Solved out;
    out.time_limit = true;
    out.seconds = milp_stop_after(opt.time_limit_s);
    out.status = "time limit (no solution: the solver ran past its limit and was stopped)";
    return out;
  }
  if (stop != 0) {
    signals.restore();
    ::raise(stop);
    REGEN_FAIL("the MILP solve was stopped by ", strsignal(stop), ": no plan");
  }
  REGEN_CHECK(
      WIFEXITED(status) && WEXITSTATUS(status) == 0, "CBC ",
      WIFSIGNALED(status) ? std::string("crashed (") + strsignal(WTERMSIG(status)) + ")"
                          : "failed (exit status " + std::to_string(WEXITSTATUS(status)) + ")",
      " while solving the MILP (", lp.lb.size(), " variables, ", lp.rows.size(), " rows): no plan");
  SolvedHeader h{};
  REGEN_CHECK(bytes.size() >= sizeof h, "the MILP solve sent back ", bytes.size(),
              " bytes, too few for its answer");
  std::memcpy(&h, bytes.data(), sizeof h);
  REGEN_CHECK(bytes.size() == sizeof h + h.status_size + h.x_size * sizeof(double),
              "the MILP solve sent back ", bytes.size(), " bytes, not its answer's");
  Solved out;
  out.has_solution = h.has_solution != 0;
  out.optimal = h.optimal != 0;
  out.infeasible = h.infeasible != 0;
  out.time_limit = h.time_limit != 0;
  out.objective = h.objective;
  out.bound = h.bound;
  out.seconds = h.seconds;
  out.status.assign(bytes.data() + sizeof h, h.status_size);
  out.x.resize(h.x_size);
  if (h.x_size > 0) {  // an empty vector's data() may be null, which memcpy may not take
    std::memcpy(out.x.data(), bytes.data() + sizeof h + h.status_size, h.x_size * sizeof(double));
  }
  return out;
}

// The model's values for a plan, as a MIP start: e, Q and R (every binary).
// The model's peak for a solution: the highest budget row.
int64_t model_peak(const Model& m, const std::vector<double>& x) {
  double top = m.fixed_need;
  for (const Lp::Row& r : m.lp.rows) {
    if (!r.budget) continue;
    double v = r.hi_const;
    for (const auto& t : r.terms) v += t.second * x[static_cast<size_t>(t.first)];
    top = std::max(top, v);
  }
  return static_cast<int64_t>(std::llround(top * kMiB));
}

std::vector<std::pair<int, double>> start_of(const Profile& p, const Model& m, const Plan& plan,
                                             std::string& note) {
  std::vector<double> v(m.lp.lb.size(), 0.0);
  bool exact = true;
  for (size_t s = 0; s < p.saved.size() && s < plan.decisions.size(); ++s) {
    if (plan.decisions[s] != Decision::recompute) continue;
    if (m.e[s] < 0) {
      exact = false;
      continue;
    }
    v[static_cast<size_t>(m.e[s])] = 1;
  }
  const Schedule sch = plan_schedule(p, plan);
  for (const RegenProgram& prog : sch.programs) {
    const int32_t r = p.nodes[static_cast<size_t>(prog.backward_node)].bwd_rank;
    for (const ReplayStep& st : prog.steps) {
      const int c = m.rcol[static_cast<size_t>(r)][static_cast<size_t>(st.node)];
      if (c < 0) {
        exact = false;
      } else {
        v[static_cast<size_t>(c)] = 1;
      }
      for (const ReplayStep::Output& o : st.outputs) {
        if (o.fate != ReplayStep::Fate::restore) continue;
        const std::vector<int>& qs = m.q[static_cast<size_t>(o.saved)];
        if (static_cast<size_t>(r) >= qs.size() || qs[static_cast<size_t>(r)] < 0) {
          exact = false;
          continue;
        }
        v[static_cast<size_t>(qs[static_cast<size_t>(r)])] = 1;
      }
    }
  }
  if (!exact) note = "the start plan does not map onto the model exactly";
  std::vector<std::pair<int, double>> out;
  for (size_t c = 0; c < v.size(); ++c) {
    if (m.lp.integer[c]) out.push_back({static_cast<int>(c), v[c]});
  }
  return out;
}

std::string percent(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g%%", 100.0 * f);
  return buf;
}

}  // namespace

Plan plan_milp(const Simulator& sim, int64_t budget_bytes, const MilpOptions& opt,
               MilpReport* report) {
  REGEN_CHECK(budget_bytes > 0, "plan_milp: the budget must be positive, got ", budget_bytes,
              " bytes");
  REGEN_CHECK(std::getenv("REGEN_MILP_PARAMS") == nullptr,
              "REGEN_MILP_PARAMS is set, but regen no longer passes CBC parameters from it (they "
              "went to the solver unchecked, and preprocess=on crashed CBC at short time limits): "
              "unset it; the solver's options are the time limit (--milp-time-limit) and threads");
  const auto t0 = std::chrono::steady_clock::now();
  const Profile& p = sim.profile();
  MilpReport rep;
  Plan plan;
  plan.policy = "milp";
  plan.budget_bytes = budget_bytes;
  {
    Budget b;
    b.kind = Budget::Kind::bytes;
    b.value = static_cast<double>(budget_bytes);
    plan.budget_text = b.str();
  }
  plan.keep_chain = false;
  plan.decisions.assign(p.saved.size(), Decision::retain);
  const LevelChange* change = nullptr;
  if (opt.offload) {  // the family's offloads and optimizer state, in every plan below
    REGEN_CHECK(opt.transfer.valid(), "plan_milp: an offload family needs a transfer model");
    for (int32_t s : opt.offload->saved) {
      REGEN_CHECK(s >= 0 && static_cast<size_t>(s) < p.saved.size() &&
                      p.saved[static_cast<size_t>(s)].offloadable,
                  "plan_milp: the offload family names saved tensor ", s,
                  ", which is not an offloadable one of this profile");
      plan.decisions[static_cast<size_t>(s)] = Decision::offload;
    }
    plan.optimizer_state = opt.offload->optimizer_state;
    plan.transfer = opt.transfer;
    if (plan.offloaded() > 0)
      plan.offloads = offload_points(p, plan.decisions, false, {}, opt.transfer);
    change = &opt.offload->change;
  }
  plan.lower_bound = memory_lower_bound(p, opt.mode);
  plan.budget_of = opt.budget_of;
  const BudgetOf of = opt.budget_of;
  // The no-remat peak is the step's with nothing recomputed or offloaded; `none` below is the
  // plan that only offloads (the family's, when given).
  plan.no_remat_peak = peak_of(
      sim.run(build_schedule(p, std::vector<Decision>(p.saved.size(), Decision::retain))), of);
  const SimResult none = sim.run(plan_schedule(p, plan));
  const PlanFit none_fit =
      fit_schedule(sim, plan_schedule(p, plan), budget_bytes, of, &none, opt.planned_layout);
  plan.predicted = none_fit.result;
  plan.layout = none_fit.layout;
  plan.lowest_peak = peak_of(none_fit.result, of);  // with a planned layout, its planned run
  bool plan_fits = none_fit.fits;
  auto finish = [&](Plan& out) {
    out.feasible = plan_fits;
    out.limit = plan_fits && of == BudgetOf::reserved ? limit_for(out.predicted, budget_bytes) : 0;
    if (opt.planned_layout) ensure_planned_layout(sim, out);
    out.lowest_peak = std::min(out.lowest_peak, peak_of(out.predicted, of));
    out.planning_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    rep.total_s = out.planning_ms / 1000.0;
    if (report) *report = rep;
    return out;
  };
  if (none_fit.fits) {
    rep.status = "optimal";
    plan.note = "milp: the budget needs no recomputation";
    return finish(plan);
  }

  plan_fits = false;
  if (std::none_of(p.saved.begin(), p.saved.end(),
                   [&](const ProfileSaved& s) { return decided(s, change); })) {
    rep.status = "infeasible";
    plan.note = "budget " + format_bytes(budget_bytes) +
                " cannot be met by milp: no saved tensor "
                "can be recomputed; lower bound " +
                format_bytes(plan.lower_bound);
    return finish(plan);
  }
  Model m = Builder(p, change).build();
  rep.variables = static_cast<int64_t>(m.lp.lb.size());
  rep.binaries = m.lp.binaries;
  rep.constraints = static_cast<int64_t>(m.lp.rows.size());
  std::string start_note;
  std::vector<std::pair<int, double>> start;
  if (opt.start) start = start_of(p, m, *opt.start, start_note);

  bool have = false;  // a solved plan in `best`
  bool best_fits = false;
  Plan best = plan;
  MilpReport best_rep;
  int64_t internal = budget_bytes;
  int64_t max_under = 0;
  std::string stop;
  const int rounds = std::max(opt.max_rounds, 1);
  for (int round = 1; round <= rounds; ++round) {
    rep.rounds = round;
    rep.internal_budget = internal;
    if (mib(internal) < m.fixed_need) {
      rep.status = "infeasible";
      stop = "memory that no plan changes (" + m.fixed_where + ") needs " +
             format_bytes(static_cast<int64_t>(m.fixed_need * kMiB)) + " > " +
             format_bytes(internal);
      break;
    }
    // One limit for the whole call: this round gets what is left of it.
    MilpOptions round_opt = opt;
    round_opt.time_limit_s = milp_round_limit(
        opt.time_limit_s,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), round);
    if (round_opt.time_limit_s < 0) {
      stop = "time limit reached after " + std::to_string(round - 1) + " round(s)";
      break;
    }
    const Solved s = solve(m.lp, internal, round_opt, start);
    rep.solve_s += s.seconds;
    if (!s.has_solution) {
      rep.status = s.status;
      stop = s.status + " at internal budget " + format_bytes(internal);
      break;
    }
    Plan cand = plan;
    double model_ms = 0;
    for (int32_t x : m.cands) {
      if (s.x[static_cast<size_t>(m.e[static_cast<size_t>(x)])] > 0.5) {
        cand.decisions[static_cast<size_t>(x)] = Decision::recompute;
      }
    }
    for (int32_t r = 0; r < static_cast<int32_t>(p.backward_order.size()); ++r) {
      Regeneration g;
      g.node = p.backward_order[static_cast<size_t>(r)];
      for (int32_t x : m.cands) {
        const std::vector<int>& qs = m.q[static_cast<size_t>(x)];
        if (static_cast<size_t>(r) < qs.size() && qs[static_cast<size_t>(r)] >= 0 &&
            s.x[static_cast<size_t>(qs[static_cast<size_t>(r)])] > 0.5) {
          g.saved.push_back(x);
        }
      }
      if (!g.saved.empty()) cand.regenerations.push_back(std::move(g));
      for (int32_t n : m.closure[static_cast<size_t>(r)]) {
        if (s.x[static_cast<size_t>(m.rcol[static_cast<size_t>(r)][static_cast<size_t>(n)])] >
            0.5) {
          model_ms += p.nodes[static_cast<size_t>(n)].fwd_ms;
        }
      }
    }
    // The copies' points follow the regenerations (a program that reads an offloaded tensor
    // needs it back before it runs).
    if (cand.offloaded() > 0) {
      cand.offloads = offload_points(p, cand.decisions, false, cand.regenerations, cand.transfer);
    }
    const SimResult unlimited = sim.run(plan_schedule(p, cand));
    PlanFit fit =
        fit_schedule(sim, plan_schedule(p, cand), budget_bytes, of, &unlimited, opt.planned_layout);
    cand.predicted = std::move(fit.result);
    cand.layout = std::move(fit.layout);
    plan.lowest_peak = std::min(plan.lowest_peak, peak_of(cand.predicted, of));
    rep.status = s.status;
    rep.objective_ms = model_ms;
    rep.bound_ms = std::max(0.0, std::min(s.bound, s.objective));
    rep.gap =
        s.optimal || s.objective <= 0 ? 0.0 : std::max(0.0, (s.objective - s.bound) / s.objective);
    if (!s.optimal && s.time_limit) rep.status = "time limit (gap " + percent(rep.gap) + ")";
    const int64_t peak = peak_of(cand.predicted, of);
    const bool fits = fit.fits;
    if (!have || fits || (!best_fits && peak < peak_of(best.predicted, of))) {
      best = std::move(cand);
      best_rep = rep;
      best_fits = fits;
      have = true;
    }
    if (fits) break;
    // The model was optimistic by `under` for this plan: where a large block lands depends on
    // the plan (the allocator does not split one when 1 MiB or less would remain), so the
    // profiled block sizes are not exact; and a reserved budget also pays for the allocator's
    // cached segments, which the rows do not count. Solve again with the budget lowered by the
    // largest error seen, and a little more: that excludes this plan and admits those the model
    // misjudges by no more.
    const int64_t under = peak - model_peak(m, s.x);
    max_under = std::max(max_under, under);
    const int64_t next = budget_bytes - max_under - std::max<int64_t>(max_under / 100, 4096);
    internal = std::min(next, internal - 4096);
    stop = "simulated peak over the budget after " + std::to_string(round) + " round(s)";
  }
  const int64_t last_internal = rep.internal_budget;
  const int last_rounds = rep.rounds;
  const double solve_s = rep.solve_s;
  const std::string last_status = rep.status;
  if (have) {
    rep = best_rep;
    const int64_t lowest = plan.lowest_peak;
    plan = std::move(best);
    plan.lowest_peak = lowest;
  }
  rep.rounds = last_rounds;
  rep.internal_budget = last_internal;
  rep.solve_s = solve_s;
  rep.total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  char buf[480];
  std::snprintf(
      buf, sizeof buf,
      "milp: %s, recompute %.3f ms (bound %.3f ms, gap %s), %d round(s), internal budget %s, "
      "%lld variables (%lld binary), %lld rows, %.2f s solving, %.2f s in all (limit %g s)",
      rep.status.c_str(), rep.objective_ms, rep.bound_ms, percent(rep.gap).c_str(), rep.rounds,
      format_bytes(rep.internal_budget).c_str(), static_cast<long long>(rep.variables),
      static_cast<long long>(rep.binaries), static_cast<long long>(rep.constraints), rep.solve_s,
      rep.total_s, opt.time_limit_s);
  plan.note = buf;
  if (!start_note.empty()) plan.note += "; " + start_note;
  const bool fits = have && best_fits;
  plan_fits = fits;
  if (!fits) {
    if (!have) rep.status = last_status;
    plan.note = "budget " + format_bytes(budget_bytes) + " cannot be met by milp (" +
                (stop.empty() ? rep.status : stop) + "): lowest peak reached " +
                format_bytes(std::min(plan.lowest_peak, peak_of(plan.predicted, of))) +
                ", lower bound " + format_bytes(plan.lower_bound) + "; " + plan.note;
    if (last_status == "infeasible") rep.status = "infeasible";
  }
  return finish(plan);
}

#endif

}  // namespace regen
