// Autocast and the 16-bit paths of the core ops: the cast op (values bitwise core/half.h's, the
// gradient's dtype), the casts Tape::apply records under AutocastScope (a low-class op's output and
// saved tensors in 16 bits, its master weight's gradient in f32), a small chain trained one SGD
// step, and every op with a 16-bit path (linear, matmul, bmm, add, mul, scale, sum, mean and the
// shape ops) in bf16 and f16 against the f32 op run on the same 16-bit-rounded inputs.
// Tolerances come from the format's unit roundoff u (bf16: 2^-8, f16: 2^-11): an element rounded
// once from an f32 value is within u |value| of it; f32 sums of K products of magnitude at most 1
// differ between two summation orders by at most about 2 K^2 2^-24, which is added as an absolute
// term where the two runs sum in different orders.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/autograd/precision.h"
#include "regen/core/half.h"
#include "regen/kernels/cpu/convert.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::expect_error;

namespace {

double unit_roundoff(DType d) {
  return d == DType::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
}

// A tensor's elements as doubles, whatever its floating dtype.
std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  switch (t.dtype()) {
    case DType::f64:
      return t.to_vector<double>();
    case DType::f32:
      for (float v : t.to_vector<float>()) out.push_back(v);
      return out;
    case DType::bf16:
      for (bfloat16 v : t.to_vector<bfloat16>()) out.push_back(static_cast<float>(v));
      return out;
    case DType::f16:
      for (float16 v : t.to_vector<float16>()) out.push_back(static_cast<float>(v));
      return out;
    default:
      FAIL("not a floating tensor: ", t.str());
  }
  return out;
}

// The raw 16-bit patterns of a bf16 or f16 tensor.
std::vector<uint16_t> bits16(const Tensor& t) {
  std::vector<uint16_t> out(static_cast<size_t>(t.numel()));
  const Tensor host = t.to(Device::cpu());
  std::memcpy(out.data(), host.raw_data(), out.size() * 2);
  return out;
}

// Uniform f32 values in [-1, 1), rounded to `dtype` (so the 16-bit tensor and its f32 widening
// hold the same numbers).
Tensor rounded(const Shape& shape, DType dtype, uint64_t seed) {
  Generator g(seed);
  const Tensor f = uniform(shape, -1.0, 1.0, g, DType::f32);
  NoGradScope no_grad;
  return cast(f, dtype);
}
Tensor widened(const Tensor& t) {
  NoGradScope no_grad;
  return cast(t, DType::f32);
}

// |got - ref| <= rel |ref| + abs for every element (ref from an f32 run).
void check_near(const std::string& what, const Tensor& got, const Tensor& ref, double rel,
                double abs) {
  REQUIRE_MESSAGE(got.shape() == ref.shape(), what, ": shapes ", sh(got.shape()), " and ",
                  sh(ref.shape()));
  const std::vector<double> a = values(got), b = values(ref);
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::fabs(a[i] - b[i]), tol = rel * std::fabs(b[i]) + abs;
    if (!(err <= tol)) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
    worst = std::max(worst, err / (std::fabs(b[i]) + abs));
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", a.size(), " out of tolerance (rel ", rel,
                ", abs ", abs, "), first at ", first,
                first >= 0
                    ? " (" + std::to_string(a[first]) + " against " + std::to_string(b[first]) + ")"
                    : std::string(),
                "; worst err / (|ref| + abs) = ", worst);
}

}  // namespace

// ---- The cast op -------------------------------------------------------------------------------

