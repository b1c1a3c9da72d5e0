// Checkpoints (weights) and training states (an exact resume) of a session. Tests:
// tests/test_cli.cpp, tests/test_training.cpp, tests/python/test_training.py.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "regen/remat/plan/planner.h"
#include "regen/session/session.h"

namespace regen {

// The first parameter of `model`, or gradient of one, that holds a value that is not finite:
// "gradient of 'fc.weight' holds nan at flat index 3", or "" when all are finite. CPU tensors are
// read in place; a CUDA tensor is copied to the host one at a time. Without `gradients` only the
// parameters are read: after an fp16 step that overflowed and was skipped, the gradients hold the
// inf or NaN that made the loss scaler skip it, and the parameters are the step before's.
std::string first_non_finite(const Model& model, bool gradients = true);
// The first of `tensors` (f32 and f64; other dtypes are not read) that holds a value that is not
// finite: "tensor 'fc.weight' holds nan at flat index 0", or "" when all are. What --load,
// --resume and regen.Model.load, resume and load_state_dict refuse (weights must be finite).
std::string first_non_finite(const NamedTensors& tensors);

// Checkpoints: the state dict (safetensors, atomically) with metadata naming the model and the
// options that shape its parameters (ModelOption::sizes_parameters, and those it records);
// loading compares that metadata with the session's model before the names, and refuses weights
// that are not finite. Returns the number of tensors loaded.
void save_checkpoint(const Session& s, const std::string& path, int64_t steps);
size_t load_checkpoint(Session& s, const std::string& path);

// The state of a training run, to resume it exactly (--save-state, --resume; regen.Model.save_state
// and resume): one safetensors file with the checkpoint's tensors and metadata, the optimizer's
// state tensors ("optimizer/<parameter>.<key>") and update counts ("optimizer/steps", i64), and
// metadata: the optimizer steps taken (the schedule's position), the dropout RNG's seed and
// stream, the data source's position, the options that shape the trajectory ("train.<key>": batch,
// accumulation, optimizer and its settings, schedule, clipping, seed, data, every model option),
// and `extra` (the plan's identity, plan_identity). torch's safetensors reads it; load_checkpoint
// (and --load) take its weights alone.
//
// Under mpirun (N ranks) every rank calls it, and the state is a file per rank, each rank's whole
// state (its weights and buffers, its optimizer state, which under ZeRO is its shard, its dropout
// stream): rank 0's at `path` (which names the save: "ranks", "shard", "bucket_size", "slot",
// "save_id"), rank r's at `path`.rank<r>-of-<N>.<slot>, the slot ("a" or "b") being the one the
// state replaced did not use. The files appear together or not at all: each rank writes a
// temporary and flushes it, the ranks agree that all did, ranks 1.. rename theirs into the unused
// slot, then rank 0 renames its file over `path` (the commit point), and the replaced state's rank
// files are removed. A failure on any rank removes every rank's temporary (and any renamed file)
// and throws, on every rank, regen::Error naming the rank and its file; a crash before rank 0's
// rename leaves the old state whole, one after it the new (docs/distributed.md).
void save_training_state(const Session& s, const std::string& path,
                         const std::map<std::string, std::string>& extra = {});
// Restores a training state into a freshly made session: refuses, naming the option and both
// values, a file whose trajectory options differ from the session's; then the weights, the
// optimizer state, the step count, the RNG and the data position. A run resumed at step k then
// computes bitwise what the run that saved it would have computed from step k on, with or without
// a remat plan (remat changes no value). Returns the file's metadata (steps in "optimizer_steps").
// Under mpirun every rank calls it and reads its own file; refused on every rank, naming both
// values, when the rank count, the shard mode or (under ZeRO) the bucket size is not the saved
// one (a state is not resharded; one process's state is not resumed under mpirun, nor the
// reverse), and when a rank's file is missing or of another save.
std::map<std::string, std::string> resume_training_state(Session& s, const std::string& path);
// The options a training state records and compares ("batch": "8", "lr_schedule": "cosine", ...).
std::map<std::string, std::string> trajectory_options(const SessionOptions& o);
// A plan's identity for a training state's metadata: its policy, budget and a hash of its
// decisions ("plan": "dp, budget 50% of reserved bytes, 12 of 340 recomputed, decisions 3f2a...").
std::map<std::string, std::string> plan_identity(const Plan& plan);

}  // namespace regen
