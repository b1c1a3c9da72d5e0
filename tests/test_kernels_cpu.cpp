// The CPU launchers of kernels/cpu/gemm.cpp and kernels/cpu/elementwise.cpp against plain loops:
// GEMM over every transpose combination with padded leading dimensions, alpha and beta, below and
// above the multithreading threshold (2e6 flops) at 1 and 2 OpenMP threads, against a triple loop
// in long double; the packed GEMM under conv2d (kernels/cpu/packed_gemm.h) against the same kind
// of loop on edge tiles, image boundaries, bias and accumulation, bitwise across thread counts;
// the element-wise launchers and reductions against loops, their scratch memory
// (from the allocator, category workspace), their thread-count independence, and the dropout mask
// against the rule of kernels/kernels.h; the dry paths of kernels.h's kDryRunLaunchers (a dry run
// requests a real call's scratch, in order, and touches no data). Compared with
// |got - ref| <= atol + rtol * |ref|, printing the first mismatches and the worst error.
#include <doctest/doctest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "regen/core/philox.h"
#include "regen/core/tensor.h"
#include "regen/kernels/cpu/packed_gemm.h"
#include "regen/kernels/cpu/panel_transpose.h"
#include "regen/kernels/cpu/philox_words.h"
#include "regen/kernels/kernels.h"
#include "regen/kernels/unary_ops.h"
#include "tests/dry_paths.h"

using namespace regen;
using regen::testing::check_dry_path;

namespace {

template <class T>
const char* type_name() {
  return sizeof(T) == 4 ? "f32" : "f64";
}

// Counts elements outside atol + rtol * |ref| (+ bound[i] when given; NaN counts), printing the
// first few and the worst.
template <class T, class R>
int count_mismatches(const std::string& what, const std::vector<T>& got, const std::vector<R>& ref,
                     double atol, double rtol, const std::vector<double>* bound = nullptr) {
  REQUIRE(got.size() == ref.size());
  int bad = 0;
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double r = static_cast<double>(ref[i]);
    const double err = std::fabs(static_cast<double>(got[i]) - r);
    const double tol = atol + rtol * std::fabs(r) + (bound ? (*bound)[i] : 0.0);
    if (!(err <= tol)) {
      if (bad < 5) {
        std::printf("%s: element %zu: got %.9g expected %.9g (err %.3g > %.3g)\n", what.c_str(), i,
                    static_cast<double>(got[i]), r, err, tol);
      }
      ++bad;
    }
    if (err > worst) {
      worst = err;
      worst_at = i;
    }
  }
  if (bad > 0)
    std::printf("%s: %d mismatches, worst error %.3g at %zu\n", what.c_str(), bad, worst, worst_at);
  return bad;
}

std::vector<double> random_values(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    v[i] = lo + (hi - lo) * philox_uniform01(philox_word(seed, 7, i));
  }
  return v;
}

template <class T>
std::vector<T> cast(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

int64_t workspace_stat(bool peak) {
  const Stat s =
      allocator_for(Device::cpu()).stats().requested_by[static_cast<int>(Category::workspace)];
  return peak ? s.peak : s.current;
}

// Runs `f` with `threads` OpenMP threads, then restores the previous setting.
template <class F>
void with_threads(int threads, F&& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  f();
  omp_set_num_threads(before);
}

// ---- GEMM ---------------------------------------------------------------------------------------

struct GemmCase {
  int64_t M, N, K;
  double alpha, beta;
};

// op(A) (M, K) from A stored (M, K) or, transposed, (K, M), with row stride lda (> the row length:
// the padding must be skipped); likewise B; C (M, N) with row stride ldc, whose padding must stay
// untouched.
template <class T>
void check_gemm(const GemmCase& c, bool ta, bool tb, int threads, uint64_t seed) {
  const int64_t a_rows = ta ? c.K : c.M, a_cols = ta ? c.M : c.K;
  const int64_t b_rows = tb ? c.N : c.K, b_cols = tb ? c.K : c.N;
  const int64_t lda = a_cols + 3, ldb = b_cols + 5, ldc = c.N + 2;
  const std::vector<T> A = cast<T>(random_values(static_cast<size_t>(a_rows * lda), seed));
  const std::vector<T> B = cast<T>(random_values(static_cast<size_t>(b_rows * ldb), seed + 1));
  std::vector<T> C = cast<T>(random_values(static_cast<size_t>(c.M * ldc), seed + 2));
  const T sentinel = T(12345.0);
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = c.N; j < ldc; ++j) C[static_cast<size_t>(i * ldc + j)] = sentinel;
  }
  // beta = 0 must ignore C entirely, NaN included.
  if (c.beta == 0.0) {
    for (int64_t i = 0; i < c.M; ++i)
      C[static_cast<size_t>(i * ldc)] = std::numeric_limits<T>::quiet_NaN();
  }
  auto a_at = [&](int64_t i, int64_t k) {
    return A[static_cast<size_t>(ta ? k * lda + i : i * lda + k)];
  };
  auto b_at = [&](int64_t k, int64_t j) {
    return B[static_cast<size_t>(tb ? j * ldb + k : k * ldb + j)];
  };
  std::vector<long double> ref(static_cast<size_t>(c.M * c.N));
  std::vector<double> bound(ref.size());  // error bound: K * u * (|alpha| sum |a b| + |beta c|)
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      long double acc = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const long double p = static_cast<long double>(a_at(i, k)) * b_at(k, j);
        acc += p;
        mag += std::fabs(p);
      }
      const long double c0 =
          c.beta == 0.0 ? 0.0L : static_cast<long double>(C[static_cast<size_t>(i * ldc + j)]);
      ref[static_cast<size_t>(i * c.N + j)] = c.alpha * acc + c.beta * c0;
      bound[static_cast<size_t>(i * c.N + j)] =
          2.0 * static_cast<double>(c.K + 2) * std::numeric_limits<T>::epsilon() *
          static_cast<double>(std::fabs(c.alpha) * mag + std::fabs(c.beta * c0));
    }
  }
  const int64_t ws_before = workspace_stat(false);
  with_threads(threads, [&] {
    cpu::gemm<T>(ta, tb, c.M, c.N, c.K, static_cast<T>(c.alpha), A.data(), lda, B.data(), ldb,
                 static_cast<T>(c.beta), C.data(), ldc);
  });
  CHECK(workspace_stat(false) == ws_before);  // scratch returned to the allocator
  const std::string what = std::string("gemm<") + type_name<T>() + "> ta=" + std::to_string(ta) +
                           " tb=" + std::to_string(tb) + " M=" + std::to_string(c.M) +
                           " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                           " alpha=" + std::to_string(c.alpha) + " beta=" + std::to_string(c.beta) +
                           " threads=" + std::to_string(threads);
  int bad = 0, padding_touched = 0;
  double worst = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      const size_t r = static_cast<size_t>(i * c.N + j);
      const double got = static_cast<double>(C[static_cast<size_t>(i * ldc + j)]);
      const double err = std::fabs(got - static_cast<double>(ref[r]));
      const double tol = bound[r] + 1e-30;
      worst = std::max(worst, err);
      if (!(err <= tol)) {
        if (bad < 5) {
          std::printf("%s: C[%lld, %lld] = %.12g, expected %.12g (err %.3g > %.3g)\n", what.c_str(),
                      static_cast<long long>(i), static_cast<long long>(j), got,
                      static_cast<double>(ref[r]), err, tol);
        }
        ++bad;
      }
    }
    for (int64_t j = c.N; j < ldc; ++j)
      padding_touched += C[static_cast<size_t>(i * ldc + j)] != sentinel;
  }
  CHECK_MESSAGE(bad == 0, what, ": ", bad, " elements out of tolerance (worst error ", worst, ")");
  CHECK_MESSAGE(padding_touched == 0, what, ": wrote ", padding_touched, " padding elements of C");
}

