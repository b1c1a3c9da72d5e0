// Stage 1: the profiler. It runs warm-up steps, then instrumented steps with the allocator's
// event log on and tape hooks marking every node's forward and backward, and builds a Profile:
// the graph, the exact allocation sequence with markers, the layout the iteration started from,
// and median timings. `regen profile` writes it as profile.json, a table and a Chrome trace.
// remat/profile/ is stage 1: this, the Profile it makes, and what is measured or estimated beside
// it (docs/architecture.md, "remat").
#pragma once

#include <functional>
#include <map>
#include <string>

#include "regen/models/train.h"
#include "regen/remat/profile/profile.h"

namespace regen {

struct ProfileOptions {
  int warmup = 1;      // plain steps first (caches, first-touch costs)
  int iterations = 3;  // instrumented steps; timings are medians over them
  std::string model_name;
  // The flags besides model, batch and device that shape the step (Profile::run).
  std::map<std::string, std::string> run;
  // Sees the result of every step it runs, warm-up and instrumented (they train the model): a
  // metrics log keeps them.
  std::function<void(const StepResult&)> on_step;
  // After the instrumented steps, measure the copies between the device and its host tier
  // (transfer.h measure_transfer, a few sizes up to 16 MiB: tens of ms) into Profile::transfer.
  // Not in a dry run.
  bool measure_transfer = true;
  // How op times are taken (profile.h OpTiming): sync, or on the device's own clock. A dry run
  // reads the host clock either way (it queues no work).
  OpTiming op_timing = OpTiming::sync;
};

// Extra hooks (e.g. a remat executor) may be installed on the tape while profiling; the
// profile then describes the iteration as executed with them.
Profile profile_training(Trainer& trainer, const ProfileOptions& options);

}  // namespace regen
