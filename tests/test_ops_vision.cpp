// Forward values of conv2d (and its two backward launchers) and of max/avg pooling against plain
// nested loops, in f32 and f64 (global_avg_pool's values: the op table's row, against PyTorch);
// batchnorm2d running statistics and replay; transpose and permute values; determinism; and the
// error messages of every vision op. Gradients are checked by finite differences in
// tests/test_gradcheck_vision.cpp.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "regen/autograd/op_list.h"
#include "regen/autograd/ops.h"
#include "regen/kernels/cpu/conv2d_lowp.h"
#include "regen/kernels/cpu/conv2d_winograd.h"
#include "regen/kernels/kernels.h"
#include "regen/session/records.h"
#include "tests/test_util.h"

using namespace regen;
using regen::testing::expect_error;

namespace {

template <class T>
Tensor rand_t(const Shape& s, uint64_t seed, double lo = -1, double hi = 1) {
  Generator g(seed);
  return uniform(s, lo, hi, g, dtype_of<T>::value);
}

// |got - want| <= atol + rtol*|want| everywhere; prints the first mismatches and the worst one.
template <class T>
void expect_close(const std::string& what, const std::vector<T>& got, const std::vector<T>& want,
                  double atol, double rtol) {
  REQUIRE_MESSAGE(got.size() == want.size(), what, ": sizes differ");
  int bad = 0;
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    const double tol = atol + rtol * std::fabs(static_cast<double>(want[i]));
    if (err > tol && bad++ < 5) {
      MESSAGE(what, ": element ", i, " got ", got[i], " want ", want[i]);
    }
    if (err > worst) {
      worst = err;
      worst_at = i;
    }
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " of ", got.size(), " elements out of tolerance, worst ",
                worst, " at ", worst_at);
}

template <class T>
double atol_for() {
  return std::is_same<T, float>::value ? 2e-4 : 1e-11;
}
template <class T>
double rtol_for() {
  return std::is_same<T, float>::value ? 1e-4 : 1e-11;
}

// ---- Plain-loop references (double accumulation) ------------------------------------------------

template <class T>
std::vector<T> ref_conv_forward(const std::vector<T>& x, const std::vector<T>& w, const T* bias,
                                const ConvShape& s) {
  std::vector<T> y(static_cast<size_t>(s.N * s.K * s.P * s.Q));
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t p = 0; p < s.P; ++p)
        for (int64_t q = 0; q < s.Q; ++q) {
          double acc = bias ? static_cast<double>(bias[k]) : 0.0;
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t r = 0; r < s.R; ++r)
              for (int64_t t = 0; t < s.S; ++t) {
                const int64_t h = p * s.stride_h - s.pad_h + r, v = q * s.stride_w - s.pad_w + t;
                if (h < 0 || h >= s.H || v < 0 || v >= s.W) continue;
                acc += static_cast<double>(x[((n * s.C + c) * s.H + h) * s.W + v]) *
                       static_cast<double>(w[((k * s.C + c) * s.R + r) * s.S + t]);
              }
          y[((n * s.K + k) * s.P + p) * s.Q + q] = static_cast<T>(acc);
        }
  return y;
}

// dx and dw by the same loops, scattering instead of gathering.
template <class T>
void ref_conv_backward(const std::vector<T>& x, const std::vector<T>& w, const std::vector<T>& dy,
                       const ConvShape& s, std::vector<T>& dx, std::vector<T>& dw) {
  std::vector<double> gx(x.size(), 0.0), gw(w.size(), 0.0);
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t p = 0; p < s.P; ++p)
        for (int64_t q = 0; q < s.Q; ++q) {
          const double g = static_cast<double>(dy[((n * s.K + k) * s.P + p) * s.Q + q]);
          for (int64_t c = 0; c < s.C; ++c)
            for (int64_t r = 0; r < s.R; ++r)
              for (int64_t t = 0; t < s.S; ++t) {
                const int64_t h = p * s.stride_h - s.pad_h + r, v = q * s.stride_w - s.pad_w + t;
                if (h < 0 || h >= s.H || v < 0 || v >= s.W) continue;
                const size_t xi = static_cast<size_t>(((n * s.C + c) * s.H + h) * s.W + v);
                const size_t wi = static_cast<size_t>(((k * s.C + c) * s.R + r) * s.S + t);
                gx[xi] += g * static_cast<double>(w[wi]);
                gw[wi] += g * static_cast<double>(x[xi]);
              }
        }
  dx.assign(gx.begin(), gx.end());
  dw.assign(gw.begin(), gw.end());
}

struct ConvCase {
  int64_t N, C, H, W, K, R, S, sh, sw, ph, pw;
};

// Forward through the op (with and without bias) and both backward launchers against the loops.
template <class T>
void check_conv(const ConvCase& c, uint64_t seed) {
  const ConvShape s = make_conv_shape(c.N, c.C, c.H, c.W, c.K, c.R, c.S, c.sh, c.sw, c.ph, c.pw);
  const std::string name =
      std::string(dtype_name(dtype_of<T>::value)) + " conv x[" + std::to_string(c.N) + "," +
      std::to_string(c.C) + "," + std::to_string(c.H) + "," + std::to_string(c.W) + "] k" +
      std::to_string(c.R) + "x" + std::to_string(c.S) + " s" + std::to_string(c.sh) + "x" +
      std::to_string(c.sw) + " p" + std::to_string(c.ph) + "x" + std::to_string(c.pw);
  Tensor x = rand_t<T>({c.N, c.C, c.H, c.W}, seed), w = rand_t<T>({c.K, c.C, c.R, c.S}, seed + 1);
  Tensor b = rand_t<T>({c.K}, seed + 2), dy = rand_t<T>({s.N, s.K, s.P, s.Q}, seed + 3);
  const std::vector<T> xv = x.to_vector<T>(), wv = w.to_vector<T>(), bv = b.to_vector<T>();
  const double atol = atol_for<T>(), rtol = rtol_for<T>();
  Tensor y = conv2d(x, w, b, c.sh, c.sw, c.ph, c.pw);
  CHECK(y.shape() == Shape{s.N, s.K, s.P, s.Q});
  expect_close(name + " forward+bias", y.to_vector<T>(), ref_conv_forward(xv, wv, bv.data(), s),
               atol, rtol);
  Tensor y0 = conv2d(x, w, Tensor(), c.sh, c.sw, c.ph, c.pw);
  expect_close(name + " forward", y0.to_vector<T>(), ref_conv_forward<T>(xv, wv, nullptr, s), atol,
               rtol);

  std::vector<T> want_dx, want_dw;
  ref_conv_backward(xv, wv, dy.to_vector<T>(), s, want_dx, want_dw);
  Tensor dx = full(x.shape(), 123.0, x.dtype());  // stale values must be overwritten
  cpu::conv2d_backward_data<T>(dy.data<T>(), w.data<T>(), dx.data<T>(), s);
  expect_close(name + " backward-data", dx.to_vector<T>(), want_dx, atol, rtol);
  Tensor dw = full(w.shape(), 123.0, w.dtype()), db = full({c.K}, 123.0, w.dtype());
  cpu::conv2d_backward_filter<T>(x.data<T>(), dy.data<T>(), dw.data<T>(), db.data<T>(), s);
  expect_close(name + " backward-filter", dw.to_vector<T>(), want_dw, atol, rtol);
  std::vector<T> want_db(static_cast<size_t>(c.K), T(0));
  const std::vector<T> dyv = dy.to_vector<T>();
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t k = 0; k < s.K; ++k)
      for (int64_t i = 0; i < s.P * s.Q; ++i) want_db[k] += dyv[(n * s.K + k) * s.P * s.Q + i];
  expect_close(name + " dbias", db.to_vector<T>(), want_db, atol, rtol);
}