template <class T>
void gemm_suite() {
  const GemmCase cases[] = {
      {5, 7, 3, 1.0, 0.0},         // tiny: one thread whatever the setting
      {1, 9, 4, 1.0, 1.0},         // a single row, accumulate into C
      {17, 1, 33, -0.5, 0.25},     // a single column
      {131, 97, 83, 1.5, 0.0},     // 2.1e6 flops, M >= N: rows split across threads
      {70, 160, 100, 0.75, -1.0},  // 2.2e6 flops, N > M: columns split across threads
      {64, 300, 129, 1.0, 1.0},    // 5e6 flops, K not a multiple of any block
      // f32 from 8e6 flops with both sides of C at least 32: the packed GEMM (kernels/cpu/gemm.cpp)
      {96, 120, 400, 1.0, 0.0},   // rows split, K past one depth block of 256
      {200, 64, 330, 1.0, 1.0},   // accumulate into C
      {48, 257, 700, 2.5, 0.0},   // columns split, alpha applied after the sums
      {100, 100, 500, 0.5, 0.5},  // a beta the packed GEMM has no form for: Eigen
  };
  uint64_t seed = 100;
  for (const GemmCase& c : cases) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (int threads : {1, 2}) check_gemm<T>(c, ta != 0, tb != 0, threads, seed);
        seed += 3;
      }
    }
  }
}

}  // namespace

TEST_CASE("cpu gemm: all transposes, padded strides, alpha and beta, 1 and 2 threads") {
  gemm_suite<float>();
  gemm_suite<double>();
}

TEST_CASE("cpu gemm: f32 on the packed GEMM gives the same bits at 1 and 2 threads") {
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      const int64_t M = 150, N = 130, K = 600;  // 23 MFLOP: the packed GEMM
      std::vector<float> A(static_cast<size_t>(M * K)), B(static_cast<size_t>(K * N));
      for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.37f * static_cast<float>(i));
      for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.11f * static_cast<float>(i));
      std::vector<float> C1(static_cast<size_t>(M * N)), C2(C1.size());
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      with_threads(1, [&] {
        cpu::gemm<float>(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C1.data(), N);
      });
      with_threads(2, [&] {
        cpu::gemm<float>(ta, tb, M, N, K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, C2.data(), N);
      });
      CHECK_MESSAGE(std::memcmp(C1.data(), C2.data(), C1.size() * sizeof(float)) == 0, "ta=", ta,
                    " tb=", tb);
    }
  }
}

TEST_CASE("unary exp_f32: within 2 ulp of exp down to the subnormals, and specials") {
  // Every 37th float of either sign over [-104, 89] (beyond, exp is 0 or inf in f32), against the
  // double exp: the error in units of the last place of the correctly rounded value (a subnormal
  // result's unit is the smallest subnormal).
  double worst = 0;
  float worst_x = 0;
  int64_t checked = 0;
  for (const uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t b = 0;; b += 37) {
      const uint32_t bits = sign | b;
      float x;
      std::memcpy(&x, &bits, sizeof x);
      if (x > 89.0f || x < -104.0f) break;
      const double want = std::exp(static_cast<double>(x));
      const float w = static_cast<float>(want);
      if (std::isinf(w)) continue;
      const double ulp =
          w == 0.0f
              ? std::numeric_limits<float>::denorm_min()
              : static_cast<double>(std::nextafter(w, std::numeric_limits<float>::infinity())) -
                    static_cast<double>(w);
      const double err = std::fabs(static_cast<double>(unary::exp_f32(x)) - want) / ulp;
      if (err > worst) worst = err, worst_x = x;
      ++checked;
    }
  }
  CHECK(checked > 40000000);
  CHECK_MESSAGE(worst <= 2.0, "worst ", worst, " ulp at ", worst_x);
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(unary::exp_f32(0.0f) == 1.0f);
  CHECK(unary::exp_f32(-0.0f) == 1.0f);
  CHECK(unary::exp_f32(inf) == inf);
  CHECK(unary::exp_f32(89.0f) == inf);
  CHECK(unary::exp_f32(-inf) == 0.0f);
  CHECK(unary::exp_f32(-1e30f) == 0.0f);
  CHECK(unary::exp_f32(-103.0f) > 0.0f);  // a subnormal, not flushed
  CHECK(std::isnan(unary::exp_f32(std::numeric_limits<float>::quiet_NaN())));
  CHECK(unary::exp_f32(1.0f) == doctest::Approx(2.718281828).epsilon(1e-7));
}

