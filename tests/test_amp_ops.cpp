// The 16-bit (bf16, f16) paths of the follow-class ops and of the ops with fp32 statistics (the
// mixed-precision policy, autograd/precision.h): relu, gelu, gelu_tanh, dropout, max_pool2d,
// avg_pool2d, global_avg_pool, upsample2x, embedding, softmax, layernorm, rmsnorm, batchnorm2d.
// Each op runs twice on the same values: once with its floating inputs in 16 bits (parameters of
// the norms in f32), once in f32 on the 16-bit-rounded values, with the same (rounded) cotangent.
// The 16-bit kernels compute in f32 and round once per stored element, so an output or gradient
// that depends only on 16-bit inputs is the f32 result rounded: within one unit roundoff u of it
// (bf16 u = 2^-8, f16 u = 2^-11, relative; plus half f16's smallest subnormal, absolute). Where
// a 16-bit backward reads a rounded saved output (softmax) or rounds more than once (embedding's
// repeated rows) the bound grows by what the conditioning of that step gives; each check says why
// its bound holds. Also: the dtypes of outputs, gradients and saved tensors, and the errors of
// mixes that are not allowed.
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"
#include "regen/autograd/ops_unary.h"
#include "regen/autograd/precision.h"
#include "regen/autograd/tape.h"
#include "regen/core/half.h"
#include "regen/core/tensor.h"
#include "regen/kernels/kernels.h"
#include "regen/kernels/lowp_launchers.h"
#include "regen/kernels/shapes.h"
#include "regen/kernels/unary_ops.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::expect_error;

namespace {

// Unit roundoff (relative) and the absolute rounding error below the normal range.
template <class H>
constexpr double unit_roundoff() {
  return std::is_same<H, bfloat16>::value ? 0x1p-8 : 0x1p-11;
}
template <class H>
constexpr double subnormal_atol() {
  return std::is_same<H, bfloat16>::value ? 0x1p-134 : 0x1p-25;
}
// The f32 reference and the 16-bit path's internal f32 arithmetic are the same formulas, but a
// compiler may order or vectorize a loop differently; this many f32 roundings cover that.
constexpr double kF32Slack = 0x1p-20;

template <class H>
DType dtype_h() {
  return dtype_of<H>::value;
}

std::vector<float> random_values(int64_t n, uint64_t seed, double lo, double hi) {
  Generator g(seed);
  return uniform({n}, lo, hi, g, DType::f32).to_vector<float>();
}

template <class H>
std::vector<float> round_to(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(H(v[i]));
  return out;
}

// A tensor of dtype `dt` (f32 or H) holding values already representable in H.
template <class H>
Tensor make(const std::vector<float>& v, const Shape& s, DType dt) {
  if (dt == DType::f32) return from_vector<float>(v, s);
  std::vector<H> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = H(v[i]);
  return from_vector<H>(h, s);
}

std::vector<double> values(const Tensor& t) {
  std::vector<double> out;
  switch (t.dtype()) {
    case DType::f32:
      for (float f : t.to_vector<float>()) out.push_back(f);
      break;
    case DType::bf16:
      for (bfloat16 h : t.to_vector<bfloat16>()) out.push_back(static_cast<float>(h));
      break;
    case DType::f16:
      for (float16 h : t.to_vector<float16>()) out.push_back(static_cast<float>(h));
      break;
    default:
      FAIL("unexpected dtype ", dtype_name(t.dtype()));
  }
  return out;
}

// |got - want| <= bound[i] element-wise; prints the first mismatches and the worst ratio.
void check_within(const std::vector<double>& got, const std::vector<double>& want,
                  const std::vector<double>& bound, const std::string& what) {
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": ", got.size(), " values, expected ",
                  want.size());
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]);
    const bool ok = std::isfinite(got[i]) && err <= bound[i];
    if (!ok && bad++ < 5) {
      MESSAGE(what, ": element ", i, " got ", got[i], " expected ", want[i], " bound ", bound[i]);
    }
    if (bound[i] > 0) worst = std::max(worst, err / bound[i]);
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), " outside the bound (worst ", worst,
                " of it)");
}

// One rounding of the f32 value: |got - want| <= u |want| (+ slack, + the subnormal step).
template <class H>
void check_rounded_once(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<double> w = values(want);
  std::vector<double> bound(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    bound[i] = (unit_roundoff<H>() + kF32Slack) * std::fabs(w[i]) + subnormal_atol<H>();
  }
  check_within(values(got), w, bound, what);
}

// The op under test: its floating inputs (the first `lowp_inputs` become 16-bit, the rest stay
// f32: parameters) -> one output.
struct Case {
  std::string name;
  std::vector<Shape> shapes;
  int lowp_inputs = 1;
  std::function<Tensor(const std::vector<Tensor>&)> op;
  double lo = -2.0, hi = 2.0;
};

struct Run {
  Tensor y;
  std::vector<Tensor> grads;
};

// Runs the case with its 16-bit inputs in `dt` (f32 or H), on values rounded to H, backward from
// the cotangent `dy` (values rounded to H, in y's dtype).
template <class H>
Run run_case(const Case& c, DType dt, uint64_t seed) {
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < c.shapes.size(); ++i) {
    const int64_t n = shape_numel(c.shapes[i]);
    const std::vector<float> v = random_values(n, seed + i, c.lo, c.hi);
    const bool lowp = static_cast<int>(i) < c.lowp_inputs;
    // Parameters keep f32 values (they stay f32); inputs are rounded to H in both runs.
    Tensor t = lowp ? make<H>(round_to<H>(v), c.shapes[i], dt) : from_vector<float>(v, c.shapes[i]);
    t.set_requires_grad(true);
    inputs.push_back(t);
  }
  Run r;
  r.y = c.op(inputs);
  const std::vector<float> dyv = round_to<H>(random_values(r.y.numel(), seed + 100, -1.0, 1.0));
  Tape::current().backward(r.y, make<H>(dyv, r.y.shape(), r.y.dtype()));
  for (const Tensor& t : inputs) r.grads.push_back(t.grad());
  return r;
}

