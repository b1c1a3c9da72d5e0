// upsample2x (nearest, bilinear) and conv_transpose2d: forward and backward values against values
// computed by PyTorch 1.13 and against plain loops written from PyTorch's definitions (bilinear:
// the general source-index formula; transposed convolution: the scatter y[p*s - pad + r] +=
// x[p] w[r]), in f32 and f64; determinism across thread counts; the error messages. Gradients are
// checked by finite differences in tests/test_gradcheck_upsample.cpp.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "regen/autograd/ops.h"
#include "regen/kernels/kernels.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::expect_error;

namespace {

template <class T>
Tensor rand_t(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return uniform(s, -1.0, 1.0, g, dtype_of<T>::value);
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
  const double tol = std::is_same<T, float>::value ? 2e-5 : 1e-12;
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": sizes differ");
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (!(err <= tol * (1 + std::fabs(static_cast<double>(want[i])))) && bad++ < 5) {
      MESSAGE(what, ": element ", i, " got ", got[i], " want ", want[i]);
    }
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), " elements out of tolerance");
}

// ---- Upsampling references
// ------------------------------------------------------------------------

// PyTorch's bilinear source index (align_corners=False, scale factor 2) for output i of an axis
// of extent n: src = max((i + 0.5) * 0.5 - 0.5, 0), i0 = floor(src), i1 = min(i0 + 1, n - 1).
void bilinear_source(int64_t i, int64_t n, int64_t& i0, int64_t& i1, double& l1) {
  const double src = std::max((static_cast<double>(i) + 0.5) * 0.5 - 0.5, 0.0);
  i0 = static_cast<int64_t>(std::floor(src));
  i1 = std::min(i0 + 1, n - 1);
  l1 = src - static_cast<double>(i0);
}

// Forward (y) and, by scattering dy with the same weights, backward (dx) of the upsampling.
template <class T>
void ref_upsample(bool bilinear, const std::vector<T>& x, const std::vector<T>& dy, int64_t NC,
                  int64_t H, int64_t W, std::vector<T>& y, std::vector<T>& dx) {
  std::vector<double> yd(static_cast<size_t>(NC * 4 * H * W)), dxd(x.size(), 0.0);
  for (int64_t i = 0; i < NC; ++i)
    for (int64_t oh = 0; oh < 2 * H; ++oh)
      for (int64_t ow = 0; ow < 2 * W; ++ow) {
        int64_t h[2], w[2];
        double lh[2], lw[2];
        if (bilinear) {
          bilinear_source(oh, H, h[0], h[1], lh[1]);
          bilinear_source(ow, W, w[0], w[1], lw[1]);
        } else {  // mode='nearest': src = floor(i * 0.5)
          h[0] = h[1] = oh / 2;
          w[0] = w[1] = ow / 2;
          lh[1] = lw[1] = 0.0;
        }
        lh[0] = 1 - lh[1];
        lw[0] = 1 - lw[1];
        const size_t o = static_cast<size_t>((i * 2 * H + oh) * 2 * W + ow);
        double acc = 0;
        for (int a = 0; a < 2; ++a)
          for (int b = 0; b < 2; ++b) {
            const size_t xi = static_cast<size_t>((i * H + h[a]) * W + w[b]);
            acc += lh[a] * lw[b] * static_cast<double>(x[xi]);
            dxd[xi] += lh[a] * lw[b] * static_cast<double>(dy[o]);
          }
        yd[o] = acc;
      }
  y.assign(yd.begin(), yd.end());
  dx.assign(dxd.begin(), dxd.end());
}

