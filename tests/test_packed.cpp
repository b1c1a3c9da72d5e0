// Packed saves (autograd/tape.h PackedSaves, docs/ops.md "Packed saves"): the packing kernels
// against plain loops (relu's 1-bit mask against y > 0 computed here, max_pool2d's window codes
// against the argmax of the unpacked launcher, decoded here), the unpacking backwards bit for bit
// equal to the full forms, special values and every tail length, at 1 and 2 threads; which nodes
// decide_packed_saves packs (only where nothing else saves the replaced output); a packed node's
// backward and replay; and sessions with --masks on against off: the same bits of training, the
// saved bytes each packed node gives back (counted here from the shapes), and the options refused
// by name.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/kernels/kernels.h"
#include "regen/kernels/unary_ops.h"
#include "regen/remat/execute/pipeline.h"
#include "regen/session/records.h"
#include "regen/session/session.h"
#include "tests/test_util.h"

using namespace regen;

namespace {

// Bitwise equality of float vectors (NaNs and signed zeros included).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Values with every case a mask must get right: signed zeros, infinities, NaN, denormals, and
// random values of both signs.
template <class T>
std::vector<T> tricky_values(int64_t n, uint64_t seed) {
  const T specials[] = {T(0),
                        -T(0),
                        std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(),
                        std::numeric_limits<T>::quiet_NaN(),
                        std::numeric_limits<T>::denorm_min(),
                        -std::numeric_limits<T>::denorm_min(),
                        T(1),
                        T(-1)};
  std::vector<T> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t r = s >> 33;
    v[static_cast<size_t>(i)] =
        (r % 7 == 0) ? specials[(r / 7) % 9]
                     : static_cast<T>((static_cast<double>(r % 20001) - 10000) / 3000.0);
  }
  return v;
}

// tricky_values for f32 and f64; for bf16 and f16, the f32 values rounded (their infinities, NaN
// and zeros kept; f32's denormals become signed zeros).
template <class T>
std::vector<T> mask_test_values(int64_t n, uint64_t seed) {
  if constexpr (is_half_v<T>) {
    std::vector<T> v;
    for (const float f : tricky_values<float>(n, seed)) v.push_back(T(f));
    return v;
  } else {
    return tricky_values<T>(n, seed);
  }
}

template <class T, class F>
void check_mask_kernels(int64_t n) {
  CAPTURE(n);
  const std::vector<T> x = mask_test_values<T>(n, 7 + static_cast<uint64_t>(n));
  const std::vector<T> dy = mask_test_values<T>(n, 99 + static_cast<uint64_t>(n));
  std::vector<T> y(static_cast<size_t>(n)), y_full(y), dx(y), dx_full(y);
  std::vector<uint32_t> mask(static_cast<size_t>(mask_words(n)) + 1, 0xdeadbeefu);  // + canary
  cpu::unary_forward_mask<T>(F{}, x.data(), y.data(), mask.data(), n);
  cpu::unary_forward<T>(F{}, x.data(), y_full.data(), n);
  CHECK(same_bits(y, y_full));
  CHECK(mask.back() == 0xdeadbeefu);
  // relu's mask is y > 0, written here without the functor: bit i of word i / 32, LSB first,
  // the last word's bits past n zero.
  for (int64_t w = 0; w < mask_words(n); ++w) {
    uint32_t expect = 0;
    for (int64_t b = 0; b < 32 && w * 32 + b < n; ++b) {
      if (static_cast<double>(static_cast<acc_t<T>>(y_full[static_cast<size_t>(w * 32 + b)])) > 0)
        expect |= 1u << b;
    }
    CHECK_MESSAGE(mask[static_cast<size_t>(w)] == expect, "word ", w);
  }
  cpu::unary_backward_mask<T>(F{}, dy.data(), mask.data(), dx.data(), n);
  cpu::unary_backward<T>(F{}, dy.data(), y_full.data(), dx_full.data(), n);
  CHECK(same_bits(dx, dx_full));
}

}  // namespace

