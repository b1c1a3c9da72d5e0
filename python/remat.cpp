// Stages 1 and 2 from Python: Profile (the graph as numpy columns, peaks, the lower bound),
// plan() with any registered planner, simulate() for any decision vector (the exact simulator,
// built once per profile), make_plan() for a plan made by hand, and register_planner() for a
// planner written in Python.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>

#include "python/bindings.h"
#include "regen/core/allocator.h"
#include "regen/remat/execute/dtr.h"
#include "regen/session/session.h"

namespace regen::py {
namespace {

constexpr double kIntMax = 2147483647.0;  // for arguments held in an int

// A hard limit in bytes (0: none): "simulate: limit must be >= 0 bytes (0: none), got -1"; beyond
// the bytes an int64 holds, the range's words.
int64_t limit_arg(const char* call, const pb::object& v) {
  if (PyIndex_Check(v.ptr()) && !pb::isinstance<pb::bool_>(v) && pb::int_(v) < pb::int_(0)) {
    REGEN_FAIL(call, ": limit must be >= 0 bytes (0: none), got ", pb::str(v).cast<std::string>());
  }
  return int_arg(call, "limit", v, OptionRange::integers(0));
}

// Every live handle by its simulator, so a planner written in Python gets the Profile object it
// was called for.
std::map<const Simulator*, std::weak_ptr<ProfileHandle>>& owners() {
  static auto* m = new std::map<const Simulator*, std::weak_ptr<ProfileHandle>>();
  return *m;
}

template <class T, class F>
pb::array_t<T> column(size_t n, F&& f) {
  pb::array_t<T> out(static_cast<pb::ssize_t>(n));
  auto w = out.template mutable_unchecked<1>();
  for (size_t i = 0; i < n; ++i) w(static_cast<pb::ssize_t>(i)) = static_cast<T>(f(i));
  return out;
}

template <class F>
pb::list str_column(size_t n, F&& f) {
  pb::list out(n);
  for (size_t i = 0; i < n; ++i) out[i] = pb::str(f(i));
  return out;
}

// A column whose rows are lists (of ids): row i is f(i), cast as it is read.
template <class F>
pb::list list_column(size_t n, F&& f) {
  pb::list out(n);
  for (size_t i = 0; i < n; ++i) out[i] = pb::cast(f(i));
  return out;
}

pb::list category_names() {
  pb::list out;
  for (int c = 0; c < kNumCategories; ++c) out.append(category_name(static_cast<Category>(c)));
  return out;
}

std::string describe(const Profile& p) {
  return p.model + " batch " + std::to_string(p.batch) + " on " + p.device;
}

pb::dict nodes_table(const Profile& p) {
  const auto& n = p.nodes;
  const size_t k = n.size();
  pb::dict t;
  t["index"] = column<int32_t>(k, [&](size_t i) { return n[i].index; });
  t["op"] = str_column(k, [&](size_t i) { return n[i].op; });
  t["name"] = str_column(k, [&](size_t i) { return n[i].name; });
  t["scope"] = str_column(k, [&](size_t i) { return n[i].scope; });
  t["block"] = column<int32_t>(k, [&](size_t i) { return n[i].block; });
  t["is_view"] = column<bool>(k, [&](size_t i) { return n[i].is_view; });
  t["fwd_ms"] = column<double>(k, [&](size_t i) { return n[i].fwd_ms; });
  t["bwd_ms"] = column<double>(k, [&](size_t i) { return n[i].bwd_ms; });
  t["fwd_alloc_bytes"] = column<int64_t>(k, [&](size_t i) { return n[i].fwd_alloc_bytes; });
  t["fwd_free_bytes"] = column<int64_t>(k, [&](size_t i) { return n[i].fwd_free_bytes; });
  t["bwd_alloc_bytes"] = column<int64_t>(k, [&](size_t i) { return n[i].bwd_alloc_bytes; });
  t["bwd_free_bytes"] = column<int64_t>(k, [&](size_t i) { return n[i].bwd_free_bytes; });
  t["bwd_rank"] = column<int32_t>(k, [&](size_t i) { return n[i].bwd_rank; });
  t["inputs"] = list_column(
      k, [&](size_t i) -> const auto& { return n[i].inputs; });
  t["outputs"] = list_column(
      k, [&](size_t i) -> const auto& { return n[i].outputs; });
  t["saved"] = list_column(
      k, [&](size_t i) -> const auto& { return n[i].saved; });
  return t;
}

pb::dict saved_table(const Profile& p) {
  const auto& s = p.saved;
  const size_t k = s.size();
  pb::dict t;
  t["index"] = column<int32_t>(k, [&](size_t i) { return s[i].index; });
  t["name"] = str_column(k, [&](size_t i) { return s[i].name; });
  t["value"] = column<int64_t>(k, [&](size_t i) { return s[i].value; });
  t["producer"] = column<int32_t>(k, [&](size_t i) { return s[i].producer; });
  // A leaf saved for backward (an input, a parameter) has no producer: op "", block -1.
  auto producer = [&](size_t i) -> const ProfileNode* {
    return s[i].producer >= 0 ? &p.nodes[static_cast<size_t>(s[i].producer)] : nullptr;
  };
  t["op"] = str_column(k, [&](size_t i) { return producer(i) ? producer(i)->op : std::string(); });
  t["block"] = column<int32_t>(k, [&](size_t i) { return producer(i) ? producer(i)->block : -1; });
  t["bytes"] = column<int64_t>(k, [&](size_t i) { return s[i].bytes; });
  t["category"] = str_column(k, [&](size_t i) { return category_name(s[i].category); });
  t["candidate"] = column<bool>(k, [&](size_t i) { return s[i].candidate; });
  t["offloadable"] = column<bool>(k, [&](size_t i) { return s[i].offloadable; });
  t["recompute_ms"] = column<double>(k, [&](size_t i) { return s[i].recompute_ms; });
  t["last_fwd_use"] = column<int32_t>(k, [&](size_t i) { return s[i].last_fwd_use; });
  t["first_bw_rank"] = column<int32_t>(k, [&](size_t i) { return s[i].first_bw_rank; });
  t["last_bw_rank"] = column<int32_t>(k, [&](size_t i) { return s[i].last_bw_rank; });
  t["readers"] = list_column(
      k, [&](size_t i) -> const auto& { return s[i].readers; });
  return t;
}

pb::dict values_table(const Profile& p) {
  const auto& v = p.values;
  const size_t k = v.size();
  pb::dict t;
  t["id"] = column<int64_t>(k, [&](size_t i) { return v[i].id; });
  t["producer"] = column<int32_t>(k, [&](size_t i) { return v[i].producer; });
  t["slot"] = column<int32_t>(k, [&](size_t i) { return v[i].slot; });
  t["root"] = column<int64_t>(k, [&](size_t i) { return v[i].root; });
  t["bytes"] = column<int64_t>(k, [&](size_t i) { return v[i].bytes; });
  t["leaf"] = column<bool>(k, [&](size_t i) { return v[i].leaf; });
  t["saved"] = column<int32_t>(k, [&](size_t i) { return v[i].saved; });
  t["shape"] = list_column(
      k, [&](size_t i) -> const auto& { return v[i].shape; });
  t["consumers"] = list_column(
      k, [&](size_t i) -> const auto& { return v[i].consumers; });
  return t;
}

// A simulation, with the budget it was judged against when one was given.
struct Simulation {
  SimResult r;
  int64_t budget = 0;
  std::string budget_of;
  bool fits = true;
};

pb::dict timeline_table(const SimResult& r) {
  const auto& tl = r.timeline;
  const size_t k = tl.size();
  pb::dict t;
  t["time_ms"] = column<double>(k, [&](size_t i) { return tl[i].time_ms; });
  t["label"] = str_column(k, [&](size_t i) { return tl[i].label; });
  pb::array_t<int64_t> by({static_cast<pb::ssize_t>(k), static_cast<pb::ssize_t>(kNumCategories)});
  auto w = by.mutable_unchecked<2>();
  for (size_t i = 0; i < k; ++i) {
    for (int c = 0; c < kNumCategories; ++c)
      w(static_cast<pb::ssize_t>(i), c) = tl[i].allocated_by[static_cast<size_t>(c)];
  }
  t["allocated_by"] = by;
  t["allocated"] = column<int64_t>(k, [&](size_t i) {
    int64_t s = 0;
    for (int64_t b : tl[i].allocated_by) s += b;
    return s;
  });
  t["reserved"] = column<int64_t>(k, [&](size_t i) { return tl[i].reserved; });
  t["categories"] = category_names();
  return t;
}

std::vector<Regeneration> regenerations_from(const pb::object& obj) {
  std::vector<Regeneration> out;
  if (obj.is_none()) return out;
  const char* expected =
      "regenerations: expected a list of (backward node, [saved indices]) pairs of integers";
  REGEN_CHECK(!pb::isinstance<pb::str>(obj) && pb::hasattr(obj, "__iter__"), expected,
              ", got type '", type_name_of(obj), "'");
  for (const pb::handle& item : obj) {
    try {
      const auto pair = item.cast<std::pair<int32_t, std::vector<int32_t>>>();
      out.push_back({pair.first, pair.second});
    } catch (const pb::cast_error&) {
      REGEN_FAIL(expected, ", got an item ", pb::repr(item).cast<std::string>());
    }
  }
  return out;
}

const char* chain_text(bool keep) {
  return keep ? "keep" : "drop";
}

// A planner written in Python: fn(profile, budget_bytes) returns decisions (anything
// decisions_from takes) or a Plan made by make_plan; finish_plan judges them.
Plan run_python_planner(const pb::object& fn, const std::string& name, const Simulator& sim,
                        const Budget& budget, const PlanOptions& options) {
  ProfilePtr handle = ProfileHandle::owner_of(sim);
  if (!handle) handle = make_profile_handle(sim.profile());  // a profile Python never saw: a copy
  const int64_t bytes = budget.resolve(handle->no_remat_peak(options.budget_of));
  pb::object out = fn(handle, bytes);
  Plan draft;
  draft.policy = name;
  if (pb::isinstance<PlanHandle>(out)) {
    const PlanHandle& ph = out.cast<const PlanHandle&>();
    // The profile it was given, or a copy of it (the same file loaded again): the same step, and
    // the same saved tensors in the same order. A profile of another model, batch, device or run
    // can have as many saved tensors and still be another step.
    const Profile &a = ph.profile->profile, &b = sim.profile();
    bool same = a.model == b.model && a.batch == b.batch && a.device == b.device &&
                a.run == b.run && a.saved.size() == b.saved.size() &&
                a.nodes.size() == b.nodes.size() && a.events.size() == b.events.size();
    for (size_t i = 0; same && i < a.saved.size(); ++i) {
      same = a.saved[i].name == b.saved[i].name && a.saved[i].bytes == b.saved[i].bytes;
    }
    REGEN_CHECK(same, "planner '", name, "' returned a Plan made for another profile (",
                describe(a), ") than the one it was given (", describe(b), ")");
    draft.decisions = ph.plan.decisions;
    draft.keep_chain = ph.plan.keep_chain;
    draft.regenerations = ph.plan.regenerations;
  } else {
    try {
      draft.decisions = decisions_from(out, sim.profile());
    } catch (const Error& e) {
      REGEN_FAIL("planner '", name, "' returned bad decisions: ", e.message());
    }
    draft.keep_chain = options.chain != Chain::drop;
  }
  return finish_plan(sim, std::move(draft), budget, options);
}

}  // namespace

ProfilePtr make_profile_handle(Profile p) {
  auto h = std::make_shared<ProfileHandle>(std::move(p));
  owners()[&h->sim] = h;
  return h;
}

ProfileHandle::ProfileHandle(Profile p) : profile(std::move(p)), sim(profile), cache(sim) {}
ProfileHandle::~ProfileHandle() {
  owners().erase(&sim);
}

int64_t ProfileHandle::no_remat_peak(BudgetOf of) const {
  int64_t& v = no_remat_[of == BudgetOf::reserved ? 0 : 1];
  if (v < 0) v = no_remat_peak_of(sim, of);
  return v;
}

std::shared_ptr<ProfileHandle> ProfileHandle::owner_of(const Simulator& sim) {
  const auto it = owners().find(&sim);
  return it == owners().end() ? nullptr : it->second.lock();
}

Budget budget_from(const pb::object& b) {
  if (b.is_none()) return Budget{};
  if (pb::isinstance<pb::str>(b)) {
    return parse_budget_option(b.cast<std::string>(), "budget", OptionStyle::keyword);
  }
  REGEN_CHECK(!pb::isinstance<pb::bool_>(b),
              "budget must be None, a text such as '60%', '2GiB' or 'lowest', "
              "or a number of bytes; got a bool");
  if (PyIndex_Check(b.ptr())) {  // int, numpy integers
    int64_t v = 0;
    try {
      v = pb::int_(b).cast<int64_t>();
    } catch (const pb::cast_error&) {
      REGEN_FAIL("budget ", pb::str(b).cast<std::string>(), " bytes is out of range");
    }
    REGEN_CHECK(v > 0, "budget must be a positive number of bytes, got ", v);
    Budget out;
    out.kind = Budget::Kind::bytes;
    out.value = static_cast<double>(v);
    return out;
  }
  REGEN_FAIL(
      "budget must be None, a text such as '60%', '2GiB' or 'lowest', or a number of bytes (int); "
      "got ",
      pb::str(pb::repr(b)).cast<std::string>(),
      pb::isinstance<pb::float_>(b) ? " (for a "
                                      "fraction of the no-remat peak write '60%')"
                                    : "");
}

std::vector<Decision> decisions_from(const pb::object& obj, const Profile& p) {
  pb::array a = pb::module_::import("numpy").attr("asarray")(obj);
  const char kind = a.dtype().kind();
  if (kind == 'U' || kind == 'S' || kind == 'O') {  // fate names
    REGEN_CHECK(a.ndim() == 1, "decisions must be one-dimensional (one per saved tensor), got ",
                a.ndim(), " dimensions");
    const size_t n = static_cast<size_t>(a.shape(0));
    REGEN_CHECK(n == p.saved.size(), "decisions has ", n, " entries, but the profile of ",
                describe(p), " has ", p.saved.size(), " saved tensors (one decision each)");
    std::vector<Decision> out(n);
    pb::list items = a.attr("tolist")();
    for (size_t i = 0; i < n; ++i) {
      try {
        out[i] = parse_fate(pb::str(items[i]).cast<std::string>());
      } catch (const Error& e) {
        REGEN_FAIL("decisions[", i, "]: ", e.message());
      }
    }
    return out;
  }
  REGEN_CHECK(kind == 'b' || kind == 'i' || kind == 'u',
              "decisions must be bools or 0/1 integers "
              "(True: recompute), fate codes 0-2 or fate names (regen.fates()), got numpy dtype ",
              pb::str(a.dtype()).cast<std::string>());
  REGEN_CHECK(a.ndim() == 1, "decisions must be one-dimensional (one per saved tensor), got ",
              a.ndim(), " dimensions");
  const size_t n = static_cast<size_t>(a.shape(0));
  REGEN_CHECK(n == p.saved.size(), "decisions has ", n, " entries, but the profile of ",
              describe(p), " has ", p.saved.size(), " saved tensors (one decision each)");
  auto v = pb::array_t<int64_t, pb::array::forcecast>::ensure(a);
  auto r = v.unchecked<1>();
  std::vector<Decision> out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t d = r(static_cast<pb::ssize_t>(i));
    REGEN_CHECK(d >= 0 && d < kNumFates && (kind != 'b' || d <= 1), "decisions[", i, "] is ", d,
                "; each is 0 (retain), 1 (recompute) or 2 (offload): regen.fates()");
    out[i] = static_cast<Fate>(d);
  }
  return out;
}