TEST_CASE("cast: values bitwise as core/half.h, in every direction") {
  // Random values of several magnitudes, with ties, subnormals, infinities and NaN among them.
  std::vector<float> xs;
  Generator g(7);
  const std::vector<float> u = uniform({3000}, -1.0, 1.0, g, DType::f32).to_vector<float>();
  for (size_t i = 0; i < u.size(); ++i) xs.push_back(u[i] * std::ldexp(1.0f, int(i % 40) - 20));
  for (uint32_t b : {0x3f808000u, 0x3f818000u, 0x00000001u, 0x387fc000u, 0x7f800000u, 0xff800000u,
                     0x7fc00001u, 0x477ff000u, 0x33000000u, 0x80000000u}) {
    float f;
    std::memcpy(&f, &b, 4);
    xs.push_back(f);
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  const Tensor x = from_vector<float>(xs, {n});
  const Tensor b = cast(x, DType::bf16), h = cast(x, DType::f16);
  REQUIRE(b.dtype() == DType::bf16);
  REQUIRE(h.dtype() == DType::f16);
  const std::vector<uint16_t> bb = bits16(b), hb = bits16(h);
  const std::vector<uint16_t> bh = bits16(cast(b, DType::f16)), hbf = bits16(cast(h, DType::bf16));
  const std::vector<float> bw = cast(b, DType::f32).to_vector<float>();
  const std::vector<float> hw = cast(h, DType::f32).to_vector<float>();
  const std::vector<double> d = cast(x, DType::f64).to_vector<double>();
  const std::vector<float> back = cast(cast(x, DType::f64), DType::f32).to_vector<float>();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = xs[static_cast<size_t>(i)];
    const size_t k = static_cast<size_t>(i);
    bad += bb[k] != half::to_bf16(v);
    bad += hb[k] != half::to_fp16(v);
    bad += bh[k] != half::to_fp16(half::from_bf16(half::to_bf16(v)));
    bad += hbf[k] != half::to_bf16(half::from_fp16(half::to_fp16(v)));
    bad += half::bits_of(bw[k]) != half::bits_of(half::from_bf16(bb[k]));
    bad += half::bits_of(hw[k]) != half::bits_of(half::from_fp16(hb[k]));
    bad += !(std::isnan(v) ? std::isnan(d[k]) : d[k] == static_cast<double>(v));
    bad += !(std::isnan(v) ? std::isnan(back[k]) : half::bits_of(back[k]) == half::bits_of(v));
  }
  CHECK(bad == 0);
}

TEST_CASE("cast: same dtype is x itself with no node, and backward casts the gradient back") {
  Tape::current().clear();
  Tensor x = rounded({3, 4}, DType::f32, 1);
  x.set_requires_grad(true);
  const Tensor same = cast(x, DType::f32);
  CHECK(same.impl() == x.impl());
  CHECK(Tape::current().empty());

  const Tensor y = cast(x, DType::bf16);
  CHECK(y.dtype() == DType::bf16);
  REQUIRE(Tape::current().nodes().size() == 1);
  CHECK(Tape::current().nodes()[0].kind == OpKind::cast);
  CHECK(Tape::current().nodes()[0].saved.empty());
  // d/dx sum(3 * widen(y)) = 3, through scale (bf16) and cast's backward (bf16 -> f32).
  const Tensor loss = sum(cast(scale(y, 3.0), DType::f32));
  backward(loss);
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == DType::f32);
  for (float v : x.grad().to_vector<float>()) CHECK(v == 3.0f);

  expect_error([&] { cast(from_vector<int64_t>({1, 2}, {2}), DType::f32); }, {"cast", "i64"});
  expect_error([&] { cast(x, DType::i32); }, {"cast", "i32"});
}

// ---- Autocast insertion ------------------------------------------------------------------------

