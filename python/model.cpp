// regen.Model: a registered model built by name with its options, with its optimizer, data and
// trainer made by the library's session (session/session.h make_session), as `regen train` makes
// them: the same options, the same checks (SessionOptions::validate, its messages naming the
// keywords), and a RematPipeline to profile, plan and train under a plan. State dicts cross as
// numpy arrays; checkpoints are `regen train --save` files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "python/bindings.h"
#include "regen/dist/world.h"
#include "regen/models/gpt2_llmc.h"
#include "regen/models/metrics_log.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/remat/profile/estimate.h"
#include "regen/session/checkpoint.h"
#include "regen/session/plan_request.h"
#include "regen/session/records.h"
#include "regen/session/session.h"
#include "regen/session/training_run.h"

namespace regen::py {
namespace {

// The keywords a Model takes besides name, batch and device: the session's options, then every
// registered model's own (a model refuses another model's with the options it takes).
std::vector<std::string> option_names() {
  std::vector<std::string> names;
  for (const std::string& k : session_option_keys()) {
    if (k != "model" && k != "batch" && k != "device") names.push_back(k);
  }
  for (const ModelOptionUse& u : model_option_uses()) names.push_back(u.option.key);
  return names;
}

std::string text_of(const pb::handle& v) {
  return pb::str(pb::repr(v)).cast<std::string>();
}

// "image_size='64': must be an integer (got a str)".
[[noreturn]] void bad_type(const std::string& key, const pb::handle& v, const char* what) {
  REGEN_FAIL(key, "=", text_of(v), ": must be ", what, " (got a ",
             pb::str(pb::type::handle_of(v).attr("__name__")).cast<std::string>(), ")");
}

bool is_integer(const pb::handle& v) {
  return PyIndex_Check(v.ptr()) && !pb::isinstance<pb::bool_>(v);  // int, numpy integers
}

// An integer keyword as a double (exact to 2^53; beyond, +-inf for one that a double cannot
// hold): the ranges are checked by SessionOptions::validate.
double integer_value(const std::string& key, const pb::handle& v) {
  if (!is_integer(v)) bad_type(key, v, "an integer");
  const pb::int_ i = pb::reinterpret_borrow<pb::object>(v);
  const double d = PyLong_AsDouble(i.ptr());
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return pb::int_(0) < i ? HUGE_VAL : -HUGE_VAL;
  }
  return d;
}

double number_value(const std::string& key, const pb::handle& v) {
  const bool number =
      (pb::isinstance<pb::float_>(v) || PyIndex_Check(v.ptr()) || PyFloat_Check(v.ptr())) &&
      !pb::isinstance<pb::bool_>(v);
  if (!number) bad_type(key, v, "a number");
  if (is_integer(v)) return integer_value(key, v);
  return v.cast<double>();
}

// An integer keyword that fits an int64_t; beyond, refused with the range's words.
int64_t int64_value(const std::string& key, const pb::handle& v, const OptionRange& range) {
  const double d = integer_value(key, v);
  const std::string problem = range.problem(d);
  if (!problem.empty()) REGEN_FAIL(option_error(key, text_of(v), problem, OptionStyle::keyword));
  return static_cast<int64_t>(pb::int_(pb::reinterpret_borrow<pb::object>(v)).cast<int64_t>());
}

std::string str_value(const std::string& key, const pb::handle& v) {
  if (!pb::isinstance<pb::str>(v)) bad_type(key, v, "a str");
  return v.cast<std::string>();
}

// The training loop's options (SessionOptions' training-loop group): sets `key` and returns true
// when it is one of them.
bool apply_training_option(SessionOptions& o, const std::string& key, const pb::handle& v) {
  static const char* const ints[] = {"accumulate", "warmup_steps", "schedule_steps", "lr_step_size",
                                     "eval_every", "eval_batches", "eval_batch"};
  for (const char* k : ints) {
    if (key != k) continue;
    const int64_t n = int64_value(key, v, SessionOptions::range(key));
    if (key == "accumulate") o.accumulate = n;
    if (key == "warmup_steps") o.warmup_steps = n;
    if (key == "schedule_steps") o.schedule_steps = n;
    if (key == "lr_step_size") o.lr_step_size = n;
    if (key == "eval_every") o.eval_every = n;
    if (key == "eval_batches") o.eval_batches = n;
    if (key == "eval_batch") o.eval_batch = n;
    return true;
  }
  if (key == "lr_gamma") {
    o.lr_gamma = number_value(key, v);
  } else if (key == "lr_min") {
    o.lr_min = number_value(key, v);
  } else if (key == "clip_grad_norm") {
    o.clip_grad_norm = number_value(key, v);
  } else if (key == "eval_split") {
    o.eval_split = number_value(key, v);
  } else if (key == "lr_schedule") {
    o.lr_schedule = str_value(key, v);
  } else if (key == "grad_norm") {
    if (!pb::isinstance<pb::bool_>(v)) bad_type(key, v, "True or False");
    o.grad_norm = v.cast<bool>();
  } else {
    return false;
  }
  return true;
}

// The training-loop keywords Model.train takes (the others are set when the Model is built: they
// change the step its profiles and plans describe, or the data).
const std::vector<std::string>& train_keywords() {
  static const std::vector<std::string> k = {
      "lr_schedule", "warmup_steps",   "schedule_steps", "lr_step_size", "lr_gamma",
      "lr_min",      "clip_grad_norm", "eval_every",     "eval_batches", "eval_batch"};
  return k;
}

pb::dict eval_dict(const EvalResult& e) {
  pb::dict d;
  d["loss"] = e.loss;
  d["accuracy"] = e.accuracy >= 0 ? pb::object(pb::float_(e.accuracy)) : pb::object(pb::none());
  d["perplexity"] =
      e.perplexity >= 0 ? pb::object(pb::float_(e.perplexity)) : pb::object(pb::none());
  d["examples"] = e.examples;
  d["targets"] = e.targets;
  d["batches"] = e.batches;
  d["ms"] = e.ms;
  d["peak_allocated"] = e.memory.allocated.peak;
  d["peak_reserved"] = e.memory.reserved.peak;
  d["persistent"] = e.persistent;
  return d;
}

SessionOptions options_from(const std::string& name, const pb::object& batch,
                            const std::string& device, const pb::dict& kw) {
  const std::vector<std::string> names = option_names();
  for (const auto& [k, v] : kw) {
    const std::string key = pb::str(k);
    REGEN_CHECK(std::find(names.begin(), names.end(), key) != names.end(), "unknown model option '",
                key, "'; the options are ", join_names(names));
  }
  SessionOptions o;
  o.style = OptionStyle::keyword;
  o.model = name;
  o.device = device;
  o.batch = int64_value("batch", batch, SessionOptions::range("batch"));
  for (const auto& [k, v] : kw) {
    const std::string key = pb::str(k);
    if (v.is_none()) continue;  // the preset's value, or the session's default
    if (key == "optimizer") {
      o.optimizer = str_value(key, v);
    } else if (key == "data") {
      o.data = str_value(key, v);
    } else if (key == "conv") {
      o.conv = str_value(key, v);
    } else if (key == "compress") {
      o.compress = str_value(key, v);
    } else if (key == "cuda_graph") {
      o.cuda_graph = str_value(key, v);
    } else if (key == "math") {
      o.math = str_value(key, v);
    } else if (key == "precision") {
      o.precision = str_value(key, v);
    } else if (key == "shard") {
      o.shard = str_value(key, v);
    } else if (key == "bucket_size") {
      // Bytes, or text as the command line takes it ("25MiB").
      if (pb::isinstance<pb::str>(v)) {
        try {
          o.bucket_size = parse_bytes(v.cast<std::string>());
        } catch (const Error& e) {
          REGEN_FAIL(option_error(key, text_of(v), e.message(), OptionStyle::keyword));
        }
      } else {
        o.bucket_size = int64_value(key, v, OptionRange::integers(0));
      }
    } else if (key == "tf32") {
      if (!pb::isinstance<pb::bool_>(v)) bad_type(key, v, "True or False");
      o.tf32 = v.cast<bool>();
    } else if (key == "masks") {
      if (!pb::isinstance<pb::bool_>(v)) bad_type(key, v, "True or False");
      o.masks = v.cast<bool>();
    } else if (key == "lr") {
      o.lr = number_value(key, v);
    } else if (key == "momentum") {
      o.momentum = number_value(key, v);
    } else if (key == "weight_decay") {
      o.weight_decay = number_value(key, v);
    } else if (key == "threads") {
      o.threads = int64_value(key, v, SessionOptions::range("threads"));
    } else if (apply_training_option(o, key, v)) {
      // the training loop's (accumulate, lr_schedule, ...)
    } else if (key == "seed") {
      if (!is_integer(v)) bad_type(key, v, "an integer");
      const pb::int_ i = pb::reinterpret_borrow<pb::object>(v);
      if (i < pb::int_(0))
        REGEN_FAIL(option_error(key, text_of(v), "must be a non-negative integer", o.style));
      try {
        o.seed = i.cast<uint64_t>();
      } catch (const pb::cast_error&) {
        REGEN_FAIL(option_error(key, text_of(v), "must be at most 18446744073709551615", o.style));
      }
    } else {
      // A model's own option: an integer or a number, as the models that take it say.
      bool integer = true;
      for (const ModelOptionUse& u : model_option_uses()) {
        if (u.option.key == key) integer = u.option.range.integer;
      }
      o.model_options[key] = integer ? integer_value(key, v) : number_value(key, v);
    }
  }
  o.validate();
  return o;
}

std::string format_ms(double ms) {
  char buf[48];
  std::snprintf(buf, sizeof buf, ms < 100 ? "%.3f ms" : "%.1f ms", ms);
  return buf;
}

// The Models alive in this process, whose files no write from Python may replace (check_write).
// Never destroyed: a Model the interpreter frees late in its shutdown still finds it.
std::vector<const PyModel*>& live_models() {
  static auto* models = new std::vector<const PyModel*>;
  return *models;
}

}  // namespace

