// Training sessions (session.h).
#include "regen/remat/session.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "regen/core/numeric.h"
#include "regen/core/safetensors.h"
#include "regen/remat/compress.h"
#include "regen/remat/pipeline.h"

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

}  // namespace

OptionRange SessionOptions::range(const std::string& key) {
  if (key == "batch") return OptionRange::integers(1);
  if (key == "threads") return OptionRange::integers(1, kMaxThreads);
  if (key == "lr" || key == "weight_decay") return OptionRange::numbers(0);
  if (key == "momentum") return OptionRange::numbers(0, 1);
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
  check_math(math, tf32, style);
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
  if (info.input.check) info.input.check(c, batch, style);
}

ModelConfig SessionOptions::model_config() const {
  validate();
  const ModelInfo& info = model_info(model);
  ModelConfig c = config ? *config : info.config;
  for (const auto& [key, value] : model_options) info.input.option(key)->set(c, value);
  c.seed = seed;
  return c;
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
  if (text == "auto") {
#ifdef REGEN_WITH_CUDA
    if (count() > 0) return Device::cuda(0);
#endif
    return Device::cpu();
  }
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
  return math_mode(o.math, o.tf32, device, default_math, o.style);
}

// ---------------------------------------------------------------------------------------------
// Memory available, and the dry run's verdict

bool cuda_memory_info(Device device, uint64_t& free_bytes, uint64_t& total_bytes) {
  free_bytes = total_bytes = 0;
#ifdef REGEN_WITH_CUDA
  if (device.is_cuda()) {
    cuda::DeviceGuard guard(device.index);
    cuda::mem_get_info(free_bytes, total_bytes);
    return true;
  }
#else
  (void)device;
#endif
  return false;
}

namespace {

// Bytes of memory on the device: physical RAM for the CPU, the GPU's total for CUDA.
double device_memory_bytes(Device device) {
  uint64_t free_bytes = 0, total_bytes = 0;
  if (cuda_memory_info(device, free_bytes, total_bytes)) return static_cast<double>(total_bytes);
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<double>(pages) * static_cast<double>(page);
}

// The model's options with `pick`, named as `style` says: "--image-size", "--seq-len".
std::vector<std::string> options_that(const SessionOptions& o, bool ModelOption::*pick) {
  std::vector<std::string> out;
  for (const ModelOption& opt : model_info(o.model).input.options) {
    if (opt.*pick) out.push_back(o.name(opt.key));
  }
  return out;
}

// "a or b", "a, b or c"
std::string either(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

// What makes a step large: the batch, with the options that size the step at their values
// ("--batch 8 at --image-size 224").
std::string size_options(const Session& s) {
  const SessionOptions& o = s.options;
  std::string out = option_setting("batch", std::to_string(o.batch), o.style);
  bool first = true;
  for (const ModelOption& opt : model_info(o.model).input.options) {
    if (!opt.sizes_step) continue;
    out += (first ? " at " : ", ") +
           option_setting(opt.key, option_value_text(opt, opt.get(s.config)), o.style);
    first = false;
  }
  return out;
}

// "use a smaller --batch or --image-size": the options a step's activations grow with.
std::string smaller(const SessionOptions& o) {
  std::vector<std::string> names = {o.name("batch")};
  for (const std::string& n : options_that(o, &ModelOption::sizes_step)) names.push_back(n);
  return "use a smaller " + either(names);
}

}  // namespace

int64_t available_memory(Device device) {
  uint64_t free_bytes = 0, total_bytes = 0;
  // What the process's own allocator already reserves (and keeps parked) is its to reuse. In
  // direct mode its segments are bookkeeping only: it holds exactly its live blocks' bytes.
  CachingAllocator& a = allocator_for(device);
  const int64_t own =
      a.direct() ? a.stats().requested.current
                 : a.stats().reserved.current + static_cast<int64_t>(a.arena().retained_bytes());
  if (cuda_memory_info(device, free_bytes, total_bytes))
    return static_cast<int64_t>(free_bytes) + own;
  if (FILE* f = std::fopen("/proc/meminfo", "r")) {
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
    }
    std::fclose(f);
    if (kib >= 0) return static_cast<int64_t>(kib) * 1024 + own;
  }
  const double total = device_memory_bytes(device);
  return total > 0 ? static_cast<int64_t>(total) : 0;
}

