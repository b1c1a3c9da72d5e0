// The models behind one interface, the registry that names them (the built-in ResNets and
// Transformers, and whatever a program registers), and what a model takes as input: the batch,
// the data that feeds it and the options that set its sizes. ResNet: resnet.h; Transformer:
// transformer.h; the built-in inputs and data: data.h. Tests: tests/test_models.cpp and the
// PyTorch parity tests in tests/test_parity.cpp.
#pragma once

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "regen/models/module.h"

namespace regen {

// One training example batch: what a model's input describes (ModelInput::batch), e.g. images
// (N, 3, H, W) f32 with labels (N) i64, or tokens (B, S) i64 with next-token targets (B, S) i64.
struct Batch {
  Tensor input;
  Tensor target;
};

// Parameters of a model configuration. The built-in models read the typed fields (ResNet the
// first group, the Transformer the second); a registered model reads those that fit it and keeps
// options of its own in `params` (ModelOption, param_option).
struct ModelConfig {
  std::string name;  // a registered model's name (see model_preset_names())
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
  // The fused head's gradients: 0 made in the forward with the loss (three products of (rows,
  // vocab, d_model); the weight's gradient, vocab x d_model f32, held until the backward), 1 made
  // in the backward from logits computed again (four products, and no such gradient held across
  // the step: the memory-lean choice). f32, bf16 and fp16; the same values up to the order of f32
  // sums.
  int64_t head_recompute = 0;
  uint64_t seed = 0;  // parameter initialization
  // Options of a registered model that have no field above, by key (param_option).
  std::map<std::string, double> params;
};

// ---- Options -----------------------------------------------------------------------------------
// How a message names an option: as a flag of the regen command line ("--image-size 16 is too
// small") or as a keyword of the Python module ("image_size=16 is too small").
enum class OptionStyle { flag, keyword };
// The option `key` ("image_size") as `style` names it: "--image-size" or "image_size".
std::string option_name(const std::string& key, OptionStyle style);
// The option with a value: "--image-size 16" or "image_size=16".
std::string option_setting(const std::string& key, const std::string& value, OptionStyle style);
// A bad value of an option with what it must be: "--threads must be at most 1024, got 300000" or
// "threads=300000: must be at most 1024" (`problem` is OptionRange::problem's text).
std::string option_error(const std::string& key, const std::string& value,
                         const std::string& problem, OptionStyle style);
// The shortest text that reads back as `v` ("0.1", "300000", "nan").
std::string number_text(double v);

// The values an option takes: integers, or finite numbers, from lo to hi. Integers are held as
// doubles, exact up to 2^53, which bounds every integer option.
struct OptionRange {
  static constexpr double kMaxInteger = 9007199254740992.0;  // 2^53
  bool integer = true;
  double lo = 1;
  double hi = kMaxInteger;
  static OptionRange integers(double lo, double hi = kMaxInteger);
  static OptionRange numbers(double lo, double hi = std::numeric_limits<double>::max());
  // What a value must be: "a positive integer", "a non-negative integer", "an integer >= 2", "an
  // integer from 2 to 16777216", "a finite number >= 0", "a number from 0 to 0.99".
  std::string requirement() const;
  // "" for a value in range, else "must be <requirement>" ("must be at most <hi>" for an integer
  // above an open-ended range's top, such as 300000 threads).
  std::string problem(double v) const;
};

// An option a model takes besides the session's own (batch, optimizer, ...): --image-size on the
// command line, image_size= in Python. Its value lands in the model's configuration.
struct ModelOption {
  std::string key;   // letters, digits and '_'; the flag is --key with '-' for '_'
  std::string help;  // one line, for --help
  OptionRange range;
  std::function<void(ModelConfig&, double)> set;
  std::function<double(const ModelConfig&)> get;
  // The activations of a step grow with it: named with --batch when a step is too large.
  bool sizes_step = false;
  // The parameters' shapes follow it: checkpoints record it and loading compares it; named when
  // the model's own state is too large for memory.
  bool sizes_parameters = false;
  // Checkpoints record it without comparing it on load (how a run computed, not what it holds).
  bool recorded = false;
  // What of its value a profile depends on (the step's graph, sizes and times), when that is less
  // than the value: a profile made at one value then plans a run at another with the same key.
  // Unset: the value itself. Dropout's: whether it is 0 (p = 0 leaves the dropout ops out; any
  // other p has the same ops, saved masks and times).
  std::function<std::string(double)> profile_key;
};
// Options bound to a field of ModelConfig, and one kept in ModelConfig::params (read as
// `fallback` when the preset does not set it).
ModelOption integer_option(std::string key, std::string help, OptionRange range,
                           int64_t ModelConfig::*field);
ModelOption float_option(std::string key, std::string help, OptionRange range,
                         float ModelConfig::*field);
ModelOption param_option(std::string key, std::string help, OptionRange range, double fallback);
// An option's value as run records and checkpoints write it ("64", "0.1").
std::string option_value_text(const ModelOption& o, double v);

// ---- Inputs ------------------------------------------------------------------------------------
// One tensor of a batch: its shape (the batch dimension first) and dtype.
struct TensorSpec {
  Shape shape;
  DType dtype = DType::f32;
};
struct BatchSpec {
  TensorSpec input, target;
};

class DataSource;
class EvalSource;
// One kind of training data a model can take: `--data NAME` or `--data NAME:ARG` (data='NAME:ARG'
// in Python).
struct DataKind {
  std::string name;  // "synthetic", "cifar10", "text"
  std::string arg;   // what follows the colon, for help and errors ("DIR", "FILE"); "" for none
  std::string help;  // one line
  // Refuses a configuration the data cannot feed (without reading anything), naming the options
  // as `style` says; may be empty.
  std::function<void(const ModelConfig&, OptionStyle)> check;
  // The source for `arg` (empty when arg is ""); a missing, truncated or malformed file is a
  // regen::Error naming it.
  std::function<std::unique_ptr<DataSource>(const std::string& arg, const ModelConfig&,
                                            uint64_t seed, OptionStyle)>
      make;
  // The files the source for `arg` reads, so that no output is written over one of them; when
  // empty, `arg` itself if the kind takes one (a file, or a folder that is read as a whole).
  std::function<std::vector<std::string>(const std::string& arg)> files;
  // Evaluation (optional; data.h make_eval_source): what the held-out split is, for help and
  // messages ("test_batch.bin in DIR"), and the source of it; `holdout` is the fraction of data
  // that one file holds for both splits keeps for evaluation.
  std::string held_out;
  std::function<std::unique_ptr<EvalSource>(const std::string& arg, const ModelConfig&,
                                            uint64_t seed, double holdout, OptionStyle)>
      make_eval;
  // The training source without the held-out part, for data whose two splits share one file (a
  // text file's tail); empty where `make` already leaves it out.
  std::function<std::unique_ptr<DataSource>(const std::string& arg, const ModelConfig&,
                                            uint64_t seed, double holdout, OptionStyle)>
      make_split;
};

// What a model takes, described by the model: the batch it trains on, the data that can feed it
// and the options that set its sizes. The session, the command line and the Python module read it
// instead of asking what kind of model they have (data.h has the image classifiers' and the
// language models' ones to start from).
struct ModelInput {
  std::string help;  // "images (N, 3, S, S) f32 with class labels (N) i64"
  // The batch of `batch` examples under `config`: the shapes and dtypes every data source of the
  // model makes, and what a dry run allocates in their place.
  std::function<BatchSpec(const ModelConfig&, int64_t batch)> batch;
  std::vector<DataKind> data;  // the first is the default (--data left out)
  std::vector<ModelOption> options;
  // What evaluation reports besides the mean loss (models/evaluate.h): "accuracy" (top-1 over the
  // last dimension of forward()'s output, one class per target) and "perplexity" (exp of the mean
  // loss per target).
  std::vector<std::string> metrics;
  // Whether AdamW's weight decay (--weight-decay) applies to the model's matrices only (parameters
  // of two or more dimensions: optim.h DecayScope::matrices), as GPT-2 is trained, instead of to
  // every parameter (torch.optim.AdamW's single group, the default).
  bool decay_matrices_only = false;
  // Refuses a configuration or batch size the model cannot train (too small an image for its
  // downsamplings, too few values per batch-norm channel), naming the options as `style` says;
  // may be empty.
  std::function<void(const ModelConfig&, int64_t batch, OptionStyle)> check;
  // The option named `key`, or null.
  const ModelOption* option(const std::string& key) const;
  const DataKind* data_kind(const std::string& name) const;
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
  // The output for a batch's input: logits (N, classes) for ResNet, (B, S, vocab) for the
  // Transformer.
  virtual Tensor forward(const Tensor& input) = 0;
  // The mean training loss of forward()'s output against the batch targets.
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

// Builds the model registered under config.name with config's values; throws regen::Error listing
// the registered names for another name.
std::unique_ptr<Model> make_model(const ModelConfig& config, Device device = Device::cpu());

// ---- The model registry -----------------------------------------------------------------------
// A model by name: its preset (the values its options override), how to build it, and what it
// takes as input. A program that links regen registers its own models, and the session
// (session/session.h), `--model NAME`, regen.Model(NAME), make_model, the profiler, the planners
// and RematPipeline then treat them as the built-in ones.
struct ModelInfo {
  std::string name;    // letters, digits, '-', '_' and '.'
  std::string help;    // one line, for --help and error messages
  ModelConfig config;  // its name is set to `name`
  std::function<std::unique_ptr<Model>(const ModelConfig&, Device)> build;
  ModelInput input;
};
// Throws regen::Error for a name already taken or not of the form above, no build function, or an
// input that describes no batch or data, or options that are malformed, repeated, named like a
// session option, or of another kind (integer or number) than a registered model's option of the
// same key.
void register_model(ModelInfo info);
const ModelInfo& model_info(const std::string& name);  // throws listing the names
// The keys the training session takes itself (session/options.h SessionOptions), which no model
// option may use: model, batch, device, optimizer, lr, ...
const std::vector<std::string>& session_option_keys();
// Every option key of the registered models, once, in registration order, with the models that
// take it (the command line makes one flag of each).
struct ModelOptionUse {
  ModelOption option;  // the first registered model's
  std::vector<std::string> models;
};
std::vector<ModelOptionUse> model_option_uses();

}  // namespace regen