TEST_CASE(
    "autocast: linear on f32 computes in bf16, saves bf16, and the weight's gradient is f32") {
  Tape::current().clear();
  const int64_t M = 6, K = 40, N = 5;
  Generator g(3);
  const Tensor x = uniform({M, K}, -1.0, 1.0, g, DType::f32);
  Tensor w = uniform({N, K}, -1.0, 1.0, g, DType::f32);
  Tensor b = uniform({N}, -1.0, 1.0, g, DType::f32);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  Tensor y, loss;
  {
    AutocastScope autocast(DType::bf16);
    y = linear(x, w, b);
    CHECK(y.dtype() == DType::bf16);
    const Tape& tape = Tape::current();
    // cast(w), cast(b) (x needs no gradient: its cast is not recorded), then linear.
    REQUIRE(tape.nodes().size() == 3);
    CHECK(tape.nodes()[0].kind == OpKind::cast);
    CHECK(tape.nodes()[1].kind == OpKind::cast);
    const Node& lin = tape.nodes()[2];
    CHECK(lin.kind == OpKind::linear);
    REQUIRE(lin.saved.size() == 2);
    for (int64_t v : lin.saved) {
      const Value& val = tape.value(v);
      CHECK(val.dtype == DType::bf16);
      REQUIRE(val.saved >= 0);
      CHECK(tape.saved_tensor(val.saved).bytes ==
            static_cast<uint64_t>(2 * shape_numel(val.shape)));
    }
    for (int64_t v : lin.inputs) CHECK(tape.value(v).dtype == DType::bf16);
    // A replay of the recorded linear node reproduces its output bit for bit.
    // The saved x and w as the tape holds them; the bias (not saved) cast again.
    std::vector<Tensor> in = {tape.value_tensor(lin.inputs[0]), tape.value_tensor(lin.inputs[1])};
    {
      NoGradScope no_grad;
      in.push_back(cast(b, DType::bf16));
    }
    const std::vector<Tensor> again = Tape::current().replay(lin.index, in);
    CHECK(bits16(again[0]) == bits16(y));
    CHECK(tape.nodes().size() == 3);
    loss = sum(y);  // fp32-class: y is cast to f32 first
    CHECK(loss.dtype() == DType::f32);
    CHECK(tape.nodes().size() == 5);
  }
  backward(loss);
  REQUIRE(w.grad().defined());
  CHECK(w.grad().dtype() == DType::f32);
  CHECK(b.grad().dtype() == DType::f32);

  // Against the f64 computation on the bf16-rounded inputs: y = x_r w_r^T + b_r rounded once
  // (plus f32 sums' error), dw[n, k] = sum_m x_r[m, k] rounded once, db[n] = M.
  const double u = unit_roundoff(DType::bf16), f32_sum = 2.0 * K * K * std::ldexp(1.0, -24);
  NoGradScope no_grad;
  const std::vector<double> xv = values(cast(cast(x, DType::bf16), DType::f32));
  const std::vector<double> wv = values(cast(cast(w, DType::bf16), DType::f32));
  const std::vector<double> bv = values(cast(cast(b, DType::bf16), DType::f32));
  std::vector<double> yref(static_cast<size_t>(M * N)), dwref(static_cast<size_t>(N * K));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = bv[static_cast<size_t>(n)];
      for (int64_t k = 0; k < K; ++k) s += xv[m * K + k] * wv[n * K + k];
      yref[static_cast<size_t>(m * N + n)] = s;
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      double s = 0;
      for (int64_t m = 0; m < M; ++m) s += xv[m * K + k];
      dwref[static_cast<size_t>(n * K + k)] = s;
    }
  }
  check_near("autocast linear output", y, from_vector<double>(yref, {M, N}), u, f32_sum);
  check_near("autocast linear weight gradient", w.grad(), from_vector<double>(dwref, {N, K}), u,
             f32_sum);
  for (float v : b.grad().to_vector<float>()) CHECK(v == static_cast<float>(M));
}

