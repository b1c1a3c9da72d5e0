// A U-Net with long skips for segmentation, defined outside regen, through the installed package
// only (unet_model.h): four levels of two 3x3 convolutions (batch norm, relu) going down with max
// pooling, a bottleneck, and four levels coming up, each joining the upsampled path to its level's
// skip with concat. The deepest level upsamples with a learned transposed convolution, the next
// with bilinear interpolation and the shallow ones with nearest-neighbour copies. A 1x1
// convolution scores every pixel; the loss is the cross-entropy over pixels against a class per
// pixel, from the model's own synthetic scenes.
//
// The program registers it as model "unet" and runs the three stages on it with every registered
// planner, each run a session of the library (session/session.h) as `regen train` makes: the
// reference training without remat, one profile, then for each budget (of allocated bytes, of
// reserved ones for DTR) and planner a plan and three steps under it. It checks, and prints, that
// every step's measured peaks equal the plan's predicted ones to the byte and are not below the
// lower bound, and that the losses, parameters and gradients are bitwise those of the reference. It
// exits 1 when a check fails.
//
//   unet [--budgets 70%,60%] [--batch 16] [--image-size 64] [--width 8] [--milp]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "regen/core/error.h"
#include "regen/remat/execute/dtr.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/session/session.h"
#include "unet_model.h"