// The dtypes of a 16-bit run: y and the 16-bit inputs' gradients in H, the parameters' in f32.
template <class H>
void check_dtypes(const Case& c, const Run& low) {
  CHECK_MESSAGE(low.y.dtype() == dtype_h<H>(), c.name, ": output ", low.y.str());
  for (size_t i = 0; i < low.grads.size(); ++i) {
    const DType want = static_cast<int>(i) < c.lowp_inputs ? dtype_h<H>() : DType::f32;
    REQUIRE_MESSAGE(low.grads[i].defined(), c.name, ": input ", i, " has no gradient");
    CHECK_MESSAGE(low.grads[i].dtype() == want, c.name, ": gradient ", i, " ", low.grads[i].str());
  }
}

// Outputs and every gradient within one rounding of f32: for ops whose 16-bit backward reads only
// unrounded data (its 16-bit inputs, the f32 parameters and statistics, the cotangent) or saved
// outputs that are exact (relu's y = x, max pooling's selected values).
template <class H>
void check_case_rounded_once(const Case& c, uint64_t seed) {
  const Run low = run_case<H>(c, dtype_h<H>(), seed);
  const Run ref = run_case<H>(c, DType::f32, seed);
  check_dtypes<H>(c, low);
  const std::string tag = c.name + " " + dtype_name(dtype_h<H>());
  check_rounded_once<H>(low.y, ref.y, tag + " output");
  for (size_t i = 0; i < low.grads.size(); ++i) {
    if (static_cast<int>(i) < c.lowp_inputs) {
      check_rounded_once<H>(low.grads[i], ref.grads[i], tag + " gradient " + std::to_string(i));
    } else {
      // A parameter's gradient is f32 from the same f32 arithmetic on the same values.
      const std::vector<double> w = values(ref.grads[i]);
      std::vector<double> bound(w.size());
      for (size_t k = 0; k < w.size(); ++k) bound[k] = kF32Slack * std::fabs(w[k]) + 1e-30;
      check_within(values(low.grads[i]), w, bound,
                   tag + " parameter gradient " + std::to_string(i));
    }
  }
}

std::vector<Case> rounded_once_cases() {
  std::vector<Case> cases;
  cases.push_back({"relu", {{3, 333}}, 1, [](const auto& in) { return relu(in[0]); }});
  cases.push_back({"gelu", {{3, 333}}, 1, [](const auto& in) { return gelu(in[0]); }});
  cases.push_back({"gelu_tanh", {{3, 333}}, 1, [](const auto& in) { return gelu_tanh(in[0]); }});
  // Enough elements for several 16-bit blocks and the parallel path; the mask is Philox's.
  cases.push_back({"dropout", {{70001}}, 1, [](const auto& in) {
                     manual_seed(1234);
                     return dropout(in[0], 0.3f, true);
                   }});
  // Overlapping windows (3x3 stride 2, padded): several outputs pick the same input.
  cases.push_back({"max_pool2d", {{2, 3, 9, 11}}, 1, [](const auto& in) {
                     return max_pool2d(in[0], 3, 2, 1);
                   }});
  cases.push_back({"avg_pool2d", {{2, 3, 9, 11}}, 1, [](const auto& in) {
                     return avg_pool2d(in[0], 3, 2, 1);
                   }});
  cases.push_back({"global_avg_pool", {{2, 3, 7, 5}}, 1, [](const auto& in) {
                     return global_avg_pool(in[0]);
                   }});
  cases.push_back({"upsample2x nearest", {{2, 3, 5, 4}}, 1, [](const auto& in) {
                     return upsample2x(in[0], UpsampleMode::nearest);
                   }});
  cases.push_back({"upsample2x bilinear", {{2, 3, 5, 4}}, 1, [](const auto& in) {
                     return upsample2x(in[0], UpsampleMode::bilinear);
                   }});
  // The norms: x 16-bit, parameters f32. Their statistics are f32 from the same values, so y and
  // dx are the f32 ones rounded once and the parameter gradients equal the f32 ones.
  cases.push_back({"layernorm", {{6, 200}, {200}, {200}}, 1, [](const auto& in) {
                     return layernorm(in[0], in[1], in[2]);
                   }});
  cases.push_back(
      {"rmsnorm", {{6, 200}, {200}}, 1, [](const auto& in) { return rmsnorm(in[0], in[1]); }});
  cases.push_back({"batchnorm2d train", {{4, 3, 5, 6}, {3}, {3}}, 1, [](const auto& in) {
                     const Tensor rm = zeros({3}), rv = ones({3});
                     return batchnorm2d(in[0], in[1], in[2], rm, rv, true, 0.1, 1e-5);
                   }});
  cases.push_back({"batchnorm2d eval", {{4, 3, 5, 6}, {3}, {3}}, 1, [](const auto& in) {
                     const Tensor rm = full({3}, 0.25), rv = full({3}, 2.0);
                     return batchnorm2d(in[0], in[1], in[2], rm, rv, false, 0.1, 1e-5);
                   }});
  return cases;
}

}  // namespace

TEST_CASE_TEMPLATE("amp ops: outputs and gradients are the f32 op's rounded once", H, bfloat16,
                   float16) {
  uint64_t seed = 10;
  for (const Case& c : rounded_once_cases()) {
    SUBCASE(c.name.c_str()) {
      check_case_rounded_once<H>(c, seed);
    }
    seed += 1000;
  }
}

TEST_CASE_TEMPLATE("amp ops: dropout keeps the same elements as f32", H, bfloat16, float16) {
  const std::vector<float> v = round_to<H>(random_values(5000, 7, 0.5, 2.0));  // no zeros
  manual_seed(99);
  const Tensor y16 = dropout(make<H>(v, {5000}, dtype_h<H>()), 0.4f, true);
  manual_seed(99);
  const Tensor y32 = dropout(from_vector<float>(v, {5000}), 0.4f, true);
  const std::vector<double> a = values(y16), b = values(y32);
  int64_t kept = 0, differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    differ += (a[i] == 0) != (b[i] == 0);
    kept += b[i] != 0;
  }
  CHECK(differ == 0);
  CHECK(kept > 2500);  // about 60% of 5000 kept; far from every or no element
  CHECK(kept < 3500);
}

