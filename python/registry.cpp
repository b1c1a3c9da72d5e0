// Models from Python and from C++ extensions, registered into the module's one copy of regen:
//   regen.register_model(name, build, input=...): a model written in Python from regen.ops and the
//     layers a regen.Net makes; the session, profiler, planners and regen.Model treat it as a
//     built-in one.
//   regen.load_extension(path): a shared object built against regen's installed headers only (no
//     copy of regen inside; examples/unet/unet_extension.cpp) whose regen_extension_init()
//     registers C++ models; its references to regen resolve to this module's.
//   regen.model_options(name): what a registered model takes.
// Tests: tests/python/test_models.py.
#include <dlfcn.h>

#include <map>
#include <memory>
#include <optional>

#include "python/bindings.h"
#include "regen/models/data.h"
#include "regen/models/layers.h"

namespace regen::py {

pb::dict config_dict(const ModelConfig& c) {
  pb::dict d;
  d["name"] = c.name;
  for (const ModelOption& o : model_info(c.name).input.options) {
    const double v = o.get(c);
    if (o.range.integer) {
      d[pb::str(o.key)] = pb::int_(static_cast<int64_t>(v));
    } else {
      // A float field reads back as the float it holds ("0.1", not 0.10000000149011612).
      d[pb::str(o.key)] = pb::float_(std::strtod(option_value_text(o, v).c_str(), nullptr));
    }
  }
  d["seed"] = c.seed;
  return d;
}

namespace {

// A layer a Net made, callable from Python while its model lives.
struct Layer {
  std::string name;
  std::function<Tensor(const Tensor&)> forward;
  std::shared_ptr<bool> alive;  // false once the model is gone
  Tensor call(const Tensor& x) const {
    REGEN_CHECK(*alive, "layer '", name, "' belongs to a model that no longer exists");
    return forward(x);
  }
};

// A parameter a Net made: calling it gives the Tensor while its model lives. It holds no Tensor
// itself, so nothing Python keeps after a model is gone holds the model's memory (a dry run's
// model lives on an allocator of its own that goes with it).
struct Param {
  std::string name;
  const Tensor* tensor = nullptr;
  std::shared_ptr<bool> alive;
  Tensor get() const {
    REGEN_CHECK(*alive, "parameter '", name, "' belongs to a model that no longer exists");
    return *tensor;
  }
};

class PythonModel;

// What build(net, config) is given: the model being built, to make its layers and parameters.
struct Net {
  PythonModel* model = nullptr;
  std::shared_ptr<bool> building;
  PythonModel& target(const char* what) const;
};

// A model whose forward (and optionally loss) is Python code over regen.ops; its layers and
// parameters are regen's Modules and Tensors, made by build() through a Net.
class PythonModel : public Model {
 public:
  PythonModel(const ModelConfig& c, Device device, const pb::object& build)
      : Model(c), device_(device), gen_(c.seed), alive_(std::make_shared<bool>(true)) {
    Net net{this, std::make_shared<bool>(true)};
    struct Done {  // the Net makes nothing once build() returns or raises
      std::shared_ptr<bool> flag;
      ~Done() { *flag = false; }
    } done{net.building};
    const pb::object out = build(pb::cast(net), config_dict(c));
    if (PyCallable_Check(out.ptr())) {
      forward_ = out;
    } else {
      REGEN_CHECK(pb::hasattr(out, "forward"), "model '", c.name,
                  "': build() must return forward(x), or an object with forward (and optionally "
                  "loss), not ",
                  pb::str(pb::repr(out)).cast<std::string>());
      forward_ = out.attr("forward");
      if (pb::hasattr(out, "loss")) loss_ = out.attr("loss");
    }
    assign_full_names();
  }
  ~PythonModel() override { *alive_ = false; }

  Tensor forward(const Tensor& input) override { return tensor_of(forward_(input), "forward"); }
  // By default the mean cross-entropy of logits (..., C) against ids (...): an image classifier's
  // (N, C) against (N), a language model's (B, S, V) against (B, S).
  Tensor loss(const Tensor& logits, const Tensor& target) const override {
    if (loss_) return tensor_of((*loss_)(logits, target), "loss");
    ModuleScope scope("loss");
    if (logits.dim() <= 2) return cross_entropy(logits, target);
    return cross_entropy(reshape(logits, {-1, logits.size(-1)}), target.reshape({-1}));
  }
  // The batch is checked against the model's input by the session (its data source).
  void check_batch(const Batch&) const override {}

