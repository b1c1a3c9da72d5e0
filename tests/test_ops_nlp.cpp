// Forward values of layernorm, softmax, attention and cross_entropy against plain loops (f32 and
// f64); the chunked linear_cross_entropy against cross_entropy(linear(...)) (loss, every gradient,
// working memory, determinism); dropout masks (statistics, reproducibility, remat replay); SGD and
// AdamW against a plain double-precision transcription of torch's formulas and against numbers
// produced by PyTorch; optimizer state accounting; results that do not depend on the thread count;
// and the error messages of every check these ops and optimizers add. The block that trains end to
// end is tests/test_train_block.cpp.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/core/allocator.h"
#include "regen/core/philox.h"
#include "regen/kernels/kernels.h"
#include "regen/models/optim.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::expect_error;

namespace {

template <class T>
Tensor rand_t(const Shape& s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Generator g(seed);
  return uniform(s, lo, hi, g, dtype_of<T>::value);
}

template <class T>
std::vector<double> as_double(const Tensor& t) {
  const std::vector<T> v = t.to_vector<T>();
  return std::vector<double>(v.begin(), v.end());
}

// |got - want| <= atol + rtol * |want| element-wise (infinities must match exactly); prints the
// first mismatches and the worst error.
void check_close(const std::vector<double>& got, const std::vector<double>& want, double atol,
                 double rtol, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": ", got.size(), " values, expected ",
                  want.size());
  int bad = 0;
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool both_inf = std::isinf(want[i]) && got[i] == want[i];
    const double err = both_inf ? 0.0 : std::fabs(got[i] - want[i]);
    const bool ok = both_inf || (std::isfinite(got[i]) && err <= atol + rtol * std::fabs(want[i]));
    if (!ok && bad++ < 5) {
      MESSAGE(what, ": element ", i, " got ", got[i], " expected ", want[i]);
    }
    if (!(err <= worst)) {
      worst = err;
      worst_at = i;
    }
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " mismatches, worst error ", worst, " at ", worst_at);
}

template <class T>
double atol_for() {
  return std::is_same<T, float>::value ? 2e-5 : 1e-12;
}

}  // namespace

// ---- layernorm / softmax ----------------------------------------------------------------------

TEST_CASE_TEMPLATE("layernorm: output, row mean and rstd match plain loops", T, float, double) {
  const int64_t M = 5, N = 13;
  // A large offset: the two-pass variance must not lose the small spread.
  Tensor x = rand_t<T>({M, N}, 1, 97.0, 103.0);
  Tensor gamma = rand_t<T>({N}, 2, 0.5, 1.5), beta = rand_t<T>({N}, 3);
  const double eps = 1e-5;
  const std::vector<double> xv = as_double<T>(x), gv = as_double<T>(gamma), bv = as_double<T>(beta);
  std::vector<double> y_ref, mean_ref, rstd_ref;
  for (int64_t r = 0; r < M; ++r) {
    double mu = 0, var = 0;
    for (int64_t j = 0; j < N; ++j) mu += xv[r * N + j] / N;
    for (int64_t j = 0; j < N; ++j) var += (xv[r * N + j] - mu) * (xv[r * N + j] - mu) / N;
    const double rs = 1.0 / std::sqrt(var + eps);
    for (int64_t j = 0; j < N; ++j) y_ref.push_back((xv[r * N + j] - mu) * rs * gv[j] + bv[j]);
    mean_ref.push_back(mu);
    rstd_ref.push_back(rs);
  }
  const double tol = std::is_same<T, float>::value ? 2e-4 : 1e-10;
  check_close(as_double<T>(layernorm(x, gamma, beta, eps)), y_ref, tol, tol, "layernorm y");
  // The hidden outputs, through the launcher.
  Tensor y = empty({M, N}, x.dtype()), mean = empty({M}, x.dtype()), rstd = empty({M}, x.dtype());
  cpu::layernorm_forward<T>(x.data<T>(), gamma.data<T>(), beta.data<T>(), y.data<T>(),
                            mean.data<T>(), rstd.data<T>(), M, N, eps);
  check_close(as_double<T>(mean), mean_ref, 0, 1e-6, "layernorm mean");
  check_close(as_double<T>(rstd), rstd_ref, 0, std::is_same<T, float>::value ? 1e-4 : 1e-10,
              "layernorm rstd");
}

TEST_CASE_TEMPLATE("softmax: rows match plain loops, large logits do not overflow", T, float,
                   double) {
  const int64_t M = 4, N = 9;
  Tensor x = rand_t<T>({M, N}, 4, -4.0, 4.0);
  T* p = x.data<T>();
  for (int64_t j = 0; j < N; ++j) p[3 * N + j] += T(1000);  // exp(1000) overflows without the max
  const std::vector<double> xv = as_double<T>(x);
  std::vector<double> want;
  for (int64_t r = 0; r < M; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < N; ++j) mx = std::max(mx, xv[r * N + j]);
    for (int64_t j = 0; j < N; ++j) sum += std::exp(xv[r * N + j] - mx);
    for (int64_t j = 0; j < N; ++j) want.push_back(std::exp(xv[r * N + j] - mx) / sum);
  }
  const std::vector<double> got = as_double<T>(softmax(x));
  check_close(got, want, atol_for<T>(), 1e-5, "softmax");
  for (int64_t r = 0; r < M; ++r) {
    double s = 0;
    for (int64_t j = 0; j < N; ++j) s += got[r * N + j];
    CHECK(s == doctest::Approx(1.0).epsilon(1e-6));
  }
}

// ---- attention ----------------------------------------------------------------------------------

namespace {
// Scores, masks, softmax, dropout and weighted sums written out directly. qkv: (B, S, 3*H*Dh).
struct AttentionRef {
  std::vector<double> out, lse;
};
AttentionRef attention_reference(const std::vector<double>& qkv, const std::vector<int32_t>& pad,
                                 const AttentionShape& s) {
  const int64_t D = s.H * s.Dh;
  AttentionRef r;
  r.out.assign(static_cast<size_t>(s.B * s.S * D), 0.0);
  r.lse.assign(static_cast<size_t>(s.B * s.H * s.S), 0.0);
  const double keep_scale = 1.0 / (1.0 - static_cast<double>(s.dropout_p));
  const uint64_t threshold = static_cast<uint64_t>(static_cast<double>(s.dropout_p) * 4294967296.0);
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return qkv[static_cast<size_t>(((b * s.S + t) * 3 + part) * D + h * s.Dh + d)];
  };
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t i = 0; i < s.S; ++i) {
        std::vector<double> score(static_cast<size_t>(s.S));
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.S; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.Dh; ++d) dot += at(b, i, 0, h, d) * at(b, j, 1, h, d);
          const bool masked = (!pad.empty() && pad[b * s.S + j] != 0) || (s.causal && j > i);
          score[j] = masked ? -INFINITY : dot * static_cast<double>(s.scale);
          mx = std::max(mx, score[j]);
        }
        double& lse = r.lse[static_cast<size_t>((b * s.H + h) * s.S + i)];
        if (mx == -INFINITY) {
          lse = -INFINITY;
          continue;  // output row stays 0
        }
        double sum = 0;
        for (int64_t j = 0; j < s.S; ++j) sum += std::exp(score[j] - mx);
        lse = mx + std::log(sum);
        for (int64_t j = 0; j < s.S; ++j) {
          double p = std::exp(score[j] - mx) / sum;
          if (s.dropout_p > 0) {
            const uint64_t idx = static_cast<uint64_t>(((b * s.H + h) * s.S + i) * s.S + j);
            p = philox_word(s.seed, s.stream, idx) >= threshold ? p * keep_scale : 0.0;
          }
          for (int64_t d = 0; d < s.Dh; ++d) {
            r.out[static_cast<size_t>((b * s.S + i) * D + h * s.Dh + d)] += p * at(b, j, 2, h, d);
          }
        }
      }
    }
  }
  return r;
}

AttentionShape make_shape(int64_t B, int64_t S, int64_t H, int64_t Dh, bool causal) {
  AttentionShape s;
  s.B = B;
  s.S = S;
  s.H = H;
  s.Dh = Dh;
  // The op passes 1/sqrt(Dh) through AttentionShape::scale, a float, for f64 as well.
  s.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(Dh)));
  s.causal = causal;
  return s;
}
}  // namespace

