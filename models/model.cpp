// Model presets and the factory (model.h).
#include "regen/models/model.h"

#include <algorithm>
#include <cctype>

#include "regen/models/resnet.h"
#include "regen/models/transformer.h"

namespace regen {

namespace {

ModelConfig builtin_preset(const std::string& name) {
  ModelConfig c;
  c.name = name;
  auto resnet = [&](std::vector<int64_t> blocks, bool bottleneck) {
    c.family = ModelFamily::resnet;
    c.blocks = std::move(blocks);
    c.bottleneck = bottleneck;
  };
  if (name == "resnet18")
    resnet({2, 2, 2, 2}, false);
  else if (name == "resnet34")
    resnet({3, 4, 6, 3}, false);
  else if (name == "resnet50")
    resnet({3, 4, 6, 3}, true);
  else if (name == "resnet101")
    resnet({3, 4, 23, 3}, true);
  else if (name == "resnet152")
    resnet({3, 8, 36, 3}, true);
  else if (name == "resnet-tiny") {
    // Bottleneck blocks at 1/8 width on 32x32 images: the parity and remat tests' ResNet.
    resnet({1, 1, 1, 1}, true);
    c.base_width = 8;
    c.num_classes = 10;
    c.image_size = 32;
  } else if (name == "transformer") {
    c.family = ModelFamily::transformer;  // the seed experiments' model: the defaults
  } else if (name == "bert-base") {
    c.family = ModelFamily::transformer;
    c.d_model = 768;
    c.layers = 12;
    c.heads = 12;
    c.ff = 3072;
    c.seq_len = 512;
    c.gelu = true;
  } else if (name == "transformer-tiny") {
    c.family = ModelFamily::transformer;
    c.vocab = 101;
    c.seq_len = 16;
    c.d_model = 32;
    c.layers = 2;
    c.heads = 4;
    c.ff = 64;
  }
  return c;
}

std::unique_ptr<Model> build_by_family(const ModelConfig& config, Device device) {
  if (config.family == ModelFamily::resnet) return std::make_unique<ResNet>(config, device);
  return std::make_unique<TransformerLM>(config, device);
}

std::vector<ModelInfo>& registry() {
  static std::vector<ModelInfo> models = [] {
    const std::pair<const char*, const char*> builtin[] = {
        {"resnet18", "ResNet-18 (torchvision), 224x224 images, 1000 classes"},
        {"resnet34", "ResNet-34 (torchvision)"},
        {"resnet50", "ResNet-50 (torchvision)"},
        {"resnet101", "ResNet-101 (torchvision)"},
        {"resnet152", "ResNet-152 (torchvision)"},
        {"resnet-tiny", "one bottleneck block per stage at 1/8 width, 32x32 images, 10 classes"},
        {"transformer",
         "post-norm encoder LM: d_model 512, 6 layers, 8 heads, ff 2048, vocab 30000, seq 128"},
        {"bert-base", "BERT-base sizes: d_model 768, 12 layers, 12 heads, ff 3072, seq 512, GELU"},
        {"transformer-tiny", "d_model 32, 2 layers, 4 heads, ff 64, vocab 101, seq 16"},
    };
    std::vector<ModelInfo> out;
    for (const auto& [name, help] : builtin) {
      out.push_back({name, help, builtin_preset(name), build_by_family});
    }
    return out;
  }();
  return models;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> out;
  for (const ModelInfo& m : registry()) out.push_back(m.name);
  return out;
}

void register_model(ModelInfo info) {
  REGEN_CHECK(
      !info.name.empty() && std::all_of(info.name.begin(), info.name.end(),
                                        [](char c) {
                                          return std::isalnum(static_cast<unsigned char>(c)) ||
                                                 c == '-' || c == '_' || c == '.';
                                        }),
      "register_model: the name '", info.name, "' must be letters, digits, '-', '_' and '.'");
  REGEN_CHECK(static_cast<bool>(info.build), "register_model: model '", info.name,
              "' has no build function");
  for (const ModelInfo& m : registry()) {
    REGEN_CHECK(m.name != info.name, "register_model: a model named '", info.name,
                "' is registered already");
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

ModelConfig model_preset(const std::string& name) {
  return model_info(name).config;
}

std::unique_ptr<Model> make_model(const ModelConfig& config, Device device) {
  for (const ModelInfo& m : registry()) {
    if (m.name == config.name) return m.build(config, device);
  }
  return build_by_family(config, device);
}

}  // namespace regen