TEST_CASE("unary tanh_f32: within 2 ulp of tanh, odd, specials, the same bits vectorized") {
  // Every 37th float from 0 to 12 (past 10 every result is 1), against the double tanh: the error
  // in units of the last place of the correctly rounded value.
  double worst = 0;
  float worst_x = 0;
  int64_t odd_fails = 0;
  for (uint32_t b = 0;; b += 37) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    if (x > 12.0f) break;
    const double want = std::tanh(static_cast<double>(x));
    const float w = static_cast<float>(want);
    const double ulp =
        w == 0.0f ? std::numeric_limits<float>::denorm_min()
                  : static_cast<double>(std::nextafter(w, std::numeric_limits<float>::infinity())) -
                        static_cast<double>(w);
    const float got = unary::tanh_f32(x);
    const double err = std::fabs(static_cast<double>(got) - want) / ulp;
    if (err > worst) worst = err, worst_x = x;
    odd_fails += unary::tanh_f32(-x) != -got;
  }
  CHECK_MESSAGE(worst <= 2.0, "worst ", worst, " ulp at ", worst_x);
  CHECK(odd_fails == 0);
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(unary::tanh_f32(inf) == 1.0f);
  CHECK(unary::tanh_f32(-inf) == -1.0f);
  CHECK(unary::tanh_f32(1e30f) == 1.0f);
  CHECK(std::isnan(unary::tanh_f32(std::numeric_limits<float>::quiet_NaN())));
  CHECK(unary::tanh_f32(0.0f) == 0.0f);
  CHECK(std::signbit(unary::tanh_f32(-0.0f)));
  CHECK(unary::tanh_f32(1e-30f) == 1e-30f);

  // gelu_tanh's CPU loops (vectorized where the compiler can, with a scalar or masked remainder)
  // give an element the same bits wherever it falls: at 1 and 2 threads, and shifted by one
  // element (another split between the vector body and the remainder). Forward and backward.
  const int64_t n = 50001;  // above the parallel threshold, odd
  std::vector<float> x(static_cast<size_t>(n)), dy(x.size());
  for (int64_t i = 0; i < n; ++i) {
    x[static_cast<size_t>(i)] = -14.0f + 28.0f * static_cast<float>(i) / static_cast<float>(n);
    dy[static_cast<size_t>(i)] = std::cos(static_cast<float>(i));
  }
  x[7] = inf;
  x[8] = -inf;
  x[9] = std::numeric_limits<float>::quiet_NaN();
  x[10] = -0.0f;
  auto run = [&](int threads, int64_t shift, std::vector<float>& y, std::vector<float>& dx) {
    y.assign(x.size(), 0.0f);
    dx.assign(x.size(), 0.0f);
    with_threads(threads, [&] {
      cpu::unary_forward<float>(unary::gelu_tanh{}, x.data() + shift, y.data() + shift, n - shift);
      cpu::unary_backward<float>(unary::gelu_tanh{}, dy.data() + shift, x.data() + shift,
                                 dx.data() + shift, n - shift);
    });
  };
  std::vector<float> y1, dx1, y2, dx2, y3, dx3;
  run(1, 0, y1, dx1);
  run(2, 0, y2, dx2);
  run(1, 1, y3, dx3);
  const size_t bytes = (x.size() - 1) * sizeof(float);
  CHECK(std::memcmp(y1.data(), y2.data(), x.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(dx1.data(), dx2.data(), x.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(y1.data() + 1, y3.data() + 1, bytes) == 0);
  CHECK(std::memcmp(dx1.data() + 1, dx3.data() + 1, bytes) == 0);
  // And the values are gelu_tanh's: against the double formula, within 6e-7 |x| (a few f32
  // roundings of a value below |x|; for x < 0, 1 + tanh cancels, so the bound is on |x|, not on
  // the value).
  int64_t off = 0;
  for (int64_t i = 11; i < n; ++i) {
    const double v = x[static_cast<size_t>(i)];
    const double want = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    off += !(std::fabs(y1[static_cast<size_t>(i)] - want) <= 6e-7 * std::fabs(v));
  }
  CHECK(off == 0);
  CHECK(y1[7] == inf);
  CHECK(std::isnan(y1[9]));
}

TEST_CASE("cpu gemm: K = 0 scales C by beta, M or N = 0 touches nothing") {
  std::vector<float> C = {1, 2, 3, 4, 5, 6};
  const float unused = 0;
  cpu::gemm<float>(false, false, 2, 3, 0, 2.0f, &unused, 1, &unused, 3, 0.5f, C.data(), 3);
  CHECK(C == std::vector<float>({0.5f, 1, 1.5f, 2, 2.5f, 3}));
  cpu::gemm<float>(false, false, 0, 3, 4, 1.0f, &unused, 4, &unused, 3, 0.0f, C.data(), 3);
  cpu::gemm<float>(false, false, 2, 0, 4, 1.0f, &unused, 4, &unused, 1, 0.0f, C.data(), 3);
  CHECK(C == std::vector<float>({0.5f, 1, 1.5f, 2, 2.5f, 3}));
}

TEST_CASE("cpu gemm_batched: strided batches against one gemm per matrix") {
  const int64_t batch = 3, M = 40, N = 50, K = 30;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int64_t lda = ta ? M : K, ldb = tb ? K : N;
      const int64_t sa = M * K + 7, sb = K * N + 3, sc = M * N + 5;
      const std::vector<double> A = random_values(static_cast<size_t>(batch * sa), 1 + ta);
      const std::vector<double> B = random_values(static_cast<size_t>(batch * sb), 3 + tb);
      std::vector<double> C(static_cast<size_t>(batch * sc), 0.5), expect = C;
      cpu::gemm_batched<double>(ta, tb, batch, M, N, K, 2.0, A.data(), lda, sa, B.data(), ldb, sb,
                                1.0, C.data(), N, sc);
      for (int64_t i = 0; i < batch; ++i) {
        cpu::gemm<double>(ta, tb, M, N, K, 2.0, A.data() + i * sa, lda, B.data() + i * sb, ldb, 1.0,
                          expect.data() + i * sc, N);
      }
      CHECK(C == expect);  // the same launcher per matrix: bitwise
    }
  }
}

// ---- The packed GEMM under conv2d (kernels/cpu/packed_gemm.h) ----------------------------------