pb::array_t<bool> decisions_to_array(const std::vector<Decision>& d) {
  return column<bool>(d.size(), [&](size_t i) { return d[i] == Decision::recompute; });
}

PlanRequest plan_request(const std::string& chain, const std::string& budget_of,
                         const std::string& layout, const std::string& offload,
                         const std::string& transfer) {
  PlanRequest r;
  r.style = OptionStyle::keyword;
  r.chain = chain;
  r.budget_of = budget_of;
  r.layout = layout;
  r.offload = offload;
  r.transfer = transfer;
  return r;
}

PlanOptions plan_options(const std::string& chain, const std::string& budget_of,
                         const std::string& layout, const std::string& offload,
                         const std::string& transfer, const Profile* profile) {
  return plan_request(chain, budget_of, layout, offload, transfer).options(profile);
}

pb::dict transfer_dict(const TransferModel& t) {
  pb::dict d;
  if (!t.valid()) return d;
  d["to_host_gb_per_s"] = t.to_host.bytes_per_ms / 1e6;
  d["to_host_latency_ms"] = t.to_host.latency_ms;
  d["to_device_gb_per_s"] = t.to_device.bytes_per_ms / 1e6;
  d["to_device_latency_ms"] = t.to_device.latency_ms;
  d["source"] = t.source;
  return d;
}