void check_preflight(const Session& s, Preflight preflight) {
  if (preflight == Preflight::none) return;
  const ModelConfig& c = s.config;
  const SessionOptions& o = s.options;
  const int64_t have = available_memory(s.device);
  if (have <= 0) return;
  // The model's own state first: no batch size helps there.
  const int64_t state = s.preflight.persistent;
  if (state > have) {
    std::vector<std::string> sizes;
    for (const ModelOption& opt : model_info(o.model).input.options) {
      if (opt.sizes_parameters) {
        sizes.push_back(o.name(opt.key) + " (now " + option_value_text(opt, opt.get(c)) + ")");
      }
    }
    REGEN_FAIL(c.name, " does not fit in memory: its parameters, gradients and ",
               "optimizer state take ", format_bytes(state), " (exact, from a dry run), but ",
               s.device.str(), " has ", format_bytes(have), " available; use a smaller preset",
               sizes.empty() ? std::string() : " or a smaller " + either(sizes));
  }
  if (preflight == Preflight::model) return;
  // Every tensor of the step, as the real step allocates them. On the CPU the kernels' scratch
  // space (GEMM packing, im2col tiles) is in it too, so this is the real step's peak; on CUDA the
  // CUDA kernels' scratch comes on top, so it is a lower bound the real peak passes.
  const int64_t need = s.preflight.memory.allocated.peak;
  const bool exact = s.device.is_cpu();
  REGEN_CHECK(need <= have, size_options(s), " is too large for memory: one ", c.name,
              " training step without remat needs ", exact ? "" : "at least ", format_bytes(need),
              " (", format_bytes(state), " of it the model's state; ",
              exact ? "every tensor and the kernels' scratch space of the first step, exact, from "
                      "a dry run"
                    : "every tensor of the first step, from a dry run, before the CUDA kernels' "
                      "scratch space",
              "), but ", s.device.str(), " has ", format_bytes(have), " available; ", smaller(o));
}

// ---------------------------------------------------------------------------------------------
// Sessions

namespace {

// Applies the threads and the CUDA settings (conv, and math as math_mode gives it for `device`).
void apply_runtime_options(const SessionOptions& o, Device device) {
  if (o.threads > 0) omp_set_num_threads(static_cast<int>(o.threads));
  const bool tf32 = math_mode(o, device) == "tf32";  // refuses tf32 on the CPU, naming it
#ifdef REGEN_WITH_CUDA
  cuda::set_conv_algo(o.conv == "cudnn" ? cuda::ConvAlgo::cudnn : cuda::ConvAlgo::native);
  cuda::set_tf32(tf32);
#else
  (void)tf32;  // math_mode refused it: without CUDA every device is the CPU
#endif
}

std::string spec_text(const TensorSpec& t) {
  std::ostringstream os;
  os << dtype_name(t.dtype) << " " << sh(t.shape);
  return os.str();
}

// The model's data source, with every batch checked against the model's input: a dry run
// allocates what the input describes, so a source that makes something else would make the
// dry run (and every prediction from the same shapes) wrong.
class CheckedSource final : public DataSource {
 public:
  CheckedSource(std::unique_ptr<DataSource> inner, const ModelConfig& config)
      : inner_(std::move(inner)), config_(config), input_(model_info(config.name).input) {}
  Batch next(int64_t n, Device device) override {
    Batch b = inner_->next(n, device);
    const BatchSpec want = input_.batch(config_, n);
    auto same = [](const Tensor& t, const TensorSpec& s) {
      return t.defined() && t.shape() == s.shape && t.dtype() == s.dtype;
    };
    REGEN_CHECK(same(b.input, want.input) && same(b.target, want.target), "data ",
                inner_->describe(), " made a batch of ", b.input.defined() ? b.input.str() : "?",
                " and ", b.target.defined() ? b.target.str() : "?", ", but model '", config_.name,
                "' describes its input as ", spec_text(want.input), " and ", spec_text(want.target),
                " (ModelInput::batch)");
    return b;
  }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::unique_ptr<DataSource> inner_;
  ModelConfig config_;
  const ModelInput& input_;
};

}  // namespace