TEST_CASE_TEMPLATE("attention: forward matches plain loops, with and without masks", T, float,
                   double) {
  const int64_t B = 2, S = 7, H = 3, Dh = 4, D = H * Dh;
  Tensor qkv = rand_t<T>({B, S, 3 * D}, 11, -2.0, 2.0);
  const std::vector<double> qv = as_double<T>(qkv);
  const double tol = atol_for<T>() * 10;

  SUBCASE("no mask") {
    const AttentionRef ref = attention_reference(qv, {}, make_shape(B, S, H, Dh, false));
    check_close(as_double<T>(attention(qkv, H)), ref.out, tol, 1e-5, "attention out");
  }
  SUBCASE("causal") {
    const AttentionRef ref = attention_reference(qv, {}, make_shape(B, S, H, Dh, true));
    check_close(as_double<T>(attention(qkv, H, Tensor(), true)), ref.out, tol, 1e-5,
                "attention causal out");
  }
  SUBCASE("key padding and causal, with a row that sees no key") {
    // Batch 1 pads key 0, so its query 0 sees nothing under the causal mask: output 0, lse -inf.
    const std::vector<int32_t> pad = {0, 0, 0, 0, 1, 1, 0, /**/ 1, 0, 0, 0, 0, 0, 1};
    const AttentionShape s = make_shape(B, S, H, Dh, true);
    const AttentionRef ref = attention_reference(qv, pad, s);
    const Tensor mask = from_vector<int32_t>(pad, {B, S});
    const std::vector<double> out = as_double<T>(attention(qkv, H, mask, true));
    check_close(out, ref.out, tol, 1e-5, "attention masked out");
    for (int64_t d = 0; d < D; ++d) CHECK(out[static_cast<size_t>(S * D + d)] == 0.0);
    // lse through the launcher.
    Tensor o = empty({B, S, D}, qkv.dtype()), lse = empty({B, H, S}, qkv.dtype());
    cpu::attention_forward<T>(qkv.data<T>(), mask.data<int32_t>(), o.data<T>(), lse.data<T>(), s);
    const std::vector<double> lv = as_double<T>(lse);
    check_close(lv, ref.lse, tol, 1e-5, "attention lse");
    CHECK(std::isinf(lv[static_cast<size_t>((1 * H + 0) * S + 0)]));
  }
}

TEST_CASE_TEMPLATE("attention: dropout keeps exactly the Philox elements of kernels/shapes.h", T,
                   float, double) {
  const int64_t B = 2, S = 9, H = 2, Dh = 3, D = H * Dh;
  Tensor qkv = rand_t<T>({B, S, 3 * D}, 12, -2.0, 2.0);
  AttentionShape s = make_shape(B, S, H, Dh, false);
  s.dropout_p = 0.25f;
  s.seed = 0x1234abcdULL;
  s.stream = 77;
  const std::vector<int32_t> pad = {0, 0, 0, 0, 0, 0, 0, 1, 1, /**/ 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const Tensor mask = from_vector<int32_t>(pad, {B, S});
  const AttentionRef ref = attention_reference(as_double<T>(qkv), pad, s);
  Tensor out = empty({B, S, D}, qkv.dtype()), lse = empty({B, H, S}, qkv.dtype());
  cpu::attention_forward<T>(qkv.data<T>(), mask.data<int32_t>(), out.data<T>(), lse.data<T>(), s);
  check_close(as_double<T>(out), ref.out, atol_for<T>() * 10, 1e-5, "attention dropout out");
  // lse is that of the probabilities before dropout.
  check_close(as_double<T>(lse), ref.lse, atol_for<T>() * 10, 1e-5, "attention dropout lse");
}

TEST_CASE("attention: a batch whose keys are all padded gives zero output and zero gradient") {
  // gradcheck cannot see a NaN (a NaN error compares false), so this checks finiteness directly.
  const int64_t B = 2, S = 5, H = 2, D = 8;
  Tensor qkv = rand_t<double>({B, S, 3 * D}, 14, -2, 2).set_requires_grad(true);
  const Tensor mask = from_vector<int32_t>({0, 0, 1, 0, 0, /**/ 1, 1, 1, 1, 1}, {B, S});
  Tensor out = attention(qkv, H, mask, false, 0.2f);
  const std::vector<double> ov = out.to_vector<double>();
  backward(sum(mul(out, rand_t<double>({B, S, D}, 15))));
  const std::vector<double> gv = qkv.grad().to_vector<double>();
  int nonfinite = 0, nonzero_padded = 0;
  for (size_t i = 0; i < gv.size(); ++i) {
    nonfinite += !std::isfinite(gv[i]);
    nonzero_padded += i >= gv.size() / 2 && gv[i] != 0.0;  // batch 1
  }
  for (size_t i = ov.size() / 2; i < ov.size(); ++i) nonzero_padded += ov[i] != 0.0;
  CHECK(nonfinite == 0);
  CHECK(nonzero_padded == 0);
  double batch0 = 0;  // batch 0 still trains
  for (size_t i = 0; i < gv.size() / 2; ++i) batch0 += std::fabs(gv[i]);
  CHECK(batch0 > 0.1);
}

TEST_CASE("attention: backward saves qkv, output, lse and mask, nothing S x S") {
  const int64_t B = 2, S = 16, H = 2, D = 8;
  Tensor qkv = rand_t<float>({B, S, 3 * D}, 13).set_requires_grad(true);
  Tensor mask = zeros({B, S}, DType::i32);
  Tensor out = attention(qkv, H, mask, true, 0.1f);
  Tape& tape = Tape::current();
  const Node& n = tape.nodes().back();
  REQUIRE(n.kind == OpKind::attention);
  uint64_t saved_bytes = 0;
  for (int64_t v : n.saved) saved_bytes += tape.value(v).bytes;
  const uint64_t f = sizeof(float);
  CHECK(saved_bytes == qkv.nbytes() + out.nbytes() + B * H * S * f + mask.nbytes());
  CHECK(n.saved.size() == 4);
  tape.clear();
}

// ---- cross_entropy ------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("cross_entropy: mean over non-ignored rows matches plain loops", T, float,
                   double) {
  const int64_t M = 7, V = 5;
  Tensor logits = rand_t<T>({M, V}, 21, -5.0, 5.0);
  const std::vector<int64_t> tv = {0, -100, 4, 2, -100, 1, 4};
  const Tensor targets = from_vector<int64_t>(tv, {M});
  const std::vector<double> lv = as_double<T>(logits);
  double total = 0;
  int counted = 0;
  std::vector<double> lse_ref;
  for (int64_t r = 0; r < M; ++r) {
    double mx = -INFINITY, sum = 0;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, lv[r * V + j]);
    for (int64_t j = 0; j < V; ++j) sum += std::exp(lv[r * V + j] - mx);
    lse_ref.push_back(mx + std::log(sum));
    if (tv[r] == -100) continue;
    total += lse_ref.back() - lv[r * V + tv[r]];
    ++counted;
  }
  const double loss = cross_entropy(logits, targets).template item<T>();
  CHECK(loss ==
        doctest::Approx(total / counted).epsilon(std::is_same<T, float>::value ? 1e-6 : 1e-13));
  Tensor l = empty({}, logits.dtype()), lse = empty({M}, logits.dtype());
  cpu::cross_entropy_forward<T>(logits.data<T>(), targets.data<int64_t>(), l.data<T>(),
                                lse.data<T>(), M, V, -100);
  check_close(as_double<T>(lse), lse_ref, atol_for<T>() * 10, 1e-6, "cross_entropy lse");

  // Every row ignored: 0 (not NaN), and a zero gradient.
  Tensor all_ignored = full({M}, 3, DType::i64);
  Tensor x = logits.clone().set_requires_grad(true);
  Tensor zero_loss = cross_entropy(x, all_ignored, 3);
  CHECK(zero_loss.template item<T>() == T(0));
  backward(zero_loss);
  for (double g : as_double<T>(x.grad())) CHECK(g == 0.0);
}

// ---- linear_cross_entropy ---------------------------------------------------------------------