int64_t int_arg(const std::string& call, const std::string& key, const pb::handle& v,
                const OptionRange& range) {
  double d = 0;
  try {
    d = integer_value(key, v);
  } catch (const Error& e) {
    REGEN_FAIL(call, ": ", e.message());
  }
  if (range.problem(d).empty())
    return pb::int_(pb::reinterpret_borrow<pb::object>(v)).cast<int64_t>();
  // OptionRange::problem's words, with the bounds written whole (number_text writes 1000 as
  // 1e+03).
  const auto whole = [](double x) { return std::to_string(static_cast<long long>(x)); };
  std::string problem;
  if ((range.lo == 0 || range.lo == 1) && d >= range.lo) {
    problem = "must be at most " + whole(range.hi);
  } else if (range.lo == 1) {
    problem = "must be a positive integer";
  } else if (range.lo == 0) {
    problem = "must be a non-negative integer";
  } else {
    problem = "must be an integer from " + whole(range.lo) + " to " + whole(range.hi);
  }
  REGEN_FAIL(call, ": ", option_error(key, text_of(v), problem, OptionStyle::keyword));
}

std::string path_text(const std::string& path) {
  return text_of(pb::str(path));
}

NamedFile source_file(const std::string& call, const std::string& path) {
  return {call + "(" + path_text(path) + ")", resolved_path(path)};
}

class PyModel {
 public:
  PyModel(const std::string& name, const pb::object& batch, const std::string& device,
          const pb::dict& kw)
      : options_(options_from(name, batch, device, kw)) {
    // Every model starts from the same allocator state, so a profile made by one predicts the
    // steps of another of the same configuration to the byte (while no other model is alive).
    allocator_for(resolve_device(options_.device, options_.style)).empty_cache();
    session_ = make_session(options_);
    pipe_ = std::make_unique<RematPipeline>(*session_->trainer);
    const std::string data = option_setting("data", path_text(options_.data), options_.style);
    for (const std::string& f : options_.data_files()) note(Role::data, data, f);
    live_models().push_back(this);
  }
  ~PyModel() {
    auto& live = live_models();
    live.erase(std::remove(live.begin(), live.end(), this), live.end());
  }
  PyModel(const PyModel&) = delete;
  PyModel& operator=(const PyModel&) = delete;

  // What a Model does with a file; each file keeps its role for the Model's life.
  enum class Role { data, load, resume, save, save_state, log };

  // The files this Model reads (its data, a loaded checkpoint, a resumed state, the files its
  // profile and plan were read from), named with `suffix` ("of another live Model(...)").
  void add_reads(std::vector<NamedFile>& out, const std::string& suffix) const {
    for (const RoleFile& f : files_) {
      if (f.role == Role::data || f.role == Role::load || f.role == Role::resume)
        out.push_back({f.file.name + suffix, f.file.path});
    }
    add_sources(out, suffix);
  }
  // The files its profile and plan were read from.
  void add_sources(std::vector<NamedFile>& out, const std::string& suffix) const {
    if (profile_ && !profile_->source.path.empty())
      out.push_back({profile_->source.name + suffix, profile_->source.path});
    if (plan_ && !plan_->source.path.empty())
      out.push_back({plan_->source.name + suffix, plan_->source.path});
  }

  // Refuses writing `path` in `role` (`call` names the write: "save_state('x')") when it is a file
  // this Model reads, one it wrote in another role (a log is never replaced by a checkpoint), or
  // one another live Model reads. As the command line's --save may name its --load file and
  // --save-state its --resume file, a checkpoint may be saved over the one loaded, and a state
  // over the one resumed: each is read whole first and replaced atomically.
  // `also`: other files the call reads.
  void check_output(Role role, const std::string& call, const std::string& path,
                    const std::vector<NamedFile>& also = {}) const {
    std::vector<NamedFile> inputs = also;
    for (const RoleFile& f : files_) {
      if (f.role == role || (role == Role::save && f.role == Role::load) ||
          (role == Role::save_state && f.role == Role::resume))
        continue;
      inputs.push_back(f.file);
    }
    add_sources(inputs, "");
    check_write(call, path, inputs, {}, this);
  }

