// The built-in models (models/model.h, module.h): torchvision's ResNet state-dict names, shapes
// and parameter counts, the Transformer presets' names and counts, train/eval behaviour of batch
// norm and dropout, state-dict round trips through safetensors, load_state_dict's messages, the
// data sources' batches and the Trainer's canonical start (models/train.h); a model registered
// from outside with its own input (options, checks, data) through the session (session/session.h).
// Reference counts: len(torchvision.models.resnetN().state_dict()) and sum(p.numel()) of its
// parameters (torchvision 0.14); the Transformer's from torch.nn.TransformerEncoderLayer's
// 3,152,384 parameters at d_model 512, feed-forward 2048.
// The large models are only built (their parameters allocated and initialized), never run.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "regen/autograd/op_list.h"
#include "regen/core/io.h"
#include "regen/core/safetensors.h"
#include "regen/models/data.h"
#include "regen/models/layers.h"
#include "regen/models/model.h"
#include "regen/models/optim.h"
#include "regen/models/train.h"
#include "regen/session/checkpoint.h"
#include "regen/session/records.h"
#include "regen/session/session.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::error_of;

namespace {

std::map<std::string, Shape> shapes_of(const NamedTensors& named) {
  std::map<std::string, Shape> out;
  for (const auto& kv : named) out[kv.first] = kv.second.shape();
  return out;
}

// A folder of its own under the working directory (the build tree), removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "./models-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    path = name;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

std::vector<float> values(const Tensor& t) {
  return t.to_vector<float>();
}

Tensor image_batch(int64_t n, int64_t size, uint64_t seed) {
  Generator g(seed);
  return normal({n, 3, size, size}, 0.0, 1.0, g);
}

Tensor token_batch(int64_t n, int64_t seq, int64_t vocab, uint64_t seed) {
  Generator g(seed);
  return randint({n, seq}, vocab, g);
}

ModelConfig preset_with_seed(const std::string& name, uint64_t seed) {
  ModelConfig c = model_preset(name);
  c.seed = seed;
  return c;
}

// One ResNet against torchvision: entry count, parameter count (0: not checked), names, shapes.
void check_resnet(const std::string& name, size_t entries, int64_t params) {
  auto model = make_model(model_preset(name));
  const NamedTensors state = model->state_dict();
  CHECK(state.size() == entries);
  if (params) CHECK(model->num_parameters() == params);
  // torch order: the stem first, the classifier last.
  REQUIRE(!state.empty());
  CHECK(state.front().first == "conv1.weight");
  CHECK(state.back().first == "fc.bias");
  const auto shapes = shapes_of(state);
  CHECK(shapes.at("conv1.weight") == Shape{64, 3, 7, 7});
  CHECK(shapes.at("bn1.running_var") == Shape{64});
  CHECK(shapes.at("bn1.num_batches_tracked") == Shape{});
  const bool bottleneck = name != "resnet18" && name != "resnet34";
  CHECK(shapes.at("fc.weight") == Shape{1000, bottleneck ? 2048 : 512});
  CHECK(shapes.at("fc.bias") == Shape{1000});
  if (bottleneck) {
    CHECK(shapes.at("layer1.0.downsample.0.weight") == Shape{256, 64, 1, 1});
    CHECK(shapes.at("layer1.0.downsample.1.running_mean") == Shape{256});
    CHECK(shapes.at("layer1.0.conv3.weight") == Shape{256, 64, 1, 1});
    CHECK(shapes.at("layer4.0.conv2.weight") == Shape{512, 512, 3, 3});
  } else {
    CHECK(shapes.count("layer1.0.downsample.0.weight") == 0);  // 64 -> 64, stride 1
    CHECK(shapes.at("layer2.0.downsample.0.weight") == Shape{128, 64, 1, 1});
    CHECK(shapes.at("layer4.1.conv2.weight") == Shape{512, 512, 3, 3});
  }
  // Parameters carry their full names (memory tags, optimizer state).
  for (const auto& kv : model->named_parameters()) CHECK(kv.second.name() == kv.first);
}

}  // namespace