std::unique_ptr<Session> make_session(const SessionOptions& options, Preflight preflight) {
  auto s = std::make_unique<Session>();
  s->options = options;
  s->config = options.model_config();  // validates every option first
  s->device = resolve_device(options.device, options.style);
  apply_runtime_options(options, s->device);
  const ModelConfig& c = s->config;
  REGEN_CHECK(options.conv == "native" || s->device.is_cuda(),
              option_setting("conv", options.conv, options.style), " applies to CUDA devices; on ",
              s->device.str(), " convolution is regen's own");
#ifndef REGEN_WITH_CUDA
  REGEN_CHECK(options.conv == "native", option_setting("conv", options.conv, options.style),
              " needs a CUDA build");
#endif
  // The data before the model: a wrong file fails before a large model is built.
  s->data = std::make_unique<CheckedSource>(
      make_data_source(options.data, c, options.seed, options.style), c);
  auto make_optimizer = [&options](Model& model) -> std::unique_ptr<Optimizer> {
    if (options.optimizer == "sgd") {
      SGDOptions o;
      o.lr = options.lr;
      o.momentum = options.momentum;
      o.weight_decay = options.weight_decay;
      return std::make_unique<SGD>(model.parameters(), o);
    }
    AdamWOptions o;
    o.lr = options.lr;
    o.weight_decay = options.weight_decay;
    return std::make_unique<AdamW>(model.parameters(), o);
  };
  // The first step, run dry: its memory (exact on the CPU), before any of it is used; first, with
  // masks on, which ops save packed forms (a dry forward pass of its own).
  try {
    if (options.masks) {
      s->packed_saves =
          std::make_shared<const PackedSaves>(learn_packed_saves(c, options.batch, s->device));
    }
    s->preflight = dry_run_step(c, options.batch, s->device, make_optimizer, s->packed_saves.get());
  } catch (const Error& e) {
    // Options that pass their own checks and still stop a dry run mostly do so by size: a request
    // beyond any device's (the Null arena maps anything else), an index type's limit, an
    // overflow. Say which options set the sizes; an error of another kind (a model's own code)
    // is passed on as it is, with them.
    if (dynamic_cast<const OutOfMemory*>(&e) != nullptr) {
      REGEN_FAIL(size_options(*s), " is too large for any memory: a dry run of one ", c.name,
                 " step stops at ", e.message(), "; ", smaller(options));
    }
    REGEN_FAIL(size_options(*s), ": a dry run of one ", c.name, " step fails: ", e.message(),
               " (if a size is the cause: ", smaller(options), ")");
  }
  check_preflight(*s, preflight);
  manual_seed(options.seed);
  s->model = make_model(c, s->device);
  s->optimizer = make_optimizer(*s->model);
  s->trainer =
      std::make_unique<Trainer>(*s->model, *s->optimizer, *s->data, options.batch, s->device);
  s->trainer->set_packed_saves(s->packed_saves);
  s->trainer->set_compression(parse_compression(options.compress));
  return s;
}

// ---------------------------------------------------------------------------------------------
// What profiles record

