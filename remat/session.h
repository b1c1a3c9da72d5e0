// A training session as library API. SessionOptions is what a person chooses (the regen command
// line's flags, regen.Model's keywords, or a program's own code): a registered model with its own
// options (models/model.h ModelInput), the optimizer, data, device and threads. validate() holds
// every range check once, for the command line and the Python module alike; make_session builds
// what one training run needs (model, optimizer, data, trainer) after a dry run of the first step
// has shown that it fits. Also what a session's profiles and checkpoints record, and one measured
// training run (sweep, frontier). Tests: tests/test_cli.cpp (through the tool and directly),
// tests/python/test_errors.py, tests/test_models.cpp (a registered model's session).
//
//   regen::SessionOptions o;
//   o.model = "resnet50";
//   o.batch = 8;
//   o.model_options["image_size"] = 128;
//   auto s = regen::make_session(o);          // validates, dry-runs, builds
//   regen::RematPipeline pipe(*s->trainer);   // profile, plan, train (pipeline.h)
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "regen/models/data.h"
#include "regen/models/evaluate.h"
#include "regen/models/optim.h"
#include "regen/models/train.h"
#include "regen/remat/planner.h"
#include "regen/remat/profile.h"

namespace regen {

struct SessionOptions {
  std::string model = "resnet-tiny";  // a registered model (model_preset_names())
  int64_t batch = 4;
  std::string device = "auto";  // auto, cpu, cuda, cuda:N
  // The model's own options that were given, by key ("image_size": 64): those of its
  // ModelInput::options; the others keep the preset's values.
  std::map<std::string, double> model_options;
  // The model's configuration given whole instead of its registered preset: a program's variant of
  // a registered model with sizes no option sets (other block counts, widths). Its name must be
  // `model`, whose build function and input serve it; model_options and the seed still apply.
  std::optional<ModelConfig> config;
  std::string optimizer = "sgd";  // sgd or adamw
  double lr = 0.1;
  double momentum = 0.9;  // SGD's
  double weight_decay = 0.0;
  uint64_t seed = 0;            // parameters, data and dropout
  int64_t threads = 0;          // CPU threads, at most kMaxThreads; 0: OpenMP's default
  std::string data;             // "": the model's first data kind (synthetic); else NAME[:ARG]
  std::string conv = "native";  // CUDA convolution: native or cudnn
  // CUDA math mode: fp32 or tf32; "" when not given (math_mode gives the default). `tf32` is the
  // same as math "tf32" (--tf32, regen.Model(tf32=True)).
  std::string math;
  bool tf32 = false;
  // ---- The training loop (models/train.h, models/schedule.h, models/evaluate.h) ----------------
  // Micro-batches per optimizer step (--accumulate): `batch` is the micro-batch, and each step's
  // gradients are those of the mean loss over batch * accumulate examples.
  int64_t accumulate = 1;
  // The learning-rate schedule (LrSchedule): constant, step or cosine, after `warmup_steps` of
  // linear warm-up; cosine decays to lr_min over schedule_steps steps (0: not set; the command line
  // sets it to --steps), step multiplies by lr_gamma every lr_step_size steps.
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;
  int64_t schedule_steps = 0;
  int64_t lr_step_size = 0;
  double lr_gamma = 0.1;
  double lr_min = 0;
  double clip_grad_norm = 0;  // the global gradient norm clipped to this (0: no clipping)
  bool grad_norm = false;     // compute the gradient norm each step even without clipping (logs)
  // Evaluation on the held-out split: every eval_every optimizer steps (0: not during training),
  // at most eval_batches batches (0: the whole split) of eval_batch examples (0: batch *
  // accumulate). eval_split: the fraction of a text file held out at its end (0: 0.1 when
  // eval_every > 0, else none: the file trains whole).
  int64_t eval_every = 0;
  int64_t eval_batches = 0;
  int64_t eval_batch = 0;
  double eval_split = 0;
  // Data parallelism, when the process is one of several ranks under mpirun (dist/world.h): what
  // each rank keeps of the optimizer state and the gradients ("none"; "optimizer", ZeRO-1;
  // "gradients", ZeRO-2) and the size of a gradient bucket in bytes (DDP's 25 MiB by default).
  // A process alone ignores both. docs/distributed.md.
  std::string shard = "none";
  int64_t bucket_size = int64_t{25} << 20;
  // Packed saves (autograd/tape.h PackedSaves; docs/ops.md): an op whose backward needs only a few
  // bits of what it would save keeps those, packed, where nothing else saves the full tensor (relu
  // a 1-bit mask, max_pool2d its argmax in 4 bits for 3x3 windows). Training is bitwise the same
  // either way. --masks on|off, masks=True|False.
  bool masks = true;
  // Lossy compression of saved activations (remat/compress.h): none, or bf16 or fp16, where every
  // plan holds the activations it retains narrow between their last forward use and backward
  // (training is then no longer bitwise that of none). Applies to steps run under a plan (a run
  // with --compress profiles and plans, policy none at least). --compress, compress=.
  std::string compress = "none";
  // How messages name the options: --image-size (the command line) or image_size= (Python).
  OptionStyle style = OptionStyle::flag;

