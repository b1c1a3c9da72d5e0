// Checkpoints and training states (checkpoint.h).
#include "regen/session/checkpoint.h"

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
  // Under mpirun rank 0 writes (every rank holds the same parameters); the others wait until the
  // file is there.
  dist::World& world = dist::world();
  if (world.rank() != 0) {
    world.barrier();
    return;
  }
  const ModelConfig& c = s.config;
  std::map<std::string, std::string> meta = {
      {"format", "regen-checkpoint-1"}, {"model", c.name}, {"steps", std::to_string(steps)}};
  // The options that shape parameters (load_checkpoint compares them) and those recorded for
  // information (how the run computed its loss: the parameters are the same either way).
  for (const ModelOption& opt : model_info(c.name).input.options) {
    if (opt.sizes_parameters || opt.recorded) meta[opt.key] = option_value_text(opt, opt.get(c));
  }
  save_safetensors(path, s.model->state_dict(), meta);
  world.barrier();
}

namespace {
constexpr const char* kStateFormat = "regen-training-state-1";
constexpr const char* kOptimizerPrefix = "optimizer/";  // never in a torch.nn state dict name

// The weights of a checkpoint or training state, loaded into the session's model.
size_t load_weights(Session& s, const SafetensorsFile& all, const std::string& path) {
  SafetensorsFile file;
  file.metadata = all.metadata;
  for (const auto& kv : all.tensors) {
    if (kv.first.rfind(kOptimizerPrefix, 0) != 0) file.tensors.push_back(kv);
  }
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
}  // namespace

size_t load_checkpoint(Session& s, const std::string& path) {
  // The step's persistent tensors first, where a run that loads nothing places them: the file's
  // tensors, read next and freed once copied, then leave the allocator's live blocks as they
  // would be (a plan from a profile checks them at every step's start).
  s.trainer->prepare();
  return load_weights(s, load_safetensors(path), path);
}

std::map<std::string, std::string> trajectory_options(const SessionOptions& o) {
  std::map<std::string, std::string> r;
  r["batch"] = std::to_string(o.batch);
  r["accumulate"] = std::to_string(o.accumulate);
  r["optimizer"] = o.optimizer;
  r["lr"] = number_text(o.lr);
  if (o.optimizer == "sgd") r["momentum"] = number_text(o.momentum);
  r["weight_decay"] = number_text(o.weight_decay);
  r["seed"] = std::to_string(o.seed);
  r["data"] = o.data.empty() ? "synthetic" : o.data;
  r["lr_schedule"] = o.lr_schedule;
  r["warmup_steps"] = std::to_string(o.warmup_steps);
  if (o.lr_schedule == "cosine") {
    r["schedule_steps"] = std::to_string(o.schedule_steps);
    r["lr_min"] = number_text(o.lr_min);
  }
  if (o.lr_schedule == "step") {
    r["lr_step_size"] = std::to_string(o.lr_step_size);
    r["lr_gamma"] = number_text(o.lr_gamma);
  }
  r["clip_grad_norm"] = number_text(o.clip_grad_norm);
  r["precision"] = precision_name(resolve_precision(o, resolve_device(o.device, o.style)));
  const ModelConfig c = o.model_config();
  // What a text file's training part is; other data hold out examples of their own, and their
  // training examples do not depend on it.
  if (data_split_by_holdout(o.data, c, o.style)) r["eval_split"] = number_text(o.holdout());
  for (const ModelOption& opt : model_info(o.model).input.options) {
    r[opt.key] = option_value_text(opt, opt.get(c));
  }
  return r;
}

std::map<std::string, std::string> plan_identity(const Plan& plan) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the decisions
  int64_t recomputed = 0;
  for (const Decision d : plan.decisions) {
    h = (h ^ static_cast<uint64_t>(d)) * 1099511628211ull;
    recomputed += d == Decision::recompute ? 1 : 0;
  }
  char hash[20];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(h));
  return {{"plan", plan.policy + ", budget " + plan.budget_text + " of " +
                       budget_of_name(plan.budget_of) + " bytes, " + std::to_string(recomputed) +
                       " of " + std::to_string(plan.decisions.size()) + " recomputed, decisions " +
                       hash}};
}

