// The 16-bit (bf16, f16) CPU paths of the low-class ops built on GEMMs other than linear, matmul
// and bmm: conv2d, conv_transpose2d, attention, linear_cross_entropy (autograd/precision.cpp).
// Each op runs on 16-bit inputs and is compared with the same op in f32 on the same inputs widened
// (the 16-bit values exactly) and the same cotangent; what each run saves for backward is checked
// (the 16-bit tensors, f32 statistics), and a dry run of each 16-bit op requests the workspace its
// real run requests (tests/dry_paths.h).
//
// Tolerances. A product of two 16-bit values is exact in f32 (8 + 8 or 11 + 11 significant bits,
// at most 24), so an f32 sum of n such products differs from the exact sum by at most
// n * u32 * sum|terms| (u32 = 2^-24), whatever the order; the f32 reference and the 16-bit run's
// f32 accumulation each do that, in different orders (packing, tile and ISA: AVX2 and AVX-512 sum
// each element in the same order, but the two runs need not agree with each other). The 16-bit
// result is that f32 value rounded once: a relative error of at most u (bf16: 2^-8, f16: 2^-11),
// plus, for f16, half the subnormal spacing (2^-25) below 2^-14. So for a bilinear op
//   |got - ref| <= u |ref| + 2 n u32 (1 + u) sum|terms| + tiny,
// and sum|terms| is measured exactly by running the f32 op on the absolute values of its inputs
// and cotangent (every output and gradient of a bilinear op is then the sum of |terms|).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"
#include "regen/autograd/tape.h"
#include "regen/core/allocator.h"
#include "regen/kernels/kernels.h"
#include "tests/dry_paths.h"

using namespace regen;
using regen::testing::scratch_events;

namespace {

constexpr double kU32 = 1.0 / (1 << 24);

double unit_roundoff(DType dt) {
  return dt == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
}
// Half the spacing of f16's subnormals (values below 2^-14 are rounded to multiples of 2^-24).
double tiny(DType dt) {
  return dt == DType::f16 ? std::ldexp(1.0, -25) : 0.0;
}

std::vector<double> values(const Tensor& t) {
  return t.to(DType::f64).to_vector<double>();
}

// Inputs uniform in [-1, 1], rounded to dt: the 16-bit tensor and its exact f32 widening.
struct Input {
  Tensor low, wide;
};
Input input(const Shape& shape, DType dt, uint64_t seed) {
  Generator g(seed);
  Tensor low = uniform(shape, -1.0, 1.0, g, DType::f32).to(dt);
  return {low, low.to(DType::f32)};
}
Tensor absolute(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  for (float& e : v) e = std::fabs(e);
  return from_vector<float>(v, t.shape());
}

// got (16-bit) against ref (f32) elementwise: |got - ref| <= u |ref| + slack[i] + tiny.
void check_lowp(const std::string& what, const Tensor& got, DType dt, const Tensor& ref,
                const std::vector<double>& slack) {
  REQUIRE(got.defined());
  CHECK_MESSAGE(got.dtype() == dt, what, " is ", got.str(), ", expected ",
                std::string(dtype_name(dt)));
  REQUIRE(got.shape() == ref.shape());
  const std::vector<double> a = values(got), b = values(ref);
  REQUIRE(slack.size() == a.size());
  const double u = unit_roundoff(dt);
  int64_t bad = 0, first = -1;
  double worst = 0;  // the largest |got - ref| / bound
  for (size_t i = 0; i < a.size(); ++i) {
    const double bound = u * std::fabs(b[i]) + slack[i] + tiny(dt);
    const double err = std::fabs(a[i] - b[i]);
    if (!(err <= bound)) {
      if (bad++ == 0) first = static_cast<int64_t>(i);
    }
    worst = std::max(worst, err / std::max(bound, 1e-300));
  }
  CHECK_MESSAGE(bad == 0, what, " (", std::string(dtype_name(dt)), "): ", bad, " of ", a.size(),
                " values out of bound, first at ", first,
                first >= 0
                    ? " (" + std::to_string(a[first]) + " against " + std::to_string(b[first]) + ")"
                    : std::string(),
                "; worst error / bound ", worst);
}

// The bilinear bound's slack: 2 n u32 (1 + u) sum|terms|, sum|terms| per element from mag.
std::vector<double> bilinear_slack(const Tensor& mag, int64_t n, DType dt) {
  std::vector<double> s = values(mag);
  for (double& e : s) e *= 2.0 * static_cast<double>(n) * kU32 * (1.0 + unit_roundoff(dt));
  return s;
}

// Forward and backward of fn on `in` (each requiring grad) with cotangent cot: the output and
// every input's gradient.
struct Run {
  Tensor y;
  std::vector<Tensor> grads;
  std::vector<uint64_t> saved_bytes;  // what the forward saved, sorted
};
using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;
Run run(const OpFn& fn, std::vector<Tensor> in, const Tensor& cot) {
  for (Tensor& t : in) {
    if (t.defined() && is_floating(t.dtype())) t.set_requires_grad(true);
  }
  Run r;
  r.y = fn(in);
  for (const SavedTensor& s : Tape::current().saved()) r.saved_bytes.push_back(s.bytes);
  std::sort(r.saved_bytes.begin(), r.saved_bytes.end());
  Tape::current().backward(r.y, cot);
  for (Tensor& t : in) {
    if (t.defined() && is_floating(t.dtype())) r.grads.push_back(t.grad());
  }
  return r;
}

std::vector<uint64_t> sorted(std::vector<uint64_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}
uint64_t bytes(const Shape& s, DType dt) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return static_cast<uint64_t>(n) * dtype_size(dt);
}