template <class T>
void check_upsample(bool bilinear, const Shape& xs, uint64_t seed) {
  const std::string name = std::string(dtype_name(dtype_of<T>::value)) +
                           (bilinear ? " bilinear " : " nearest ") + shape_str(xs);
  const int64_t NC = xs[0] * xs[1], H = xs[2], W = xs[3];
  Tensor x = rand_t<T>(xs, seed).set_requires_grad(true);
  Tensor dy = rand_t<T>({xs[0], xs[1], 2 * H, 2 * W}, seed + 1);
  std::vector<T> want_y, want_dx;
  ref_upsample<T>(bilinear, x.to_vector<T>(), dy.to_vector<T>(), NC, H, W, want_y, want_dx);
  Tensor y = upsample2x(x, bilinear ? UpsampleMode::bilinear : UpsampleMode::nearest);
  CHECK(y.shape() == Shape{xs[0], xs[1], 2 * H, 2 * W});
  expect_close(name + " forward", y.to_vector<T>(), want_y);
  Tape::current().backward(y, dy);
  expect_close(name + " backward", x.grad().to_vector<T>(), want_dx);
}

// ---- Transposed convolution reference
// ------------------------------------------------------------

struct ConvTCase {
  int64_t N, Cin, H, W, Cout, kh, kw, sh, sw, ph, pw, oph, opw;
};

// y[n, co, p*sh - ph + r, q*sw - pw + t] += x[n, ci, p, q] w[ci, co, r, t] (+ bias), and the
// adjoints: dx[n, ci, p, q] = sum dy[...] w, dw[ci, co, r, t] = sum dy[...] x, db = sum dy.
template <class T>
void ref_conv_transpose(const ConvTCase& c, const std::vector<T>& x, const std::vector<T>& w,
                        const std::vector<T>& b, const std::vector<T>& dy, std::vector<T>& y,
                        std::vector<T>& dx, std::vector<T>& dw, std::vector<T>& db) {
  const int64_t Ho = (c.H - 1) * c.sh - 2 * c.ph + c.kh + c.oph;
  const int64_t Wo = (c.W - 1) * c.sw - 2 * c.pw + c.kw + c.opw;
  std::vector<double> yd(static_cast<size_t>(c.N * c.Cout * Ho * Wo), 0.0);
  std::vector<double> dxd(x.size(), 0.0), dwd(w.size(), 0.0), dbd(b.size(), 0.0);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t co = 0; co < c.Cout; ++co)
      for (int64_t i = 0; i < Ho * Wo; ++i) {
        const size_t o = static_cast<size_t>((n * c.Cout + co) * Ho * Wo + i);
        yd[o] += static_cast<double>(b[co]);
        dbd[co] += static_cast<double>(dy[o]);
      }
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t ci = 0; ci < c.Cin; ++ci)
      for (int64_t p = 0; p < c.H; ++p)
        for (int64_t q = 0; q < c.W; ++q)
          for (int64_t co = 0; co < c.Cout; ++co)
            for (int64_t r = 0; r < c.kh; ++r)
              for (int64_t t = 0; t < c.kw; ++t) {
                const int64_t oh = p * c.sh - c.ph + r, ow = q * c.sw - c.pw + t;
                if (oh < 0 || oh >= Ho || ow < 0 || ow >= Wo) continue;
                const size_t xi = static_cast<size_t>(((n * c.Cin + ci) * c.H + p) * c.W + q);
                const size_t wi = static_cast<size_t>(((ci * c.Cout + co) * c.kh + r) * c.kw + t);
                const size_t o = static_cast<size_t>(((n * c.Cout + co) * Ho + oh) * Wo + ow);
                yd[o] += static_cast<double>(x[xi]) * static_cast<double>(w[wi]);
                dxd[xi] += static_cast<double>(dy[o]) * static_cast<double>(w[wi]);
                dwd[wi] += static_cast<double>(dy[o]) * static_cast<double>(x[xi]);
              }
  y.assign(yd.begin(), yd.end());
  dx.assign(dxd.begin(), dxd.end());
  dw.assign(dwd.begin(), dwd.end());
  db.assign(dbd.begin(), dbd.end());
}