namespace {
// Row-major A (M, K) and B (K, N), packed as packed_gemm.h lays panels out.
template <class T>
struct PlainA {
  const T* p;
  int64_t K;
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, T* dst) const {
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t i = 0; i < cpu::packed::kMR; ++i)
        dst[k * cpu::packed::kMR + i] = i < rows ? p[(m0 + i) * K + k0 + k] : T(0);
  }
};
template <class T>
struct PlainB {
  const T* p;
  int64_t N;
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, T* dst) const {
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t j = 0; j < w; ++j) dst[k * w + j] = j < cols ? p[(k0 + k) * N + j0 + j] : T(0);
  }
};

// C = A B + bias, or C += A B (bias unused), its columns in images of `cpi` columns (rows
// ld = cpi + 3 apart, images M ld + 5 apart): against a long-double loop within
// 2 (K + 2) u (sum |a b| + |c or bias|), the gaps untouched, the same bits at 1 and 2 threads.
template <class T>
void check_packed(int64_t M, int64_t N, int64_t K, int64_t cpi, bool accumulate, bool bias) {
  const int64_t ld = cpi + 3, istride = M * ld + 5, images = (N + cpi - 1) / cpi;
  const std::vector<T> A = cast<T>(random_values(static_cast<size_t>(M * K), M + N));
  const std::vector<T> B = cast<T>(random_values(static_cast<size_t>(K * N), K + 1));
  const std::vector<T> bv = cast<T>(random_values(static_cast<size_t>(M), 5));
  std::vector<T> C1 = cast<T>(random_values(static_cast<size_t>(images * istride), 6));
  std::vector<T> C2 = C1, want = C1;
  std::vector<double> bound(C1.size(), 0.0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      const size_t at = static_cast<size_t>(n / cpi * istride + m * ld + n % cpi);
      long double acc = accumulate ? C1[at] : bias ? bv[static_cast<size_t>(m)] : T(0);
      long double mag = std::fabs(acc);
      for (int64_t k = 0; k < K; ++k) {
        const long double t = static_cast<long double>(A[m * K + k]) * B[k * N + n];
        acc += t;
        mag += std::fabs(t);
      }
      want[at] = static_cast<T>(acc);
      bound[at] = 2.0 * (K + 2) * std::numeric_limits<T>::epsilon() * static_cast<double>(mag);
    }
  }
  auto run = [&](std::vector<T>& C) {
    cpu::packed::gemm<T>(M, N, K, PlainA<T>{A.data(), K}, PlainB<T>{B.data(), N},
                         bias ? bv.data() : nullptr, accumulate, {C.data(), ld, cpi, istride});
  };
  with_threads(1, [&] { run(C1); });
  with_threads(2, [&] { run(C2); });
  const std::string what = std::string("packed gemm<") + type_name<T>() +
                           "> M=" + std::to_string(M) + " N=" + std::to_string(N) +
                           " K=" + std::to_string(K) + " cols/image=" + std::to_string(cpi) +
                           (accumulate ? " accumulate" : "") + (bias ? " bias" : "");
  CHECK_MESSAGE(count_mismatches(what, C1, want, 0.0, 0.0, &bound) == 0, what);  // gaps: exact
  CHECK_MESSAGE(std::memcmp(C1.data(), C2.data(), C1.size() * sizeof(T)) == 0, what);
}
}  // namespace

TEST_CASE(
    "packed gemm: edge tiles, image boundaries, KC blocks, bias, accumulate, 1 and 2 threads") {
  const int64_t cases[][4] = {
      {1, 1, 1, 1},        {5, 7, 3, 7},        // partial vectors and rows
      {13, 29, 300, 5},    {9, 50, 17, 2},      // images end inside a tile; more ends than runs
      {37, 301, 300, 301}, {301, 37, 300, 19},  // threads split columns, rows; two KC blocks
      {6, 10, 0, 10},                           // K = 0
  };
  for (const auto& c : cases) {
    for (int mode = 0; mode < 4; ++mode) {
      check_packed<float>(c[0], c[1], c[2], c[3], mode & 1, mode & 2);
      check_packed<double>(c[0], c[1], c[2], c[3], mode & 1, mode & 2);
    }
  }
}

namespace {
// dst[k * stride + i] = src[i * ld + k] (at k ^ 1 with swap_pairs) for i < n and k < have, 0 for
// n <= i < width and for have <= k, and nothing else of dst written, against the loop that says
// so. A 16-bit source S packs f32 (T): its values are every kind of bit pattern (NaN payloads,
// infinities, subnormals), each expected widened as core/half.h widens it.
template <class S, class T = S>
void check_panel_transpose(int64_t n, int64_t kc, int64_t ld, int64_t stride, int64_t width,
                           bool swap_pairs, int64_t have = std::numeric_limits<int64_t>::max()) {
  std::vector<S> src(static_cast<size_t>(std::max<int64_t>(1, n * ld)));
  for (size_t i = 0; i < src.size(); ++i) {
    if constexpr (std::is_same_v<S, T>) {
      src[i] = static_cast<T>(i % 1009) + T(0.25);
    } else {
      src[i] = S::from_bits(static_cast<uint16_t>(i * 40503u + (i >> 3) * 977u));
    }
  }
  const T sentinel = T(-7);
  std::vector<T> dst(static_cast<size_t>(kc * stride + 1), sentinel), want(dst);
  for (int64_t k = 0; k < kc; ++k) {
    const int64_t row = swap_pairs ? k ^ 1 : k;
    for (int64_t i = 0; i < width; ++i) {
      want[static_cast<size_t>(row * stride + i)] =
          i < n && k < have ? static_cast<T>(src[static_cast<size_t>(i * ld + k)]) : T(0);
    }
  }
  cpu::packed::transpose_into_panel(src.data(), ld, n, kc, dst.data(), stride, width, swap_pairs,
                                    have);
  int64_t bad = 0;
  for (size_t i = 0; i < dst.size(); ++i) bad += std::memcmp(&dst[i], &want[i], sizeof(T)) != 0;
  const char* type = std::is_same_v<S, uint32_t>   ? "u32"
                     : std::is_same_v<S, bfloat16> ? "bf16"
                     : std::is_same_v<S, float16>  ? "f16"
                                                   : type_name<T>();
  CHECK_MESSAGE(bad == 0, "panel transpose<", type, "> n=", n, " kc=", kc, " ld=", ld,
                " stride=", stride, " width=", width, (swap_pairs ? " swapped" : ""),
                " have=", std::min(have, kc), ": ", bad, " elements wrong");
}
}  // namespace

