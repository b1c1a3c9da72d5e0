// llm.c's formats (models/gpt2_llmc.h): a GPT-2 checkpoint written and read back (header, size,
// llm.c's parameter order, bfloat16 version 5), token shards and `--data tokens:FILE` (llm.c's
// batch layout), and the errors for bad files (magic, version, truncation, sizes that do not match
// the model, tokens outside the vocabulary, a model that is not a GPT-2).
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "regen/core/half.h"
#include "regen/core/io.h"
#include "regen/models/data.h"
#include "regen/models/gpt2.h"
#include "regen/models/gpt2_llmc.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::expect_error;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char name[] = "./llmc-XXXXXX";
    REQUIRE(::mkdtemp(name) != nullptr);
    path = name;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

int32_t int_at(const std::string& bytes, size_t i) {
  int32_t v;
  std::memcpy(&v, bytes.data() + 4 * i, 4);
  return v;
}
void set_int(std::string& bytes, size_t i, int32_t v) {
  std::memcpy(&bytes[4 * i], &v, 4);
}
float float_at(const std::string& bytes, size_t byte_offset) {
  float v;
  std::memcpy(&v, bytes.data() + byte_offset, 4);
  return v;
}

const Tensor& param(const Model& m, const std::string& name) {
  static NamedTensors keep;
  keep = m.named_parameters();
  for (const auto& kv : keep) {
    if (kv.first == name) return kv.second;
  }
  FAIL("no parameter ", name);
  return keep.front().second;
}

}  // namespace

TEST_CASE("gpt2 llm.c checkpoint: written in llm.c's layout and read back exactly") {
  TempDir dir;
  ModelConfig c = model_preset("gpt2-tiny");
  auto model = make_model(c);
  const std::string path = dir.file("tiny.bin");
  save_llmc_checkpoint(*model, path);
  const std::string bytes = read_file(path);
  REQUIRE(bytes.size() == 1024 + 4 * 30080);
  CHECK(int_at(bytes, 0) == kLlmcCheckpointMagic);
  CHECK(int_at(bytes, 1) == 3);
  CHECK(int_at(bytes, 2) == 16);   // maxT
  CHECK(int_at(bytes, 3) == 100);  // V
  CHECK(int_at(bytes, 4) == 2);    // L
  CHECK(int_at(bytes, 5) == 4);    // NH
  CHECK(int_at(bytes, 6) == 32);   // C
  CHECK(int_at(bytes, 7) == 128);  // Vp
  for (size_t i = 8; i < 256; ++i) REQUIRE(int_at(bytes, i) == 0);
  // llm.c's order: wte (128 x 32), wpe (16 x 32), then ln_1.weight of layers 0 and 1, ln_1.bias of
  // both, then c_attn.weight of layer 0 (96 x 32) then of layer 1, ...
  const size_t wpe = 1024 + 4 * 128 * 32;
  CHECK(float_at(bytes, wpe) == param(*model, "wpe.weight").to_vector<float>()[0]);
  const size_t ln1b = wpe + 4 * (16 * 32 + 2 * 32);
  CHECK(float_at(bytes, ln1b - 4) == 1.0f);  // layer 1's ln_1.weight, last element
  CHECK(float_at(bytes, ln1b) == 0.0f);
  const size_t qkv1 = ln1b + 4 * (2 * 32 + 96 * 32);
  CHECK(float_at(bytes, qkv1 + 4 * 5) ==
        param(*model, "h.1.attn.c_attn.weight").to_vector<float>()[5]);
  CHECK(float_at(bytes, bytes.size() - 4 * 33) ==
        param(*model, "ln_f.weight").to_vector<float>()[31]);

  ModelConfig other = c;
  other.seed = 99;
  auto fresh = make_model(other);
  CHECK(param(*fresh, "wte.weight").to_vector<float>() !=
        param(*model, "wte.weight").to_vector<float>());
  load_llmc_checkpoint(*fresh, path);
  for (const auto& kv : model->named_parameters()) {
    CHECK_MESSAGE(param(*fresh, kv.first).to_vector<float>() == kv.second.to_vector<float>(),
                  kv.first);
  }
  const LlmcHeader h = read_llmc_header(path);
  CHECK(h.padded_vocab == 128);
  const ModelConfig from = gpt2_config_from_llmc(path, model_preset("gpt2"));
  CHECK(from.vocab == 100);
  CHECK(from.seq_len == 16);
  CHECK(from.d_model == 32);
  CHECK(from.ff == 128);
  CHECK(from.layers == 2);
  CHECK(from.heads == 4);

  // Version 5: the same parameters in bfloat16.
  std::string bf = bytes.substr(0, 1024);
  set_int(bf, 1, 5);
  for (size_t at = 1024; at < bytes.size(); at += 4) {
    const uint16_t b = half::to_bf16(float_at(bytes, at));
    bf.append(reinterpret_cast<const char*>(&b), 2);
  }
  write_bytes(dir.file("bf16.bin"), bf);
  load_llmc_checkpoint(*fresh, dir.file("bf16.bin"));
  const std::vector<float> a = param(*fresh, "h.0.mlp.c_fc.weight").to_vector<float>();
  const std::vector<float> b = param(*model, "h.0.mlp.c_fc.weight").to_vector<float>();
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == half::from_bf16(half::to_bf16(b[i])));
}

