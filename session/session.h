// A training session: make_session builds what one training run needs (model, optimizer, data,
// trainer) from SessionOptions (options.h) after a dry run of the first step has shown that it
// fits. The layer above remat: records.h (what profiles record of a session), checkpoint.h
// (checkpoints and training states), training_run.h (the one training loop). Tests:
// tests/test_cli.cpp, tests/test_models.cpp (a registered model's session).
//
//   regen::SessionOptions o;
//   o.model = "resnet50";
//   o.batch = 8;
//   o.model_options["image_size"] = 128;
//   auto s = regen::make_session(o);          // validates, dry-runs, builds
//   regen::RematPipeline pipe(*s->trainer);   // profile, plan (remat/execute/pipeline.h)
//   regen::TrainingRun run(*s, pipe);         // train (training_run.h)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "regen/remat/profile/profile.h"
#include "regen/session/options.h"

namespace regen {

// Everything one training run needs, built from the options on a fresh allocator state.
struct Session {
  SessionOptions options;
  Device device;
  // What the run trains in (resolve_precision): the trainer's, and evaluate_session's autocast.
  Precision precision = Precision::fp32;
  ModelConfig config;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<Trainer> trainer;
  DryRunResult preflight;  // the first step without remat, run dry before anything was built
  // The held-out split (data.h EvalSource): made with the session when options.eval_every > 0,
  // else by the first evaluate_session.
  std::unique_ptr<EvalSource> eval_data;
  // Data parallelism (dist/data_parallel.h) when the world has more than one rank: the trainer's
  // gradient sync. Null in a process alone.
  std::unique_ptr<GradientSync> sync;
  // The packed-save decisions the trainer's steps record with (options.masks; null when off),
  // learned from a dry forward pass (models/train.h learn_packed_saves).
  std::shared_ptr<const PackedSaves> packed_saves;
};

// What make_session refuses before it builds the model, from the dry run of the first step
// (models/train.h dry_run_step): step, a step without remat whose peak of allocated bytes passes
// the memory available on the device (a run that profiles or trains without a plan); the dry
// run's peak is the real step's on either device, the kernels' scratch space included (on CUDA
// with cuDNN's and CUB's workspaces as the GPU sizes them, and cuBLAS's); model, only parameters,
// gradients and optimizer state that pass it (a run whose steps follow a plan, which the caller
// checks against its own prediction); none, nothing.
enum class Preflight { step, model, none };
// Validates the options, applies the threads and CUDA settings, checks the data, runs the first
// step dry, refuses what does not fit (Preflight), then builds the model (seeded by
// options.seed), its optimizer, the data source and the trainer. Every batch the data source makes
// is checked against the model's input (ModelInput::batch).
std::unique_ptr<Session> make_session(const SessionOptions& options,
                                      Preflight preflight = Preflight::step);

// Bytes the device can still give this process: the CPU's MemAvailable, or CUDA's free memory,
// plus what the process's allocator already reserves or keeps parked for reuse.
int64_t available_memory(Device device);
// cudaMemGetInfo of a CUDA device (false, zeros, for the CPU): what the device itself reports,
// to set beside the allocator's reserved bytes.
bool cuda_memory_info(Device device, uint64_t& free_bytes, uint64_t& total_bytes);
// Throws regen::Error naming the options, both sizes and what to do when the session's dry run
// does not fit (see Preflight), the step's size exact on either device.
void check_preflight(const Session& s, Preflight preflight);

// Evaluates the session's model on its held-out split (options.eval_batches batches of
// evaluation_batch() examples; the split is made on first use).
EvalResult evaluate_session(Session& s);

}  // namespace regen