namespace {

using namespace regen;

using Run = std::unique_ptr<Session>;

// Every run starts from the same allocator state and seeds, as a fresh process would: a session
// of the registered model, as `regen train --model unet` makes one.
Run make_run(const SessionOptions& options) {
  allocator_for(Device::cpu()).empty_cache();
  return make_session(options);
}

struct Outcome {
  std::vector<double> losses;
  std::vector<int64_t> peak_allocated, peak_reserved;
  std::vector<std::vector<float>> state;  // parameters, then gradients
};

Outcome train(RematPipeline& pipe, Run& r, int steps) {
  Outcome o;
  for (const StepResult& s : pipe.train(steps)) {
    o.losses.push_back(s.loss);
    o.peak_allocated.push_back(s.memory.allocated.peak);
    o.peak_reserved.push_back(s.memory.reserved.peak);
  }
  pipe.finish();
  for (const Tensor& p : r->model->parameters()) o.state.push_back(p.to_vector<float>());
  for (const Tensor& p : r->model->parameters()) o.state.push_back(p.grad().to_vector<float>());
  return o;
}

bool bitwise_same(const Outcome& a, const Outcome& b) {
  if (a.losses != b.losses || a.state.size() != b.state.size()) return false;
  for (size_t i = 0; i < a.state.size(); ++i) {
    if (a.state[i].size() != b.state[i].size() ||
        std::memcmp(a.state[i].data(), b.state[i].data(), a.state[i].size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

int run(int argc, char** argv) {
  std::string budgets_text = "70%,60%";
  int64_t batch = 16, image = 64, width = 8;
  bool milp = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      REGEN_CHECK(i + 1 < argc, a, " needs a value");
      return argv[++i];
    };
    auto integer = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const long long n = std::strtoll(v.c_str(), &end, 10);
      REGEN_CHECK(!v.empty() && *end == 0 && n > 0 && n <= 4096, a,
                  " must be a positive integer up to 4096, got '", v, "'");
      return static_cast<int64_t>(n);
    };
    if (a == "--budgets")
      budgets_text = value();
    else if (a == "--batch")
      batch = integer();
    else if (a == "--image-size")
      image = integer();
    else if (a == "--width")
      width = integer();
    else if (a == "--milp")
      milp = true;
    else
      REGEN_FAIL("unknown argument '", a,
                 "': unet [--budgets 70%,60%] [--batch N] [--image-size N] [--width N] [--milp]");
  }
  std::vector<Budget> budgets;
  for (size_t at = 0; at <= budgets_text.size();) {
    const size_t comma = std::min(budgets_text.find(',', at), budgets_text.size());
    const std::string item = budgets_text.substr(at, comma - at);
    REGEN_CHECK(!item.empty(), "--budgets '", budgets_text, "' has an empty item");
    budgets.push_back(Budget::parse(item));
    at = comma + 1;
  }

  // The model joins the registry like a built-in one (unet_model.h); this run's sizes are its
  // options, checked by the session as the command line's are.
  unet::register_unet();
  SessionOptions options;
  options.model = "unet";
  options.batch = batch;
  options.device = "cpu";
  options.model_options = {{"width", static_cast<double>(width)},
                           {"image_size", static_cast<double>(image)}};
  options.lr = 0.05;
  options.seed = 1234;
  options.validate();

  // Stage 0: the reference, without remat.
  Outcome ref;
  {
    Run r = make_run(options);
    RematPipeline plain(*r->trainer);
    ref = train(plain, r, 3);
  }
  // Stage 1: one profile, on a run of its own.
  Profile profile;
  {
    Run r = make_run(options);
    RematPipeline pipe(*r->trainer);
    ProfileOptions po;
    po.warmup = 1;
    po.iterations = 2;
    profile = pipe.profile(po);
  }
  std::printf(
      "unet: %zu nodes, %zu saved tensors, %zu blocks; batch %lld, %lldx%lld images, width "
      "%lld; no-remat peak %s allocated, %s reserved; lower bound %s\n",
      profile.nodes.size(), profile.saved.size(), profile.blocks.size(),
      static_cast<long long>(batch), static_cast<long long>(image), static_cast<long long>(image),
      static_cast<long long>(width), format_bytes(profile.peak_allocated).c_str(),
      format_bytes(profile.peak_reserved).c_str(),
      format_bytes(memory_lower_bound(profile)).c_str());
  // No plan's step goes below the lower bound (docs/remat.md): checked on every measured step.
  const int64_t lower_bound = memory_lower_bound(profile);
  std::printf("%-7s %-8s %-4s %10s %14s %14s %-7s %10s %-8s\n", "budget", "policy", "fits",
              "recomputed", "predicted", "measured", "peaks", "pred step", "training");

  int failures = 0, met = 0;
  for (const Budget& budget : budgets) {
    for (const std::string& policy : policy_names()) {
      if (planner_info(policy).slow && !milp) continue;  // a solver: minutes beyond small graphs
      Run r = make_run(options);
      RematPipeline pipe(*r->trainer);
      pipe.use_profile(profile);
      PlanOptions po;
      // DTR evicts when the allocator's hard limit refuses a request, and that limit bounds
      // reserved bytes: its budget is a share of the reserved peak; the others', allocated.
      const bool dynamic = dtr_policy(policy).has_value();
      po.budget_of = dynamic ? BudgetOf::reserved : BudgetOf::allocated;
      po.milp_time_limit_s = 20;
      const Plan& plan = pipe.plan(policy, budget, po);
      const int64_t predicted = plan.predicted.peak_allocated;
      const int64_t predicted_reserved = plan.predicted.peak_reserved;
      const double predicted_ms = plan.predicted.time_ms;
      const bool feasible = plan.feasible;
      const int64_t recomputed = plan.recomputed();
      const int64_t budget_bytes = plan.budget_bytes;
      const Outcome got = train(pipe, r, 3);
      bool exact = true, within = true, above = true;
      for (size_t i = 0; i < got.peak_allocated.size(); ++i) {
        exact = exact && got.peak_allocated[i] == predicted &&
                got.peak_reserved[i] == predicted_reserved;
        within = within && (!feasible || (dynamic ? got.peak_reserved[i] : got.peak_allocated[i]) <=
                                             budget_bytes);
        above = above && got.peak_allocated[i] >= lower_bound;
      }
      const bool same = bitwise_same(got, ref);
      std::printf("%-7s %-8s %-4s %10lld %14s %14s %-7s %8.1fms %-8s\n", budget.str().c_str(),
                  policy.c_str(), feasible ? "yes" : "no", static_cast<long long>(recomputed),
                  format_bytes(predicted).c_str(), format_bytes(got.peak_allocated.back()).c_str(),
                  !above  ? "BELOW"
                  : exact ? "exact"
                          : "DIFFER",
                  predicted_ms, same ? "bitwise" : "DIFFERS");
      if (!exact || !same || !within || !above) ++failures;
      if (feasible && policy != "none") ++met;
    }
  }
  if (met == 0) {
    std::printf("unet: no planner met any of the budgets: nothing was checked under a budget\n");
    ++failures;
  }
  if (failures > 0) {
    std::printf("unet: %d planner(s) failed a check\n", failures);
    return 1;
  }
  std::printf(
      "unet: every plan's peaks exact, at or above the lower bound, and its training bitwise that "
      "of no remat\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const regen::Error& e) {
    std::fprintf(stderr, "unet: error: %s\n", e.what());
    return 2;
  }
}
