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

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"
#include "regen/autograd/ops_unary.h"
#include "regen/autograd/tape.h"
#include "regen/core/half.h"
#include "regen/core/tensor.h"
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

TEST_CASE_TEMPLATE("amp ops: embedding gathers 16-bit rows; repeated ids round per add", H,
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