template <class T>
std::vector<T> ref_pool(const std::vector<T>& x, const PoolShape& s, bool max,
                        std::vector<int32_t>* argmax = nullptr) {
  std::vector<T> y(static_cast<size_t>(s.N * s.C * s.P * s.Q));
  if (argmax) argmax->assign(y.size(), -1);
  for (int64_t i = 0; i < s.N * s.C; ++i)
    for (int64_t p = 0; p < s.P; ++p)
      for (int64_t q = 0; q < s.Q; ++q) {
        double acc = 0, best = -INFINITY;
        int32_t best_at = -1;
        for (int64_t r = 0; r < s.kh; ++r)
          for (int64_t t = 0; t < s.kw; ++t) {
            const int64_t h = p * s.stride_h - s.pad_h + r, v = q * s.stride_w - s.pad_w + t;
            if (h < 0 || h >= s.H || v < 0 || v >= s.W) continue;  // padding: 0 in the sum
            const double val = static_cast<double>(x[(i * s.H + h) * s.W + v]);
            acc += val;
            if (val > best) {
              best = val;
              best_at = static_cast<int32_t>(h * s.W + v);
            }
          }
        const size_t o = static_cast<size_t>((i * s.P + p) * s.Q + q);
        y[o] = static_cast<T>(max ? best : acc / static_cast<double>(s.kh * s.kw));
        if (argmax) (*argmax)[o] = best_at;
      }
  return y;
}

template <class T>
void check_pools(const Shape& xs, int64_t k, int64_t stride, int64_t pad, uint64_t seed) {
  // All-negative input: a padded zero must never win the max.
  Tensor x = rand_t<T>(xs, seed, -2.0, -0.5);
  const PoolShape s = make_pool_shape(xs[0], xs[1], xs[2], xs[3], k, k, stride, stride, pad, pad);
  const std::string name = std::string(dtype_name(dtype_of<T>::value)) + " pool " + shape_str(xs) +
                           " k" + std::to_string(k) + " s" + std::to_string(stride) + " p" +
                           std::to_string(pad);
  const std::vector<T> xv = x.to_vector<T>();
  std::vector<int32_t> want_arg;
  const std::vector<T> want_max = ref_pool(xv, s, true, &want_arg);
  Tensor y = max_pool2d(x, k, stride, pad);
  CHECK(y.shape() == Shape{s.N, s.C, s.P, s.Q});
  CHECK_MESSAGE(y.to_vector<T>() == want_max, name, " max");  // a max is exact
  std::vector<int32_t> arg(want_arg.size());
  std::vector<T> ybuf(want_max.size());
  cpu::maxpool2d_forward<T>(xv.data(), ybuf.data(), arg.data(), s);
  CHECK_MESSAGE(arg == want_arg, name, " argmax");
  expect_close(name + " avg", avg_pool2d(x, k, stride, pad).to_vector<T>(), ref_pool(xv, s, false),
               atol_for<T>(), rtol_for<T>());
}

}  // namespace

// ---- conv2d
// ---------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("conv2d forward, backward-data and backward-filter match nested loops", T, float,
                   double) {
  const ConvCase cases[] = {
      {2, 3, 9, 7, 5, 3, 3, 1, 1, 1, 1},      // 3x3 same padding, odd sizes
      {3, 4, 8, 8, 6, 3, 3, 2, 2, 1, 1},      // 3x3 stride 2
      {2, 5, 7, 9, 4, 1, 1, 1, 1, 0, 0},      // 1x1 stride 1: backward-data writes dx directly
      {1, 6, 33, 35, 3, 1, 1, 1, 1, 0, 0},    // the same, one image, many column panels
      {3, 20, 13, 11, 24, 1, 1, 1, 1, 0, 0},  // 1x1, 143-pixel planes: tiles straddle images
      {2, 5, 9, 8, 7, 1, 1, 2, 2, 0, 0},      // 1x1 stride 2
      {2, 3, 23, 21, 4, 7, 7, 2, 2, 3, 3},    // 7x7 stride 2 pad 3
      {1, 2, 5, 6, 3, 5, 6, 1, 1, 0, 0},      // kernel as large as the input
      {2, 3, 6, 5, 2, 2, 3, 3, 1, 2, 0},      // asymmetric everything
      {5, 2, 20, 20, 3, 3, 3, 1, 1, 1, 1},    // 400-pixel planes: GEMM tiles straddle images
      {10, 3, 4, 4, 9, 3, 3, 1, 1, 0, 0},     // 2x2 planes: more image ends per tile than runs
      {2, 17, 40, 36, 20, 3, 3, 1, 1, 1, 1},  // M, N and K past one register tile and KC
      {2, 3, 5, 6, 4, 1, 1, 1, 1, 1, 1},      // 1x1 padded: dx by col2im, not as a convolution
  };
  uint64_t seed = 100;
  for (const ConvCase& c : cases) check_conv<T>(c, seed += 10);
}

TEST_CASE("conv2d strided backward-data tiles: whole images per tile, or row bands of one image") {
  // 16 channels x 7x7 taps x 148x148 outputs x 4 bytes = 68.7 MB of dcol for one image: more than
  // the 64 MiB budget, so backward-data folds bands of output rows.
  check_conv<float>({1, 16, 295, 295, 2, 7, 7, 2, 2, 3, 3}, 7);
  // 27.9 MB per image: two images per tile, then the remaining one.
  check_conv<float>({3, 64, 220, 220, 2, 3, 3, 2, 2, 1, 1}, 8);
}

TEST_CASE("conv2d gives the same bits with 1 and 2 threads") {
  // 3x3 (unfolded columns), and 1x1 (the planes read as they are) on planes that do not split
  // into whole register tiles.
  for (const ConvShape& s : {make_conv_shape(3, 40, 20, 20, 48, 3, 3, 1, 1, 1, 1),
                             make_conv_shape(3, 40, 13, 11, 48, 1, 1, 1, 1, 0, 0)}) {
    Tensor x = rand_t<float>({s.N, s.C, s.H, s.W}, 1), w = rand_t<float>({s.K, s.C, s.R, s.S}, 2);
    Tensor b = rand_t<float>({s.K}, 3), dy = rand_t<float>({s.N, s.K, s.P, s.Q}, 4);
    auto run = [&](int threads) {
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      Tensor y = empty(dy.shape()), dx = empty(x.shape()), dw = empty(w.shape()), db = empty({s.K});
      cpu::conv2d_forward<float>(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(),
                                 s);
      cpu::conv2d_backward_data<float>(dy.data<float>(), w.data<float>(), dx.data<float>(), s);
      cpu::conv2d_backward_filter<float>(x.data<float>(), dy.data<float>(), dw.data<float>(),
                                         db.data<float>(), s);
      omp_set_num_threads(saved);
      std::vector<std::vector<float>> out = {y.to_vector<float>(), dx.to_vector<float>(),
                                             dw.to_vector<float>(), db.to_vector<float>()};
      return out;
    };
    CHECK(run(1) == run(2));
  }
}