// Separate cases so that ctest -j builds the large models in parallel.
TEST_CASE("models: resnet18 matches torchvision's state dict") {
  check_resnet("resnet18", 122, 11689512);
}
TEST_CASE("models: resnet34 matches torchvision's state dict") {
  check_resnet("resnet34", 218, 0);
}
TEST_CASE("models: resnet50 matches torchvision's state dict") {
  check_resnet("resnet50", 320, 25557032);
}
TEST_CASE("models: resnet101 matches torchvision's state dict") {
  check_resnet("resnet101", 626, 0);
}
TEST_CASE("models: resnet152 matches torchvision's state dict") {
  check_resnet("resnet152", 932, 60192808);
}

TEST_CASE("models: --num-classes changes only fc, and resnet-tiny is the parity tests' model") {
  ModelConfig c = model_preset("resnet18");
  c.num_classes = 10;
  auto model = make_model(c);
  const auto shapes = shapes_of(model->state_dict());
  CHECK(shapes.at("fc.weight") == Shape{10, 512});
  CHECK(model->num_parameters() == 11689512 - 990 * 513);

  auto tiny = make_model(model_preset("resnet-tiny"));
  const auto t = shapes_of(tiny->state_dict());
  CHECK(t.at("conv1.weight") == Shape{8, 3, 7, 7});
  CHECK(t.at("fc.weight") == Shape{10, 256});
}

TEST_CASE("models: Transformer presets have torch.nn names and parameter counts") {
  // transformer: embeddings 30000x512 + 128x512, 6 x 3,152,384 per encoder layer, head 512->30000.
  auto model = make_model(model_preset("transformer"));
  CHECK(model->num_parameters() == 30000 * 512 + 128 * 512 + 6 * 3152384 + 512 * 30000 + 30000);
  CHECK(model->num_parameters() == 49729840);
  const NamedTensors state = model->state_dict();
  CHECK(state.size() == 2 + 6 * 12 + 2);
  const auto shapes = shapes_of(state);
  CHECK(state.front().first == "tok_emb.weight");
  CHECK(shapes.at("tok_emb.weight") == Shape{30000, 512});
  CHECK(shapes.at("pos_emb.weight") == Shape{128, 512});
  for (int i = 0; i < 6; ++i) {
    const std::string p = "encoder.layers." + std::to_string(i) + ".";
    CAPTURE(p);
    CHECK(shapes.at(p + "self_attn.in_proj_weight") == Shape{1536, 512});
    CHECK(shapes.at(p + "self_attn.in_proj_bias") == Shape{1536});
    CHECK(shapes.at(p + "self_attn.out_proj.weight") == Shape{512, 512});
    CHECK(shapes.at(p + "self_attn.out_proj.bias") == Shape{512});
    CHECK(shapes.at(p + "linear1.weight") == Shape{2048, 512});
    CHECK(shapes.at(p + "linear1.bias") == Shape{2048});
    CHECK(shapes.at(p + "linear2.weight") == Shape{512, 2048});
    CHECK(shapes.at(p + "linear2.bias") == Shape{512});
    CHECK(shapes.at(p + "norm1.weight") == Shape{512});
    CHECK(shapes.at(p + "norm2.bias") == Shape{512});
  }
  CHECK(shapes.count("encoder.layers.6.linear1.weight") == 0);
  CHECK(shapes.at("lm_head.weight") == Shape{30000, 512});
  CHECK(state.back().first == "lm_head.bias");

  // The tiny preset: vocabulary 101 (the parity fixtures' model), 2 layers of width 32.
  const ModelConfig tiny = model_preset("transformer-tiny");
  CHECK(tiny.vocab == 101);
  CHECK(tiny.seq_len == 16);
  auto t = make_model(tiny);
  CHECK(t->num_parameters() == 101 * 32 + 16 * 32 + 2 * 8544 + 32 * 101 + 101);
  CHECK(t->state_dict().size() == 2 + 2 * 12 + 2);

  // A larger vocabulary (--vocab) changes the embedding and the head only.
  ModelConfig big = tiny;
  big.vocab = 256;
  auto b = make_model(big);
  CHECK(b->num_parameters() - t->num_parameters() == (256 - 101) * (32 + 32 + 1));
  CHECK(shapes_of(b->state_dict()).at("lm_head.weight") == Shape{256, 32});
}

