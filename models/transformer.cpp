// TransformerLM (transformer.h).
#include "regen/models/transformer.h"

namespace regen {

namespace {
class Container : public Module {
 public:
  explicit Container(const std::string& name) : Module(name) {}
  template <class M>
  M& add(const std::string& name, std::unique_ptr<M> m) {
    return register_module(name, std::move(m));
  }
};
}  // namespace

ModelInput TransformerLM::input() {
  ModelInput in = token_lm_input();
  ModelOption dropout = float_option("dropout", "dropout probability (default: the preset's)",
                                     OptionRange::numbers(0.0, 0.99), &ModelConfig::dropout);
  dropout.profile_key = [](double p) { return p == 0 ? std::string("off") : std::string("on"); };
  in.options.push_back(dropout);
  in.options.push_back(lm_head_chunk_option());
  in.options.push_back(lm_head_recompute_option());
  in.check = check_lm_head_options;
  return in;
}

TransformerLM::TransformerLM(const ModelConfig& c, Device device) : Model(c) {
  REGEN_CHECK(c.vocab > 0 && c.seq_len > 0 && c.d_model > 0 && c.layers > 0 && c.ff > 0,
              "Transformer '", c.name, "': sizes must be positive");
  REGEN_CHECK(c.heads > 0 && c.d_model % c.heads == 0, "Transformer '", c.name, "': d_model ",
              c.d_model, " is not divisible by ", c.heads, " heads");
  REGEN_CHECK(c.dropout >= 0.0f && c.dropout < 1.0f, "Transformer '", c.name, "': dropout ",
              c.dropout, " must be in [0, 1)");
  REGEN_CHECK(c.head_chunk_rows >= -1, "Transformer '", c.name, "': head_chunk_rows ",
              c.head_chunk_rows,
              " must be -1 (unfused head), 0 (fused, automatic chunks) or a positive row count");
  check_lm_head_recompute(c);
  Generator gen(c.seed);
  tok_emb_ = &register_module(
      "tok_emb", std::make_unique<Embedding>("tok_emb", c.vocab, c.d_model, gen, device));
  pos_emb_ = &register_module(
      "pos_emb", std::make_unique<Embedding>("pos_emb", c.seq_len, c.d_model, gen, device));
  drop_ = &register_module("drop", std::make_unique<Dropout>("drop", c.dropout));
  auto encoder = std::make_unique<Container>("encoder");
  auto stack = std::make_unique<Container>("layers");
  for (int64_t i = 0; i < c.layers; ++i) {
    layers_.push_back(&stack->add(std::to_string(i), std::make_unique<TransformerEncoderLayer>(
                                                         std::to_string(i), c.d_model, c.heads,
                                                         c.ff, c.dropout, c.gelu, gen, device)));
  }
  encoder->add("layers", std::move(stack));
  register_module("encoder", std::move(encoder));
  lm_head_ = &register_module(
      "lm_head", std::make_unique<Linear>("lm_head", c.d_model, c.vocab, true, gen, device));
  assign_full_names();
}

Tensor TransformerLM::hidden(const Tensor& tokens) {
  REGEN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::i64, config_.name,
              ": expected tokens i64 (B, S), got ", tokens.str());
  const int64_t S = tokens.size(1);
  REGEN_CHECK(S >= 1 && S <= config_.seq_len, config_.name, ": sequence length ", S,
              " is outside [1, ", config_.seq_len, "]");
  prepare_inputs(tokens.device());
  Tensor h = add(tok_emb_->forward(tokens), pos_emb_->forward(positions_.narrow0(0, S)));
  h = drop_->forward(h);
  {
    ModuleScope enc("encoder");
    ModuleScope stack("layers");
    for (TransformerEncoderLayer* layer : layers_) h = layer->forward(h, Tensor(), config_.causal);
  }
  return h;
}

Tensor TransformerLM::forward(const Tensor& tokens) {
  return lm_head_->forward(hidden(tokens));
}

Tensor TransformerLM::forward_loss(const Tensor& tokens, const Tensor& target) {
  if (config_.head_chunk_rows < 0) return Model::forward_loss(tokens, target);
  check_lm_targets(config_, tokens, target);
  const Tensor h = hidden(tokens);
  // The head's parameters under the head's scope; the op is the head and the loss at once.
  ModuleScope scope("lm_head");
  Tensor* bias = lm_head_->bias();
  return linear_cross_entropy(reshape(h, {-1, config_.d_model}), lm_head_->weight(),
                              bias ? *bias : Tensor(), target.reshape({-1}), -100,
                              config_.head_chunk_rows, config_.head_recompute != 0);
}

void TransformerLM::prepare_inputs(Device device) {
  if (positions_.defined() && positions_.device() == device) return;
  CategoryScope cat(Category::input);
  TagScope tag("positions");
  positions_ = arange(config_.seq_len, DType::i64, device);
}

Tensor TransformerLM::loss(const Tensor& logits, const Tensor& target) const {
  ModuleScope scope("loss");
  const int64_t V = logits.size(-1);
  return cross_entropy(reshape(logits, {-1, V}), target.reshape({-1}));
}

void TransformerLM::check_batch(const Batch& b) const {
  REGEN_CHECK(b.input.defined() && b.input.dim() == 2 && b.input.dtype() == DType::i64,
              config_.name, ": expected tokens i64 (B, S), got ", b.input.str());
  REGEN_CHECK(
      b.target.defined() && b.target.dtype() == DType::i64 && b.target.shape() == b.input.shape(),
      config_.name, ": expected targets i64 ", sh(b.input.shape()), ", got ", b.target.str());
}

}  // namespace regen