namespace {
struct LceResult {
  double loss = 0;
  std::vector<double> dx, dw, db;
};

// One forward and backward of either the fused op (chunk >= 0; its gradients made in the forward,
// or with recompute in the backward) or cross_entropy(linear(...)) (chunk < 0) on copies of the
// same inputs.
template <class T>
LceResult lce_run(const Tensor& x0, const Tensor& w0, const Tensor& b0, const Tensor& targets,
                  int64_t chunk, int64_t ignore_index = -100, bool recompute = false) {
  Tensor x = x0.clone().set_requires_grad(true), w = w0.clone().set_requires_grad(true);
  Tensor b = b0.defined() ? b0.clone().set_requires_grad(true) : Tensor();
  Tensor loss = chunk >= 0 ? linear_cross_entropy(x, w, b, targets, ignore_index, chunk, recompute)
                           : cross_entropy(linear(x, w, b), targets, ignore_index);
  LceResult r;
  r.loss = static_cast<double>(loss.template item<T>());
  backward(loss);
  r.dx = as_double<T>(x.grad());
  r.dw = as_double<T>(w.grad());
  if (b.defined()) r.db = as_double<T>(b.grad());
  return r;
}
}  // namespace

TEST_CASE_TEMPLATE("linear_cross_entropy: loss and gradients equal cross_entropy(linear(...))", T,
                   float, double) {
  const int64_t M = 37, K = 19, V = 53;
  const Tensor x = rand_t<T>({M, K}, 41, -2, 2), w = rand_t<T>({V, K}, 42), b = rand_t<T>({V}, 43);
  std::vector<int64_t> tv;
  for (int64_t r = 0; r < M; ++r) tv.push_back(r % 5 == 2 ? -100 : (r * 7) % V);
  const Tensor targets = from_vector<int64_t>(tv, {M});
  // float: both sides round the same products in a different order (GEMM blocking, chunked dW
  // accumulation); double: the same up to a few ulps.
  const double atol = std::is_same<T, float>::value ? 2e-6 : 1e-14;
  const double rtol = std::is_same<T, float>::value ? 2e-5 : 1e-12;
  for (const bool with_bias : {true, false}) {
    const Tensor bias = with_bias ? b : Tensor();
    const LceResult ref = lce_run<T>(x, w, bias, targets, -1);
    // Chunks that do not divide M, one row, exactly M, more than M, automatic; float also with
    // the logits recomputed in the backward (f64 computes its gradients in the forward only).
    for (const bool recompute : {false, true}) {
      if (recompute && !std::is_same<T, float>::value) continue;
      for (const int64_t chunk : {int64_t{5}, int64_t{1}, M, M + 10, int64_t{0}}) {
        const std::string what = std::string(with_bias ? "bias" : "no bias") + " chunk " +
                                 std::to_string(chunk) + (recompute ? " recompute" : "");
        CAPTURE(what);
        const LceResult got = lce_run<T>(x, w, bias, targets, chunk, -100, recompute);
        CHECK(got.loss == doctest::Approx(ref.loss).epsilon(rtol));
        check_close(got.dx, ref.dx, atol, rtol, what + " dx");
        check_close(got.dw, ref.dw, atol, rtol, what + " dW");
        if (with_bias) check_close(got.db, ref.db, atol, rtol, what + " db");
        // Fixed chunk and tile order: the same bits on a second run.
        const LceResult again = lce_run<T>(x, w, bias, targets, chunk, -100, recompute);
        CHECK(again.loss == got.loss);
        CHECK(again.dx == got.dx);
        CHECK(again.dw == got.dw);
        CHECK(again.db == got.db);
      }
    }
  }
  // A custom ignore_index that is also a class id.
  for (int64_t& t : tv) t = t == -100 ? 3 : t;
  const Tensor targets3 = from_vector<int64_t>(tv, {M});
  const LceResult ref3 = lce_run<T>(x, w, b, targets3, -1, 3);
  const LceResult got3 = lce_run<T>(x, w, b, targets3, 4, 3);
  CHECK(got3.loss == doctest::Approx(ref3.loss).epsilon(rtol));
  check_close(got3.dw, ref3.dw, atol, rtol, "ignore_index 3 dW");
}

TEST_CASE_TEMPLATE(
    "linear_cross_entropy: a loss gradient other than 1, and only some inputs requiring grad", T,
    float, double) {
  // The forward's gradients are for a loss gradient of 1; backward scales them by the real one
  // (here 3, an upstream scale): against the unfused op under the same scale.
  const int64_t M = 23, K = 9, V = 41;
  const Tensor x0 = rand_t<T>({M, K}, 71, -2, 2), w0 = rand_t<T>({V, K}, 72),
               b0 = rand_t<T>({V}, 73);
  std::vector<int64_t> tv;
  for (int64_t r = 0; r < M; ++r) tv.push_back(r % 4 == 1 ? -100 : (r * 5) % V);
  const Tensor targets = from_vector<int64_t>(tv, {M});
  const double atol = std::is_same<T, float>::value ? 6e-6 : 1e-14;
  const double rtol = std::is_same<T, float>::value ? 6e-5 : 1e-12;
  // Which of x, w, b require grad: all, the weight alone, the input alone, no bias gradient.
  const bool needs[4][3] = {
      {true, true, true}, {false, true, false}, {true, false, false}, {true, true, false}};
  // The fused op as recorded (gradients in the forward) and, for float, recomputing.
  const int runs = std::is_same<T, float>::value ? 3 : 2;
  for (const auto& need : needs) {
    std::vector<std::vector<double>> grads[3];
    for (int run = 0; run < runs; ++run) {
      const bool fused = run > 0, recompute = run == 2;
      Tensor x = x0.clone().set_requires_grad(need[0]), w = w0.clone().set_requires_grad(need[1]);
      Tensor b = b0.clone().set_requires_grad(need[2]);
      Tensor loss = fused ? linear_cross_entropy(x, w, b, targets, -100, 7, recompute)
                          : cross_entropy(linear(x, w, b), targets);
      if (fused) {
        const LinearCrossEntropyAttrs& a =
            Tape::current().nodes().back().attr<LinearCrossEntropyAttrs>();
        CHECK(a.forward_dx == (need[0] && !recompute));
        CHECK(a.forward_dw == (need[1] && !recompute));
        CHECK(a.forward_db == (need[2] && !recompute));
      }
      backward(scale(loss, 3.0));
      for (int i = 0; i < 3; ++i) {
        const Tensor& p = i == 0 ? x : i == 1 ? w : b;
        CHECK(p.grad().defined() == need[i]);
        grads[run].push_back(need[i] ? as_double<T>(p.grad()) : std::vector<double>{});
      }
    }
    for (int run = 1; run < runs; ++run) {
      for (int i = 0; i < 3; ++i) {
        check_close(grads[run][static_cast<size_t>(i)], grads[0][static_cast<size_t>(i)], atol,
                    rtol, "run " + std::to_string(run) + " gradient " + std::to_string(i));
      }
    }
  }
}

TEST_CASE(
    "linear_cross_entropy: a node whose attributes disagree with its dtype is refused by name") {
  // linear_cross_entropy() sets forward_dx/dw/db from the inputs; a node recorded with other
  // attributes (apply_op directly) fails clearly instead of computing nothing.
  const int64_t M = 6, K = 4, V = 9;
  const Tensor targets = from_vector<int64_t>({0, 1, 2, 3, 4, 5}, {M});
  Tensor x = rand_t<float>({M, K}, 81).set_requires_grad(true);
  const Tensor w = rand_t<float>({V, K}, 82);
  LinearCrossEntropyAttrs a;
  a.chunk_rows = 4;
  // Forward gradients recorded for f32 inputs (grad_dtype), handed bf16 ones: refused.
  a.forward_dx = true;
  expect_error(
      [&] {
        apply_op(OpKind::linear_cross_entropy, a,
                 {cast(x, DType::bf16), cast(w, DType::bf16), Tensor(), targets});
      },
      {"linear_cross_entropy: bf16 inputs, yet the node was recorded for f32 gradients"});
  Tape::current().clear();
  // f64 inputs recorded without any forward gradient: backward says so (only f32, bf16 and f16
  // recompute the logits).
  a.forward_dx = false;
  Tensor xd = cast(x, DType::f64).set_requires_grad(true);
  Tensor loss =
      apply_op(OpKind::linear_cross_entropy, a, {xd, cast(w, DType::f64), Tensor(), targets})[0];
  expect_error([&] { backward(loss); },
               {"linear_cross_entropy backward", "the forward computed no gradient"});
  Tape::current().clear();
  // And linear_cross_entropy() refuses to record recompute for f64.
  expect_error(
      [&] { linear_cross_entropy(xd, cast(w, DType::f64), Tensor(), targets, -100, 4, true); },
      {"linear_cross_entropy: recompute", "f64"});
  Tape::current().clear();
}

