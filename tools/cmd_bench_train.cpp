// `regen bench train`: times training steps (warm-up, then the median of the timed steps).
#include <algorithm>
#include <cstdio>
#include <omp.h>

#include "core/numeric.h"
#include "tools/common.h"
#include "tools/command.h"

namespace regen::tool {
namespace {

struct Flags {
  ModelFlags m;
  int warmup = 2;
  int steps = 5;
};

void setup(CLI::App& app) {
  auto f = std::make_shared<Flags>();
  add_model_flags(app, f->m);
  app.add_option("--warmup", f->warmup, "untimed steps first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--steps", f->steps, "timed steps")->check(CLI::PositiveNumber)->capture_default_str();
  app.callback([f] {
    auto s = make_session(f->m, f->m.batch);
    for (int i = 0; i < f->warmup; ++i) s->trainer->step();
    std::vector<double> ms;
    int64_t peak = 0;
    for (int i = 0; i < f->steps; ++i) {
      const StepResult r = s->trainer->step();
      ms.push_back(r.ms);
      peak = std::max(peak, r.memory.allocated.peak);
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    const double med = median(ms);
    std::printf("bench train: %s batch %lld on %s, %d threads: median step %.3f s over %d steps "
                "(min %.3f, max %.3f; %d warm-up), %.2f samples/s, peak allocated %s\n",
                f->m.model.c_str(), static_cast<long long>(f->m.batch), s->device.str().c_str(),
                omp_get_max_threads(), med / 1000, f->steps, sorted.front() / 1000,
                sorted.back() / 1000, f->warmup, 1000.0 * f->m.batch / med,
                format_bytes(peak).c_str());
  });
}
REGEN_COMMAND("bench train", "time training steps of a model (median after warm-up)", setup);

}  // namespace
}  // namespace regen::tool