TEST_CASE("autocast: a weight used twice in one forward is copied once, as autocast's cache") {
  const int64_t M = 4, D = 24;
  Generator g(11);
  const Tensor x = uniform({M, D}, -1.0, 1.0, g, DType::f32);
  Tensor w = uniform({D, D}, -0.5, 0.5, g, DType::f32);
  Tensor w2 = uniform({D, D}, -0.5, 0.5, g, DType::f32);
  w.set_requires_grad(true);
  w2.set_requires_grad(true);
  auto count = [](OpKind kind) {
    int n = 0;
    for (const Node& node : Tape::current().nodes()) n += node.kind == kind ? 1 : 0;
    return n;
  };
  // y = linear(linear(linear(x, w), w2), w): w is read by two ops, w2 by one.
  Tape::current().clear();
  Tensor loss;
  {
    AutocastScope autocast(DType::bf16);
    const Tensor y = linear(linear(linear(x, w), w2), w);
    CHECK(count(OpKind::cast) == 2);  // one copy of w, one of w2 (x needs no gradient)
    const Tape& tape = Tape::current();
    // Both linears that read w read the same value: one saved tensor with two readers.
    std::vector<int64_t> w_reads;
    for (const Node& node : tape.nodes()) {
      if (node.kind == OpKind::linear) w_reads.push_back(node.inputs[1]);
    }
    REQUIRE(w_reads.size() == 3);
    CHECK(w_reads[0] == w_reads[2]);
    CHECK(w_reads[0] != w_reads[1]);
    loss = sum(y);
  }
  backward(loss);
  const std::vector<float> once = w.grad().to_vector<float>();
  const std::vector<float> once2 = w2.grad().to_vector<float>();

  // The same forward with the copies made by hand, twice for w. w2's gradient is the same bits.
  // w's differs by where the two readers' gradients meet: on the one copy they are summed and
  // rounded to bf16 once (as in PyTorch, whose autocast cache also keeps one copy), on two copies
  // each is widened and the sum stays f32; so within bf16's unit roundoff of the sum.
  Tape::current().clear();
  w.impl()->grad.reset();
  w2.impl()->grad.reset();
  {
    AutocastScope autocast(DType::bf16);
    const Tensor a = cast(w, DType::bf16), b = cast(w, DType::bf16), c = cast(w2, DType::bf16);
    loss = sum(linear(linear(linear(x, a), c), b));
    CHECK(count(OpKind::cast) == 4);  // three by hand, x's not recorded, the sum's input
  }
  backward(loss);
  const std::vector<float> twice = w.grad().to_vector<float>();
  REQUIRE(twice.size() == once.size());
  int bad = 0, differ = 0;
  for (size_t i = 0; i < once.size(); ++i) {
    differ += once[i] != twice[i] ? 1 : 0;
    bad += std::fabs(once[i] - twice[i]) > unit_roundoff(DType::bf16) * std::fabs(twice[i]) ? 1 : 0;
  }
  CHECK(bad == 0);
  CHECK(differ > 0);  // the sums do meet in bf16 on the one copy
  CHECK(w2.grad().to_vector<float>() == once2);

  // A new recording makes new copies: the cache lives for one recording of the tape.
  Tape::current().clear();
  {
    AutocastScope autocast(DType::bf16);
    const Tensor y = linear(x, w);
    CHECK(count(OpKind::cast) == 1);
    CHECK(y.dtype() == DType::bf16);
  }
  Tape::current().clear();
}

TEST_CASE("autocast: integer inputs stay, fp32 ops get f32, grad mode off autocasts too") {
  Tape::current().clear();
  AutocastScope autocast(DType::f16);
  Generator g(5);
  const Tensor logits = uniform({4, 6}, -1.0, 1.0, g, DType::f32);
  const Tensor w = uniform({6, 6}, -1.0, 1.0, g, DType::f32);
  NoGradScope no_grad;
  const Tensor h = matmul(logits, w);
  CHECK(h.dtype() == DType::f16);
  CHECK(Tape::current().empty());
  const Tensor targets = from_vector<int64_t>({0, 5, 2, 3}, {4});
  const Tensor loss = cross_entropy(h, targets);  // fp32-class: h cast to f32; targets untouched
  CHECK(loss.dtype() == DType::f32);
  CHECK(add(h, logits).dtype() == DType::f32);  // follow with mixed dtypes: f32
  CHECK(add(h, h).dtype() == DType::f16);
  CHECK(concat({h, h}, 0).dtype() == DType::f16);
}