namespace {

// Largest |got - want| over `scale`, where scale is the output's own sum of |x w| terms: an error
// in units of the magnitude the sum passed through.
double scaled_error(const std::vector<float>& got, const std::vector<float>& want,
                    const std::vector<float>& scale) {
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    worst = std::max(worst, e / std::max(static_cast<double>(scale[i]), 1e-30));
  }
  return worst;
}

}  // namespace

TEST_CASE(
    "conv2d f32 3x3 stride 1: Winograd F(2x2, 3x3) and F(4x4, 3x3) against nested loops and the "
    "direct path, all three passes") {
  struct Case {
    int64_t N, C, H, W, K, pad;
  };
  const Case cases[] = {
      {4, 17, 17, 15, 20, 1},  // odd planes: the last tile row and column are half outside
      {15, 300, 6, 5, 70, 1},  // depth past one KC block; K past a row chunk, not a multiple of 8
      {4, 16, 14, 14, 16, 0},  // no padding: 12x12 outputs (backward-data: padding 2)
      {3, 24, 13, 16, 33, 2},  // padding 2: 15x18 outputs (backward-data: padding 0)
      {4, 32, 28, 28, 40, 1},  // 784 tiles, 17 blocks: threads take whole blocks
      {128, 20, 1, 1, 18, 1},  // 1x1 planes: one tile each, three quarters outside
      {3, 40, 23, 21, 17, 1},  // 396 tiles: backward-filter sums two chunks (240 + 156)
  };
  const cpu::winograd::ScopedAlgo winograd(cpu::winograd::Algo::winograd);
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const ConvShape s = make_conv_shape(c.N, c.C, c.H, c.W, c.K, 3, 3, 1, 1, c.pad, c.pad);
    const std::string name = "x[" + std::to_string(c.N) + "," + std::to_string(c.C) + "," +
                             std::to_string(c.H) + "," + std::to_string(c.W) + "] K " +
                             std::to_string(c.K) + " pad " + std::to_string(c.pad);
    REQUIRE_MESSAGE(cpu::winograd::applies(s), name);
    seed += 10;
    Tensor x = rand_t<float>({c.N, c.C, c.H, c.W}, seed),
           w = rand_t<float>({c.K, c.C, 3, 3}, seed + 1);
    Tensor b = rand_t<float>({c.K}, seed + 2), dy = rand_t<float>({s.N, s.K, s.P, s.Q}, seed + 3);
    const std::vector<float> xv = x.to_vector<float>(), wv = w.to_vector<float>();
    const std::vector<float> bv = b.to_vector<float>(), dyv = dy.to_vector<float>();
    // The magnitudes each output's sum passes through: the same loops over |x| and |w|.
    std::vector<float> ax(xv.size()), aw(wv.size()), ady(dyv.size());
    for (size_t i = 0; i < xv.size(); ++i) ax[i] = std::fabs(xv[i]);
    for (size_t i = 0; i < wv.size(); ++i) aw[i] = std::fabs(wv[i]);
    for (size_t i = 0; i < dyv.size(); ++i) ady[i] = std::fabs(dyv[i]);
    const std::vector<float> want_y = ref_conv_forward<float>(xv, wv, bv.data(), s);
    const std::vector<float> scale_y = ref_conv_forward<float>(ax, aw, nullptr, s);
    std::vector<float> want_dx, want_dw, scale_dx, scale_dw;
    ref_conv_backward<float>(xv, wv, dyv, s, want_dx, want_dw);
    ref_conv_backward<float>(ax, aw, ady, s, scale_dx, scale_dw);
    auto run = [&](cpu::winograd::Algo algo, int tiles) {
      const cpu::winograd::ScopedAlgo scoped(algo);
      const cpu::winograd::ScopedTileSize tile(tiles);
      Tensor y = full(dy.shape(), 123.0), dx = full(x.shape(), 123.0);  // stale values
      Tensor dw = full(w.shape(), 123.0);
      cpu::conv2d_forward<float>(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(),
                                 s);
      cpu::conv2d_backward_data<float>(dy.data<float>(), w.data<float>(), dx.data<float>(), s);
      cpu::conv2d_backward_filter<float>(x.data<float>(), dy.data<float>(), dw.data<float>(),
                                         nullptr, s);
      return std::vector<std::vector<float>>{y.to_vector<float>(), dx.to_vector<float>(),
                                             dw.to_vector<float>()};
    };
    const auto direct = run(cpu::winograd::Algo::direct, 0);
    const double dy_direct = scaled_error(direct[0], want_y, scale_y);
    const double dx_direct = scaled_error(direct[1], want_dx, scale_dx);
    const double dw_direct = scaled_error(direct[2], want_dw, scale_dw);
    for (const int m : {2, 4}) {
      const std::string at = name + " F(" + std::to_string(m) + "x" + std::to_string(m) + ")";
      const auto wino = run(cpu::winograd::Algo::winograd, m);
      // F(4x4)'s transforms scale by up to 8 and 1/24 before the products: sums of 300 channels
      // land up to 8e-4 from the double sum, where F(2x2) stays within 2e-4.
      const double atol = m == 2 ? 2e-4 : 2e-3, rtol = m == 2 ? 1e-4 : 1e-3;
      expect_close(at + " forward", wino[0], want_y, atol, rtol);
      expect_close(at + " backward-data", wino[1], want_dx, atol, rtol);
      expect_close(at + " backward-filter", wino[2], want_dw, 2e-4, 1e-4);
      // Rounding: Winograd's transforms add and scale before they multiply. Measured on these
      // cases (scaled as above): direct 3.9e-8 to 2.3e-7; F(2x2) 7.3e-8 to 2.7e-7, F(4x4) 4.6e-7
      // to 2.4e-6 (forward and backward-data); backward-filter (F(2x2) either way) direct 3.4e-8
      // to 1.7e-7, Winograd 6.1e-8 to 2.3e-7. The bounds leave room for other seeds and
      // compilers, and are far below what a wrong tile gives (0.1).
      const double ey = scaled_error(wino[0], want_y, scale_y);
      const double edx = scaled_error(wino[1], want_dx, scale_dx);
      const double edw = scaled_error(wino[2], want_dw, scale_dw);
      MESSAGE(at, ": scaled error forward ", ey, " (direct ", dy_direct, "), backward-data ", edx,
              " (direct ", dx_direct, "), backward-filter ", edw, " (direct ", dw_direct, ")");
      const double bound = m == 2 ? 4e-6 : 1.5e-5;
      CHECK_MESSAGE(ey < bound, at);
      CHECK_MESSAGE(edx < bound, at);
      CHECK_MESSAGE(edw < 4e-6, at);
      CHECK(wino[0] != direct[0]);  // the Winograd path ran, all three passes
      CHECK(wino[1] != direct[1]);
      // On 1x1 planes only the centre tap has a gradient, and both paths sum it exactly alike.
      if (c.H > 1) CHECK(wino[2] != direct[2]);
    }
  }
  // tile_size: F(4x4) where the planes split into whole 4x4 tiles, at least 128 of them.
  CHECK(cpu::winograd::tile_size(make_conv_shape(4, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1)) == 4);
  CHECK(cpu::winograd::tile_size(make_conv_shape(4, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1)) == 4);
  CHECK(cpu::winograd::tile_size(make_conv_shape(2, 128, 28, 28, 128, 3, 3, 1, 1, 1, 1)) == 2);
  CHECK(cpu::winograd::tile_size(make_conv_shape(32, 256, 14, 14, 256, 3, 3, 1, 1, 1, 1)) == 2);
  CHECK(cpu::winograd::tile_size(make_conv_shape(4, 64, 56, 56, 64, 3, 3, 1, 1, 0, 0)) == 2);
  CHECK_THROWS_WITH(cpu::winograd::ScopedTileSize(3),
                    doctest::Contains("Winograd output tiles: 2 or 4 (0 to choose), got 3"));
  // Where it does not pay, the direct path: too few tiles (ResNet's 7x7 planes at batch 4), a
  // stride, another kernel size, few channels.
  CHECK_FALSE(cpu::winograd::applies(make_conv_shape(4, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1)));
  CHECK(cpu::winograd::applies(make_conv_shape(8, 512, 7, 7, 512, 3, 3, 1, 1, 1, 1)));
  CHECK_FALSE(cpu::winograd::applies(make_conv_shape(4, 64, 56, 56, 64, 3, 3, 2, 2, 1, 1)));
  CHECK_FALSE(cpu::winograd::applies(make_conv_shape(4, 64, 56, 56, 64, 5, 5, 1, 1, 2, 2)));
  CHECK_FALSE(cpu::winograd::applies(make_conv_shape(4, 8, 56, 56, 64, 3, 3, 1, 1, 1, 1)));
  {
    const cpu::winograd::ScopedAlgo direct(cpu::winograd::Algo::direct);  // opt-out
    CHECK_FALSE(cpu::winograd::applies(make_conv_shape(4, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1)));
  }
}

