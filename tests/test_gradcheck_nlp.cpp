// Finite-difference gradient checks (f64, CPU) for embedding, layernorm, softmax, attention,
// cross_entropy and the chunked linear_cross_entropy, alone and chained, beyond the op table's rows
// (tests/op_table.h, which also gradchecks dropout). The harness and
// the per-op tolerances are in tests/gradcheck.h. Random ops reseed inside the checked function, so
// every evaluation sees the same dropout mask.
#include "tests/gradcheck.h"

using namespace regen;
using namespace regen::testing;

namespace {
Tensor ids_tensor(const std::vector<int64_t>& ids, const Shape& shape) {
  return from_vector<int64_t>(ids, shape);
}
Tensor mask_tensor(const std::vector<int32_t>& m, const Shape& shape) {
  return from_vector<int32_t>(m, shape);
}
}  // namespace

TEST_CASE("gradcheck: embedding weight, repeated ids, 2-d ids") {
  // Ids 1 and 3 repeat: their rows must sum the gradients of every position that used them.
  const Tensor ids = ids_tensor({1, 3, 0, 3, 1, 1}, {2, 3});
  gradcheck(
      "embedding", [](const std::vector<Tensor>& in) { return embedding(in[0], in[1]); },
      {ids, rand64({5, 4}, 1)}, linear_op_tol());
}

TEST_CASE("gradcheck: layernorm input, gamma and beta") {
  gradcheck(
      "layernorm 2-d", [](const std::vector<Tensor>& in) { return layernorm(in[0], in[1], in[2]); },
      {rand64({4, 7}, 1, -2, 2), rand64({7}, 2, 0.5, 1.5), rand64({7}, 3)}, smooth_op_tol());
  gradcheck(
      "layernorm 3-d, eps 1e-3",
      [](const std::vector<Tensor>& in) { return layernorm(in[0], in[1], in[2], 1e-3); },
      {rand64({2, 3, 5}, 4), rand64({5}, 5), rand64({5}, 6)}, smooth_op_tol());
}

TEST_CASE("gradcheck: softmax over the last dimension of a 3-d input") {
  gradcheck(
      "softmax 3-d", [](const std::vector<Tensor>& in) { return softmax(in[0]); },
      {rand64({2, 2, 5}, 2, -3, 3)}, smooth_op_tol());
}

TEST_CASE("gradcheck: attention, plain and causal, several heads, odd lengths") {
  // qkv: (B, S, 3 * H * Dh)
  gradcheck(
      "attention B2 S5 H2 Dh3", [](const std::vector<Tensor>& in) { return attention(in[0], 2); },
      {rand64({2, 5, 18}, 1, -2, 2)}, smooth_op_tol());
  gradcheck(
      "attention causal B1 S7 H3 Dh2",
      [](const std::vector<Tensor>& in) { return attention(in[0], 3, Tensor(), true); },
      {rand64({1, 7, 18}, 2, -2, 2)}, smooth_op_tol());
  gradcheck(
      "attention S1", [](const std::vector<Tensor>& in) { return attention(in[0], 1); },
      {rand64({3, 1, 6}, 3, -2, 2)}, smooth_op_tol());
}

TEST_CASE("gradcheck: attention with a key padding mask, including rows with no visible key") {
  // Batch 0 pads its last two keys, batch 1 its first key.
  const Tensor pad = mask_tensor({0, 0, 0, 1, 1, 1, 0, 0, 0, 0}, {2, 5});
  gradcheck(
      "attention masked", [](const std::vector<Tensor>& in) { return attention(in[0], 2, in[1]); },
      {rand64({2, 5, 12}, 4, -2, 2), pad}, smooth_op_tol());
  // Causal + padded key 0 in batch 1: query 0 of batch 1 sees no key at all (output 0, lse -inf);
  // its gradient must be 0, not NaN.
  gradcheck(
      "attention masked causal",
      [](const std::vector<Tensor>& in) { return attention(in[0], 2, in[1], true); },
      {rand64({2, 5, 12}, 5, -2, 2), pad}, smooth_op_tol());
}

TEST_CASE("gradcheck: attention with dropout on the probabilities (p = 0.3)") {
  const Tensor pad = mask_tensor({0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}, {2, 6});
  gradcheck(
      "attention dropout",
      [](const std::vector<Tensor>& in) {
        manual_seed(1234);  // the same mask at every evaluation
        return attention(in[0], 2, Tensor(), false, 0.3f);
      },
      {rand64({2, 6, 12}, 6, -2, 2)}, smooth_op_tol());
  gradcheck(
      "attention dropout masked causal",
      [](const std::vector<Tensor>& in) {
        manual_seed(99);
        return attention(in[0], 3, in[1], true, 0.3f);
      },
      {rand64({2, 6, 9}, 7, -2, 2), pad}, smooth_op_tol());
}

