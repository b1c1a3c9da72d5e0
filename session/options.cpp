// Session options (options.h).
#include "regen/session/options.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "regen/core/numeric.h"
#include "regen/core/safetensors.h"
#include "regen/dist/data_parallel.h"
#include "regen/dist/world.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/remat/plan/compress.h"

#ifdef REGEN_WITH_CUDA
#include "regen/core/cuda/runtime.h"
#include "regen/kernels/cuda/cuda_kernels.h"
#endif

namespace regen {

// ---------------------------------------------------------------------------------------------
// Options

namespace {

std::string quoted(const std::string& text) {
  return "'" + text + "'";
}

// A bad value of option `key`, shown as `value`, with what it must be.
[[noreturn]] void bad_option(const SessionOptions& o, const std::string& key,
                             const std::string& value, const std::string& problem) {
  REGEN_FAIL(option_error(key, value, problem, o.style));
}

void check_range(const SessionOptions& o, const std::string& key, double v) {
  const std::string problem = SessionOptions::range(key).problem(v);
  if (!problem.empty()) bad_option(o, key, number_text(v), problem);
}

void check_one_of(const SessionOptions& o, const std::string& key, const std::string& v,
                  const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
    std::string list;
    for (size_t i = 0; i < allowed.size(); ++i)
      list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
    bad_option(o, key, quoted(v), "must be " + list);
  }
}

// What math_mode and validate refuse whatever the device.
void check_math(const std::string& math, bool tf32, OptionStyle style) {
  if (!math.empty() && math != "fp32" && math != "tf32")
    REGEN_FAIL(option_error("math", quoted(math), "must be fp32 or tf32", style));
  const std::string tf32_name = style == OptionStyle::keyword ? "tf32=True" : "--tf32";
  REGEN_CHECK(!tf32 || math != "fp32", tf32_name, " (the same as ",
              option_setting("math", style == OptionStyle::keyword ? "'tf32'" : "tf32", style),
              ") conflicts with ",
              option_setting("math", style == OptionStyle::keyword ? "'fp32'" : "fp32", style),
              ": give one of them");
}

// What resolve_precision and validate refuse whatever the device: a precision beside a math mode
// that says otherwise.
void check_precision(const SessionOptions& o) {
  if (o.precision.empty()) return;
  check_one_of(o, "precision", o.precision, {"fp32", "tf32", "bf16", "fp16"});
  if (o.math.empty() && !o.tf32) return;
  const std::string math = !o.math.empty() ? o.math : "tf32";
  if (math == o.precision) return;
  const bool kw = o.style == OptionStyle::keyword;
  const std::string given = !o.math.empty()
                                ? option_setting("math", kw ? "'" + o.math + "'" : o.math, o.style)
                                : (kw ? "tf32=True" : "--tf32");
  const bool mixed = o.precision == "bf16" || o.precision == "fp16";
  REGEN_FAIL(option_setting("precision", kw ? "'" + o.precision + "'" : o.precision, o.style),
             " conflicts with ", given,
             mixed ? ": the math mode is fp32 runs' (a mixed precision computes its GEMMs from "
                     "16-bit copies); drop it"
                   : ": the math mode and the precision say the same thing; give one of them");
}

}  // namespace

OptionRange SessionOptions::range(const std::string& key) {
  if (key == "batch") return OptionRange::integers(1, static_cast<double>(kMaxBatch));
  if (key == "threads") return OptionRange::integers(1, kMaxThreads);
  if (key == "lr" || key == "weight_decay") return OptionRange::numbers(0);
  if (key == "momentum") return OptionRange::numbers(0, 1);
  if (key == "accumulate") return OptionRange::integers(1, 1 << 20);
  if (key == "eval_batch") return OptionRange::integers(0, static_cast<double>(kMaxBatch));
  if (key == "warmup_steps" || key == "schedule_steps" || key == "lr_step_size" ||
      key == "eval_every" || key == "eval_batches") {
    return OptionRange::integers(0);
  }
  if (key == "lr_gamma" || key == "lr_min" || key == "clip_grad_norm") {
    return OptionRange::numbers(0);
  }
  if (key == "eval_split") return OptionRange::numbers(0, 0.9);
  if (key == "bucket_size") return OptionRange::integers(1024, int64_t{1} << 40);
  REGEN_FAIL("SessionOptions::range: no range for option '", key, "'");
}