TEST_CASE("models: preset names and unknown names") {
  const auto names = model_preset_names();
  CHECK(names.size() == 12);  // 6 ResNets, 3 Transformers, 3 GPT-2s
  for (const std::string& n : names) CHECK(model_preset(n).name == n);
  const std::string msg = error_of([] { model_preset("resnet7"); });
  CHECK(msg.find("unknown model 'resnet7'") != std::string::npos);
  CHECK(msg.find("transformer-tiny") != std::string::npos);
}

TEST_CASE("models: batch norm uses batch statistics in training and running statistics in eval") {
  manual_seed(0);
  auto model = make_model(model_preset("resnet-tiny"));
  const Tensor x = image_batch(4, 32, 7);
  auto running = [&] {
    for (const auto& kv : model->state_dict()) {
      if (kv.first == "bn1.running_mean") return values(kv.second);
    }
    FAIL("no bn1.running_mean");
    return std::vector<float>();
  };
  auto tracked = [&] {
    for (const auto& kv : model->state_dict()) {
      if (kv.first == "bn1.num_batches_tracked") return kv.second.item<int64_t>();
    }
    return int64_t{-1};
  };
  const std::vector<float> mean0 = running();
  CHECK(tracked() == 0);
  REQUIRE(model->is_training());
  std::vector<float> train_out;
  {
    NoGradScope ng;
    train_out = values(model->forward(x));
  }
  const std::vector<float> mean1 = running();
  CHECK(mean1 != mean0);  // the batch statistics moved the running mean
  CHECK(tracked() == 1);

  model->eval();
  CHECK(!model->is_training());
  std::vector<float> eval_a, eval_b;
  {
    NoGradScope ng;
    eval_a = values(model->forward(x));
    eval_b = values(model->forward(x));
  }
  CHECK(eval_a == eval_b);    // running statistics: the same answer every time
  CHECK(running() == mean1);  // and they are not updated
  CHECK(tracked() == 1);
  CHECK(eval_a != train_out);  // batch statistics differ from the running ones

  model->train();
  CHECK(model->is_training());
}

TEST_CASE("models: dropout is active in training and the identity in eval") {
  const ModelConfig with = model_preset("transformer-tiny");  // dropout 0.1
  REQUIRE(with.dropout > 0.0f);
  ModelConfig without = with;
  without.dropout = 0.0f;
  manual_seed(3);
  auto a = make_model(with);
  auto b = make_model(without);  // same seed: the same parameters
  b->eval();
  const Tensor tokens = token_batch(2, 16, with.vocab, 5);
  NoGradScope ng;
  const std::vector<float> train1 = values(a->forward(tokens));
  const std::vector<float> train2 = values(a->forward(tokens));
  CHECK(train1 != train2);  // fresh masks each forward
  a->eval();
  const std::vector<float> eval1 = values(a->forward(tokens));
  const std::vector<float> eval2 = values(a->forward(tokens));
  CHECK(eval1 == eval2);
  CHECK(eval1 == values(b->forward(tokens)));  // eval ignores p
  CHECK(eval1 != train1);
}