TEST_CASE_TEMPLATE("amp ops: softmax 16-bit, backward from the rounded saved output", H, bfloat16,
                   float16) {
  const Case c{"softmax", {{5, 300}}, 1, [](const auto& in) { return softmax(in[0]); }, -4, 4};
  const Run low = run_case<H>(c, dtype_h<H>(), 31);
  const Run ref = run_case<H>(c, DType::f32, 31);
  check_dtypes<H>(c, low);
  check_rounded_once<H>(low.y, ref.y, std::string("softmax output ") + dtype_name(dtype_h<H>()));
  // Backward reads the saved 16-bit y: y_j (1 + e_j), |e_j| <= u. With d = sum_k dy_k y_k,
  // dx_j = y_j (dy_j - d) moves by at most u |y_j| |dy_j - d| (y_j's error) plus |y_j| u S,
  // S = sum_k |dy_k y_k| (d's error, first order), and is then rounded once (u |dx_j|): the bound
  // below, doubled for the second-order terms and the f32 slack.
  const double u = unit_roundoff<H>();
  const std::vector<double> y = values(ref.y), dx = values(ref.grads[0]);
  const std::vector<float> dyv = round_to<H>(random_values(ref.y.numel(), 31 + 100, -1.0, 1.0));
  const int64_t N = 300;
  std::vector<double> bound(y.size());
  for (int64_t r = 0; r < 5; ++r) {
    double d = 0, s = 0;
    for (int64_t j = 0; j < N; ++j) {
      d += dyv[r * N + j] * y[r * N + j];
      s += std::fabs(dyv[r * N + j] * y[r * N + j]);
    }
    for (int64_t j = 0; j < N; ++j) {
      const size_t k = static_cast<size_t>(r * N + j);
      bound[k] = 2 * u * (std::fabs(y[k]) * (std::fabs(dyv[k] - d) + s) + std::fabs(dx[k])) +
                 subnormal_atol<H>();
    }
  }
  check_within(values(low.grads[0]), dx, bound,
               std::string("softmax gradient ") + dtype_name(dtype_h<H>()));
}

TEST_CASE_TEMPLATE("amp ops: embedding gathers 16-bit rows, and repeated ids round per add", H,
                   bfloat16, float16) {
  const int64_t V = 7, D = 150;
  const std::vector<int64_t> id_values = {3, 0, 3, 6, 3, 1, 6, 2};  // row 3 three times, 6 twice
  const Tensor ids = from_vector<int64_t>(id_values, {2, 4});
  const Case c{"embedding", {{V, D}}, 1, [&](const auto& in) { return embedding(ids, in[0]); }};
  const Run low = run_case<H>(c, dtype_h<H>(), 41);
  const Run ref = run_case<H>(c, DType::f32, 41);
  check_dtypes<H>(c, low);
  // A gather copies: exact.
  CHECK(values(low.y) == values(ref.y));
  // Row v's gradient adds the k_v token rows that use it, rounding after each add: the error is
  // at most k_v u times the sum of the |partial sums|, which is at most k_v sum_i |dy_i| (zero
  // for unused rows, one rounding for a row used once).
  const double u = unit_roundoff<H>();
  const std::vector<float> dyv = round_to<H>(random_values(ref.y.numel(), 41 + 100, -1.0, 1.0));
  std::vector<double> bound(static_cast<size_t>(V * D), subnormal_atol<H>());
  std::vector<int> uses(V, 0);
  for (int64_t id : id_values) ++uses[static_cast<size_t>(id)];
  for (size_t i = 0; i < id_values.size(); ++i) {
    const int64_t v = id_values[i];
    for (int64_t d = 0; d < D; ++d) {
      bound[static_cast<size_t>(v * D + d)] +=
          (u + kF32Slack) * uses[static_cast<size_t>(v)] * std::fabs(dyv[i * D + d]);
    }
  }
  check_within(values(low.grads[0]), values(ref.grads[0]), bound,
               std::string("embedding gradient ") + dtype_name(dtype_h<H>()));
}

TEST_CASE("amp ops: a 16-bit layernorm, rmsnorm and batchnorm2d save 16-bit x, f32 statistics") {
  const Tensor x =
      make<bfloat16>(round_to<bfloat16>(random_values(4 * 3 * 8, 5, -1, 1)), {4, 3, 8}, DType::bf16)
          .set_requires_grad(true);
  const Tensor g = ones({8}).set_requires_grad(true), b = zeros({8}).set_requires_grad(true);
  const auto saved_dtypes = [] {
    const Tape& tape = Tape::current();
    std::vector<DType> out;
    for (int64_t v : tape.nodes().back().saved) out.push_back(tape.value(v).dtype);
    return out;
  };
  {
    const Tensor y = layernorm(x, g, b);
    CHECK(y.dtype() == DType::bf16);
    // x, gamma, mean, rstd (OpDef::saves).
    CHECK(saved_dtypes() == std::vector<DType>{DType::bf16, DType::f32, DType::f32, DType::f32});
    Tape::current().clear();
  }
  {
    const Tensor y = rmsnorm(x, g);
    CHECK(y.dtype() == DType::bf16);
    CHECK(saved_dtypes() == std::vector<DType>{DType::bf16, DType::f32, DType::f32});
    Tape::current().clear();
  }
  {
    const Tensor x4 = make<float16>(round_to<float16>(random_values(2 * 3 * 4 * 4, 6, -1, 1)),
                                    {2, 3, 4, 4}, DType::f16)
                          .set_requires_grad(true);
    const Tensor g3 = ones({3}).set_requires_grad(true), b3 = zeros({3});
    Tensor rm = zeros({3}), rv = ones({3});
    const Tensor y = batchnorm2d(x4, g3, b3, rm, rv, true, 0.5, 1e-5);
    CHECK(y.dtype() == DType::f16);
    CHECK(saved_dtypes() == std::vector<DType>{DType::f16, DType::f32, DType::f32, DType::f32});
    Tape::current().clear();
    // The running stats stay f32 and were updated (momentum 0.5 towards the batch's).
    CHECK(rm.dtype() == DType::f32);
    CHECK(rv.to_vector<float>()[0] != 1.0f);
  }
}