void SessionOptions::validate() const {
  const ModelInfo& info = model_info(model);  // an unknown model, listing the known ones
  check_range(*this, "batch", static_cast<double>(batch));
  if (threads != 0) check_range(*this, "threads", static_cast<double>(threads));
  check_one_of(*this, "optimizer", optimizer, {"sgd", "adamw"});
  check_range(*this, "lr", lr);
  check_range(*this, "momentum", momentum);
  check_range(*this, "weight_decay", weight_decay);
  check_one_of(*this, "conv", conv, {"native", "cudnn"});
  check_one_of(*this, "compress", compress, {"none", "bf16", "fp16"});
  check_one_of(*this, "cuda_graph", cuda_graph, {"off", "on", "auto"});
  check_math(math, tf32, style);
  check_precision(*this);
  if ((precision == "bf16" || precision == "fp16") && compress != "none") {
    const bool kw = style == OptionStyle::keyword;
    REGEN_FAIL(option_setting("compress", kw ? "'" + compress + "'" : compress, style), " with ",
               option_setting("precision", kw ? "'" + precision + "'" : precision, style),
               ": under a mixed precision the ops that save most (convolutions, GEMMs, attention) "
               "already save 16-bit copies, and compressing the rest is not supported yet; drop ",
               name("compress"));
  }
  // The training loop's options, then how they combine.
  check_range(*this, "accumulate", static_cast<double>(accumulate));
  check_one_of(*this, "lr_schedule", lr_schedule, {"constant", "step", "cosine"});
  for (const char* key : {"warmup_steps", "schedule_steps", "lr_step_size", "eval_every",
                          "eval_batches", "eval_batch"}) {
    const int64_t v = key == std::string("warmup_steps")     ? warmup_steps
                      : key == std::string("schedule_steps") ? schedule_steps
                      : key == std::string("lr_step_size")   ? lr_step_size
                      : key == std::string("eval_every")     ? eval_every
                      : key == std::string("eval_batches")   ? eval_batches
                                                             : eval_batch;
    check_range(*this, key, static_cast<double>(v));
  }
  check_range(*this, "lr_gamma", lr_gamma);
  check_range(*this, "lr_min", lr_min);
  check_range(*this, "clip_grad_norm", clip_grad_norm);
  check_range(*this, "eval_split", eval_split);
  const auto given = [this](const std::string& key, const std::string& value) {
    return option_setting(key, style == OptionStyle::keyword ? quoted(value) : value, style);
  };
  REGEN_CHECK(lr_schedule != "step" || lr_step_size >= 1, given("lr_schedule", "step"), " needs ",
              name("lr_step_size"), " (the steps between decays, at least 1)");
  REGEN_CHECK(lr_schedule != "cosine" || schedule_steps == 0 || schedule_steps > warmup_steps,
              given("lr_schedule", "cosine"), " decays over ",
              option_setting("schedule_steps", std::to_string(schedule_steps), style),
              " steps, which must be more than ",
              option_setting("warmup_steps", std::to_string(warmup_steps), style));
  // Another schedule's settings would be ignored without a word: refused, naming both options.
  const auto other_schedule = [&](const char* key, bool set, const char* schedule) {
    REGEN_CHECK(!set || lr_schedule == schedule, name(key), " applies to ",
                given("lr_schedule", schedule), ", not to ", given("lr_schedule", lr_schedule),
                ": drop it, or pass ", given("lr_schedule", schedule));
  };
  // Cosine decays from lr to lr_min: a floor above the start would make it a rise.
  REGEN_CHECK(lr_schedule != "cosine" || lr_min <= lr, given("lr_schedule", "cosine"),
              " decays from ", option_setting("lr", number_text(lr), style), " to ",
              option_setting("lr_min", number_text(lr_min), style),
              ", which must not be above it: lower ", name("lr_min"), " or raise ", name("lr"));
  other_schedule("lr_step_size", lr_step_size != 0, "step");
  other_schedule("lr_gamma", lr_gamma != 0.1, "step");
  other_schedule("lr_min", lr_min != 0, "cosine");
  other_schedule("schedule_steps", schedule_steps != 0, "cosine");
  check_one_of(*this, "shard", shard, {"none", "optimizer", "gradients", "parameters"});
  // Bytes, named as integers (check_range writes numbers shortly: 1e+02).
  const std::string bucket_problem = range("bucket_size").problem(static_cast<double>(bucket_size));
  if (!bucket_problem.empty()) {
    bad_option(*this, "bucket_size", std::to_string(bucket_size), bucket_problem);
  }
  try {
    if (device != "auto") Device::parse(device);
  } catch (const Error& e) {
    REGEN_FAIL(
        option_setting("device", style == OptionStyle::keyword ? quoted(device) : device, style),
        ": ", e.message());
  }
  // The model's own options: only those it takes, each in its range.
  std::vector<std::string> keys;
  for (const ModelOption& opt : info.input.options) keys.push_back(name(opt.key));
  for (const auto& [key, value] : model_options) {
    const ModelOption* opt = info.input.option(key);
    if (opt == nullptr) {
      REGEN_FAIL(style == OptionStyle::keyword ? key + "=" + number_text(value) : name(key),
                 " does not apply to model '", model, "' (",
                 keys.empty() ? std::string("it takes no options of its own")
                              : "its options: " + join_names(keys),
                 ")");
    }
    const std::string problem = opt->range.problem(value);
    if (!problem.empty()) bad_option(*this, key, number_text(value), problem);
  }
  REGEN_CHECK(!config || config->name == model,
              "SessionOptions: config is a configuration of model '", config ? config->name : "",
              "', not of '", model, "'");
  ModelConfig c = config ? *config : info.config;
  for (const auto& [key, value] : model_options) info.input.option(key)->set(c, value);
  check_data_spec(data, c, style);
  // A held-out fraction is of a text file; other data holds out examples of its own, and the
  // fraction would be ignored.
  REGEN_CHECK(eval_split == 0 || data_split_by_holdout(data, c, style),
              option_setting("eval_split", number_text(eval_split), style),
              " holds out the end of a text file; this data has held-out examples of its own "
              "(drop ",
              name("eval_split"), ")");
  if (info.input.check) info.input.check(c, batch, style);
}