// The workspace a 16-bit op's forward and backward request, real and dry, must be the same blocks
// in the same order; and it takes some (the GEMMs pack their panels).
void check_dry_run(const OpFn& fn, const std::vector<Shape>& shapes, DType dt,
                   const Tensor& targets = Tensor()) {
  auto body = [&](const auto& begin) {
    std::vector<Tensor> in;
    for (size_t i = 0; i < shapes.size(); ++i) {
      in.push_back(input(shapes[i], dt, 100 + i).low.set_requires_grad(true));
    }
    if (targets.defined()) in.push_back(targets.to(Device::cpu()));
    begin();
    Tensor y = fn(in);
    const Tensor cot =
        y.dtype() == DType::f32 ? ones(y.shape(), DType::f32) : input(y.shape(), dt, 99).low;
    Tape::current().backward(y, cot);
  };
  const regen::testing::ScratchEvents real = scratch_events(Device::cpu(), false, body);
  const regen::testing::ScratchEvents dry = scratch_events(Device::cpu(), true, body);
  CHECK(!real.empty());
  CHECK(dry == real);
}

const DType kLow[] = {DType::bf16, DType::f16};

// ---- conv2d and conv_transpose2d ---------------------------------------------------------------

struct ConvCase {
  const char* name;
  int64_t N, C, H, W, K, R, S, stride, pad;
};

// A bilinear op y = f(x, w) + b compared in 16 bits and f32; n_y, n_dx, n_dw: the reduction
// lengths of y (the bias included), dx and dw (db is summed in double, over n_dw terms of dy).
void check_bilinear(const std::string& name, const OpFn& fn, const Shape& xs, const Shape& ws,
                    const Shape& bs, const Shape& ys, int64_t n_y, int64_t n_dx, int64_t n_dw,
                    int64_t n_db, const std::vector<uint64_t>& saved16) {
  for (DType dt : kLow) {
    const std::string dtype = dtype_name(dt);
    CAPTURE(dtype);
    const Input x = input(xs, dt, 1), w = input(ws, dt, 2), b = input(bs, dt, 3);
    const Input g = input(ys, dt, 4);
    const Run low = run(fn, {x.low, w.low, b.low}, g.low);
    const Run ref = run(fn, {x.wide, w.wide, b.wide}, g.wide);
    const Run mag =
        run(fn, {absolute(x.wide), absolute(w.wide), absolute(b.wide)}, absolute(g.wide));
    check_lowp(name + " output", low.y, dt, ref.y, bilinear_slack(mag.y, n_y, dt));
    REQUIRE(low.grads.size() == 3);
    check_lowp(name + " dx", low.grads[0], dt, ref.grads[0],
               bilinear_slack(mag.grads[0], n_dx, dt));
    check_lowp(name + " dw", low.grads[1], dt, ref.grads[1],
               bilinear_slack(mag.grads[1], n_dw, dt));
    check_lowp(name + " db", low.grads[2], dt, ref.grads[2],
               bilinear_slack(mag.grads[2], n_db, dt));
    // Saved: the 16-bit x and weight, half the bytes of the f32 run's.
    CHECK(low.saved_bytes == sorted(saved16));
    std::vector<uint64_t> half_of_ref;
    for (uint64_t v : ref.saved_bytes) half_of_ref.push_back(v / 2);
    CHECK(low.saved_bytes == half_of_ref);
    check_dry_run(fn, {xs, ws, bs}, dt);
  }
}

}  // namespace

