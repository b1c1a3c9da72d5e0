// GPT-2: a decoder-only language model of pre-norm blocks, as OpenAI's GPT-2 and llm.c's
// train_gpt2.c lay it out. Token embedding wte (Vp, C) plus learned positions wpe (maxT, C); L
// blocks of
//   x = x + attn.c_proj(attention(attn.c_attn(ln_1(x)), causal))
//   x = x + mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))))
// then ln_f and the LM head, which is wte itself (tied). The vocabulary V is padded to Vp, a
// multiple of 128 (gpt2: 50257 -> 50304), as llm.c pads it; the padded rows of wte start at zero
// and are never a class: forward() returns logits over the V real tokens (the first V rows of
// wte, copied), and the fused head and loss of training take all Vp rows with a bias of -inf on
// the padded classes, so a padded row gets no probability and no gradient, as in llm.c.
// Parameter names (llm.c's and Hugging Face's, with nn.Linear's (out, in) weights): wte.weight,
// wpe.weight, h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight,bias},
// ln_f.{weight,bias}. Initialization as GPT-2 (nanoGPT): every matrix and embedding normal with
// std 0.02, the residual projections (attn.c_proj, mlp.c_proj) 0.02 / sqrt(2 L), biases 0,
// layer norms 1 and 0; from regen's Generator seeded with ModelConfig::seed.
// tools/torch_gpt2.py is the same model in PyTorch; tests/test_gpt2.cpp checks it against it.
#pragma once

#include "regen/models/layers.h"
#include "regen/models/model.h"

namespace regen {

// The padded vocabulary: V rounded up to a multiple of 128.
int64_t gpt2_padded_vocab(int64_t vocab);

class GPT2 : public Model {
 public:
  GPT2(const ModelConfig& config, Device device);
  // Tokens and next-token targets (data.h token_lm_input) with the --lm-head-chunk option.
  static ModelInput input();
  // tokens: (B, S) i64, S <= seq_len, ids < vocab -> logits (B, S, vocab).
  Tensor forward(const Tensor& tokens) override;
  Tensor loss(const Tensor& logits, const Tensor& target) const override;
  // With config().head_chunk_rows >= 0, the tied head and the loss as one linear_cross_entropy op;
  // with -1, loss(forward(tokens), target).
  Tensor forward_loss(const Tensor& tokens, const Tensor& target) override;
  void check_batch(const Batch& b) const override;
  void prepare_inputs(Device device) override;

  int64_t padded_vocab() const { return padded_vocab_; }

 private:
  struct Block;
  Tensor hidden(const Tensor& tokens);  // through ln_f: (B, S, C)
  Tensor head_weight() const;           // the first V rows of wte: (V, C)

  int64_t padded_vocab_;
  Tensor *wte_, *wpe_;
  std::vector<Block*> blocks_;
  LayerNorm* ln_f_;
  Tensor positions_;  // arange(seq_len) on the model's device, created before the first step
  // (Vp) f32: 0 for the real classes, -inf for the padded ones: the fused head's bias, created
  // with the positions; undefined when V == Vp.
  Tensor head_mask_;
};

}  // namespace regen
