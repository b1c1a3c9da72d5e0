// `regen eval`: evaluates a checkpoint (a --save or --save-state file) on the held-out split of its
// data: CIFAR-10's test_batch.bin, the last part of a text file (--eval-split), or synthetic
// examples no training step draws. No tape and no saved tensors; the memory it takes is the
// allocator's, printed with the result.
#include <cstdio>

#include "regen/core/io.h"
#include "regen/models/evaluate.h"
#include "tools/command.h"
#include "tools/common.h"

namespace regen::tool {
namespace {

struct EvalFlags {
  SessionOptions m;
  std::string load, json;
};

void run(const EvalFlags& f) {
  if (!f.json.empty()) {
    std::vector<std::pair<std::string, std::string>> inputs = data_inputs(f.m);
    inputs.emplace_back("--load", f.load);
    check_distinct_files({{"--json", f.json}}, inputs);
  }
  // The weights only: the optimizer is built but never steps, and no training step needs to fit.
  auto s = make_session(f.m, Preflight::model);
  const size_t n = load_checkpoint(*s, f.load);
  std::printf("loaded %s (%zu tensors) into %s on %s\n", f.load.c_str(), n, f.m.model.c_str(),
              s->device.str().c_str());
  const EvalResult e = evaluate_session(*s);
  std::printf("evaluated on %s: %lld examples in %lld batches of up to %lld\n",
              s->eval_data->describe().c_str(), static_cast<long long>(e.examples),
              static_cast<long long>(e.batches), static_cast<long long>(f.m.evaluation_batch()));
  std::printf("  %s\n", eval_summary(e).c_str());
  std::printf("  %s, %.1f examples/s\n", format_ms(e.ms).c_str(),
              e.ms > 0 ? 1000.0 * static_cast<double>(e.examples) / e.ms : 0.0);
  std::printf(
      "  memory (no tape, no saved tensors): peak allocated %s, reserved %s, of which the model's "
      "state %s\n",
      format_bytes(e.memory.allocated.peak).c_str(), format_bytes(e.memory.reserved.peak).c_str(),
      format_bytes(e.persistent).c_str());
  if (!f.json.empty()) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "{\"model\": \"%s\", \"checkpoint\": \"%s\", \"examples\": %lld, \"loss\": %.9g, "
                  "\"accuracy\": %s, \"perplexity\": %s, \"ms\": %.6g, \"peak_allocated\": %lld, "
                  "\"peak_reserved\": %lld}\n",
                  f.m.model.c_str(), f.load.c_str(), static_cast<long long>(e.examples), e.loss,
                  e.accuracy >= 0 ? std::to_string(e.accuracy).c_str() : "null",
                  e.perplexity >= 0 ? std::to_string(e.perplexity).c_str() : "null", e.ms,
                  static_cast<long long>(e.memory.allocated.peak),
                  static_cast<long long>(e.memory.reserved.peak));
    write_file_atomic(f.json, buf);
  }
}

void setup(CLI::App& app) {
  auto f = std::make_shared<EvalFlags>();
  add_model_flags(app, f->m);
  add_eval_flags(app, f->m);
  app.add_option("--load", f->load,
                 "the checkpoint: FILE.safetensors from --save or --save-state (its weights)")
      ->required()
      ->check(non_empty("a file name"));
  app.add_option("--json", f->json, "also write the result to FILE (JSON)")
      ->check(non_empty("a file name"));
  // The model's flags are training's too; those that only shape a training step would be ignored
  // here, so they are refused by name.
  app.callback([f, &app] {
    for (const char* flag :
         {"--optimizer", "--lr", "--momentum", "--weight-decay", "--grad-norm", "--compress",
          "--shard", "--bucket-size", "--masks", "--lm-head-recompute"}) {
      REGEN_CHECK(app.count(flag) == 0, flag,
                  " applies to training, and eval runs no training step (no optimizer, gradients, "
                  "tape or saved tensors): drop it");
    }
    run(*f);
  });
}
REGEN_COMMAND(
    "eval", "evaluate a checkpoint on the held-out split of its data (accuracy, loss, perplexity)",
    setup);

}  // namespace
}  // namespace regen::tool
