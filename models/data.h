// Training data and the inputs of the built-in models. A model's input (model.h ModelInput) names
// the data kinds that can feed it; make_data_source picks one by `--data` text. Built in: synthetic
// images and CIFAR-10 binary batches (`cifar10:DIR`) for image classifiers, synthetic token motifs
// and a UTF-8 text file as byte tokens (`text:FILE`) for language models. Every batch is created in
// the input memory category. Tests: tests/test_models.cpp (batches, a registered model's input),
// tests/test_cli.cpp (bad specs and files).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "regen/models/model.h"

namespace regen {

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual Batch next(int64_t batch_size, Device device) = 0;
  virtual std::string describe() const = 0;
  // Where the source is in its stream, as text ("" for a source that keeps no position), and
  // setting it back: a run resumed from a checkpoint draws the batches the stopped run would have
  // drawn next (session/checkpoint.h save_training_state). set_position throws regen::Error for
  // text it did not write; the default takes only "".
  virtual std::string position() const { return ""; }
  virtual void set_position(const std::string& position);
  // Passes over the next `samples` samples of the stream without making them, exactly as if
  // next() had made and dropped them. Data parallelism reads each rank's shard of every global
  // batch this way (dist/data_parallel.h ShardedSource): rank r of N skips r * B samples, makes
  // its B, skips the other ranks' (N - 1 - r) * B. The built-in sources skip without drawing; this
  // default refuses, naming the source (a source outside regen implements it to train under
  // mpirun).
  virtual void skip(int64_t samples);
};

// A held-out split for evaluation (models/evaluate.h): a fixed set of examples read in order, the
// same at every evaluation. Its batches have the shapes and dtypes of the model's input at their
// size (the last batch may be smaller).
class EvalSource {
 public:
  virtual ~EvalSource() = default;
  virtual int64_t size() const = 0;  // examples in the split
  // Starts again from the first example.
  virtual void reset() = 0;
  // The next min(n, examples left) examples; throws regen::Error when none is left.
  virtual Batch next(int64_t n, Device device) = 0;
  virtual std::string describe() const = 0;
};

// The fraction of a text file's bytes held out at its end for evaluation (--eval-split).
constexpr double kDefaultHoldout = 0.1;
// The held-out split of the data `spec` names (the data kind's make_eval): CIFAR-10's
// test_batch.bin, the last `holdout` of a text file, fresh synthetic examples. Throws regen::Error,
// naming the option as `style` says, for data without a held-out split or a missing file.
std::unique_ptr<EvalSource> make_eval_source(const std::string& spec, const ModelConfig& model,
                                             uint64_t seed, double holdout,
                                             OptionStyle style = OptionStyle::flag);
// The training source when a held-out split is in use (holdout > 0): for a text file, its bytes
// before the held-out tail; for data whose held-out split is separate (CIFAR-10's test_batch.bin,
// synthetic examples), make_data_source's.
std::unique_ptr<DataSource> make_training_source(const std::string& spec, const ModelConfig& model,
                                                 uint64_t seed, double holdout,
                                                 OptionStyle style = OptionStyle::flag);

// Whether the training examples of the data `spec` names depend on the held-out fraction (a text
// file trains on its bytes before the held-out tail; CIFAR-10 and synthetic data hold out
// examples of their own): what a training state compares of --eval-split.
bool data_split_by_holdout(const std::string& spec, const ModelConfig& model,
                           OptionStyle style = OptionStyle::flag);

// spec: "" (the model's first data kind, synthetic for the built-in ones), "NAME" or "NAME:ARG",
// one of the data kinds of the model registered as model.name (ModelInput::data). Checks the spec
// against the model and its sizes; a missing, truncated or malformed file is a regen::Error naming
// it. Messages name the option as `style` says (--data, data=).
std::unique_ptr<DataSource> make_data_source(const std::string& spec, const ModelConfig& model,
                                             uint64_t seed, OptionStyle style = OptionStyle::flag);
// Refuses a spec the model takes no data of, or a configuration its data cannot feed, without
// reading anything (the session's validate() runs it before any work).
void check_data_spec(const std::string& spec, const ModelConfig& model, OptionStyle style);
// The files the data of `spec` reads (DataKind::files): none for synthetic data. Outputs are
// checked against them before a run, so that nothing is written over its own training data.
std::vector<std::string> data_input_files(const std::string& spec, const ModelConfig& model,
                                          OptionStyle style = OptionStyle::flag);

// Batches of the right shapes, dtypes, categories and tags for `model` (its input's batch) and no
// values (a dry run, core/allocator.h DryRunScope): the blocks every real source's batch takes,
// nothing written.
std::unique_ptr<DataSource> make_shape_source(const ModelConfig& model);

// The host values of one batch tensor: f32 values or i64 values (the other empty), and its shape.
struct HostArray {
  Shape shape;
  std::vector<float> f32;
  std::vector<int64_t> i64;
};
// A batch on `device` from host values: the input, then the target, in the input category with
// the tags every data source uses, so a source of another model takes the blocks a dry run of
// make_shape_source takes. For DataSource::next of sources outside regen.
Batch batch_on_device(const HostArray& input, const HostArray& target, Device device);

// ---- The built-in inputs
// ------------------------------------------------------------------------- Images (N, 3, S, S) f32
// with class labels (N) i64, S = image_size: synthetic images (labels from per-class channel
// offsets plus noise) and CIFAR-10; options --image-size (at least `min_image_size`) and
// --num-classes (2 to 2^24).
ModelInput image_classifier_input(int64_t min_image_size = 1);
// Tokens (B, S) i64 with next-token targets (B, S) i64, S = seq_len: synthetic motifs and text
// files as byte tokens (which need a vocabulary of 256); options --seq-len and --vocab (at least
// 2).
ModelInput token_lm_input();
// --lm-head-chunk (ModelConfig::head_chunk_rows), for the language models whose head and loss run
// fused (linear_cross_entropy): the Transformer's and GPT-2's.
ModelOption lm_head_chunk_option();
// --lm-head-recompute (ModelConfig::head_recompute) for the same models.
ModelOption lm_head_recompute_option();
// head_recompute 0 or 1, and 1 only with the fused head (head_chunk_rows >= 0), else an error
// naming the model and both settings.
void check_lm_head_recompute(const ModelConfig& c);
// The same combination refused by the options' names in the caller's style (--lm-head-recompute,
// lm_head_recompute=): the ModelInput check of the models with an LM head option.
void check_lm_head_options(const ModelConfig& c, int64_t batch, OptionStyle style);
// The fused head's targets: i64 of the tokens' shape, else an error naming the model.
void check_lm_targets(const ModelConfig& c, const Tensor& tokens, const Tensor& target);
// The data kinds above, for inputs of other models: synthetic class-labelled images; CIFAR-10
// (32x32 images, 10 labels); token motifs; byte tokens of a text file.
DataKind synthetic_images_data();
DataKind cifar10_data();
DataKind synthetic_tokens_data();
DataKind text_data();

}  // namespace regen