LrSchedule SessionOptions::schedule() const {
  LrSchedule s;
  s.kind = parse_schedule_kind(lr_schedule);
  s.base = lr;
  s.warmup = warmup_steps;
  s.horizon = schedule_steps;
  s.step_size = lr_step_size;
  s.gamma = lr_gamma;
  s.min = lr_min;
  REGEN_CHECK(
      s.kind != LrSchedule::Kind::cosine || schedule_steps > 0,
      option_setting("lr_schedule", style == OptionStyle::keyword ? "'cosine'" : "cosine", style),
      " needs ", name("schedule_steps"), ", the steps it decays over",
      style == OptionStyle::flag ? " (regen train sets it to --steps)" : "");
  const std::string bad = s.problem();
  REGEN_CHECK(bad.empty(), "learning-rate schedule: ", bad);
  return s;
}

double SessionOptions::holdout() const {
  if (eval_split > 0) return eval_split;
  return eval_every > 0 ? kDefaultHoldout : 0.0;
}

int64_t SessionOptions::evaluation_batch() const {
  return eval_batch > 0 ? eval_batch : batch * accumulate;
}

void SessionOptions::check_steps(int64_t steps) const {
  REGEN_CHECK(warmup_steps <= steps,
              option_setting("warmup_steps", std::to_string(warmup_steps), style), " is more than ",
              option_setting("steps", std::to_string(steps), style),
              ": the warm-up would never finish (the learning rate would not reach ", name("lr"),
              "); lower ", name("warmup_steps"), " or raise ", name("steps"));
}

ModelConfig SessionOptions::model_config() const {
  validate();
  const ModelInfo& info = model_info(model);
  ModelConfig c = config ? *config : info.config;
  for (const auto& [key, value] : model_options) info.input.option(key)->set(c, value);
  c.seed = seed;
  return c;
}

std::vector<std::string> SessionOptions::data_files() const {
  return data_input_files(data, model_config(), style);
}

Device resolve_device(const std::string& text, OptionStyle style) {
  const std::string what =
      option_setting("device", style == OptionStyle::keyword ? quoted(text) : text, style);
#ifdef REGEN_WITH_CUDA
  // A GPU whose runtime fails is an error, never taken for a machine without one (runtime.h).
  auto count = [&] {
    const cuda::DeviceProbe& probe = cuda::probe_devices();
    REGEN_CHECK(probe.error.empty(), what, ": ", probe.error);
    return probe.count;
  };
#endif
#ifdef REGEN_WITH_CUDA
  // Under mpirun the ranks on one host take its GPUs in turn (their local rank).
  const int local = dist::world().distributed() ? dist::world().local_rank() : 0;
#endif
  if (text == "auto") {
#ifdef REGEN_WITH_CUDA
    if (count() > 0) return Device::cuda(local % count());
#endif
    return Device::cpu();
  }
#ifdef REGEN_WITH_CUDA
  if (text == "cuda" && local > 0 && count() > 0) return Device::cuda(local % count());
#endif
  Device d;
  try {
    d = Device::parse(text);
  } catch (const Error& e) {
    REGEN_FAIL(what, ": ", e.message());
  }
#ifdef REGEN_WITH_CUDA
  if (d.is_cuda()) {
    const int n = count();
    REGEN_CHECK(
        d.index < n, what, ": ", n, " CUDA device(s) visible",
        n == 0
            ? "; use " + option_setting(
                             "device", style == OptionStyle::keyword ? quoted("cpu") : "cpu", style)
            : std::string());
  }
#else
  REGEN_CHECK(d.is_cpu(), what, ": regen was built without CUDA support");
#endif
  return d;
}