TEST_CASE("relu's mask: grad_masked(dy, mask(s)) is grad(dy, s) bit for bit, special values too") {
  static_assert(unary::has_mask<unary::relu>::value, "relu packs a mask");
  static_assert(!unary::has_mask<unary::gelu>::value, "gelu's backward needs its input");
  const std::vector<float> s = tricky_values<float>(2000, 3), dy = tricky_values<float>(2000, 4);
  for (size_t i = 0; i < s.size(); ++i) {
    const float a = unary::relu::grad(dy[i], s[i]);
    const float b = unary::relu::grad_masked(dy[i], unary::relu::mask(s[i]));
    CHECK(std::memcmp(&a, &b, sizeof a) == 0);
  }
}

TEST_CASE(
    "cpu unary mask kernels: bits against y > 0, backward equal to the full form, f32 to bf16") {
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{95},
                      int64_t{40001}}) {
      check_mask_kernels<float, unary::relu>(n);
      check_mask_kernels<double, unary::relu>(n);
    }
    // 16 bits: blocks of 512 elements, whole mask words each, and a partial last block and word.
    for (int64_t n : {int64_t{0}, int64_t{33}, int64_t{512}, int64_t{1000}, int64_t{40001}}) {
      check_mask_kernels<bfloat16, unary::relu>(n);
      check_mask_kernels<float16, unary::relu>(n);
    }
  }
  // A functor without a mask has no packed form.
  float v = 1, out = 0;
  uint32_t m = 0;
  testing::expect_error([&] { cpu::unary_forward_mask<float>(unary::gelu{}, &v, &out, &m, 1); },
                        {"gelu", "no packed mask"});
}

namespace {

// The window codes decoded here: (h - top) * kw + (w - left) of each output's argmax.
std::vector<uint32_t> decode_codes(const std::vector<uint32_t>& codes, const PoolShape& s) {
  const int bits = pool_code_bits(s);
  const int64_t per = 32 / bits, words = pool_code_words_per_plane(s), pq = s.P * s.Q;
  std::vector<uint32_t> out;
  for (int64_t plane = 0; plane < s.N * s.C; ++plane) {
    for (int64_t j = 0; j < pq; ++j) {
      const uint64_t word = codes[static_cast<size_t>(plane * words + j / per)];
      out.push_back(
          static_cast<uint32_t>((word >> ((j % per) * bits)) & ((uint64_t{1} << bits) - 1)));
    }
  }
  return out;
}

template <class T>
void check_pool_codes(int64_t N, int64_t C, int64_t H, int64_t W, int64_t k, int64_t stride,
                      int64_t pad, int expect_bits, bool ties) {
  const PoolShape s = make_pool_shape(N, C, H, W, k, k, stride, stride, pad, pad);
  CAPTURE(k);
  CAPTURE(stride);
  CAPTURE(pad);
  CHECK(pool_code_bits(s) == expect_bits);
  const int64_t nx = N * C * H * W, ny = N * C * s.P * s.Q;
  std::vector<T> x = tricky_values<T>(nx, 5 + static_cast<uint64_t>(k));
  if (ties) {
    for (T& v : x) v = std::floor(v);  // many equal maxima: the first in window order wins
  }
  std::vector<T> y(static_cast<size_t>(ny)), y_full(y);
  std::vector<int32_t> argmax(static_cast<size_t>(ny));
  const int64_t words = N * C * pool_code_words_per_plane(s);
  std::vector<uint32_t> codes(static_cast<size_t>(words) + 1, 0xdeadbeefu);
  cpu::maxpool2d_forward<T>(x.data(), y_full.data(), argmax.data(), s);
  cpu::maxpool2d_forward_packed<T>(x.data(), y.data(), codes.data(), s);
  CHECK(same_bits(y, y_full));
  CHECK(codes.back() == 0xdeadbeefu);
  codes.pop_back();
  const std::vector<uint32_t> pos = decode_codes(codes, s);
  int64_t bad = 0;
  for (int64_t i = 0; i < ny; ++i) {
    const int64_t pq = i % (s.P * s.Q), p = pq / s.Q, q = pq % s.Q;
    const int64_t h = argmax[static_cast<size_t>(i)] / W, w = argmax[static_cast<size_t>(i)] % W;
    const int64_t expect = (h - (p * stride - pad)) * k + (w - (q * stride - pad));
    bad += static_cast<int64_t>(pos[static_cast<size_t>(i)]) != expect;
  }
  CHECK(bad == 0);
  const std::vector<T> dy = tricky_values<T>(ny, 17);
  std::vector<T> dx(static_cast<size_t>(nx)), dx_full(dx);
  cpu::maxpool2d_backward<T>(dy.data(), argmax.data(), dx_full.data(), s);
  cpu::maxpool2d_backward_packed<T>(dy.data(), codes.data(), dx.data(), s);
  CHECK(same_bits(dx, dx_full));
}

}  // namespace