TEST_CASE("conv2d f32 Winograd: the same bits with 1, 2 and 3 threads, blocks or rows split") {
  // F(2x2): 4 x 7 x 7 tiles = 196, five blocks: two threads split the output channels; 16 x 7 x
  // 7 = 784 tiles, 17 blocks: they split the blocks. F(4x4) (planes of 16 x 16): 4 x 4 x 4 = 64
  // tiles, two blocks, rows split; 16 x 16 = 256, six blocks, rows split; 64 x 16 = 1024, 22
  // blocks, blocks split. One thread takes every block either way. Backward-filter: threads take
  // whole xi, over one chunk of tiles (196) or four (784).
  const cpu::winograd::ScopedAlgo winograd(cpu::winograd::Algo::winograd);
  {
    const cpu::winograd::ScopedTileSize four(4);
    for (const int64_t batch : {4, 16, 64}) {
      const ConvShape s = make_conv_shape(batch, 24, 16, 16, 40, 3, 3, 1, 1, 1, 1);
      Tensor x = rand_t<float>({s.N, s.C, s.H, s.W}, 21), w = rand_t<float>({s.K, s.C, 3, 3}, 22);
      Tensor b = rand_t<float>({s.K}, 23), dy = rand_t<float>({s.N, s.K, s.P, s.Q}, 24);
      auto run = [&](int threads) {
        const int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        Tensor y = empty(dy.shape()), dx = empty(x.shape());
        cpu::conv2d_forward<float>(x.data<float>(), w.data<float>(), b.data<float>(),
                                   y.data<float>(), s);
        cpu::conv2d_backward_data<float>(dy.data<float>(), w.data<float>(), dx.data<float>(), s);
        omp_set_num_threads(saved);
        return std::vector<std::vector<float>>{y.to_vector<float>(), dx.to_vector<float>()};
      };
      const auto one = run(1);
      CHECK_MESSAGE(one == run(2), "F(4x4), batch ", batch);
      CHECK_MESSAGE(one == run(3), "F(4x4), batch ", batch);
    }
  }
  for (const int64_t n : {4, 16}) {
    const ConvShape s = make_conv_shape(n, 24, 14, 14, 40, 3, 3, 1, 1, 1, 1);
    REQUIRE(cpu::winograd::applies(s));
    Tensor x = rand_t<float>({s.N, s.C, s.H, s.W}, 11), w = rand_t<float>({s.K, s.C, 3, 3}, 12);
    Tensor b = rand_t<float>({s.K}, 13), dy = rand_t<float>({s.N, s.K, s.P, s.Q}, 14);
    auto run = [&](int threads) {
      const int saved = omp_get_max_threads();
      omp_set_num_threads(threads);
      Tensor y = empty(dy.shape()), dx = empty(x.shape()), dw = empty(w.shape());
      cpu::conv2d_forward<float>(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(),
                                 s);
      cpu::conv2d_backward_data<float>(dy.data<float>(), w.data<float>(), dx.data<float>(), s);
      cpu::conv2d_backward_filter<float>(x.data<float>(), dy.data<float>(), dw.data<float>(),
                                         nullptr, s);
      omp_set_num_threads(saved);
      return std::vector<std::vector<float>>{y.to_vector<float>(), dx.to_vector<float>(),
                                             dw.to_vector<float>()};
    };
    const auto one = run(1);
    CHECK_MESSAGE(one == run(2), "batch ", n);
    CHECK_MESSAGE(one == run(3), "batch ", n);
  }
}

