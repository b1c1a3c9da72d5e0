// Model presets, the registry, options and the factory (model.h).
#include "regen/models/model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "regen/models/gpt2.h"
#include "regen/models/resnet.h"
#include "regen/models/transformer.h"

namespace regen {

// ---- Options -----------------------------------------------------------------------------------

std::string option_name(const std::string& key, OptionStyle style) {
  if (style == OptionStyle::keyword) return key;
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

std::string option_setting(const std::string& key, const std::string& value, OptionStyle style) {
  return style == OptionStyle::keyword ? key + "=" + value : option_name(key, style) + " " + value;
}

std::string option_error(const std::string& key, const std::string& value,
                         const std::string& problem, OptionStyle style) {
  if (style == OptionStyle::keyword) return key + "=" + value + ": " + problem;
  return option_name(key, style) + " " + problem + ", got " + value;
}

std::string number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

OptionRange OptionRange::integers(double lo, double hi) {
  OptionRange r;
  r.integer = true;
  r.lo = lo;
  r.hi = hi;
  return r;
}

OptionRange OptionRange::numbers(double lo, double hi) {
  OptionRange r;
  r.integer = false;
  r.lo = lo;
  r.hi = hi;
  return r;
}

std::string OptionRange::requirement() const {
  if (integer) {
    if (lo == 1) return "a positive integer";
    if (lo == 0) return "a non-negative integer";
    if (hi == kMaxInteger) return "an integer >= " + number_text(lo);
    return "an integer from " + number_text(lo) + " to " + number_text(hi);
  }
  if (hi == std::numeric_limits<double>::max()) return "a finite number >= " + number_text(lo);
  return "a number from " + number_text(lo) + " to " + number_text(hi);
}

std::string OptionRange::problem(double v) const {
  // Written so that nan fails (every comparison with nan is false).
  const bool open_top = integer && (lo == 0 || lo == 1);
  if (integer && std::isfinite(v) && v != std::floor(v)) return "must be " + requirement();
  if (!(v >= lo)) return "must be " + requirement();
  if (!(v <= hi))
    return open_top ? "must be at most " + number_text(hi) : "must be " + requirement();
  return "";
}

ModelOption integer_option(std::string key, std::string help, OptionRange range,
                           int64_t ModelConfig::*field) {
  ModelOption o;
  o.key = std::move(key);
  o.help = std::move(help);
  o.range = range;
  o.set = [field](ModelConfig& c, double v) { c.*field = static_cast<int64_t>(v); };
  o.get = [field](const ModelConfig& c) { return static_cast<double>(c.*field); };
  return o;
}

ModelOption float_option(std::string key, std::string help, OptionRange range,
                         float ModelConfig::*field) {
  ModelOption o;
  o.key = std::move(key);
  o.help = std::move(help);
  o.range = range;
  o.range.integer = false;
  o.set = [field](ModelConfig& c, double v) { c.*field = static_cast<float>(v); };
  o.get = [field](const ModelConfig& c) { return static_cast<double>(c.*field); };
  return o;
}

ModelOption param_option(std::string key, std::string help, OptionRange range, double fallback) {
  ModelOption o;
  o.key = key;
  o.help = std::move(help);
  o.range = range;
  o.set = [key](ModelConfig& c, double v) { c.params[key] = v; };
  o.get = [key, fallback](const ModelConfig& c) {
    const auto it = c.params.find(key);
    return it == c.params.end() ? fallback : it->second;
  };
  return o;
}

std::string option_value_text(const ModelOption& o, double v) {
  if (o.range.integer && std::isfinite(v)) return std::to_string(static_cast<int64_t>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

const ModelOption* ModelInput::option(const std::string& key) const {
  for (const ModelOption& o : options) {
    if (o.key == key) return &o;
  }
  return nullptr;
}

const DataKind* ModelInput::data_kind(const std::string& name) const {
  for (const DataKind& d : data) {
    if (d.name == name) return &d;
  }
  return nullptr;
}

// ---- Presets and the registry ------------------------------------------------------------------

namespace {

ModelConfig resnet_preset(const std::string& name, std::vector<int64_t> blocks, bool bottleneck) {
  ModelConfig c;
  c.name = name;
  c.blocks = std::move(blocks);
  c.bottleneck = bottleneck;
  return c;
}

ModelConfig transformer_preset(const std::string& name) {
  ModelConfig c;  // the seed experiments' model: the defaults
  c.name = name;
  if (name == "bert-base") {
    c.d_model = 768;
    c.layers = 12;
    c.heads = 12;
    c.ff = 3072;
    c.seq_len = 512;
    c.gelu = true;
  } else if (name == "transformer-tiny") {
    c.vocab = 101;
    c.seq_len = 16;
    c.d_model = 32;
    c.layers = 2;
    c.heads = 4;
    c.ff = 64;
  }
  return c;
}

// GPT-2 (OpenAI's sizes; vocabulary 50257, padded to 50304 in the model) and a tiny one for tests.
ModelConfig gpt2_preset(const std::string& name) {
  ModelConfig c;
  c.name = name;
  c.vocab = 50257;
  c.seq_len = 1024;
  c.d_model = 768;
  c.layers = 12;
  c.heads = 12;
  c.dropout = 0.0f;  // GPT-2 here has no dropout
  c.gelu = true;
  if (name == "gpt2-medium") {
    c.d_model = 1024;
    c.layers = 24;
    c.heads = 16;
  } else if (name == "gpt2-tiny") {
    c.vocab = 100;  // padded to 128: the tests see the padding
    c.seq_len = 16;
    c.d_model = 32;
    c.layers = 2;
    c.heads = 4;
  }
  c.ff = 4 * c.d_model;
  return c;
}

std::unique_ptr<Model> build_gpt2(const ModelConfig& config, Device device) {
  return std::make_unique<GPT2>(config, device);
}

std::unique_ptr<Model> build_resnet(const ModelConfig& config, Device device) {
  return std::make_unique<ResNet>(config, device);
}

std::unique_ptr<Model> build_transformer(const ModelConfig& config, Device device) {
  return std::make_unique<TransformerLM>(config, device);
}

std::vector<ModelInfo>& registry() {
  static std::vector<ModelInfo> models = [] {
    std::vector<ModelInfo> out;
    auto resnet = [&](const char* name, const char* help, ModelConfig c) {
      out.push_back({name, help, std::move(c), build_resnet, ResNet::input()});
    };
    resnet("resnet18", "ResNet-18 (torchvision), 224x224 images, 1000 classes",
           resnet_preset("resnet18", {2, 2, 2, 2}, false));
    resnet("resnet34", "ResNet-34 (torchvision)", resnet_preset("resnet34", {3, 4, 6, 3}, false));
    resnet("resnet50", "ResNet-50 (torchvision)", resnet_preset("resnet50", {3, 4, 6, 3}, true));
    resnet("resnet101", "ResNet-101 (torchvision)",
           resnet_preset("resnet101", {3, 4, 23, 3}, true));
    resnet("resnet152", "ResNet-152 (torchvision)",
           resnet_preset("resnet152", {3, 8, 36, 3}, true));
    // Bottleneck blocks at 1/8 width on 32x32 images: the parity and remat tests' ResNet.
    ModelConfig tiny = resnet_preset("resnet-tiny", {1, 1, 1, 1}, true);
    tiny.base_width = 8;
    tiny.num_classes = 10;
    tiny.image_size = 32;
    resnet("resnet-tiny", "one bottleneck block per stage at 1/8 width, 32x32 images, 10 classes",
           tiny);
    auto transformer = [&](const char* name, const char* help) {
      out.push_back(
          {name, help, transformer_preset(name), build_transformer, TransformerLM::input()});
    };
    transformer(
        "transformer",
        "post-norm encoder LM: d_model 512, 6 layers, 8 heads, ff 2048, vocab 30000, seq 128");
    transformer("bert-base",
                "BERT-base sizes: d_model 768, 12 layers, 12 heads, ff 3072, seq 512, GELU");
    transformer("transformer-tiny", "d_model 32, 2 layers, 4 heads, ff 64, vocab 101, seq 16");
    auto gpt2 = [&](const char* name, const char* help) {
      out.push_back({name, help, gpt2_preset(name), build_gpt2, GPT2::input()});
    };
    gpt2("gpt2",
         "GPT-2 124M: pre-norm decoder, 12 layers, 12 heads, width 768, context 1024, vocab 50257 "
         "(padded to 50304), head tied to the token embedding");
    gpt2("gpt2-medium", "GPT-2 350M: 24 layers, 16 heads, width 1024, context 1024, vocab 50257");
    gpt2("gpt2-tiny", "GPT-2 for tests: 2 layers, 4 heads, width 32, context 16, vocab 100");
    return out;
  }();
  return models;
}

bool is_name(const std::string& s, bool dots) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [dots](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
           (dots && (c == '-' || c == '.'));
  });
}

}  // namespace

const std::vector<std::string>& session_option_keys() {
  static const std::vector<std::string> keys = {
      "model",          "batch",          "device",       "optimizer",    "lr",
      "momentum",       "weight_decay",   "seed",         "threads",      "data",
      "conv",           "math",           "tf32",         "accumulate",   "lr_schedule",
      "warmup_steps",   "schedule_steps", "lr_step_size", "lr_gamma",     "lr_min",
      "clip_grad_norm", "grad_norm",      "eval_every",   "eval_batches", "eval_batch",
      "eval_split",     "shard",          "bucket_size",  "masks",        "compress",
      "precision",      "cuda_graph"};
  return keys;
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const ModelInfo& m : registry()) out.push_back(m.name);
  return out;
}

void register_model(ModelInfo info) {
  REGEN_CHECK(is_name(info.name, true), "register_model: the name '", info.name,
              "' must be letters, digits, '-', '_' and '.'");
  const std::string who = "register_model: model '" + info.name + "'";
  REGEN_CHECK(static_cast<bool>(info.build), who, " has no build function");
  for (const ModelInfo& m : registry()) {
    REGEN_CHECK(m.name != info.name, "register_model: a model named '", info.name,
                "' is registered already");
  }
  const ModelInput& in = info.input;
  REGEN_CHECK(static_cast<bool>(in.batch), who,
              " describes no input batch (ModelInput::batch; data.h has "
              "image_classifier_input() and token_lm_input() to start from)");
  REGEN_CHECK(!in.data.empty(), who, " names no data that can feed it (ModelInput::data)");
  for (size_t i = 0; i < in.data.size(); ++i) {
    const DataKind& d = in.data[i];
    REGEN_CHECK(is_name(d.name, false) && static_cast<bool>(d.make), who, ": data kind ", i,
                " needs a name of letters, digits and '_', and a make function");
    REGEN_CHECK(in.data_kind(d.name) == &d, who, " names data '", d.name, "' twice");
  }
  const std::vector<std::string>& reserved = session_option_keys();
  const std::vector<ModelOptionUse> uses = model_option_uses();
  for (const ModelOption& o : in.options) {
    REGEN_CHECK(is_name(o.key, false) && o.set && o.get, who, ": option '", o.key,
                "' needs a key of letters, digits and '_', and set and get functions");
    REGEN_CHECK(std::find(reserved.begin(), reserved.end(), o.key) == reserved.end(), who,
                ": option '", o.key, "' is the session's own (", join_names(reserved), ")");
    REGEN_CHECK(in.option(o.key) == &o, who, " has option '", o.key, "' twice");
    REGEN_CHECK(o.range.lo <= o.range.hi && !std::isnan(o.range.lo) && !std::isnan(o.range.hi), who,
                ": option '", o.key, "' has an empty range");
    for (const ModelOptionUse& u : uses) {
      REGEN_CHECK(u.option.key != o.key || u.option.range.integer == o.range.integer, who,
                  ": option '", o.key, "' is ", o.range.integer ? "an integer" : "a number",
                  ", but model '", u.models.front(), "' has it as ",
                  u.option.range.integer ? "an integer" : "a number",
                  " (one flag serves both: give it the same kind)");
    }
  }
  info.config.name = info.name;
  registry().push_back(std::move(info));
}

const ModelInfo& model_info(const std::string& name) {
  for (const ModelInfo& m : registry()) {
    if (m.name == name) return m;
  }
  REGEN_FAIL("unknown model '", name, "': known models are ", join_names(model_preset_names()));
}

std::vector<ModelOptionUse> model_option_uses() {
  std::vector<ModelOptionUse> out;
  for (const ModelInfo& m : registry()) {
    for (const ModelOption& o : m.input.options) {
      auto it = std::find_if(out.begin(), out.end(),
                             [&](const ModelOptionUse& u) { return u.option.key == o.key; });
      if (it == out.end()) {
        out.push_back({o, {m.name}});
      } else {
        it->models.push_back(m.name);
      }
    }
  }
  return out;
}

ModelConfig model_preset(const std::string& name) {
  return model_info(name).config;
}

std::unique_ptr<Model> make_model(const ModelConfig& config, Device device) {
  return model_info(config.name).build(config, device);
}

}  // namespace regen