TEST_CASE("cpu max_pool2d window codes: the argmax form's values, positions and gradients") {
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    for (bool ties : {false, true}) {
      // ResNet's stem pool (9 positions: 4 bits), the U-Net's 2x2 (2 bits), 1x1 (1 bit), 5x5 (25
      // positions: 8 bits); odd planes whose codes end mid-word.
      check_pool_codes<float>(2, 3, 13, 11, 3, 2, 1, 4, ties);
      check_pool_codes<double>(2, 3, 13, 11, 3, 2, 1, 4, ties);
      check_pool_codes<float>(2, 5, 10, 6, 2, 2, 0, 2, ties);
      check_pool_codes<float>(1, 2, 5, 3, 1, 1, 0, 1, ties);
      check_pool_codes<float>(1, 2, 9, 12, 5, 3, 2, 8, ties);
      check_pool_codes<float>(4, 16, 40, 40, 3, 2, 1, 4, ties);  // above the parallel threshold
    }
  }
}

// ---- Decisions and the packed nodes -------------------------------------------------------------

TEST_CASE("decide_packed_saves: relu packs only where nothing else saves its output") {
  Generator g(5);
  Tape& tape = Tape::current();
  REQUIRE(tape.empty());
  Tensor w = uniform({6, 6}, -1, 1, g).set_requires_grad(true);
  Tensor x = uniform({4, 6}, -1, 1, g).set_requires_grad(true);
  Tensor a = relu(x);                        // node 0: read by dropout (saves nothing) -> packed
  Tensor b = dropout(a, 0.5f, true);         // node 1
  Tensor c = relu(linear(b, w));             // nodes 2, 3: relu's output saved by matmul below
  Tensor d = matmul(reshape(c, {4, 6}), w);  // a view of it, saved by matmul: not packed
  Tensor e = relu(d);                        // node 6: read by sum only -> packed
  Tensor img = uniform({1, 2, 5, 5}, -1, 1, g).set_requires_grad(true);
  Tensor pooled = max_pool2d(img, 3, 2, 1);  // its argmax only it reads -> packed
  Tensor loss = add(sum(e), sum(pooled));
  const PackedSaves d0 = decide_packed_saves(tape);
  REQUIRE(d0.packed.size() == tape.nodes().size());
  std::vector<int32_t> packed;
  for (size_t i = 0; i < d0.packed.size(); ++i) {
    if (d0.packed[i]) packed.push_back(static_cast<int32_t>(i));
  }
  // The first relu, the relu after matmul and the pool; not the relu whose output the view
  // carries into matmul.
  REQUIRE(packed.size() == 3);
  CHECK(op_name(tape.node(packed.at(0)).kind) == std::string("relu"));
  CHECK(packed.at(0) == 0);
  CHECK(op_name(tape.node(packed.at(1)).kind) == std::string("relu"));
  CHECK(tape.node(packed.at(1)).inputs[0] == d.impl()->tape_value);
  CHECK(op_name(tape.node(packed.at(2)).kind) == std::string("max_pool2d"));
  CHECK(d0.count() == 3);
  tape.clear();
}

namespace {
struct Grads {
  double loss;
  std::vector<float> gx, gw, gimg;
  std::vector<int64_t> saved_bytes;
};

// The graph above, recorded with `decisions` installed, then backward.
Grads run_graph(const PackedSaves* decisions) {
  manual_seed(11);
  Generator g(5);
  Tensor w = uniform({6, 6}, -1, 1, g).set_requires_grad(true);
  Tensor x = uniform({4, 6}, -1, 1, g).set_requires_grad(true);
  Tensor img = uniform({1, 2, 5, 5}, -1, 1, g).set_requires_grad(true);
  Grads r;
  Tensor loss;
  {
    PackedSavesScope scope(decisions);
    Tensor b = dropout(relu(x), 0.5f, true);
    Tensor c = relu(linear(b, w));
    Tensor e = relu(matmul(reshape(c, {4, 6}), w));
    loss = add(sum(e), sum(max_pool2d(img, 3, 2, 1)));
  }
  for (const SavedTensor& s : Tape::current().saved())
    r.saved_bytes.push_back(static_cast<int64_t>(s.bytes));
  r.loss = loss.item<float>();
  backward(loss);
  r.gx = x.grad().to_vector<float>();
  r.gw = w.grad().to_vector<float>();
  r.gimg = img.grad().to_vector<float>();
  return r;
}
}  // namespace