TEST_CASE_TEMPLATE(
    "conv2d 16-bit Winograd: f32 Winograd's results on the widened values, rounded once", E,
    bfloat16, float16) {
  // The 16-bit passes widen what they read and run f32 Winograd's operations in its order, so
  // every output is the f32 pass's on the same values, rounded once: the same bits, not a
  // tolerance. Both tile sizes, odd planes, every padding, blocks or rows split, several
  // backward-filter chunks; backward-data with a bias (conv_transpose2d's forward).
  struct Case {
    int64_t N, C, H, W, K, pad;
  };
  const Case cases[] = {
      {4, 17, 17, 15, 20, 1}, {15, 300, 6, 5, 70, 1}, {4, 16, 14, 14, 16, 0},
      {3, 24, 13, 16, 33, 2}, {4, 32, 28, 28, 40, 1}, {3, 40, 23, 21, 17, 1},
  };
  const DType dt = dtype_of<E>::value;
  const cpu::winograd::ScopedAlgo winograd(cpu::winograd::Algo::winograd);
  uint64_t seed = 1300;
  int64_t dw_differ = 0;
  for (const Case& c : cases) {
    const ConvShape s = make_conv_shape(c.N, c.C, c.H, c.W, c.K, 3, 3, 1, 1, c.pad, c.pad);
    REQUIRE(cpu::winograd::applies(s));
    seed += 10;
    // 16-bit tensors and their exact f32 widenings.
    const Tensor x = rand_t<float>({c.N, c.C, c.H, c.W}, seed).to(dt);
    const Tensor w = rand_t<float>({c.K, c.C, 3, 3}, seed + 1).to(dt);
    const Tensor b = rand_t<float>({c.K}, seed + 2).to(dt);
    const Tensor bx = rand_t<float>({c.C}, seed + 4).to(dt);  // backward-data's bias
    const Tensor dy = rand_t<float>({s.N, s.K, s.P, s.Q}, seed + 3).to(dt);
    const Tensor x32 = x.to(DType::f32), w32 = w.to(DType::f32), b32 = b.to(DType::f32);
    const Tensor bx32 = bx.to(DType::f32), dy32 = dy.to(DType::f32);
    for (const int m : {2, 4}) {
      const std::string at = "x[" + std::to_string(c.N) + "," + std::to_string(c.C) + "," +
                             std::to_string(c.H) + "," + std::to_string(c.W) + "] K " +
                             std::to_string(c.K) + " pad " + std::to_string(c.pad) + " F(" +
                             std::to_string(m) + "x" + std::to_string(m) + ")";
      const cpu::winograd::ScopedTileSize tile(m);
      Tensor y = full(dy.shape(), 123.0, dt), dx = full(x.shape(), 123.0, dt);  // stale values
      Tensor dw = full(w.shape(), 123.0, dt), db = full(b.shape(), 123.0, dt);
      cpu::conv2d_forward<E>(x.data<E>(), w.data<E>(), b.data<E>(), y.data<E>(), s);
      cpu::conv2d_backward_data_with_bias<E>(dy.data<E>(), w.data<E>(), bx.data<E>(), dx.data<E>(),
                                             s);
      cpu::conv2d_backward_filter<E>(x.data<E>(), dy.data<E>(), dw.data<E>(), db.data<E>(), s);
      Tensor y32 = empty(dy.shape()), dx32 = empty(x.shape()), dw32 = empty(w.shape());
      Tensor db32 = empty(b.shape());
      cpu::conv2d_forward<float>(x32.data<float>(), w32.data<float>(), b32.data<float>(),
                                 y32.data<float>(), s);
      cpu::conv2d_backward_data<float>(dy32.data<float>(), w32.data<float>(), dx32.data<float>(),
                                       s);
      // Winograd's output transform adds the bias last, as here.
      {
        float* d = dx32.data<float>();
        const float* bb = bx32.data<float>();
        for (int64_t i = 0; i < dx32.numel(); ++i) d[i] += bb[i / (c.H * c.W) % c.C];
      }
      cpu::conv2d_backward_filter<float>(x32.data<float>(), dy32.data<float>(), dw32.data<float>(),
                                         db32.data<float>(), s);
      const auto bits = [](const Tensor& t) {
        std::vector<uint16_t> v;
        for (const E& e : t.to_vector<E>()) v.push_back(e.bits);
        return v;
      };
      CHECK_MESSAGE(bits(y) == bits(y32.to(dt)), at, " forward");
      CHECK_MESSAGE(bits(dx) == bits(dx32.to(dt)), at, " backward-data");
      CHECK_MESSAGE(bits(dw) == bits(dw32.to(dt)), at, " backward-filter");
      CHECK_MESSAGE(bits(db) == bits(db32.to(dt)), at, " bias gradient");
      // And they are Winograd's: the direct path rounds otherwise somewhere (backward-filter's
      // few sums, rounded to 16 bits, can all agree on one case, so over all of them).
      const cpu::winograd::ScopedAlgo direct(cpu::winograd::Algo::direct);
      Tensor yd = empty(dy.shape(), dt), dwd = empty(w.shape(), dt);
      cpu::conv2d_forward<E>(x.data<E>(), w.data<E>(), b.data<E>(), yd.data<E>(), s);
      cpu::conv2d_backward_filter<E>(x.data<E>(), dy.data<E>(), dwd.data<E>(), nullptr, s);
      CHECK_MESSAGE(bits(yd) != bits(y), at);
      const auto a = bits(dwd), z = bits(dw);
      for (size_t i = 0; i < a.size(); ++i) dw_differ += a[i] != z[i];
    }
  }
  CHECK(dw_differ > 0);
}

TEST_CASE(
    "REGEN_CPU_CONV: CPU profiles record the algorithm, and a run with the other is refused") {
  SessionOptions o;
  o.model = "resnet-tiny";
  o.batch = 2;
  o.device = "cpu";
  Profile p;
  p.device = "cpu";
  ProfileNode conv;
  conv.op = "conv2d";
  p.nodes.push_back(conv);
  {
    const cpu::winograd::ScopedAlgo direct(cpu::winograd::Algo::direct);
    CHECK(cpu::conv2d_algorithm() == "direct");
    p.run = run_flags(o);
    CHECK(p.run.at("REGEN_CPU_CONV") == "direct");
    check_profile_run(p, o, "the profile");  // the same algorithm: accepted
  }
  {
    const cpu::winograd::ScopedAlgo winograd(cpu::winograd::Algo::winograd);
    CHECK(cpu::conv2d_algorithm() == "winograd");
    expect_error([&] { check_profile_run(p, o, "the profile"); },
                 {"the profile was made with the CPU's 3x3 convolutions by direct "
                  "(REGEN_CPU_CONV=direct), but this run has winograd",
                  "set the environment variable REGEN_CPU_CONV=direct, or profile again"});
    // A profile from before the algorithm was recorded ran the direct path.
    p.run.erase("REGEN_CPU_CONV");
    expect_error([&] { check_profile_run(p, o, "the profile"); },
                 {"by direct (REGEN_CPU_CONV=direct), but this run has winograd"});
    // What a Winograd profile records beside the algorithm: with it the profile is accepted;
    // without it (a profile from before it was recorded) refused, with `refusal`.
    auto recorded = [&](const SessionOptions& opts, const std::string& key,
                        const std::string& value, const std::vector<std::string>& refusal) {
      Profile q = p;
      q.run = run_flags(opts);
      CHECK(q.run.at(key) == value);
      check_profile_run(q, opts, "the profile");
      q.run.erase(key);
      expect_error([&] { check_profile_run(q, opts, "the profile"); }, refusal);
    };
    // The output tiles forward chooses from; a profile from before F(4x4, 3x3) had other
    // workspace and times.
    recorded(o, "winograd-tiles", "2x2,4x4",
             {"the profile was made by a regen whose CPU Winograd convolutions had output "
              "tiles of 2x2 only, but this one's have 2x2,4x4",
              "(profile again)"});
    // In bf16 and fp16, that Winograd takes 16-bit operands (not recorded in fp32); a 16-bit
    // profile from before ran those convolutions on the direct path.
    CHECK(run_flags(o).count("winograd-types") == 0);
    SessionOptions o16 = o;
    o16.precision = "bf16";
    recorded(o16, "winograd-types", "f32,bf16,f16",
             {"the profile was made by a regen whose CPU Winograd convolutions took f32 "
              "operands only (its bf16 3x3 convolutions ran the direct path), but this one's "
              "take f32,bf16,f16",
              "(profile again)"});
    // Without a convolution in the step, the algorithm does not matter.
    Profile no_conv = p;
    no_conv.nodes.clear();
    check_profile_run(no_conv, o, "the profile");
    no_conv.run = run_flags(o);
    CHECK(no_conv.run.at("REGEN_CPU_CONV") == "winograd");
    const cpu::winograd::ScopedAlgo direct(cpu::winograd::Algo::direct);
    CHECK(run_flags(o).count("winograd-tiles") == 0);
    check_profile_run(no_conv, o, "the profile");
    check_profile_run(p, o, "the profile");  // the old profile, on the direct path again
    // The setter `regen bench train --cpu-conv` uses (inside the scope, which restores it).
    cpu::set_conv2d_algorithm("winograd");
    CHECK(cpu::conv2d_algorithm() == "winograd");
    expect_error([] { cpu::set_conv2d_algorithm("fast"); },
                 {"the CPU's convolution algorithm 'fast': expected winograd or direct"});
    CHECK(cpu::conv2d_algorithm() == "winograd");
  }
}