TEST_CASE(
    "panel transpose: whole and partial 8 x 8 blocks, strides, zero columns, swapped pairs, "
    "words, 16-bit rows widened, depths cut short") {
  // {n, kc, ld, stride, width}: A panels (stride = width = kMR), B panels (stride = width = w),
  // depths that end inside a block, sources wider than the depth copied.
  const int64_t cases[][5] = {
      {8, 256, 256, 8, 8},    {5, 256, 300, 8, 8},    {8, 18, 40, 8, 8},  {3, 2, 3, 8, 8},
      {48, 256, 768, 48, 48}, {41, 130, 131, 48, 48}, {16, 8, 8, 16, 16}, {1, 6, 6, 16, 16},
      {0, 4, 1, 16, 16},      {23, 64, 70, 32, 24},
  };
  for (const auto& c : cases) {
    for (const bool swap : {false, true}) {
      check_panel_transpose<float>(c[0], c[1], c[2], c[3], c[4], swap);
      check_panel_transpose<double>(c[0], c[1], c[2], c[3], c[4], swap);
      check_panel_transpose<uint32_t>(c[0], c[1], c[2], c[3], c[4], swap);  // bf16 pair words
      // The widening sources' 16-bit rows, whole and ending inside the block (an odd depth's
      // last pair, a block past the operand's depth).
      for (const int64_t have : {c[1], c[1] - 1, c[1] / 2 + 3, int64_t{0}}) {
        check_panel_transpose<bfloat16, float>(c[0], c[1], c[2], c[3], c[4], swap, have);
        check_panel_transpose<float16, float>(c[0], c[1], c[2], c[3], c[4], swap, have);
        check_panel_transpose<float>(c[0], c[1], c[2], c[3], c[4], swap, have);
      }
    }
  }
}

// ---- Element-wise -------------------------------------------------------------------------------

namespace {
constexpr int64_t kBig = 40003;  // above elementwise.cpp's parallel threshold, not a multiple of 4

template <class T>
double tol_of() {
  return sizeof(T) == 4 ? 2e-6 : 1e-14;
}

template <class T, class F>
void check_unary_loop(const std::string& name, const std::vector<T>& x, const std::vector<T>& dy,
                      int64_t n) {
  CAPTURE(name);
  std::vector<T> y(static_cast<size_t>(n)), dx(y), ref(y);
  cpu::unary_forward<T>(F{}, x.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) ref[i] = F::value(x[i]);
  CHECK(y == ref);
  const std::vector<T>& s = F::reads == unary::Reads::output ? y : x;
  cpu::unary_backward<T>(F{}, dy.data(), s.data(), dx.data(), n);
  for (int64_t i = 0; i < n; ++i) ref[i] = F::grad(dy[i], s[i]);
  CHECK(dx == ref);
}

template <class T>
void elementwise_suite() {
  const double rt = tol_of<T>();
  const std::string tn = type_name<T>();
  for (int64_t n : {int64_t{7}, kBig}) {
    const std::string sz = " n=" + std::to_string(n);
    const std::vector<T> x = cast<T>(random_values(static_cast<size_t>(n), 11, -3, 3));
    const std::vector<T> dy = cast<T>(random_values(static_cast<size_t>(n), 12));
    std::vector<T> y(static_cast<size_t>(n)), ref(static_cast<size_t>(n));

    // The unary list's loops: the functor element by element, bitwise, also above the parallel
    // threshold (their values against references: the op table).
#define REGEN_UNARY_LOOP_CHECK(name) check_unary_loop<T, unary::name>(#name, x, dy, n);
    REGEN_UNARY_OPS(REGEN_UNARY_LOOP_CHECK)
#undef REGEN_UNARY_LOOP_CHECK
    std::vector<T> dx(static_cast<size_t>(n));

    cpu::scale<T>(x.data(), y.data(), n, T(-2.5));
    for (int64_t i = 0; i < n; ++i) ref[i] = T(-2.5) * x[i];
    CHECK(y == ref);
    cpu::fill<T>(y.data(), n, T(0.25));
    CHECK(y == std::vector<T>(static_cast<size_t>(n), T(0.25)));
    cpu::copy<T>(x.data(), y.data(), n);
    CHECK(y == x);
    const T s = T(3);
    cpu::fill_from_scalar<T>(&s, y.data(), n, T(0.5));
    CHECK(y == std::vector<T>(static_cast<size_t>(n), T(1.5)));
    y = x;
    cpu::add_inplace<T>(y.data(), dy.data(), n);
    for (int64_t i = 0; i < n; ++i) ref[i] = x[i] + dy[i];
    CHECK(y == ref);
  }

  // add and mul, same shape and with b broadcast over leading dimensions (b: the last nb).
  for (int64_t nb : {int64_t{1}, int64_t{14}, int64_t{6 * 7 * 1000}}) {
    const int64_t n = 6 * 7 * 1000;  // above the parallel threshold
    REQUIRE(n % nb == 0);
    const std::vector<T> a = cast<T>(random_values(static_cast<size_t>(n), 21));
    const std::vector<T> b = cast<T>(random_values(static_cast<size_t>(nb), 22));
    std::vector<T> y(static_cast<size_t>(n)), ref(static_cast<size_t>(n));
    cpu::add<T>(a.data(), b.data(), y.data(), n, nb);
    for (int64_t i = 0; i < n; ++i) ref[i] = a[i] + b[i % nb];
    CHECK_MESSAGE(y == ref, "add<", tn, "> nb=", nb);
    cpu::mul<T>(a.data(), b.data(), y.data(), n, nb);
    for (int64_t i = 0; i < n; ++i) ref[i] = a[i] * b[i % nb];
    CHECK_MESSAGE(y == ref, "mul<", tn, "> nb=", nb);
  }

  // sum_rows: column sums, small and parallel (rows * cols above the threshold, > 64 columns).
  for (auto rc : {std::pair<int64_t, int64_t>{3, 5}, {300, 130}}) {
    const int64_t rows = rc.first, cols = rc.second;
    const std::vector<T> x = cast<T>(random_values(static_cast<size_t>(rows * cols), 31));
    std::vector<T> y(static_cast<size_t>(cols));
    std::vector<double> ref(static_cast<size_t>(cols), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) ref[c] += static_cast<double>(x[r * cols + c]);
    }
    cpu::sum_rows<T>(x.data(), y.data(), rows, cols);
    CHECK(count_mismatches("sum_rows<" + tn + ">", y, ref, rt, rt) == 0);
  }
}
}  // namespace