void save_training_state(const Session& s, const std::string& path,
                         const std::map<std::string, std::string>& extra) {
  // Each rank's data position and (under ZeRO) optimizer shard would need a file of its own.
  REGEN_CHECK(!dist::world().distributed(),
              "saving the training state under mpirun is not supported yet (each rank has its own "
              "data position and, under ZeRO, its own optimizer shard); save weights with "
              "--save, or train in one process");
  const ModelConfig& c = s.config;
  const Trainer& t = *s.trainer;
  std::map<std::string, std::string> meta = extra;
  meta["format"] = kStateFormat;
  meta["model"] = c.name;
  meta["steps"] = std::to_string(t.optimizer_steps());
  meta["optimizer_steps"] = std::to_string(t.optimizer_steps());
  meta["rng_seed"] = std::to_string(rng_seed());
  meta["rng_stream"] = std::to_string(rng_stream_position());
  meta["data_position"] = s.data->position();
  meta["device"] = s.device.str();
  meta["threads"] =
      std::to_string(s.options.threads > 0 ? s.options.threads : omp_get_max_threads());
  for (const ModelOption& opt : model_info(c.name).input.options) {
    if (opt.sizes_parameters || opt.recorded) meta[opt.key] = option_value_text(opt, opt.get(c));
  }
  for (const auto& [key, value] : trajectory_options(s.options)) meta["train." + key] = value;
  if (t.precision() == Precision::fp16) {  // the loss scale goes on where it stopped
    meta["loss_scale"] = number_text(t.loss_scale().scale);
    meta["loss_scale_good_steps"] = std::to_string(t.loss_scale().good_steps);
    meta["loss_scale_skipped"] = std::to_string(t.loss_scale().skipped);
  }
  NamedTensors tensors = s.model->state_dict();
  for (const auto& [name, st] : s.optimizer->named_state())
    tensors.emplace_back(kOptimizerPrefix + name, st);
  const std::vector<int64_t> steps = s.optimizer->step_counts();
  tensors.emplace_back(std::string(kOptimizerPrefix) + "steps",
                       from_vector<int64_t>(steps, {static_cast<int64_t>(steps.size())}));
  save_safetensors(path, tensors, meta);
}

