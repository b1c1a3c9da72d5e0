// plan.json: writing a plan and reading one back against the profile it is used with
// (planner.h save_plan, load_plan).
#include "regen/remat/plan/planner.h"

// nlohmann/json's messages then name the field that was wrong ("(/nodes/3/fwd_ms) type must be
// number"), so a damaged file is reported by its field (remat/json_error.h). The macro puts this
// file's json types in an ABI namespace of their own, so the other files' json is not affected.
#define JSON_DIAGNOSTICS 1
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

#include "regen/core/error.h"
#include "regen/core/io.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/json_error.h"

namespace regen {

// ---- Plan files ---------------------------------------------------------------------------------

void save_plan(const Plan& plan, const Profile& p, const std::string& path) {
  nlohmann::json j;
  j["format"] = "regen-plan-1";
  j["model"] = p.model;
  j["batch"] = p.batch;
  j["device"] = p.device;
  j["policy"] = plan.policy;
  j["budget"] = plan.budget_text;
  j["budget_bytes"] = plan.budget_bytes;
  j["budget_of"] = budget_of_name(plan.budget_of);
  j["limit"] = plan.limit;
  j["layout"] = plan.planned_layout ? "planned" : "caching";
  j["keep_chain"] = plan.keep_chain;
  j["feasible"] = plan.feasible;
  j["note"] = plan.note;
  j["predicted"] = {{"peak_allocated", plan.predicted.peak_allocated},
                    {"peak_reserved", plan.predicted.peak_reserved},
                    {"time_ms", plan.predicted.time_ms},
                    {"recompute_ms", plan.predicted.recompute_ms}};
  if (plan.uses_host()) {
    j["predicted"]["host_peak_allocated"] = plan.predicted.host_peak_allocated;
    j["predicted"]["host_peak_reserved"] = plan.predicted.host_peak_reserved;
    j["predicted"]["stall_ms"] = plan.predicted.stall_ms;
  }
  j["no_remat_peak"] = plan.no_remat_peak;
  j["lowest_peak"] = plan.lowest_peak;
  j["lower_bound"] = plan.lower_bound;
  nlohmann::json d = nlohmann::json::array();
  for (size_t i = 0; i < plan.decisions.size(); ++i) {
    d.push_back(
        {{"saved", i}, {"name", p.saved[i].name}, {"decision", decision_name(plan.decisions[i])}});
  }
  j["decisions"] = std::move(d);
  nlohmann::json regen = nlohmann::json::array();
  for (const Regeneration& r : plan.regenerations) {
    nlohmann::json names = nlohmann::json::array();
    for (int32_t s : r.saved)
      names.push_back({{"saved", s}, {"name", p.saved[static_cast<size_t>(s)].name}});
    regen.push_back({{"before", r.node},
                     {"before_name", p.nodes[static_cast<size_t>(r.node)].name},
                     {"restore", std::move(names)}});
  }
  j["regenerations"] = std::move(regen);
  nlohmann::json offloads = nlohmann::json::array();
  for (const Offload& o : plan.offloads) {
    offloads.push_back(
        {{"saved", o.saved},
         {"name", p.saved[static_cast<size_t>(o.saved)].name},
         {"free_after", o.free_after},
         {"free_after_name", p.nodes[static_cast<size_t>(o.free_after)].name},
         {"prefetch_before", o.prefetch_before},
         {"prefetch_before_name", p.nodes[static_cast<size_t>(o.prefetch_before)].name}});
  }
  j["offloads"] = std::move(offloads);
  j["optimizer_state"] = state_place_name(plan.optimizer_state);
  if (plan.transfer.valid()) j["transfer"] = nlohmann::json::parse(transfer_to_json(plan.transfer));
  write_file_atomic(path, j.dump(1));
}

Plan load_plan(const std::string& path, const Profile& p) {
  const std::string origin = "plan '" + path + "'";
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    REGEN_FAIL(origin, ": not valid JSON: ", json_error_text(e));
  }
  Plan plan;
  // A count read as a JSON integer (nlohmann would truncate 2.5 and wrap 1e300 or -1).
  const auto integer = [&](const nlohmann::json& v, const std::string& what) {
    REGEN_CHECK(v.is_number_integer(), origin, ": ", what, " must be an integer, got ", v.dump());
    return v.get<int64_t>();
  };
  try {
    REGEN_CHECK(j.is_object() && j.value("format", "") == "regen-plan-1", origin,
                ": not a regen plan (expected \"format\": \"regen-plan-1\")");
    REGEN_CHECK(
        j.at("model").get<std::string>() == p.model && j.at("batch").get<int64_t>() == p.batch,
        origin, ": made for ", j.at("model").get<std::string>(), " batch ",
        j.at("batch").get<int64_t>(), ", not ", p.model, " batch ", p.batch);
    // The device the plan's profile was measured on: a plan of one device's allocator states
    // does not predict another's.
    if (j.contains("device")) {
      const std::string device = j.at("device").get<std::string>();
      REGEN_CHECK(device == p.device, origin, ": made for ", device, ", not ", p.device,
                  " (the device of the profile it is used with)");
    }
    plan.policy = j.at("policy").get<std::string>();
    REGEN_CHECK(!plan.policy.empty(), origin, ": \"policy\" is empty");
    plan.budget_text = j.at("budget").get<std::string>();
    plan.budget_bytes = integer(j.at("budget_bytes"), "budget_bytes");
    REGEN_CHECK(plan.budget_bytes >= 0, origin, ": budget_bytes is negative");
    // Plans written before budgets bounded reserved bytes bound allocated bytes.
    plan.budget_of = parse_budget_of(j.value("budget_of", std::string("allocated")));
    plan.limit = j.contains("limit") ? integer(j.at("limit"), "limit") : 0;
    REGEN_CHECK(plan.limit >= 0, origin, ": limit is negative");
    const std::string layout = j.value("layout", std::string("caching"));
    REGEN_CHECK(layout == "planned" || layout == "caching", origin, ": \"layout\" is '", layout,
                "', not planned or caching");
    plan.planned_layout = layout == "planned";
    plan.keep_chain = j.at("keep_chain").get<bool>();
    plan.note = j.value("note", "");
    plan.decisions.assign(p.saved.size(), Decision::retain);
    const auto& d = j.at("decisions");
    REGEN_CHECK(d.is_array() && d.size() == p.saved.size(), origin, ": has ", d.size(),
                " decisions, the profile has ", p.saved.size(), " saved tensors");
    for (const auto& e : d) {
      const int64_t at = integer(e.at("saved"), "a decision's \"saved\"");
      REGEN_CHECK(at >= 0 && static_cast<size_t>(at) < p.saved.size(), origin,
                  ": a decision names saved tensor ", at, ", not one of the profile's 0 to ",
                  p.saved.size() - 1);
      const size_t i = static_cast<size_t>(at);
      REGEN_CHECK(e.at("name").get<std::string>() == p.saved[i].name, origin,
                  ": decision for saved tensor ", i, " names '", e.at("name").get<std::string>(),
                  "', which does not match the profile");
      const std::string v = e.at("decision").get<std::string>();
      try {
        plan.decisions[i] = parse_fate(v);
      } catch (const Error& err) {
        REGEN_FAIL(origin, ": bad decision for saved tensor ", i, ": ", err.message());
      }
      REGEN_CHECK(plan.decisions[i] != Decision::recompute || p.saved[i].candidate, origin,
                  ": saved tensor '", p.saved[i].name, "' cannot be recomputed");
      REGEN_CHECK(plan.decisions[i] != Decision::offload || p.saved[i].offloadable, origin,
                  ": saved tensor '", p.saved[i].name, "' cannot be offloaded");
    }
    // A plan's policy and its decisions agree: none recomputes nothing, and a DTR policy decides
    // at run time (its plan has no static decisions). Any other name is a planner's, registered
    // here or in the program that wrote the plan; its decisions are checked above and below.
    const bool recomputes =
        std::count(plan.decisions.begin(), plan.decisions.end(), Decision::recompute) > 0;
    REGEN_CHECK(!recomputes || (plan.policy != "none" && !dtr_policy(plan.policy)), origin,
                ": policy '", plan.policy, "' ",
                plan.policy == "none" ? "recomputes nothing" : "decides at run time",
                ", but the plan's decisions recompute saved tensors");
    if (j.contains("offloads")) {
      const auto& offs = j.at("offloads");
      REGEN_CHECK(offs.is_array(), origin, ": \"offloads\" is not an array");
      for (const auto& e : offs) {
        Offload o;
        o.saved = e.at("saved").get<int32_t>();
        REGEN_CHECK(
            o.saved >= 0 && static_cast<size_t>(o.saved) < p.saved.size() &&
                e.at("name").get<std::string>() == p.saved[static_cast<size_t>(o.saved)].name,
            origin, ": an offload names saved tensor ", o.saved, " '",
            e.at("name").get<std::string>(), "', which does not match the profile");
        auto node_of = [&](const char* key, const char* name_key) {
          const int32_t n = e.at(key).get<int32_t>();
          REGEN_CHECK(n >= 0 && static_cast<size_t>(n) < p.nodes.size() &&
                          e.at(name_key).get<std::string>() == p.nodes[static_cast<size_t>(n)].name,
                      origin, ": the offload of '", p.saved[static_cast<size_t>(o.saved)].name,
                      "' names node ", n, " '", e.at(name_key).get<std::string>(), "' as ", key,
                      ", which does not match the profile");
          return n;
        };
        o.free_after = node_of("free_after", "free_after_name");
        o.prefetch_before = node_of("prefetch_before", "prefetch_before_name");
        plan.offloads.push_back(o);
      }
    }
    plan.optimizer_state = parse_state_place(j.value("optimizer_state", std::string("device")));
    if (j.contains("transfer")) plan.transfer = transfer_from_json(j.at("transfer").dump(), origin);
    REGEN_CHECK(!plan.uses_host() || plan.transfer.valid() || p.transfer.valid(), origin,
                ": the plan copies to the host tier and names no transfer model, nor does the "
                "profile");
    if (j.contains("regenerations")) {
      const auto& regen = j.at("regenerations");
      REGEN_CHECK(regen.is_array(), origin, ": \"regenerations\" is not an array");
      for (const auto& r : regen) {
        Regeneration g;
        g.node = r.at("before").get<int32_t>();
        REGEN_CHECK(
            g.node >= 0 && static_cast<size_t>(g.node) < p.nodes.size() &&
                r.at("before_name").get<std::string>() == p.nodes[static_cast<size_t>(g.node)].name,
            origin, ": a regeneration names node ", g.node, " '",
            r.at("before_name").get<std::string>(), "', which does not match the profile");
        for (const auto& e : r.at("restore")) {
          const int64_t i = e.at("saved").get<int64_t>();
          REGEN_CHECK(i >= 0 && static_cast<size_t>(i) < p.saved.size() &&
                          e.at("name").get<std::string>() == p.saved[static_cast<size_t>(i)].name,
                      origin, ": a regeneration names saved tensor ", i, " '",
                      e.at("name").get<std::string>(), "', which does not match the profile");
          g.saved.push_back(static_cast<int32_t>(i));
        }
        plan.regenerations.push_back(std::move(g));
      }
    }
    // The schedule builder checks what no single field can: each named tensor is evicted when
    // its regeneration runs.
    try {
      plan_schedule(p, plan);
    } catch (const Error& e) {
      REGEN_FAIL(origin, ": ", e.what());
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    REGEN_FAIL(origin, ": malformed plan: ", json_error_text(e));
  }
  return plan;
}

}  // namespace regen
