// The subcommands' shared flags (common.h).
#include "tools/common.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "regen/core/io.h"

namespace regen::tool {

// ---------------------------------------------------------------------------------------------
// Validators

namespace {

enum class IntParse { ok, not_integer, too_large };

// A decimal integer: optional sign, then digits only (no hex, octal, exponent or spaces).
IntParse parse_integer(const std::string& s, bool& negative, uint64_t& magnitude) {
  size_t i = 0;
  negative = false;
  magnitude = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  if (i == s.size()) return IntParse::not_integer;
  bool overflow = false;
  for (; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return IntParse::not_integer;
    const uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (magnitude > (std::numeric_limits<uint64_t>::max() - d) / 10) overflow = true;
    magnitude = magnitude * 10 + d;
  }
  return overflow ? IntParse::too_large : IntParse::ok;
}

// Integers in [lo, hi]; `requirement` completes "must be ...".
CLI::Validator integer_validator(int64_t lo, uint64_t hi, const std::string& requirement,
                                 const std::string& description) {
  return CLI::Validator(
      [lo, hi, requirement](const std::string& s) -> std::string {
        bool negative = false;
        uint64_t mag = 0;
        const IntParse r = parse_integer(s, negative, mag);
        if (r == IntParse::not_integer) {
          return "must be " + requirement + ", got '" + s + "' (not an integer)";
        }
        // CLI11 converts with base 0, which would read "010" as octal 8.
        const size_t first_digit = (s[0] == '+' || s[0] == '-') ? 1 : 0;
        if (s.size() > first_digit + 1 && s[first_digit] == '0') {
          return "must be " + requirement + ", got '" + s + "' (write it without leading zeros)";
        }
        if (negative && mag != 0) {
          // -mag >= lo  <=>  mag <= -lo (for lo < 0)
          const bool fits = lo < 0 && mag <= static_cast<uint64_t>(-(lo + 1)) + 1;
          if (!fits) return "must be " + requirement + ", got " + s;
          return "";
        }
        if (lo > 0 && mag < static_cast<uint64_t>(lo))
          return "must be " + requirement + ", got " + s;
        if (r == IntParse::too_large || mag > hi) {
          return "must be at most " + std::to_string(hi) + ", got " + s;
        }
        return "";
      },
      description);
}

CLI::Validator number_validator(double lo, double hi, const std::string& requirement,
                                const std::string& description) {
  return CLI::Validator(
      [lo, hi, requirement](const std::string& s) -> std::string {
        if (!decimal_number_text(s)) {
          return "must be " + requirement + ", got '" + s + "' (not a number)";
        }
        const double v = std::strtod(s.c_str(), nullptr);
        if (!std::isfinite(v) || v < lo || v > hi) return "must be " + requirement + ", got " + s;
        return "";
      },
      description);
}

}  // namespace

bool decimal_number_text(const std::string& s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  std::string word;
  for (size_t k = i; k < s.size(); ++k) word += static_cast<char>(std::tolower(s[k]));
  if (word == "inf" || word == "infinity" || word == "nan") return true;
  size_t digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exponent = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i, ++exponent;
    if (exponent == 0) return false;
  }
  return i == s.size();
}

CLI::Validator positive_integer(int64_t max) {
  return integer_validator(1, static_cast<uint64_t>(max), "a positive integer", "POSITIVE");
}

CLI::Validator non_negative_integer(uint64_t max) {
  return integer_validator(0, max, "a non-negative integer", "NON-NEGATIVE");
}

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string range = std::to_string(lo) + " to " + std::to_string(hi);
  return integer_validator(lo, hi < 0 ? 0 : static_cast<uint64_t>(hi), "an integer from " + range,
                           range);
}

CLI::Validator non_empty(const std::string& what) {
  return CLI::Validator(
      [what](std::string& text) -> std::string {
        return text.empty() ? "is empty: give " + what : std::string();
      },
      "TEXT");
}

CLI::Validator budget_text() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "is empty (leave it out to plan without a budget)";
        try {
          parse_budget_option(text);
        } catch (const Error& e) {
          return e.message();
        }
        return "";
      },
      "BYTES|PERCENT");
}

CLI::Validator non_negative_number() {
  return number_validator(0.0, std::numeric_limits<double>::max(), "a finite number >= 0",
                          "NON-NEGATIVE");
}

