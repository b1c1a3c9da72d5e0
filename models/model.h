// The built-in models behind one interface, their presets, and the factory the command line
// uses. ResNet: resnet.h; Transformer: transformer.h. Tests: tests/test_models.cpp and the
// PyTorch parity tests in tests/test_parity.cpp.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "regen/models/module.h"

namespace regen {

// One training example batch: images (N, 3, H, W) f32 with labels (N) i64, or tokens (B, S) i64
// with next-token targets (B, S) i64.
struct Batch {
  Tensor input;
  Tensor target;
};

// What a model takes and so which data and flags apply: resnet, images (N, 3, H, W) with class
// labels (--image-size, --num-classes, CIFAR-10 data); transformer, tokens (B, S) with next-token
// targets (--seq-len, --vocab, text data). A registered model of either kind is trained, profiled
// and planned by the same code as the built-in ones.
enum class ModelFamily { resnet, transformer };

struct ModelConfig {
  std::string name;  // a preset name (see model_presets())
  ModelFamily family = ModelFamily::resnet;
  // ResNet
  std::vector<int64_t> blocks;  // per stage, e.g. {3, 8, 36, 3}
  bool bottleneck = true;
  int64_t base_width = 64;  // stem channels; stage i has base_width * 2^i planes
  int64_t num_classes = 1000;
  int64_t image_size = 224;
  // Transformer
  int64_t vocab = 30000, seq_len = 128, d_model = 512, layers = 6, heads = 8, ff = 2048;
  float dropout = 0.1f;
  bool causal = true;  // next-token objective: each position sees only earlier ones
  bool gelu = false;   // activation (torch's TransformerEncoderLayer default is relu)
  // The LM head's loss in training (forward_loss): -1 computes the (B*S, vocab) logits and then
  // cross_entropy, as PyTorch does; 0 fuses the head and the loss (linear_cross_entropy), chunked
  // automatically (rows whose logits take about 32 MiB); N > 0 fuses with N rows per chunk.
  // Fusing changes no result beyond float rounding and never materializes the logits.
  int64_t head_chunk_rows = 0;
  uint64_t seed = 0;  // parameter initialization
};

// The registered models' preset configurations by name: the built-in ones (resnet18, resnet34,
// resnet50, resnet101, resnet152, resnet-tiny, transformer, bert-base, transformer-tiny), then
// those a program registered (register_model). Throws regen::Error listing them for an unknown
// name.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

class Model : public Module {
 public:
  explicit Model(ModelConfig config) : Module(""), config_(std::move(config)) {}
  const ModelConfig& config() const { return config_; }
  // Logits: (N, classes) for ResNet, (B, S, vocab) for the Transformer.
  virtual Tensor forward(const Tensor& input) = 0;
  // Mean cross-entropy of the logits against the batch targets.
  virtual Tensor loss(const Tensor& logits, const Tensor& target) const = 0;
  // The training loss of a batch: what Trainer::step differentiates. By default
  // loss(forward(input), target); a model may compute it without materializing the logits (the
  // Transformer's fused LM head, ModelConfig::head_chunk_rows), so forward() stays the way to get
  // logits for inference and evaluation.
  virtual Tensor forward_loss(const Tensor& input, const Tensor& target) {
    return loss(forward(input), target);
  }
  // Checks a batch's shapes and dtypes against the model; throws regen::Error naming them.
  virtual void check_batch(const Batch& b) const = 0;
  // Creates inputs the model keeps across steps (e.g. position ids) before the first step, so
  // they never land between one step's activations.
  virtual void prepare_inputs(Device /*device*/) {}

 protected:
  ModelConfig config_;
};

// Builds the model registered under config.name (with config's values); a config whose name is
// not registered builds by its family (ResNet or TransformerLM).
std::unique_ptr<Model> make_model(const ModelConfig& config, Device device = Device::cpu());

// ---- The model registry -----------------------------------------------------------------------
// A model by name: its preset (the values the command line's flags override) and how to build it.
// A program that links regen registers its own models, and `--model NAME`, make_model, the
// profiler, the planners and RematPipeline then treat them as the built-in ones.
struct ModelInfo {
  std::string name;    // letters, digits, '-', '_' and '.'
  std::string help;    // one line, for --help and error messages
  ModelConfig config;  // its name is set to `name`
  std::function<std::unique_ptr<Model>(const ModelConfig&, Device)> build;
};
// Throws regen::Error for a name already taken or not of the form above, or no build function.
void register_model(ModelInfo info);
const ModelInfo& model_info(const std::string& name);  // throws listing the names

}  // namespace regen