TEST_CASE("gradcheck: cross_entropy with ignored rows") {
  const Tensor targets = ids_tensor({2, -100, 0, 4, -100, 1}, {6});
  gradcheck(
      "cross_entropy", [](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1]); },
      {rand64({6, 5}, 1, -3, 3), targets}, smooth_op_tol());
  // A custom ignore_index that is also a valid class id.
  const Tensor targets2 = ids_tensor({3, 3, 1, 0}, {4});
  gradcheck(
      "cross_entropy ignore_index=3",
      [](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], 3); },
      {rand64({4, 4}, 2, -3, 3), targets2}, smooth_op_tol());
}

TEST_CASE("gradcheck: linear_cross_entropy, chunked, with and without bias, ignored rows") {
  // x: (M, K), weight: (V, K), bias: (V); every floating input is checked.
  const auto with_bias = [](int64_t chunk, int64_t ignore = -100) {
    return [chunk, ignore](const std::vector<Tensor>& in) {
      return linear_cross_entropy(in[0], in[1], in[2], in[3], ignore, chunk);
    };
  };
  const auto without_bias = [](int64_t chunk) {
    return [chunk](const std::vector<Tensor>& in) {
      return linear_cross_entropy(in[0], in[1], Tensor(), in[2], -100, chunk);
    };
  };
  const Tensor t7 = ids_tensor({2, -100, 0, 4, -100, 1, 3}, {7});
  // M = 7 rows in chunks of 3 (3, 3, 1), two rows ignored.
  gradcheck("linear_cross_entropy M7 chunk3 bias", with_bias(3),
            {rand64({7, 4}, 1, -2, 2), rand64({5, 4}, 2), rand64({5}, 3), t7}, smooth_op_tol());
  gradcheck("linear_cross_entropy M7 chunk3", without_bias(3),
            {rand64({7, 4}, 4, -2, 2), rand64({5, 4}, 5), t7}, smooth_op_tol());
  // One row per chunk.
  gradcheck("linear_cross_entropy chunk1 bias", with_bias(1),
            {rand64({7, 3}, 6, -2, 2), rand64({5, 3}, 7), rand64({5}, 8), t7}, smooth_op_tol());
  gradcheck("linear_cross_entropy chunk1", without_bias(1),
            {rand64({7, 3}, 9, -2, 2), rand64({5, 3}, 10), t7}, smooth_op_tol());
  // One chunk: chunk_rows >= M, and automatic (0).
  gradcheck("linear_cross_entropy chunk 16 >= M", with_bias(16),
            {rand64({7, 4}, 11, -2, 2), rand64({5, 4}, 12), rand64({5}, 13), t7}, smooth_op_tol());
  gradcheck("linear_cross_entropy chunk auto", without_bias(0),
            {rand64({7, 4}, 14, -2, 2), rand64({5, 4}, 15), t7}, smooth_op_tol());
  // A custom ignore_index that is also a valid class id, in chunks of 2.
  gradcheck("linear_cross_entropy ignore_index=3 chunk2", with_bias(2, 3),
            {rand64({5, 3}, 16, -2, 2), rand64({4, 3}, 17), rand64({4}, 18),
             ids_tensor({3, 3, 1, 0, 2}, {5})},
            smooth_op_tol());
}

TEST_CASE("gradcheck: a chained block (embedding, layernorm, attention, cross_entropy)") {
  // Gradients flow through every op of this file into all parameters at once.
  const Tensor ids = ids_tensor({0, 2, 1, 3, 3, 1}, {2, 3});
  const Tensor targets = ids_tensor({2, 1, -100, 0, 3, 3}, {6});
  gradcheck(
      "chain",
      [&](const std::vector<Tensor>& in) {
        manual_seed(3);
        Tensor h = embedding(ids, in[0]);  // (2, 3, 4)
        Tensor n = layernorm(h, in[1], in[2]);
        Tensor a = attention(linear(n, in[3]), 2, Tensor(), true, 0.2f);
        Tensor logits = linear(softmax(add(a, h)), in[4]);  // (2, 3, 4)
        return cross_entropy(reshape(logits, {6, 4}), targets);
      },
      {rand64({4, 4}, 1), rand64({4}, 2, 0.5, 1.5), rand64({4}, 3), rand64({12, 4}, 4),
       rand64({4, 4}, 5)},
      smooth_op_tol());
}

TEST_CASE(
    "gradcheck: a chained block ending in the fused head (linear_cross_entropy, chunks of 4)") {
  // The Transformer's fused LM head: gradients reach the layers below through dx.
  const Tensor ids = ids_tensor({0, 2, 1, 3, 3, 1}, {2, 3});
  const Tensor targets = ids_tensor({2, 1, -100, 0, 3, 3}, {6});
  gradcheck(
      "chain fused head",
      [&](const std::vector<Tensor>& in) {
        Tensor h = embedding(ids, in[0]);  // (2, 3, 4)
        Tensor n = layernorm(h, in[1], in[2]);
        return linear_cross_entropy(reshape(n, {6, 4}), in[3], in[4], targets, -100, 4);
      },
      {rand64({4, 4}, 1), rand64({4}, 2, 0.5, 1.5), rand64({4}, 3), rand64({5, 4}, 4),
       rand64({5}, 5)},
      smooth_op_tol());
}
