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
#include "regen/session/session.h"
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
  const std::vector<std::string> want = {"wte.weight",
                                         "wpe.weight",
                                         "h.0.ln_1.weight",
                                         "h.0.ln_1.bias",
                                         "h.0.attn.c_attn.weight",
                                         "h.0.attn.c_attn.bias",
                                         "h.0.attn.c_proj.weight",
                                         "h.0.attn.c_proj.bias",
                                         "h.0.ln_2.weight",
                                         "h.0.ln_2.bias",
                                         "h.0.mlp.c_fc.weight",
                                         "h.0.mlp.c_fc.bias",
                                         "h.0.mlp.c_proj.weight",
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

TEST_CASE(
    "gpt2: logits over the real vocabulary, fused and unfused losses agree, no gradient "
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
    const std::vector<float> g =
        find(m->named_parameters(), "wte.weight")->grad().to_vector<float>();
    for (int64_t i = c.vocab * c.d_model; i < 128 * c.d_model; ++i) REQUIRE(g[i] == 0.0f);
    double norm = 0;
    for (int64_t i = 0; i < c.vocab * c.d_model; ++i) norm += std::fabs(g[i]);
    CHECK(norm > 0);
  }
  // A sequence longer than the context is refused, naming it.
  testing::expect_error([&] { fused->forward(tokens(1, 17, c.vocab, 3)); },
                        {"gpt2-tiny", "sequence length 17"});
}

TEST_CASE("gpt2: AdamW decays the matrices only under DecayScope::matrices") {
  Tensor w = from_vector<float>({1, 2, 3, 4}, {2, 2});
  Tensor b = from_vector<float>({1, 2}, {2});
  w.impl()->name = "w";
  b.impl()->name = "b";
  AdamWOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.5;
  o.decay = DecayScope::matrices;
  AdamW opt({w, b}, o);
  CHECK(opt.decays("w"));
  CHECK(!opt.decays("b"));
  // Zero gradients: Adam's step is 0 / (0 + eps) = 0, so only the decay moves a parameter.
  w.impl()->grad = zeros({2, 2}).impl();
  b.impl()->grad = zeros({2}).impl();
  opt.step();
  const std::vector<float> wv = w.to_vector<float>(), bv = b.to_vector<float>();
  for (int i = 0; i < 4; ++i) CHECK(wv[i] == doctest::Approx((i + 1) * (1 - 0.1 * 0.5)));
  CHECK(bv == std::vector<float>{1, 2});
  AdamWOptions all = o;
  all.decay = DecayScope::all;
  CHECK(AdamW({w, b}, all).decays("b"));
  all.weight_decay = 0;
  CHECK(!AdamW({w, b}, all).decays("w"));
}

// The parity: PyTorch's GPT-2 (tools/torch_gpt2.py) from the same weights on the same tokens, in
// f32, 20 AdamW steps with decay on the matrices. The fused head and loss (the training default)
// and the unfused one both run.
TEST_CASE("gpt2: 20 AdamW steps give PyTorch's losses (gpt2-tiny, fp32)") {
  const SafetensorsFile f = load_safetensors(data("gpt2-tiny_adamw.safetensors"));
  for (const int64_t chunk : {int64_t{0}, int64_t{-1}}) {
    ModelConfig c = model_preset("gpt2-tiny");
    c.head_chunk_rows = chunk;
    auto model = make_model(c);
    NamedTensors state;
    for (const auto& kv : model->named_parameters()) {
      const Tensor* t = f.find(kv.first);
      REQUIRE_MESSAGE(t != nullptr, "no reference weight for ", kv.first);
      state.emplace_back(kv.first, *t);
    }
    model->load_state_dict(state);
    AdamWOptions o;
    o.lr = 3e-3;
    o.weight_decay = 0.1;
    o.decay = DecayScope::matrices;
    AdamW opt(model->parameters(), o);
    const std::vector<float> want = f.find("losses")->to_vector<float>();
    REQUIRE(want.size() == 20);
    double worst = 0;
    for (int i = 0; i < 20; ++i) {
      opt.zero_grad();
      Tensor loss = model->forward_loss(*f.find("input." + std::to_string(i)),
                                        *f.find("target." + std::to_string(i)));
      const double got = loss.item<float>();
      const double rel = std::fabs(got - want[i]) / std::fabs(want[i]);
      worst = std::max(worst, rel);
      CHECK_MESSAGE(rel <= 1e-5, "step ", i, ": loss ", got, " vs torch ", want[i]);
      backward(loss);
      opt.step();
    }
    double worst_weight = 0;
    int finals = 0;
    for (const auto& kv : model->named_parameters()) {
      const Tensor* ref = f.find("final." + kv.first);
      if (ref == nullptr) continue;
      ++finals;
      const std::vector<float> a = kv.second.to_vector<float>(), b = ref->to_vector<float>();
      REQUIRE(a.size() == b.size());
      const bool qkv_bias = kv.first.find("c_attn.bias") != std::string::npos;
      for (size_t i = 0; i < a.size(); ++i) {
        // The key bias adds q.b to every score of a row, which softmax cancels: its gradient is
        // rounding noise in both runs, which Adam scales to steps of lr * noise / eps. Both stay
        // near zero, but not near each other.
        if (qkv_bias && static_cast<int64_t>(i) / c.d_model == 1) {
          CHECK(std::fabs(a[i]) < 1e-4);
          CHECK(std::fabs(b[i]) < 1e-4);
          continue;
        }
        worst_weight = std::max(worst_weight, static_cast<double>(std::fabs(a[i] - b[i])));
      }
    }
    CHECK(finals == 2 * 4 * c.layers + 2 + 1);
    // An Adam step moves a weight by lr times its normalized gradient, so a relative gradient
    // error d moves it by about lr d: 20 steps of lr 3e-3 by 0.06 d. With d at the f32 rounding
    // of the sums behind a gradient (up to 128 terms: 128 * 2^-24 = 7.6e-6 at worst), 4.6e-7.
    // Measured: 1.2e-7.
    CHECK(worst_weight <= 1e-6);
    MESSAGE("gpt2-tiny, head ", chunk < 0 ? std::string("unfused") : std::string("fused"),
            ": losses ", want.front(), " -> ", want.back(), ", worst relative loss error ", worst,
            ", worst final weight error ", worst_weight);
  }
}

TEST_CASE(
    "gpt2: a session's AdamW decays GPT-2's matrices only, and other models' every "
    "parameter") {
  SessionOptions o;
  o.model = "gpt2-tiny";
  o.batch = 2;
  o.device = "cpu";
  o.optimizer = "adamw";
  o.weight_decay = 0.1;
  auto s = make_session(o);
  const auto* adamw = dynamic_cast<const AdamW*>(&s->trainer->optimizer());
  REQUIRE(adamw != nullptr);
  CHECK(adamw->options().decay == DecayScope::matrices);
  for (const char* decayed :
       {"wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_proj.weight"}) {
    CHECK_MESSAGE(adamw->decays(decayed), decayed);
  }
  for (const char* kept : {"h.0.ln_1.weight", "h.0.attn.c_attn.bias", "ln_f.bias"}) {
    CHECK_MESSAGE(!adamw->decays(kept), kept);
  }
  o.model = "transformer-tiny";
  auto t = make_session(o);
  const auto* all = dynamic_cast<const AdamW*>(&t->trainer->optimizer());
  REQUIRE(all != nullptr);
  CHECK(all->options().decay == DecayScope::all);
  CHECK(all->decays("encoder.layers.0.norm1.bias"));
}
