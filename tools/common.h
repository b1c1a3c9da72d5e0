// The flags shared by the regen subcommands: CLI11 validators with messages a user can act on, the
// session's flags (the library's SessionOptions, session/options.h, which holds their ranges and
// every check: the command line only parses), the flags of every registered model's options, and
// the checks of output paths. Tests: tests/test_cli.cpp.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "regen/session/checkpoint.h"
#include "regen/session/records.h"
#include "regen/session/session.h"
#include "regen/session/training_run.h"
#include "tools/output.h"

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
// Decimal number text: [+-] digits [. digits] [e|E [+-] digits], or the words inf, infinity and
// nan (which the range checks then refuse by name). strtod alone would also read hexadecimal
// ("0x10" as 16, "0x1p3" as 8).
bool decimal_number_text(const std::string& s);
// A value in a range the library sets (SessionOptions::range, ModelOption::range), with its words.
CLI::Validator in_range(const OptionRange& range);
// Budget text the library accepts (parse_budget_option): not empty, and Budget::parse reads it.
CLI::Validator budget_text();
CLI::Validator non_empty(const std::string& what);  // "is empty: give <what>"
// For options bound to an `int`.
constexpr int64_t kIntMax = std::numeric_limits<int>::max();

// Rewrites a CLI11 error for the terminal: "regen: error: --batch must be ..." plus a pointer to
// --help. Installed on the top-level app by run_cli (tools/cli.cpp).
std::string cli_failure_message(const CLI::App* app, const CLI::Error& e);

// Adds the session's flags to `app` (`with_batch` false for commands that take --batches;
// `math_default` is the help's word on what the command does without --math, add_math_flags), and
// one flag per option of the registered models (--image-size, --seq-len, a program's own models'
// options too), whose values go to options.model_options. Call options.validate() (make_session
// does) before using them: a model option's range is the model's.
void add_model_flags(CLI::App& app, SessionOptions& options, bool with_batch = true,
                     const std::string& math_default = "fp32");

// The training loop's flags (session/options.h, SessionOptions' training-loop group, which holds
// their ranges and checks): --accumulate, --lr-schedule, --warmup-steps, --schedule-steps,
// --lr-step-size, --lr-gamma, --lr-min, --clip-grad-norm, and with `with_eval` --eval-every,
// --eval-batches, --eval-batch, --eval-split.
void add_training_flags(CLI::App& app, SessionOptions& options, bool with_eval = true);
// The evaluation flags alone (--eval-batches, --eval-batch, --eval-split; regen eval).
void add_eval_flags(CLI::App& app, SessionOptions& options);

// --math fp32|tf32 and its synonym --tf32; `default_help` says what the command does without them
// ("fp32", or "tf32 on a CUDA device, fp32 on the CPU").
void add_math_flags(CLI::App& app, std::string& math, bool& tf32, const std::string& default_help);
// --masks on|off (SessionOptions::masks): packed saves; --compress none|bf16|fp16
// (SessionOptions::compress, checked by validate).
void add_pack_flags(CLI::App& app, SessionOptions& options);
// The benchmarks' default math mode on CUDA (what people run on Hopper; training and everything
// else default to fp32), and what their help says of it.
inline constexpr char kBenchMath[] = "tf32";
inline constexpr char kBenchMathHelp[] = "tf32 on a CUDA device, fp32 on the CPU";

// --budget-of reserved|allocated: what a --budget bounds (planner.h BudgetOf).
void add_budget_of_flag(CLI::App& app, std::string& budget_of);
// --layout caching|planned: where a planned step's blocks go (PlanOptions::planned_layout).
CLI::Option* add_layout_flag(CLI::App& app, std::string& layout);
// --op-timing sync|device: how the profiler times ops (ProfileOptions::op_timing).
void add_op_timing_flag(CLI::App& app, std::string& op_timing);

// --offload none|activations|optimizer|all (PlanOptions::offload: what dp and milp may move to
// the host tier) and --transfer (the transfer model that times the copies: profile, FILE.json from
// `regen bench copy`, step:F or gbps:B[,LATENCY_MS]; transfer.h transfer_for).
void add_offload_flags(CLI::App& app, std::string& offload, std::string& transfer);
// The lines a command prints about a plan's offloads ("" when it keeps nothing on the host tier).
std::string describe_offload(const Plan& plan, const Profile& p);

// "a,b,,c" -> {"a", "b", "c"} (empty items dropped).
std::vector<std::string> split_commas(const std::string& s);
// The items of a comma-separated list flag: a regen::Error naming `flag` when the list is empty,
// an item is empty ("a,,b") or an item is listed twice (each would run twice).
std::vector<std::string> list_items(const std::string& flag, const std::string& text);
// The same for a list of positive decimal integers ("2abc" and "2.9" are not batch 2), each at
// most `max`.
std::vector<int64_t> positive_integers(const std::string& flag, const std::string& text,
                                       int64_t max = std::numeric_limits<int64_t>::max());

// Throws regen::Error naming the flag when `path` cannot be written (io.h why_not_writable):
// call before a long run for every output it will write at the end.
void check_output_path(const std::string& flag, const std::string& path);
// Each output writable (check_output_path), and no two of the outputs and inputs the same file
// (flag, path pairs; empty input paths are skipped): a regen::Error naming both flags.
void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& outputs,
                          const std::vector<std::pair<std::string, std::string>>& inputs);

// The files a session's --data reads, as (flag, path) inputs for check_distinct_files.
std::vector<std::pair<std::string, std::string>> data_inputs(const SessionOptions& options);

}  // namespace regen::tool