TEST_CASE("amp gemm ops: conv2d in bf16 and f16 against f32 on the same values") {
  // Backward-data takes each of its routes: dcol + col2im (small planes, strides), the flipped
  // convolution (stride 1, planes of 100 pixels or more), and the pointwise product.
  const ConvCase cases[] = {
      {"3x3 pad 1, 9x9 (dcol)", 2, 5, 9, 9, 6, 3, 3, 1, 1},
      {"3x3 pad 1, 12x12 (flipped)", 2, 4, 12, 12, 3, 3, 3, 1, 1},
      {"1x1 (pointwise)", 2, 8, 6, 6, 5, 1, 1, 1, 0},
      {"3x3 stride 2 pad 1", 2, 3, 11, 11, 4, 3, 3, 2, 1},
  };
  for (const ConvCase& c : cases) {
    const std::string case_name = c.name;
    CAPTURE(case_name);
    const int64_t P = (c.H + 2 * c.pad - c.R) / c.stride + 1;
    const int64_t Q = (c.W + 2 * c.pad - c.S) / c.stride + 1;
    const OpFn fn = [&](const std::vector<Tensor>& in) {
      return conv2d(in[0], in[1], in[2], c.stride, c.pad);
    };
    const Shape xs{c.N, c.C, c.H, c.W}, ws{c.K, c.C, c.R, c.S};
    check_bilinear(std::string("conv2d ") + c.name, fn, xs, ws, {c.K}, {c.N, c.K, P, Q},
                   c.C * c.R * c.S + 1, c.K * c.R * c.S, c.N * P * Q, c.N * P * Q,
                   {bytes(xs, DType::bf16), bytes(ws, DType::bf16)});
  }
}

TEST_CASE("amp gemm ops: conv2d in bf16 with a frozen weight: the bias gradient alone") {
  const Input x = input({2, 3, 8, 8}, DType::bf16, 5), w = input({4, 3, 3, 3}, DType::bf16, 6);
  const Input b = input({4}, DType::bf16, 7), g = input({2, 4, 8, 8}, DType::bf16, 8);
  Tensor bl = b.low, bw = b.wide;
  bl.set_requires_grad(true);
  bw.set_requires_grad(true);
  Tape::current().backward(conv2d(x.low, w.low, bl, 1, 1), g.low);
  Tape::current().backward(conv2d(x.wide, w.wide, bw, 1, 1), g.wide);
  const Tensor mag = absolute(g.wide).to(DType::f64);
  std::vector<double> sums(4, 0.0);  // sum|dy| per channel
  const std::vector<double> m = mag.to_vector<double>();
  for (size_t i = 0; i < m.size(); ++i) sums[i / 64 % 4] += m[i];
  for (double& s : sums) s *= 2.0 * 128 * kU32 * (1.0 + unit_roundoff(DType::bf16));
  check_lowp("conv2d db (frozen weight)", bl.grad(), DType::bf16, bw.grad(), sums);
}

