// regen.Model: a registered model built by name with overrides, with its optimizer, data and
// trainer made exactly as `regen train` makes them (tools/common.h make_session, the same flags
// and checks), and a RematPipeline to profile, plan and train under a plan. State dicts cross as
// numpy arrays; checkpoints are `regen train --save` files.
#include <algorithm>
#include <cmath>
#include <limits>

#include "python/bindings.h"
#include "regen/remat/pipeline.h"
#include "tools/common.h"

namespace regen::py {
namespace {

// The keyword options a Model takes besides name, batch and device, as the command line's flags.
const std::vector<std::string>& option_names() {
  static const std::vector<std::string> names = {
      "image_size",    "num_classes", "seq_len", "vocab",    "dropout",
      "lm_head_chunk", "optimizer",   "lr",      "momentum", "weight_decay",
      "seed",          "threads",     "data",    "conv",     "tf32"};
  return names;
}

template <class T>
void take(const pb::dict& kw, const char* key, T& out) {
  if (!kw.contains(key)) return;
  const pb::handle v = kw[key];
  if (v.is_none()) return;
  try {
    if constexpr (std::is_same_v<T, bool>) {
      REGEN_CHECK(pb::isinstance<pb::bool_>(v), key, " must be True or False");
      out = v.cast<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      // int and numpy integers; not bool, not float.
      REGEN_CHECK(PyIndex_Check(v.ptr()) && !pb::isinstance<pb::bool_>(v), key,
                  " must be an integer, got ", pb::str(pb::repr(v)).cast<std::string>());
      const int64_t x = pb::int_(pb::reinterpret_borrow<pb::object>(v)).cast<int64_t>();
      REGEN_CHECK(x >= 0 || std::is_signed_v<T>, key, " must be >= 0, got ", x);
      bool in_range = true;
      if constexpr (sizeof(T) < sizeof(int64_t)) {
        in_range = x >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                   x <= static_cast<int64_t>(std::numeric_limits<T>::max());
      }
      REGEN_CHECK(in_range, key, " is out of range: ", x);
      out = static_cast<T>(x);
    } else if constexpr (std::is_floating_point_v<T>) {
      REGEN_CHECK((pb::isinstance<pb::float_>(v) || pb::isinstance<pb::int_>(v)) &&
                      !pb::isinstance<pb::bool_>(v),
                  key, " must be a number, got ", pb::str(pb::repr(v)).cast<std::string>());
      out = v.cast<T>();
    } else {
      REGEN_CHECK(pb::isinstance<pb::str>(v), key, " must be a str, got ",
                  pb::str(pb::repr(v)).cast<std::string>());
      out = v.cast<T>();
    }
  } catch (const pb::cast_error&) {
    REGEN_FAIL(key, " is out of range: ", pb::str(pb::repr(v)).cast<std::string>());
  }
}

tool::ModelFlags flags_from(const std::string& name, int64_t batch, const std::string& device,
                            const pb::dict& kw) {
  for (const auto& [k, v] : kw) {
    const std::string key = pb::str(k);
    const auto& names = option_names();
    REGEN_CHECK(std::find(names.begin(), names.end(), key) != names.end(), "unknown model option '",
                key, "'; the options are ", join_names(names));
  }
  tool::ModelFlags f;
  f.model = name;
  f.batch = batch;
  f.device = device;
  take(kw, "image_size", f.image_size);
  take(kw, "num_classes", f.num_classes);
  take(kw, "seq_len", f.seq_len);
  take(kw, "vocab", f.vocab);
  take(kw, "dropout", f.dropout);
  take(kw, "lm_head_chunk", f.lm_head_chunk);
  take(kw, "optimizer", f.optimizer);
  take(kw, "lr", f.lr);
  take(kw, "momentum", f.momentum);
  take(kw, "weight_decay", f.weight_decay);
  take(kw, "seed", f.seed);
  take(kw, "threads", f.threads);
  take(kw, "data", f.data);
  take(kw, "conv", f.conv);
  take(kw, "tf32", f.tf32);
  return f;
}

pb::dict config_dict(const ModelConfig& c) {
  pb::dict d;
  d["name"] = c.name;
  d["family"] = c.family == ModelFamily::resnet ? "resnet" : "transformer";
  if (c.family == ModelFamily::resnet) {
    d["blocks"] = c.blocks;
    d["bottleneck"] = c.bottleneck;
    d["base_width"] = c.base_width;
    d["num_classes"] = c.num_classes;
    d["image_size"] = c.image_size;
  } else {
    d["vocab"] = c.vocab;
    d["seq_len"] = c.seq_len;
    d["d_model"] = c.d_model;
    d["layers"] = c.layers;
    d["heads"] = c.heads;
    d["ff"] = c.ff;
    d["dropout"] = c.dropout;
    d["causal"] = c.causal;
    d["gelu"] = c.gelu;
    d["lm_head_chunk"] = c.head_chunk_rows;
  }
  d["seed"] = c.seed;
  return d;
}

}  // namespace

class PyModel {
 public:
  PyModel(const std::string& name, int64_t batch, const std::string& device, const pb::dict& kw)
      : flags_(flags_from(name, batch, device, kw)) {
    REGEN_CHECK(batch > 0, "batch must be a positive integer, got ", batch);
    // Every model starts from the same allocator state, so a profile made by one predicts the
    // steps of another of the same configuration to the byte (while no other model is alive).
    allocator_for(tool::resolve_device(flags_.device)).empty_cache();
    session_ = tool::make_session(flags_, batch);
    pipe_ = std::make_unique<RematPipeline>(*session_->trainer);
  }