TEST_CASE(
    "linear_cross_entropy: every row ignored gives 0 and zero gradients, like cross_entropy") {
  const int64_t M = 6, K = 4, V = 7;
  const Tensor x = rand_t<float>({M, K}, 51), w = rand_t<float>({V, K}, 52),
               b = rand_t<float>({V}, 53);
  const Tensor targets = full({M}, -100, DType::i64);
  for (const int64_t chunk : {int64_t{4}, int64_t{0}}) {
    const LceResult got = lce_run<float>(x, w, b, targets, chunk);
    CHECK(got.loss == 0.0);
    for (const std::vector<double>* g : {&got.dx, &got.dw, &got.db}) {
      for (double v : *g) CHECK(v == 0.0);
    }
  }
  const LceResult ref = lce_run<float>(x, w, b, targets, -1);
  CHECK(ref.loss == 0.0);
}

TEST_CASE("linear_cross_entropy: saves its gradients from the forward, and never holds (M, V)") {
  const int64_t M = 64, K = 8, V = 1000, chunk = 16;
  Tensor x = rand_t<float>({M, K}, 61).set_requires_grad(true);
  Tensor w = rand_t<float>({V, K}, 62).set_requires_grad(true);
  Tensor b = rand_t<float>({V}, 63).set_requires_grad(true);
  Generator gen(64);
  const Tensor targets = randint({M}, V, gen);
  CachingAllocator& alloc = allocator_for(Device::cpu());
  const int ws = static_cast<int>(Category::workspace);
  const int64_t logits_bytes = M * V * 4, chunk_bytes = chunk * V * 4;
  const int64_t grad_bytes = x.nbytes() + w.nbytes() + b.nbytes();
  alloc.reset_peak();
  const int64_t before = alloc.stats().requested.current;
  Tensor loss = linear_cross_entropy(x, w, b, targets, -100, chunk);
  {
    Tape& tape = Tape::current();
    const Node& n = tape.nodes().back();
    REQUIRE(n.kind == OpKind::linear_cross_entropy);
    const LinearCrossEntropyAttrs& a = n.attr<LinearCrossEntropyAttrs>();
    CHECK(a.chunk_rows == chunk);
    CHECK((a.forward_dx && a.forward_dw && a.forward_db));
    // What it saves: the three gradients (for a unit loss gradient), none of its inputs.
    uint64_t saved_bytes = 0;
    for (int64_t v : n.saved) saved_bytes += tape.value(v).bytes;
    CHECK(n.saved.size() == 3);
    CHECK(saved_bytes == static_cast<uint64_t>(grad_bytes));
    // What the forward leaves: the loss and the gradients (the lse is not kept).
    CHECK(alloc.stats().requested.current - before == 4 + grad_bytes);
  }
  const MemoryStats fwd = alloc.stats();
  // The largest workspace is the chunk of logits (and the GEMMs' blocking buffers beside it).
  CHECK(fwd.requested_by[ws].peak >= chunk_bytes);
  // The gradients, the chunk and the GEMMs' buffers: less than the logits alone.
  CHECK(fwd.requested.peak - before < logits_bytes);
  alloc.reset_peak();
  const int64_t before_bwd = alloc.stats().requested.current;
  backward(loss);
  const MemoryStats bwd = alloc.stats();
  // Backward scales the saved gradients in place: no workspace, and nothing beyond the leaves'
  // first gradients (copies: the tape still holds the saved ones while the node runs) and the
  // loss's gradient (4 bytes).
  CHECK(bwd.requested_by[ws].peak - fwd.requested_by[ws].current == 0);
  CHECK(bwd.requested.peak - before_bwd <= grad_bytes + 4);
  CHECK(x.grad().defined());
  // No grad mode: nothing computed beyond the loss, nothing saved.
  {
    NoGradScope no_grad;
    alloc.reset_peak();
    const int64_t before_eval = alloc.stats().requested.current;
    Tensor l = linear_cross_entropy(x, w, b, targets, -100, chunk);
    CHECK(alloc.stats().requested.current - before_eval == 4);
    CHECK(alloc.stats().requested.peak - before_eval < grad_bytes + chunk_bytes);
  }
  // Unfused, the step holds the logits and their gradient at once.
  x.impl()->grad.reset();
  w.impl()->grad.reset();
  b.impl()->grad.reset();
  alloc.reset_peak();
  const int64_t before2 = alloc.stats().requested.current;
  Tensor loss2 = cross_entropy(linear(x, w, b), targets);
  backward(loss2);
  CHECK(alloc.stats().requested.peak - before2 >= 2 * logits_bytes);
  CHECK(Tape::current().empty());

  // chunk_rows 0 resolves to about 32 MiB of logits per chunk, evenly spread.
  CHECK(linear_cross_entropy_auto_rows(1024, 30000) == 256);  // 279 at most -> 4 chunks of 256
  CHECK(linear_cross_entropy_auto_rows(100, 30000) == 100);
  CHECK(linear_cross_entropy_auto_rows(0, 30000) == 1);
  CHECK(linear_cross_entropy_auto_rows(10, 1 << 26) == 1);       // one row is more than 32 MiB
  CHECK(linear_cross_entropy_auto_rows(4096, 30000, 8) == 137);  // f64: 139 at most -> 30 chunks
  Tensor l = linear_cross_entropy(x, w, b, targets);
  CHECK(Tape::current().nodes().back().attr<LinearCrossEntropyAttrs>().chunk_rows == M);
  Tape::current().clear();
}

// ---- embedding
// ------------------------------------------------------------------------------------

TEST_CASE("embedding: rows are copied for ids of any shape") {
  Tensor w = rand_t<float>({6, 3}, 31);
  const Tensor ids = from_vector<int64_t>({5, 0, 5, 2}, {2, 1, 2});
  Tensor y = embedding(ids, w);
  CHECK(y.shape() == Shape{2, 1, 2, 3});
  const std::vector<float> wv = w.to_vector<float>(), yv = y.to_vector<float>();
  const int64_t idv[] = {5, 0, 5, 2};
  for (int i = 0; i < 4; ++i) {
    for (int d = 0; d < 3; ++d) CHECK(yv[i * 3 + d] == wv[idv[i] * 3 + d]);
  }
}

// ---- dropout ------------------------------------------------------------------------------------

TEST_CASE("dropout: kept fraction near 1 - p, kept values scaled by 1 / (1 - p)") {
  const int64_t n = 200000;
  const float p = 0.3f;
  manual_seed(42);
  const std::vector<float> y = dropout(ones({n}), p).to_vector<float>();
  int64_t kept = 0, wrong_scale = 0;
  for (float v : y) {
    if (v == 0.0f) continue;
    ++kept;
    wrong_scale += v != 1.0f / (1.0f - p);
  }
  CHECK(wrong_scale == 0);
  // 1 - p = 0.7 with a standard deviation of about 0.001 at this n.
  CHECK(static_cast<double>(kept) / n == doctest::Approx(0.7).epsilon(0.01));
}

TEST_CASE("dropout: identity without a node when not training or p == 0") {
  Tensor x = rand_t<float>({5}, 1).set_requires_grad(true);
  const size_t nodes = Tape::current().nodes().size();
  CHECK(dropout(x, 0.5f, false).same(x));
  CHECK(dropout(x, 0.0f).same(x));
  CHECK(Tape::current().nodes().size() == nodes);
}

TEST_CASE("dropout: same stream gives the same mask bit for bit, another stream differs") {
  Tensor x = rand_t<float>({4096}, 2);
  manual_seed(7);
  const std::vector<float> a = dropout(x, 0.5f).to_vector<float>();
  const std::vector<float> b = dropout(x, 0.5f).to_vector<float>();  // the next stream
  manual_seed(7);
  const std::vector<float> c = dropout(x, 0.5f).to_vector<float>();
  CHECK(a == c);
  int same_mask = 0;
  for (size_t i = 0; i < a.size(); ++i) same_mask += (a[i] == 0.0f) == (b[i] == 0.0f);
  // Independent masks agree on about half the elements at p = 0.5.
  CHECK(same_mask < static_cast<int>(a.size() * 0.6));
  // The launcher with an explicit (seed, stream) twice.
  std::vector<float> y1(4096), y2(4096);
  cpu::dropout_forward<float>(x.data<float>(), y1.data(), 4096, 0.5f, 99, 3);
  cpu::dropout_forward<float>(x.data<float>(), y2.data(), 4096, 0.5f, 99, 3);
  CHECK(y1 == y2);
}