TEST_CASE("cpu element-wise: unary maps, fills, add and mul with broadcast, sum_rows") {
  elementwise_suite<float>();
  elementwise_suite<double>();
}

TEST_CASE("cpu sum_all: against a loop, same bits at 1 and 2 threads, allocator scratch") {
  CachingAllocator& alloc = allocator_for(Device::cpu());
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{4096}, int64_t{4097}, int64_t{100003},
                    int64_t{(1 << 17) + 5}}) {
    const std::vector<float> x = cast<float>(random_values(static_cast<size_t>(n), 41, 0, 2));
    double ref = 0;
    for (float v : x) ref += static_cast<double>(v);
    float one = -1, two = -2;
    alloc.reset_peak();
    const int64_t ws_before = workspace_stat(false);
    with_threads(1, [&] { cpu::sum_all<float>(x.data(), &one, n); });
    with_threads(2, [&] { cpu::sum_all<float>(x.data(), &two, n); });
    CHECK(one == static_cast<float>(ref));
    CHECK(std::memcmp(&one, &two, sizeof(float)) == 0);
    // One double per 4096-element chunk, from the allocator (category workspace), returned after.
    const int64_t chunks = n > 4096 ? (n + 4095) / 4096 : 0;
    CHECK_MESSAGE(workspace_stat(true) - ws_before == chunks * static_cast<int64_t>(sizeof(double)),
                  "n=", n);
    CHECK(workspace_stat(false) == ws_before);
  }
  std::vector<double> xd = random_values(50000, 42);
  double got = 0, ref = 0;
  for (double v : xd) ref += v;
  cpu::sum_all<double>(xd.data(), &got, 50000);
  CHECK(std::fabs(got - ref) <= 1e-12 * 50000);
}

TEST_CASE("cpu sum_squares: the sum of squares in double, same bits at 1 and 2 threads") {
  for (int64_t n : {int64_t{0}, int64_t{3}, int64_t{4097}, int64_t{100003}}) {
    const std::vector<float> x = cast<float>(random_values(static_cast<size_t>(n), 43, -3, 3));
    double ref = 0;
    for (float v : x) ref += static_cast<double>(v) * static_cast<double>(v);
    float one = -1, two = -2;
    with_threads(1, [&] { cpu::sum_squares<float>(x.data(), &one, n); });
    with_threads(2, [&] { cpu::sum_squares<float>(x.data(), &two, n); });
    // Chunks of 4096 summed in order: the double total is within a few ulps of the loop's.
    CHECK(std::fabs(one - static_cast<float>(ref)) <= 1e-6 * std::fabs(ref));
    CHECK(std::memcmp(&one, &two, sizeof(float)) == 0);
  }
  const float three_four[2] = {3.0f, -4.0f};
  float y = 0;
  cpu::sum_squares<float>(three_four, &y, 2);
  CHECK(y == 25.0f);
}

TEST_CASE("cpu philox_words: philox_word's bits at every start, length and block counter") {
  const uint64_t seed = 0xfedcba9876543210ull, stream = (uint64_t{5} << 32) + 3;
  // Starts at each word of a block, runs shorter and longer than one pass (64 words), and block
  // counters past 2^32 (their high half in the counter's second word).
  for (const uint64_t base : {uint64_t{0}, uint64_t{1000}, (uint64_t{1} << 34) - 70}) {
    for (uint64_t off = 0; off < 5; ++off) {
      for (const int64_t count : {int64_t{0}, int64_t{1}, int64_t{3}, int64_t{63}, int64_t{64},
                                  int64_t{65}, int64_t{200}}) {
        std::vector<uint32_t> got(static_cast<size_t>(count) + 1, 0xdeadbeefu);
        cpu::philox_words(seed, stream, base + off, count, got.data());
        int64_t wrong = 0;
        for (int64_t k = 0; k < count; ++k) {
          wrong += got[static_cast<size_t>(k)] !=
                   philox_word(seed, stream, base + off + static_cast<uint64_t>(k));
        }
        CHECK_MESSAGE(wrong == 0, "base ", base, " + ", off, ", ", count, " words");
        CHECK(got[static_cast<size_t>(count)] == 0xdeadbeefu);  // nothing past the run
      }
    }
  }
}

TEST_CASE("cpu dropout: keep iff philox_word(seed, stream, i) >= p * 2^32, scale 1 / (1 - p)") {
  for (int64_t n : {int64_t{1}, int64_t{6}, kBig}) {
    std::vector<float> x = cast<float>(random_values(static_cast<size_t>(n), 51));
    if (n >= 6) {  // a dropped element is +0.0 whatever x holds; a kept one is x times the scale
      x[1] = std::numeric_limits<float>::infinity();
      x[3] = -std::numeric_limits<float>::infinity();
      x[4] = std::numeric_limits<float>::quiet_NaN();
      x[5] = -0.0f;
    }
    const uint64_t seed = 0x123456789abcdefull, stream = (uint64_t{3} << 32) + 17;
    for (float p : {0.0f, 0.3f, 1.0f}) {
      const uint64_t threshold = p <= 0.0f ? 0
                                 : p >= 1.0f
                                     ? (uint64_t{1} << 32)
                                     : static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0);
      const float keep_scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
      std::vector<float> ref(static_cast<size_t>(n)), y(static_cast<size_t>(n)), dx(y.size());
      int64_t kept = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool keep = philox_word(seed, stream, static_cast<uint64_t>(i)) >= threshold;
        kept += keep;
        ref[i] = keep ? x[i] * keep_scale : 0.0f;
      }
      with_threads(2, [&] { cpu::dropout_forward<float>(x.data(), y.data(), n, p, seed, stream); });
      CHECK_MESSAGE(std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)) == 0, "n=", n,
                    " p=", p);
      cpu::dropout_backward<float>(x.data(), dx.data(), n, p, seed, stream);  // the same mask
      CHECK(std::memcmp(dx.data(), ref.data(), dx.size() * sizeof(float)) == 0);
      if (n == kBig && p == 0.3f) {
        CHECK(std::fabs(static_cast<double>(kept) / n - 0.7) < 0.01);
      }
    }
  }
}