template <class T>
void check_conv_transpose(const ConvTCase& c, uint64_t seed) {
  const std::string name =
      std::string(dtype_name(dtype_of<T>::value)) + " conv_transpose2d x[" + std::to_string(c.N) +
      "," + std::to_string(c.Cin) + "," + std::to_string(c.H) + "," + std::to_string(c.W) + "] w[" +
      std::to_string(c.Cin) + "," + std::to_string(c.Cout) + "," + std::to_string(c.kh) + "," +
      std::to_string(c.kw) + "] s" + std::to_string(c.sh) + "x" + std::to_string(c.sw) + " p" +
      std::to_string(c.ph) + "x" + std::to_string(c.pw) + " op" + std::to_string(c.oph) + "x" +
      std::to_string(c.opw);
  Tensor x = rand_t<T>({c.N, c.Cin, c.H, c.W}, seed).set_requires_grad(true);
  Tensor w = rand_t<T>({c.Cin, c.Cout, c.kh, c.kw}, seed + 1).set_requires_grad(true);
  Tensor b = rand_t<T>({c.Cout}, seed + 2).set_requires_grad(true);
  Tensor y = conv_transpose2d(x, w, b, c.sh, c.sw, c.ph, c.pw, c.oph, c.opw);
  const int64_t Ho = (c.H - 1) * c.sh - 2 * c.ph + c.kh + c.oph;
  const int64_t Wo = (c.W - 1) * c.sw - 2 * c.pw + c.kw + c.opw;
  REQUIRE_MESSAGE((y.shape() == Shape{c.N, c.Cout, Ho, Wo}), name);
  Tensor dy = rand_t<T>(y.shape(), seed + 3);
  std::vector<T> want_y, want_dx, want_dw, want_db;
  ref_conv_transpose<T>(c, x.to_vector<T>(), w.to_vector<T>(), b.to_vector<T>(), dy.to_vector<T>(),
                        want_y, want_dx, want_dw, want_db);
  expect_close(name + " forward", y.to_vector<T>(), want_y);
  Tape::current().backward(y, dy);
  expect_close(name + " dx", x.grad().to_vector<T>(), want_dx);
  expect_close(name + " dw", w.grad().to_vector<T>(), want_dw);
  expect_close(name + " dbias", b.grad().to_vector<T>(), want_db);
  // Without bias the forward is the same minus the bias.
  Tensor y0;
  {
    NoGradScope no_grad;
    y0 = conv_transpose2d(x, w, Tensor(), c.sh, c.sw, c.ph, c.pw, c.oph, c.opw);
  }
  std::vector<T> want_y0 = want_y;
  const std::vector<T> bv = b.to_vector<T>();
  for (size_t i = 0; i < want_y0.size(); ++i) want_y0[i] -= bv[i / (Ho * Wo) % c.Cout];
  expect_close(name + " forward without bias", y0.to_vector<T>(), want_y0);
}

}  // namespace