  Layer add_layer(const std::string& name, std::unique_ptr<Module> m,
                  std::function<Tensor(Module&, const Tensor&)> call) {
    Module& ref = register_module(name, std::move(m));
    return Layer{name, [&ref, call](const Tensor& x) { return call(ref, x); }, alive_};
  }
  Param add_parameter(const std::string& name, const Shape& shape, double std) {
    Tensor& p = register_parameter(name, make_param(name, shape, device_));
    p.copy_from(std > 0 ? normal(shape, 0.0, std, gen_) : zeros(shape));
    return Param{name, &p, alive_};
  }
  Device device() const { return device_; }
  Generator& gen() { return gen_; }

 private:
  Tensor tensor_of(const pb::object& out, const char* what) const {
    REGEN_CHECK(pb::isinstance<Tensor>(out), "model '", config_.name, "': ", what, " returned ",
                pb::str(pb::repr(out)).cast<std::string>(), ", not a regen.Tensor");
    return out.cast<Tensor>();
  }

  Device device_;
  Generator gen_;
  std::shared_ptr<bool> alive_;
  pb::object forward_;
  std::optional<pb::object> loss_;
};

PythonModel& Net::target(const char* what) const {
  REGEN_CHECK(*building, "net.", what,
              ": the model is built already; make its layers and parameters in build()");
  return *model;
}

template <class L>
std::function<Tensor(Module&, const Tensor&)> call_of() {
  return [](Module& m, const Tensor& x) { return static_cast<L&>(m).forward(x); };
}

// The model input named `input`: 'images', 'tokens', or a registered model's (its preset too).
ModelInput input_named(const std::string& input, ModelConfig& preset) {
  if (input == "images") {
    preset.image_size = 32;
    preset.num_classes = 10;
    return image_classifier_input();
  }
  if (input == "tokens") {
    preset.seq_len = 16;
    preset.vocab = 256;
    return token_lm_input();
  }
  const ModelInfo& other = model_info(input);  // unknown: lists the registered models
  preset = other.config;
  return other.input;
}

// An option of a Python model's own: default, or (default, lo, hi); an int default makes an
// integer option (from 1 when no range is given), a float one a number (from 0).
ModelOption own_option(const std::string& key, const pb::handle& spec, double& fallback) {
  pb::object def = pb::reinterpret_borrow<pb::object>(spec);
  OptionRange range;
  const bool tuple = pb::isinstance<pb::tuple>(spec);
  if (tuple) {
    const pb::tuple t = pb::reinterpret_borrow<pb::tuple>(spec);
    REGEN_CHECK(t.size() == 3, "register_model: option '", key,
                "' must be a default value or (default, lo, hi)");
    def = t[0];
  }
  const bool integer = PyIndex_Check(def.ptr()) && !pb::isinstance<pb::bool_>(def);
  REGEN_CHECK(integer || pb::isinstance<pb::float_>(def), "register_model: option '", key,
              "' needs an int or float default, got ", pb::str(pb::repr(def)).cast<std::string>());
  fallback = def.cast<double>();
  range = integer ? OptionRange::integers(1) : OptionRange::numbers(0);
  if (tuple) {
    const pb::tuple t = pb::reinterpret_borrow<pb::tuple>(spec);
    range.lo = t[1].cast<double>();
    range.hi = t[2].cast<double>();
  }
  REGEN_CHECK(range.problem(fallback).empty(), "register_model: option '", key, "' default ",
              number_text(fallback), " ", range.problem(fallback));
  return param_option(key, "an option of a Python model", range, fallback);
}

}  // namespace

void bind_registry(pb::module_& m) {
  pb::class_<Layer>(m, "Layer", "A layer of a model built in Python (Net): call it on a Tensor")
      .def("__call__", &Layer::call, pb::arg("x"))
      .def_readonly("name", &Layer::name)
      .def("__repr__", [](const Layer& l) { return "regen.Layer('" + l.name + "')"; });

  pb::class_<Param>(
      m, "Parameter",
      "A parameter of a model built in Python (Net.parameter): call it for the Tensor")
      .def("__call__", &Param::get)
      .def_readonly("name", &Param::name)
      .def("__repr__", [](const Param& p) { return "regen.Parameter('" + p.name + "')"; });

  pb::class_<Net>(m, "Net", R"doc(
What ``build(net, config)`` of regen.register_model is given: the model being built. Its methods make
the model's layers and parameters, named like torch.nn's (``net.conv2d('down0.conv1', 3, 8, 3,
padding=1)`` has parameter 'down0.conv1.weight'), initialized as regen's C++ layers are from the
model's seed, in the order they are made. Layers and parameters are handles: call a layer on a Tensor,
call a parameter for its Tensor; neither keeps the model's memory alive.)doc")
      .def(
          "linear",
          [](const Net& n, const std::string& name, int64_t in, int64_t out, bool bias) {
            PythonModel& pm = n.target("linear");
            return pm.add_layer(
                name, std::make_unique<Linear>(name, in, out, bias, pm.gen(), pm.device()),
                call_of<Linear>());
          },
          pb::arg("name"), pb::arg("in_features"), pb::arg("out_features"), pb::arg("bias") = true)
      .def(
          "conv2d",
          [](const Net& n, const std::string& name, int64_t in, int64_t out, int64_t kernel,
             int64_t stride, int64_t padding, bool bias) {
            PythonModel& pm = n.target("conv2d");
            return pm.add_layer(name,
                                std::make_unique<Conv2d>(name, in, out, kernel, stride, padding,
                                                         bias, pm.gen(), pm.device()),
                                call_of<Conv2d>());
          },
          pb::arg("name"), pb::arg("in_channels"), pb::arg("out_channels"), pb::arg("kernel"),
          pb::arg("stride") = 1, pb::arg("padding") = 0, pb::arg("bias") = false)
      .def(
          "batch_norm2d",
          [](const Net& n, const std::string& name, int64_t channels) {
            PythonModel& pm = n.target("batch_norm2d");
            return pm.add_layer(name, std::make_unique<BatchNorm2d>(name, channels, pm.device()),
                                call_of<BatchNorm2d>());
          },
          pb::arg("name"), pb::arg("channels"))
      .def(
          "layer_norm",
          [](const Net& n, const std::string& name, int64_t dim) {
            PythonModel& pm = n.target("layer_norm");
            return pm.add_layer(name, std::make_unique<LayerNorm>(name, dim, pm.device()),
                                call_of<LayerNorm>());
          },
          pb::arg("name"), pb::arg("dim"))
      .def(
          "embedding",
          [](const Net& n, const std::string& name, int64_t num, int64_t dim) {
            PythonModel& pm = n.target("embedding");
            return pm.add_layer(name,
                                std::make_unique<Embedding>(name, num, dim, pm.gen(), pm.device()),
                                call_of<Embedding>());
          },
          pb::arg("name"), pb::arg("num"), pb::arg("dim"))
      .def(
          "parameter",
          [](const Net& n, const std::string& name, const Shape& shape, double std) {
            REGEN_CHECK(std >= 0, "net.parameter: std must be >= 0, got ", std);
            return n.target("parameter").add_parameter(name, shape, std);
          },
          pb::arg("name"), pb::arg("shape"), pb::arg("std") = 0.0,
          "A parameter drawn from N(0, std^2) (zeros for std 0); call it in forward for its "
          "Tensor");

  m.def(
      "register_model",
      [](const std::string& name, const pb::function& build, const std::string& input,
         const pb::dict& preset, const pb::dict& options, const std::string& help) {
        ModelConfig config;
        ModelInput in = input_named(input, config);
        for (const auto& [k, spec] : options) {
          const std::string key = pb::str(k);
          double fallback = 0;
          in.options.push_back(own_option(key, spec, fallback));
          config.params[key] = fallback;
        }
        for (const auto& [k, v] : preset) {
          const std::string key = pb::str(k);
          const ModelOption* o = in.option(key);
          REGEN_CHECK(
              o != nullptr, "register_model: preset '", key, "' is no option of the model",
              " (its options: ",
              [&] {
                std::vector<std::string> keys;
                for (const ModelOption& x : in.options) keys.push_back(x.key);
                return join_names(keys);
              }(),
              ")");
          const double value = v.cast<double>();
          const std::string problem = o->range.problem(value);
          REGEN_CHECK(problem.empty(), "register_model: preset ", key, "=", number_text(value),
                      ": ", problem);
          o->set(config, value);
        }
        // Kept for the life of the process: the registry outlives the interpreter, so the
        // function is never released (a release after Python's finalization would crash).
        auto* keep = new pb::object(build);
        register_model({name, help.empty() ? "a model written in Python" : help, config,
                        [keep](const ModelConfig& c, Device d) {
                          return std::unique_ptr<Model>(std::make_unique<PythonModel>(c, d, *keep));
                        },
                        std::move(in)});
      },
      pb::arg("name"), pb::arg("build"), pb::kw_only(), pb::arg("input") = "images",
      pb::arg("preset") = pb::dict(), pb::arg("options") = pb::dict(), pb::arg("help") = "",
      R"doc(
Registers a model written in Python. ``build(net, config)`` makes the layers and parameters with
``net`` (a regen.Net) and returns ``forward(x) -> Tensor`` (or an object with ``forward`` and
optionally ``loss(output, target)``; the default loss is the mean cross-entropy over the last
dimension). ``input`` is what it takes: 'images' (N, 3, S, S) with class labels, 'tokens' (B, S)
with next tokens, or a registered model's name (its input, options and preset, e.g. 'unet' after
load_extension). ``options`` adds options of its own: ``{'hidden': 64}``, or ``{'p': (0.5, 0.0,
1.0)}`` with a range; ``preset`` sets the options' defaults. regen.Model(name, ...), regen.profile
and the planners then treat it as a built-in model; config (in build) has the options' values.)doc");

  m.def(
      "load_extension",
      [](const std::string& path) {
        // This module's symbols become visible to the objects loaded after it: the extension's
        // references to regen bind to this copy (it carries none of its own).
        Dl_info self;
        REGEN_CHECK(::dladdr(reinterpret_cast<void*>(&config_dict), &self) != 0 &&
                        ::dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL) != nullptr,
                    "load_extension: cannot find the regen module's own file");
        static std::map<void*, std::vector<std::string>> loaded;
        void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr) {
          const char* why = ::dlerror();
          REGEN_FAIL("load_extension: cannot load ", path, ": ", why ? why : "unknown error");
        }
        const auto again = loaded.find(handle);
        if (again != loaded.end()) return again->second;
        using Init = void (*)();
        auto init = reinterpret_cast<Init>(::dlsym(handle, "regen_extension_init"));
        REGEN_CHECK(init != nullptr, "load_extension: ", path,
                    " has no regen_extension_init() (extern \"C\"): nothing to register");
        const std::vector<std::string> before = model_preset_names();
        init();
        std::vector<std::string> added = model_preset_names();
        added.erase(added.begin(), added.begin() + static_cast<std::ptrdiff_t>(before.size()));
        loaded[handle] = added;
        return added;
      },
      pb::arg("path"), R"doc(
Loads a C++ extension: a shared object built against regen's installed headers and nothing of
regen's libraries (CMake: ``regen_add_extension``), whose ``extern "C" void
regen_extension_init()`` registers models (and planners) into this module's regen. Returns the
names of the models it registered; loading one twice registers nothing more.)doc");

  m.def(
      "model_options",
      [](const std::string& name) {
        const ModelInfo& info = model_info(name);
        pb::dict out;
        for (const ModelOption& o : info.input.options) {
          pb::dict d;
          d["help"] = o.help;
          d["integer"] = o.range.integer;
          d["lo"] = o.range.lo;
          d["hi"] = o.range.hi;
          d["default"] = config_dict(info.config)[pb::str(o.key)];
          out[pb::str(o.key)] = d;
        }
        return out;
      },
      pb::arg("name"),
      "The options a registered model takes (regen.Model's keywords beyond the session's): key "
      "-> {help, integer, lo, hi, default}");
  m.def(
      "model_input",
      [](const std::string& name) {
        const ModelInput& in = model_info(name).input;
        pb::dict d;
        d["help"] = in.help;
        pb::list data;
        for (const DataKind& k : in.data)
          data.append(k.arg.empty() ? k.name : k.name + ":" + k.arg);
        d["data"] = data;
        return d;
      },
      pb::arg("name"), "What a registered model takes: {help, data (the data kinds)}");
}

}  // namespace regen::py
