// `regen profile`: stage 1. Profiles training iterations of a model and writes profile.json, a
// readable table (profile.txt) and a Chrome trace (trace.json).
#include <cstdio>
#include <optional>

#include "regen/core/io.h"
#include "regen/remat/profile/profiler.h"
#include "regen/remat/report.h"
#include "regen/remat/simulate/simulator.h"
#include "tools/command.h"
#include "tools/common.h"
#include "tools/distributed.h"

namespace regen::tool {
namespace {

struct Flags {
  SessionOptions m;
  int warmup = 1;
  int iterations = 3;
  std::string out = ".";
  bool full = false;
  std::string op_timing = "sync";
};

void setup(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  add_model_flags(app, f->m);
  app.add_option("--warmup", f->warmup, "plain steps before profiling")
      ->check(non_negative_integer(kIntMax))
      ->capture_default_str();
  app.add_option("--iterations", f->iterations, "instrumented steps (timings are their medians)")
      ->check(positive_integer(kIntMax))
      ->capture_default_str();
  app.add_option("--out", f->out,
                 "folder for profile.json, profile.txt and trace.json (created if missing)")
      ->capture_default_str();
  app.add_flag("--full", f->full, "print every op and activation, not only the largest");
  add_op_timing_flag(app, f->op_timing);
  app.callback([f] {
    f->m.validate();  // the flags before the folder
    // Made if missing (and removed again if the run fails), locked against a second writer: a
    // second profile into the same folder stops here. Under mpirun rank 0 owns the folder and
    // writes the files.
    std::optional<OutputFolder> out;
    if (output_rank()) {
      out.emplace(f->out, "--out");
      std::vector<std::pair<std::string, std::string>> outputs;
      for (const char* name : {"/profile.json", "/profile.txt", "/trace.json"}) {
        outputs.emplace_back("--out", f->out + name);
      }
      check_distinct_files(outputs, data_inputs(f->m));
    }
    auto s = make_session(f->m);
    ProfileOptions po;
    po.warmup = f->warmup;
    po.iterations = f->iterations;
    po.model_name = f->m.model;
    po.op_timing = parse_op_timing(f->op_timing, "--op-timing");
    Profile p = profile_training(*s->trainer, po);
    p.run = run_flags(f->m);
    const std::string table = profile_table(p, true);
    // The three files together: all written and synced before the first replaces an old one;
    // profile.json is renamed last, and the others carry its id, so that a kill between the
    // renames leaves a set load_profile refuses (simulator.h profile_set_files).
    if (output_rank()) {
      write_files_atomic(profile_set_files(f->out, profile_to_json(p), table, profile_trace(p)));
    }
    std::printf("%s", f->full ? table.c_str() : profile_table(p, false).c_str());
    std::printf(
        "\nwrote %s/profile.json, %s/profile.txt (every op and activation) and "
        "%s/trace.json (open in https://ui.perfetto.dev)\n",
        f->out.c_str(), f->out.c_str(), f->out.c_str());
  });
}
REGEN_COMMAND("profile",
              "profile training iterations: per-op time and memory, activation "
              "lifetimes (writes profile.json, profile.txt, trace.json)",
              setup);

}  // namespace
}  // namespace regen::tool