std::map<std::string, std::string> run_flags(const SessionOptions& o) {
  const ModelConfig c = o.model_config();
  const Device device = resolve_device(o.device, o.style);
  std::map<std::string, std::string> r;
  r["--optimizer"] = o.optimizer;
  if (o.optimizer == "sgd") {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", o.momentum);
    r["--momentum"] = buf;
  }
  r["--threads"] = std::to_string(o.threads > 0 ? o.threads : omp_get_max_threads());
  r["--data"] = o.data.empty() ? "synthetic" : o.data.substr(0, o.data.find(':'));
  for (const ModelOption& opt : model_info(o.model).input.options) {
    r[option_name(opt.key, OptionStyle::flag)] = option_value_text(opt, opt.get(c));
  }
  r["--math"] = math_mode(o, device);  // fp32 on the CPU
  if (device.is_cuda()) r["--conv"] = o.conv;
  r["--masks"] = o.masks ? "on" : "off";
  r["--compress"] = o.compress;
  return r;
}

std::string profile_math(const Profile& p) {
  const auto math = p.run.find("--math");
  if (math != p.run.end()) return math->second;
  const auto tf32 = p.run.find("--tf32");
  return tf32 != p.run.end() && tf32->second == "on" ? "tf32" : "fp32";
}

void check_profile_run(const Profile& p, const SessionOptions& o, const std::string& what) {
  const std::map<std::string, std::string> now = run_flags(o);
  // The optimizer first: other flags (its momentum) follow from it.
  std::vector<std::pair<std::string, std::string>> recorded(p.run.begin(), p.run.end());
  std::stable_partition(recorded.begin(), recorded.end(),
                        [](const auto& kv) { return kv.first == "--optimizer"; });
  // Profiles written before packed saves were made without them.
  if (p.run.count("--masks") == 0 && !p.run.empty()) recorded.emplace_back("--masks", "off");
  if (p.run.count("--compress") == 0 && !p.run.empty()) {
    recorded.emplace_back("--compress", compression_name(p.compress));
  }
  for (auto [flag, then] : recorded) {
    if (flag == "--tf32") {  // written before --math
      flag = "--math";
      then = profile_math(p);
    }
    const auto it = now.find(flag);
    const std::string here = it == now.end() ? "(none)" : it->second;
    if (here == then) continue;
    // The flag as `o.style` names it: "--seq-len" -> "seq_len".
    std::string key = flag.substr(2);
    std::replace(key.begin(), key.end(), '-', '_');
    const std::string was = option_setting(key, then, o.style);
    REGEN_FAIL(what, " was made with ", was,
               o.style == OptionStyle::keyword ? ", but this model has " : ", but this run has ",
               option_setting(key, here, o.style), ": its memory and times are another step's (",
               "pass ", was, ", or profile again)");
  }
}

// ---------------------------------------------------------------------------------------------
// Losses and checkpoints

namespace {
// The flat index of the first value of `t` that is not finite, or -1.
int64_t first_bad(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return -1;
  auto scan = [](const auto* d, int64_t n) -> int64_t {
    int64_t first = n;
#pragma omp parallel for reduction(min : first) if (n > (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(d[i]) && i < first) first = i;
    }
    return first < n ? first : -1;
  };
  if (t.device().is_cpu()) {
    if (t.dtype() == DType::f32) return scan(t.data<float>(), t.numel());
    if (t.dtype() == DType::f64) return scan(t.data<double>(), t.numel());
    return -1;
  }
  if (t.dtype() != DType::f32) return -1;
  const std::vector<float> v = t.to_vector<float>();
  return scan(v.data(), static_cast<int64_t>(v.size()));
}
double value_at(const Tensor& t, int64_t i) {
  if (t.device().is_cpu())
    return t.dtype() == DType::f64 ? t.data<double>()[i] : t.data<float>()[i];
  return t.to_vector<float>()[static_cast<size_t>(i)];
}
}  // namespace

std::string first_non_finite(const Model& model) {
  for (const auto& [name, p] : model.named_parameters()) {
    for (const bool grad : {false, true}) {
      const Tensor t = grad ? p.grad() : p;
      const int64_t i = first_bad(t);
      if (i >= 0) {
        std::ostringstream os;
        os << (grad ? "gradient of '" : "parameter '") << name << "' holds " << value_at(t, i)
           << " at flat index " << i;
        return os.str();
      }
    }
  }
  return "";
}