CLI::Validator number_in(double lo, double hi) {
  const std::string range = number_text(lo) + " to " + number_text(hi);
  return number_validator(lo, hi, "a number from " + range, range);
}

namespace {

// A decimal integer or a finite number, as text, without a range: the model options' flags (their
// ranges are the model's; SessionOptions::validate checks them). On success `value` holds it
// (+-inf for an integer too large for 64 bits).
std::string parse_value(const std::string& s, bool integer, double& value) {
  if (integer) {
    bool negative = false;
    uint64_t mag = 0;
    const IntParse r = parse_integer(s, negative, mag);
    if (r == IntParse::not_integer) return "must be an integer, got '" + s + "' (not an integer)";
    const size_t first_digit = (s[0] == '+' || s[0] == '-') ? 1 : 0;
    if (s.size() > first_digit + 1 && s[first_digit] == '0') {
      return "must be an integer, got '" + s + "' (write it without leading zeros)";
    }
    value = r == IntParse::too_large ? HUGE_VAL : static_cast<double>(mag);
    if (negative) value = -value;
    return "";
  }
  if (!decimal_number_text(s)) return "must be a number, got '" + s + "' (not a number)";
  value = std::strtod(s.c_str(), nullptr);
  return "";
}

}  // namespace

CLI::Validator in_range(const OptionRange& range) {
  return CLI::Validator(
      [range](const std::string& s) -> std::string {
        double v = 0;
        const std::string bad = parse_value(s, range.integer, v);
        if (!bad.empty()) {
          // "must be a positive integer, got '2.5' (not an integer)"
          const auto got = bad.find(", got ");
          return "must be " + range.requirement() + bad.substr(got);
        }
        const std::string problem = range.problem(v);
        return problem.empty() ? "" : problem + ", got " + s;
      },
      range.integer ? "INTEGER" : "NUMBER");
}

std::string cli_failure_message(const CLI::App* /*app*/, const CLI::Error& e) {
  std::string msg = e.what();
  if (e.get_name() == "ValidationError") {
    // CLI11 writes "--batch: must be ..."; read it as one sentence.
    for (const char* rest : {": must be ", ": is empty"}) {
      const auto colon = msg.find(rest);
      if (colon != std::string::npos && msg.find(' ') > colon) msg.erase(colon, 1);
    }
  }
  return "regen: error: " + msg + "\nRun with --help for the flags of a command.\n";
}

// ---------------------------------------------------------------------------------------------
// The session's flags