TEST_CASE("amp gemm ops: conv_transpose2d in bf16 and f16 against f32 on the same values") {
  struct Case {
    const char* name;
    int64_t N, Cin, H, W, Cout, k, stride, pad, out_pad;
  };
  const Case cases[] = {
      {"3x3 stride 2 pad 1 out_pad 1", 2, 4, 5, 5, 3, 3, 2, 1, 1},
      {"3x3 stride 1 pad 1, 12x12 (flipped)", 2, 4, 12, 12, 3, 3, 1, 1, 0},
      {"4x4 stride 2 pad 1", 1, 3, 6, 6, 5, 4, 2, 1, 0},
  };
  for (const Case& c : cases) {
    const std::string case_name = c.name;
    CAPTURE(case_name);
    const int64_t Ho = (c.H - 1) * c.stride - 2 * c.pad + c.k + c.out_pad;
    const int64_t Wo = (c.W - 1) * c.stride - 2 * c.pad + c.k + c.out_pad;
    const OpFn fn = [&](const std::vector<Tensor>& in) {
      return conv_transpose2d(in[0], in[1], in[2], c.stride, c.pad, c.out_pad);
    };
    const Shape xs{c.N, c.Cin, c.H, c.W}, ws{c.Cin, c.Cout, c.k, c.k};
    // y sums over (C_in, taps) + bias; dx is a conv2d of dy over (C_out, k, k); dw and db sum
    // over every (image, input pixel) and (image, output pixel).
    check_bilinear(std::string("conv_transpose2d ") + c.name, fn, xs, ws, {c.Cout},
                   {c.N, c.Cout, Ho, Wo}, c.Cin * c.k * c.k + 1, c.Cout * c.k * c.k,
                   c.N * c.H * c.W, c.N * Ho * Wo,
                   {bytes(xs, DType::bf16), bytes(ws, DType::bf16)});
  }
}

// ---- attention ---------------------------------------------------------------------------------

namespace {

// The f32 kernels on the widened qkv, with the dropout stream the 16-bit op drew.
struct AttentionRef {
  std::vector<float> out, lse, dqkv;
};
AttentionRef attention_ref(const Tensor& qkv32, const Tensor& dout32, const Tensor& out_used,
                           const int32_t* pad, const AttentionShape& s) {
  AttentionRef r;
  const int64_t D = s.H * s.Dh;
  r.out.resize(static_cast<size_t>(s.B * s.S * D));
  r.lse.resize(static_cast<size_t>(s.B * s.H * s.S));
  r.dqkv.resize(static_cast<size_t>(s.B * s.S * 3 * D));
  cpu::attention_forward<float>(qkv32.data<float>(), pad, r.out.data(), r.lse.data(), s);
  // Backward reads the output forward saved: the 16-bit run's (rounded), widened, so the two
  // backward runs see the same O.
  cpu::attention_backward<float>(dout32.data<float>(), qkv32.data<float>(), out_used.data<float>(),
                                 r.lse.data(), pad, r.dqkv.data(), s);
  return r;
}

void check_attention(const char* name, bool causal, bool mask, float dropout_p) {
  const std::string case_name = name;
  CAPTURE(case_name);
  const int64_t B = 2, S = 7, H = 2, Dh = 4, D = H * Dh;
  Tensor pad_mask;
  if (mask) {
    std::vector<int32_t> m(static_cast<size_t>(B * S), 0);
    m[5] = m[6] = 1;                   // batch 0: the last two keys are padding
    for (int64_t j = 0; j < S; ++j) {  // batch 1: every key but the second padded
      m[static_cast<size_t>(S + j)] = j == 1 ? 0 : 1;
    }
    pad_mask = from_vector<int32_t>(m, {B, S});
  }
  const OpFn fn = [&](const std::vector<Tensor>& in) {
    return attention(in[0], H, pad_mask, causal, dropout_p);
  };
  for (DType dt : kLow) {
    const std::string dtype = dtype_name(dt);
    CAPTURE(dtype);
    const Input qkv = input({B, S, 3 * D}, dt, 21), g = input({B, S, D}, dt, 22);
    Tensor q = qkv.low;
    q.set_requires_grad(true);
    const Tensor out = fn({q});
    REQUIRE(out.dtype() == dt);
    // What forward saved: qkv and out in 16 bits, lse (B, H, S) in f32, and the mask.
    std::vector<uint64_t> saved;
    for (const SavedTensor& s : Tape::current().saved()) saved.push_back(s.bytes);
    std::vector<uint64_t> want = {bytes({B, S, 3 * D}, dt), bytes({B, S, D}, dt),
                                  bytes({B, H, S}, DType::f32)};
    if (mask) want.push_back(bytes({B, S}, DType::i32));
    CHECK(sorted(saved) == sorted(want));
    const AttentionAttrs a = Tape::current().nodes().back().attr<AttentionAttrs>();
    Tape::current().backward(out, g.low);
    const Tensor dqkv = q.grad();

    AttentionShape s;
    s.B = B, s.S = S, s.H = H, s.Dh = Dh;
    s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
    s.causal = causal;
    s.dropout_p = dropout_p;
    s.seed = a.seed;
    s.stream = a.stream;
    const AttentionRef r = attention_ref(qkv.wide, g.wide, out.to(DType::f32),
                                         mask ? pad_mask.data<int32_t>() : nullptr, s);
    // Both runs compute in f32 from the same 16-bit values; they differ by the order of f32
    // sums and where the scale is applied, then the 16-bit run rounds once (u |ref|). With
    // |qkv|, |dout| <= 1: a score's f32 error is at most Dh u32 |q||k| scale <= Dh^1.5 u32 per run,
    // a probability's relative error 2 (score errors) + 2 S u32 (the normalizing sum), and the
    // output, a convex combination of v times keep = 1 / (1 - p), another S u32: so
    //   out: (4 Dh^1.5 + 3 S) u32 keep.
    // Gradients: dv = Pd^T dO sums S terms of at most keep (Pd <= keep, column sums <= S keep);
    // dq = dS k and dk = dS^T q sum S terms of dS = P (dP m - <dO, O>) scale, each at most
    // P 2 Dh keep scale: relative errors as P's plus (Dh + S) u32 for the sums, so
    //   dqkv: (4 Dh^1.5 + 3 S + 2 (Dh + S)) u32 keep S (1 + 2 Dh scale).
    const double keep = 1.0 / (1.0 - dropout_p), dh15 = std::pow(static_cast<double>(Dh), 1.5);
    const double out_slack = (4 * dh15 + 3 * S) * kU32 * keep;
    const double grad_slack = (4 * dh15 + 3 * S + 2 * (Dh + S)) * kU32 * keep * S *
                              (1 + 2 * Dh * static_cast<double>(s.scale));
    const Tensor out_ref = from_vector<float>(r.out, {B, S, D});
    const Tensor dqkv_ref = from_vector<float>(r.dqkv, {B, S, 3 * D});
    check_lowp(std::string("attention output, ") + name, out, dt, out_ref,
               std::vector<double>(static_cast<size_t>(B * S * D), out_slack));
    check_lowp(std::string("attention dqkv, ") + name, dqkv, dt, dqkv_ref,
               std::vector<double>(static_cast<size_t>(B * S * 3 * D), grad_slack));
    check_dry_run(fn, {{B, S, 3 * D}}, dt);
  }
}

}  // namespace