// An f32 x under autocast (the Transformer's fp32 residual stream): layernorm computes in f32 as
// without autocast, and saves, in place of x, xhat = (x - mean) * rstd rounded once to H. So its
// output is the f32 op's bit for bit, the saved tensors are gamma, rstd and the H xhat, and the
// gradients differ from the f32 op's only through xhat's rounding: xhat_H = xhat (1 + d), |d| <= u.
// Then b = mean(g xhat) (g = dy gamma) moves by at most u mean|g xhat|, dgamma by u sum|dy xhat|,
// dbeta not at all, and dx = rstd (g - a - xhat b) by at most rstd u |xhat| (|b| + 2 mean|g xhat|);
// kF32Slack of the terms' magnitudes covers the f32 arithmetic's order.
TEST_CASE_TEMPLATE("amp ops: an f32 layernorm under autocast saves xhat in 16 bits", H, bfloat16,
                   float16) {
  const double u = unit_roundoff<H>();
  for (const int64_t N : {7, 48, 600}) {
    CAPTURE(N);
    const int64_t M = 10;
    // Rows with a mean away from 0 (a residual stream's), scaled per row.
    std::vector<float> xv = random_values(M * N, 11 + N, -2, 3);
    for (int64_t r = 0; r < M; ++r) {
      for (int64_t j = 0; j < N; ++j) xv[r * N + j] *= 0.5f + 0.25f * static_cast<float>(r);
    }
    const std::vector<float> gv = random_values(N, 12, 0.5, 1.5), bv = random_values(N, 13, -1, 1);
    const std::vector<float> dyv = random_values(M * N, 14 + N, -1, 1);
    struct Run {
      Tensor y, dx, dg, db;
      std::vector<DType> saved;
    };
    const auto run = [&](bool autocast) {
      const Tensor x = from_vector<float>(xv, {M, N}).set_requires_grad(true);
      const Tensor g = from_vector<float>(gv, {N}).set_requires_grad(true);
      const Tensor b = from_vector<float>(bv, {N}).set_requires_grad(true);
      Run r;
      {
        std::unique_ptr<AutocastScope> scope;
        if (autocast) scope = std::make_unique<AutocastScope>(dtype_h<H>());
        r.y = layernorm(x, g, b);
      }
      const Tape& tape = Tape::current();
      for (int64_t v : tape.nodes().back().saved) r.saved.push_back(tape.value(v).dtype);
      Tape::current().backward(r.y, from_vector<float>(dyv, {M, N}));
      r.dx = x.grad();
      r.dg = g.grad();
      r.db = b.grad();
      Tape::current().clear();
      return r;
    };
    const Run f = run(false), h = run(true);
    CHECK(f.saved == std::vector<DType>{DType::f32, DType::f32, DType::f32, DType::f32});
    // gamma, rstd, xhat.
    CHECK(h.saved == std::vector<DType>{DType::f32, DType::f32, dtype_h<H>()});
    REQUIRE(h.y.dtype() == DType::f32);
    REQUIRE(h.dx.dtype() == DType::f32);
    CHECK(values(h.y) == values(f.y));
    CHECK(values(h.db) == values(f.db));
    // The bounds, from the f32 run's xhat (the same mean and rstd: the outputs agree).
    std::vector<double> bx(M * N), bg(N, 0.0);
    for (int64_t r = 0; r < M; ++r) {
      double mu = 0, sq = 0;
      for (int64_t j = 0; j < N; ++j) mu += xv[r * N + j];
      mu /= N;
      for (int64_t j = 0; j < N; ++j) sq += (xv[r * N + j] - mu) * (xv[r * N + j] - mu);
      const double rs = 1.0 / std::sqrt(sq / N + 1e-5);
      double mean_gx = 0, b = 0, mag = 0;
      std::vector<double> xhat(N);
      for (int64_t j = 0; j < N; ++j) {
        xhat[j] = (xv[r * N + j] - mu) * rs;
        const double gj = dyv[r * N + j] * gv[j];
        mean_gx += std::fabs(gj * xhat[j]) / N;
        b += gj * xhat[j] / N;
        bg[j] += u * std::fabs(dyv[r * N + j] * xhat[j]);
      }
      for (int64_t j = 0; j < N; ++j) {
        mag = std::max(mag,
                       rs * (std::fabs(dyv[r * N + j] * gv[j]) + mean_gx + std::fabs(xhat[j] * b)));
      }
      for (int64_t j = 0; j < N; ++j) {
        bx[r * N + j] =
            rs * u * std::fabs(xhat[j]) * (std::fabs(b) + 2 * mean_gx) * 1.01 + kF32Slack * mag;
      }
    }
    for (int64_t j = 0; j < N; ++j) bg[j] = bg[j] * 1.01 + kF32Slack * (1 + bg[j] / u);
    check_within(values(h.dx), values(f.dx), bx, "dx");
    check_within(values(h.dg), values(f.dg), bg, "dgamma");
  }
  // The kernels themselves: y, mean and rstd are layernorm_forward's bits; xhat is the f32
  // (x - mean) * rstd rounded once; and backward from a given xhat matches a double reference.
  const int64_t M = 9, N = 520;
  const std::vector<float> x = random_values(M * N, 21, -3, 4), g = random_values(N, 22, 0.5, 2),
                           b = random_values(N, 23, -1, 1), dy = random_values(M * N, 24, -1, 1);
  std::vector<float> y0(M * N), m0(M), r0(M), y1(M * N), m1(M), r1(M);
  std::vector<H> xs(M * N);
  cpu::layernorm_forward<float>(x.data(), g.data(), b.data(), y0.data(), m0.data(), r0.data(), M, N,
                                1e-5);
  cpu::layernorm_forward_save_xhat<H>(x.data(), g.data(), b.data(), y1.data(), m1.data(), r1.data(),
                                      xs.data(), M, N, 1e-5);
  CHECK(y1 == y0);
  CHECK(m1 == m0);
  CHECK(r1 == r0);
  int bad = 0;
  for (int64_t i = 0; i < M * N; ++i) {
    const float want = static_cast<float>(H((x[i] - m0[i / N]) * r0[i / N]));
    if (static_cast<float>(xs[i]) != want) ++bad;
  }
  CHECK(bad == 0);
  std::vector<float> dx(M * N), dg(N), db(N);
  cpu::layernorm_backward_xhat<H>(dy.data(), xs.data(), g.data(), r1.data(), dx.data(), dg.data(),
                                  db.data(), M, N);
  std::vector<double> want_dx(M * N), want_dg(N, 0.0), want_db(N, 0.0), bdx(M * N), bdg(N);
  for (int64_t r = 0; r < M; ++r) {
    double a = 0, bb = 0, mag = 0;
    for (int64_t j = 0; j < N; ++j) {
      const double xh = static_cast<float>(xs[r * N + j]), gj = double(dy[r * N + j]) * g[j];
      a += gj / N;
      bb += gj * xh / N;
      want_dg[j] += dy[r * N + j] * xh;
      want_db[j] += dy[r * N + j];
    }
    for (int64_t j = 0; j < N; ++j) {
      const double xh = static_cast<float>(xs[r * N + j]), gj = double(dy[r * N + j]) * g[j];
      want_dx[r * N + j] = r1[r] * (gj - a - xh * bb);
      mag = std::max(mag, r1[r] * (std::fabs(gj) + std::fabs(a) + std::fabs(xh * bb)));
    }
    for (int64_t j = 0; j < N; ++j) bdx[r * N + j] = kF32Slack * mag;
  }
  for (int64_t j = 0; j < N; ++j) bdg[j] = kF32Slack * M * 8;
  std::vector<double> got_dx(dx.begin(), dx.end()), got_dg(dg.begin(), dg.end()),
      got_db(db.begin(), db.end());
  check_within(got_dx, want_dx, bdx, "kernel dx");
  check_within(got_dg, want_dg, bdg, "kernel dgamma");
  check_within(got_db, want_db, bdg, "kernel dbeta");
}