TEST_CASE("conv2d results are identical across two runs (forward and both backwards)") {
  auto run = [] {
    Tensor x = rand_t<float>({4, 8, 14, 14}, 1).set_requires_grad(true);
    Tensor w = rand_t<float>({16, 8, 3, 3}, 2).set_requires_grad(true);
    Tensor b = rand_t<float>({16}, 3).set_requires_grad(true);
    Tensor y = conv2d(x, w, b, 1, 1);
    backward(sum(mul(y, y)));
    std::vector<std::vector<float>> out = {y.to_vector<float>(), x.grad().to_vector<float>(),
                                           w.grad().to_vector<float>(),
                                           b.grad().to_vector<float>()};
    return out;
  };
  CHECK(run() == run());
}

// ---- pooling
// --------------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("max_pool2d and avg_pool2d match nested loops and padding never wins", T, float,
                   double) {
  check_pools<T>({2, 3, 8, 8}, 2, 2, 0, 1);
  check_pools<T>({1, 2, 7, 9}, 3, 2, 1, 2);  // ResNet's stem pool on odd sizes
  check_pools<T>({2, 2, 5, 6}, 3, 1, 1, 3);
  check_pools<T>({1, 1, 6, 7}, 4, 3, 2, 4);
  check_pools<T>({3, 2, 4, 4}, 4, 4, 0, 5);  // one window per plane
}

TEST_CASE("max_pool2d: ties go to the first maximum in window order, and backward routes there") {
  Tensor x = ones({1, 1, 4, 4}, DType::f64).set_requires_grad(true);
  Tensor y = max_pool2d(x, 2, 2, 0);
  backward(sum(y));
  const std::vector<double> g = x.grad().to_vector<double>();
  const std::vector<double> want = {1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0};
  CHECK(g == want);
  // Overlapping windows that pick the same element add up there.
  Tensor z = from_vector<double>({0, 0, 0, 0, 5, 0, 0, 0, 0}, {1, 1, 3, 3});
  z.set_requires_grad(true);
  backward(sum(max_pool2d(z, 2, 1, 0)));
  CHECK(z.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 0, 4, 0, 0, 0, 0});
  // A NaN wins its window (and the first NaN stays), as in PyTorch.
  const std::vector<float> nan_in = {1, NAN, 3, NAN, 5, 6, 7, 8, 9};
  std::vector<float> out(4);
  std::vector<int32_t> arg(4);
  cpu::maxpool2d_forward<float>(nan_in.data(), out.data(), arg.data(),
                                make_pool_shape(1, 1, 3, 3, 2, 2, 1, 1, 0, 0));
  CHECK(std::isnan(out[0]));
  CHECK(arg[0] == 1);
  CHECK(std::isnan(out[1]));
  CHECK(std::isnan(out[2]));
  CHECK(arg[2] == 3);
  CHECK(out[3] == 9.0f);
  CHECK(arg[3] == 8);
}

// ---- batchnorm2d
// ----------------------------------------------------------------------------------

TEST_CASE_TEMPLATE("batchnorm2d: one training step updates the running stats by the formula", T,
                   float, double) {
  const int64_t N = 3, C = 4, H = 5, W = 2, M = N * H * W;
  Tensor x = rand_t<T>({N, C, H, W}, 11, -1, 3);
  Tensor gamma = rand_t<T>({C}, 12, 0.5, 1.5), beta = rand_t<T>({C}, 13);
  Tensor rm = rand_t<T>({C}, 14), rv = rand_t<T>({C}, 15, 0.5, 2);
  const std::vector<T> xv = x.to_vector<T>(), rm0 = rm.to_vector<T>(), rv0 = rv.to_vector<T>();
  const std::vector<T> gv = gamma.to_vector<T>(), bv = beta.to_vector<T>();
  const double momentum = 0.3, eps = 1e-3;
  Tensor y = batchnorm2d(x, gamma, beta, rm, rv, true, momentum, eps);
  std::vector<T> want_rm(C), want_rv(C), want_y(xv.size());
  for (int64_t c = 0; c < C; ++c) {
    double s = 0, sq = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < H * W; ++i) s += xv[(n * C + c) * H * W + i];
    const double mean = s / M;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < H * W; ++i) {
        const double d = xv[(n * C + c) * H * W + i] - mean;
        sq += d * d;
      }
    want_rm[c] = static_cast<T>((1 - momentum) * rm0[c] + momentum * mean);
    want_rv[c] = static_cast<T>((1 - momentum) * rv0[c] + momentum * sq / (M - 1));  // unbiased
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < H * W; ++i) {
        const size_t j = static_cast<size_t>((n * C + c) * H * W + i);
        want_y[j] = static_cast<T>((xv[j] - mean) / std::sqrt(sq / M + eps) * gv[c] + bv[c]);
      }
  }
  expect_close("running_mean", rm.to_vector<T>(), want_rm, atol_for<T>(), rtol_for<T>());
  expect_close("running_var", rv.to_vector<T>(), want_rv, atol_for<T>(), rtol_for<T>());
  expect_close("train output", y.to_vector<T>(), want_y, atol_for<T>(), rtol_for<T>());

  // Eval uses the running statistics and leaves them alone.
  const std::vector<T> rm1 = rm.to_vector<T>(), rv1 = rv.to_vector<T>();
  Tensor ye = batchnorm2d(x, gamma, beta, rm, rv, false, momentum, eps);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < H * W; ++i) {
        const size_t j = static_cast<size_t>((n * C + c) * H * W + i);
        want_y[j] = static_cast<T>((xv[j] - rm1[c]) / std::sqrt(rv1[c] + eps) * gv[c] + bv[c]);
      }
  expect_close("eval output", ye.to_vector<T>(), want_y, atol_for<T>(), rtol_for<T>());
  CHECK(rm.to_vector<T>() == rm1);
  CHECK(rv.to_vector<T>() == rv1);
}