TEST_CASE("amp gemm ops: attention in bf16 and f16 against f32 on the same values") {
  check_attention("plain", false, false, 0.0f);
  check_attention("causal", true, false, 0.0f);
  // The dropout mask is the f32 run's: the same Philox words decide, so a different mask would
  // differ by whole probabilities, far beyond the bound.
  check_attention("key padding, dropout 0.3", false, true, 0.3f);
  check_attention("causal, dropout 0.5", true, false, 0.5f);
}

// ---- linear_cross_entropy ----------------------------------------------------------------------

// linear_cross_entropy on (M, K) x, (V, K) weight and, with_bias, a (V) bias, row 4 ignored, the
// targets spread over the vocabulary (so over its products' tiles when V is above one tile: 4096
// rows at most, autograd/ops_linear_cross_entropy_lowp.cpp), with chunks of 4 rows and automatic,
// its gradients made in the forward and recomputed in the backward, for a loss gradient of 1 and
// of 0.75 (which the forward's f32 gradients are scaled by before they are rounded).
void check_linear_cross_entropy(int64_t M, int64_t K, int64_t V, bool with_bias, bool recompute,
                                float cot);
void check_linear_cross_entropy(int64_t M, int64_t K, int64_t V, bool with_bias) {
  for (const bool recompute : {false, true}) {
    for (const float cot : {1.0f, 0.75f}) {
      CAPTURE(recompute);
      CAPTURE(cot);
      check_linear_cross_entropy(M, K, V, with_bias, recompute, cot);
    }
  }
}
void check_linear_cross_entropy(int64_t M, int64_t K, int64_t V, bool with_bias, bool recompute,
                                float cot) {
  std::vector<int64_t> tv(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) tv[static_cast<size_t>(i)] = (i * (V / M + 7) + 3) % V;
  tv[static_cast<size_t>(M - 1)] = V - 1;  // the last column
  tv[4] = -100;                            // ignored
  const Tensor targets = from_vector<int64_t>(tv, {M});
  const int64_t counted = M - 1;
  for (int64_t chunk : {int64_t{4}, int64_t{0}}) {  // several chunks; one (automatic)
    CAPTURE(chunk);
    const OpFn fn = [&](const std::vector<Tensor>& in) {
      return with_bias
                 ? linear_cross_entropy(in[0], in[1], in[2], in[3], -100, chunk, recompute)
                 : linear_cross_entropy(in[0], in[1], Tensor(), in[2], -100, chunk, recompute);
    };
    for (DType dt : kLow) {
      const std::string dtype = dtype_name(dt);
      CAPTURE(dtype);
      const Input x = input({M, K}, dt, 31), w = input({V, K}, dt, 32), b = input({V}, dt, 33);
      const Tensor g = full({}, cot, DType::f32);
      const Run low = run(fn,
                          with_bias ? std::vector<Tensor>{x.low, w.low, b.low, targets}
                                    : std::vector<Tensor>{x.low, w.low, targets},
                          g);
      const Run ref = run(fn,
                          with_bias ? std::vector<Tensor>{x.wide, w.wide, b.wide, targets}
                                    : std::vector<Tensor>{x.wide, w.wide, targets},
                          g);
      REQUIRE(low.y.dtype() == DType::f32);
      // Saved, recomputing: x, weight, bias in 16 bits, targets, and lse (M) in f32. Otherwise
      // the forward's gradients of x, weight and bias as f32 sums.
      std::vector<uint64_t> saved =
          recompute ? std::vector<uint64_t>{bytes({M, K}, dt), bytes({V, K}, dt),
                                            bytes({M}, DType::i64), bytes({M}, DType::f32)}
                    : std::vector<uint64_t>{bytes({M, K}, DType::f32), bytes({V, K}, DType::f32)};
      if (with_bias) saved.push_back(bytes({V}, recompute ? dt : DType::f32));
      CHECK(low.saved_bytes == sorted(saved));
      // With |x|, |w|, |b| <= 1 a logit sums at most K + 1 terms of at most 1: each run's f32
      // logit is within (K + 1)^2 u32 of the exact one, so e = 2 (K + 1)^2 u32 between the runs.
      // The loss, lse - logit[target] averaged, moves by at most 2 e plus V u32 for lse's sum (the
      // loss is never rounded to 16 bits: a bf16 loss would be off by up to u |loss|, far more).
      const double e = 2.0 * (K + 1) * (K + 1) * kU32;
      const double loss_bound = 2 * e + 2 * V * kU32 * (1 + std::fabs(ref.y.item<float>()));
      CHECK(std::fabs(static_cast<double>(low.y.item<float>()) - ref.y.item<float>()) <=
            loss_bound);
      // dlogits = (softmax - onehot) / counted: each |dlogit| <= 1 / counted, a row's sum of
      // |dlogit| <= 2 / counted; a logit error e moves a probability by at most 2 p e. So
      //   dx (sums V terms dlogit w, in any order: the 16-bit run sums tile by tile):
      //     2 V u32 (2 / counted) + 4 e / counted;
      //   dw (sums M terms dlogit x) and db (M terms dlogit): (2 M u32 + 2 e) M / counted.
      // Each bound has u |ref| for the one rounding to 16 bits on top (check_lowp). bf16 rounds
      // dlogits to bf16 before the products of dx and dw (as autocast's bf16 logits gradient):
      // each term moves by at most u |dlogit| |w or x|, so dx by u (2 / counted) more and dw by
      // u M / counted more (db sums the f32 dlogits).
      // The gradients scale with the loss's gradient, and so do their bounds.
      const double sc = cot / counted;
      const double rounded = dt == DType::bf16 ? unit_roundoff(dt) : 0.0;
      REQUIRE(low.grads.size() == (with_bias ? 3u : 2u));
      check_lowp("linear_cross_entropy dx", low.grads[0], dt, ref.grads[0],
                 std::vector<double>(M * K, 2 * V * kU32 * 2 * sc + 4 * e * sc + 2 * rounded * sc));
      check_lowp("linear_cross_entropy dw", low.grads[1], dt, ref.grads[1],
                 std::vector<double>(V * K, (2 * M * kU32 + 2 * e) * M * sc + rounded * M * sc));
      if (with_bias) {
        check_lowp("linear_cross_entropy db", low.grads[2], dt, ref.grads[2],
                   std::vector<double>(V, (2 * M * kU32 + 2 * e) * M * sc));
      }
      std::vector<Shape> shapes = {{M, K}, {V, K}};
      if (with_bias) shapes.push_back({V});
      check_dry_run(fn, shapes, dt, targets);
    }
  }
}