TEST_CASE("cpu permute: a 4-d permutation against index arithmetic") {
  const int64_t d[4] = {3, 4, 5, 6};
  const int perm[4] = {2, 0, 3, 1};
  const std::vector<double> x = random_values(3 * 4 * 5 * 6, 61);
  PermuteShape s{};
  s.ndim = 4;
  for (int i = 0; i < 4; ++i) {
    s.shape[i] = d[i];
    s.perm[i] = perm[i];
  }
  std::vector<double> y(x.size());
  cpu::permute<double>(x.data(), y.data(), s);
  int64_t at = 0;
  int bad = 0;
  int64_t idx[4];
  for (idx[0] = 0; idx[0] < d[perm[0]]; ++idx[0]) {
    for (idx[1] = 0; idx[1] < d[perm[1]]; ++idx[1]) {
      for (idx[2] = 0; idx[2] < d[perm[2]]; ++idx[2]) {
        for (idx[3] = 0; idx[3] < d[perm[3]]; ++idx[3]) {
          int64_t src[4];
          for (int k = 0; k < 4; ++k) src[perm[k]] = idx[k];
          const int64_t off = ((src[0] * d[1] + src[1]) * d[2] + src[2]) * d[3] + src[3];
          bad += y[static_cast<size_t>(at++)] != x[static_cast<size_t>(off)];
        }
      }
    }
  }
  CHECK(bad == 0);
}

// ---- Dry paths (tests/dry_paths.h) ----------------------------------------------------------