  // A metrics log train() may open: not a file in use (check_output). The log is CSV for a name
  // ending in ".csv" in any case, JSON lines for any other (models/metrics_log.h).
  void check_log(const std::string& path, const std::vector<NamedFile>& also = {}) const {
    const std::string call = "train(log=" + path_text(path) + ")";
    // As --log is checked (io.h why_not_writable): a folder that exists and takes a new file, and
    // a regular file (a FIFO with no reader would block the open for ever).
    const std::string why = why_not_writable(path);
    REGEN_CHECK(why.empty(), call, ": cannot write there: ", why);
    check_output(Role::log, call, path, also);
  }

  // Refuses `call` from train()'s progress callback when it would change the step under way (its
  // plan, profile, limit, weights or options): the running loop checked them before its first
  // step (a plan that does not fit, for one). Saving, evaluating and reading stay allowed.
  void check_idle(const char* call) const {
    REGEN_CHECK(!training_, call,
                ": the Model is training (this is a call from train()'s progress callback); call "
                "it after train() returns (progress may return False to stop)");
  }

  // Runs `write` on the metrics log; its errors name train()'s keyword, not the command line's
  // flag ("--log FILE: cannot open it for writing: ..." from the library).
  template <class F>
  static void logged(const std::string& path, F&& write) {
    try {
      write();
    } catch (const Error& e) {
      std::string why = e.message();
      const std::string flag = "--log " + path + ": ";
      if (why.rfind(flag, 0) == 0) why = why.substr(flag.size());
      REGEN_FAIL("train(log=", path_text(path), "): ", why);
    }
  }

  // Records a file read or written in `role` (after the call succeeded), named by `call`.
  void note(Role role, const std::string& call, const std::string& path) {
    const std::string resolved = resolved_path(path);
    for (const RoleFile& f : files_) {
      if (f.role == role && f.file.path == resolved) return;
    }
    files_.push_back({role, {call, resolved}});
  }

  const SessionOptions& options() const { return options_; }
  Session& session() { return *session_; }
  RematPipeline& pipe() { return *pipe_; }
  const ProfilePtr& profile() const { return profile_; }
  const std::shared_ptr<PlanHandle>& plan() const { return plan_; }

  // Model.train as an observer of the library's training loop (TrainingRun): the metrics log
  // (its errors named by train()'s keyword), the evaluations it keeps (Model.evaluations), and the
  // progress callback, whose False stops the run.
  class Observer : public TrainingObserver {
   public:
    Observer(PyModel& m, pb::object progress, MetricsLog* log, std::string log_path)
        : m_(m), progress_(std::move(progress)), log_(log), log_path_(std::move(log_path)) {}
    void on_step(const TrainingRun& run, const StepEvent& e) override {
      if (log_) logged(log_path_, [&] { log_->step(e.step, *e.result, run.examples_per_step()); });
    }
    void on_eval(const TrainingRun&, int64_t step, const EvalResult& e) override {
      m_.evals_.emplace_back(step, e);
      if (log_) logged(log_path_, [&] { log_->eval(step, e); });
    }
    bool on_step_end(const TrainingRun&, const StepEvent& e) override {
      bool keep_going = true;
      if (!progress_.is_none()) {
        pb::object keep = progress_(e.index, *e.result);
        if (!keep.is_none() && !pb::isinstance<pb::bool_>(keep)) {
          throw pb::type_error(
              "progress(step, result) must return None, True or False (False "
              "stops training), but it returned a value of type '" +
              type_name_of(keep) + "' after step " + std::to_string(e.index));
        }
        keep_going = keep.is_none() || keep.cast<bool>();
      }
      if (keep_going && e.index < e.count && PyErr_CheckSignals() != 0)
        throw pb::error_already_set();
      return keep_going;
    }

   private:
    PyModel& m_;
    pb::object progress_;
    MetricsLog* log_;
    std::string log_path_;
  };

  // `log`: train()'s metrics log, which keeps the profiling steps (they train), as regen train's.
  ProfilePtr run_profile(int iterations, int warmup, const std::string& op_timing = "sync",
                         MetricsLog* log = nullptr, const std::string& log_path = "") {
    check_idle("profile");
    REGEN_CHECK(iterations >= 1, "profile: iterations=", iterations,
                ": must be a positive integer");
    REGEN_CHECK(warmup >= 0, "profile: warmup=", warmup, ": must be a non-negative integer");
    ProfileOptions po;
    po.op_timing = parse_op_timing(op_timing, "profile: op_timing");
    po.warmup = warmup;
    po.iterations = iterations;
    po.model_name = options_.model;
    po.run = run_flags(options_);
    plan_.reset();
    // The profiling steps train: the library's training loop takes them, and the log keeps them.
    Observer observer(*this, pb::none(), log, log_path);
    TrainingRun run(*session_, *pipe_);
    run.observe(observer);
    profile_ = make_profile_handle(run.profile(po));
    return profile_;
  }

  void use_profile(const ProfilePtr& p) {
    check_idle("use_profile");
    REGEN_CHECK(p != nullptr, "use_profile: profile is None");
    if (p == profile_) return;
    check_profile_run(p->profile, options_, "the profile");
    plan_.reset();
    pipe_->use_profile(p->profile);  // refuses another model, batch or device
    profile_ = p;
  }

  std::shared_ptr<PlanHandle> make(const std::string& policy, const pb::object& budget,
                                   const std::string& chain, const std::string& budget_of,
                                   const std::string& layout, const std::string& offload,
                                   const std::string& transfer) {
    check_idle("plan");
    REGEN_CHECK(profile_ != nullptr,
                "plan: the model has no profile; call profile() or use_profile() first");
    PlanOptions o = plan_options(chain, budget_of, layout, offload, transfer, &profile_->profile);
    o.cache = &profile_->cache;
    auto h = std::make_shared<PlanHandle>(
        PlanHandle{make_plan(profile_->sim, policy, budget_from(budget), o), profile_});
    install(h);
    return h;
  }

  void install(const std::shared_ptr<PlanHandle>& h) {
    check_idle("use_plan");
    REGEN_CHECK(h != nullptr, "use_plan: plan is None");
    use_profile(h->profile);
    pipe_->use_plan(h->plan);
    plan_ = h;
  }

  void clear_plan() {
    check_idle("clear_plan");
    pipe_->clear_plan();
    plan_.reset();
  }