TEST_CASE("dropout and attention: a remat replay reproduces the outputs bit for bit") {
  Tape& tape = Tape::current();
  tape.clear();
  manual_seed(2024);
  Tensor x = rand_t<float>({3, 50}, 3).set_requires_grad(true);
  Tensor y = dropout(x, 0.4f);
  const int32_t dnode = static_cast<int32_t>(tape.nodes().size()) - 1;
  Tensor qkv = rand_t<float>({2, 9, 12}, 4, -2.0, 2.0).set_requires_grad(true);
  Tensor mask =
      from_vector<int32_t>({0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {2, 9});
  Tensor out = attention(qkv, 2, mask, true, 0.3f);
  const int32_t anode = static_cast<int32_t>(tape.nodes().size()) - 1;

  const std::vector<Tensor> y_again = tape.replay(dnode, {x});
  CHECK(y_again.at(0).to_vector<float>() == y.to_vector<float>());
  const std::vector<Tensor> a_again = tape.replay(anode, {qkv, mask});
  REQUIRE(a_again.size() == 2);  // the output and the hidden lse
  CHECK(a_again[0].to_vector<float>() == out.to_vector<float>());
  // Backward reads the saved lse; the replayed one must be identical for a remat run to match.
  const Tensor saved_lse = tape.value_tensor(tape.node(anode).outputs[1]);
  CHECK(a_again[1].to_vector<float>() == saved_lse.to_vector<float>());
  tape.clear();
}

// ---- threads ------------------------------------------------------------------------------------

namespace {
// Runs f with `threads` OpenMP threads and returns what it produced.
template <class F>
std::vector<float> with_threads(int threads, F&& f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::vector<float> r = f();
  omp_set_num_threads(saved);
  return r;
}
}  // namespace

TEST_CASE("kernels: layernorm, softmax, embedding and cross_entropy do not depend on threads") {
  // Sizes above every parallel threshold, so the threaded paths run.
  const int64_t M = 300, N = 257, V = 50;
  const Tensor x = rand_t<float>({M, N}, 1, -3, 3), dy = rand_t<float>({M, N}, 2);
  const Tensor gamma = rand_t<float>({N}, 3), beta = rand_t<float>({N}, 4);
  Generator gen(5);
  const Tensor ids = randint({M}, V, gen), targets = randint({M}, N, gen);
  auto run_all = [&] {
    std::vector<float> r(static_cast<size_t>(M * N * 4 + 3 * N + V * N + M + 2), 0.0f);
    float* p = r.data();
    std::vector<float> mean(M), rstd(M);
    cpu::layernorm_forward<float>(x.data<float>(), gamma.data<float>(), beta.data<float>(), p,
                                  mean.data(), rstd.data(), M, N, 1e-5);
    cpu::layernorm_backward<float>(dy.data<float>(), x.data<float>(), gamma.data<float>(),
                                   mean.data(), rstd.data(), p + M * N, p + 2 * M * N,
                                   p + 2 * M * N + N, M, N);
    float* q = p + 2 * M * N + 2 * N;
    cpu::softmax_forward<float>(x.data<float>(), q, M, N);
    cpu::softmax_backward<float>(dy.data<float>(), q, q + M * N, M, N);
    float* e = q + 2 * M * N;
    cpu::embedding_backward<float>(x.data<float>(), ids.data<int64_t>(), e, M, V, N);
    float* c = e + V * N;
    cpu::cross_entropy_forward<float>(x.data<float>(), targets.data<int64_t>(), c, c + 1, M, N,
                                      -100);
    const float one = 1.0f;
    std::vector<float> dlogits(static_cast<size_t>(M * N));
    cpu::cross_entropy_backward<float>(&one, x.data<float>(), targets.data<int64_t>(), c + 1,
                                       dlogits.data(), M, N, -100);
    r.insert(r.end(), dlogits.begin(), dlogits.end());
    return r;
  };
  const std::vector<float> one_thread = with_threads(1, run_all);
  const std::vector<float> two_threads = with_threads(2, run_all);
  CHECK(one_thread == two_threads);
}

TEST_CASE("attention: threaded rows match one thread and repeated runs are bit-identical") {
  // S * S above the row-parallel threshold, with padding, causal mask and dropout.
  const int64_t B = 2, S = 70, H = 2, Dh = 8, D = H * Dh;
  const Tensor qkv = rand_t<float>({B, S, 3 * D}, 7, -2, 2), dout = rand_t<float>({B, S, D}, 8);
  std::vector<int32_t> pad(static_cast<size_t>(B * S), 0);
  for (int64_t j = 60; j < S; ++j) pad[static_cast<size_t>(S + j)] = 1;
  AttentionShape s = make_shape(B, S, H, Dh, true);
  s.dropout_p = 0.2f;
  s.seed = 5;
  s.stream = 6;
  auto run = [&] {
    std::vector<float> out(static_cast<size_t>(B * S * D)), lse(static_cast<size_t>(B * H * S));
    std::vector<float> dqkv(static_cast<size_t>(B * S * 3 * D));
    cpu::attention_forward<float>(qkv.data<float>(), pad.data(), out.data(), lse.data(), s);
    cpu::attention_backward<float>(dout.data<float>(), qkv.data<float>(), out.data(), lse.data(),
                                   pad.data(), dqkv.data(), s);
    out.insert(out.end(), lse.begin(), lse.end());
    out.insert(out.end(), dqkv.begin(), dqkv.end());
    return out;
  };
  const std::vector<float> a = with_threads(2, run), b = with_threads(2, run);
  CHECK(a == b);
  // gemm's blocking depends on its thread count, so one thread agrees to rounding only.
  const std::vector<float> c = with_threads(1, run);
  check_close(std::vector<double>(a.begin(), a.end()), std::vector<double>(c.begin(), c.end()),
              1e-5, 1e-4, "attention 1 vs 2 threads");
  // And the forward matches the plain loops at this size.
  const AttentionRef ref = attention_reference(as_double<float>(qkv), pad, s);
  check_close(std::vector<double>(a.begin(), a.begin() + B * S * D), ref.out, 2e-5, 1e-4,
              "attention S=70 out");
}

namespace {
// One forward and backward of the CPU attention in T (qkv and dout hold T), widened to double:
// out, the rows' lse and dqkv.
struct AttentionPass {
  std::vector<double> out, lse, grad;
};
template <class T>
AttentionPass attention_pass(const Tensor& qkv, const Tensor& dout, const std::vector<int32_t>& pad,
                             const AttentionShape& s) {
  using Acc = typename accumulate_type<T>::type;
  const int64_t D = s.H * s.Dh;
  std::vector<T> out(static_cast<size_t>(s.B * s.S * D));
  std::vector<T> dqkv(static_cast<size_t>(s.B * s.S * 3 * D));
  std::vector<Acc> lse(static_cast<size_t>(s.B * s.H * s.S));
  cpu::attention_forward<T>(qkv.data<T>(), pad.data(), out.data(), lse.data(), s);
  cpu::attention_backward<T>(dout.data<T>(), qkv.data<T>(), out.data(), lse.data(), pad.data(),
                             dqkv.data(), s);
  const auto wide = [](const auto& v) {
    std::vector<double> r;
    for (const auto& x : v) r.push_back(static_cast<double>(x));
    return r;
  };
  return {wide(out), wide(lse), wide(dqkv)};
}
}  // namespace

TEST_CASE("attention: causal rows by blocks (S past 256) match the whole f64 products") {
  // S = 520: row blocks of 256, 256 and 8 (kernels/cpu/attention.cpp); key padding (a row of the
  // second batch sees no key) and dropout. The f32 and bf16 launchers run by row blocks, the f64
  // one the whole S x S products: forward and backward from the same inputs (bf16's, widened).
  const int64_t B = 2, S = 520, H = 2, Dh = 16, D = H * Dh;
  std::vector<int32_t> pad(static_cast<size_t>(B * S), 0);
  pad[static_cast<size_t>(S + 0)] = 1;  // batch 1, query 0 sees no key
  for (int64_t j = 300; j < 310; ++j) pad[static_cast<size_t>(j)] = 1;
  AttentionShape s = make_shape(B, S, H, Dh, true);
  s.dropout_p = 0.1f;
  s.seed = 9;
  s.stream = 4;
  const Tensor qkv16 = rand_t<float>({B, S, 3 * D}, 31, -2, 2).to(DType::bf16);
  const Tensor dout16 = rand_t<float>({B, S, D}, 32).to(DType::bf16);
  const Tensor qkv32 = qkv16.to(DType::f32), dout32 = dout16.to(DType::f32);
  const Tensor qkv64 = qkv16.to(DType::f64), dout64 = dout16.to(DType::f64);
  const AttentionPass ref = attention_pass<double>(qkv64, dout64, pad, s);
  const AttentionPass f32 = attention_pass<float>(qkv32, dout32, pad, s);
  const AttentionPass b16 = attention_pass<bfloat16>(qkv16, dout16, pad, s);
  // f32: sums of up to 520 terms of size 1, rounded in f32 (2^-24 each).
  check_close(f32.out, ref.out, 1e-5, 1e-4, "f32 causal blocks out");
  check_close(f32.grad, ref.grad, 1e-5, 1e-4, "f32 causal blocks dqkv");
  // bf16: the output rounded once to bf16 (2^-9 relative). The gradients also read that rounded
  // output (the softmax-backward row term <dO, O>), so their error scales with the largest
  // gradient, not with each element: 2^-7 of it (a few bf16 roundings), plus 2^-9 relative.
  double largest = 0;
  for (double g : ref.grad) largest = std::max(largest, std::fabs(g));
  check_close(b16.out, ref.out, 1e-4, 4e-3, "bf16 causal blocks out");
  check_close(b16.grad, ref.grad, largest / 128, 4e-3, "bf16 causal blocks dqkv");
  // The row that sees no key: output 0 and no gradient through its query.
  for (int64_t d = 0; d < D; ++d) CHECK(f32.out[static_cast<size_t>(S * D + d)] == 0.0);
}

TEST_CASE("attention: heads in parallel give one thread's bits and the f64 products' values") {
  // 4 B H S S Dh = 9.4 MFLOP: two threads run the heads (kernels/cpu/attention.cpp, head_threads);
  // not causal, with padding, a row with no visible key and dropout.
  const int64_t B = 2, S = 96, H = 4, Dh = 32, D = H * Dh;
  std::vector<int32_t> pad(static_cast<size_t>(B * S), 0);
  for (int64_t j = 80; j < S; ++j) pad[static_cast<size_t>(S + j)] = 1;
  AttentionShape s = make_shape(B, S, H, Dh, false);
  s.dropout_p = 0.1f;
  s.seed = 3;
  s.stream = 8;
  const Tensor qkv16 = rand_t<float>({B, S, 3 * D}, 41, -2, 2).to(DType::bf16);
  const Tensor dout16 = rand_t<float>({B, S, D}, 42).to(DType::bf16);
  const Tensor qkv32 = qkv16.to(DType::f32), dout32 = dout16.to(DType::f32);
  const AttentionPass ref =
      attention_pass<double>(qkv16.to(DType::f64), dout16.to(DType::f64), pad, s);
  double largest = 0;
  for (double g : ref.grad) largest = std::max(largest, std::fabs(g));
  // Everything a pass returns, as floats: for bitwise comparisons.
  const auto all = [](const AttentionPass& p) {
    std::vector<float> r(p.out.begin(), p.out.end());
    r.insert(r.end(), p.lse.begin(), p.lse.end());
    r.insert(r.end(), p.grad.begin(), p.grad.end());
    return r;
  };
  AttentionPass f32, b16;
  with_threads(2, [&] {
    f32 = attention_pass<float>(qkv32, dout32, pad, s);
    b16 = attention_pass<bfloat16>(qkv16, dout16, pad, s);
    return std::vector<float>();
  });
  check_close(f32.out, ref.out, 1e-5, 1e-4, "f32 heads out");
  check_close(f32.grad, ref.grad, 1e-5, 1e-4, "f32 heads dqkv");
  check_close(b16.out, ref.out, 1e-4, 4e-3, "bf16 heads out");
  check_close(b16.grad, ref.grad, largest / 128, 4e-3, "bf16 heads dqkv");
  // The same bits on one thread as on two.
  CHECK(with_threads(1, [&] { return all(attention_pass<float>(qkv32, dout32, pad, s)); }) ==
        all(f32));
  CHECK(with_threads(1, [&] { return all(attention_pass<bfloat16>(qkv16, dout16, pad, s)); }) ==
        all(b16));
}

// ---- optimizers ---------------------------------------------------------------------------------

namespace {
// p0[i] = 0.5 sin(i + 1), gradient at step t: cos(0.7 i + t) - 0.3 (the PyTorch fixture's inputs).
double p0_at(int64_t i) {
  return 0.5 * std::sin(static_cast<double>(i + 1));
}
double grad_at(int64_t i, int t) {
  return std::cos(0.7 * static_cast<double>(i) + t) - 0.3;
}

template <class T>
Tensor fixture_param(int64_t n, const std::string& name) {
  std::vector<T> v;
  for (int64_t i = 0; i < n; ++i) v.push_back(static_cast<T>(p0_at(i)));
  Tensor p = from_vector<T>(v, {n});
  p.impl()->name = name;
  return p.set_requires_grad(true);
}

template <class T>
void set_fixture_grad(const Tensor& p, int t) {
  std::vector<T> g;
  for (int64_t i = 0; i < p.numel(); ++i) g.push_back(static_cast<T>(grad_at(i, t)));
  p.impl()->grad = from_vector<T>(g, p.shape()).impl();
}

// torch.optim.SGD's update written out in double.
std::vector<double> sgd_reference(int64_t n, const SGDOptions& o, int steps) {
  std::vector<double> p(n), buf(n);
  for (int64_t i = 0; i < n; ++i) p[i] = p0_at(i);
  for (int t = 0; t < steps; ++t) {
    for (int64_t i = 0; i < n; ++i) {
      double d = grad_at(i, t) + o.weight_decay * p[i];
      if (o.momentum != 0) {
        buf[i] = t == 0 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
        d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
      }
      p[i] -= o.lr * d;
    }
  }
  return p;
}

// torch.optim.AdamW's update written out in double.
std::vector<double> adamw_reference(int64_t n, const AdamWOptions& o, int steps) {
  std::vector<double> p(n), m(n, 0.0), v(n, 0.0);
  for (int64_t i = 0; i < n; ++i) p[i] = p0_at(i);
  for (int t = 1; t <= steps; ++t) {
    for (int64_t i = 0; i < n; ++i) {
      const double g = grad_at(i, t - 1);
      p[i] *= 1 - o.lr * o.weight_decay;
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g * g;
      const double bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
      p[i] -= (o.lr / bc1) * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + o.eps);
    }
  }
  return p;
}

template <class T>
std::vector<double> run_optimizer(Optimizer& opt, const Tensor& p, int steps) {
  for (int t = 0; t < steps; ++t) {
    set_fixture_grad<T>(p, t);
    opt.step();
  }
  return as_double<T>(p);
}

SGDOptions sgd_options(double lr, double momentum, double dampening, double wd, bool nesterov) {
  SGDOptions o;
  o.lr = lr;
  o.momentum = momentum;
  o.dampening = dampening;
  o.weight_decay = wd;
  o.nesterov = nesterov;
  return o;
}
AdamWOptions adamw_options() {
  AdamWOptions o;
  o.lr = 0.01;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  return o;
}
}  // namespace