TEST_CASE("autocast: linear -> add -> linear -> sum trains one SGD step in bf16") {
  const int64_t B = 8, D = 16;
  Generator g(9);
  const Tensor x = uniform({B, D}, -1.0, 1.0, g, DType::f32);
  std::vector<Tensor> params = {uniform({D, D}, -0.3, 0.3, g, DType::f32),
                                uniform({D}, -0.3, 0.3, g, DType::f32),
                                uniform({D, D}, -0.3, 0.3, g, DType::f32)};
  auto step_loss = [&](bool mixed) {
    Tape::current().clear();
    for (Tensor& p : params) {
      p.set_requires_grad(true);
      p.impl()->grad.reset();
    }
    std::unique_ptr<AutocastScope> scope;
    if (mixed) scope = std::make_unique<AutocastScope>(DType::bf16);
    const Tensor h = linear(x, params[0], params[1]);
    const Tensor r = add(h, x);  // bf16 beside f32: both f32
    const Tensor y = linear(r, params[2]);
    if (mixed) {
      CHECK(h.dtype() == DType::bf16);
      CHECK(r.dtype() == DType::f32);
      CHECK(y.dtype() == DType::bf16);
    }
    return sum(mul(y, y));
  };
  // The f32 gradients on the same weights, then the bf16 ones.
  Tensor loss32 = step_loss(false);
  const double before32 = values(loss32)[0];
  backward(loss32);
  std::vector<std::vector<double>> grads32;
  for (const Tensor& p : params) grads32.push_back(values(p.grad()));

  Tensor loss = step_loss(true);
  CHECK(loss.dtype() == DType::f32);
  const double before = values(loss)[0];
  backward(loss);
  // The loss and each gradient against f32: a handful of roundings (u each) along the chain; in
  // norm, 16 u leaves room for them and no more than that.
  const double u = unit_roundoff(DType::bf16);
  CHECK(std::fabs(before - before32) <= 16 * u * before32);
  for (size_t i = 0; i < params.size(); ++i) {
    REQUIRE(params[i].grad().defined());
    CHECK(params[i].grad().dtype() == DType::f32);
    const std::vector<double> gv = values(params[i].grad());
    double diff = 0, norm = 0;
    for (size_t k = 0; k < gv.size(); ++k) {
      diff += (gv[k] - grads32[i][k]) * (gv[k] - grads32[i][k]);
      norm += grads32[i][k] * grads32[i][k];
    }
    CHECK_MESSAGE(std::sqrt(diff) <= 16 * u * std::sqrt(norm), "parameter ", i,
                  ": relative gradient error ", std::sqrt(diff / norm));
  }
  // One SGD step on the f32 master weights lowers the bf16 loss.
  const double lr = 1e-3;
  {
    NoGradScope no_grad;
    for (Tensor& p : params) {
      std::vector<float> pv = p.to_vector<float>();
      const std::vector<float> gv = p.grad().to_vector<float>();
      for (size_t k = 0; k < pv.size(); ++k) pv[k] -= static_cast<float>(lr) * gv[k];
      std::memcpy(p.raw_data(), pv.data(), pv.size() * sizeof(float));
    }
  }
  const Tensor after = step_loss(true);
  const double after_v = values(after)[0];
  Tape::current().clear();
  CHECK_MESSAGE(after_v < before, "loss ", before, " -> ", after_v);
}

// ---- The 16-bit paths against f32 -------------------------------------------------------------