  // Steps under the installed plan (none: without remat). A plan that does not fit its budget is
  // refused before the first step, as `regen train` refuses it.
  // Applies Model.train's training-loop keywords: checked with the Model's other options
  // (SessionOptions::validate), against the profile in use (clipping changes the step), then set on
  // the trainer.
  void set_training_options(const pb::dict& kw) {
    check_idle("train");
    if (kw.size() == 0) return;
    SessionOptions o = options_;
    for (const auto& [k, v] : kw) {
      const std::string key = pb::str(k);
      const auto& allowed = train_keywords();
      REGEN_CHECK(std::find(allowed.begin(), allowed.end(), key) != allowed.end(), "train: ", key,
                  key == "accumulate" || key == "eval_split" || key == "grad_norm"
                      ? " is set when the Model is built (it changes the step or the data)"
                      : " is not an option of train()",
                  "; train() takes ", join_names(allowed));
      if (!v.is_none()) apply_training_option(o, key, v);
    }
    o.validate();
    const LrSchedule schedule = o.schedule();
    if (profile_) check_profile_run(profile_->profile, o, "the profile");
    Trainer& t = *session_->trainer;
    t.set_schedule(schedule);
    t.set_clip_grad_norm(o.clip_grad_norm);
    options_ = o;
    session_->options = o;
  }

  EvalResult evaluate(const pb::object& batches, const pb::object& batch) {
    pipe_->finish();  // the plan's hooks, limit and layout are the training step's
    SessionOptions o = options_;
    if (!batches.is_none())
      o.eval_batches = int64_value("batches", batches, SessionOptions::range("eval_batches"));
    if (!batch.is_none())
      o.eval_batch = int64_value("batch", batch, SessionOptions::range("eval_batch"));
    const SessionOptions keep = session_->options;
    session_->options = o;
    struct Back {
      Session& s;
      const SessionOptions& o;
      ~Back() { s.options = o; }
    } back{*session_, keep};
    return evaluate_session(*session_);
  }

  const std::vector<std::pair<int64_t, EvalResult>>& evaluations() const { return evals_; }

  // The metrics log of train(log=`path`) (checked: check_log), opened to append once the model
  // has trained; null on the ranks but 0 under mpirun, where rank 0 writes it as `regen train
  // --log` does (every rank has the same loss).
  std::unique_ptr<MetricsLog> open_log(const std::string& path) {
    const std::string call = "train(log=" + path_text(path) + ")";
    check_log(path);
    std::unique_ptr<MetricsLog> log;
    if (dist::world().rank() == 0) {
      logged(path, [&] {
        log = std::make_unique<MetricsLog>(path, session_->trainer->optimizer_steps() > 0);
      });
    }
    note(Role::log, call, path);
    return log;
  }

  // `log`: the log of `log_path` when the caller opened it already (to keep profiling steps).
  std::vector<StepResult> train(int64_t steps, const pb::object& progress,
                                const std::string& log_path = "",
                                std::unique_ptr<MetricsLog> log = nullptr) {
    REGEN_CHECK(steps >= 1, "train: steps=", steps, ": must be a positive integer");
    check_idle("train");
    // A plan that does not fit its budget, or the device, is refused before the first step, as
    // `regen train` refuses it: the same loop.
    TrainingRun run(*session_, *pipe_);
    run.check_plan();
    // Refusals first: a refused call leaves an existing log as it was.
    if (!log && !log_path.empty()) log = open_log(log_path);
    evals_.clear();
    struct Busy {
      bool& training;
      explicit Busy(bool& t) : training(t) { training = true; }
      ~Busy() { training = false; }
    } busy{training_};
    // The plan's hooks, allocator limit and layout come off when the call returns or raises: the
    // model lives on in Python, and another model's steps must not run under this one's limit.
    struct Finish {
      RematPipeline& pipe;
      ~Finish() { pipe.finish(); }
    } finish{*pipe_};
    Observer observer(*this, progress, log.get(), log_path);
    run.observe(observer);
    std::vector<StepResult> out = run.run(steps);
    // Every step under the plan measured the predicted peaks (and, under DTR, evictions and
    // replays), as `regen train` checks them.
    run.check_predictions();
    return out;
  }

 private:
  SessionOptions options_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<RematPipeline> pipe_;  // after session_: destroyed first
  ProfilePtr profile_;
  std::shared_ptr<PlanHandle> plan_;
  std::vector<std::pair<int64_t, EvalResult>> evals_;  // the last train() call's evaluations
  struct RoleFile {
    Role role;
    NamedFile file;  // the call that used it ("save('c.st')") and its resolved path
  };
  std::vector<RoleFile> files_;
  bool training_ = false;  // inside train(): its progress callback may call back
};

void check_write(const std::string& call, const std::string& path,
                 const std::vector<NamedFile>& inputs, const NamedFile& own,
                 const PyModel* writer) {
  std::vector<NamedFile> all = inputs;
  for (const PyModel* m : live_models()) {
    if (m == writer) continue;
    m->add_reads(all, std::string(writer ? " of another" : " of a") + " live Model('" +
                          m->options().model + "')");
  }
  if (!own.path.empty()) {
    // The object written over the file it was read from: the same content again.
    const std::string self = resolved_path(path);
    all.erase(
        std::remove_if(all.begin(), all.end(),
                       [&](const NamedFile& f) { return f.path == own.path && self == own.path; }),
        all.end());
  }
  check_distinct_files({{call + ": " + path_text(path), path}}, all);
}