TEST_CASE_TEMPLATE("SGD: 3 steps equal torch's formulas (plain, momentum, nesterov)", T, float,
                   double) {
  const int64_t n = 37;
  const double tol = std::is_same<T, float>::value ? 1e-6 : 1e-14;
  const SGDOptions cases[] = {sgd_options(0.1, 0.0, 0.0, 0.1, false),
                              sgd_options(0.05, 0.9, 0.1, 0.01, false),
                              sgd_options(0.05, 0.9, 0.0, 0.05, true)};
  for (const SGDOptions& o : cases) {
    Tensor p = fixture_param<T>(n, "w");
    SGD opt({p}, o);
    check_close(run_optimizer<T>(opt, p, 3), sgd_reference(n, o, 3), tol, tol,
                "SGD momentum " + std::to_string(o.momentum) + (o.nesterov ? " nesterov" : ""));
    CHECK(opt.state("w", "momentum_buffer").defined() == (o.momentum != 0.0));
  }
}

TEST_CASE_TEMPLATE("AdamW: 3 steps equal torch's formulas", T, float, double) {
  const int64_t n = 37;
  const double tol = std::is_same<T, float>::value ? 1e-6 : 1e-14;
  Tensor p = fixture_param<T>(n, "w");
  AdamW opt({p}, adamw_options());
  check_close(run_optimizer<T>(opt, p, 3), adamw_reference(n, adamw_options(), 3), tol, tol,
              "AdamW");
  CHECK(opt.step_count("w") == 3);
}