TEST_CASE("amp gemm ops: linear_cross_entropy in bf16 and f16: an f32 loss, 16-bit gradients") {
  check_linear_cross_entropy(10, 12, 17, true);
  check_linear_cross_entropy(10, 12, 17, false);
}

// The backward's vocabulary tiles: V = 9000 is 3 tiles of 3000 rows, and with chunks of 4 rows
// its blocks are 12 rows (as many floats as the forward's (4, V) buffer): 3 blocks of 10 rows in
// each tile. The targets fall in every tile and the last column; dW and db are rounded tile by
// tile.
TEST_CASE("amp gemm ops: linear_cross_entropy in bf16 and f16 over several vocabulary tiles") {
  check_linear_cross_entropy(30, 12, 9000, true);
  check_linear_cross_entropy(30, 12, 9000, false);
}

// What recompute buys in 16 bits: the forward's gradients hold W's as f32 sums, (V, K) floats,
// from the forward to the backward, where it is rounded beside them; recomputing, the backward
// holds one (tile, K) f32 tile and the 16-bit gradient (and the GEMMs' f32 packing of W's tile).
// V = 9000, K = 512: 3 tiles of 3000 rows (6.1 MB) against an 18.4 MB f32 gradient; measured
// 28.2 MB against 21.7 MB, asserted with room for the packing's blocking on other CPUs.
TEST_CASE("amp gemm ops: linear_cross_entropy in bf16 recomputing its logits peaks lower") {
  const int64_t M = 30, K = 512, V = 9000;
  std::vector<int64_t> tv;
  for (int64_t i = 0; i < M; ++i) tv.push_back((i * 307) % V);
  const Tensor targets = from_vector<int64_t>(tv, {M});
  const Input x = input({M, K}, DType::bf16, 41), w = input({V, K}, DType::bf16, 42);
  CachingAllocator& alloc = allocator_for(Device::cpu());
  int64_t peak[2] = {0, 0};
  std::vector<float> dw[2];
  for (const bool recompute : {false, true}) {
    Tensor xi = x.low.clone().set_requires_grad(true), wi = w.low.clone().set_requires_grad(true);
    alloc.reset_peak();
    const int64_t before = alloc.stats().allocated.current;
    Tensor loss = linear_cross_entropy(xi, wi, Tensor(), targets, -100, 4, recompute);
    Tape::current().backward(loss);
    peak[recompute] = alloc.stats().allocated.peak - before;
    dw[recompute] = wi.grad().to(DType::f32).to_vector<float>();
  }
  MESSAGE("peak above the inputs: gradients in the forward ", peak[0], " B, recomputed ", peak[1],
          " B");
  const int64_t f32_grad = V * K * 4;
  CHECK(peak[1] + f32_grad / 4 <= peak[0]);
  // The same gradient up to the order of f32 sums (far below bf16's step) and one bf16 rounding
  // each: within two bf16 units of the largest element.
  REQUIRE(dw[0].size() == dw[1].size());
  double largest = 0, worst = 0;
  for (size_t i = 0; i < dw[0].size(); ++i) {
    largest = std::max(largest, static_cast<double>(std::fabs(dw[0][i])));
    worst = std::max(worst, static_cast<double>(std::fabs(dw[0][i] - dw[1][i])));
  }
  CHECK(largest > 0);
  CHECK(worst <= 2 * unit_roundoff(DType::bf16) * largest);
}

TEST_CASE("amp gemm ops: 16-bit inputs of mixed dtypes are refused, naming the op") {
  const Input x = input({1, 2, 4, 4}, DType::bf16, 1);
  const Input w = input({3, 2, 3, 3}, DType::f16, 2);
  CHECK_THROWS_WITH_AS(conv2d(x.low, w.low), doctest::Contains("conv2d"), regen::Error);
}