// ---- upsample2x ---------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("upsample2x matches PyTorch's F.interpolate(scale_factor=2)", T, float, double) {
  // Produced with PyTorch 1.13 (float64): x = ((5 i) % 7 - 3) / 4, dy = ((3 i) % 5 - 2) / 2 for
  // flat index i; F.interpolate(x, scale_factor=2, mode='nearest') and mode='bilinear',
  // align_corners=False, then .backward(dy). Every value is a short binary fraction, so f32 and
  // f64 must match exactly.
  const std::vector<double> xv = {-0.75, 0.5,   0.0, -0.5, 0.75, 0.25,
                                  -0.25, -0.75, 0.5, 0.0,  -0.5, 0.75};
  const std::vector<double> nearest = {
      -0.75, -0.75, 0.5,   0.5,   0.0,  0.0,  -0.75, -0.75, 0.5,   0.5,   0.0,  0.0,
      -0.5,  -0.5,  0.75,  0.75,  0.25, 0.25, -0.5,  -0.5,  0.75,  0.75,  0.25, 0.25,
      -0.25, -0.25, -0.75, -0.75, 0.5,  0.5,  -0.25, -0.25, -0.75, -0.75, 0.5,  0.5,
      0.0,   0.0,   -0.5,  -0.5,  0.75, 0.75, 0.0,   0.0,   -0.5,  -0.5,  0.75, 0.75};
  const std::vector<double> bilinear = {
      -0.75,   -0.4375, 0.1875,  0.375,  0.125,  0.0,     -0.6875, -0.375,  0.25,    0.4375,
      0.1875,  0.0625,  -0.5625, -0.25,  0.375,  0.5625,  0.3125,  0.1875,  -0.5,    -0.1875,
      0.4375,  0.625,   0.375,   0.25,   -0.25,  -0.375,  -0.625,  -0.4375, 0.1875,  0.5,
      -0.1875, -0.3125, -0.5625, -0.375, 0.25,   0.5625,  -0.0625, -0.1875, -0.4375, -0.25,
      0.375,   0.6875,  0.0,     -0.125, -0.375, -0.1875, 0.4375,  0.75};
  const std::vector<double> nearest_dx = {-0.5, 1.5, -1.5, 1.5, -1.5, 0.5,
                                          -1.5, 0.5, 0.0,  0.5, 0.0,  -0.5};
  const std::vector<double> bilinear_dx = {-0.40625, 0.6875,  -1.03125, 1.03125, -0.6875, 0.40625,
                                           -1.09375, 0.46875, 0.0,      0.34375, 0.03125, -0.75};
  std::vector<double> dyv(48);
  for (size_t i = 0; i < dyv.size(); ++i)
    dyv[i] = static_cast<double>(static_cast<int>(3 * i % 5) - 2) / 2;
  const Tensor dy = from_vector<T>(cast<T>(dyv), {1, 2, 4, 6});
  for (bool bl : {false, true}) {
    Tensor x = from_vector<T>(cast<T>(xv), {1, 2, 2, 3}).set_requires_grad(true);
    Tensor y = upsample2x(x, bl ? UpsampleMode::bilinear : UpsampleMode::nearest);
    CHECK(y.shape() == Shape{1, 2, 4, 6});
    CHECK(y.to_vector<T>() == cast<T>(bl ? bilinear : nearest));
    Tape::current().backward(y, dy);
    CHECK(x.grad().to_vector<T>() == cast<T>(bl ? bilinear_dx : nearest_dx));
  }
}

TEST_CASE_TEMPLATE("upsample2x forward and backward match loops over PyTorch's definitions", T,
                   float, double) {
  uint64_t seed = 10;
  for (const Shape& s : {Shape{2, 3, 5, 4}, Shape{1, 1, 1, 1}, Shape{1, 2, 1, 6}, Shape{3, 1, 7, 1},
                         Shape{1, 2, 2, 2}, Shape{2, 4, 33, 17}}) {
    check_upsample<T>(false, s, seed += 2);
    check_upsample<T>(true, s, seed += 2);
  }
}

TEST_CASE("upsample2x gives the same bits with 1 and 2 threads") {
  Tensor x = rand_t<float>({4, 8, 40, 30}, 3), dy = rand_t<float>({4, 8, 80, 60}, 4);
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    std::vector<std::vector<float>> out;
    for (bool bl : {false, true}) {
      Tensor y = empty(dy.shape()), dx = empty(x.shape());
      if (bl) {
        cpu::upsample2x_bilinear_forward<float>(x.data<float>(), y.data<float>(), 32, 40, 30);
        cpu::upsample2x_bilinear_backward<float>(dy.data<float>(), dx.data<float>(), 32, 40, 30);
      } else {
        cpu::upsample2x_nearest_forward<float>(x.data<float>(), y.data<float>(), 32, 40, 30);
        cpu::upsample2x_nearest_backward<float>(dy.data<float>(), dx.data<float>(), 32, 40, 30);
      }
      out.push_back(y.to_vector<float>());
      out.push_back(dx.to_vector<float>());
    }
    omp_set_num_threads(saved);
    return out;
  };
  CHECK(run(1) == run(2));
}

