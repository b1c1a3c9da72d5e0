// Plans as a person asks for them (plan_request.h).
#include "regen/session/plan_request.h"

#include "regen/remat/profile/transfer.h"

namespace regen {

namespace {

// `value` of option `key` as `style` writes it: "--offload all", "offload='all'".
std::string setting(const std::string& key, const std::string& value, OptionStyle style) {
  return option_setting(key, style == OptionStyle::keyword ? "'" + value + "'" : value, style);
}

// Runs `parse`; its error is prefixed with the option and its value as `style` writes them.
template <class F>
auto named(const std::string& key, const std::string& value, OptionStyle style, F&& parse) {
  try {
    return parse();
  } catch (const Error& e) {
    REGEN_FAIL(setting(key, value, style), ": ", e.message());
  }
}

}  // namespace

void check_offload_request(const std::string& offload, const std::string& transfer, bool planning,
                           OptionStyle style) {
  const bool keyword = style == OptionStyle::keyword;
  REGEN_CHECK(offload == "none" || planning, setting("offload", offload, style),
              " is what a planner may move to the host tier, and no plan is made here: give ",
              setting("policy", "dp", style), " or ", setting("policy", "milp", style),
              " (the planners that offload)");
  REGEN_CHECK(transfer == "profile" || offload != "none", setting("transfer", transfer, style),
              " times copies to and from the host tier, and ", option_name("offload", style),
              " is none: give ",
              keyword ? "offload='activations', 'optimizer' or 'all'"
                      : "--offload activations, optimizer or all",
              ", or drop ", option_name("transfer", style));
}

void PlanRequest::set_budget(const std::string& text) {
  budget = parse_budget_option(text, "budget", style);
  budget_text = text;
}

bool PlanRequest::at_step_time() const {
  const PlannerInfo* p = find_planner(policy);
  return p != nullptr && p->at_step_time.has_value();
}

void PlanRequest::validate(bool compress, bool given_plan) const {
  const bool keyword = style == OptionStyle::keyword;
  // As keywords: policy=, budget= (the command line's --policy, --budget).
  const auto ask = [&](const std::string& key) { return keyword ? key + "=" : "--" + key; };
  planner_info(policy);  // its message names the policy and lists the known ones
  named("chain", chain, style, [&] { return parse_chain(chain); });
  named("budget_of", budget_of, style, [&] { return parse_budget_of(budget_of); });
  REGEN_CHECK(layout == "caching" || layout == "planned", setting("layout", layout, style),
              ": must be caching or planned");
  named("offload", offload, style, [&] { return parse_offload_mode(offload); });
  const std::string planners = join_names(remat_policy_names());
  REGEN_CHECK(!budget_given() || plans(), setting("budget", budget_text, style),
              " needs a rematerialization ", ask("policy"), " (", planners, ")");
  // What only a planner reads is refused at anything but its default when none plans, as the
  // Python module's train refuses it (a plan file carries its own).
  const std::pair<const char*, std::pair<const std::string*, const char*>> planning[] = {
      {"chain", {&chain, "auto"}}, {"budget_of", {&budget_of, "reserved"}}};
  for (const auto& [key, value] : planning) {
    REGEN_CHECK(
        *value.first == value.second || plans(), setting(key, *value.first, style),
        " applies to planning with a rematerialization ", ask("policy"),
        given_plan ? std::string("; the plan file carries its own") : " (" + planners + ")");
  }
  if (layout == "planned") {
    REGEN_CHECK(plans() || compress || given_plan, setting("layout", "planned", style),
                " places the blocks of a rematerialization plan: give ", ask("policy"), " (one of ",
                planners, ") or ", keyword ? "plan=" : "--plan");
    REGEN_CHECK(!at_step_time(), setting("layout", "planned", style), ": ",
                setting("policy", policy, style),
                " evicts at run time under the caching allocator's limit, with no placement to "
                "plan; use ",
                setting("layout", "caching", style));
  }
  check_offload_request(offload, transfer, plans(), style);
  if (offload != "none" && plans() && !planner_info(policy).offloads) {
    std::string offloading;  // the planners that do, for the message
    for (const std::string& name : remat_policy_names()) {
      const PlannerInfo* p = find_planner(name);
      if (p != nullptr && p->offloads) {
        offloading += (offloading.empty() ? "" : " or ") + setting("policy", name, style);
      }
    }
    REGEN_FAIL(setting("offload", offload, style),
               " is what a planner may move to the host tier, but ",
               setting("policy", policy, style), " plans no offload and would ignore it: give ",
               offloading, ", or drop ", option_name("offload", style));
  }
}

PlanOptions PlanRequest::options(const Profile* profile) const {
  PlanOptions o;
  o.chain = named("chain", chain, style, [&] { return parse_chain(chain); });
  o.budget_of = named("budget_of", budget_of, style, [&] { return parse_budget_of(budget_of); });
  REGEN_CHECK(layout == "caching" || layout == "planned", setting("layout", layout, style),
              ": must be caching or planned");
  o.planned_layout = layout == "planned";
  o.offload = named("offload", offload, style, [&] { return parse_offload_mode(offload); });
  o.milp_time_limit_s = milp_time_limit_s;
  o.milp_threads = milp_threads;
  // The profile's own transfer model is the default; resolving it here names the option when the
  // profile has none and the plan needs one.
  if (profile != nullptr && (transfer != "profile" || profile->transfer.valid())) {
    if (style == OptionStyle::keyword) {
      o.transfer =
          named("transfer", transfer, style, [&] { return transfer_for(transfer, *profile); });
    } else {
      o.transfer = transfer_for(transfer, *profile);  // its message names --transfer
    }
  }
  return o;
}

Plan PlanRequest::make(const Simulator& sim, const Profile& profile, PlanCache* cache) const {
  PlanOptions o = options(&profile);
  o.cache = cache;
  return make_plan(sim, policy, budget, o);
}

}  // namespace regen