TEST_CASE("batchnorm2d statistics stay accurate for a channel far from zero") {
  // Mean 1e4, variance ~1/3: a naive sum of squares would cancel most of its digits.
  Tensor x = rand_t<double>({2, 2, 8, 8}, 41);
  double* p = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) p[i] += 1e4;
  Tensor rm = zeros({2}, DType::f64), rv = zeros({2}, DType::f64);
  batchnorm2d(x, ones({2}, DType::f64), zeros({2}, DType::f64), rm, rv, true, 1.0, 1e-5);
  const std::vector<double> xv = x.to_vector<double>();
  for (int64_t c = 0; c < 2; ++c) {
    double s = 0, sq = 0;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 64; ++i) s += xv[(n * 2 + c) * 64 + i];
    const double mean = s / 128;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t i = 0; i < 64; ++i) sq += std::pow(xv[(n * 2 + c) * 64 + i] - mean, 2);
    CHECK(rm.to_vector<double>()[c] == doctest::Approx(mean).epsilon(1e-14));
    CHECK(rv.to_vector<double>()[c] == doctest::Approx(sq / 127).epsilon(1e-10));
  }
}

TEST_CASE("batchnorm2d: a replayed training node leaves running stats alone, same bits out") {
  Tape& tape = Tape::current();
  tape.clear();
  Tensor x = rand_t<float>({2, 3, 4, 4}, 21).set_requires_grad(true);
  Tensor gamma = rand_t<float>({3}, 22, 0.5, 1.5), beta = rand_t<float>({3}, 23);
  Tensor rm = zeros({3}), rv = ones({3});
  Tensor y = batchnorm2d(x, gamma, beta, rm, rv, true);
  const std::vector<float> rm1 = rm.to_vector<float>(), rv1 = rv.to_vector<float>();
  CHECK(rm1 != std::vector<float>(3, 0.0f));  // the recorded forward did update them
  REQUIRE(tape.nodes().size() == 1);
  REQUIRE(tape.node(0).kind == OpKind::batchnorm2d);
  const std::vector<Tensor> out = tape.replay(0, {x, gamma, beta, rm, rv});
  REQUIRE(out.size() == 3);
  CHECK(out[0].to_vector<float>() == y.to_vector<float>());
  CHECK(out[1].shape() == Shape{3});
  CHECK(out[2].shape() == Shape{3});
  CHECK(rm.to_vector<float>() == rm1);
  CHECK(rv.to_vector<float>() == rv1);
  // The recorded hidden outputs (saved for backward) equal the replayed ones bit for bit.
  const Tensor mean = tape.value_tensor(tape.node(0).outputs[1]);
  const Tensor invstd = tape.value_tensor(tape.node(0).outputs[2]);
  CHECK(out[1].to_vector<float>() == mean.to_vector<float>());
  CHECK(out[2].to_vector<float>() == invstd.to_vector<float>());
  tape.clear();
}

TEST_CASE("batchnorm2d forward and backward are identical across two runs") {
  auto run = [] {
    Tensor x = rand_t<float>({4, 16, 9, 9}, 31, -1, 2).set_requires_grad(true);
    Tensor gamma = rand_t<float>({16}, 32).set_requires_grad(true);
    Tensor beta = rand_t<float>({16}, 33).set_requires_grad(true);
    Tensor rm = zeros({16}), rv = ones({16});
    Tensor y = batchnorm2d(x, gamma, beta, rm, rv, true);
    backward(sum(mul(y, y)));
    std::vector<std::vector<float>> out = {y.to_vector<float>(),
                                           x.grad().to_vector<float>(),
                                           gamma.grad().to_vector<float>(),
                                           beta.grad().to_vector<float>(),
                                           rm.to_vector<float>(),
                                           rv.to_vector<float>()};
    return out;
  };
  CHECK(run() == run());
}

// ---- transpose / permute
// --------------------------------------------------------------------------

TEST_CASE("transpose and permute move elements where the index maps say") {
  Tensor x = arange(24, DType::f32).reshape({2, 3, 4});
  Tensor t = transpose(x, 0, 2);
  CHECK(t.shape() == Shape{4, 3, 2});
  Tensor p = permute(x, {1, 2, 0});
  CHECK(p.shape() == Shape{3, 4, 2});
  const std::vector<float> tv = t.to_vector<float>(), pv = p.to_vector<float>();
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t c = 0; c < 4; ++c) {
        const float v = static_cast<float>((a * 3 + b) * 4 + c);
        CHECK(tv[(c * 3 + b) * 2 + a] == v);
        CHECK(pv[(b * 4 + c) * 2 + a] == v);
      }
  Tensor d = transpose(arange(6, DType::f64).reshape({2, 3}), -2, -1);
  CHECK(d.to_vector<double>() == std::vector<double>{0, 3, 1, 4, 2, 5});
}

// ---- errors
// ---------------------------------------------------------------------------------------

TEST_CASE("conv2d rejects bad input with messages naming the op and the shapes") {
  Tensor x = zeros({2, 3, 8, 8}), w = zeros({4, 5, 3, 3});
  expect_error([&] { conv2d(x, w); }, {"conv2d: input [2, 3, 8, 8] has 3 channels but weight "
                                       "[4, 5, 3, 3] expects 5"});
  Tensor w3 = zeros({4, 3, 3, 3});
  expect_error([&] { conv2d(x, w3.to(DType::f64)); }, {"conv2d", "dtype mismatch", "f64"});
  expect_error(
      [&] {
        conv2d(zeros({1, 3, 2, 2}), w3);
      },
      {"conv2d: kernel 3x3 of weight [4, 3, 3, 3] is larger than input [1, 3, 2, 2]"});
  expect_error([&] { conv2d(x, w3, Tensor(), -1, 1, 0, 0); },
               {"conv2d: stride -1x1 must be positive", "[2, 3, 8, 8]", "[4, 3, 3, 3]"});
  expect_error([&] { conv2d(x, w3, Tensor(), 1, 1, 0, -2); },
               {"conv2d: padding 0x-2 must be non-negative", "[2, 3, 8, 8]"});
  expect_error([&] { conv2d(zeros({3, 8, 8}), w3); }, {"conv2d: input [3, 8, 8] must be 4-D"});
  expect_error([&] { conv2d(x, zeros({4, 3, 3})); }, {"conv2d: weight [4, 3, 3] must be 4-D"});
  expect_error([&] { conv2d(x, w3, zeros({5})); },
               {"conv2d: bias [5] does not match weight [4, 3, 3, 3]"});
  expect_error([&] { conv2d(x, w3, zeros({4}, DType::f64)); }, {"conv2d", "dtype mismatch"});
  expect_error(
      [&] {
        conv2d(zeros({2, 3, 8, 8}, DType::i32), w3);
      },
      {"conv2d: expected a floating-point tensor"});
  expect_error([&] { conv2d(Tensor(), w3); }, {"conv2d: input is undefined"});
}