TEST_CASE("models: state_dict saved and loaded gives identical outputs") {
  TempDir dir;
  for (const std::string name : {"resnet-tiny", "transformer-tiny"}) {
    CAPTURE(name);
    manual_seed(11);
    auto src = make_model(preset_with_seed(name, 1));
    auto dst = make_model(preset_with_seed(name, 2));  // different initial weights
    const bool resnet = name == "resnet-tiny";
    const Tensor input = resnet ? image_batch(2, 32, 9) : token_batch(2, 16, 101, 9);
    {
      NoGradScope ng;
      src->forward(input);  // moves batch-norm running statistics away from their start
    }
    const std::string path = dir.file(name + ".safetensors");
    save_safetensors(path, src->state_dict(), {{"model", name}});
    const SafetensorsFile file = load_safetensors(path);
    CHECK(file.tensors.size() == src->state_dict().size());
    CHECK(file.metadata.at("model") == name);
    src->eval();
    dst->eval();
    NoGradScope ng;
    const std::vector<float> before = values(dst->forward(input));
    const std::vector<float> want = values(src->forward(input));
    CHECK(before != want);
    dst->load_state_dict(file.tensors);
    CHECK(values(dst->forward(input)) == want);  // bitwise
    const NamedTensors a = src->state_dict(), b = dst->state_dict();
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].first == b[i].first);
      if (a[i].second.dtype() == DType::f32)
        CHECK(values(a[i].second) == values(b[i].second));
      else
        CHECK(a[i].second.item<int64_t>() == b[i].second.item<int64_t>());
    }
  }
}

TEST_CASE("models: load_state_dict leads with the matched count and changes nothing on failure") {
  auto resnet = make_model(model_preset("resnet-tiny"));
  auto transformer = make_model(model_preset("transformer-tiny"));
  const size_t n = transformer->state_dict().size();
  const std::string msg = error_of([&] { transformer->load_state_dict(resnet->state_dict()); });
  CHECK(msg.find("0 of the model's " + std::to_string(n) + " names match") != std::string::npos);
  CHECK(msg.find("missing " + std::to_string(n) + " entries: tok_emb.weight") != std::string::npos);
  CHECK(msg.find("unexpected: conv1.weight") != std::string::npos);

  // One wrong shape: nothing is copied, not even the entries before it.
  auto other = make_model(preset_with_seed("transformer-tiny", 5));
  NamedTensors state;
  for (const auto& kv : other->state_dict()) state.emplace_back(kv.first, kv.second.clone());
  state.back().second = zeros({3});  // lm_head.bias
  const std::vector<float> tok_before = values(transformer->state_dict().front().second);
  const std::string shape_msg = error_of([&] { transformer->load_state_dict(state); });
  CHECK(shape_msg.find("'lm_head.bias' has shape [3] but the model expects [101]") !=
        std::string::npos);
  CHECK(values(transformer->state_dict().front().second) == tok_before);

  // Non-strict loading takes what matches and ignores the rest.
  NamedTensors partial(state.begin(), state.begin() + 1);
  partial.emplace_back("not.a.parameter", zeros({1}));
  transformer->load_state_dict(partial, false);
  CHECK(values(transformer->state_dict().front().second) == values(state.front().second));
}