  const tool::ModelFlags& flags() const { return flags_; }
  tool::Session& session() { return *session_; }
  RematPipeline& pipe() { return *pipe_; }
  const ProfilePtr& profile() const { return profile_; }
  const std::shared_ptr<PlanHandle>& plan() const { return plan_; }

  ProfilePtr run_profile(int iterations, int warmup) {
    REGEN_CHECK(iterations >= 1, "profile: iterations must be >= 1, got ", iterations);
    REGEN_CHECK(warmup >= 0, "profile: warmup must be >= 0, got ", warmup);
    ProfileOptions po;
    po.warmup = warmup;
    po.iterations = iterations;
    po.model_name = flags_.model;
    po.run = tool::run_flags(flags_);
    plan_.reset();
    profile_ = make_profile_handle(pipe_->profile(po));
    return profile_;
  }

  void use_profile(const ProfilePtr& p) {
    REGEN_CHECK(p != nullptr, "use_profile: profile is None");
    if (p == profile_) return;
    tool::check_profile_run(p->profile, flags_, "the profile");
    plan_.reset();
    pipe_->use_profile(p->profile);  // refuses another model, batch or device
    profile_ = p;
  }

  std::shared_ptr<PlanHandle> make(const std::string& policy, const pb::object& budget,
                                   const std::string& chain, const std::string& budget_of,
                                   const std::string& layout) {
    REGEN_CHECK(profile_ != nullptr,
                "plan: the model has no profile; call profile() or use_profile() first");
    const PlanOptions o = plan_options(chain, budget_of, layout);
    auto h = std::make_shared<PlanHandle>(
        PlanHandle{make_plan(profile_->sim, policy, budget_from(budget), o), profile_});
    install(h);
    return h;
  }

  void install(const std::shared_ptr<PlanHandle>& h) {
    REGEN_CHECK(h != nullptr, "use_plan: plan is None");
    use_profile(h->profile);
    pipe_->use_plan(h->plan);
    plan_ = h;
  }

  void clear_plan() {
    pipe_->clear_plan();
    plan_.reset();
  }

  // Steps under the installed plan (none: without remat). A plan that does not fit its budget is
  // refused before the first step, as `regen train` refuses it.
  std::vector<StepResult> train(int64_t steps, const pb::object& progress) {
    REGEN_CHECK(steps >= 1, "train: steps must be >= 1, got ", steps);
    if (plan_) {
      const Plan& p = plan_->plan;
      REGEN_CHECK(p.feasible,
                  "the plan does not fit its budget, so training stops before it starts: ", p.note,
                  p.predicted.oom ? "; under the limit the simulated step runs out of memory at " +
                                        p.predicted.oom_at
                                  : std::string(),
                  ". Use a larger budget, another policy, or budget_of='allocated'");
    }
    // The plan's hooks, allocator limit and layout come off when the call returns or raises: the
    // model lives on in Python, and another model's steps must not run under this one's limit.
    struct Finish {
      RematPipeline& pipe;
      ~Finish() { pipe.finish(); }
    } finish{*pipe_};
    std::vector<StepResult> out;
    for (int64_t i = 1; i <= steps; ++i) {
      StepResult r = pipe_->step();
      REGEN_CHECK(std::isfinite(r.loss), "training diverged: the loss of step ", i, " is ", r.loss,
                  " (not finite); try a lower lr (this model uses ", flags_.lr, ")");
      out.push_back(r);
      bool stop = i == steps;
      if (!progress.is_none()) {
        pb::object keep = progress(i, r);
        stop = stop || (!keep.is_none() && !keep.cast<bool>());
      }
      if (stop) {
        // A parameter or gradient can stop being finite while the loss still is: read them after
        // the last step, so a model that is not finite is never handed back as trained.
        const std::string bad = tool::first_non_finite(*session_->model);
        REGEN_CHECK(bad.empty(), "training diverged: after step ", i, " the ", bad,
                    " (not finite); try a "
                    "lower lr (this model uses ",
                    flags_.lr, ")");
        break;
      }
      if (PyErr_CheckSignals() != 0) throw pb::error_already_set();
    }
    return out;
  }