TEST_CASE("batchnorm2d rejects bad input with messages naming the op and the shapes") {
  Tensor x = zeros({2, 3, 4, 4}), c3 = ones({3});
  expect_error([&] { batchnorm2d(x, ones({4}), c3, c3, c3, true); },
               {"batchnorm2d: gamma [4] does not match the 3 channels of input [2, 3, 4, 4]"});
  expect_error([&] { batchnorm2d(x, c3, c3, c3, zeros({2}), true); },
               {"batchnorm2d: running_var [2]", "[2, 3, 4, 4]"});
  expect_error([&] { batchnorm2d(x, c3, c3.to(DType::f64), c3, c3, true); },
               {"batchnorm2d", "dtype mismatch"});
  expect_error(
      [&] {
        batchnorm2d(zeros({2, 3, 4}), c3, c3, c3, c3, true);
      },
      {"batchnorm2d: input [2, 3, 4] must be 4-D"});
  expect_error(
      [&] {
        batchnorm2d(zeros({1, 3, 1, 1}), c3, c3, c3, c3, true);
      },
      {"batchnorm2d: training needs more than one value per channel, input [1, 3, 1, 1]"});
  expect_error([&] { batchnorm2d(x, c3, c3, c3, c3, true, 0.1, 0.0); },
               {"batchnorm2d: eps 0 must be positive"});
  expect_error([&] { batchnorm2d(x, c3, c3, c3, c3, true, 1.5); },
               {"batchnorm2d", "momentum 1.5 in [0, 1]"});
  Tensor rm = zeros({3});
  rm.set_requires_grad(true);
  expect_error([&] { batchnorm2d(x, c3, c3, rm, c3, true); },
               {"batchnorm2d: running_mean and running_var are buffers"});
  expect_error([&] { batchnorm2d(x, Tensor(), c3, c3, c3, true); },
               {"batchnorm2d: gamma is undefined"});
  expect_error(
      [&] {
        batchnorm2d(zeros({2, 3, 4, 4}, DType::i64), c3, c3, c3, c3, false);
      },
      {"batchnorm2d: expected a floating-point tensor"});
}

TEST_CASE("pooling ops reject bad input with messages naming the op and the shapes") {
  Tensor x = zeros({1, 2, 5, 5});
  expect_error([&] { max_pool2d(x, 7, 1, 0); },
               {"max_pool2d: kernel 7x7 is larger than input [1, 2, 5, 5]"});
  expect_error([&] { avg_pool2d(x, 6, 1, 0); },
               {"avg_pool2d: kernel 6x6 is larger than input [1, 2, 5, 5]"});
  expect_error([&] { max_pool2d(x, 3, -1, 0); },
               {"max_pool2d: kernel 3 and stride -1 must be positive (input [1, 2, 5, 5])"});
  expect_error([&] { avg_pool2d(x, 3, 1, 2); },
               {"avg_pool2d: padding 2 must be between 0 and half the kernel 3"});
  expect_error(
      [&] {
        max_pool2d(zeros({2, 5, 5}), 2, 2, 0);
      },
      {"max_pool2d: input [2, 5, 5] must be 4-D"});
  expect_error(
      [&] {
        max_pool2d(zeros({1, 1, 4, 4}, DType::i32), 2, 2, 0);
      },
      {"max_pool2d: expected a floating-point tensor"});
  expect_error(
      [&] {
        global_avg_pool(zeros({2, 3}));
      },
      {"global_avg_pool: input [2, 3] must be 4-D"});
  expect_error(
      [&] {
        global_avg_pool(zeros({2, 3, 0, 4}));
      },
      {"global_avg_pool: input [2, 3, 0, 4] has an empty plane"});
  // Argmax indices are i32. A shape-only tensor (no bytes) is enough to reach the check.
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = {1, 1, 65536, 32769};
  expect_error([&] { max_pool2d(Tensor(impl), 2, 2, 0); },
               {"max_pool2d: input plane of [1, 1, 65536, 32769] is too large"});
}

TEST_CASE("transpose and permute reject bad dims with messages naming the op and the shapes") {
  Tensor x = zeros({2, 3, 4});
  expect_error(
      [&] {
        permute(x, {0, 1});
      },
      {"permute: dims (0, 1) do not match input [2, 3, 4] of 3 dimensions"});
  expect_error(
      [&] {
        permute(x, {0, 1, 1});
      },
      {"permute: dims (0, 1, 1) are not a permutation", "[2, 3, 4]"});
  expect_error([&] { permute(x, {0, 1, 3}); }, {"permute: dims (0, 1, 3) are not a permutation"});
  expect_error([&] { transpose(x, 0, 3); },
               {"transpose: dims 0 and 3 out of range for input [2, 3, 4]"});
  Tensor seven = zeros({1, 1, 1, 1, 1, 1, 2});
  expect_error(
      [&] {
        permute(seven, {0, 1, 2, 3, 4, 5, 6});
      },
      {"permute: input [1, 1, 1, 1, 1, 1, 2] has 7 dimensions; at most 6"});
  expect_error([&] { transpose(seven, 0, 1); }, {"transpose: input [1, 1, 1, 1, 1, 1, 2] has 7"});
  expect_error(
      [&] {
        transpose(zeros({2, 2}, DType::i64), 0, 1);
      },
      {"transpose: expected a floating-point tensor"});
}

TEST_CASE("vision ops name the op and the missing tensor when an input is undefined") {
  Tensor x = zeros({1, 2, 4, 4}), w = zeros({3, 2, 3, 3}), c2 = ones({2});
  expect_error([&] { conv2d(x, Tensor()); }, {"conv2d: weight is undefined"});
  expect_error([&] { batchnorm2d(Tensor(), c2, c2, c2, c2, true); },
               {"batchnorm2d: input is undefined"});
  expect_error([&] { batchnorm2d(x, c2, Tensor(), c2, c2, true); },
               {"batchnorm2d: beta is undefined"});
  expect_error([&] { batchnorm2d(x, c2, c2, Tensor(), c2, true); },
               {"batchnorm2d: running_mean is undefined"});
  expect_error([&] { batchnorm2d(x, c2, c2, c2, Tensor(), true); },
               {"batchnorm2d: running_var is undefined"});
  expect_error([&] { max_pool2d(Tensor(), 2, 2, 0); }, {"max_pool2d: input is undefined"});
  expect_error([&] { avg_pool2d(Tensor(), 2, 2, 0); }, {"avg_pool2d: input is undefined"});
  expect_error([&] { global_avg_pool(Tensor()); }, {"global_avg_pool: input is undefined"});
  expect_error(
      [&] {
        global_avg_pool(zeros({1, 2, 2, 2}, DType::i32));
      },
      {"global_avg_pool: expected a floating-point tensor"});
  expect_error([&] { permute(Tensor(), {0}); }, {"permute: input is undefined"});
  expect_error([&] { transpose(Tensor(), 0, 1); }, {"transpose: input is undefined"});
  expect_error(
      [&] {
        permute(zeros({2, 2}, DType::i64), {1, 0});
      },
      {"permute: expected a floating-point tensor"});
}
