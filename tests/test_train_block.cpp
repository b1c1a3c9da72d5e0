// A Transformer-style block learns a fixed synthetic next-token task on the CPU: token and
// position embeddings, pre-norm causal self-attention (linear to packed qkv), a GELU feed-forward
// with dropout, a final layernorm and a vocabulary projection, trained with cross-entropy and
// AdamW. The task (predict the previous token) cannot be solved without attending to the
// previous position, so a falling loss exercises every op of the block and the optimizer; a
// held-out set checks that the rule, not the 32 training sequences, was learned.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"
#include "regen/models/optim.h"

using namespace regen;

namespace {
constexpr int64_t kVocab = 12, kSeq = 8, kBatch = 8, kModel = 32, kHeads = 4, kHidden = 64;

struct TinyBlock {
  std::vector<Tensor> params;
  Tensor tok, pos, g1, b1, w_qkv, b_qkv, w_o, b_o, g2, b2, w1, c1, w2, c2, g3, b3, w_out;

  Tensor param(Tensor t, const std::string& name) {
    t.impl()->name = name;
    t.set_requires_grad(true);
    params.push_back(t);
    return t;
  }
  Tensor linear_weight(int64_t out, int64_t in, Generator& gen, const std::string& name) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    return param(uniform({out, in}, -bound, bound, gen), name);
  }

  explicit TinyBlock(uint64_t seed) {
    Generator gen(seed);
    tok = param(normal({kVocab, kModel}, 0.0, 0.5, gen), "tok");
    pos = param(normal({kSeq, kModel}, 0.0, 0.5, gen), "pos");
    g1 = param(ones({kModel}), "ln1.weight");
    b1 = param(zeros({kModel}), "ln1.bias");
    w_qkv = linear_weight(3 * kModel, kModel, gen, "attn.in_proj_weight");
    b_qkv = param(zeros({3 * kModel}), "attn.in_proj_bias");
    w_o = linear_weight(kModel, kModel, gen, "attn.out_proj.weight");
    b_o = param(zeros({kModel}), "attn.out_proj.bias");
    g2 = param(ones({kModel}), "ln2.weight");
    b2 = param(zeros({kModel}), "ln2.bias");
    w1 = linear_weight(kHidden, kModel, gen, "ff.0.weight");
    c1 = param(zeros({kHidden}), "ff.0.bias");
    w2 = linear_weight(kModel, kHidden, gen, "ff.2.weight");
    c2 = param(zeros({kModel}), "ff.2.bias");
    g3 = param(ones({kModel}), "ln3.weight");
    b3 = param(zeros({kModel}), "ln3.bias");
    w_out = linear_weight(kVocab, kModel, gen, "head.weight");
  }

  // tokens: (B, S) i64 -> mean cross-entropy against targets (B * S) i64.
  Tensor loss(const Tensor& tokens, const Tensor& positions, const Tensor& targets, bool training) {
    Tensor h = add(embedding(tokens, tok), embedding(positions, pos));  // (B, S, D)
    Tensor qkv = linear(layernorm(h, g1, b1), w_qkv, b_qkv);            // (B, S, 3D)
    h = add(h, linear(attention(qkv, kHeads, Tensor(), true), w_o, b_o));
    Tensor ff = linear(gelu(linear(layernorm(h, g2, b2), w1, c1)), w2, c2);
    h = add(h, dropout(ff, 0.1f, training));
    Tensor logits = linear(layernorm(h, g3, b3), w_out);  // (B, S, V)
    return cross_entropy(reshape(logits, {kBatch * kSeq, kVocab}), targets);
  }
};

// Random tokens; the target at position t is the token at t - 1 (none at t = 0).
struct Batch {
  Tensor tokens, targets;
};
Batch make_batch(Generator& gen) {
  Batch b;
  b.tokens = randint({kBatch, kSeq}, kVocab, gen);
  const std::vector<int64_t> t = b.tokens.to_vector<int64_t>();
  std::vector<int64_t> y(t.size());
  for (int64_t i = 0; i < kBatch; ++i) {
    for (int64_t s = 0; s < kSeq; ++s) y[i * kSeq + s] = s == 0 ? -100 : t[i * kSeq + s - 1];
  }
  b.targets = from_vector<int64_t>(y, {kBatch * kSeq});
  return b;
}

double eval_loss(TinyBlock& m, const std::vector<Batch>& data, const Tensor& positions) {
  NoGradScope no_grad;
  double total = 0;
  for (const Batch& b : data) total += m.loss(b.tokens, positions, b.targets, false).item<float>();
  return total / static_cast<double>(data.size());
}
}  // namespace

TEST_CASE("a Transformer-style block learns to copy the previous token with AdamW") {
  manual_seed(17);
  TinyBlock model(3);
  Generator data_gen(11);
  std::vector<Batch> data, held_out;
  for (int i = 0; i < 4; ++i) data.push_back(make_batch(data_gen));
  for (int i = 0; i < 2; ++i) held_out.push_back(make_batch(data_gen));
  const Tensor positions = arange(kSeq, DType::i64);

  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.01;
  AdamW opt(model.params, o);

  const double initial = eval_loss(model, data, positions);
  // Uniform guessing over 12 tokens costs ln 12 = 2.48; the random initialization is near it.
  CHECK(initial > 2.0);
  const int kSteps = 60;
  for (int step = 0; step < kSteps; ++step) {
    const Batch& b = data[static_cast<size_t>(step) % data.size()];
    Tensor loss = model.loss(b.tokens, positions, b.targets, true);
    opt.zero_grad();
    backward(loss);
    opt.step();
    if (step % 10 == 0) std::printf("step %d: loss %.4f\n", step, loss.item<float>());
  }
  const double final_loss = eval_loss(model, data, positions);
  const double held_out_loss = eval_loss(model, held_out, positions);
  std::printf("eval loss: initial %.4f, after %d steps %.4f, held-out %.4f\n", initial, kSteps,
              final_loss, held_out_loss);
  // Seen in practice (4 seeds): train below 0.2% and held-out below 1.2% of the initial loss
  // after 60 steps. The bounds leave an order of magnitude of slack.
  CHECK(final_loss < 0.1 * initial);
  CHECK(held_out_loss < 0.25 * initial);
  for (const Tensor& p : model.params) CHECK(p.grad().defined());  // every parameter trained
}