namespace {

struct LowpCase {
  std::string name;
  std::vector<Shape> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  bool exact = false;   // one f32 op per element, rounded once: bitwise the f32 result rounded
  double rel_ulps = 1;  // otherwise: rel_ulps u |ref| + abs
  double abs = 0;
  double abs_ulps = 0;  // and abs_ulps u more
};

void run_lowp_case(const LowpCase& c, DType dt) {
  CAPTURE(c.name);
  CAPTURE(dtype_name(dt));
  Tape::current().clear();
  std::vector<Tensor> lo, wide;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    lo.push_back(rounded(c.inputs[i], dt, 100 + i));
    wide.push_back(widened(lo.back()));
    lo.back().set_requires_grad(true);
    wide.back().set_requires_grad(true);
  }
  const Tensor y = c.fn(lo);
  REQUIRE(y.dtype() == dt);
  const Tensor cot = rounded(y.shape(), dt, 999);
  Tape::current().backward(y, cot);
  const Tensor y32 = c.fn(wide);
  REQUIRE(y32.dtype() == DType::f32);
  Tape::current().backward(y32, widened(cot));
  const double u = unit_roundoff(dt);
  // f16's subnormals: an absolute half-ulp of 2^-25 below 2^-14.
  const double tiny = dt == DType::f16 ? std::ldexp(1.0, -24) : 0.0;
  auto compare = [&](const std::string& what, const Tensor& got, const Tensor& ref32) {
    REQUIRE(got.dtype() == dt);
    if (c.exact) {
      NoGradScope no_grad;
      CHECK_MESSAGE(bits16(got) == bits16(cast(ref32, dt)), what,
                    ": not the f32 result rounded once");
    } else {
      check_near(what, got, ref32, c.rel_ulps * u, c.abs + c.abs_ulps * u + tiny);
    }
  };
  compare("output", y, y32);
  for (size_t i = 0; i < lo.size(); ++i) {
    REQUIRE(lo[i].grad().defined());
    compare("gradient of input " + std::to_string(i), lo[i].grad(), wide[i].grad());
  }
}

}  // namespace

TEST_CASE("16-bit paths: bf16 and f16 against the f32 op on the same rounded inputs") {
  // GEMMs: f32 sums of K products (inputs and cotangents in [-1, 1]); the two runs sum in
  // different orders, by at most 2 K^2 2^-24 apart, then the 16-bit result is rounded once.
  auto gemm_abs = [](double K) { return 2.0 * K * K * std::ldexp(1.0, -24); };
  std::vector<LowpCase> cases = {
      {"linear with bias",
       {{7, 33}, {9, 33}, {9}},
       [](const std::vector<Tensor>& x) { return linear(x[0], x[1], x[2]); },
       false,
       1,
       gemm_abs(34)},
      {"linear on a 3-d input without bias",
       {{2, 5, 20}, {6, 20}},
       [](const std::vector<Tensor>& x) { return linear(x[0], x[1]); },
       false,
       1,
       gemm_abs(20)},
      {"matmul",
       {{11, 24}, {24, 13}},
       [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); },
       false,
       1,
       gemm_abs(24)},
      {"bmm",
       {{3, 6, 10}, {3, 10, 7}},
       [](const std::vector<Tensor>& x) { return bmm(x[0], x[1]); },
       false,
       1,
       gemm_abs(10)},
      {"bmm trans_a trans_b",
       {{3, 10, 6}, {3, 7, 10}},
       [](const std::vector<Tensor>& x) { return bmm(x[0], x[1], true, true); },
       false,
       1,
       gemm_abs(10)},
      {"add", {{5, 8}, {5, 8}}, [](const std::vector<Tensor>& x) { return add(x[0], x[1]); }, true},
      // The broadcast operand's gradient is a sum over rows, rounded once.
      {"add broadcast",
       {{4, 3, 8}, {8}},
       [](const std::vector<Tensor>& x) { return add(x[0], x[1]); },
       false,
       1,
       1e-6},
      {"mul", {{5, 8}, {5, 8}}, [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); }, true},
      // The broadcast operand's gradient sums products dy a that were each rounded to 16 bits
      // first (as PyTorch's does): u per term of magnitude at most 1, 6 terms.
      {"mul broadcast",
       {{6, 8}, {8}},
       [](const std::vector<Tensor>& x) { return mul(x[0], x[1]); },
       false,
       1,
       1e-6,
       6},
      {"scale by 1/3",
       {{5, 8}},
       [](const std::vector<Tensor>& x) { return scale(x[0], 1.0 / 3); },
       true},
      // sum rounds once; mean rounds the sum, then the scaled sum (2 u).
      {"sum", {{5, 9}}, [](const std::vector<Tensor>& x) { return sum(x[0]); }, false, 1, 1e-6},
      {"mean", {{5, 9}}, [](const std::vector<Tensor>& x) { return mean(x[0]); }, false, 2, 1e-6},
      {"reshape then scale",
       {{4, 6}},
       [](const std::vector<Tensor>& x) {
         return scale(reshape(x[0], {3, 8}), 1.0);
       },
       true},
      {"transpose",
       {{3, 4, 5}},
       [](const std::vector<Tensor>& x) { return transpose(x[0], 0, 2); },
       true},
      {"permute",
       {{3, 4, 5}},
       [](const std::vector<Tensor>& x) {
         return permute(x[0], {1, 2, 0});
       },
       true},
      {"concat",
       {{2, 3, 4}, {2, 5, 4}},
       [](const std::vector<Tensor>& x) {
         return concat({x[0], x[1]}, 1);
       },
       true},
      {"split (pieces concatenated back, swapped)",
       {{3, 10}},
       [](const std::vector<Tensor>& x) {
         const std::vector<Tensor> p = split(x[0], {4, 6}, 1);
         return concat({p[1], p[0]}, 1);
       },
       true},
      {"narrow",
       {{4, 9}},
       [](const std::vector<Tensor>& x) { return narrow(x[0], 1, 2, 5); },
       true},
  };
  for (const LowpCase& c : cases) {
    run_lowp_case(c, DType::bf16);
    run_lowp_case(c, DType::f16);
  }
}