TEST_CASE("amp ops: mixes that are not allowed name the op and the dtypes") {
  const Tensor x16 = zeros({2, 8}, DType::bf16), x32 = zeros({2, 8});
  const Tensor p16 = ones({8}, DType::bf16), p32 = ones({8}), p64 = ones({8}, DType::f64);
  // A 16-bit x reads f32 parameters; an f32 x reads f32 ones.
  expect_error([&] { layernorm(x16, p16, p32); }, {"layernorm", "gamma", "bf16", "f32"});
  expect_error([&] { layernorm(x16, p32, p64); }, {"layernorm", "beta", "f64", "f32"});
  expect_error([&] { layernorm(x32, p16, p16); }, {"layernorm", "gamma", "bf16", "f32"});
  expect_error(
      [&] {
        rmsnorm(zeros({2, 8}, DType::f16), p16);
      },
      {"rmsnorm", "weight", "bf16", "f16", "f32"});
  const Tensor x4 = zeros({2, 3, 2, 2}, DType::f16);
  expect_error(
      [&] {
        batchnorm2d(x4, ones({3}), zeros({3}), zeros({3}, DType::f16), ones({3}), true, 0.1, 1e-5);
      },
      {"batchnorm2d", "running_mean", "f16", "f32"});
  // cross_entropy is fp32-class: 16-bit logits are refused, naming the dtype.
  expect_error(
      [&] {
        cross_entropy(zeros({2, 5}, DType::bf16), zeros({2}, DType::i64));
      },
      {"cross_entropy", "bf16", "f32"});
}

// ---- Bit for bit against per-element references
// -------------------------------------------------- The 16-bit kernels widen rows and planes into
// f32 buffers (kernels/cpu/lowp_blocks.h) for speed; each reference below converts one element at a
// time (core/half.h) and runs the same f32 expressions in the same order, as the kernels did before
// they were blocked. Results must be equal bit for bit, on shapes that end inside a block and a
// vector and that exceed a block.

namespace regen {
// rmsnorm's f32 launchers, declared beside its op (autograd/ops_rmsnorm.cpp; a declaration that
// differs from that one fails to link); the 16-bit ones are in kernels/lowp_launchers.h.
REGEN_LAUNCHER(rmsnorm_forward,
               (const T* x, const T* weight, T* y, T* rstd, int64_t M, int64_t N, double eps))
REGEN_LAUNCHER(rmsnorm_backward, (const T* dy, const T* x, const T* weight, const T* rstd, T* dx,
                                  T* dweight, int64_t M, int64_t N))
}  // namespace regen

namespace {

template <class H>
std::vector<H> random_h(int64_t n, uint64_t seed, double lo, double hi) {
  std::vector<H> out;
  for (float f : random_values(n, seed, lo, hi)) out.push_back(H(f));
  return out;
}

template <class H>
void check_same_bits(const std::vector<H>& got, const std::vector<H>& want,
                     const std::string& what) {
  REQUIRE(got.size() == want.size());
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].bits != want[i].bits && bad++ == 0) first = static_cast<int64_t>(i);
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), " elements differ, first at ", first,
                bad ? " (got bits " + std::to_string(got[static_cast<size_t>(first)].bits) +
                          ", want " + std::to_string(want[static_cast<size_t>(first)].bits) + ")"
                    : std::string());
}

template <class H>
void ref_softmax(const std::vector<H>& x, std::vector<H>& y, int64_t M, int64_t N) {
  for (int64_t r = 0; r < M; ++r) {
    float mx = -INFINITY;
    for (int64_t j = 0; j < N; ++j) mx = std::max(mx, static_cast<float>(x[r * N + j]));
    double sum = 0;
    for (int64_t j = 0; j < N; ++j) sum += static_cast<double>(std::exp(float(x[r * N + j]) - mx));
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = 0; j < N; ++j) y[r * N + j] = H(std::exp(float(x[r * N + j]) - mx) * inv);
  }
}

