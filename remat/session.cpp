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
#include "regen/dist/data_parallel.h"
#include "regen/dist/world.h"
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
  check_math(math, tf32, style);
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
  other_schedule("lr_step_size", lr_step_size != 0, "step");
  other_schedule("lr_gamma", lr_gamma != 0.1, "step");
  other_schedule("lr_min", lr_min != 0, "cosine");
  other_schedule("schedule_steps", schedule_steps != 0, "cosine");
  check_one_of(*this, "shard", shard, {"none", "optimizer", "gradients"});
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
  // Every tensor of the step, as the real step allocates them, with the kernels' scratch space
  // (GEMM packing, im2col tiles; on CUDA the kernels' partial sums and cuDNN's and CUB's
  // workspaces) and what the device keeps (cuBLAS's workspace): the real step's peak.
  const int64_t need = s.preflight.memory.allocated.peak;
  REGEN_CHECK(need <= have, size_options(s), " is too large for memory: one ", c.name,
              " training step without remat needs ", format_bytes(need), " (", format_bytes(state),
              " of it the model's state; every tensor and the kernels' scratch space of the first "
              "step, exact, from a dry run), but ",
              s.device.str(), " has ", format_bytes(have), " available; ", smaller(o));
}

// ---------------------------------------------------------------------------------------------
// Sessions

namespace {

// make_session's probe of a large batch's dry run: from this batch on, and past this many
// allocator requests (about a second of dry run each 100000 on a CPU core).
constexpr int64_t kProbeBatch = 64;
constexpr double kMaxDryRequests = 2e6;

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
  std::string position() const override { return inner_->position(); }
  void set_position(const std::string& p) override { inner_->set_position(p); }
  void skip(int64_t samples) override { inner_->skip(samples); }

 private:
  std::unique_ptr<DataSource> inner_;
  ModelConfig config_;
  const ModelInput& input_;
};

