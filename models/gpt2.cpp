// GPT2 (gpt2.h).
#include "regen/models/gpt2.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "regen/autograd/ops_unary.h"
#include "regen/models/data.h"
#include "regen/models/gpt2_llmc.h"

namespace regen {

namespace {

constexpr double kInitStd = 0.02;

Tensor init_normal(const std::string& name, const Shape& shape, double stddev, Generator& gen,
                   Device device) {
  CategoryScope cat(Category::parameter);
  TagScope tag(name);
  return normal(shape, 0.0, stddev, gen, DType::f32, device);
}

Tensor init_zeros(const std::string& name, const Shape& shape, Device device) {
  CategoryScope cat(Category::parameter);
  TagScope tag(name);
  return zeros(shape, DType::f32, device);
}

// A module that only groups others (h, attn, mlp) or holds one parameter (wte, wpe).
class Group : public Module {
 public:
  explicit Group(const std::string& name) : Module(name) {}
  template <class M>
  M& add(const std::string& name, std::unique_ptr<M> m) {
    return register_module(name, std::move(m));
  }
  Tensor& add_parameter(const std::string& name, Tensor value) {
    return register_parameter(name, std::move(value));
  }
};

// nn.Linear's layout (weight (out, in), bias (out)) with GPT-2's initialization: weight normal
// with std `stddev`, bias zero.
class Dense : public Module {
 public:
  Dense(const std::string& name, int64_t in, int64_t out, double stddev, Generator& gen,
        Device device)
      : Module(name) {
    weight_ = &register_parameter("weight",
                                  init_normal(name + ".weight", {out, in}, stddev, gen, device));
    bias_ = &register_parameter("bias", init_zeros(name + ".bias", {out}, device));
  }
  Tensor forward(const Tensor& x) const {
    ModuleScope scope(name());
    return linear(x, *weight_, *bias_);
  }

 private:
  Tensor *weight_, *bias_;
};

}  // namespace

int64_t gpt2_padded_vocab(int64_t vocab) {
  return (vocab + 127) / 128 * 128;
}

struct GPT2::Block : public Module {
  Block(const std::string& name, const ModelConfig& c, Generator& gen, Device device)
      : Module(name), heads(c.heads) {
    const int64_t C = c.d_model;
    const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.layers));
    ln_1 = &register_module("ln_1", std::make_unique<LayerNorm>("ln_1", C, device));
    auto attn = std::make_unique<Group>("attn");
    c_attn =
        &attn->add("c_attn", std::make_unique<Dense>("c_attn", C, 3 * C, kInitStd, gen, device));
    attn_proj =
        &attn->add("c_proj", std::make_unique<Dense>("c_proj", C, C, residual_std, gen, device));
    register_module("attn", std::move(attn));
    ln_2 = &register_module("ln_2", std::make_unique<LayerNorm>("ln_2", C, device));
    auto mlp = std::make_unique<Group>("mlp");
    c_fc = &mlp->add("c_fc", std::make_unique<Dense>("c_fc", C, c.ff, kInitStd, gen, device));
    mlp_proj =
        &mlp->add("c_proj", std::make_unique<Dense>("c_proj", c.ff, C, residual_std, gen, device));
    register_module("mlp", std::move(mlp));
  }

  Tensor forward(const Tensor& x) const {
    ModuleScope scope(name());
    BlockScope block("");
    Tensor a;
    {
      ModuleScope attn("attn");
      // qkv: (B, S, 3C) laid out [q | k | v], the layout attention() takes.
      const Tensor qkv = c_attn->forward(ln_1->forward(x));
      a = attn_proj->forward(attention(qkv, heads, Tensor(), /*causal=*/true));
    }
    const Tensor h = add(x, a);
    Tensor m;
    {
      ModuleScope mlp("mlp");
      m = mlp_proj->forward(gelu_tanh(c_fc->forward(ln_2->forward(h))));
    }
    return add(h, m);
  }

  int64_t heads;
  LayerNorm *ln_1, *ln_2;
  Dense *c_attn, *attn_proj, *c_fc, *mlp_proj;
};

ModelInput GPT2::input() {
  ModelInput in = token_lm_input();
  in.options.push_back(lm_head_chunk_option());
  in.options.push_back(lm_head_recompute_option());
  in.check = check_lm_head_options;
  in.data.push_back(llmc_tokens_data());
  in.decay_matrices_only = true;
  return in;
}