void add_model_flags(CLI::App& app, SessionOptions& o, bool with_batch,
                     const std::string& math_default) {
  app.add_option("--model", o.model, "model: " + join_names(model_preset_names()))
      ->capture_default_str();
  if (with_batch) {
    app.add_option("--batch", o.batch, "batch size (examples per step)")
        ->check(in_range(SessionOptions::range("batch")))
        ->capture_default_str();
  }
  app.add_option("--device", o.device, "auto, cpu, cuda or cuda:N (auto picks cuda when present)")
      ->capture_default_str();
  // One flag per option key of the registered models; the value is checked against the range of
  // the model the run names (SessionOptions::validate), so here only that it is a number.
  for (const ModelOptionUse& u : model_option_uses()) {
    const std::string key = u.option.key;
    app.add_option_function<double>(
           option_name(key, OptionStyle::flag),
           [&o, key](const double& v) { o.model_options[key] = v; },
           u.option.help + " [" + join_names(u.models) + "]")
        ->type_name(u.option.range.integer ? "INT" : "FLOAT")
        ->check(CLI::Validator(
            [integer = u.option.range.integer](const std::string& s) {
              double v = 0;
              return parse_value(s, integer, v);
            },
            u.option.range.integer ? "INTEGER" : "NUMBER"));
  }
  app.add_option("--optimizer", o.optimizer, "sgd or adamw")->capture_default_str();
  app.add_option("--lr", o.lr, "learning rate")
      ->check(in_range(SessionOptions::range("lr")))
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")
      ->check(in_range(SessionOptions::range("momentum")))
      ->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "weight decay")
      ->check(in_range(SessionOptions::range("weight_decay")))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of initialization, data and dropout")
      ->check(non_negative_integer(std::numeric_limits<uint64_t>::max()))
      ->capture_default_str();
  app.add_option("--threads", o.threads,
                 "CPU threads, at most " + std::to_string(SessionOptions::kMaxThreads) +
                     " (default: OpenMP's)")
      ->check(in_range(SessionOptions::range("threads")));
  app.add_option("--data", o.data,
                 "the model's data: synthetic (default), cifar10:DIR (CIFAR-10 binary batches), "
                 "text:FILE (UTF-8 text as byte tokens) for the built-in models, or tokens:FILE "
                 "(an llm.c token shard) for GPT-2");
  app.add_option("--conv", o.conv, "CUDA convolution: native (regen's kernels) or cudnn")
      ->capture_default_str();
  add_math_flags(app, o.math, o.tf32, math_default);
  app.add_option("--precision", o.precision,
                 "what the run trains in: fp32, tf32 (CUDA: TF32 tensor cores, as --math tf32), "
                 "bf16 or fp16 (mixed precision as PyTorch's autocast: convolutions, GEMMs and "
                 "attention from 16-bit copies with fp32 accumulation, fp32 master weights; fp16 "
                 "scales the loss); default: the math mode's");
  // Data parallelism under mpirun (docs/distributed.md); a process alone ignores them.
  app.add_option("--shard", o.shard,
                 "under mpirun, what each rank keeps: none (data parallelism like DDP), optimizer "
                 "(ZeRO-1: 1/N of the optimizer state), gradients (ZeRO-2: and 1/N of the "
                 "gradients) or parameters (ZeRO-3: and 1/N of the parameters, gathered for "
                 "each use)")
      ->check(CLI::IsMember({"none", "optimizer", "gradients", "parameters"}))
      ->capture_default_str();
  const OptionRange bucket = SessionOptions::range("bucket_size");
  app.add_option_function<std::string>(
         "--bucket-size", [&o](const std::string& text) { o.bucket_size = parse_bytes(text); },
         "under mpirun, the gradient buckets' size (bytes: 25MiB, 4MB, 1048576; default 25MiB)")
      ->type_name("BYTES")
      ->check(CLI::Validator(
          [bucket](const std::string& text) -> std::string {
            int64_t bytes = 0;
            try {
              bytes = parse_bytes(text);
            } catch (const Error& e) {
              return e.message();
            }
            const std::string problem = bucket.problem(static_cast<double>(bytes));
            return problem.empty() ? "" : problem + " bytes, got '" + text + "'";
          },
          "BYTES"));
  // Part of the step (its scratch and its pass over the gradients), so a profile records it and
  // a run planned from that profile must match it.
  app.add_option_function<std::string>(
         "--grad-norm", [&o](const std::string& v) { o.grad_norm = v == "on"; },
         "compute the gradients' global L2 norm every step, without clipping: on or off (default "
         "off; `regen train` turns it on for --log, whose grad_norm column it fills; "
         "--clip-grad-norm and fp16 compute it anyway). The step's memory and time include it, "
         "so a profile records it")
      ->type_name("on|off")
      ->check(CLI::IsMember({"on", "off"}));
  add_pack_flags(app, o);
}

void add_eval_flags(CLI::App& app, SessionOptions& o) {
  app.add_option("--eval-batches", o.eval_batches,
                 "evaluate on at most this many batches of the held-out split (0: all of it)")
      ->check(in_range(SessionOptions::range("eval_batches")))
      ->capture_default_str();
  app.add_option("--eval-batch", o.eval_batch,
                 "examples per evaluation batch (0: --batch times --accumulate)")
      ->check(in_range(SessionOptions::range("eval_batch")))
      ->capture_default_str();
  app.add_option("--eval-split", o.eval_split,
                 "the fraction of a text file held out at its end for evaluation, which training "
                 "then skips (0: 0.1 when evaluating, else the file trains whole); CIFAR-10 "
                 "evaluates on test_batch.bin, synthetic data on examples no training step draws")
      ->check(in_range(SessionOptions::range("eval_split")))
      ->capture_default_str();
}