namespace {

// profile()'s iterations and warmup, in the ranges of `regen profile --iterations --warmup`.
std::pair<int, int> profile_counts(const pb::object& iterations, const pb::object& warmup) {
  const double int_max = std::numeric_limits<int>::max();
  return {
      static_cast<int>(
          int_arg("profile", "iterations", iterations, OptionRange::integers(1, int_max))),
      static_cast<int>(int_arg("profile", "warmup", warmup, OptionRange::integers(0, int_max)))};
}

// Model.train's planning keywords, checked as `regen train` checks --policy, --plan, --budget,
// --layout, --chain, --budget-of, --offload and --transfer: each applies to planning with a
// policy, so with a plan (which carries its own) or without either it would be ignored; a budget
// needs a policy, a planned layout a plan.
void check_planning_arguments(const PyModel& s, const pb::object& policy, const pb::object& budget,
                              const std::string& chain, const std::string& budget_of,
                              const std::string& layout, const pb::object& plan,
                              const std::string& offload, const std::string& transfer) {
  if (!plan.is_none()) {
    REGEN_CHECK(policy.is_none(), "train: give a plan or a policy, not both");
    REGEN_CHECK(pb::isinstance<PlanHandle>(plan),
                "train: plan must be a regen.Plan (from regen.plan or regen.load_plan), got type '",
                type_name_of(plan), "'");
    const auto h = plan.cast<std::shared_ptr<PlanHandle>>();
    REGEN_CHECK(h != nullptr, "train: plan is None");
    REGEN_CHECK(budget.is_none(), "train: budget=", text_of(budget),
                " applies to planning with policy=; plan= carries its own budget (",
                h->plan.budget_text.empty() ? std::string("none") : h->plan.budget_text, ")");
    REGEN_CHECK(layout != "planned" || h->plan.planned_layout,
                "train: layout='planned' contradicts plan=, which was made without a planned "
                "layout (plan(..., layout='planned')): leave layout out, the plan carries its own");
  } else if (policy.is_none()) {
    const std::string policies = join_names(remat_policy_names());
    REGEN_CHECK(budget.is_none(), "train: budget=", text_of(budget),
                " needs a policy= (a rematerialization planner: ", policies, ")");
    REGEN_CHECK(layout != "planned",
                "train: layout='planned' places the blocks of a rematerialization plan: give "
                "policy= (one of ",
                policies, ") or plan=");
  } else {
    REGEN_CHECK(pb::isinstance<pb::str>(policy),
                "train: policy must be a planner's name (str), "
                "one of regen.policies()");
    const std::string name = policy.cast<std::string>();
    // Known, with a budget that reads, and the keywords planning takes checked as the command
    // line checks them (session/plan_request.h; the transfer model is read once there is a
    // profile): each fails now, not after the profiling steps.
    budget_from(budget);  // its message names the keyword: "budget='' is empty (...)"
    if (name != "none") {
      PlanRequest r = plan_request(chain, budget_of, layout, offload, transfer);
      r.policy = name;
      try {
        r.validate(s.options().compress != "none");
      } catch (const Error& e) {
        REGEN_FAIL("train: ", e.message());
      }
      return;
    }
    try {
      planner_info(name);
      plan_options(chain, budget_of, layout, offload);
    } catch (const Error& e) {
      REGEN_FAIL("train: ", e.message());
    }
    // 'none' plans nothing (with compress: a plan of none, holding what it retains narrow).
    REGEN_CHECK(budget.is_none(), "train: budget=", text_of(budget),
                " needs a policy= (a rematerialization planner: ", join_names(remat_policy_names()),
                "); policy='none' plans nothing");
    if (s.options().compress != "none") return;
    REGEN_CHECK(layout != "planned",
                "train: layout='planned' places the blocks of a rematerialization plan, and "
                "policy='none' plans nothing: give a policy= (one of ",
                join_names(remat_policy_names()), ")");
  }
  // Keywords that only planning reads, left at their defaults unless a policy plans.
  const std::pair<const char*, std::pair<std::string, const char*>> planning[] = {
      {"chain", {chain, "auto"}},
      {"budget_of", {budget_of, "reserved"}},
      {"offload", {offload, "none"}},
      {"transfer", {transfer, "profile"}}};
  for (const auto& [key, value] : planning) {
    REGEN_CHECK(value.first == value.second, "train: ", key, "=", path_text(value.first),
                " applies to planning with a policy",
                plan.is_none() ? ": give policy= (one of " + join_names(remat_policy_names()) + ")"
                               : std::string("; plan= carries its own"));
  }
}

}  // namespace

