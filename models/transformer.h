// The Transformer language model of the seed experiments: token embedding plus learned
// positions, dropout, a stack of post-norm torch.nn.TransformerEncoderLayer-style layers (causal
// self-attention for the next-token objective), and a linear head over the vocabulary.
// Parameter names: tok_emb.weight, pos_emb.weight, encoder.layers.<i>.{self_attn.in_proj_weight,
// self_attn.in_proj_bias, self_attn.out_proj.*, linear1.*, linear2.*, norm1.*, norm2.*},
// lm_head.{weight,bias} (tools/make_reference.py builds the same model in PyTorch). In training the
// head and the loss run fused and chunked by default (ModelConfig::head_chunk_rows).
#pragma once

#include "regen/models/data.h"
#include "regen/models/layers.h"
#include "regen/models/model.h"

namespace regen {

class TransformerLM : public Model {
 public:
  TransformerLM(const ModelConfig& config, Device device);
  // What it takes: tokens and next-token targets (data.h token_lm_input), with its own options
  // --dropout and --lm-head-chunk (ModelConfig::dropout, head_chunk_rows).
  static ModelInput input();
  // tokens: (B, S) i64 with S <= seq_len -> logits (B, S, vocab).
  Tensor forward(const Tensor& tokens) override;
  Tensor loss(const Tensor& logits, const Tensor& target) const override;
  // With config().head_chunk_rows >= 0, the head and the loss as one linear_cross_entropy op
  // (no (B*S, vocab) logits); with -1, loss(forward(tokens), target).
  Tensor forward_loss(const Tensor& tokens, const Tensor& target) override;
  void check_batch(const Batch& b) const override;
  void prepare_inputs(Device device) override;

 private:
  Embedding *tok_emb_, *pos_emb_;
  Dropout* drop_;
  std::vector<TransformerEncoderLayer*> layers_;
  // Embeddings and the encoder stack: the head's input (B, S, d_model).
  Tensor hidden(const Tensor& tokens);

  Linear* lm_head_;
  Tensor positions_;  // arange(seq_len) on the model's device, created before the first step
};

}  // namespace regen