TEST_CASE("SGD and AdamW: agree with numbers produced by PyTorch 1.13 (f64, 3 steps)") {
  // /usr/bin/python3: p = 0.5 sin(i + 1), grad_t = cos(0.7 i + t) - 0.3 for i < 5, t < 3, then
  // torch.optim.SGD / AdamW with the options below; values printed with repr().
  struct Case {
    const char* name;
    std::function<std::unique_ptr<Optimizer>(const Tensor&)> make;
    std::vector<double> param, state;
    const char* state_key;
  };
  const std::vector<Case> cases = {
      {"SGD lr 0.1 wd 0.1",
       [](const Tensor& p) {
         return std::make_unique<SGD>(std::vector<Tensor>{p}, sgd_options(0.1, 0, 0, 0.1, false));
       },
       {0.387456982917827, 0.5584488283369764, 0.3105906187711174, -0.0721826109551801,
        -0.21421551564616645},
       {},
       ""},
      {"SGD momentum 0.9 dampening 0.1 wd 0.01",
       [](const Tensor& p) {
         return std::make_unique<SGD>(std::vector<Tensor>{p},
                                      sgd_options(0.05, 0.9, 0.1, 0.01, false));
       },
       {0.3365122504064268, 0.48133421805560705, 0.2336627987957046, -0.11799043402023718,
        -0.2071541522832134},
       {0.12672906419150884, -1.0434691429019514, -2.083373000217271, -2.4995556873072315,
        -2.091202530761325},
       "momentum_buffer"},
      {"SGD nesterov momentum 0.9 wd 0.05",
       [](const Tensor& p) {
         return std::make_unique<SGD>(std::vector<Tensor>{p},
                                      sgd_options(0.05, 0.9, 0.0, 0.05, true));
       },
       {0.328421767835834, 0.5385090403235012, 0.35178288275219727, 0.025094107198722473,
        -0.09033062058099295},
       {0.11494234935527281, -1.1553527809179134, -2.289912383720575, -2.731899503381087,
        -2.24628031278388},
       "momentum_buffer"},
      {"AdamW lr 0.01 betas (0.9, 0.95) wd 0.1",
       [](const Tensor& p) {
         return std::make_unique<AdamW>(std::vector<Tensor>{p}, adamw_options());
       },
       {0.40024448123942674, 0.4490362670877141, 0.09727895425776986, -0.3477204377089327,
        -0.4495363139872696},
       {0.006712523873418337, -0.12135100151825974, -0.23057791508173864, -0.26959709265051046,
        -0.22005720532251413},
       "exp_avg"},
  };
  for (const Case& c : cases) {
    Tensor p = fixture_param<double>(5, "w");
    std::unique_ptr<Optimizer> opt = c.make(p);
    check_close(run_optimizer<double>(*opt, p, 3), c.param, 1e-14, 1e-13, c.name);
    if (!c.state.empty()) {
      check_close(as_double<double>(opt->state("w", c.state_key)), c.state, 1e-14, 1e-13,
                  std::string(c.name) + " " + c.state_key);
    }
  }
}

TEST_CASE("optimizers: state lands in optimizer_state, tagged by parameter name") {
  CachingAllocator& alloc = allocator_for(Device::cpu());
  const size_t cat = static_cast<size_t>(Category::optimizer_state);
  Tensor w = fixture_param<float>(1000, "block.w");
  Tensor b = fixture_param<float>(10, "block.b");
  const int64_t before = alloc.stats().requested_by[cat].current;
  {
    AdamW opt({w, b}, adamw_options());
    set_fixture_grad<float>(w, 0);  // b has no gradient: skipped, no state
    CHECK(alloc.stats().requested_by[cat].current == before);  // state is created lazily
    opt.step();
    CHECK(alloc.stats().requested_by[cat].current - before == static_cast<int64_t>(2 * w.nbytes()));
    CHECK(opt.step_count("block.w") == 1);
    CHECK(opt.step_count("block.b") == 0);
    CHECK_FALSE(opt.state("block.b", "exp_avg").defined());
    CHECK(fixture_param<float>(10, "x").to_vector<float>() == b.to_vector<float>());  // unchanged
    const std::map<std::string, Tensor> named = opt.named_state();
    CHECK(named.size() == 2);
    CHECK(named.count("block.w.exp_avg") == 1);
    CHECK(named.count("block.w.exp_avg_sq") == 1);
    int tagged = 0;
    for (const BlockInfo& blk : alloc.snapshot()) {
      if (!blk.allocated || blk.category != Category::optimizer_state) continue;
      const std::string tag = tag_name(blk.tag);
      tagged += tag == "block.w.exp_avg" || tag == "block.w.exp_avg_sq";
    }
    CHECK(tagged == 2);
  }
  CHECK(alloc.stats().requested_by[cat].current == before);  // freed with the optimizer
}

TEST_CASE("optimizers: zero_grad keeps gradient memory and lr is settable") {
  Tensor w = fixture_param<double>(4, "w");
  SGD opt({w}, sgd_options(0.5, 0, 0, 0, false));
  set_fixture_grad<double>(w, 0);
  const void* grad_bytes = w.grad().raw_data();
  opt.zero_grad();
  CHECK(w.grad().raw_data() == grad_bytes);
  for (double g : w.grad().to_vector<double>()) CHECK(g == 0.0);
  set_fixture_grad<double>(w, 0);
  opt.set_lr(0.25);
  CHECK(opt.lr() == 0.25);
  opt.step();
  for (int64_t i = 0; i < 4; ++i) {
    CHECK(w.to_vector<double>()[i] == doctest::Approx(p0_at(i) - 0.25 * grad_at(i, 0)));
  }
}

// ---- error messages -----------------------------------------------------------------------------

TEST_CASE("embedding: bad ids and tables throw errors naming the op and shapes") {
  Tensor w = rand_t<float>({4, 3}, 1);
  expect_error(
      [&] {
        embedding(from_vector<int64_t>({0, 4}, {2}), w);
      },
      {"embedding", "id 4", "position 1", "V = 4"});
  expect_error([&] { embedding(from_vector<int64_t>({-1}, {1}), w); }, {"embedding", "id -1"});
  expect_error([&] { embedding(from_vector<int32_t>({0}, {1}), w); },
               {"embedding", "ids", "i32[1]", "must be i64"});
  expect_error([&] { embedding(from_vector<int64_t>({0}, {1}), rand_t<float>({4}, 1)); },
               {"embedding", "weight", "f32[4]", "(V, D)"});
  std::vector<float> dy(3), dw(12);
  const int64_t bad_id = 9;
  expect_error([&] { cpu::embedding_backward<float>(dy.data(), &bad_id, dw.data(), 1, 4, 3); },
               {"embedding", "id 9", "V = 4"});
}

TEST_CASE("layernorm and softmax: mismatched shapes and dtypes throw") {
  Tensor x = rand_t<float>({2, 5}, 1);
  expect_error([&] { layernorm(x, ones({4}), zeros({5})); },
               {"layernorm", "[2, 5]", "gamma [4]", "beta [5]"});
  expect_error([&] { layernorm(x, ones({5}, DType::f64), zeros({5})); },
               {"layernorm", "dtype mismatch"});
  expect_error([&] { layernorm(x, ones({5}), zeros({5}), 0.0); }, {"layernorm", "eps 0"});
  expect_error([&] { softmax(full({}, 1.0)); }, {"softmax", "at least one dimension"});
  expect_error([&] { softmax(zeros({3}, DType::i64)); }, {"softmax", "floating-point"});
}