TEST_CASE("16-bit paths: gradient accumulation sums in f32 and rounds once") {
  // x is read by two ops: its gradient is the sum of both, a + b rounded once.
  for (DType dt : {DType::bf16, DType::f16}) {
    Tape::current().clear();
    Tensor x = rounded({4, 8}, dt, 21);
    x.set_requires_grad(true);
    const Tensor y = add(scale(x, 1.0 / 3), scale(x, 1.0 / 7));
    const Tensor cot = rounded({4, 8}, dt, 22);
    Tape::current().backward(y, cot);
    REQUIRE(x.grad().dtype() == dt);
    const std::vector<double> cv = values(cot), gv = values(x.grad());
    // Each piece: round(c * alpha) (scale's backward), then the two pieces summed in f32 and
    // rounded once.
    int64_t bad = 0;
    for (size_t i = 0; i < cv.size(); ++i) {
      const float c = static_cast<float>(cv[i]);
      const float p = static_cast<float>(1.0 / 3) * c, q = static_cast<float>(1.0 / 7) * c;
      float expect;
      if (dt == DType::bf16) {
        expect = static_cast<float>(
            bfloat16(static_cast<float>(bfloat16(p)) + static_cast<float>(bfloat16(q))));
      } else {
        expect = static_cast<float>(
            float16(static_cast<float>(float16(p)) + static_cast<float>(float16(q))));
      }
      bad += static_cast<float>(gv[i]) != expect;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("16-bit paths: a gradient of the wrong dtype is a clear error") {
  Tape::current().clear();
  Tensor x = rounded({2, 3}, DType::bf16, 31);
  x.set_requires_grad(true);
  const Tensor y = scale(x, 2.0);
  expect_error(
      [&] {
        Tape::current().backward(y, ones({2, 3}, DType::f32));
      },
      {"backward", "gradient", "does not match"});
  Tape::current().clear();
}