// Under mpirun every rank must run the same step: the options that shape it, compared with rank
// 0's before anything is built (a rank with another batch or model would wait in a collective
// forever). Rank 0 names the first difference; the other ranks wait for it to end the job.
void check_same_on_every_rank(const SessionOptions& o, Device device) {
  dist::World& w = dist::world();
  if (!w.distributed()) return;
  std::ostringstream mine;
  mine << "--model " << o.model << "\n--batch " << o.batch << "\n--device " << device.str()
       << "\n--seed " << o.seed << "\n--lr " << number_text(o.lr) << "\n--weight-decay "
       << number_text(o.weight_decay) << "\n--shard " << o.shard << "\n--bucket-size "
       << o.bucket_size << "\n";
  for (const auto& [flag, value] : run_flags(o)) mine << flag << " " << value << "\n";
  const std::vector<std::string> all = w.all_gather(mine.str());
  if (w.rank() != 0) {
    for (const std::string& other : all) {
      if (other != all[0]) {
        w.barrier();  // rank 0 ends the job with the difference
      }
    }
    return;
  }
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  const std::vector<std::string> ref = lines(all[0]);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    const std::vector<std::string> got = lines(all[r]);
    for (size_t i = 0; i < std::max(ref.size(), got.size()); ++i) {
      const std::string a = i < ref.size() ? ref[i] : "(nothing)";
      const std::string b = i < got.size() ? got[i] : "(nothing)";
      REGEN_CHECK(a == b, "rank ", r, " of ", all.size(), " runs with ", b,
                  " where rank 0 runs with ", a,
                  ": every rank of a data-parallel job must train the same step (give every "
                  "rank the same options and environment, OMP_NUM_THREADS included)");
    }
  }
}

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
  // Data parallelism: every rank trains the same step on its own shard of each global batch.
  dist::World& world = dist::world();
  check_same_on_every_rank(options, s->device);
  if (world.distributed()) {
    // What the training loop does that data parallelism does not carry yet (docs/distributed.md).
    REGEN_CHECK(options.accumulate == 1,
                option_setting("accumulate", std::to_string(options.accumulate), options.style),
                " under mpirun: gradient accumulation is not supported with data parallelism yet "
                "(each micro-batch's backward would reduce its gradients); a larger batch per rank "
                "or more ranks give the same global batch");
    REGEN_CHECK(options.shard == "none" || (options.clip_grad_norm == 0 && !options.grad_norm),
                option_setting("shard", options.shard, options.style),
                " with gradient clipping or the gradient norm: under ZeRO a rank holds a shard of "
                "the gradients, and the global norm across ranks is not computed yet; shard none");
  }
  // The data before the model: a wrong file fails before a large model is built.
  std::unique_ptr<DataSource> data =
      make_training_source(options.data, c, options.seed, options.holdout(), options.style);
  if (world.distributed()) {
    data = std::make_unique<dist::ShardedSource>(std::move(data), world.rank(), world.size());
  }
  s->data = std::make_unique<CheckedSource>(std::move(data), c);
  if (options.eval_every > 0) {
    s->eval_data =
        make_eval_source(options.data, c, options.seed, options.holdout(), options.style);
  }
  const LrSchedule schedule = options.schedule();
  // What the trainer does besides forward, backward and the update: the dry run does it too.
  // The packed-save decisions are learned just before the dry run (below), which uses them too.
  Session* const session = s.get();
  auto setup_trainer = [&options, session](Trainer& t) {
    t.set_accumulation(options.accumulate);
    t.set_clip_grad_norm(options.clip_grad_norm);
    t.set_track_grad_norm(options.grad_norm);
    if (session->packed_saves) t.set_packed_saves(session->packed_saves);
  };
  auto make_sync = [&](Model& model) -> std::unique_ptr<GradientSync> {
    if (!world.distributed()) return nullptr;
    dist::DataParallelOptions o;
    o.shard = dist::parse_shard_mode(options.shard);
    o.bucket_bytes = options.bucket_size;
    o.first_bucket_bytes = std::min(o.first_bucket_bytes, o.bucket_bytes);
    return std::make_unique<dist::DataParallel>(model, dist::communicator_for(model.device()), o);
  };
  auto make_optimizer = [&options](Model& model, GradientSync* sync) -> std::unique_ptr<Optimizer> {
    // Under ZeRO the optimizer owns this rank's slices of the parameters only.
    std::vector<Tensor> params = sync ? sync->optimizer_parameters() : model.parameters();
    if (options.optimizer == "sgd") {
      SGDOptions o;
      o.lr = options.lr;
      o.momentum = options.momentum;
      o.weight_decay = options.weight_decay;
      return std::make_unique<SGD>(std::move(params), o);
    }
    AdamWOptions o;
    o.lr = options.lr;
    o.weight_decay = options.weight_decay;
    return std::make_unique<AdamW>(std::move(params), o);
  };
  // A dry run's time grows with the batch: no kernel runs, but the kernels request their scratch
  // as they would (per sample and head, per tile). Before a large batch's, two small steps run
  // dry tell how its requests and its peak grow: a step that would take millions of requests
  // to measure (minutes) and is far past the memory available is refused from them, roughly.
  if (preflight == Preflight::step && options.batch >= kProbeBatch) {
    const int64_t have = available_memory(s->device);
    // Batches 2 and 3: batch norm trains on any map of two values a channel.
    DryRunResult one, two;
    try {
      one = dry_run_step(c, 2, s->device, make_optimizer, make_sync, setup_trainer);
      two = dry_run_step(c, 3, s->device, make_optimizer, make_sync, setup_trainer);
    } catch (const Error&) {
      // A batch this small cannot run (a model's own check): the full dry run says why.
      one = two = DryRunResult{};
    }
    const auto grown = [&](double at2, double at3) {
      return at2 + std::max(0.0, at3 - at2) * static_cast<double>(options.batch - 2);
    };
    const double requests = grown(static_cast<double>(one.memory.num_allocs),
                                  static_cast<double>(two.memory.num_allocs));
    const double need = grown(static_cast<double>(one.memory.allocated.peak),
                              static_cast<double>(two.memory.allocated.peak));
    if (have > 0 && requests > kMaxDryRequests && need > 2.0 * static_cast<double>(have)) {
      char about[64];
      std::snprintf(about, sizeof about, "%.3g", requests);
      REGEN_FAIL(size_options(*s), " is too large for memory: one ", c.name,
                 " training step without remat needs about ",
                 format_bytes(static_cast<int64_t>(std::min(need, 9e18))),
                 " (grown from dry runs at batch 2 and 3; the exact dry run would make about ",
                 about, " requests, minutes of work), but ", s->device.str(), " has ",
                 format_bytes(have), " available; ", smaller(options));
    }
  }
  // The first step, run dry: its memory, exact, before any of it is used; first, with masks on,
  // which ops save packed forms (a dry forward pass of its own).
  try {
    if (options.masks) {
      s->packed_saves =
          std::make_shared<const PackedSaves>(learn_packed_saves(c, options.batch, s->device));
    }
    s->preflight =
        dry_run_step(c, options.batch, s->device, make_optimizer, make_sync, setup_trainer);
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
  // Each rank draws its own dropout masks (rank 0 those of one process with the same seed).
  if (world.distributed()) manual_seed(dist::rank_seed(options.seed, world.rank()));
  s->sync = make_sync(*s->model);
  s->optimizer = make_optimizer(*s->model, s->sync.get());
  s->trainer =
      std::make_unique<Trainer>(*s->model, *s->optimizer, *s->data, options.batch, s->device);
  setup_trainer(*s->trainer);
  s->trainer->set_schedule(schedule);
  s->trainer->set_gradient_sync(s->sync.get());
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
  // What the step allocates besides forward and backward: micro-batches, the gradient norm.
  r["--accumulate"] = std::to_string(o.accumulate);
  r["--grad-norm"] = o.clip_grad_norm > 0 || o.grad_norm ? "on" : "off";
  // Data parallelism: the ranks, and what shapes each rank's step (a process alone records none).
  const dist::World& world = dist::world();
  if (world.distributed()) {
    r["--ranks"] = std::to_string(world.size());
    r["--shard"] = o.shard;
    r["--bucket-size"] = std::to_string(o.bucket_size);
  }
  r["--masks"] = o.masks ? "on" : "off";
  r["--compress"] = o.compress;
  return r;
}