TEST_CASE("attention: bad qkv, heads, masks and dropout_p throw errors naming shapes") {
  expect_error(
      [&] {
        attention(zeros({2, 5, 96}), 5);
      },
      {"attention: qkv [2, 5, 96] last dimension must be 3 * d_model with d_model "
       "divisible by num_heads 5"});
  expect_error(
      [&] {
        attention(zeros({2, 5, 10}), 1);
      },
      {"attention", "[2, 5, 10]", "3 * d_model"});
  expect_error([&] { attention(zeros({10, 12}), 2); }, {"attention", "[10, 12]", "3 dimensions"});
  expect_error([&] { attention(zeros({2, 5, 12}), 0); }, {"attention", "num_heads 0"});
  expect_error(
      [&] {
        attention(zeros({2, 5, 12}), 2, zeros({2, 5}, DType::i64));
      },
      {"attention", "key_padding_mask i64[2, 5]", "i32", "[2, 5]"});
  expect_error(
      [&] {
        attention(zeros({2, 5, 12}), 2, zeros({5, 2}, DType::i32));
      },
      {"attention", "i32[5, 2]", "[2, 5]"});
  expect_error(
      [&] {
        attention(zeros({2, 5, 12}), 2, Tensor(), false, 1.0f);
      },
      {"attention", "dropout_p 1", "[0, 1)"});
  expect_error([&] { attention(zeros({2, 5, 12}, DType::i32), 2); }, {"attention", "floating"});
}

TEST_CASE("dropout: p outside [0, 1] throws") {
  expect_error([&] { dropout(zeros({3}), 1.5f); }, {"dropout", "p 1.5", "f32[3]"});
  expect_error([&] { dropout(zeros({3}), -0.1f); }, {"dropout", "p -0.1"});
}

TEST_CASE("cross_entropy: bad targets and shapes throw errors naming row, target and V") {
  Tensor logits = rand_t<float>({3, 4}, 1);
  expect_error(
      [&] {
        cross_entropy(logits, from_vector<int64_t>({0, 7, 1}, {3}));
      },
      {"cross_entropy", "target 7", "row 1", "V = 4"});
  expect_error(
      [&] {
        cross_entropy(logits, from_vector<int64_t>({-100, 1, -3}, {3}));
      },
      {"cross_entropy", "target -3", "row 2"});
  expect_error(
      [&] {
        cross_entropy(logits, from_vector<int32_t>({0, 1, 2}, {3}));
      },
      {"cross_entropy", "targets i32[3]", "i64"});
  expect_error(
      [&] {
        cross_entropy(logits, from_vector<int64_t>({0, 1}, {2}));
      },
      {"cross_entropy", "logits [3, 4]", "targets [2]"});
  expect_error([&] { cross_entropy(rand_t<float>({12}, 1), from_vector<int64_t>({0}, {1})); },
               {"cross_entropy", "logits [12]"});
  std::vector<float> d(12), lse(3);
  const float dloss = 1.0f;
  const int64_t targets[] = {0, 5, 1};
  expect_error(
      [&] {
        cpu::cross_entropy_backward<float>(&dloss, logits.data<float>(), targets, lse.data(),
                                           d.data(), 3, 4, -100);
      },
      {"cross_entropy", "target 5", "row 1", "V = 4"});
}

TEST_CASE("linear_cross_entropy: bad inputs throw errors naming the op, shapes and rows") {
  const Tensor x = rand_t<float>({3, 4}, 1), w = rand_t<float>({5, 4}, 2),
               b = rand_t<float>({5}, 3);
  const Tensor t = from_vector<int64_t>({0, 1, 4}, {3});
  expect_error(
      [&] {
        linear_cross_entropy(x, w, b, from_vector<int64_t>({0, 7, 1}, {3}), -100, 2);
      },
      {"linear_cross_entropy", "target 7", "row 1", "V = 5"});
  expect_error(
      [&] {
        linear_cross_entropy(x, w, b, from_vector<int64_t>({-100, 1, -3}, {3}));
      },
      {"linear_cross_entropy", "target -3", "row 2"});
  expect_error(
      [&] {
        linear_cross_entropy(x, w, b, from_vector<int32_t>({0, 1, 2}, {3}));
      },
      {"linear_cross_entropy", "targets i32[3]", "i64"});
  expect_error(
      [&] {
        linear_cross_entropy(x, w, b, from_vector<int64_t>({0, 1}, {2}));
      },
      {"linear_cross_entropy", "input [3, 4]", "targets [2]"});
  expect_error(
      [&] {
        linear_cross_entropy(x, rand_t<float>({5, 3}, 4), b, t);
      },
      {"linear_cross_entropy", "input [3, 4]", "weight [5, 3]"});
  expect_error([&] { linear_cross_entropy(rand_t<float>({12}, 1), w, b, t); },
               {"linear_cross_entropy", "input [12]"});
  expect_error([&] { linear_cross_entropy(x, w, rand_t<float>({4}, 5), t); },
               {"linear_cross_entropy", "bias [4]", "weight [5, 4]"});
  expect_error(
      [&] {
        linear_cross_entropy(x, rand_t<double>({5, 4}, 6), b, t);
      },
      {"linear_cross_entropy", "dtype mismatch"});
  expect_error([&] { linear_cross_entropy(x, w, rand_t<double>({5}, 7), t); },
               {"linear_cross_entropy", "dtype mismatch"});
  expect_error([&] { linear_cross_entropy(x, w, b, t, -100, -1); },
               {"linear_cross_entropy", "chunk_rows", "got -1"});
  expect_error(
      [&] {
        linear_cross_entropy(from_vector<int64_t>({1, 2}, {1, 2}), w, b, t);
      },
      {"linear_cross_entropy", "floating-point"});
  expect_error([&] { linear_cross_entropy(x, Tensor(), b, t); },
               {"linear_cross_entropy", "weight is undefined"});
  // The backward launcher validates too (on its own, as a remat replay might call it).
  const float dloss = 1.0f;
  float scale = 0;
  const int64_t bad[] = {0, 5, 1};
  expect_error([&] { cpu::linear_cross_entropy_scale<float>(&dloss, bad, &scale, 3, 5, -100); },
               {"linear_cross_entropy", "target 5", "row 1", "V = 5"});
}

TEST_CASE("optimizers: bad options, parameters, names and gradients throw") {
  Tensor w = fixture_param<float>(3, "w");
  expect_error([&] { SGD({w}, sgd_options(-1.0, 0, 0, 0, false)); }, {"SGD", "learning rate -1"});
  expect_error([&] { SGD({w}, sgd_options(0.1, -0.5, 0, 0, false)); }, {"SGD", "momentum -0.5"});
  expect_error([&] { SGD({w}, sgd_options(0.1, 0, 0, -1, false)); }, {"SGD", "weight_decay -1"});
  expect_error([&] { SGD({w}, sgd_options(0.1, 0.0, 0, 0, true)); },
               {"SGD", "nesterov", "momentum 0"});
  expect_error([&] { SGD({w}, sgd_options(0.1, 0.9, 0.5, 0, true)); },
               {"SGD", "nesterov", "dampening 0.5"});
  AdamWOptions bad = adamw_options();
  bad.beta2 = 1.0;
  expect_error([&] { AdamW({w}, bad); }, {"AdamW", "betas (0.9, 1)"});
  bad = adamw_options();
  bad.eps = -1;
  expect_error([&] { AdamW({w}, bad); }, {"AdamW", "eps -1"});
  bad = adamw_options();
  bad.weight_decay = -0.5;
  expect_error([&] { AdamW({w}, bad); }, {"AdamW", "weight_decay -0.5"});
  expect_error(
      [&] {
        AdamW({w, fixture_param<float>(2, "w")}, adamw_options());
      },
      {"AdamW", "two parameters", "\"w\""});
  expect_error(
      [&] {
        AdamW({w, Tensor()}, adamw_options());
      },
      {"AdamW", "parameter 1", "undefined"});
  expect_error([&] { AdamW({zeros({2}, DType::i64)}, adamw_options()); },
               {"AdamW", "parameter 0", "i64[2]", "floating"});
  AdamW opt({w}, adamw_options());
  expect_error([&] { opt.state("nope", "exp_avg"); }, {"AdamW", "no parameter named \"nope\""});
  expect_error([&] { opt.set_lr(-0.1); }, {"AdamW", "learning rate -0.1"});
  w.impl()->grad = zeros({4}).impl();
  expect_error([&] { opt.step(); }, {"AdamW", "gradient f32[4]", "\"w\"", "f32[3]"});
  // The launchers' own guards.
  std::vector<float> p(3), g(3), m(3), v(3);
  expect_error(
      [&] {
        cpu::adamw_step<float>(p.data(), g.data(), m.data(), v.data(), 3, 0.1, 0.9, 0.99, 1e-8, 0,
                               0);
      },
      {"adamw_step", "step 0"});
  expect_error(
      [&] { cpu::sgd_step<float>(p.data(), g.data(), nullptr, 3, 0.1, 0.9, 0, 0, false, true); },
      {"sgd_step", "momentum 0.9", "buffer"});
}