std::string math_mode(const std::string& math, bool tf32, Device device,
                      const std::string& default_math, OptionStyle style) {
  check_math(math, tf32, style);
  const bool asked = tf32 || math == "tf32";
  if (device.is_cpu()) {
    const bool kw = style == OptionStyle::keyword;
    REGEN_CHECK(!asked,
                math == "tf32" ? option_setting("math", kw ? "'tf32'" : "tf32", style)
                               : (kw ? "tf32=True" : "--tf32"),
                " applies to CUDA devices (cuBLAS and cuDNN); on ", device.str(),
                " every kernel computes in FP32: drop it, or pass ",
                option_setting("device", kw ? "'cuda'" : "cuda", style));
    return "fp32";
  }
  if (!math.empty()) return math;
  return tf32 ? "tf32" : default_math;
}

std::string math_mode(const SessionOptions& o, Device device, const std::string& default_math) {
  if (!o.precision.empty()) {
    return resolve_precision(o, device, default_math) == Precision::tf32 ? "tf32" : "fp32";
  }
  return math_mode(o.math, o.tf32, device, default_math, o.style);
}

Precision estimate_precision(const SessionOptions& o, bool exact) {
  const Precision p = resolve_precision(o, Device::cpu());
  const bool kw = o.style == OptionStyle::keyword;
  const auto quoted_setting = [&](const char* key, const std::string& v) {
    return option_setting(key, kw ? "'" + v + "'" : v, o.style);
  };
  REGEN_CHECK(o.conv == "native", quoted_setting("conv", o.conv),
              " applies to CUDA devices; the estimate counts a CPU step, whose convolution is "
              "regen's own");
  REGEN_CHECK(o.compress == "none", quoted_setting("compress", o.compress),
              " narrows what a remat plan retains; the estimate makes no plan and counts the step "
              "without it");
  REGEN_CHECK(!is_mixed(p) || exact, quoted_setting("precision", o.precision),
              ": the closed forms count an fp32 step; pass ", kw ? "compare=True" : "--compare",
              " for the exact terms of a ", precision_name(p), " step from its dry run");
  return p;
}

Precision resolve_precision(const SessionOptions& o, Device device,
                            const std::string& default_math) {
  check_precision(o);
  if (o.precision.empty()) {
    return math_mode(o.math, o.tf32, device, default_math, o.style) == "tf32" ? Precision::tf32
                                                                              : Precision::fp32;
  }
  const Precision p = parse_precision(o.precision);
  const bool kw = o.style == OptionStyle::keyword;
  const std::string setting =
      option_setting("precision", kw ? "'" + o.precision + "'" : o.precision, o.style);
  if (p == Precision::tf32) {
    REGEN_CHECK(device.is_cuda(), setting,
                " applies to CUDA devices (cuBLAS and cuDNN may use TF32 tensor cores); on ",
                device.str(), " pass ",
                option_setting("precision", kw ? "'fp32'" : "fp32", o.style), ", bf16 or fp16");
  }
#ifdef REGEN_WITH_CUDA
  if (is_mixed(p) && device.is_cuda()) {
    // Every op has a 16-bit CUDA path (cuda::kHalfLaunchers, docs/precision.md); what remains is
    // whether the device has the format's arithmetic.
    const cuda::ComputeCapability cc = cuda::compute_capability(device.index);
    check_precision_capability(p, setting, device, cc.major, cc.minor);
  }
#endif
  return p;
}

void check_precision_capability(Precision p, const std::string& setting, Device device, int major,
                                int minor) {
  if (!is_mixed(p)) return;
  const bool bf16 = p == Precision::bf16;
  const int need = bf16 ? 8 : 7;
  REGEN_CHECK(major >= need, setting, ": ", device.str(), " has compute capability ", major, ".",
              minor, ", and ", bf16 ? "bf16" : "fp16", " training needs ", need, ".0 or later (",
              bf16 ? "bf16 arithmetic and tensor cores came with Ampere; fp16 runs from 7.0"
                   : "fp16 tensor cores came with Volta",
              "): pass ", bf16 ? "fp16, " : "", "fp32 or tf32");
}

Budget parse_budget_option(const std::string& text, const std::string& key, OptionStyle style) {
  REGEN_CHECK(!text.empty(), style == OptionStyle::keyword ? key + "=''" : option_name(key, style),
              " is empty (leave it out", style == OptionStyle::keyword ? ", or pass None," : "",
              " to plan without a budget)");
  try {
    return Budget::parse(text);
  } catch (const Error& e) {
    REGEN_FAIL(style == OptionStyle::keyword ? key + "='" + text + "': " : "", e.message());
  }
}

}  // namespace regen