GPT2::GPT2(const ModelConfig& c, Device device)
    : Model(c), padded_vocab_(gpt2_padded_vocab(c.vocab)) {
  REGEN_CHECK(c.vocab > 0 && c.seq_len > 0 && c.d_model > 0 && c.layers > 0 && c.ff > 0, "GPT-2 '",
              c.name, "': sizes must be positive (vocab ", c.vocab, ", seq_len ", c.seq_len,
              ", d_model ", c.d_model, ", layers ", c.layers, ", ff ", c.ff, ")");
  REGEN_CHECK(c.heads > 0 && c.d_model % c.heads == 0, "GPT-2 '", c.name, "': d_model ", c.d_model,
              " is not divisible by ", c.heads, " heads");
  REGEN_CHECK(c.head_chunk_rows >= -1, "GPT-2 '", c.name, "': head_chunk_rows ", c.head_chunk_rows,
              " must be -1 (unfused head), 0 (fused, automatic chunks) or a positive row count");
  check_lm_head_recompute(c);
  Generator gen(c.seed);
  const int64_t C = c.d_model;
  auto wte = std::make_unique<Group>("wte");
  wte_ = &wte->add_parameter("weight",
                             init_normal("wte.weight", {padded_vocab_, C}, kInitStd, gen, device));
  // The padded rows are never a token and never a class: zero, as llm.c writes them.
  if (padded_vocab_ > c.vocab) {
    Tensor pad = wte_->narrow0(c.vocab, padded_vocab_ - c.vocab);
    fill_(pad, 0.0);
  }
  register_module("wte", std::move(wte));
  auto wpe = std::make_unique<Group>("wpe");
  wpe_ = &wpe->add_parameter("weight",
                             init_normal("wpe.weight", {c.seq_len, C}, kInitStd, gen, device));
  register_module("wpe", std::move(wpe));
  auto h = std::make_unique<Group>("h");
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string n = std::to_string(i);
    blocks_.push_back(&h->add(n, std::make_unique<Block>(n, c, gen, device)));
  }
  register_module("h", std::move(h));
  ln_f_ = &register_module("ln_f", std::make_unique<LayerNorm>("ln_f", C, device));
  assign_full_names();
}

Tensor GPT2::head_weight() const {
  if (padded_vocab_ == config_.vocab) return *wte_;
  // A copy of the real rows (narrow is differentiable; its gradient leaves the padded rows zero).
  return narrow(*wte_, 0, 0, config_.vocab);
}

Tensor GPT2::hidden(const Tensor& tokens) {
  REGEN_CHECK(tokens.defined() && tokens.dim() == 2 && tokens.dtype() == DType::i64, config_.name,
              ": expected tokens i64 (B, S), got ",
              tokens.defined() ? tokens.str() : std::string("nothing"));
  const int64_t S = tokens.size(1);
  REGEN_CHECK(S >= 1 && S <= config_.seq_len, config_.name, ": sequence length ", S,
              " is outside [1, ", config_.seq_len, "]");
  prepare_inputs(tokens.device());
  Tensor x;
  {
    ModuleScope scope("wte");
    x = embedding(tokens, *wte_);
  }
  {
    ModuleScope scope("wpe");
    x = add(x, embedding(positions_.narrow0(0, S), *wpe_));
  }
  {
    ModuleScope scope("h");
    for (const Block* b : blocks_) x = b->forward(x);
  }
  return ln_f_->forward(x);
}

Tensor GPT2::forward(const Tensor& tokens) {
  const Tensor h = hidden(tokens);
  ModuleScope scope("lm_head");
  return linear(h, head_weight());
}

Tensor GPT2::forward_loss(const Tensor& tokens, const Tensor& target) {
  if (config_.head_chunk_rows < 0) return Model::forward_loss(tokens, target);
  check_lm_targets(config_, tokens, target);
  const Tensor h = hidden(tokens);
  ModuleScope scope("lm_head");
  // All Vp rows of wte, with the padded classes' logits at -inf (head_mask_): they take no
  // probability, so their gradient is 0 and their rows of wte get none, without a copy of the
  // real rows (which head_weight() makes for forward()).
  return linear_cross_entropy(reshape(h, {-1, config_.d_model}), *wte_, head_mask_,
                              target.reshape({-1}), -100, config_.head_chunk_rows,
                              config_.head_recompute != 0);
}

Tensor GPT2::loss(const Tensor& logits, const Tensor& target) const {
  ModuleScope scope("loss");
  const int64_t V = logits.size(-1);
  return cross_entropy(reshape(logits, {-1, V}), target.reshape({-1}));
}

void GPT2::prepare_inputs(Device device) {
  if (positions_.defined() && positions_.device() == device) return;
  CategoryScope cat(Category::input);
  TagScope tag("positions");
  positions_ = arange(config_.seq_len, DType::i64, device);
  if (padded_vocab_ > config_.vocab) {
    TagScope mask("head_mask");
    std::vector<float> m(static_cast<size_t>(padded_vocab_), 0.0f);
    std::fill(m.begin() + config_.vocab, m.end(), -std::numeric_limits<float>::infinity());
    head_mask_ = from_vector<float>(m, {padded_vocab_}, device);
  }
}

void GPT2::check_batch(const Batch& b) const {
  REGEN_CHECK(b.input.defined() && b.input.dim() == 2 && b.input.dtype() == DType::i64,
              config_.name, ": expected tokens i64 (B, S), got ",
              b.input.defined() ? b.input.str() : std::string("nothing"));
  REGEN_CHECK(
      b.target.defined() && b.target.dtype() == DType::i64 && b.target.shape() == b.input.shape(),
      config_.name, ": expected targets i64 ", sh(b.input.shape()), ", got ",
      b.target.defined() ? b.target.str() : std::string("nothing"));
}

}  // namespace regen
