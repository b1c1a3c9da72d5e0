// Setup shared by the regen subcommands: model/optimizer/data flags and their validators, device
// choice, threads, the objects a training run needs, checkpoints, and the checks that make a
// mistake fail before a long run rather than after it. Tests: tests/test_cli.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "regen/models/data.h"
#include "regen/models/optim.h"
#include "regen/models/train.h"
#include "regen/remat/planner.h"

namespace regen::tool {

// CLI11 validators with messages a user can act on. CLI11 puts the flag's name in front, and
// regen's failure message joins them: "--batch must be a positive integer, got 0",
// "--lr must be a finite number >= 0, got 'abc' (not a number)". The integer validators take
// plain decimal only: CLI11 converts with base 0, so "010" would be octal 8 and "0x10" 16.
// Use them instead of CLI::PositiveNumber / NonNegativeNumber / Range, whose messages print
// DBL_MAX in full and which let nan through.
CLI::Validator positive_integer(int64_t max = std::numeric_limits<int64_t>::max());
CLI::Validator non_negative_integer(uint64_t max = std::numeric_limits<int64_t>::max());
CLI::Validator integer_in(int64_t lo, int64_t hi);
CLI::Validator non_negative_number();  // finite and >= 0
CLI::Validator number_in(double lo, double hi);
CLI::Validator budget_text();  // Budget::parse accepts it, and it is not empty
CLI::Validator non_empty(
    const std::string& what);  // "is empty: give <what>"  // finite and lo <= x <= hi
// For options bound to an `int`.
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// Rewrites a CLI11 error for the terminal: "regen: error: --batch must be ..." plus a pointer to
// --help. Installed on the top-level app by run_cli (tools/cli.cpp).
std::string cli_failure_message(const CLI::App* app, const CLI::Error& e);

struct ModelFlags {
  std::string model = "resnet-tiny";
  int64_t batch = 4;
  std::string device = "auto";
  int64_t image_size = 0;  // 0: the preset's
  int64_t num_classes = 0;
  int64_t seq_len = 0;
  int64_t vocab = 0;    // 0: the preset's (Transformer)
  double dropout = -1;  // < 0: the preset's
  // Transformer LM head in training: -1 unfused (logits, then cross_entropy), 0 fused with
  // automatic chunks, N fused with N rows per chunk; kPresetHeadChunk: the preset's (fused, auto).
  static constexpr int64_t kPresetHeadChunk = -2;
  int64_t lm_head_chunk = kPresetHeadChunk;
  std::string optimizer = "sgd";
  double lr = 0.1;
  double momentum = 0.9;
  double weight_decay = 0.0;
  uint64_t seed = 0;
  int threads = 0;              // 0: OpenMP's default
  std::string data;             // "", synthetic, cifar10:DIR, text:FILE
  std::string conv = "native";  // CUDA convolution: native or cudnn
  // CUDA math mode (--math): fp32 (strict FP32) or tf32 (cuBLAS GEMMs and cuDNN convolutions may
  // use TF32 tensor cores); "" when not given: the command's default (math_mode).
  std::string math;
  bool tf32 = false;  // --tf32: the same as --math tf32 (older scripts; regen.Model(tf32=True))
};

// Adds the flags above to `app` (`with_batch` false for commands that take --batches;
// `math_default` is the help's word on what the command does without --math, add_math_flags).
void add_model_flags(CLI::App& app, ModelFlags& f, bool with_batch = true,
                     const std::string& math_default = "fp32");

// --math fp32|tf32 and its synonym --tf32; `default_help` says what the command does without them
// ("fp32", or "tf32 on a CUDA device, fp32 on the CPU").
void add_math_flags(CLI::App& app, std::string& math, bool& tf32, const std::string& default_help);
// The math mode a run on `device` uses, "fp32" or "tf32": --math when given, tf32 for --tf32, else
// `default_math` on a CUDA device and fp32 on the CPU (every CPU kernel is FP32). Throws
// regen::Error naming both flags for --tf32 with --math fp32, naming the flag for --math other
// than fp32 or tf32, and for tf32 asked of the CPU.
std::string math_mode(const std::string& math, bool tf32, Device device,
                      const std::string& default_math = "fp32");
std::string math_mode(const ModelFlags& f, Device device, const std::string& default_math = "fp32");
// The benchmarks' default math mode on CUDA (what people run on Hopper; training and everything
// else default to fp32), and what their help says of it.
inline constexpr char kBenchMath[] = "tf32";
inline constexpr char kBenchMathHelp[] = "tf32 on a CUDA device, fp32 on the CPU";

// Checks the flags' values and how they combine, without building anything (make_session calls
// it; it also guards callers that fill ModelFlags in code). Throws regen::Error naming the flag.
void check_model_flags(const ModelFlags& f);

// The preset named by --model with --image-size, --num-classes, --seq-len, --vocab, --dropout,
// --lm-head-chunk and --seed applied. Throws regen::Error for a flag that does not fit the model.
ModelConfig model_config(const ModelFlags& f);

// "auto": cuda:0 when regen was built with CUDA and a GPU is visible, else cpu.
Device resolve_device(const std::string& text);

// Everything one training run needs, built from the flags on a fresh allocator state.
struct Session {
  ModelFlags flags;
  Device device;
  ModelConfig config;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<DataSource> data;
  std::unique_ptr<Trainer> trainer;
  DryRunResult preflight;  // the first step without remat, run dry before anything was built
};

// What make_session refuses before it builds the model, from the dry run of the first step
// (models/train.h dry_run_step): step, a step without remat whose peak of allocated bytes passes
// the memory available on the device (a command that profiles or trains without a plan); the dry
// run's peak is exact on the CPU, the kernels' scratch space included, and on CUDA a lower bound
// the real step passes by at most the CUDA kernels' scratch; model, only parameters, gradients
// and optimizer state that pass it (a run whose steps follow a plan, which the caller checks
// against its own prediction); none, nothing.
enum class Preflight { step, model, none };
// Bytes the device can still give this process: the CPU's MemAvailable, or CUDA's free memory,
// plus what the process's allocator already reserves or keeps parked for reuse.
int64_t available_memory(Device device);
// Throws regen::Error naming the flags, both sizes and what to do when the session's dry run
// does not fit (see Preflight); the message says whether the step's size is exact (CPU) or a
// lower bound (CUDA).
void check_preflight(const Session& s, int64_t batch, Preflight preflight);
std::unique_ptr<Session> make_session(const ModelFlags& flags, int64_t batch,
                                      Preflight preflight = Preflight::step);

// The flags besides --model, --batch and --device that shape a session's step, with the values it
// runs with (Profile::run): what a profile records and what a run planned from it must match.
std::map<std::string, std::string> run_flags(const ModelFlags& f);
// Refuses a profile recorded with other run_flags than `f` gives, naming the flag, both values
// and what to do; `what` names the profile ("--profile FILE"). A profile written before --math
// (--tf32 on|off) is read as --math tf32|fp32.
void check_profile_run(const Profile& p, const ModelFlags& f, const std::string& what);
// The math mode a profile's steps ran with: its --math (fp32 on the CPU), or its --tf32 on|off
// (CUDA profiles written before --math), else fp32 (profiles from before either was recorded).
std::string profile_math(const Profile& p);

// --budget-of reserved|allocated: what a --budget bounds (planner.h BudgetOf).
void add_budget_of_flag(CLI::App& app, std::string& budget_of);
// --layout caching|planned: where a planned step's blocks go (PlanOptions::planned_layout).
void add_layout_flag(CLI::App& app, std::string& layout);

// Applies --threads and the CUDA settings (--conv, and --math as math_mode gives it for `device`);
// returns the thread count in use.
int apply_runtime_flags(const ModelFlags& f, Device device);

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
};
// A fresh session (make_session) on an emptied allocator and `steps` steps through a
// RematPipeline: without `plan`, no rematerialization; with it (made for `profile`), every step
// under the plan, its limit (or `limit` when >= 0) and its planned layout. An out-of-memory error
// names what the plan predicted.
MeasuredRun measure_training(const ModelFlags& m, int64_t batch, int steps,
                             const Profile* profile = nullptr, const Plan* plan = nullptr,
                             int64_t limit = -1);