namespace {
// Flags a profile made before they were recorded ran with these values.
const std::map<std::string, std::string>& flags_before_recorded() {
  static const std::map<std::string, std::string> m = {{"--accumulate", "1"},
                                                       {"--grad-norm", "off"}};
  return m;
}
}  // namespace

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
  // A flag recorded since (a profile of any age has the step of its value then): compared too.
  // Only a profile that recorded flags at all (an empty set is a profile from before them).
  if (!p.run.empty()) {
    for (const auto& [flag, value] : flags_before_recorded()) {
      if (p.run.count(flag) == 0) recorded.emplace_back(flag, value);
    }
  }
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
    // An option whose profile depends on less than its value (ModelOption::profile_key).
    const ModelOption* opt = nullptr;
    for (const ModelOption& m : model_info(o.model).input.options) {
      if (option_name(m.key, OptionStyle::flag) == flag) opt = &m;
    }
    if (opt && opt->profile_key && it != now.end()) {
      char* end_then = nullptr;
      char* end_here = nullptr;
      const double v_then = std::strtod(then.c_str(), &end_then);
      const double v_here = std::strtod(here.c_str(), &end_here);
      if (*end_then == '\0' && *end_here == '\0' &&
          opt->profile_key(v_then) == opt->profile_key(v_here)) {
        continue;
      }
    }
    // The flag as `o.style` names it: "--seq-len" -> "seq_len".
    std::string key = flag.substr(2);
    std::replace(key.begin(), key.end(), '-', '_');
    const std::string was = option_setting(key, then, o.style);
    REGEN_FAIL(what, " was made with ", was,
               o.style == OptionStyle::keyword ? ", but this model has " : ", but this run has ",
               option_setting(key, here, o.style), ": its memory and times are another step's (",
               "pass ", was, ", or profile again)");
  }
  // A profile of one process records no ranks.
  const auto ranks = now.find("--ranks");
  REGEN_CHECK(ranks == now.end() || p.run.count("--ranks"), what,
              " was made by one process, but this run has ", ranks->second,
              " ranks (mpirun): each rank's step also reduces gradients, which the profile does "
              "not have; profile under mpirun with the same ranks");
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
    const std::string then = it == meta.end() ? "(not recorded)" : it->second;
    if (then == now) continue;
    const bool text = key == "optimizer" || key == "data" || key == "lr_schedule";
    const auto setting = [&](const std::string& v) {
      return option_setting(key, text && style == OptionStyle::keyword ? quoted(v) : v, style);
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
  const auto pos = meta.find("data_position");
  s.data->set_position(pos == meta.end() ? "" : pos->second);
  set_rng_state(seed, rng_stream);
  return meta;
}

EvalResult evaluate_session(Session& s) {
  const SessionOptions& o = s.options;
  if (!s.eval_data) {
    const double holdout = o.holdout() > 0 ? o.holdout() : kDefaultHoldout;
    s.eval_data = make_eval_source(o.data, s.config, o.seed, holdout, o.style);
  }
  return evaluate(*s.model, *s.eval_data, o.evaluation_batch(), o.eval_batches);
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
  std::vector<double> ms, cores;
  MeasuredRun r;
  for (const StepResult& st : pipe.train(steps)) {
    ms.push_back(st.ms);
    cores.push_back(st.cpu_cores());
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
  // Under mpirun: the highest peaks of any rank, and a step exact only when it was on every rank.
  dist::World& world = dist::world();
  if (world.distributed()) {
    for (int64_t v : world.all_gather(r.peak)) r.peak = std::max(r.peak, v);
    for (int64_t v : world.all_gather(r.reserved)) r.reserved = std::max(r.reserved, v);
    for (int64_t v : world.all_gather(r.steps_exact)) r.steps_exact = std::min(r.steps_exact, v);
  }
  // The first step pays first-touch costs; the median of the rest is the step time.
  if (ms.size() > 1) ms.erase(ms.begin());
  if (cores.size() > 1) cores.erase(cores.begin());
  r.ms = median(ms);
  if (s->device.is_cpu()) {
    r.cpu_cores = median(cores);
    r.threads = omp_get_max_threads();
  }
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