TEST_CASE("data: synthetic and text batches have the model's shapes, and bad specs are clear") {
  TempDir dir;
  const ModelConfig resnet = model_preset("resnet-tiny");
  auto images = make_data_source("", resnet, 0);
  const Batch b = images->next(3, Device::cpu());
  CHECK(b.input.shape() == Shape{3, 3, 32, 32});
  CHECK(b.target.shape() == Shape{3});
  for (int64_t label : b.target.to_vector<int64_t>()) CHECK((label >= 0 && label < 10));

  ModelConfig lm = model_preset("transformer-tiny");
  auto tokens = make_data_source("synthetic", lm, 0);
  const Batch t = tokens->next(2, Device::cpu());
  CHECK(t.input.shape() == Shape{2, 16});
  CHECK(t.target.shape() == Shape{2, 16});

  // Text as bytes: targets are the inputs shifted by one.
  const std::string path = dir.file("text.txt");
  write_file_atomic(path,
                    "the quick brown fox jumps over the lazy dog, twice: the quick brown fox");
  CHECK(error_of([&] { make_data_source("text:" + path, lm, 0); }).find("--vocab 256") !=
        std::string::npos);
  lm.vocab = 256;
  auto text = make_data_source("text:" + path, lm, 0);
  const Batch tb = text->next(2, Device::cpu());
  const std::vector<int64_t> in = tb.input.to_vector<int64_t>(),
                             out = tb.target.to_vector<int64_t>();
  for (size_t i = 0; i + 1 < 16; ++i) CHECK(out[i] == in[i + 1]);

  CHECK(error_of([&] {
          make_data_source("text:" + dir.path, lm, 0);
        }).find("is a directory, not a regular file") != std::string::npos);
  write_file_atomic(dir.file("empty.txt"), "");
  CHECK(error_of([&] {
          make_data_source("text:" + dir.file("empty.txt"), lm, 0);
        }).find("the file is empty") != std::string::npos);
  CHECK(error_of([&] {
          make_data_source("cifar10:" + dir.file("none"), resnet, 0);
        }).find("cannot open") != std::string::npos);
  CHECK(error_of([&] {
          make_data_source("cifar10:" + path, resnet, 0);
        }).find("is not a directory") != std::string::npos);
  // Each model takes the data its input names: an image model no text.
  CHECK(error_of([&] {
          make_data_source("text:" + path, resnet, 0);
        }).find("model 'resnet-tiny' takes synthetic, cifar10:DIR") != std::string::npos);
  CHECK(error_of([&] { make_data_source("imagenet:x", resnet, 0); }).find("bad --data") !=
        std::string::npos);
}

TEST_CASE("train: every step starts from the same allocator layout (same peak every step)") {
  manual_seed(0);
  const ModelConfig c = model_preset("transformer-tiny");
  auto model = make_model(c);
  SGDOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  SGD opt(model->parameters(), o);
  auto data = make_data_source("", c, 0);
  Trainer trainer(*model, opt, *data, 2, Device::cpu());
  std::vector<StepResult> steps;
  for (int i = 0; i < 4; ++i) steps.push_back(trainer.step());
  for (const StepResult& r : steps) CHECK(std::isfinite(r.loss));
  // Gradients and optimizer state exist from the first step on: every step's peak is the same.
  for (int i = 1; i < 4; ++i) {
    CHECK(steps[i].memory.allocated.peak == steps[0].memory.allocated.peak);
  }
}

namespace {
struct HeadStep {
  double loss = 0;
  std::vector<std::vector<float>> grads, params;
  int64_t peak = 0;
  std::vector<OpKind> kinds;  // the ops of the step's forward
};

// Records the op kinds of the step's forward (backward releases the tape).
class KindRecorder : public TapeHooks {
 public:
  std::vector<OpKind> kinds;
  void on_forward_end(Tape& tape, int32_t node, const std::vector<Tensor>&) override {
    kinds.push_back(tape.node(node).kind);
  }
};

// One Trainer step (SGD) of `config` from a fresh allocator, dropout on.
HeadStep head_step(const ModelConfig& config, int64_t batch) {
  allocator_for(Device::cpu()).empty_cache();
  manual_seed(7);
  auto model = make_model(config);
  SGDOptions o;
  o.lr = 0.1;
  SGD opt(model->parameters(), o);
  auto data = make_data_source("", config, 3);
  Trainer trainer(*model, opt, *data, batch, Device::cpu());
  KindRecorder rec;
  StepResult r;
  {
    const HooksScope hooks(&rec);
    r = trainer.step();
  }
  HeadStep s;
  s.loss = r.loss;
  s.peak = r.memory.allocated.peak;
  s.kinds = rec.kinds;
  for (const Tensor& p : model->parameters()) {
    s.grads.push_back(values(p.grad()));
    s.params.push_back(values(p));
  }
  return s;
}

// max |a - b| <= rtol * max |b| over each tensor.
void check_close_scaled(const std::vector<std::vector<float>>& a,
                        const std::vector<std::vector<float>>& b, double rtol,
                        const std::string& what) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    double scale = 0, worst = 0;
    for (size_t j = 0; j < a[i].size(); ++j) {
      scale = std::max(scale, static_cast<double>(std::fabs(b[i][j])));
      worst = std::max(worst, static_cast<double>(std::fabs(a[i][j] - b[i][j])));
    }
    CHECK_MESSAGE(worst <= rtol * scale + 1e-12, what, " ", i, ": max error ", worst,
                  " against max |value| ", scale);
  }
}
}  // namespace