// "a,b,,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_commas(const std::string& s);

// The python that draws plots: $REGEN_PYTHON, else Debian's /usr/bin/python3 (with
// python3-matplotlib) when present, else whatever python3 is first on PATH.
std::string plot_python();

// Throws regen::Error naming the flag when `path` cannot be written (io.h why_not_writable):
// call before a long run for every output it will write at the end.
void check_output_path(const std::string& flag, const std::string& path);
// Each output writable (check_output_path), and no two of the outputs and inputs the same file
// (flag, path pairs; empty input paths are skipped): a regen::Error naming both flags.
void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& outputs,
                          const std::vector<std::pair<std::string, std::string>>& inputs);

// A training step's loss that is nan or inf: throws regen::Error naming the step, the value and
// the learning rate, suggesting a lower --lr.
void check_finite_loss(double loss, int64_t step, double lr);
// The first parameter of `model`, or gradient of one, that holds a value that is not finite:
// "gradient of 'fc.weight' holds nan at flat index 3", or "" when all are finite. CPU tensors are
// read in place; a CUDA tensor is copied to the host one at a time.
std::string first_non_finite(const Model& model);

// Checkpoints: the state dict with metadata naming the model and the sizes that shape its
// parameters; loading compares that metadata with the session's model before the names.
void save_checkpoint(const Session& s, const std::string& path, int64_t steps);
// Returns the number of tensors loaded.
size_t load_checkpoint(Session& s, const std::string& path);

std::string gib(int64_t bytes);  // "1.234" (GiB, 2^30 bytes)
// "12.345 ms" below 100 ms, "1234.5 ms" above: enough digits for tiny and large models.
std::string format_ms(double ms);
bool stdout_is_terminal();

// cudaMemGetInfo of a CUDA device (false, zeros, for the CPU): what the device itself reports,
// to set beside the allocator's reserved bytes.
bool cuda_memory_info(Device device, uint64_t& free_bytes, uint64_t& total_bytes);

}  // namespace regen::tool
