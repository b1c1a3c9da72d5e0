// GPT-2 (models/gpt2.h): the presets' parameter names, shapes and counts (llm.c's train_gpt2.c
// prints 124,475,904 parameters for GPT-2 124M at the padded vocabulary 50304), the padded rows of
// the tied embedding (zero, never a class, never a gradient), the fused head and loss against the
// unfused one, the initialization's scales, and the PyTorch parity of 20 AdamW steps
// (tools/make_gpt2_reference.py wrote tests/data/gpt2-tiny_adamw.safetensors with
// tools/torch_gpt2.py).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "regen/core/safetensors.h"
#include "regen/models/gpt2.h"
#include "regen/models/model.h"
#include "regen/models/optim.h"
#include "tests/test_util.h"

using namespace regen;

namespace {

std::string data(const std::string& f) {
  return std::string(REGEN_TEST_DATA) + "/" + f;
}

const Tensor* find(const NamedTensors& named, const std::string& name) {
  for (const auto& kv : named) {
    if (kv.first == name) return &kv.second;
  }
  return nullptr;
}

double stddev(const Tensor& t) {
  const std::vector<float> v = t.to_vector<float>();
  double s = 0, s2 = 0;
  for (float x : v) {
    s += x;
    s2 += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(v.size());
  return std::sqrt(std::max(0.0, s2 / n - (s / n) * (s / n)));
}

// Tokens (B, S) from a small LCG, below `vocab`.
Tensor tokens(int64_t B, int64_t S, int64_t vocab, uint64_t seed) {
  std::vector<int64_t> v(static_cast<size_t>(B * S));
  uint64_t x = seed;
  for (auto& t : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t = static_cast<int64_t>((x >> 33) % static_cast<uint64_t>(vocab));
  }
  return from_vector<int64_t>(v, {B, S});
}

}  // namespace

TEST_CASE("gpt2: presets, parameter names, shapes and counts") {
  CHECK(gpt2_padded_vocab(50257) == 50304);
  CHECK(gpt2_padded_vocab(128) == 128);
  CHECK(gpt2_padded_vocab(100) == 128);
  const ModelConfig big = model_preset("gpt2");
  CHECK(big.vocab == 50257);
  CHECK(big.seq_len == 1024);
  CHECK(big.d_model == 768);
  CHECK(big.layers == 12);
  CHECK(big.heads == 12);
  CHECK(big.ff == 3072);
  const ModelConfig medium = model_preset("gpt2-medium");
  CHECK(medium.d_model == 1024);
  CHECK(medium.layers == 24);
  CHECK(medium.heads == 16);
  // The parameter count at the padded vocabulary, by llm.c's sizes (wte Vp C, wpe maxT C, per
  // layer 12 C^2 + 13 C, ln_f 2 C): 124,475,904 for GPT-2 124M, without building it.
  auto count = [](const ModelConfig& c) {
    const int64_t C = c.d_model;
    return gpt2_padded_vocab(c.vocab) * C + c.seq_len * C + c.layers * (12 * C * C + 13 * C) +
           2 * C;
  };
  CHECK(count(big) == 124475904);

  ModelConfig c = model_preset("gpt2-tiny");
  auto model = make_model(c);
  const NamedTensors p = model->named_parameters();
  CHECK(model->num_parameters() == count(c));
  const std::vector<std::string> want = {
      "wte.weight",          "wpe.weight",          "h.0.ln_1.weight",          "h.0.ln_1.bias",
      "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias", "h.0.attn.c_proj.weight",
      "h.0.attn.c_proj.bias",   "h.0.ln_2.weight",      "h.0.ln_2.bias",
      "h.0.mlp.c_fc.weight",    "h.0.mlp.c_fc.bias",    "h.0.mlp.c_proj.weight",
      "h.0.mlp.c_proj.bias"};
  REQUIRE(p.size() == 2 + 12 * static_cast<size_t>(c.layers) + 2);
  for (size_t i = 0; i < want.size(); ++i) CHECK(p[i].first == want[i]);
  CHECK(p[p.size() - 2].first == "ln_f.weight");
  CHECK(p.back().first == "ln_f.bias");
  CHECK(find(p, "wte.weight")->shape() == Shape{128, 32});
  CHECK(find(p, "wpe.weight")->shape() == Shape{16, 32});
  CHECK(find(p, "h.1.attn.c_attn.weight")->shape() == Shape{96, 32});
  CHECK(find(p, "h.1.mlp.c_proj.weight")->shape() == Shape{32, 128});
}

TEST_CASE("gpt2: initialization scales and the zero padded rows") {
  ModelConfig c = model_preset("gpt2-tiny");
  c.d_model = 64;
  c.ff = 256;
  c.layers = 4;
  auto model = make_model(c);
  const NamedTensors p = model->named_parameters();
  const std::vector<float> wte = find(p, "wte.weight")->to_vector<float>();
  // Rows V..Vp zero; the real rows drawn with std 0.02 (100 x 64 draws: within 10%).
  for (int64_t i = c.vocab * c.d_model; i < 128 * c.d_model; ++i) REQUIRE(wte[i] == 0.0f);
  const Tensor real = find(p, "wte.weight")->narrow0(0, c.vocab);
  CHECK(stddev(real) == doctest::Approx(0.02).epsilon(0.1));
  CHECK(stddev(*find(p, "h.0.mlp.c_fc.weight")) == doctest::Approx(0.02).epsilon(0.1));
  const double residual = 0.02 / std::sqrt(2.0 * c.layers);
  CHECK(stddev(*find(p, "h.3.mlp.c_proj.weight")) == doctest::Approx(residual).epsilon(0.1));
  CHECK(stddev(*find(p, "h.3.attn.c_proj.weight")) == doctest::Approx(residual).epsilon(0.1));
  for (const char* zero : {"h.0.attn.c_attn.bias", "h.2.mlp.c_proj.bias", "ln_f.bias"}) {
    for (float v : find(p, zero)->to_vector<float>()) REQUIRE(v == 0.0f);
  }
  for (float v : find(p, "h.1.ln_2.weight")->to_vector<float>()) REQUIRE(v == 1.0f);
  // The same seed builds the same weights.
  auto again = make_model(c);
  CHECK(find(again->named_parameters(), "wte.weight")->to_vector<float>() == wte);
}

TEST_CASE("gpt2: logits over the real vocabulary; fused and unfused losses agree; no gradient "
          "reaches a padded row") {
  ModelConfig c = model_preset("gpt2-tiny");
  const Tensor x = tokens(3, 16, c.vocab, 1), y = tokens(3, 16, c.vocab, 2);
  c.head_chunk_rows = -1;
  auto unfused = make_model(c);
  const Tensor logits = unfused->forward(x);
  CHECK(logits.shape() == Shape{3, 16, 100});
  Tensor l1 = unfused->forward_loss(x, y);
  backward(l1);
  c.head_chunk_rows = 7;  // chunks that do not divide the 48 rows
  auto fused = make_model(c);
  Tensor l2 = fused->forward_loss(x, y);
  backward(l2);
  const double a = l1.item<float>(), b = l2.item<float>();
  // A fresh model predicts nearly uniformly over the 100 real tokens: log(100) = 4.605.
  CHECK(a == doctest::Approx(std::log(100.0)).epsilon(0.01));
  CHECK(std::fabs(a - b) <= 1e-6 * std::fabs(a));
  for (auto* m : {unfused.get(), fused.get()}) {
    const std::vector<float> g = find(m->named_parameters(), "wte.weight")->grad().to_vector<float>();
    for (int64_t i = c.vocab * c.d_model; i < 128 * c.d_model; ++i) REQUIRE(g[i] == 0.0f);
    double norm = 0;
    for (int64_t i = 0; i < c.vocab * c.d_model; ++i) norm += std::fabs(g[i]);
    CHECK(norm > 0);
  }
  // A sequence longer than the context is refused, naming it.
  testing::expect_error([&] { fused->forward(tokens(1, 17, c.vocab, 3)); },
                        {"gpt2-tiny", "sequence length 17"});
}