// Each launcher of kernels.h's kDryRunLaunchers, called through REGEN_LAUNCH in a dry run, asks
// the allocator for the same workspace blocks, of the same sizes, in the same order and nesting, as
// a real call with the same thread count, and touches no tensor byte (the Null arena's addresses
// are not memory); every other launcher is skipped.
TEST_CASE(
    "cpu dry paths: the listed launchers request a real call's scratch in order, and only they "
    "run") {
  static_assert(cpu::has_dry_run_path("gemm") && cpu::has_dry_run_path("gemm_batched"));
  static_assert(!cpu::has_dry_run_path("gem") && !cpu::has_dry_run_path("gemm_batchedx"));
  static_assert(!cpu::has_dry_run_path("unary_forward") && !cpu::has_dry_run_path(""));
  const Device cpu = Device::cpu();
  std::set<std::string> covered;
  auto f32 = [&](const Shape& shape) { return zeros(shape, DType::f32, cpu); };

  for (const GemmCase& g : {GemmCase{128, 128, 128, 1, 0}, GemmCase{8, 5, 7, 1, 1},
                            GemmCase{300, 20, 64, 1, 0.5}, GemmCase{6, 9, 0, 1, 2}}) {
    check_dry_path(
        cpu, "gemm " + std::to_string(g.M) + "x" + std::to_string(g.N) + "x" + std::to_string(g.K),
        g.K > 0, [&](const auto& begin) {
          Tensor A = f32({g.M, g.K}), B = f32({g.N, g.K}), C = f32({g.M, g.N});
          begin();
          REGEN_LAUNCH(cpu, float, gemm, false, true, g.M, g.N, g.K, float(g.alpha),
                       A.data<float>(), g.K, B.data<float>(), g.K, float(g.beta), C.data<float>(),
                       g.N);
        });
  }
  covered.insert("gemm");
  check_dry_path(cpu, "gemm_batched", true, [&](const auto& begin) {
    Tensor A = f32({3, 32, 64}), B = f32({3, 32, 48}), C = f32({3, 64, 48});
    begin();
    REGEN_LAUNCH(cpu, float, gemm_batched, true, false, int64_t{3}, int64_t{64}, int64_t{48},
                 int64_t{32}, 1.0f, A.data<float>(), int64_t{64}, int64_t{32 * 64}, B.data<float>(),
                 int64_t{48}, int64_t{32 * 48}, 0.0f, C.data<float>(), int64_t{48},
                 int64_t{64 * 48});
  });
  covered.insert("gemm_batched");
  for (int64_t n : {int64_t{100}, int64_t{100003}}) {
    check_dry_path(cpu, "sum_all " + std::to_string(n), n > 4096, [&](const auto& begin) {
      Tensor x = f32({n}), y = f32({1});
      begin();
      REGEN_LAUNCH(cpu, float, sum_all, x.data<float>(), y.data<float>(), n);
    });
  }
  covered.insert("sum_all");
  check_dry_path(cpu, "sum_squares", true, [&](const auto& begin) {
    Tensor x = f32({100003}), y = f32({1});
    begin();
    REGEN_LAUNCH(cpu, float, sum_squares, x.data<float>(), y.data<float>(), int64_t{100003});
  });
  covered.insert("sum_squares");
  check_dry_path(cpu, "cross_entropy_forward", true, [&](const auto& begin) {
    Tensor logits = f32({64, 100}), lse = f32({64}), loss = f32({1});
    Tensor targets = zeros({64}, DType::i64, cpu);
    begin();
    REGEN_LAUNCH(cpu, float, cross_entropy_forward, logits.data<float>(), targets.data<int64_t>(),
                 loss.data<float>(), lse.data<float>(), int64_t{64}, int64_t{100}, int64_t{-100});
  });
  covered.insert("cross_entropy_forward");

  // Convolutions: 3x3 stride 1 on 16x16 planes (backward-data as a flipped convolution; GEMMs
  // large enough to be threaded), 3x3 stride 2 (dcol and col2im), 3x3 stride 1 on 8x8 planes
  // (dcol: planes below kFlipMinPixels), 1x1 (pointwise), and a 7x7/2 stem.
  const ConvShape convs[] = {make_conv_shape(4, 16, 16, 16, 32, 3, 3, 1, 1, 1, 1),
                             make_conv_shape(3, 8, 16, 16, 16, 3, 3, 2, 2, 1, 1),
                             make_conv_shape(2, 16, 8, 8, 8, 3, 3, 1, 1, 1, 1),
                             make_conv_shape(2, 16, 8, 8, 32, 1, 1, 1, 1, 0, 0),
                             make_conv_shape(2, 3, 32, 32, 16, 7, 7, 2, 2, 3, 3)};
  for (const ConvShape& s : convs) {
    const std::string shape = " C" + std::to_string(s.C) + " " + std::to_string(s.H) + "x" +
                              std::to_string(s.W) + " K" + std::to_string(s.K) + " " +
                              std::to_string(s.R) + "x" + std::to_string(s.S) + "/" +
                              std::to_string(s.stride_h);
    const Shape xs{s.N, s.C, s.H, s.W}, ws{s.K, s.C, s.R, s.S}, ys{s.N, s.K, s.P, s.Q};
    check_dry_path(cpu, "conv2d_forward" + shape, true, [&](const auto& begin) {
      Tensor x = f32(xs), w = f32(ws), b = f32({s.K}), y = f32(ys);
      begin();
      REGEN_LAUNCH(cpu, float, conv2d_forward, x.data<float>(), w.data<float>(), b.data<float>(),
                   y.data<float>(), s);
    });
    check_dry_path(cpu, "conv2d_backward_data" + shape, true, [&](const auto& begin) {
      Tensor dy = f32(ys), w = f32(ws), dx = f32(xs);
      begin();
      REGEN_LAUNCH(cpu, float, conv2d_backward_data, dy.data<float>(), w.data<float>(),
                   dx.data<float>(), s);
    });
    check_dry_path(cpu, "conv2d_backward_filter" + shape, true, [&](const auto& begin) {
      Tensor x = f32(xs), dy = f32(ys), dw = f32(ws), db = f32({s.K});
      begin();
      REGEN_LAUNCH(cpu, float, conv2d_backward_filter, x.data<float>(), dy.data<float>(),
                   dw.data<float>(), db.data<float>(), s);
    });
  }
  covered.insert({"conv2d_forward", "conv2d_backward_data", "conv2d_backward_filter"});
  {
    // A 4x4/2 transposed convolution 8 -> 4 channels, 6x6 -> 12x12 (s: the adjoint conv2d's).
    const ConvShape s = make_conv_transpose_shape(2, 8, 6, 6, 4, 4, 4, 2, 2, 1, 1, 0, 0);
    const Shape xs{s.N, s.K, s.P, s.Q}, ws{s.K, s.C, s.R, s.S}, ys{s.N, s.C, s.H, s.W};
    check_dry_path(cpu, "conv_transpose2d_forward", true, [&](const auto& begin) {
      Tensor x = f32(xs), w = f32(ws), b = f32({s.C}), y = f32(ys);
      begin();
      REGEN_LAUNCH(cpu, float, conv_transpose2d_forward, x.data<float>(), w.data<float>(),
                   b.data<float>(), y.data<float>(), s);
    });
    check_dry_path(cpu, "conv_transpose2d_backward_data", true, [&](const auto& begin) {
      Tensor dy = f32(ys), w = f32(ws), dx = f32(xs);
      begin();
      REGEN_LAUNCH(cpu, float, conv_transpose2d_backward_data, dy.data<float>(), w.data<float>(),
                   dx.data<float>(), s);
    });
    check_dry_path(cpu, "conv_transpose2d_backward_filter", true, [&](const auto& begin) {
      Tensor x = f32(xs), dy = f32(ys), dw = f32(ws), db = f32({s.C});
      begin();
      REGEN_LAUNCH(cpu, float, conv_transpose2d_backward_filter, x.data<float>(), dy.data<float>(),
                   dw.data<float>(), db.data<float>(), s);
    });
    covered.insert({"conv_transpose2d_forward", "conv_transpose2d_backward_data",
                    "conv_transpose2d_backward_filter"});
  }
  for (int64_t S : {int64_t{16}, int64_t{96}}) {
    AttentionShape s;
    s.B = 2;
    s.S = S;
    s.H = 2;
    s.Dh = 32;
    s.scale = 0.125f;
    s.causal = true;
    s.dropout_p = 0.1f;
    const Shape qkv_shape{s.B, S, 3 * s.H * s.Dh}, out_shape{s.B, S, s.H * s.Dh};
    check_dry_path(cpu, "attention_forward S=" + std::to_string(S), true, [&](const auto& begin) {
      Tensor qkv = f32(qkv_shape), out = f32(out_shape), lse = f32({s.B, s.H, S});
      Tensor pad = zeros({s.B, S}, DType::i32, cpu);
      begin();
      REGEN_LAUNCH(cpu, float, attention_forward, qkv.data<float>(), pad.data<int32_t>(),
                   out.data<float>(), lse.data<float>(), s);
    });
    check_dry_path(cpu, "attention_backward S=" + std::to_string(S), true, [&](const auto& begin) {
      Tensor dout = f32(out_shape), qkv = f32(qkv_shape), out = f32(out_shape);
      Tensor lse = f32({s.B, s.H, S}), dqkv = f32(qkv_shape);
      Tensor pad = zeros({s.B, S}, DType::i32, cpu);
      begin();
      REGEN_LAUNCH(cpu, float, attention_backward, dout.data<float>(), qkv.data<float>(),
                   out.data<float>(), lse.data<float>(), pad.data<int32_t>(), dqkv.data<float>(),
                   s);
    });
  }
  covered.insert({"attention_forward", "attention_backward"});

  // Every listed launcher is checked here, and nothing else is listed.
  const std::set<std::string> listed(std::begin(cpu::kDryRunLaunchers),
                                     std::end(cpu::kDryRunLaunchers));
  CHECK(covered == listed);

  // A launcher without a dry path is skipped: on the Null arena's addresses it would fault.
  check_dry_path(cpu, "unary_forward (no dry path)", false, [&](const auto& begin) {
    Tensor x = f32({1000}), y = f32({1000});
    begin();
    REGEN_LAUNCH(cpu, float, unary_forward, unary::relu{}, x.data<float>(), y.data<float>(),
                 int64_t{1000});
  });
}