TEST_CASE("gpt2 llm.c checkpoint: bad files are clear errors naming the file") {
  TempDir dir;
  auto model = make_model(model_preset("gpt2-tiny"));
  const std::string good = dir.file("good.bin");
  save_llmc_checkpoint(*model, good);
  const std::string bytes = read_file(good);
  auto variant = [&](const std::string& name, const std::string& content) {
    const std::string p = dir.file(name);
    write_bytes(p, content);
    return p;
  };
  std::string magic = bytes;
  set_int(magic, 0, 1234);
  expect_error([&] { load_llmc_checkpoint(*model, variant("magic.bin", magic)); },
               {"magic.bin", "bad magic 1234", "20240326"});
  std::string version = bytes;
  set_int(version, 1, 4);
  expect_error([&] { load_llmc_checkpoint(*model, variant("version.bin", version)); },
               {"version.bin", "version 4"});
  expect_error(
      [&] {
        load_llmc_checkpoint(*model, variant("short.bin", bytes.substr(0, bytes.size() - 8)));
      },
      {"short.bin", "truncated"});
  expect_error([&] { load_llmc_checkpoint(*model, variant("tiny.bin", bytes.substr(0, 100))); },
               {"tiny.bin", "100 bytes", "header"});
  expect_error([&] { read_llmc_header(dir.file("missing.bin")); }, {"missing.bin"});
  // The header alone is read, and checked against the file's size.
  expect_error([&] { read_llmc_header(dir.file("short.bin")); }, {"short.bin", "truncated"});
  expect_error([&] { read_llmc_header(dir.file("tiny.bin")); }, {"tiny.bin", "100 bytes"});
  ModelConfig bigger = model_preset("gpt2-tiny");
  bigger.vocab = 300;
  auto other = make_model(bigger);
  expect_error([&] { load_llmc_checkpoint(*other, good); },
               {"good.bin", "vocab 100 (padded 128)", "vocab 300 (padded 384)"});
  std::string nan = bytes;
  const float bad = std::nanf("");
  std::memcpy(&nan[1024 + 4 * 7], &bad, 4);
  expect_error([&] { load_llmc_checkpoint(*model, variant("nan.bin", nan)); },
               {"nan.bin", "wte.weight element 7", "not finite"});
  auto resnet = make_model(model_preset("resnet-tiny"));
  expect_error([&] { save_llmc_checkpoint(*resnet, dir.file("r.bin")); },
               {"r.bin", "resnet-tiny", "not a GPT-2"});
  // A token shard is not a checkpoint.
  write_llmc_tokens(dir.file("tokens.bin"), {1, 2, 3});
  expect_error([&] { load_llmc_checkpoint(*model, dir.file("tokens.bin")); },
               {"tokens.bin", "bad magic 20240520"});
}