  static constexpr int64_t kMaxThreads = 1024;  // libgomp fails far above the cores any CPU has
  // The largest batch (and micro-batch, evaluation batch, global batch): 2^24 examples, far above
  // what any device holds for the smallest model, and small enough that counts derived from it
  // (examples x accumulation, batch x sizes of a sample) stay far from int64's limit and loops over
  // a batch's divisors end at once.
  static constexpr int64_t kMaxBatch = int64_t{1} << 24;
  // The range of a session option with one ("batch", "threads", "lr", "momentum",
  // "weight_decay", "bucket_size"); the command line's validators take theirs from here.
  static OptionRange range(const std::string& key);

  // Every value in range and the combination valid, for the registered model, without building
  // or reading anything: the session's own options, the model's options (only the model's, each
  // in its range), the data kind, the model's own checks of its configuration and batch. Throws
  // regen::Error naming the option as `style` says: "--threads must be at most 1024, got
  // 300000", "threads=300000: must be at most 1024".
  void validate() const;
  // The registered model's preset (or `config`) with the given options and the seed applied
  // (validates first).
  ModelConfig model_config() const;
  // The files `data` reads (models/data.h data_input_files; validates first): outputs are checked
  // against them, so that no run writes over its own training data.
  std::vector<std::string> data_files() const;
  // The option `key` as `style` names it.
  std::string name(const std::string& key) const { return option_name(key, style); }
  // The schedule these options give (validates the schedule's fields; schedule_steps must be set
  // for cosine).
  LrSchedule schedule() const;
  // The fraction of a text file held out for evaluation (eval_split, or its default).
  double holdout() const;
  // The evaluation batch size (eval_batch, or batch * accumulate).
  int64_t evaluation_batch() const;
  // The options against a run of `steps` optimizer steps in all (a resumed run's included): a
  // warm-up longer than the run, which would never reach the learning rate, is refused naming both
  // options as `style` says.
  void check_steps(int64_t steps) const;
};

// "auto": cuda:0 when regen was built with CUDA and a GPU is visible, else cpu. A device that is
// not there (or a CUDA runtime that fails) is a regen::Error naming the option as `style` says.
Device resolve_device(const std::string& text, OptionStyle style = OptionStyle::flag);

// The math mode a run on `device` uses, "fp32" or "tf32": `math` when given, tf32 for `tf32`, else
// `default_math` on a CUDA device and fp32 on the CPU (every CPU kernel is FP32). Throws
// regen::Error naming both options for tf32 with math fp32, naming the option for a math mode
// other than fp32 or tf32, and for tf32 asked of the CPU.
std::string math_mode(const std::string& math, bool tf32, Device device,
                      const std::string& default_math = "fp32",
                      OptionStyle style = OptionStyle::flag);
std::string math_mode(const SessionOptions& o, Device device,
                      const std::string& default_math = "fp32");

// Everything one training run needs, built from the options on a fresh allocator state.
struct Session {
  SessionOptions options;
  Device device;
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

// The options besides model, batch and device that shape a session's step, with the values it
// runs with, named as flags ("--optimizer": "adamw", "--image-size": "64"; every option of the
// model, the preset's included): what a profile records (Profile::run) and what a run planned from
// it must match.
std::map<std::string, std::string> run_flags(const SessionOptions& o);
// Refuses a profile recorded with other run_flags than `o` gives, naming the option, both values
// and what to do; `what` names the profile ("--profile FILE", "the profile"). A profile written
// before --math (--tf32 on|off) is read as --math tf32|fp32.
void check_profile_run(const Profile& p, const SessionOptions& o, const std::string& what);
// The math mode a profile's steps ran with: its --math (fp32 on the CPU), or its --tf32 on|off
// (CUDA profiles written before --math), else fp32 (profiles from before either was recorded).
std::string profile_math(const Profile& p);

// The first parameter of `model`, or gradient of one, that holds a value that is not finite:
// "gradient of 'fc.weight' holds nan at flat index 3", or "" when all are finite. CPU tensors are
// read in place; a CUDA tensor is copied to the host one at a time.
std::string first_non_finite(const Model& model);

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
void save_training_state(const Session& s, const std::string& path,
                         const std::map<std::string, std::string>& extra = {});
// Restores a training state into a freshly made session: refuses, naming the option and both
// values, a file whose trajectory options differ from the session's; then the weights, the
// optimizer state, the step count, the RNG and the data position. A run resumed at step k then
// computes bitwise what the run that saved it would have computed from step k on, with or without
// a remat plan (remat changes no value). Returns the file's metadata (steps in "optimizer_steps").
std::map<std::string, std::string> resume_training_state(Session& s, const std::string& path);
// The options a training state records and compares ("batch": "8", "lr_schedule": "cosine", ...).
std::map<std::string, std::string> trajectory_options(const SessionOptions& o);
// A plan's identity for a training state's metadata: its policy, budget and a hash of its
// decisions ("plan": "dp, budget 50% of reserved bytes, 12 of 340 recomputed, decisions 3f2a...").
std::map<std::string, std::string> plan_identity(const Plan& plan);

// Evaluates the session's model on its held-out split (options.eval_batches batches of
// evaluation_batch() examples; the split is made on first use).
EvalResult evaluate_session(Session& s);

// One measured training run (regen sweep, regen frontier): peaks over every step, the median step
// time of all steps but the first (which pays first-touch costs), and the executor's figures of
// its last iteration.
struct MeasuredRun {
  double ms = 0;
  int64_t peak = 0, reserved = 0;  // peak allocated and reserved bytes
  double regen_ms = 0;             // regeneration time of the last step (with an executor)
  int64_t replays = 0;
  // Under a plan at its own limit: the steps whose peaks were checked against the prediction, and
  // how many measured it exactly (RematPipeline::step checks every step).
  int64_t steps_predicted = 0, steps_exact = 0;
  // Under a plan that uses the host tier (offload): its peaks over every step, and the time the
  // last step waited for copies.
  int64_t host_peak = 0, host_reserved = 0;
  double stall_ms = 0;
  // On the CPU, the median over the timed steps of their CPU time over wall time, in cores
  // (StepResult::cpu_cores), and the threads they ran with; when waited_for_other_work says so,
  // their times are not the step's own. 0 on a GPU.
  double cpu_cores = 0;
  int threads = 0;
};
// The share of each thread's core, in CPU time over wall time (StepResult::cpu_cores), a CPU step
// must reach to count as having run undisturbed (MeasuredRun, regen train's summary): below it,
// its time is the machine's load as much as the step's, and is not compared with a prediction as
// its error (as tools/torch_baseline.py reports the CPU time of PyTorch's steps). Measured on this
// project's 2-core machine (2026-11-28, the main job's executed plans): undisturbed 2-thread steps
// of ResNet-152 and the Transformer ran at 1.70-1.91 cores; one that another job's build shared
// the cores with, at 1.34, took 2.09x its predicted time.
inline constexpr double kBusyCores = 0.75;
inline bool waited_for_other_work(double cpu_cores, int threads) {
  return cpu_cores > 0 && cpu_cores < kBusyCores * (threads > 1 ? threads : 1);
}
// A fresh session (make_session) on an emptied allocator and `steps` steps through a
// RematPipeline: without `plan`, no rematerialization; with it (made for `profile`), every step
// under the plan, its limit (or `limit` when >= 0) and its planned layout. An out-of-memory error
// names what the plan predicted.
MeasuredRun measure_training(const SessionOptions& o, int steps, const Profile* profile = nullptr,
                             const Plan* plan = nullptr, int64_t limit = -1);

// A budget as a person writes it ("60%", "2GiB"); empty text is refused ("leave it out to plan
// without a budget"), naming the option `key` as `style` says.
Budget parse_budget_option(const std::string& text, const std::string& key = "budget",
                           OptionStyle style = OptionStyle::flag);

}  // namespace regen