void add_training_flags(CLI::App& app, SessionOptions& o, bool with_eval) {
  app.add_option("--accumulate", o.accumulate,
                 "gradient accumulation: micro-batches of --batch examples per optimizer step (the "
                 "step's gradients are those of the mean over batch x accumulate examples; batch "
                 "norm normalizes each micro-batch on its own)")
      ->check(in_range(SessionOptions::range("accumulate")))
      ->capture_default_str();
  app.add_option("--lr-schedule", o.lr_schedule,
                 "learning-rate schedule after the warm-up: constant, step (x --lr-gamma every "
                 "--lr-step-size steps, torch's StepLR) or cosine (to --lr-min over "
                 "--schedule-steps, torch's CosineAnnealingLR)")
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps,
                 "linear warm-up: step t < W uses lr * (t + 1) / W, then the schedule starts")
      ->check(in_range(SessionOptions::range("warmup_steps")))
      ->capture_default_str();
  app.add_option("--schedule-steps", o.schedule_steps,
                 "the steps the cosine schedule spans, warm-up included (0: --steps); give the "
                 "full run's when a run stops early to be resumed")
      ->check(in_range(SessionOptions::range("schedule_steps")))
      ->capture_default_str();
  app.add_option("--lr-step-size", o.lr_step_size, "step schedule: steps between decays")
      ->check(in_range(SessionOptions::range("lr_step_size")))
      ->capture_default_str();
  app.add_option("--lr-gamma", o.lr_gamma, "step schedule: the factor of each decay")
      ->check(in_range(SessionOptions::range("lr_gamma")))
      ->capture_default_str();
  app.add_option("--lr-min", o.lr_min, "cosine schedule: the final learning rate")
      ->check(in_range(SessionOptions::range("lr_min")))
      ->capture_default_str();
  app.add_option("--clip-grad-norm", o.clip_grad_norm,
                 "clip the global L2 norm of the gradients to this before each update (0: off; "
                 "torch.nn.utils.clip_grad_norm_)")
      ->check(in_range(SessionOptions::range("clip_grad_norm")))
      ->capture_default_str();
  if (!with_eval) return;
  app.add_option("--eval-every", o.eval_every,
                 "evaluate on the held-out split every N optimizer steps and after the last one "
                 "(0: never): top-1 accuracy and loss for image classifiers, loss and perplexity "
                 "for language models")
      ->check(in_range(SessionOptions::range("eval_every")))
      ->capture_default_str();
  add_eval_flags(app, o);
}

void add_pack_flags(CLI::App& app, SessionOptions& o) {
  app.add_option_function<std::string>(
         "--masks", [&o](const std::string& v) { o.masks = v == "on"; },
         "packed saves: relu keeps a 1-bit mask where nothing else saves its output, max_pool2d "
         "its argmax as window positions in a few bits; training is bitwise the same (default: "
         "on)")
      ->type_name("on|off")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--compress", o.compress,
                 "lossy: hold the activations a plan retains as bf16 or fp16 between their last "
                 "forward use and backward (none, bf16 or fp16; training is then no longer bitwise "
                 "that of none; with no --policy, the run profiles and plans with none)")
      ->capture_default_str();
}