void save_checkpoint(const Session& s, const std::string& path, int64_t steps) {
  const ModelConfig& c = s.config;
  std::map<std::string, std::string> meta = {
      {"format", "regen-checkpoint-1"}, {"model", c.name}, {"steps", std::to_string(steps)}};
  // The options that shape parameters (load_checkpoint compares them) and those recorded for
  // information (how the run computed its loss: the parameters are the same either way).
  for (const ModelOption& opt : model_info(c.name).input.options) {
    if (opt.sizes_parameters || opt.recorded) meta[opt.key] = option_value_text(opt, opt.get(c));
  }
  save_safetensors(path, s.model->state_dict(), meta);
}

size_t load_checkpoint(Session& s, const std::string& path) {
  const SafetensorsFile file = load_safetensors(path);
  const ModelConfig& c = s.config;
  const OptionStyle style = s.options.style;
  const auto& meta = file.metadata;
  const auto model = meta.find("model");
  if (model != meta.end()) {
    REGEN_CHECK(model->second == c.name, "checkpoint ", path, " was saved from model ",
                model->second, ", not ", c.name, " (pass ",
                style == OptionStyle::keyword ? "regen.Model('" + model->second + "')"
                                              : "--model " + model->second,
                ")");
    for (const ModelOption& opt : model_info(c.name).input.options) {
      if (!opt.sizes_parameters) continue;
      const auto it = meta.find(opt.key);
      const std::string value = option_value_text(opt, opt.get(c));
      REGEN_CHECK(it == meta.end() || it->second == value, "checkpoint ", path, " was saved from ",
                  c.name, " with ", option_setting(opt.key, it->second, style),
                  ", but this run's model has ", value, " (pass ",
                  option_setting(opt.key, it->second, style), ")");
    }
  }
  // Weights that are not finite would train into NaN silently: refused with the tensor and index.
  for (const auto& [name, t] : file.tensors) {
    const int64_t i = first_bad(t);  // f32 and f64 tensors, read in place
    REGEN_CHECK(i < 0, "checkpoint ", path, ": tensor '", name, "' holds ", value_at(t, i),
                " at flat index ", i, " (weights must be finite)");
  }
  try {
    s.model->load_state_dict(file.tensors);
  } catch (const Error& e) {
    REGEN_FAIL("checkpoint ", path, " does not fit model ", c.name,
               model == meta.end() ? " (it names no model)" : "", ": ", e.message());
  }
  return file.tensors.size();
}

// ---------------------------------------------------------------------------------------------
// Measured runs and budgets

MeasuredRun measure_training(const SessionOptions& o, int steps, const Profile* profile,
                             const Plan* plan, int64_t limit) {
  REGEN_CHECK(plan == nullptr || profile != nullptr, "measure_training: a plan needs its profile");
  allocator_for(resolve_device(o.device, o.style)).empty_cache();
  auto s = make_session(o);
  RematPipeline pipe(*s->trainer);
  if (plan) {
    pipe.use_profile(*profile);
    pipe.use_plan(*plan);
    pipe.set_limit(limit);
  }
  std::vector<double> ms;
  MeasuredRun r;
  for (const StepResult& st : pipe.train(steps)) {
    ms.push_back(st.ms);
    r.peak = std::max(r.peak, st.memory.allocated.peak);
    r.reserved = std::max(r.reserved, st.memory.reserved.peak);
    if (st.host_predicted) {
      r.host_peak = std::max(r.host_peak, st.host_memory.allocated.peak);
      r.host_reserved = std::max(r.host_reserved, st.host_memory.reserved.peak);
    }
  }
  if (const RematExecutor* exec = pipe.executor()) {
    r.regen_ms = exec->regen_ms();
    r.replays = exec->replays();
    r.stall_ms = exec->offload().stall_ms;
  }
  r.steps_predicted = pipe.predicted_steps();
  r.steps_exact = pipe.exact_steps();
  // The first step pays first-touch costs; the median of the rest is the step time.
  if (ms.size() > 1) ms.erase(ms.begin());
  r.ms = median(ms);
  return r;
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