TEST_CASE("upsample2x rejects bad input with messages naming the op and the shapes") {
  expect_error([] { upsample2x(zeros({2, 3, 4})); }, {"upsample2x: input [2, 3, 4] must be 4-D"});
  expect_error(
      [] {
        upsample2x(zeros({1, 2, 0, 3}), UpsampleMode::bilinear);
      },
      {"upsample2x: input [1, 2, 0, 3] has an empty plane"});
  expect_error(
      [] {
        upsample2x(zeros({1, 1, 2, 2}, DType::i64));
      },
      {"upsample2x: expected a floating-point tensor"});
  expect_error(
      [] {
        upsample2x(zeros({1, 1, 2, 2}), static_cast<UpsampleMode>(7));
      },
      {"upsample2x: unknown mode 7"});
  expect_error([] { upsample2x(Tensor()); }, {"upsample2x: input is undefined"});
  auto impl = std::make_shared<TensorImpl>();  // shape only: enough to reach the check
  impl->shape = {1, 1, 32768, 16384};
  expect_error([&] { upsample2x(Tensor(impl)); },
               {"upsample2x: input plane of [1, 1, 32768, 16384] is too large"});
}

// ---- conv_transpose2d
// -----------------------------------------------------------------------------

TEST_CASE_TEMPLATE("conv_transpose2d matches PyTorch's F.conv_transpose2d, forward and backward", T,
                   float, double) {
  // Produced with PyTorch 1.13 (float64): x = ((3 i) % 8 - 4) / 4 of shape (1, 2, 2, 3),
  // w = ((7 i) % 11 - 5) / 8 of shape (2, 3, 3, 3), bias (0.5, -0.25, 1),
  // y = F.conv_transpose2d(x, w, bias, stride=2, padding=1, output_padding=1), shape (1, 3, 4, 6),
  // then y.backward(dy) with dy = ((5 i) % 7 - 3) / 4. Exact binary fractions in f32 and f64.
  std::vector<double> xv(12), wv(54), dyv(72);
  for (size_t i = 0; i < xv.size(); ++i)
    xv[i] = static_cast<double>(static_cast<int>(3 * i % 8) - 4) / 4;
  for (size_t i = 0; i < wv.size(); ++i)
    wv[i] = static_cast<double>(static_cast<int>(7 * i % 11) - 5) / 8;
  for (size_t i = 0; i < dyv.size(); ++i)
    dyv[i] = static_cast<double>(static_cast<int>(5 * i % 7) - 3) / 4;
  const std::vector<double> want_y = {
      0.1875,   0.65625,  0.5625,  1.375,   0.1875,  0.4375,  0.0625,   0.84375,  0.8125,
      1.25,     0.0625,   0.3125,  0.3125,  0.5625,  0.6875,  1.28125,  0.3125,   0.3125,
      0.4375,   0.625,    0.625,   1.21875, 0.3125,  0.3125,  0.0,      -0.5625,  -0.1875,
      -0.90625, -0.375,   0.5625,  0.25,    0.5,     -0.125,  -1.21875, -0.5,     0.4375,
      -0.0625,  -0.34375, -0.25,   -0.6875, -0.4375, 0.59375, 0.0625,   -0.28125, -0.3125,
      -0.75,    -0.4375,  0.59375, 1.8125,  0.5625,  1.0625,  0.875,    1.0625,   0.625,
      1.0625,   0.4375,   0.59375, 1.0625,  1.625,   0.5,     1.5625,   0.75,     0.8125,
      1.0625,   0.8125,   0.8125,  0.65625, 0.8125,  0.75,    1.0,      1.84375,  0.8125};
  const std::vector<double> want_dx = {0.53125,  -0.6875, -0.1875, 0.0,  1.0625, -0.59375,
                                       -0.78125, 0.75,    0.78125, 0.25, 0.0625, 0.71875};
  const std::vector<double> want_dw = {
      0.0,     -0.1875, 1.125,   0.0,    0.9375,  -0.4375, -0.375, -0.3125, 0.9375,
      0.1875,  -0.1875, -0.1875, 0.25,   -0.125,  -0.625,  -0.125, 0.8125,  -0.125,
      0.375,   -0.1875, -0.1875, -0.375, -0.3125, 0.9375,  0.125,  -0.25,   -0.3125,
      -0.375,  0.6875,  -0.375,  0.125,  -0.8125, 0.0625,  0.5,    0.0625,  -0.8125,
      -0.4375, 0.5625,  0.8125,  -0.125, 0.5,     -0.375,  0.25,   0.0625,  0.5,
      -0.5,    -0.4375, 0.6875,  0.5,    0.0625,  -0.8125, 0.0,    0.5,     0.0625};
  const std::vector<double> want_db = {-0.25, 0.5, -0.5};
  Tensor x = from_vector<T>(cast<T>(xv), {1, 2, 2, 3}).set_requires_grad(true);
  Tensor w = from_vector<T>(cast<T>(wv), {2, 3, 3, 3}).set_requires_grad(true);
  Tensor b = from_vector<T>(cast<T>({0.5, -0.25, 1.0}), {3}).set_requires_grad(true);
  Tensor y = conv_transpose2d(x, w, b, 2, 1, 1);
  REQUIRE(y.shape() == Shape{1, 3, 4, 6});
  CHECK(y.to_vector<T>() == cast<T>(want_y));
  Tape::current().backward(y, from_vector<T>(cast<T>(dyv), {1, 3, 4, 6}));
  CHECK(x.grad().to_vector<T>() == cast<T>(want_dx));
  CHECK(w.grad().to_vector<T>() == cast<T>(want_dw));
  CHECK(b.grad().to_vector<T>() == cast<T>(want_db));
}