TEST_CASE("train: the fused LM head gives the unfused step's loss and gradients at a lower peak") {
  // transformer-tiny with a 4000-word vocabulary at batch 8: the (128, 4000) logits are 2 MB,
  // and unfused training holds them and their gradient at once; fused in chunks of 24 rows it
  // holds 384 kB of them at a time.
  ModelConfig c = model_preset("transformer-tiny");
  c.vocab = 4000;
  CHECK(c.head_chunk_rows == 0);  // fused, automatic chunks: every preset's default
  c.head_chunk_rows = -1;
  const HeadStep unfused = head_step(c, 8);
  CHECK(std::count(unfused.kinds.begin(), unfused.kinds.end(), OpKind::cross_entropy) == 1);
  CHECK(std::count(unfused.kinds.begin(), unfused.kinds.end(), OpKind::linear_cross_entropy) == 0);
  for (const int64_t chunk : {int64_t{24}, int64_t{0}}) {
    CAPTURE(chunk);
    c.head_chunk_rows = chunk;
    const HeadStep fused = head_step(c, 8);
    CHECK(std::count(fused.kinds.begin(), fused.kinds.end(), OpKind::cross_entropy) == 0);
    CHECK(std::count(fused.kinds.begin(), fused.kinds.end(), OpKind::linear_cross_entropy) == 1);
    CHECK(fused.loss == doctest::Approx(unfused.loss).epsilon(1e-6));
    check_close_scaled(fused.grads, unfused.grads, 1e-5, "gradient");
    check_close_scaled(fused.params, unfused.params, 1e-6, "parameter after the step");
    const int64_t logits_bytes = 8 * 16 * 4000 * 4;
    MESSAGE("peak allocated: unfused ", unfused.peak, " B, fused (chunk ", chunk, ") ", fused.peak,
            " B");
    if (chunk > 0)
      CHECK(fused.peak + logits_bytes <= unfused.peak);  // at least one (M, V) less
    else
      CHECK(fused.peak < unfused.peak);  // auto: one chunk of 128 rows, still no dlogits
  }
  // forward() still returns the logits, the same whichever way training computes the loss.
  c.head_chunk_rows = 0;
  auto model = make_model(c);
  const Tensor tokens = token_batch(2, 16, c.vocab, 5);
  Tensor logits;
  {
    NoGradScope ng;
    logits = model->forward(tokens);
  }
  CHECK(logits.shape() == Shape{2, 16, 4000});
  // A bad setting is refused when the model is built.
  c.head_chunk_rows = -2;
  CHECK(error_of([&] { make_model(c); }).find("head_chunk_rows -2") != std::string::npos);
}