template <class H>
void ref_softmax_backward(const std::vector<H>& dy, const std::vector<H>& y, std::vector<H>& dx,
                          int64_t M, int64_t N) {
  for (int64_t r = 0; r < M; ++r) {
    double dot = 0;
    for (int64_t j = 0; j < N; ++j) {
      dot += static_cast<double>(dy[r * N + j]) * static_cast<double>(y[r * N + j]);
    }
    const float d = static_cast<float>(dot);
    for (int64_t j = 0; j < N; ++j)
      dx[r * N + j] = H(float(y[r * N + j]) * (float(dy[r * N + j]) - d));
  }
}

template <class H>
void ref_layernorm(const std::vector<H>& x, const std::vector<float>& g,
                   const std::vector<float>& b, std::vector<H>& y, int64_t M, int64_t N) {
  for (int64_t r = 0; r < M; ++r) {
    const H* xr = x.data() + r * N;
    double sum = 0;
    for (int64_t j = 0; j < N; ++j) sum += static_cast<double>(xr[j]);
    const double mu = sum / static_cast<double>(N);
    double sq = 0;
    for (int64_t j = 0; j < N; ++j) {
      const double d = static_cast<double>(xr[j]) - mu;
      sq += d * d;
    }
    const float mu_t = static_cast<float>(mu);
    const float rs_t = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(N) + 1e-5));
    // Written as the kernel's loop (gamma and beta may be null there), so that the compiler
    // fuses its multiply-add, or not, as it does in the kernel.
    const float *gp = g.data(), *bp = b.data();
    for (int64_t j = 0; j < N; ++j) {
      const float xhat = (float(xr[j]) - mu_t) * rs_t;
      y[r * N + j] = H((gp ? xhat * gp[j] : xhat) + (bp ? bp[j] : 0.0f));
    }
  }
}

template <class H>
void ref_layernorm_backward(const std::vector<H>& dy, const std::vector<H>& x,
                            const std::vector<float>& g, const std::vector<float>& mean,
                            const std::vector<float>& rstd, std::vector<H>& dx, int64_t M,
                            int64_t N) {
  for (int64_t r = 0; r < M; ++r) {
    const H *xr = x.data() + r * N, *dyr = dy.data() + r * N;
    const float mu = mean[r], rs = rstd[r];
    double sum_g = 0, sum_gx = 0;
    for (int64_t j = 0; j < N; ++j) {
      const float gj = float(dyr[j]) * g[j];
      sum_g += static_cast<double>(gj);
      sum_gx += static_cast<double>(gj) * static_cast<double>((float(xr[j]) - mu) * rs);
    }
    const float a = static_cast<float>(sum_g / static_cast<double>(N));
    const float b = static_cast<float>(sum_gx / static_cast<double>(N));
    for (int64_t j = 0; j < N; ++j) {
      const float gj = float(dyr[j]) * g[j];
      const float xhat = (float(xr[j]) - mu) * rs;
      dx[r * N + j] = H(rs * (gj - a - xhat * b));
    }
  }
}

template <class H>
void ref_rmsnorm(const std::vector<H>& x, const std::vector<float>& w, std::vector<H>& y, int64_t M,
                 int64_t N) {
  for (int64_t r = 0; r < M; ++r) {
    const H* xr = x.data() + r * N;
    double sq = 0;
    for (int64_t j = 0; j < N; ++j) {
      const double v = static_cast<float>(xr[j]);
      sq += v * v;
    }
    const float rs = static_cast<float>(1.0 / std::sqrt(sq / static_cast<double>(N) + 1e-6));
    for (int64_t j = 0; j < N; ++j) y[r * N + j] = H(float(xr[j]) * rs * w[j]);
  }
}

template <class H>
void ref_avgpool(const std::vector<H>& x, std::vector<H>& y, const PoolShape& s) {
  const double inv = 1.0 / static_cast<double>(s.kh * s.kw);
  for (int64_t i = 0; i < s.N * s.C; ++i) {
    for (int64_t p = 0; p < s.P; ++p) {
      for (int64_t q = 0; q < s.Q; ++q) {
        double acc = 0;
        for (int64_t h = std::max<int64_t>(p * s.stride_h - s.pad_h, 0);
             h < std::min(p * s.stride_h - s.pad_h + s.kh, s.H); ++h) {
          for (int64_t w = std::max<int64_t>(q * s.stride_w - s.pad_w, 0);
               w < std::min(q * s.stride_w - s.pad_w + s.kw, s.W); ++w) {
            acc += static_cast<double>(x[(i * s.H + h) * s.W + w]);
          }
        }
        y[(i * s.P + p) * s.Q + q] = static_cast<H>(acc * inv);
      }
    }
  }
}

