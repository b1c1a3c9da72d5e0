// `regen estimate`: the analytic memory model (remat/profile/estimate.h), with no run: parameters,
// gradients, optimizer state, inputs, the activations saved for backward without remat or with
// every block checkpointed, what backward adds, and the peak. With --compare, the same terms
// exactly from a dry profile of the step (no kernel runs; milliseconds) and the error of each.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "regen/core/io.h"
#include "regen/remat/profile/estimate.h"
#include "tools/command.h"
#include "tools/common.h"
#include "tools/distributed.h"

namespace regen::tool {
namespace {

struct Flags {
  SessionOptions m;
  std::string policy = "none";
  bool compare = false;
  std::string csv;
};

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string describe(const ModelConfig& c, int64_t batch) {
  std::ostringstream os;
  os << c.name << " batch " << batch;
  if (estimate_arch(c) == EstimateArch::resnet) {
    os << ", " << c.image_size << "x" << c.image_size << " images, " << c.num_classes << " classes";
  } else {
    os << ", " << c.seq_len << " tokens, vocabulary " << c.vocab << ", dropout " << c.dropout
       << ", head " << (c.head_chunk_rows < 0 ? "unfused" : "fused");
  }
  return os.str();
}

void run(const Flags& f) {
  f.m.validate();
  const ModelConfig c = f.m.model_config();
  EstimateOptions o;
  o.optimizer = f.m.optimizer;
  o.momentum = f.m.momentum;
  o.masks = f.m.masks;
  o.policy = parse_estimate_policy(f.policy);
  // The closed forms count an fp32 step; a mixed precision's terms come from its dry run.
  o.precision = estimate_precision(f.m, f.compare);
  const bool closed = !is_mixed(o.precision);
  if (!f.csv.empty()) check_distinct_files({{"--csv", f.csv}}, data_inputs(f.m));
  // A size refused (bytes past what 64-bit counts hold, a dry run too long) is named by its flags.
  std::string sizes = "--batch " + std::to_string(f.m.batch);
  for (const auto& [key, value] : f.m.model_options) {
    const ModelOption* opt = model_info(f.m.model).input.option(key);
    if (opt && (opt->sizes_step || opt->sizes_parameters))
      sizes += " " + f.m.name(key) + " " + option_value_text(*opt, value);
  }
  MemoryTerms est, exact;
  try {
    if (closed) est = estimate_memory(c, f.m.batch, o);
    if (f.compare) exact = measure_memory_terms(dry_profile(c, f.m.batch, o), o.policy);
  } catch (const Error& e) {
    REGEN_FAIL(sizes, ": ", e.message());
  }
  std::printf("estimate of one training step of %s; precision %s; %s%s; policy %s (%s)\n",
              describe(c, f.m.batch).c_str(), precision_name(o.precision), o.optimizer.c_str(),
              o.optimizer == "sgd" ? (" momentum " + fmt_g(o.momentum)).c_str() : "",
              estimate_policy_name(o.policy),
              o.policy == EstimatePolicy::none ? "every saved activation held"
                                               : "every block checkpointed, as the blocks planner");
  std::printf("  %-16s %14s", "term", "closed form");
  if (f.compare) std::printf(" %14s %9s", "exact", "error");
  std::printf("\n");
  const std::pair<const char*, int64_t MemoryTerms::*> terms[] = {
      {"parameters", &MemoryTerms::parameters},
      {"gradients", &MemoryTerms::gradients},
      {"optimizer state", &MemoryTerms::optimizer_state},
      {"inputs", &MemoryTerms::inputs},
      {"activations", &MemoryTerms::activations},
      {"backward", &MemoryTerms::backward},
      {"peak", &MemoryTerms::peak},
  };
  std::ostringstream csv;
  csv << "model,family,batch,image_size,seq_len,policy,optimizer,term,closed_form_bytes,"
         "exact_bytes,error_pct\n";
  // Every row's first seven columns.
  std::ostringstream row_text;
  row_text << c.name << "," << estimate_arch_name(estimate_arch(c)) << "," << f.m.batch << ","
           << (estimate_arch(c) == EstimateArch::resnet ? c.image_size : 0) << ","
           << (estimate_arch(c) == EstimateArch::transformer ? c.seq_len : 0) << ","
           << estimate_policy_name(o.policy) << "," << o.optimizer << ",";
  const std::string row = row_text.str();
  for (const auto& [name, member] : terms) {
    const int64_t a = est.*member;
    std::printf("  %-16s %14s", name, closed ? format_bytes(a).c_str() : "-");
    std::string err;
    if (f.compare) {
      const int64_t b = exact.*member;
      char buf[32];
      std::snprintf(buf, sizeof buf, "%+.1f%%", b != 0 ? 100.0 * double(a - b) / double(b) : 0.0);
      err = !closed ? "-" : b != 0 ? buf : (a == 0 ? "0" : "-");
      std::printf(" %14s %9s", format_bytes(b).c_str(), err.c_str());
    }
    std::printf("\n");
    csv << row << name << "," << (closed ? std::to_string(a) : "") << ","
        << (f.compare ? std::to_string(exact.*member) : "") << ","
        << (f.compare && !err.empty() && err != "-" ? err.substr(0, err.size() - 1) : "") << "\n";
  }
  if (f.compare) {
    // The allocated peak has no closed form here: the allocator's rounding comes on top.
    csv << row << "peak allocated,," << exact.peak_allocated << ",\n";
    csv << row << "scratch at peak,," << exact.scratch_at_peak << ",\n";
    csv << row << "weight copies,," << exact.weight_copies << ",\n";
    if (exact.weight_copies > 0) {
      std::printf(
          "  of the activations, %s are 16-bit copies of weights (saved by the ops that "
          "read them) and %s the forward's activations proper\n",
          format_bytes(exact.weight_copies).c_str(),
          format_bytes(exact.activations - exact.weight_copies).c_str());
    }
    std::printf(
        "  exact: requested bytes of a dry run of the step (shapes only, no kernels); with the "
        "allocator's rounding the peak is %s allocated. 'backward' is what the peak holds beyond "
        "the terms above; measured, it includes %s of kernel scratch (workspace), which the "
        "closed form leaves out\n",
        format_bytes(exact.peak_allocated).c_str(), format_bytes(exact.scratch_at_peak).c_str());
  }
  if (!f.csv.empty()) {
    if (output_rank()) write_file_atomic(f.csv, csv.str());
    std::printf("wrote %s\n", f.csv.c_str());
  }
}

void setup(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  add_model_flags(app, f->m);
  app.add_option("--policy", f->policy,
                 "none (every saved activation held) or blocks (every residual block or encoder "
                 "layer checkpointed, as the blocks planner does)")
      ->check(CLI::IsMember({"none", "blocks"}))
      ->capture_default_str();
  app.add_flag("--compare", f->compare,
               "also the exact terms, from a dry run of the step (shapes only, no kernels: "
               "milliseconds at usual sizes; a batch whose dry run would take minutes is "
               "refused), and each term's error");
  app.add_option("--csv", f->csv, "write the terms (and with --compare the exact ones) as CSV")
      ->check(non_empty("a file name"));
  app.callback([f] { run(*f); });
}
REGEN_COMMAND("estimate",
              "closed-form memory of a training step (parameters, gradients, optimizer state, "
              "activations with and without per-block checkpointing), with no run",
              setup);

}  // namespace
}  // namespace regen::tool