TEST_CASE("train: the fused LM head recomputing its logits gives the same step") {
  // head_recompute 1: the backward computes the logits again by vocabulary tiles (its lower peak
  // in 16 bits: tests/test_amp_gemm_ops.cpp).
  ModelConfig c = model_preset("transformer-tiny");
  c.vocab = 4000;
  CHECK(c.head_recompute == 0);  // gradients in the forward: every preset's default
  const HeadStep forward_grads = head_step(c, 8);
  c.head_recompute = 1;
  const HeadStep recomputed = head_step(c, 8);
  CHECK(std::count(recomputed.kinds.begin(), recomputed.kinds.end(),
                   OpKind::linear_cross_entropy) == 1);
  CHECK(recomputed.loss == forward_grads.loss);  // the same forward
  check_close_scaled(recomputed.grads, forward_grads.grads, 1e-5, "gradient");
  check_close_scaled(recomputed.params, forward_grads.params, 1e-6, "parameter after the step");
  // Only with the fused head, and only 0 or 1: refused when the model is built.
  c.head_chunk_rows = -1;
  CHECK(error_of([&] { make_model(c); }).find("head_recompute 1 recomputes the fused head") !=
        std::string::npos);
  c.head_chunk_rows = 0;
  c.head_recompute = 2;
  CHECK(error_of([&] { make_model(c); }).find("head_recompute 2 must be 0") != std::string::npos);
}

namespace {

// An MLP on images of any size, registered from outside with its own option --hidden: what the
// session, the command line and Python give any registered model.
class Mlp : public Model {
 public:
  Mlp(const ModelConfig& c, Device device) : Model(c) {
    Generator gen(c.seed);
    const int64_t hidden = static_cast<int64_t>(c.params.at("hidden"));
    fc1_ = &register_module("fc1", std::make_unique<Linear>("fc1", 3 * c.image_size * c.image_size,
                                                            hidden, true, gen, device));
    fc2_ = &register_module(
        "fc2", std::make_unique<Linear>("fc2", hidden, c.num_classes, true, gen, device));
    assign_full_names();
  }
  Tensor forward(const Tensor& x) override {
    return fc2_->forward(relu(fc1_->forward(flatten(x))));
  }
  Tensor loss(const Tensor& logits, const Tensor& target) const override {
    return cross_entropy(logits, target);
  }
  void check_batch(const Batch&) const override {}

 private:
  Linear *fc1_, *fc2_;
};

ModelInput mlp_input() {
  ModelInput in = image_classifier_input();
  ModelOption hidden =
      param_option("hidden", "the MLP's hidden width", OptionRange::integers(1, 4096), 32);
  hidden.sizes_parameters = true;
  in.options.push_back(hidden);
  return in;
}

void register_mlps() {
  static const bool done = [] {
    ModelConfig preset;
    preset.image_size = 32;
    preset.num_classes = 10;
    preset.params["hidden"] = 32;
    auto build = [](const ModelConfig& c, Device d) { return std::make_unique<Mlp>(c, d); };
    register_model({"mlp-test", "an MLP on images (a test model)", preset, build, mlp_input()});
    // Its data makes images twice the size its input describes.
    ModelInput wrong = mlp_input();
    wrong.data[0].make = [](const std::string& arg, const ModelConfig& c, uint64_t seed,
                            OptionStyle style) {
      ModelConfig larger = c;
      larger.image_size *= 2;
      return synthetic_images_data().make(arg, larger, seed, style);
    };
    register_model({"mlp-wrong-data", "an MLP whose data is not its input", preset, build, wrong});
    return true;
  }();
  (void)done;
}

}  // namespace