TEST_CASE("packed nodes: backward bit for bit as unpacked, masks of the right size, replays") {
  Tape& tape = Tape::current();
  REQUIRE(tape.empty());
  const Grads full = run_graph(nullptr);
  // Decide on a recording of the same graph.
  PackedSaves d;
  {
    manual_seed(11);
    Generator g(5);
    Tensor w = uniform({6, 6}, -1, 1, g).set_requires_grad(true);
    Tensor x = uniform({4, 6}, -1, 1, g).set_requires_grad(true);
    Tensor img = uniform({1, 2, 5, 5}, -1, 1, g).set_requires_grad(true);
    Tensor b = dropout(relu(x), 0.5f, true);
    Tensor c = relu(linear(b, w));
    Tensor e = relu(matmul(reshape(c, {4, 6}), w));
    Tensor loss = add(sum(e), sum(max_pool2d(img, 3, 2, 1)));
    d = decide_packed_saves(tape);
    tape.clear();
  }
  REQUIRE(d.count() == 3);
  const Grads packed = run_graph(&d);
  CHECK(packed.loss == full.loss);
  CHECK(same_bits(packed.gx, full.gx));
  CHECK(same_bits(packed.gw, full.gw));
  CHECK(same_bits(packed.gimg, full.gimg));
  // The saved bytes: relu's 4x6 output (96 bytes) becomes one 4-byte mask word twice; the pool's
  // 1x2x3x3 i32 argmax (72 bytes) becomes 4-bit codes, 9 per plane: two words per plane, 16 bytes.
  int64_t full_total = 0, packed_total = 0;
  for (int64_t b : full.saved_bytes) full_total += b;
  for (int64_t b : packed.saved_bytes) packed_total += b;
  CHECK(full_total - packed_total == 2 * (96 - 4) + (72 - 16));

  // A replay of a packed node makes the same output and mask; an unpacked decision table for
  // another op at that index packs nothing.
  {
    PackedSavesScope scope(&d);
    Generator g(9);
    Tensor x = uniform({4, 6}, -1, 1, g).set_requires_grad(true);
    Tensor y = relu(x);
    REQUIRE(tape.node(0).packed);
    REQUIRE(tape.node(0).outputs.size() == 2);
    const std::vector<Tensor> again = tape.replay(0, {x});
    REQUIRE(again.size() == 2);
    CHECK(same_bits(again[0].to_vector<float>(), y.to_vector<float>()));
    CHECK(again[1].to_vector<int32_t>() ==
          tape.value_tensor(tape.node(0).outputs[1]).to_vector<int32_t>());
    tape.clear();
    Tensor z = gelu(x);  // node 0 again, but gelu: not what was decided for
    CHECK_FALSE(tape.node(0).packed);
    tape.clear();
  }
  testing::expect_error(
      [&] {
        PackedSavesScope scope(&d);
        Generator g(9);
        Tensor x = uniform({4, 6}, -1, 1, g).set_requires_grad(true);
        Tensor y = relu(x);
        try {
          decide_packed_saves(tape);
        } catch (...) {
          tape.clear();
          throw;
        }
      },
      {"decide_packed_saves", "recorded packed"});
}

// ---- Sessions -----------------------------------------------------------------------------------