TEST_CASE_TEMPLATE("conv_transpose2d forward and backward match scatter loops", T, float, double) {
  const ConvTCase cases[] = {
      {2, 3, 4, 5, 2, 2, 2, 2, 2, 0, 0, 0, 0},     // U-Net's 2x2 stride-2 upsampling
      {1, 4, 3, 3, 3, 3, 3, 2, 2, 1, 1, 1, 1},     // 3x3 stride 2 with output padding
      {2, 2, 5, 4, 3, 3, 3, 1, 1, 1, 1, 0, 0},     // stride 1 (the flipped-conv path of conv2d)
      {1, 3, 12, 11, 2, 3, 3, 1, 1, 0, 0, 0, 0},   // stride 1, planes of 100+ pixels
      {2, 5, 3, 4, 4, 1, 1, 1, 1, 0, 0, 0, 0},     // 1x1
      {1, 2, 4, 3, 3, 3, 2, 3, 2, 1, 0, 2, 1},     // asymmetric everything
      {1, 1, 1, 1, 1, 4, 4, 1, 1, 0, 0, 0, 0},     // one pixel spread by the whole kernel
      {2, 3, 3, 3, 2, 5, 5, 1, 1, 3, 3, 0, 0},     // padding larger than half the kernel
      {2, 17, 9, 10, 20, 4, 4, 2, 2, 1, 1, 0, 0},  // GEMM panels past one register tile
  };
  uint64_t seed = 200;
  for (const ConvTCase& c : cases) check_conv_transpose<T>(c, seed += 10);
}

