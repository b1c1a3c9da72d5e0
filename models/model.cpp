// Model presets and the factory (model.h).
#include "models/model.h"

#include "models/resnet.h"
#include "models/transformer.h"

namespace regen {

std::vector<std::string> model_preset_names() {
  return {"resnet18",    "resnet34",  "resnet50",  "resnet101",       "resnet152",
          "resnet-tiny", "transformer", "bert-base", "transformer-tiny"};
}

ModelConfig model_preset(const std::string& name) {
  ModelConfig c;
  c.name = name;
  auto resnet = [&](std::vector<int64_t> blocks, bool bottleneck) {
    c.family = ModelFamily::resnet;
    c.blocks = std::move(blocks);
    c.bottleneck = bottleneck;
  };
  if (name == "resnet18") resnet({2, 2, 2, 2}, false);
  else if (name == "resnet34") resnet({3, 4, 6, 3}, false);
  else if (name == "resnet50") resnet({3, 4, 6, 3}, true);
  else if (name == "resnet101") resnet({3, 4, 23, 3}, true);
  else if (name == "resnet152") resnet({3, 8, 36, 3}, true);
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
  } else {
    std::string known;
    for (const std::string& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
    REGEN_FAIL("unknown model '", name, "': known models are ", known);
  }
  return c;
}

std::unique_ptr<Model> make_model(const ModelConfig& config, Device device) {
  if (config.family == ModelFamily::resnet) return std::make_unique<ResNet>(config, device);
  return std::make_unique<TransformerLM>(config, device);
}

}  // namespace regen