 private:
  tool::ModelFlags flags_;
  std::unique_ptr<tool::Session> session_;
  std::unique_ptr<RematPipeline> pipe_;  // after session_: destroyed first
  ProfilePtr profile_;
  std::shared_ptr<PlanHandle> plan_;
};

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
      .def("__repr__", [](const StepResult& r) {
        return "regen.StepResult(loss " + std::to_string(r.loss) + ", " + tool::format_ms(r.ms) +
               ", peak allocated " + format_bytes(r.memory.allocated.peak) + ", reserved " +
               format_bytes(r.memory.reserved.peak) + ")";
      });

  pb::class_<PyModel>(m, "Model", R"doc(
A registered model (regen.models()) with its optimizer, data and trainer, built as ``regen train``
builds them: ``Model("resnet-tiny", batch=4, device="cpu", lr=0.05)``. Options (None: the preset's
or the command line's default): image_size, num_classes, seq_len, vocab, dropout, lm_head_chunk,
optimizer ('sgd' or 'adamw'), lr, momentum, weight_decay, seed, threads, data ('', 'synthetic',
'cifar10:DIR', 'text:FILE'), conv, tf32. The first step runs dry before the model is built: a batch
too large for the device's memory is refused. Use one model at a time for exact memory figures:
another live model's tensors count in the allocator's peaks.)doc")
      .def(pb::init([](const std::string& name, int64_t batch, const std::string& device,
                       const pb::kwargs& kw) {
             return std::make_unique<PyModel>(name, batch, device, kw);
           }),
           pb::arg("name") = "resnet-tiny", pb::arg("batch") = 4, pb::arg("device") = "auto")
      .def_property_readonly("name", [](PyModel& s) { return s.flags().model; })
      .def_property_readonly("batch", [](PyModel& s) { return s.flags().batch; })
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
          "first_step_peak", [](PyModel& s) { return s.session().preflight.memory.allocated.peak; },
          "The dry run's peak of allocated bytes of the first step without remat: exact on the "
          "CPU, a lower "
          "bound by the CUDA kernels' scratch on a GPU")
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
            d["regen_ms"] = e->regen_ms();
            return d;
          },
          "Under a plan: the last step's replays and regeneration time, else None")
      .def(
          "step", [](PyModel& s) { return s.train(1, pb::none()).front(); },
          "One training step (under the plan in use); returns a StepResult")
      .def(
          "train",
          [](PyModel& s, int64_t steps, const pb::object& policy, const pb::object& budget,
             const std::string& chain, const std::string& budget_of, const std::string& layout,
             const pb::object& plan, int profile_steps, const pb::object& progress) {
            if (!plan.is_none()) {
              REGEN_CHECK(policy.is_none(), "train: give a plan or a policy, not both");
              s.install(plan.cast<std::shared_ptr<PlanHandle>>());
            } else if (!policy.is_none()) {
              const std::string name = policy.cast<std::string>();
              if (name == "none" && budget.is_none()) {
                s.clear_plan();
              } else {
                if (!s.profile()) s.run_profile(profile_steps, 0);
                s.make(name, budget, chain, budget_of, layout);
              }
            } else {
              REGEN_CHECK(budget.is_none(), "train: a budget needs a policy (regen.policies())");
            }
            return s.train(steps, progress);
          },
          pb::arg("steps") = 1, pb::kw_only(), pb::arg("policy") = pb::none(),
          pb::arg("budget") = pb::none(), pb::arg("chain") = "auto",
          pb::arg("budget_of") = "reserved", pb::arg("layout") = "caching",
          pb::arg("plan") = pb::none(), pb::arg("profile_steps") = 2,
          pb::arg("progress") = pb::none(), R"doc(
``steps`` training steps; returns their StepResults. With ``policy`` (and ``budget``, ``chain``,
``budget_of``, ``layout``): the model is profiled first if it has no profile (``profile_steps``
steps, which train too), planned, and every step runs under the plan; ``policy='none'`` drops the
plan. With ``plan``: under that Plan (made for this model's configuration, e.g. by make_plan).
Without either: under the plan in use, if any. A plan that does not fit its budget is refused
before the first step. ``progress(step, result)`` is called after each step; returning False
stops. A loss, parameter or gradient that is not finite raises regen.Error.)doc")
      .def("profile", &PyModel::run_profile, pb::arg("iterations") = 2, pb::arg("warmup") = 0,
           "Profiles ``iterations`` instrumented steps (after ``warmup`` plain ones; all of them "
           "train) "
           "and returns the Profile, which the model then plans with")
      .def("use_profile", &PyModel::use_profile, pb::arg("profile"),
           "Plans with a profile made earlier; refused when it was made for another model, batch, "
           "device or settings")
      .def("plan", &PyModel::make, pb::arg("policy"), pb::arg("budget") = pb::none(), pb::kw_only(),
           pb::arg("chain") = "auto", pb::arg("budget_of") = "reserved",
           pb::arg("layout") = "caching",
           "Plans with the model's profile (regen.plan's arguments) and runs the next steps under "
           "it")
      .def(
          "use_plan", [](PyModel& s, const std::shared_ptr<PlanHandle>& h) { s.install(h); },
          pb::arg("plan"), "Runs the next steps under ``plan`` (its profile becomes the model's)")
      .def("clear_plan", &PyModel::clear_plan, "The next steps run without remat")
      .def(
          "set_limit",
          [](PyModel& s, const pb::object& limit) {
            int64_t v = -1;
            if (!limit.is_none()) {
              REGEN_CHECK(pb::isinstance<pb::int_>(limit) && !pb::isinstance<pb::bool_>(limit),
                          "set_limit: limit must be a number of bytes (int) or None");
              v = limit.cast<int64_t>();
              REGEN_CHECK(v >= 0, "set_limit: limit must be >= 0 bytes (0: none), got ", v);
            }
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
            NamedTensors list;
            for (const auto& [k, v] : state) {
              REGEN_CHECK(pb::isinstance<pb::str>(k),
                          "load_state_dict: the keys must be names (str)");
              const std::string name = k.cast<std::string>();
              list.emplace_back(name, tensor_from_numpy(v, "load_state_dict: '" + name + "'"));
            }
            s.session().model->load_state_dict(list, strict);
          },
          pb::arg("state"), pb::arg("strict") = true,
          "Copies arrays into the parameters and buffers; shapes and dtypes must match, and with "
          "strict "
          "every name both ways")
      .def(
          "save",
          [](PyModel& s, const std::string& path) {
            tool::save_checkpoint(s.session(), path, s.pipe().steps_done());
          },
          pb::arg("path"), "Writes a checkpoint (safetensors, as `regen train --save`), atomically")
      .def(
          "load",
          [](PyModel& s, const std::string& path) {
            return tool::load_checkpoint(s.session(), path);
          },
          pb::arg("path"),
          "Loads a checkpoint saved from this model's configuration; returns the tensor count")
      .def("__repr__", [](PyModel& s) {
        return "regen.Model(" + s.flags().model + ", batch " + std::to_string(s.flags().batch) +
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
      [](const pb::object& model, int64_t batch, const std::string& device, int iterations,
         int warmup, const pb::kwargs& kw) {
        if (pb::isinstance<PyModel>(model)) {
          REGEN_CHECK(kw.size() == 0,
                      "profile: model options go to the Model, not to profile() of one");
          return model.cast<PyModel&>().run_profile(iterations, warmup);
        }
        REGEN_CHECK(pb::isinstance<pb::str>(model),
                    "profile: model must be a registered model's name or a Model");
        PyModel built(model.cast<std::string>(), batch, device, kw);
        return built.run_profile(iterations, warmup);
      },
      pb::arg("model"), pb::arg("batch") = 4, pb::arg("device") = "auto", pb::kw_only(),
      pb::arg("iterations") = 2, pb::arg("warmup") = 0, R"doc(
Stage 1: builds the model (a name and Model options, or an existing Model) and profiles
``iterations`` training steps; returns the Profile.)doc");
}

}  // namespace regen::py