template <class H>
void ref_upsample_bilinear(const std::vector<H>& x, std::vector<H>& y, int64_t NC, int64_t Hi,
                           int64_t W) {
  // Output i of an axis of extent n reads i0 and min(i0 + 1, n - 1) (kernels/cpu/upsample.cpp).
  const auto src = [](int64_t i, int64_t n, int64_t& i0, int64_t& i1, float& l1) {
    const int64_t k = i >> 1;
    i0 = (i & 1) ? k : (k == 0 ? 0 : k - 1);
    l1 = (i & 1) ? 0.25f : (k == 0 ? 0.0f : 0.75f);
    i1 = i0 < n - 1 ? i0 + 1 : i0;
  };
  for (int64_t i = 0; i < NC; ++i) {
    for (int64_t oh = 0; oh < 2 * Hi; ++oh) {
      int64_t h0, h1;
      float lh1;
      src(oh, Hi, h0, h1, lh1);
      const float lh0 = 1.0f - lh1;
      const H* r0 = x.data() + (i * Hi + h0) * W;
      const H* r1 = x.data() + (i * Hi + h1) * W;
      for (int64_t ow = 0; ow < 2 * W; ++ow) {
        int64_t w0, w1;
        float lw1;
        src(ow, W, w0, w1, lw1);
        const float lw0 = 1.0f - lw1;
        y[(i * 2 * Hi + oh) * 2 * W + ow] = H(lh0 * (lw0 * float(r0[w0]) + lw1 * float(r0[w1])) +
                                              lh1 * (lw0 * float(r1[w0]) + lw1 * float(r1[w1])));
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("amp ops: blocked 16-bit kernels equal per-element references bit for bit", H,
                   bfloat16, float16) {
  // Rows shorter than a vector, ending inside a block, and longer than the softmax row buffer.
  for (const auto& [M, N] :
       std::vector<std::pair<int64_t, int64_t>>{{3, 7}, {4, 1000}, {2, 5000}}) {
    CAPTURE(N);
    const std::vector<H> x = random_h<H>(M * N, 71, -6, 6), dy = random_h<H>(M * N, 72, -1, 1);
    const std::vector<float> g = random_values(N, 73, 0.5, 1.5), b = random_values(N, 74, -1, 1);
    std::vector<H> got(static_cast<size_t>(M * N)), want(got.size());
    std::vector<float> mean(static_cast<size_t>(M)), rstd(mean.size()), dg(g.size()), db(g.size());
    cpu::softmax_forward(x.data(), got.data(), M, N);
    ref_softmax(x, want, M, N);
    check_same_bits(got, want, "softmax");
    const std::vector<H> y = got;
    cpu::softmax_backward(dy.data(), y.data(), got.data(), M, N);
    ref_softmax_backward(dy, y, want, M, N);
    check_same_bits(got, want, "softmax backward");
    cpu::layernorm_forward_lowp(x.data(), g.data(), b.data(), got.data(), mean.data(), rstd.data(),
                                M, N, 1e-5);
    ref_layernorm(x, g, b, want, M, N);
    check_same_bits(got, want, "layernorm");
    cpu::layernorm_backward_lowp(dy.data(), x.data(), g.data(), mean.data(), rstd.data(),
                                 got.data(), dg.data(), db.data(), M, N);
    ref_layernorm_backward(dy, x, g, mean, rstd, want, M, N);
    check_same_bits(got, want, "layernorm backward");
    cpu::rmsnorm_forward_lowp(x.data(), g.data(), got.data(), rstd.data(), M, N, 1e-6);
    ref_rmsnorm(x, g, want, M, N);
    check_same_bits(got, want, "rmsnorm");
  }
  for (const auto& [Hi, W] : std::vector<std::pair<int64_t, int64_t>>{{5, 4}, {9, 37}, {3, 300}}) {
    CAPTURE(W);
    const int64_t NC = 3;
    const std::vector<H> x = random_h<H>(NC * Hi * W, 81, -3, 3);
    std::vector<H> got(static_cast<size_t>(4 * NC * Hi * W)), want(got.size());
    cpu::upsample2x_bilinear_forward(x.data(), got.data(), NC, Hi, W);
    ref_upsample_bilinear(x, want, NC, Hi, W);
    check_same_bits(got, want, "upsample2x bilinear");
    const PoolShape s = make_pool_shape(1, NC, Hi, W, 3, 3, 2, 2, 1, 1);
    std::vector<H> pg(static_cast<size_t>(NC * s.P * s.Q)), pw(pg.size());
    cpu::avgpool2d_forward(x.data(), pg.data(), s);
    ref_avgpool(x, pw, s);
    check_same_bits(pg, pw, "avg_pool2d");
  }
}

// ---- Throughput (hidden: run with --no-skip)
// ------------------------------------------------------ The CPU kernels of these ops in f32, bf16
// and f16, one thread, called directly (no tape): the milliseconds of each, the median of
// interleaved repetitions (f32, bf16, f16 in turn, so a load that changes over the run weighs on
// all three alike), and the 16-bit ones' ratio to f32 (issue 36's target: at most 1).

namespace {

// The arrays of one dtype T for the bench: x, dy (n), y, dx (n * 4: upsampling's output), f32
// parameters and statistics.
template <class T>
struct BenchArrays {
  std::vector<T> x, dy, y, dx;
  std::vector<float> p0, p1, s0, s1, g0, g1;
  std::vector<int32_t> argmax;
  explicit BenchArrays(int64_t n) {
    const std::vector<float> v = random_values(n, 1, -3, 3), g = random_values(4 * n, 2, -1, 1);
    for (float f : v) x.push_back(T(f));
    for (float f : g) dy.push_back(T(f));
    y.resize(static_cast<size_t>(4 * n));
    dx.resize(static_cast<size_t>(4 * n));
    argmax.resize(static_cast<size_t>(n));
    for (auto* p : {&p0, &p1, &s0, &s1, &g0, &g1}) p->assign(static_cast<size_t>(n), 1.0f);
  }
};

// The parameters and statistics: T itself for f32, f32 beside a 16-bit T.
template <class T>
struct BenchOps {
  BenchArrays<T>& a;
  static constexpr int64_t kRows = 4096, kCols = 1024;          // (M, N) of the row ops
  static constexpr int64_t kN = 32, kC = 64, kH = 32, kW = 32;  // (N, C, H, W) of the image ops
  static constexpr int64_t kNumel = kRows * kCols;

  void run(const std::string& op) {
    const int64_t M = kRows, N = kCols;
    const PoolShape pool = make_pool_shape(kN, kC, kH, kW, 3, 3, 2, 2, 1, 1);
    if (op == "relu") {
      cpu::unary_forward(unary::relu{}, a.x.data(), a.y.data(), kNumel);
    } else if (op == "gelu") {
      cpu::unary_forward(unary::gelu{}, a.x.data(), a.y.data(), kNumel);
    } else if (op == "dropout") {
      if constexpr (is_half_v<T>) {
        cpu::dropout_forward_lowp(a.x.data(), a.y.data(), kNumel, 0.1f, 7, 0);
      } else {
        cpu::dropout_forward(a.x.data(), a.y.data(), kNumel, 0.1f, 7, 0);
      }
    } else if (op == "layernorm") {
      if constexpr (is_half_v<T>) {
        cpu::layernorm_forward_lowp(a.x.data(), a.p0.data(), a.p1.data(), a.y.data(), a.s0.data(),
                                    a.s1.data(), M, N, 1e-5);
      } else {
        cpu::layernorm_forward(a.x.data(), a.p0.data(), a.p1.data(), a.y.data(), a.s0.data(),
                               a.s1.data(), M, N, 1e-5);
      }
    } else if (op == "layernorm bwd") {
      if constexpr (is_half_v<T>) {
        cpu::layernorm_backward_lowp(a.dy.data(), a.x.data(), a.p0.data(), a.s0.data(), a.s1.data(),
                                     a.dx.data(), a.g0.data(), a.g1.data(), M, N);
      } else {
        cpu::layernorm_backward(a.dy.data(), a.x.data(), a.p0.data(), a.s0.data(), a.s1.data(),
                                a.dx.data(), a.g0.data(), a.g1.data(), M, N);
      }
    } else if (op == "rmsnorm") {
      if constexpr (is_half_v<T>) {
        cpu::rmsnorm_forward_lowp(a.x.data(), a.p0.data(), a.y.data(), a.s0.data(), M, N, 1e-6);
      } else {
        cpu::rmsnorm_forward(a.x.data(), a.p0.data(), a.y.data(), a.s0.data(), M, N, 1e-6);
      }
    } else if (op == "rmsnorm bwd") {
      if constexpr (is_half_v<T>) {
        cpu::rmsnorm_backward_lowp(a.dy.data(), a.x.data(), a.p0.data(), a.s0.data(), a.dx.data(),
                                   a.g0.data(), M, N);
      } else {
        cpu::rmsnorm_backward(a.dy.data(), a.x.data(), a.p0.data(), a.s0.data(), a.dx.data(),
                              a.g0.data(), M, N);
      }
    } else if (op == "softmax") {
      cpu::softmax_forward(a.x.data(), a.y.data(), M, N);
    } else if (op == "softmax bwd") {
      cpu::softmax_backward(a.dy.data(), a.y.data(), a.dx.data(), M, N);
    } else if (op == "batchnorm") {
      if constexpr (is_half_v<T>) {
        cpu::batchnorm_forward_train_lowp(a.x.data(), a.p0.data(), a.p1.data(), a.y.data(),
                                          a.s0.data(), a.s1.data(), a.g0.data(), a.g1.data(), kN,
                                          kC, kH * kW, 0.1, 1e-5);
      } else {
        cpu::batchnorm_forward_train(a.x.data(), a.p0.data(), a.p1.data(), a.y.data(), a.s0.data(),
                                     a.s1.data(), a.g0.data(), a.g1.data(), kN, kC, kH * kW, 0.1,
                                     1e-5);
      }
    } else if (op == "batchnorm bwd") {
      if constexpr (is_half_v<T>) {
        cpu::batchnorm_backward_lowp(a.dy.data(), a.x.data(), a.p0.data(), a.s0.data(), a.s1.data(),
                                     a.dx.data(), a.g0.data(), a.g1.data(), kN, kC, kH * kW);
      } else {
        cpu::batchnorm_backward(a.dy.data(), a.x.data(), a.p0.data(), a.s0.data(), a.s1.data(),
                                a.dx.data(), a.g0.data(), a.g1.data(), kN, kC, kH * kW);
      }
    } else if (op == "max_pool2d 3x3/2") {
      cpu::maxpool2d_forward(a.x.data(), a.y.data(), a.argmax.data(), pool);
    } else if (op == "max_pool2d bwd") {
      cpu::maxpool2d_backward(a.dy.data(), a.argmax.data(), a.dx.data(), pool);
    } else if (op == "avg_pool2d 3x3/2") {
      cpu::avgpool2d_forward(a.x.data(), a.y.data(), pool);
    } else if (op == "avg_pool2d bwd") {
      cpu::avgpool2d_backward(a.dy.data(), a.dx.data(), pool);
    } else if (op == "upsample2x bilinear") {
      cpu::upsample2x_bilinear_forward(a.x.data(), a.y.data(), kN * kC, kH, kW);
    } else if (op == "upsample bilinear bwd") {
      cpu::upsample2x_bilinear_backward(a.dy.data(), a.dx.data(), kN * kC, kH, kW);
    } else if (op == "upsample nearest bwd") {
      cpu::upsample2x_nearest_backward(a.dy.data(), a.dx.data(), kN * kC, kH, kW);
    } else {
      FAIL("no bench op ", op);
    }
  }
};

}  // namespace

TEST_CASE("bench: f32, bf16 and f16 CPU kernels of the follow-class and norm ops" *
          doctest::skip()) {
  const std::vector<std::string> ops = {"relu",
                                        "gelu",
                                        "dropout",
                                        "layernorm",
                                        "layernorm bwd",
                                        "rmsnorm",
                                        "rmsnorm bwd",
                                        "softmax",
                                        "softmax bwd",
                                        "batchnorm",
                                        "batchnorm bwd",
                                        "max_pool2d 3x3/2",
                                        "max_pool2d bwd",
                                        "avg_pool2d 3x3/2",
                                        "avg_pool2d bwd",
                                        "upsample2x bilinear",
                                        "upsample bilinear bwd",
                                        "upsample nearest bwd"};
  const int64_t n = BenchOps<float>::kNumel;
  BenchArrays<float> af(n);
  BenchArrays<bfloat16> ab(n);
  BenchArrays<float16> ah(n);
  BenchOps<float> f{af};
  BenchOps<bfloat16> b{ab};
  BenchOps<float16> h{ah};
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  std::printf(
      "CPU, 1 thread, ms (median of 7 interleaved runs); rows (4096, 1024), images "
      "(32, 64, 32, 32), pools 3x3 stride 2 pad 1\n");
  std::printf("%-24s %9s %9s %9s %10s %10s\n", "op", "f32", "bf16", "f16", "bf16/f32", "f16/f32");
  const auto ms = [](auto&& fn) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    return 1e3 * std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  for (const std::string& op : ops) {
    std::vector<double> tf, tb, th;
    f.run(op);  // warm-up; the backward cases read what the forward ones before them wrote
    b.run(op);
    h.run(op);
    for (int r = 0; r < 7; ++r) {
      tf.push_back(ms([&] { f.run(op); }));
      tb.push_back(ms([&] { b.run(op); }));
      th.push_back(ms([&] { h.run(op); }));
    }
    const double mf = median(tf), mb = median(tb), mh = median(th);
    std::printf("%-24s %9.2f %9.2f %9.2f %10.2f %10.2f\n", op.c_str(), mf, mb, mh, mb / mf,
                mh / mf);
  }
  omp_set_num_threads(before);
}