TEST_CASE("conv_transpose2d: only the bias, or only the weight, needs a gradient") {
  Tensor x = rand_t<double>({2, 3, 4, 4}, 1), w = rand_t<double>({3, 2, 3, 3}, 2);
  Tensor b = rand_t<double>({2}, 3).set_requires_grad(true);
  Tensor y = conv_transpose2d(x, w, b, 2, 1, 1);
  Tensor dy = rand_t<double>(y.shape(), 4);
  Tape::current().backward(y, dy);
  std::vector<double> want(2, 0.0);
  const std::vector<double> dyv = dy.to_vector<double>();
  const size_t plane = static_cast<size_t>(y.size(2) * y.size(3));
  for (size_t i = 0; i < dyv.size(); ++i) want[i / plane % 2] += dyv[i];
  expect_close<double>("dbias only", b.grad().to_vector<double>(), want);
  CHECK(!x.requires_grad());

  w.set_requires_grad(true);
  Tensor y2 = conv_transpose2d(x, w, Tensor(), 2, 1, 1);
  Tape::current().backward(y2, dy);
  Tensor w2 = w.clone().set_requires_grad(true);
  Tensor b2 = b.clone().set_requires_grad(true);
  Tape::current().backward(conv_transpose2d(x, w2, b2, 2, 1, 1), dy);
  CHECK(w.grad().to_vector<double>() == w2.grad().to_vector<double>());  // same launcher, same bits
}

TEST_CASE("conv_transpose2d rejects bad input with messages naming the op and the shapes") {
  Tensor x = zeros({2, 3, 4, 4}), w = zeros({3, 5, 3, 3});
  expect_error(
      [&] {
        conv_transpose2d(x, zeros({4, 5, 3, 3}));
      },
      {"conv_transpose2d: input [2, 3, 4, 4] has 3 channels but weight [4, 5, 3, 3] "
       "expects 4"});
  expect_error(
      [&] {
        conv_transpose2d(zeros({3, 4, 4}), w);
      },
      {"conv_transpose2d: input [3, 4, 4] must be 4-D"});
  expect_error(
      [&] {
        conv_transpose2d(x, zeros({3, 5, 3}));
      },
      {"conv_transpose2d: weight [3, 5, 3] must be 4-D (C_in, C_out, kH, kW)"});
  expect_error([&] { conv_transpose2d(x, w, zeros({3})); },
               {"conv_transpose2d: bias [3] does not match weight [3, 5, 3, 3] (expected [5])"});
  expect_error([&] { conv_transpose2d(x, w, Tensor(), 2, 1, 2); },
               {"conv_transpose2d: output padding 2x2 must be non-negative and smaller than the "
                "stride 2x2",
                "[2, 3, 4, 4]"});
  expect_error([&] { conv_transpose2d(x, w, Tensor(), 0); },
               {"conv_transpose2d: stride 0x0 must be positive", "[3, 5, 3, 3]"});
  expect_error([&] { conv_transpose2d(x, w, Tensor(), 1, -1); },
               {"conv_transpose2d: padding -1x-1 must be non-negative"});
  expect_error(
      [&] {
        conv_transpose2d(zeros({1, 3, 1, 1}), w, Tensor(), 1, 2);
      },
      {"conv_transpose2d: input [1, 3, 1, 1] with weight [3, 5, 3, 3], stride 1x1 and "
       "padding 2x2 gives an empty output -1x-1"});
  expect_error([&] { conv_transpose2d(x, w.to(DType::f64)); },
               {"conv_transpose2d", "dtype mismatch"});
  expect_error([&] { conv_transpose2d(x, w, zeros({5}, DType::f64)); },
               {"conv_transpose2d", "dtype mismatch"});
  expect_error([&] { conv_transpose2d(Tensor(), w); }, {"conv_transpose2d: input is undefined"});
  expect_error([&] { conv_transpose2d(x, Tensor()); }, {"conv_transpose2d: weight is undefined"});
  expect_error(
      [&] {
        conv_transpose2d(zeros({2, 3, 4, 4}, DType::i32), w);
      },
      {"conv_transpose2d: expected a floating-point tensor"});
}