void add_math_flags(CLI::App& app, std::string& math, bool& tf32, const std::string& default_help) {
  app.add_option("--math", math,
                 "CUDA math mode: fp32 (strict FP32 everywhere) or tf32 (cuBLAS GEMMs and cuDNN "
                 "convolutions may use TF32 tensor cores; regen's own convolution and attention "
                 "kernels stay FP32); default: " +
                     default_help);
  app.add_flag("--tf32", tf32, "the same as --math tf32");
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<std::string> list_items(const std::string& flag, const std::string& text) {
  REGEN_CHECK(!text.empty(), flag, " is empty: give one or more comma-separated values");
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    REGEN_CHECK(!item.empty(), flag, " '", text, "' has an empty item");
    REGEN_CHECK(std::find(items.begin(), items.end(), item) == items.end(), flag, " '", text,
                "' lists '", item, "' twice");
    items.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return items;
}

std::vector<int64_t> positive_integers(const std::string& flag, const std::string& text,
                                       int64_t max) {
  std::vector<int64_t> values;
  const CLI::Validator positive = positive_integer(max);
  for (const std::string& item : list_items(flag, text)) {
    std::string copy = item;
    const std::string bad = positive(copy);
    REGEN_CHECK(bad.empty(), flag, " '", text, "': each item ", bad);
    const int64_t v = std::stoll(item);
    REGEN_CHECK(std::find(values.begin(), values.end(), v) == values.end(), flag, " '", text,
                "' lists ", v, " twice");
    values.push_back(v);
  }
  return values;
}

// ---------------------------------------------------------------------------------------------
// Outputs and losses

void check_output_path(const std::string& flag, const std::string& path) {
  const std::string why = why_not_writable(path);
  REGEN_CHECK(why.empty(), flag, " ", path, ": cannot write there: ", why);
}

void check_distinct_files(const std::vector<std::pair<std::string, std::string>>& outputs,
                          const std::vector<std::pair<std::string, std::string>>& inputs) {
  std::vector<NamedFile> outs, ins;
  for (const auto& [flag, path] : outputs) {
    check_output_path(flag, path);
    outs.push_back({flag + " " + path, path});
  }
  for (const auto& [flag, path] : inputs) ins.push_back({flag, path});
  regen::check_distinct_files(outs, ins);  // core/io.h
}

std::vector<std::pair<std::string, std::string>> data_inputs(const SessionOptions& options) {
  std::vector<std::pair<std::string, std::string>> inputs;
  for (const std::string& f : options.data_files()) inputs.emplace_back("--data", f);
  return inputs;
}

void add_budget_of_flag(CLI::App& app, std::string& budget_of) {
  app.add_option("--budget-of", budget_of,
                 "what --budget bounds: reserved (what the device sees: the steps run with the "
                 "allocator's hard limit at the budget, and a plan fits when it runs under it) or "
                 "allocated (the bytes tensors occupy, as other planners count them)")
      ->check(CLI::IsMember({"reserved", "allocated"}))
      ->capture_default_str();
}

CLI::Option* add_layout_flag(CLI::App& app, std::string& layout) {
  return app
      .add_option("--layout", layout,
                  "where the planned step's blocks go: caching (the caching allocator places them "
                  "as they come) or planned (every block at a place planned from the schedule, in "
                  "the persistent segments' free blocks and one arena mapped before the step: "
                  "reserved bytes close to allocated)")
      ->check(CLI::IsMember({"caching", "planned"}))
      ->capture_default_str();
}

void add_op_timing_flag(CLI::App& app, std::string& op_timing) {
  app.add_option("--op-timing", op_timing,
                 "how ops are timed: sync (the device is waited for at every op boundary: each "
                 "op's own time, and on CUDA a slower step than training's) or device (points "
                 "on the device's clock, CUDA events, and nothing waits: the step runs as in "
                 "training); the same on the CPU")
      ->check(CLI::IsMember({"sync", "device"}))
      ->capture_default_str();
}

void add_offload_flags(CLI::App& app, std::string& offload, std::string& transfer) {
  app.add_option("--offload", offload,
                 "what dp and milp may move to the device's host tier: none, activations (saved "
                 "activations, copied out after their producer and back before backward needs "
                 "them), optimizer (the optimizer state between steps) or all")
      ->check(CLI::IsMember(offload_mode_names()))
      ->capture_default_str();
  app.add_option("--transfer", transfer,
                 "the transfer model that times copies to and from the host tier: profile (the "
                 "one the profile measured), FILE.json (regen bench copy --json), step:F (copying "
                 "every saved activation once, one way, takes F of the profiled step: 0.4 is an "
                 "H100 ResNet-152 step against PCIe 5) or gbps:B[,LATENCY_MS]")
      ->check(non_empty("a transfer model"))
      ->capture_default_str();
}

std::string describe_offload(const Plan& plan, const Profile& p) {
  if (!plan.uses_host()) return "";
  char buf[512];
  std::string out;
  if (plan.offloaded() > 0) {
    std::snprintf(buf, sizeof buf, "  offload %lld saved tensors (%s) to the host tier\n",
                  static_cast<long long>(plan.offloaded()),
                  format_bytes(plan.offloaded_bytes(p)).c_str());
    out += buf;
  }
  if (plan.optimizer_state == StatePlace::host) {
    out +=
        "  the optimizer state lives on the host tier, streamed through the device by the "
        "update\n";
  }
  std::snprintf(buf, sizeof buf,
                "  predicted host tier peak allocated %s, reserved %s; %s copied out, %s back; "
                "the step waits %.1f ms for copies (transfer model: %s)\n",
                format_bytes(plan.predicted.host_peak_allocated).c_str(),
                format_bytes(plan.predicted.host_peak_reserved).c_str(),
                format_bytes(plan.predicted.bytes_to_host).c_str(),
                format_bytes(plan.predicted.bytes_to_device).c_str(), plan.predicted.stall_ms,
                plan.transfer.str().c_str());
  out += buf;
  return out;
}

}  // namespace regen::tool