TEST_CASE("gpt2 llm.c tokens: shards and --data tokens:FILE in llm.c's batch layout") {
  TempDir dir;
  std::vector<uint16_t> tokens(100);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 97);
  const std::string path = dir.file("train.bin");
  write_llmc_tokens(path, tokens);
  CHECK(read_llmc_tokens(path) == tokens);
  CHECK(read_file(path).size() == 1024 + 200);

  ModelConfig c = model_preset("gpt2-tiny");  // seq_len 16: (100 - 1) / 16 = 6 windows
  auto src = make_data_source("tokens:" + path, c, 0);
  Batch b = src->next(2, Device::cpu());
  REQUIRE(b.input.shape() == Shape{2, 16});
  const std::vector<int64_t> in = b.input.to_vector<int64_t>(), out = b.target.to_vector<int64_t>();
  for (int64_t i = 0; i < 32; ++i) {
    CHECK(in[static_cast<size_t>(i)] == i);       // B * T consecutive tokens ...
    CHECK(out[static_cast<size_t>(i)] == i + 1);  // ... and the next ones as targets
  }
  src->skip(3);  // windows 2, 3, 4
  CHECK(src->position() == "sample=5");
  b = src->next(2, Device::cpu());  // window 5, then window 0 again
  CHECK(b.input.to_vector<int64_t>()[0] == 80);
  CHECK(b.input.to_vector<int64_t>()[16] == 0);
  src->set_position("sample=1");
  CHECK(src->next(1, Device::cpu()).input.to_vector<int64_t>()[0] == 16);
  expect_error([&] { src->set_position("epoch=1"); }, {"sample=N"});

  // A held-out tail of 20% (20 tokens): one window of 16 and its next token, in order; training
  // then draws from the first 80 tokens only ((80 - 1) / 16 = 4 windows).
  auto eval = make_eval_source("tokens:" + path, c, 0, 0.2);
  REQUIRE(eval->size() == 1);
  const Batch e = eval->next(4, Device::cpu());
  CHECK(e.input.shape() == Shape{1, 16});
  CHECK(e.input.to_vector<int64_t>()[0] == 80);
  CHECK(e.target.to_vector<int64_t>()[15] == 96);
  auto train = make_training_source("tokens:" + path, c, 0, 0.2);
  CHECK_MESSAGE(
      train->describe().find("4 windows of 16, the last 20 held out") != std::string::npos,
      train->describe());
  train->skip(4);
  CHECK(train->next(1, Device::cpu()).input.to_vector<int64_t>()[0] == 0);  // wrapped
  expect_error([&] { make_eval_source("tokens:" + path, c, 0, 0.1); },
               {"train.bin", "held-out last 10 tokens", "no window"});

  tokens[42] = 100;  // the vocabulary is 100: ids 0..99
  write_llmc_tokens(dir.file("big.bin"), tokens);
  expect_error([&] { make_data_source("tokens:" + dir.file("big.bin"), c, 0); },
               {"--data tokens:", "big.bin", "token 100 at position 42", "gpt2-tiny"});
  write_llmc_tokens(dir.file("short.bin"), {1, 2, 3});
  expect_error([&] { make_data_source("tokens:" + dir.file("short.bin"), c, 0); },
               {"short.bin", "3 tokens"});
  std::string bytes = read_file(path);
  set_int(bytes, 1, 2);
  write_bytes(dir.file("v2.bin"), bytes);
  expect_error([&] { read_llmc_tokens(dir.file("v2.bin")); }, {"v2.bin", "version 2"});
  write_bytes(dir.file("cut.bin"), read_file(path).substr(0, 1100));
  expect_error([&] { read_llmc_tokens(dir.file("cut.bin")); }, {"cut.bin", "truncated"});
  // Only GPT-2 takes llm.c tokens.
  expect_error([&] { make_data_source("tokens:" + path, model_preset("transformer-tiny"), 0); },
               {"tokens"});
}