std::map<std::string, std::string> resume_training_state(Session& s, const std::string& path) {
  REGEN_CHECK(!dist::world().distributed(),
              "resuming a training state under mpirun is not supported yet (a state is written by "
              "one process); resume in one process");
  // Gradients and optimizer state in their places first, as a run from the first step has them
  // after its first: the file's tensors, read next and freed once copied, must not take those
  // places (a plan made from a profile checks every step's start against the profiled one's).
  s.trainer->prepare();
  const SafetensorsFile file = load_safetensors(path);
  const auto& meta = file.metadata;
  const OptionStyle style = s.options.style;
  const std::string what = style == OptionStyle::keyword ? "resume" : "--resume";
  const auto format = meta.find("format");
  REGEN_CHECK(
      format != meta.end() && format->second == kStateFormat, what, " ", path,
      " is not a training state (",
      format == meta.end() ? std::string("no format in its metadata") : "format " + format->second,
      "): write one with ",
      style == OptionStyle::keyword ? "Model.save_state()" : "--save-state FILE",
      "; a checkpoint of weights alone loads with ",
      style == OptionStyle::keyword ? "Model.load()" : "--load");
  const auto model = meta.find("model");
  REGEN_CHECK(model != meta.end() && model->second == s.config.name, what, " ", path,
              " was saved from model ", model == meta.end() ? "?" : model->second, ", not ",
              s.config.name);
  // Every option that shapes the trajectory must be the one the stopped run had: the optimizer
  // and the schedule first (the options that apply follow from them).
  const std::map<std::string, std::string> now_options = trajectory_options(s.options);
  std::vector<std::pair<std::string, std::string>> ordered(now_options.begin(), now_options.end());
  std::stable_partition(ordered.begin(), ordered.end(), [](const auto& kv) {
    return kv.first == "optimizer" || kv.first == "lr_schedule";
  });
  for (const auto& entry : ordered) {
    const std::string& key = entry.first;  // a plain reference: lambdas below capture it
    const std::string& now = entry.second;
    const auto it = meta.find("train." + key);
    // States saved before the precision was recorded trained in fp32.
    const std::string then = it != meta.end()     ? it->second
                             : key == "precision" ? "fp32"
                                                  : "(not recorded)";
    if (then == now) continue;
    const bool text = key == "optimizer" || key == "data" || key == "lr_schedule";
    const auto setting = [&](const std::string& v) {
      return option_setting(key, text && style == OptionStyle::keyword ? "'" + v + "'" : v, style);
    };
    REGEN_FAIL(what, " ", path, " was saved by a run with ", setting(then), ", but this run has ",
               setting(now),
               ": the resumed steps would not be the ones "
               "that run took (pass ",
               setting(then), ")");
  }
  auto number = [&](const char* key) -> uint64_t {
    const auto it = meta.find(key);
    REGEN_CHECK(it != meta.end() && !it->second.empty() &&
                    it->second.find_first_not_of("0123456789") == std::string::npos,
                what, " ", path, ": its metadata has no valid '", key, "'");
    return std::stoull(it->second);
  };
  const uint64_t steps = number("optimizer_steps");
  const uint64_t rng_stream = number("rng_stream"), seed = number("rng_seed");
  // The optimizer's state, checked before anything is changed.
  std::map<std::string, Tensor> state;
  std::vector<int64_t> counts;
  bool have_counts = false;
  for (const auto& [name, t] : file.tensors) {
    if (name.rfind(kOptimizerPrefix, 0) != 0) continue;
    const std::string rest = name.substr(std::string(kOptimizerPrefix).size());
    if (rest == "steps") {
      REGEN_CHECK(t.dtype() == DType::i64 && t.dim() == 1, what, " ", path, ": optimizer/steps is ",
                  t.str(), ", not a vector of i64");
      counts = t.to_vector<int64_t>();
      have_counts = true;
    } else {
      state[rest] = t;
    }
  }
  REGEN_CHECK(have_counts, what, " ", path, ": no optimizer/steps (the file is damaged)");
  load_weights(s, file, path);
  try {
    s.optimizer->load_state(state, counts);
  } catch (const Error& e) {
    REGEN_FAIL(what, " ", path, ": ", e.message());
  }
  s.trainer->set_optimizer_steps(static_cast<int64_t>(steps));
  if (s.trainer->precision() == Precision::fp16) {
    LossScale scale;
    const auto text = meta.find("loss_scale");
    REGEN_CHECK(text != meta.end(), what, " ", path, ": an fp16 state without its loss scale");
    char* end = nullptr;
    scale.scale = std::strtod(text->second.c_str(), &end);
    REGEN_CHECK(end && *end == '\0' && !text->second.empty(), what, " ", path, ": loss_scale '",
                text->second, "' is not a number");
    scale.good_steps = static_cast<int64_t>(number("loss_scale_good_steps"));
    scale.skipped = static_cast<int64_t>(number("loss_scale_skipped"));
    try {
      s.trainer->set_loss_scale(scale);
    } catch (const Error& e) {
      REGEN_FAIL(what, " ", path, ": ", e.message());
    }
  }
  const auto pos = meta.find("data_position");
  s.data->set_position(pos == meta.end() ? "" : pos->second);
  set_rng_state(seed, rng_stream);
  return meta;
}

}  // namespace regen