TEST_CASE("models: a registered model owns its input: options, checks and data, in a session") {
  register_mlps();
  SessionOptions o;
  o.model = "mlp-test";
  o.batch = 4;
  o.device = "cpu";
  o.model_options = {{"image_size", 16}, {"hidden", 8}};
  // 16x16 images: only ResNet's five downsamplings need 32, and an MLP is no ResNet.
  auto s = make_session(o);
  CHECK(s->config.image_size == 16);
  CHECK(s->config.params.at("hidden") == 8);
  CHECK(s->model->num_parameters() == (768 * 8 + 8) + (8 * 10 + 10));
  const StepResult r = s->trainer->step();
  CHECK(std::isfinite(r.loss));
  CHECK(r.memory.allocated.peak == s->preflight.memory.allocated.peak);  // the dry run, exact
  const std::map<std::string, std::string> run = run_flags(o);
  CHECK(run.at("--image-size") == "16");
  CHECK(run.at("--hidden") == "8");
  CHECK(run.count("--seq-len") == 0);

  TempDir dir;
  const std::string ckpt = dir.file("mlp.safetensors");
  save_checkpoint(*s, ckpt, 1);
  CHECK(load_safetensors(ckpt).metadata.at("hidden") == "8");
  SessionOptions wider = o;
  wider.model_options["hidden"] = 16;
  auto w = make_session(wider);
  CHECK(error_of([&] {
          load_checkpoint(*w, ckpt);
        }).find("was saved from mlp-test with --hidden 8, but this run's model has 16") !=
        std::string::npos);

  SessionOptions bad = o;
  bad.model_options["hidden"] = 0;
  CHECK(error_of([&] { bad.validate(); }).find("--hidden must be a positive integer, got 0 [") ==
        0);
  bad.style = OptionStyle::keyword;
  CHECK(error_of([&] { bad.validate(); }).find("hidden=0: must be a positive integer [") == 0);
  bad = o;
  bad.model = "resnet-tiny";
  CHECK(error_of([&] { bad.validate(); })
            .find("--hidden does not apply to model 'resnet-tiny' (its options: --image-size, "
                  "--num-classes)") == 0);
  bad.model_options.erase("hidden");
  CHECK(error_of([&] {
          bad.validate();
        }).find("--image-size 16 is too small for ResNet's five downsamplings") == 0);
  bad = o;
  bad.data = "text:book.txt";
  CHECK(error_of([&] {
          bad.validate();
        }).find("bad --data text:book.txt: model 'mlp-test' takes synthetic, cifar10:DIR") == 0);
  bad.data = "cifar10:" + dir.path;  // CIFAR-10's 32x32 images need --image-size 32
  CHECK(error_of([&] { bad.validate(); }).find("(use --image-size 32)") != std::string::npos);

  // A source that makes other batches than the model's input describes (and its dry run
  // allocated) is stopped at its first batch.
  SessionOptions wrong = o;
  wrong.model = "mlp-wrong-data";
  auto ws = make_session(wrong);
  const std::string e = error_of([&] { ws->trainer->step(); });
  CHECK(e.find("made a batch of") != std::string::npos);
  CHECK(e.find("but model 'mlp-wrong-data' describes its input as f32 [4, 3, 16, 16] and i64 "
               "[4]") != std::string::npos);
}

TEST_CASE("models: register_model refuses an input it cannot serve") {
  register_mlps();
  ModelConfig preset;
  auto build = [](const ModelConfig& c, Device d) { return std::make_unique<Mlp>(c, d); };
  ModelInput none;
  CHECK(error_of([&] {
          register_model({"no-input", "x", preset, build, none});
        }).find("describes no input batch") != std::string::npos);
  ModelInput no_data = image_classifier_input();
  no_data.data.clear();
  CHECK(error_of([&] {
          register_model({"no-data", "x", preset, build, no_data});
        }).find("names no data that can feed it") != std::string::npos);
  ModelInput reserved = image_classifier_input();
  reserved.options.push_back(param_option("lr", "", OptionRange::numbers(0), 1));
  CHECK(error_of([&] {
          register_model({"lr-option", "x", preset, build, reserved});
        }).find("option 'lr' is the session's own") != std::string::npos);
  // One flag serves every model with the option: an integer for one is an integer for all.
  ModelInput as_number = image_classifier_input();
  as_number.options[0].range = OptionRange::numbers(1);
  CHECK(error_of([&] {
          register_model({"float-size", "x", preset, build, as_number});
        }).find("option 'image_size' is a number, but model 'resnet18' has it as an integer") !=
        std::string::npos);
  CHECK(error_of([] { model_preset("no-input"); }).find("unknown model 'no-input'") == 0);
}