pb::dict by_category(const std::array<int64_t, kNumCategories>& a) {
  pb::dict d;
  for (int c = 0; c < kNumCategories; ++c)
    d[category_name(static_cast<Category>(c))] = a[static_cast<size_t>(c)];
  return d;
}

bool keep_chain_from(const std::string& chain, const char* what) {
  REGEN_CHECK(chain == "keep" || chain == "drop", what, ": chain must be 'keep' or 'drop', got '",
              chain, "'");
  return chain == "keep";
}

void bind_remat(pb::module_& m) {
  // ---- Profile ----------------------------------------------------------------------------------
  pb::class_<ProfileHandle, ProfilePtr>(m, "Profile", R"doc(
One profiled training iteration (stage 1): the graph, the allocator's exact event sequence and the
timings. Made by ``regen.profile``, ``Model.profile`` or ``regen.load_profile``. Tables are dicts
of equal-length columns (numpy arrays, or lists for text and lists), ready for
``pandas.DataFrame``.)doc")
      .def_property_readonly("model", [](const ProfileHandle& h) { return h.profile.model; })
      .def_property_readonly("batch", [](const ProfileHandle& h) { return h.profile.batch; })
      .def_property_readonly("device", [](const ProfileHandle& h) { return h.profile.device; })
      .def_property_readonly("threads", [](const ProfileHandle& h) { return h.profile.threads; })
      .def_property_readonly("date", [](const ProfileHandle& h) { return h.profile.date; })
      .def_property_readonly(
          "op_timing", [](const ProfileHandle& h) { return op_timing_name(h.profile.op_timing); },
          "How its op times were taken: 'sync' or 'device' (regen profile --op-timing)")
      .def_property_readonly(
          "iterations", [](const ProfileHandle& h) { return h.profile.iterations; },
          "Instrumented iterations the times are medians of")
      .def_property_readonly(
          "run", [](const ProfileHandle& h) { return h.profile.run; },
          "The settings besides model, batch and device that shape the step")
      .def_property_readonly("num_nodes",
                             [](const ProfileHandle& h) { return h.profile.nodes.size(); })
      .def_property_readonly("num_saved",
                             [](const ProfileHandle& h) { return h.profile.saved.size(); })
      .def_property_readonly(
          "blocks", [](const ProfileHandle& h) { return h.profile.blocks; },
          "Block names by index (the nodes' and saved tensors' block column)")
      .def_property_readonly(
          "backward_order",
          [](const ProfileHandle& h) {
            const auto& b = h.profile.backward_order;
            return column<int32_t>(b.size(), [&](size_t i) { return b[i]; });
          },
          "Node indices in the order backward runs them")
      .def_property_readonly(
          "peak_allocated", [](const ProfileHandle& h) { return h.profile.peak_allocated; },
          "Measured peak of allocated bytes without remat")
      .def_property_readonly(
          "peak_reserved", [](const ProfileHandle& h) { return h.profile.peak_reserved; },
          "Measured peak of reserved bytes without remat")
      .def_property_readonly(
          "transfer", [](const ProfileHandle& h) { return transfer_dict(h.profile.transfer); },
          "The transfer model the profiler measured (copies to and from the host tier), or {}")
      .def_property_readonly(
          "lower_bound", [](const ProfileHandle& h) { return memory_lower_bound(h.profile); },
          "Allocated bytes no plan goes below: at the profiled iteration's highest point, what no "
          "plan can free there (docs/remat.md, memory_lower_bound)")
      .def_property_readonly(
          "persistent", [](const ProfileHandle& h) { return by_category(h.profile.persistent_by); },
          "Bytes allocated at iteration start, by category")
      .def_property_readonly(
          "allocated_at_peak",
          [](const ProfileHandle& h) { return by_category(h.profile.allocated_by_at_peak); },
          "Allocated bytes by category at the measured peak")
      .def_property_readonly("iteration_ms",
                             [](const ProfileHandle& h) { return h.profile.iteration_ms; })
      .def_property_readonly("forward_ms",
                             [](const ProfileHandle& h) { return h.profile.forward_ms; })
      .def_property_readonly("backward_ms",
                             [](const ProfileHandle& h) { return h.profile.backward_ms; })
      .def_property_readonly("optimizer_ms",
                             [](const ProfileHandle& h) { return h.profile.optimizer_ms; })
      .def(
          "no_remat_peak",
          [](const ProfileHandle& h, const std::string& of) {
            return h.no_remat_peak(parse_budget_of(of));
          },
          pb::arg("of") = "reserved",
          "The simulated peak without remat, of 'reserved' or 'allocated' "
          "bytes: what a percentage budget is of")
      .def(
          "nodes", [](const ProfileHandle& h) { return nodes_table(h.profile); },
          "The forward nodes (ops) as columns: index, op, name, scope, block, is_view, fwd_ms, "
          "bwd_ms, "
          "fwd/bwd alloc/free bytes, bwd_rank, inputs, outputs, saved (value ids)")
      .def(
          "saved", [](const ProfileHandle& h) { return saved_table(h.profile); },
          "The saved tensors (what a decision vector indexes) as columns: index, name, value, "
          "producer, "
          "op, block, bytes, category, candidate, offloadable, recompute_ms, last_fwd_use, "
          "first_bw_rank, "
          "last_bw_rank, readers")
      .def(
          "values", [](const ProfileHandle& h) { return values_table(h.profile); },
          "The tape's values as columns: id, producer, slot, root, bytes, leaf, saved, shape, "
          "consumers")
      .def(
          "recompute_blockers",
          [](const ProfileHandle& h) { return recompute_blockers(h.profile); },
          "Why saved tensors that could be recomputed are not candidates ('' when none are "
          "blocked)")
      .def(
          "save",
          [](const ProfileHandle& h, const std::string& path) {
            check_write("Profile.save(" + path_text(path) + ")", path, {}, h.source);
            save_profile(h.profile, path);
          },
          pb::arg("path"), "Writes profile.json (atomically), as `regen profile` does")
      .def("__repr__", [](const ProfileHandle& h) {
        const Profile& p = h.profile;
        return "regen.Profile(" + describe(p) + ", " + std::to_string(p.nodes.size()) + " nodes, " +
               std::to_string(p.saved.size()) + " saved tensors, peak allocated " +
               format_bytes(p.peak_allocated) + ", reserved " + format_bytes(p.peak_reserved) + ")";
      });
  m.def(
      "load_profile",
      [](const std::string& path) {
        ProfilePtr h = make_profile_handle(load_profile(path));
        h->source = source_file("load_profile", path);
        return h;
      },
      pb::arg("path"),
      "Reads a profile.json (from `regen profile` or Profile.save), validated and "
      "replayed against its recorded peaks");

  // ---- Simulation -------------------------------------------------------------------------------
  pb::class_<Simulation>(m, "Simulation",
                         "The exact simulation of one iteration under a decision vector")
      .def_property_readonly("peak_allocated",
                             [](const Simulation& s) { return s.r.peak_allocated; })
      .def_property_readonly("peak_reserved", [](const Simulation& s) { return s.r.peak_reserved; })
      .def_property_readonly("peak_requested",
                             [](const Simulation& s) { return s.r.peak_requested; })
      .def_property_readonly(
          "time_ms", [](const Simulation& s) { return s.r.time_ms; },
          "Profiled iteration time plus recomputation (and compression's conversions)")
      .def_property_readonly("recompute_ms", [](const Simulation& s) { return s.r.recompute_ms; })
      .def_property_readonly(
          "evictions", [](const Simulation& s) { return s.r.evictions; },
          "Saved tensors evicted in the step: the decisions' recomputed ones, or those DTR chose")
      .def_property_readonly(
          "replays", [](const Simulation& s) { return s.r.replays; },
          "Nodes replayed by regenerations")
      .def_property_readonly(
          "narrowed", [](const Simulation& s) { return s.r.narrowed; },
          "Saved tensors held narrow between forward and backward (the profile's compress mode)")
      .def_property_readonly(
          "compress_ms", [](const Simulation& s) { return s.r.compress_ms; },
          "Their narrowings and widenings, by the profile's time model (part of time_ms)")
      .def_property_readonly(
          "allocated_at_peak",
          [](const Simulation& s) { return by_category(s.r.allocated_by_at_peak); })
      .def_property_readonly(
          "peak_by", [](const Simulation& s) { return by_category(s.r.peak_by); },
          "Each category's own peak")
      .def_property_readonly(
          "peak_at", [](const Simulation& s) { return s.r.peak_at; },
          "With top_live: the last marker before the peak")
      .def_property_readonly(
          "live_at_peak",
          [](const Simulation& s) {
            pb::list out;
            for (const LiveBlockRec& b : s.r.live_at_peak)
              out.append(pb::make_tuple(b.tag, category_name(b.category), b.bytes));
            return out;
          },
          "With top_live: the largest live blocks at the peak, (tag, category, bytes)")
      .def_property_readonly(
          "oom", [](const Simulation& s) { return s.r.oom; },
          "With a limit: whether the step runs out of memory under it")
      .def_property_readonly("oom_message", [](const Simulation& s) { return s.r.oom_message; })
      .def_property_readonly("oom_at", [](const Simulation& s) { return s.r.oom_at; })
      .def_property_readonly("cache_flushes", [](const Simulation& s) { return s.r.cache_flushes; })
      .def_property_readonly(
          "host_peak_allocated", [](const Simulation& s) { return s.r.host_peak_allocated; },
          "Offload: the host tier's peak of allocated bytes over the step")
      .def_property_readonly("host_peak_reserved",
                             [](const Simulation& s) { return s.r.host_peak_reserved; })
      .def_property_readonly(
          "stall_ms", [](const Simulation& s) { return s.r.stall_ms; },
          "Offload: time the step waits for copies that are late (part of time_ms)")
      .def_property_readonly(
          "offloads", [](const Simulation& s) { return s.r.offloads; },
          "Saved tensors copied to the host tier and back")
      .def_property_readonly("bytes_to_host", [](const Simulation& s) { return s.r.bytes_to_host; })
      .def_property_readonly("bytes_to_device",
                             [](const Simulation& s) { return s.r.bytes_to_device; })
      .def_property_readonly(
          "timeline",
          [](const Simulation& s) -> pb::object {
            if (s.r.timeline.empty()) return pb::none();
            return timeline_table(s.r);
          },
          "With timeline=True: a point per marker as columns time_ms, label, allocated_by (points "
          "x "
          "categories), allocated, reserved, and the category names")
      .def_property_readonly(
          "budget", [](const Simulation& s) { return s.budget; },
          "The budget in bytes it was judged against (0: none)")
      .def_property_readonly(
          "fits", [](const Simulation& s) { return s.fits; },
          "Whether it fits that budget (True without one)")
      .def("__repr__", [](const Simulation& s) {
        return "regen.Simulation(peak allocated " + format_bytes(s.r.peak_allocated) +
               ", reserved " + format_bytes(s.r.peak_reserved) + ", " +
               std::to_string(s.r.time_ms) + " ms, " + std::to_string(s.r.replays) + " replays" +
               (s.r.oom ? ", out of memory" : "") +
               (s.budget > 0
                    ? std::string(s.fits ? ", fits " : ", does not fit ") + format_bytes(s.budget)
                    : "") +
               ")";
      });

  m.def(
      "simulate",
      [](const ProfilePtr& profile, const pb::object& decisions, const std::string& chain,
         const pb::object& regenerations, const pb::object& budget, const std::string& budget_of,
         const pb::object& limit_value, bool timeline, const pb::object& top_live_arg,
         const std::string& optimizer_state, const std::string& transfer) {
        REGEN_CHECK(profile != nullptr, "simulate: profile is None");
        const Profile& p = profile->profile;
        const int64_t limit = limit_arg("simulate", limit_value);
        const int top_live = static_cast<int>(
            int_arg("simulate", "top_live", top_live_arg, OptionRange::integers(0, kIntMax)));
        Plan draft;
        draft.decisions = decisions_from(decisions, p);
        draft.keep_chain = keep_chain_from(chain, "simulate");
        draft.regenerations = regenerations_from(regenerations);
        draft.optimizer_state = parse_state_place(optimizer_state);
        complete_offloads(p, draft,
                          plan_options("auto", "reserved", "caching", "none", transfer, &p));
        const Schedule s = plan_schedule(p, draft);
        SimOptions o;
        o.timeline = timeline;
        o.top_live = top_live;
        o.limit = limit;
        Simulation out;
        const Budget b = budget_from(budget);
        if (b.kind != Budget::Kind::none) {
          REGEN_CHECK(limit == 0,
                      "simulate: give a budget or a limit, not both (a reserved budget sets "
                      "the limit itself)");
          const BudgetOf of = parse_budget_of(budget_of);
          out.budget = b.resolve(profile->no_remat_peak(of));
          out.budget_of = budget_of_name(of);
          const SimResult unlimited = profile->sim.run(s, o);
          PlanFit fit = fit_schedule(profile->sim, s, out.budget, of, &unlimited);
          out.fits = fit.fits;
          if (fit.result.limit > 0 && (timeline || top_live > 0)) {
            o.limit =
                fit.result.limit;  // the limited run, with the timeline and peak details asked for
            out.r = profile->sim.run(s, o);
          } else {
            out.r = std::move(fit.result);
          }
        } else {
          out.r = profile->sim.run(s, o);
        }
        return out;
      },
      pb::arg("profile"), pb::arg("decisions"), pb::kw_only(), pb::arg("chain") = "keep",
      pb::arg("regenerations") = pb::none(), pb::arg("budget") = pb::none(),
      pb::arg("budget_of") = "reserved", pb::arg("limit") = 0, pb::arg("timeline") = false,
      pb::arg("top_live") = 0, pb::arg("optimizer_state") = "device",
      pb::arg("transfer") = "profile", R"doc(
The exact memory simulation of one iteration under ``decisions`` (one per saved tensor, True or 1:
recompute; only candidates may be recomputed; or fates: 2 or 'offload' copies a tensor to the host
tier and back, regen.fates()). ``chain`` 'keep' or 'drop' (see regen.chains()).
``regenerations``: explicit ones, a list of (backward node, [saved indices]). ``budget`` (with
``budget_of``) judges the result as plan() does; ``limit`` replays it under the allocator's hard
limit in bytes instead. ``optimizer_state`` 'device' or 'host'; ``transfer`` times the copies
('profile', 'step:0.4', 'gbps:50', FILE.json). Returns a Simulation; its peaks (device and host
tier) are what executing the decisions measures.)doc");

  m.def(
      "simulate_dtr",
      [](const ProfilePtr& profile, const pb::object& limit_value, bool coop, bool timeline,
         const pb::object& top_live_arg) {
        REGEN_CHECK(profile != nullptr, "simulate_dtr: profile is None");
        const int64_t limit = limit_arg("simulate_dtr", limit_value);
        const int top_live = static_cast<int>(
            int_arg("simulate_dtr", "top_live", top_live_arg, OptionRange::integers(0, kIntMax)));
        SimOptions o;
        o.timeline = timeline;
        o.top_live = top_live;
        Simulation out;
        out.r = simulate_dtr(profile->sim, DtrOptions{coop}, limit, o);
        out.fits = !out.r.oom;
        return out;
      },
      pb::arg("profile"), pb::arg("limit") = 0, pb::kw_only(), pb::arg("coop") = false,
      pb::arg("timeline") = false, pb::arg("top_live") = 0, R"doc(
DTR's step under the allocator's hard limit ``limit`` in bytes (0: none, and DTR never evicts),
simulated exactly: the engine that runs while training evicts when the limit refuses a request and
regenerates what a later op reads. ``coop`` evicts address-contiguous windows (dtr-coop). Returns a
Simulation with the peaks, evictions, replays and recomputation time every step then measures;
``oom`` when the step runs out of memory even so. regen.plan(profile, 'dtr', budget) picks the
limit from a budget.)doc");

  // ---- Plan -------------------------------------------------------------------------------------
  pb::class_<PlanHandle, std::shared_ptr<PlanHandle>>(
      m, "Plan", "A decision per saved tensor with its exact prediction (stage 2)")
      .def_property_readonly("policy", [](const PlanHandle& h) { return h.plan.policy; })
      .def_property_readonly(
          "profile", [](const PlanHandle& h) { return h.profile; },
          "The profile the plan was made for")
      .def_property_readonly(
          "decisions", [](const PlanHandle& h) { return decisions_to_array(h.plan.decisions); },
          "A bool array, one per saved tensor (True: recompute)")
      .def_property_readonly("chain",
                             [](const PlanHandle& h) { return chain_text(h.plan.keep_chain); })
      .def_property_readonly(
          "regenerations",
          [](const PlanHandle& h) {
            pb::list out;
            for (const Regeneration& r : h.plan.regenerations)
              out.append(pb::make_tuple(r.node, r.saved));
            return out;
          },
          "Explicit regenerations, (backward node, [saved indices])")
      .def_property_readonly("budget", [](const PlanHandle& h) { return h.plan.budget_text; })
      .def_property_readonly("budget_bytes",
                             [](const PlanHandle& h) { return h.plan.budget_bytes; })
      .def_property_readonly("budget_of",
                             [](const PlanHandle& h) { return budget_of_name(h.plan.budget_of); })
      .def_property_readonly(
          "layout",
          [](const PlanHandle& h) { return h.plan.planned_layout ? "planned" : "caching"; })
      .def_property_readonly(
          "limit", [](const PlanHandle& h) { return h.plan.limit; },
          "The allocator's hard limit the steps run under (0: none)")
      .def_property_readonly("feasible", [](const PlanHandle& h) { return h.plan.feasible; })
      .def_property_readonly(
          "predicted",
          [](const PlanHandle& h) {
            Simulation s;
            s.r = h.plan.predicted;
            s.budget = h.plan.budget_bytes;
            s.budget_of = budget_of_name(h.plan.budget_of);
            s.fits = h.plan.feasible;
            return s;
          },
          "The exact simulation of the plan (under its limit)")
      .def_property_readonly(
          "peak_allocated", [](const PlanHandle& h) { return h.plan.predicted.peak_allocated; },
          "Predicted peak of allocated bytes")
      .def_property_readonly(
          "peak_reserved", [](const PlanHandle& h) { return h.plan.predicted.peak_reserved; },
          "Predicted peak of reserved bytes")
      .def_property_readonly(
          "time_ms", [](const PlanHandle& h) { return h.plan.predicted.time_ms; },
          "Predicted step time: the profiled one plus recomputation")
      .def_property_readonly("recomputed", [](const PlanHandle& h) { return h.plan.recomputed(); })
      .def_property_readonly(
          "fates",
          [](const PlanHandle& h) {
            pb::list out;
            for (Decision d : h.plan.decisions) out.append(fate_word(d));
            return out;
          },
          "The fate of each saved tensor: 'retain', 'recompute' or 'offload'")
      .def_property_readonly("offloaded", [](const PlanHandle& h) { return h.plan.offloaded(); })
      .def_property_readonly(
          "offloaded_bytes",
          [](const PlanHandle& h) { return h.plan.offloaded_bytes(h.profile->profile); })
      .def_property_readonly(
          "offloads",
          [](const PlanHandle& h) {
            pb::list out;
            for (const Offload& o : h.plan.offloads)
              out.append(pb::make_tuple(o.saved, o.free_after, o.prefetch_before));
            return out;
          },
          "Each offloaded tensor's points: (saved index, forward node after which its device "
          "block goes, backward node before which it is copied back)")
      .def_property_readonly(
          "optimizer_state",
          [](const PlanHandle& h) { return state_place_name(h.plan.optimizer_state); },
          "Where the optimizer state lives between steps: 'device' or 'host'")
      .def_property_readonly(
          "transfer", [](const PlanHandle& h) { return transfer_dict(h.plan.transfer); },
          "The transfer model that timed the plan's copies (empty without one)")
      .def_property_readonly(
          "dynamic", [](const PlanHandle& h) { return dtr_policy(h.plan.policy).has_value(); },
          "True for a DTR plan (dtr, dtr-coop): nothing decided ahead of time, the evictions "
          "chosen while the step runs, predicted exactly (predicted.evictions, .replays)")
      .def_property_readonly(
          "recomputed_bytes",
          [](const PlanHandle& h) { return h.plan.recomputed_bytes(h.profile->profile); })
      .def_property_readonly("no_remat_peak",
                             [](const PlanHandle& h) { return h.plan.no_remat_peak; })
      .def_property_readonly("lowest_peak", [](const PlanHandle& h) { return h.plan.lowest_peak; })
      .def_property_readonly("lower_bound", [](const PlanHandle& h) { return h.plan.lower_bound; })
      .def_property_readonly("planning_ms", [](const PlanHandle& h) { return h.plan.planning_ms; })
      .def_property_readonly("note", [](const PlanHandle& h) { return h.plan.note; })
      .def(
          "save",
          [](const PlanHandle& h, const std::string& path) {
            // Never over the profile.json it was made for, as `regen plan --out` never is.
            std::vector<NamedFile> inputs;
            if (!h.profile->source.path.empty()) {
              inputs.push_back(
                  {h.profile->source.name + " (the plan's profile)", h.profile->source.path});
            }
            check_write("Plan.save(" + path_text(path) + ")", path, inputs, h.source);
            save_plan(h.plan, h.profile->profile, path);
          },
          pb::arg("path"), "Writes plan.json (atomically), as `regen plan` does")
      .def("__repr__", [](const PlanHandle& h) {
        const Plan& p = h.plan;
        return "regen.Plan(" + p.policy + ", budget " +
               (p.budget_bytes > 0 ? format_bytes(p.budget_bytes) : "none") + " " +
               budget_of_name(p.budget_of) + ", recompute " + std::to_string(p.recomputed()) +
               " of " + std::to_string(p.decisions.size()) + ", peak allocated " +
               format_bytes(p.predicted.peak_allocated) + ", reserved " +
               format_bytes(p.predicted.peak_reserved) + ", " +
               std::to_string(p.predicted.time_ms) + " ms" + (p.feasible ? "" : ", infeasible") +
               ")";
      });

  m.def(
      "plan",
      [](const ProfilePtr& profile, const std::string& policy, const pb::object& budget,
         const std::string& chain, const std::string& budget_of, const std::string& layout,
         double milp_time_limit, const pb::object& milp_threads_arg, const std::string& offload,
         const std::string& transfer) {
        REGEN_CHECK(profile != nullptr, "plan: profile is None");
        PlanOptions o =
            plan_options(chain, budget_of, layout, offload, transfer, &profile->profile);
        // The range of `regen plan --milp-time-limit` (0.1 s to a day).
        REGEN_CHECK(milp_time_limit >= 0.1 && milp_time_limit <= 86400,
                    "plan: milp_time_limit=", number_text(milp_time_limit),
                    ": must be a number of seconds from 0.1 to 86400");
        const int milp_threads =
            static_cast<int>(int_arg("plan", "milp_threads", milp_threads_arg,
                                     OptionRange::integers(1, SessionOptions::kMaxThreads)));
        o.milp_time_limit_s = milp_time_limit;
        o.milp_threads = milp_threads;
        o.cache = &profile->cache;
        return PlanHandle{make_plan(profile->sim, policy, budget_from(budget), o), profile};
      },
      pb::arg("profile"), pb::arg("policy"), pb::arg("budget") = pb::none(), pb::kw_only(),
      pb::arg("chain") = "auto", pb::arg("budget_of") = "reserved", pb::arg("layout") = "caching",
      pb::arg("milp_time_limit") = 60.0, pb::arg("milp_threads") = 1, pb::arg("offload") = "none",
      pb::arg("transfer") = "profile", R"doc(
Plans with any registered planner (regen.policies()) under ``budget``: None, '60%' (of the no-remat
peak of ``budget_of``), '2GiB', bytes, or 'lowest' (the lowest budget the policy meets). ``chain`` 'auto', 'keep' or 'drop'; ``budget_of``
'reserved' (what the device sees; the steps run under the allocator's hard limit) or 'allocated';
``layout`` 'caching' or 'planned'. ``offload`` ('none', 'activations', 'optimizer' or 'all'): what
dp and milp may move to the device's host tier, timed by ``transfer`` ('profile', 'step:0.4',
'gbps:50', FILE.json). The Plan is returned even when it does not fit (see feasible and note).)doc");

  m.def(
      "make_plan",
      [](const ProfilePtr& profile, const pb::object& decisions, const pb::object& budget,
         const std::string& chain, const pb::object& regenerations, const std::string& budget_of,
         const std::string& layout, const std::string& policy, const std::string& optimizer_state,
         const std::string& transfer) {
        REGEN_CHECK(profile != nullptr, "make_plan: profile is None");
        // The label is written to plan.json and read back (load_plan refuses an empty one).
        REGEN_CHECK(!policy.empty() && std::none_of(policy.begin(), policy.end(),
                                                    [](unsigned char c) { return c <= ' '; }),
                    "make_plan: policy=", path_text(policy),
                    ": the plan's label must be a name (not empty, no spaces or control "
                    "characters)");
        REGEN_CHECK(!dtr_policy(policy), "make_plan: '", policy,
                    "' is DTR's, which decides while the step runs: use regen.plan(profile, '",
                    policy, "', budget)");
        const Profile& p = profile->profile;
        Plan draft;
        draft.policy = policy;
        draft.decisions = decisions_from(decisions, p);
        draft.keep_chain = keep_chain_from(chain, "make_plan");
        draft.regenerations = regenerations_from(regenerations);
        draft.optimizer_state = parse_state_place(optimizer_state);
        Plan plan = finish_plan(profile->sim, std::move(draft), budget_from(budget),
                                plan_options(chain, budget_of, layout, "none", transfer, &p));
        if (!plan.feasible) {
          plan.note = "the decisions reach a " + std::string(budget_of_name(plan.budget_of)) +
                      " peak of " + format_bytes(peak_of(plan.predicted, plan.budget_of)) +
                      ", over the budget of " + format_bytes(plan.budget_bytes) +
                      (plan.predicted.oom ? "; under its limit the step runs out of memory at " +
                                                plan.predicted.oom_at
                                          : "");
        }
        return PlanHandle{std::move(plan), profile};
      },
      pb::arg("profile"), pb::arg("decisions"), pb::arg("budget") = pb::none(), pb::kw_only(),
      pb::arg("chain") = "keep", pb::arg("regenerations") = pb::none(),
      pb::arg("budget_of") = "reserved", pb::arg("layout") = "caching",
      pb::arg("policy") = "python", pb::arg("optimizer_state") = "device",
      pb::arg("transfer") = "profile", R"doc(
A plan from decisions made by hand (fates, as regen.simulate takes them), judged exactly as a
planner's: prediction, limit, feasibility; offloaded tensors get their copy points from the transfer
model. Execute it with Model.use_plan or Model.train(plan=...).)doc");

  m.def(
      "load_plan",
      [](const std::string& path, const ProfilePtr& profile) {
        REGEN_CHECK(profile != nullptr, "load_plan: profile is None");
        Plan plan = load_plan(path, profile->profile);
        judge_loaded_plan(profile->sim, plan);
        return PlanHandle{std::move(plan), profile, source_file("load_plan", path)};
      },
      pb::arg("path"), pb::arg("profile"),
      "Reads a plan.json made for ``profile`` and judges it again on it");

  m.def(
      "policies",
      [] {
        pb::dict out;  // in registration order: the built-in ones first
        for (const std::string& n : policy_names()) out[pb::str(n)] = planner_info(n).help;
        return out;
      },
      "The registered planners: name -> one line of help");
  m.def(
      "chains", [] { return chain_names(); }, "The chain modes: 'auto', 'keep', 'drop'");
  m.def(
      "fates", [] { return fate_words(); },
      "The fates of a saved tensor, by code: 'retain' (0), 'recompute' (1), 'offload' (2)");
  m.def(
      "offload_modes", [] { return offload_mode_names(); },
      "What regen.plan(offload=...) may move to the host tier: 'none', 'activations', 'optimizer', "
      "'all'");
  m.def(
      "measure_transfer",
      [](const std::string& device, const std::vector<pb::object>& sizes,
         const pb::object& repeats_arg) {
        // The ranges of `regen bench copy --repeats --sizes`.
        const int repeats = static_cast<int>(
            int_arg("measure_transfer", "repeats", repeats_arg, OptionRange::integers(1, 1000)));
        REGEN_CHECK(!sizes.empty(), "measure_transfer: sizes is empty: give at least one size");
        std::vector<uint64_t> s;
        for (const pb::object& size : sizes) {
          // Bytes, or text as --sizes takes it ("4MiB").
          int64_t b = 0;
          if (pb::isinstance<pb::str>(size)) {
            try {
              b = parse_bytes(size.cast<std::string>());
            } catch (const Error& e) {
              REGEN_FAIL("measure_transfer: sizes: ", path_text(size.cast<std::string>()), ": ",
                         e.message());
            }
          } else {
            b = int_arg("measure_transfer", "sizes", size,
                        OptionRange::integers(1, static_cast<double>(int64_t{1} << 40)));
          }
          REGEN_CHECK(b > 0 && b <= (int64_t{1} << 40),
                      "measure_transfer: sizes: ", pb::str(pb::repr(size)).cast<std::string>(),
                      " must be between 1 byte and 1 TiB");
          s.push_back(static_cast<uint64_t>(b));
        }
        const Device d = resolve_device(device, OptionStyle::keyword);
        TransferModel t = measure_transfer(d, s, repeats);
        t.source = "measured: regen.measure_transfer on " + d.str();
        host_allocator_for(d).release_memory();
        return transfer_dict(t);
      },
      pb::arg("device") = "cpu",
      pb::arg("sizes") = std::vector<int64_t>{1 << 20, 4 << 20, 16 << 20}, pb::arg("repeats") = 3,
      "Times copies between a device and its host tier (as `regen bench copy`) and returns the "
      "fitted transfer model");
  m.def(
      "register_planner",
      [](const std::string& name, const pb::function& fn, const std::string& help) {
        // Kept for the life of the process: the registry outlives the interpreter, so the function
        // is never released (a release after Python's finalization would crash).
        auto* keep = new pb::object(fn);
        register_planner(
            {name, help.empty() ? "a planner written in Python" : help,
             [keep, name](const Simulator& sim, const Budget& b, const PlanOptions& o) {
               return run_python_planner(*keep, name, sim, b, o);
             }});
      },
      pb::arg("name"), pb::arg("fn"), pb::arg("help") = "", R"doc(
Registers ``fn(profile, budget_bytes)`` as a planner: it returns decisions (one per saved tensor) or
a Plan from make_plan, and regen.plan, Model.plan and Model.train(policy=name) then use it like a
built-in one (budget_bytes is 0 without a budget). Names are letters, digits, '-' and '_'.)doc");
}

}  // namespace regen::py