void bind_model(pb::module_& m) {
  pb::class_<StepResult>(m, "StepResult",
                         "One training step: its loss, wall time and the allocator's peaks")
      .def_readonly("loss", &StepResult::loss)
      .def_readonly("ms", &StepResult::ms, "Wall time of the iteration (device synchronized)")
      .def_property_readonly("peak_allocated",
                             [](const StepResult& r) { return r.memory.allocated.peak; })
      .def_property_readonly("peak_reserved",
                             [](const StepResult& r) { return r.memory.reserved.peak; })
      .def_property_readonly(
          "allocated_at_peak",
          [](const StepResult& r) { return by_category(r.memory.allocated_by_at_peak); },
          "Allocated bytes by category when the peak was reached")
      .def_property_readonly("cache_flushes",
                             [](const StepResult& r) { return r.memory.num_cache_flushes; })
      .def_readonly("lr", &StepResult::lr, "The learning rate of the step's update")
      .def_property_readonly(
          "grad_norm",
          [](const StepResult& r) -> pb::object {
            return r.grad_norm >= 0 ? pb::object(pb::float_(r.grad_norm)) : pb::object(pb::none());
          },
          "The gradients' global L2 norm before clipping (None unless clip_grad_norm or grad_norm)")
      .def_readonly("micro_batches", &StepResult::micro_batches,
                    "Micro-batches of the step (accumulate)")
      .def_readonly("optimizer_step", &StepResult::optimizer_step,
                    "Optimizer steps taken after this one (the schedule's position)")
      .def_property_readonly(
          "host_peak_allocated",
          [](const StepResult& r) -> pb::object {
            return r.host_predicted ? pb::cast(r.host_memory.allocated.peak) : pb::none();
          },
          "Under a plan that uses the host tier (offload): its peak of allocated bytes, else None")
      .def_property_readonly("host_peak_reserved",
                             [](const StepResult& r) -> pb::object {
                               return r.host_predicted ? pb::cast(r.host_memory.reserved.peak)
                                                       : pb::none();
                             })
      .def_property_readonly(
          "exact", [](const StepResult& r) { return r.exact(); },
          "A step under a plan at its own limit whose peaks, device and host tier, were the "
          "predicted ones")
      .def("__repr__", [](const StepResult& r) {
        return "regen.StepResult(loss " + std::to_string(r.loss) + ", " + format_ms(r.ms) +
               ", peak allocated " + format_bytes(r.memory.allocated.peak) + ", reserved " +
               format_bytes(r.memory.reserved.peak) + ")";
      });

  pb::class_<PyModel>(m, "Model", R"doc(
A registered model (regen.models()) with its optimizer, data and trainer: the library's session, as
``regen train`` builds it: ``Model("resnet-tiny", batch=4, device="cpu", lr=0.05)``. Options (None:
the preset's or the session's default): the session's optimizer ('sgd' or 'adamw'), lr, momentum,
weight_decay, seed, threads (at most 1024; 0: OpenMP's), data ('', or one of the model's data kinds:
regen.model_input(name)), conv, math ('fp32' or 'tf32'), tf32, precision ('fp32', 'tf32', 'bf16' or
'fp16': bf16 and fp16 train as PyTorch's autocast, fp16 with a dynamic loss scale), masks (packed
saves, default True),
compress ('none', 'bf16' or 'fp16': lossy, steps under a plan hold retained activations narrow),
cuda_graph ('off', 'on' or 'auto': the steps under a plan with layout='planned' as one replayed
CUDA graph, as --cuda-graph);
the training loop's accumulate (micro-batches per step), lr_schedule, warmup_steps, schedule_steps,
lr_step_size, lr_gamma, lr_min, clip_grad_norm, grad_norm, eval_every, eval_batches, eval_batch,
eval_split (as regen train's flags); data parallelism's shard and bucket_size (under mpirun); and
the model's own
(regen.model_options(name)): image_size and num_classes for the ResNets, seq_len, vocab, dropout,
lm_head_chunk and lm_head_recompute for the Transformers. Every value is checked as the command line
checks its flags, with the keyword in the message ("threads=5000: must be at most 1024"). The first
step runs dry before the model is built: a batch too large for the device's memory is refused. Use
one model at a time for exact memory figures: another live model's tensors count in the allocator's
peaks.)doc")
      .def(pb::init([](const std::string& name, const pb::object& batch, const std::string& device,
                       const pb::kwargs& kw) {
             return std::make_unique<PyModel>(name, batch, device, kw);
           }),
           pb::arg("name") = "resnet-tiny", pb::arg("batch") = 4, pb::arg("device") = "auto")
      .def_property_readonly("name", [](PyModel& s) { return s.options().model; })
      .def_property_readonly("batch", [](PyModel& s) { return s.options().batch; })
      .def_property_readonly("device", [](PyModel& s) { return s.session().device.str(); })
      .def_property_readonly(
          "config", [](PyModel& s) { return config_dict(s.session().config); },
          "The model's configuration (the preset with the overrides)")
      .def_property_readonly("num_parameters",
                             [](PyModel& s) { return s.session().model->num_parameters(); })
      .def_property_readonly(
          "steps_done", [](PyModel& s) { return s.pipe().steps_done(); },
          "Training steps run so far, profiling steps included")
      .def_property_readonly(
          "optimizer_steps", [](PyModel& s) { return s.session().trainer->optimizer_steps(); },
          "Optimizer steps taken (the schedule's position), resumed ones included")
      .def_property_readonly(
          "first_step_peak", [](PyModel& s) { return s.session().preflight.memory.allocated.peak; },
          "The dry run's peak of allocated bytes of the first step without remat: the real "
          "first step's, the kernels' scratch included, on the CPU and on a GPU")
      .def_property_readonly(
          "profile_in_use",
          [](PyModel& s) -> pb::object { return s.profile() ? pb::cast(s.profile()) : pb::none(); },
          "The Profile the model plans with, or None")
      .def_property_readonly(
          "plan_in_use",
          [](PyModel& s) -> pb::object { return s.plan() ? pb::cast(s.plan()) : pb::none(); },
          "The Plan the steps run under, or None")
      .def_property_readonly(
          "executor",
          [](PyModel& s) -> pb::object {
            const RematExecutor* e = s.pipe().executor();
            if (e == nullptr) return pb::none();
            pb::dict d;
            d["replays"] = e->replays();
            d["evictions"] = e->evictions();
            d["regen_ms"] = e->regen_ms();
            d["offloads"] = e->offload().offloads;
            d["bytes_to_host"] = e->offload().bytes_to_host;
            d["bytes_to_device"] = e->offload().bytes_to_device;
            d["stall_ms"] = e->offload().stall_ms;
            return d;
          },
          "Under a plan: the last step's evictions, replays and regeneration time, and its "
          "offloads (tensors, bytes copied each way, time waited for copies), else None")
      .def(
          "step", [](PyModel& s) { return s.train(1, pb::none()).front(); },
          "One training step (under the plan in use); returns a StepResult")
      .def(
          "train",
          [](PyModel& s, const pb::object& steps_arg, const pb::object& policy,
             const pb::object& budget, const std::string& chain, const std::string& budget_of,
             const std::string& layout, const pb::object& plan, const pb::object& profile_steps_arg,
             const pb::object& progress, const std::string& offload, const std::string& transfer,
             const std::string& log, const pb::kwargs& kw) {
            // Everything checked before the first step (profiling steps train too), as the
            // command line checks its flags before it starts.
            const int64_t steps = int_arg("train", "steps", steps_arg, OptionRange::integers(1));
            const int profile_steps = static_cast<int>(
                int_arg("train", "profile_steps", profile_steps_arg,
                        OptionRange::integers(1, std::numeric_limits<int>::max())));
            check_planning_arguments(s, policy, budget, chain, budget_of, layout, plan, offload,
                                     transfer);
            REGEN_CHECK(progress.is_none() || PyCallable_Check(progress.ptr()),
                        "train: progress must be a function progress(step, result) or None, got "
                        "type '",
                        type_name_of(progress), "'");
            if (!log.empty()) {
              // A transfer model read from a file (regen bench copy --json) is an input too.
              std::vector<NamedFile> reads;
              if (transfer != "profile" && transfer.rfind("step:", 0) != 0 &&
                  transfer.rfind("gbps:", 0) != 0) {
                reads.push_back({"transfer=" + path_text(transfer), transfer});
              }
              s.check_log(log, reads);
            }
            s.set_training_options(kw);
            std::unique_ptr<MetricsLog> metrics;
            if (!plan.is_none()) {
              s.install(plan.cast<std::shared_ptr<PlanHandle>>());
            } else if (!policy.is_none()) {
              const std::string name = policy.cast<std::string>();
              // With compress, 'none' still plans: the plan holds what it retains narrow.
              if (name == "none" && budget.is_none() && s.options().compress == "none") {
                s.clear_plan();
              } else {
                if (!s.profile()) {
                  // The profiling steps train: the log keeps them, as regen train's does.
                  if (!log.empty()) metrics = s.open_log(log);
                  s.run_profile(profile_steps, 0, "sync", metrics.get(), log);
                }
                s.make(name, budget, chain, budget_of, layout, offload, transfer);
              }
            }
            return s.train(steps, progress, log, std::move(metrics));
          },
          pb::arg("steps") = 1, pb::kw_only(), pb::arg("policy") = pb::none(),
          pb::arg("budget") = pb::none(), pb::arg("chain") = "auto",
          pb::arg("budget_of") = "reserved", pb::arg("layout") = "caching",
          pb::arg("plan") = pb::none(), pb::arg("profile_steps") = 2,
          pb::arg("progress") = pb::none(), pb::arg("offload") = "none",
          pb::arg("transfer") = "profile", pb::arg("log") = "", R"doc(
``steps`` training steps; returns their StepResults. With ``policy`` (and ``budget``, ``chain``,
``budget_of``, ``layout``, ``offload``, ``transfer``: regen.plan's): the model is profiled first if it has no profile (``profile_steps``
steps, which train too), planned, and every step runs under the plan; ``policy='none'`` drops the
plan (with ``compress``, it plans none: the activations it retains are held narrow). With ``plan``: under that Plan (made for this model's configuration, e.g. by make_plan).
Without either: under the plan in use, if any. A plan that does not fit its budget is refused
before the first step. ``progress(step, result)`` is called after each step; returning False
stops; it may save and evaluate, not change the step under way (plan, train, ...). A loss, parameter
or gradient that is not finite raises regen.Error. Every argument is checked before the first step:
counts in the command line's ranges, and planning keywords (budget, chain, budget_of, layout,
offload, transfer) are refused where they would be ignored (no policy, policy='none', or plan=).

The training loop's keywords, checked as the Model's (SessionOptions): ``lr_schedule`` ('constant',
'step', 'cosine'), ``warmup_steps``, ``schedule_steps`` (cosine's horizon), ``lr_step_size``,
``lr_gamma``, ``lr_min``, ``clip_grad_norm``, ``eval_every`` (evaluate on the held-out split every N
optimizer steps and after the last one: Model.evaluations), ``eval_batches``, ``eval_batch``; they
stay set for later calls. ``accumulate``, ``eval_split`` and ``grad_norm`` are set when the Model is
built. ``log``: a metrics file (.csv, or JSON lines), appended to once the model has trained.)doc")
      .def(
          "evaluate",
          [](PyModel& s, const pb::object& batches, const pb::object& batch) {
            return eval_dict(s.evaluate(batches, batch));
          },
          pb::kw_only(), pb::arg("batches") = pb::none(), pb::arg("batch") = pb::none(), R"doc(
Evaluates on the held-out split of the Model's data (CIFAR-10's test_batch.bin, the last part of a
text file, synthetic examples no training step draws) in eval mode, without the tape or saved
tensors: a dict with loss (mean per target), accuracy (image classifiers) or perplexity (language
models), examples, targets, batches, ms, and the allocator's peak_allocated and peak_reserved over
it with persistent, the model's state when it started. ``batches`` (default: eval_batches, 0 the
whole split) and ``batch`` (default: eval_batch, else batch x accumulate). A Model built without
eval_every or eval_split trains on the whole of a text file, whose tail it then evaluates on.)doc")
      .def_property_readonly(
          "evaluations",
          [](PyModel& s) {
            pb::list out;
            for (const auto& [step, e] : s.evaluations()) {
              pb::dict d = eval_dict(e);
              d["step"] = step;
              out.append(d);
            }
            return out;
          },
          "The evaluations of the last train() call (eval_every), each a dict with its step")
      .def(
          "save_state",
          [](PyModel& s, const std::string& path) {
            const std::string call = "save_state(" + path_text(path) + ")";
            s.check_output(PyModel::Role::save_state, call, path);
            // Before the first step the optimizer has no state yet: made now (zeroed, with no
            // update counted, as the first step makes it), so the file holds every tensor resume()
            // reads and a state at step 0 resumes like any other.
            s.session().trainer->prepare();
            save_training_state(s.session(), path,
                                s.plan() ? plan_identity(s.plan()->plan)
                                         : std::map<std::string, std::string>{{"plan", "no plan"}});
            s.note(PyModel::Role::save_state, call, path);
          },
          pb::arg("path"), R"doc(
Writes the training state (safetensors, atomically): weights, optimizer state, optimizer step, RNG
and data position, the options that shape the trajectory and the plan's identity. resume() on a
Model built with the same options continues it bitwise (as ``regen train --save-state``), also from
a state saved before the first step. Refused over a file the Model reads (its data, a loaded
checkpoint) or wrote otherwise (a log, a checkpoint), or that another live Model reads; the state
it resumed may be replaced. Under mpirun every rank calls it: a file per rank (rank 0's at
``path``, rank r's at ``path.rank<r>-of-<N>.a`` or ``.b``), all written or none
(docs/distributed.md).)doc")
      .def(
          "resume",
          [](PyModel& s, const std::string& path) {
            s.check_idle("resume");
            pb::dict d;
            for (const auto& [k, v] : resume_training_state(s.session(), path)) d[pb::str(k)] = v;
            s.note(PyModel::Role::resume, "resume(" + path_text(path) + ")", path);
            return d;
          },
          pb::arg("path"), R"doc(
Restores a training state written by save_state() or ``regen train --save-state`` into this Model,
which must have been built with the same trajectory options (refused otherwise, naming the
keyword); returns the file's metadata. Under mpirun every rank calls it and reads its own file;
refused on every rank when the rank count or the shard mode is not the saved one.)doc")
      .def(
          "profile",
          [](PyModel& s, const pb::object& iterations, const pb::object& warmup,
             const std::string& op_timing) {
            const auto [i, w] = profile_counts(iterations, warmup);
            return s.run_profile(i, w, op_timing);
          },
          pb::arg("iterations") = 2, pb::arg("warmup") = 0, pb::arg("op_timing") = "sync",
          "Profiles ``iterations`` instrumented steps (after ``warmup`` plain ones; all of them "
          "train) and returns the Profile, which the model then plans with. ``op_timing`` "
          "'sync' or 'device' (regen profile --op-timing)")
      .def("use_profile", &PyModel::use_profile, pb::arg("profile"),
           "Plans with a profile made earlier; refused when it was made for another model, batch, "
           "device or settings")
      .def("plan", &PyModel::make, pb::arg("policy"), pb::arg("budget") = pb::none(), pb::kw_only(),
           pb::arg("chain") = "auto", pb::arg("budget_of") = "reserved",
           pb::arg("layout") = "caching", pb::arg("offload") = "none",
           pb::arg("transfer") = "profile",
           "Plans with the model's profile (regen.plan's arguments) and runs the next steps under "
           "it")
      .def(
          "use_plan", [](PyModel& s, const std::shared_ptr<PlanHandle>& h) { s.install(h); },
          pb::arg("plan"), "Runs the next steps under ``plan`` (its profile becomes the model's)")
      .def("clear_plan", &PyModel::clear_plan, "The next steps run without remat")
      .def(
          "set_limit",
          [](PyModel& s, const pb::object& limit) {
            // Bytes (0: none), or None: the plan's again.
            s.check_idle("set_limit");
            const int64_t v = limit.is_none()
                                  ? -1
                                  : int_arg("set_limit", "limit", limit, OptionRange::integers(0));
            // Without a plan the steps run under no limit at all: a limit set then would be
            // ignored by every step until a plan comes, so it is refused.
            REGEN_CHECK(s.pipe().has_plan(),
                        "set_limit: the limit replaces a plan's, and the Model has no plan: its "
                        "steps run under no limit (call use_plan(), plan() or train(policy=...) "
                        "first)");
            s.pipe().set_limit(v);
          },
          pb::arg("limit"),
          "Under a plan: the allocator's hard limit on reserved bytes the steps run under instead "
          "of "
          "the plan's (0: none; None: the plan's again), to run a plan under a tighter limit than "
          "it "
          "was made for (simulate(..., limit=) predicts what happens)")
      .def(
          "parameters",
          [](PyModel& s) {
            pb::dict d;
            for (const auto& [name, t] : s.session().model->named_parameters())
              d[pb::str(name)] = t;
            return d;
          },
          "name -> Tensor, the live parameters (np.asarray(t) is a view on the CPU)")
      .def(
          "state_dict",
          [](PyModel& s) {
            pb::dict d;
            for (const auto& [name, t] : s.session().model->state_dict())
              d[pb::str(name)] = tensor_to_numpy(t);
            return d;
          },
          "name -> numpy array (a copy), parameters and buffers with torch.nn's names")
      .def(
          "load_state_dict",
          [](PyModel& s, const pb::dict& state, bool strict) {
            s.check_idle("load_state_dict");
            NamedTensors list;
            for (const auto& [k, v] : state) {
              REGEN_CHECK(pb::isinstance<pb::str>(k),
                          "load_state_dict: the keys must be names (str)");
              const std::string name = k.cast<std::string>();
              list.emplace_back(name, tensor_from_numpy(v, "load_state_dict: '" + name + "'"));
            }
            // As a checkpoint's (--load, load): a weight that is not finite would train into NaN.
            const std::string bad = first_non_finite(list);
            REGEN_CHECK(bad.empty(), "load_state_dict: ", bad, " (weights must be finite)");
            s.session().model->load_state_dict(list, strict);
          },
          pb::arg("state"), pb::arg("strict") = true,
          "Copies arrays into the parameters and buffers; shapes and dtypes must match, values "
          "must be finite, and with strict every name both ways")
      .def(
          "save",
          [](PyModel& s, const std::string& path) {
            const std::string call = "save(" + path_text(path) + ")";
            s.check_output(PyModel::Role::save, call, path);
            if (is_llmc_checkpoint_path(path)) {
              save_llmc_checkpoint(*s.session().model, path);
            } else {
              save_checkpoint(s.session(), path, s.pipe().steps_done());
            }
            s.note(PyModel::Role::save, call, path);
          },
          pb::arg("path"),
          "Writes a checkpoint (safetensors, as `regen train --save`; a GPT-2 to a .bin path as an "
          "llm.c checkpoint), atomically; refused over a file in use (the data, a log, a training "
          "state; the loaded checkpoint may be replaced)")
      .def(
          "load",
          [](PyModel& s, const std::string& path) {
            s.check_idle("load");
            size_t n = 0;
            if (is_llmc_checkpoint_path(path)) {
              load_llmc_checkpoint(*s.session().model, path);
              n = s.session().model->named_parameters().size();
            } else {
              n = load_checkpoint(s.session(), path);
            }
            s.note(PyModel::Role::load, "load(" + path_text(path) + ")", path);
            return n;
          },
          pb::arg("path"),
          "Loads a checkpoint saved from this model's configuration (a GPT-2 also from an llm.c "
          "checkpoint, a .bin path); returns the tensor count")
      .def("__repr__", [](PyModel& s) {
        return "regen.Model(" + s.options().model + ", batch " + std::to_string(s.options().batch) +
               " on " + s.session().device.str() + ", " +
               std::to_string(s.session().model->num_parameters()) + " parameters)";
      });

  m.def(
      "models",
      [] {
        pb::dict out;  // in registration order: the built-in ones first
        for (const std::string& n : model_preset_names()) out[pb::str(n)] = model_info(n).help;
        return out;
      },
      "The registered models: name -> one line of help");

  m.def(
      "profile",
      [](const pb::object& model, const pb::object& batch, const std::string& device,
         const pb::object& iterations_arg, const pb::object& warmup_arg,
         const std::string& op_timing, const pb::kwargs& kw) {
        const auto [iterations, warmup] = profile_counts(iterations_arg, warmup_arg);
        if (pb::isinstance<PyModel>(model)) {
          REGEN_CHECK(kw.size() == 0,
                      "profile: model options go to the Model, not to profile() of one");
          return model.cast<PyModel&>().run_profile(iterations, warmup, op_timing);
        }
        REGEN_CHECK(pb::isinstance<pb::str>(model),
                    "profile: model must be a registered model's name or a Model");
        PyModel built(model.cast<std::string>(), batch, device, kw);
        return built.run_profile(iterations, warmup, op_timing);
      },
      pb::arg("model"), pb::arg("batch") = 4, pb::arg("device") = "auto", pb::kw_only(),
      pb::arg("iterations") = 2, pb::arg("warmup") = 0, pb::arg("op_timing") = "sync", R"doc(
Stage 1: builds the model (a name and Model options, or an existing Model) and profiles
``iterations`` training steps; returns the Profile. ``op_timing``: 'sync' (the device waited for
at every op boundary) or 'device' (points on the device's own clock: CUDA events, no waits), as
regen profile --op-timing.)doc");

  m.def(
      "estimate",
      [](const std::string& model, const pb::object& batch_arg, const std::string& policy,
         bool compare, const pb::kwargs& kw) {
        // Checked as Model's options are ("batch=0: must be a positive integer").
        SessionOptions f = options_from(model, batch_arg, "cpu", kw);
        // The training loop's options (train's keywords, and how a run splits its batch, holds
        // out data or replays its steps) change nothing of one step's memory: refused, as regen
        // estimate has no flags for them.
        const std::vector<std::string>& loop = train_keywords();
        for (const auto& [k, v] : kw) {
          const std::string key = pb::str(k);
          const bool training = std::find(loop.begin(), loop.end(), key) != loop.end() ||
                                key == "accumulate" || key == "eval_split" || key == "cuda_graph";
          REGEN_CHECK(!training, "estimate: ", key,
                      "= applies to training, not to the memory of one step (regen estimate "
                      "takes no such option)");
        }
        const int64_t batch = f.batch;
        f.validate();
        const ModelConfig c = f.model_config();
        EstimateOptions o;
        o.optimizer = f.optimizer;
        o.momentum = f.momentum;
        o.masks = f.masks;
        o.policy = parse_estimate_policy(policy);
        // As regen estimate: a mixed precision from its dry run only, what it cannot count
        // refused.
        try {
          o.precision = estimate_precision(f, compare);
        } catch (const Error& e) {
          REGEN_FAIL("estimate: ", e.message());
        }
        const bool closed = !is_mixed(o.precision);
        auto as_dict = [](const MemoryTerms& t, bool measured) {
          pb::dict d;
          d["parameters"] = t.parameters;
          d["gradients"] = t.gradients;
          d["optimizer_state"] = t.optimizer_state;
          d["inputs"] = t.inputs;
          d["activations"] = t.activations;
          d["backward"] = t.backward;
          d["peak"] = t.peak;
          if (measured) {
            d["peak_allocated"] = t.peak_allocated;
            d["scratch_at_peak"] = t.scratch_at_peak;
          }
          return d;
        };
        pb::dict out = closed ? as_dict(estimate_memory(c, batch, o), false) : pb::dict();
        if (compare)
          out["exact"] = as_dict(measure_memory_terms(dry_profile(c, batch, o), o.policy), true);
        return out;
      },
      pb::arg("model"), pb::arg("batch") = 4, pb::kw_only(), pb::arg("policy") = "none",
      pb::arg("compare") = false, R"doc(
The closed-form memory of one training step of a ResNet or Transformer preset (regen estimate),
with no run: a dict of bytes by term (parameters, gradients, optimizer_state, inputs, activations
saved for backward, backward, peak). ``policy`` 'none' or 'blocks' (every block checkpointed).
Model options as Model takes them (image_size, seq_len, optimizer, momentum, ...). With
``compare``, 'exact' holds the same terms from a dry run of the step (shapes only, no kernels) and
its peak of allocated bytes. A mixed precision (``precision='bf16'`` or ``'fp16'``) needs ``compare``,
and the dict then holds 'exact' alone (the closed forms count an fp32 step).)doc");
}

}  // namespace regen::py