namespace {
struct Trained {
  std::vector<double> losses;
  std::vector<std::vector<float>> state;
  Profile profile;
  std::vector<StepResult> steps;
};

Trained train_session(SessionOptions o, bool masks) {
  o.masks = masks;
  o.seed = 21;
  allocator_for(Device::cpu()).empty_cache();
  auto s = make_session(o, Preflight::none);
  CHECK((s->packed_saves != nullptr) == masks);
  RematPipeline pipe(*s->trainer);
  Trained t;
  t.profile = pipe.profile();  // two real steps, no remat
  pipe.plan("none", Budget());
  t.steps = pipe.train(2);
  for (const StepResult& r : t.steps) {
    t.losses.push_back(r.loss);
    CHECK(r.exact());
  }
  pipe.finish();
  for (const Tensor& p : s->model->parameters()) {
    t.state.push_back(p.to_vector<float>());
    t.state.push_back(p.grad().to_vector<float>());
  }
  return t;
}

int64_t activation_save_bytes(const Profile& p) {
  int64_t total = 0;
  for (const ProfileSaved& s : p.saved) {
    if (s.category == Category::activation && !p.values[static_cast<size_t>(s.value)].leaf)
      total += static_cast<int64_t>(s.bytes);
  }
  return total;
}
}  // namespace

TEST_CASE(
    "--masks on against off: the same bits of training, the bytes the packed nodes give back") {
  // A ResNet on 64x64 images: the stem's relu (read by max-pool, which saves no input) packs a
  // mask, the pool its codes, and the last block's relu (read by global average pooling) a mask;
  // every other relu's output the next convolution saves.
  SessionOptions r;
  r.model = "resnet-tiny";
  r.batch = 4;
  r.device = "cpu";
  r.model_options["image_size"] = 64;
  const Trained on = train_session(r, true), off = train_session(r, false);
  CHECK(on.losses == off.losses);
  REQUIRE(on.state.size() == off.state.size());
  for (size_t i = 0; i < on.state.size(); ++i) CHECK(same_bits(on.state[i], off.state[i]));
  int64_t packed_nodes = 0;
  for (const ProfileNode& n : on.profile.nodes) packed_nodes += n.packed;
  for (const ProfileNode& n : off.profile.nodes) CHECK_FALSE(n.packed);
  CHECK(packed_nodes == 3);
  // By hand: stem relu (4, 8, 32, 32) f32 -> 32768 bits; max-pool (4, 8, 16, 16) i32 argmax ->
  // 256 4-bit codes a plane, 32 words; last relu (4, 256, 2, 2) f32 -> 4096 bits.
  const int64_t stem = 4 * 8 * 32 * 32, pool = 4 * 8 * 16 * 16, last = 4 * 256 * 2 * 2;
  const int64_t given_back =
      (stem * 4 - stem / 8) + (pool * 4 - 4 * 8 * 32 * 4) + (last * 4 - last / 8);
  CHECK(activation_save_bytes(off.profile) - activation_save_bytes(on.profile) == given_back);

  // The Transformer with dropout: relu's output feeds dropout, so each layer keeps a mask of its
  // (B, S, ff) feed-forward tensor; without dropout linear2 saves that output and nothing packs.
  SessionOptions t;
  t.model = "transformer-tiny";
  t.batch = 4;
  t.device = "cpu";
  t.model_options["dropout"] = 0.1;
  const Trained ton = train_session(t, true), toff = train_session(t, false);
  CHECK(ton.losses == toff.losses);
  for (size_t i = 0; i < ton.state.size(); ++i) CHECK(same_bits(ton.state[i], toff.state[i]));
  const ModelConfig tc = t.model_config();
  const int64_t wide = 4 * tc.seq_len * tc.ff;
  CHECK(activation_save_bytes(toff.profile) - activation_save_bytes(ton.profile) ==
        tc.layers * (wide * 4 - mask_words(wide) * 4));
  t.model_options["dropout"] = 0.0;
  const Trained nodrop = train_session(t, true);
  for (const ProfileNode& n : nodrop.profile.nodes) CHECK_FALSE(n.packed);
}

TEST_CASE("--masks: a profile made with the other setting is refused by name") {
  SessionOptions o;
  o.model = "transformer-tiny";
  o.batch = 2;
  o.device = "cpu";
  Profile p;
  p.run = run_flags(o);
  CHECK(p.run.at("--masks") == "on");
  o.masks = false;
  testing::expect_error([&] { check_profile_run(p, o, "the profile"); },
                        {"the profile was made with --masks on", "--masks off"});
  // A profile from before packed saves was made without them.
  p.run.erase("--masks");
  check_profile_run(p, o, "the profile");
  o.masks = true;
  testing::expect_error([&] { check_profile_run(p, o, "the profile"); }, {"--masks off"});
}
