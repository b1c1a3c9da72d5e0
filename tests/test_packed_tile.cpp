// The packed GEMM's register tiles (kernels/cpu/packed_tile*.cpp), each one the CPU runs: every
// SIMD tile gives exactly the bits of one std::fma chain per element over k (then + C, or + the
// bias), so AVX2 and AVX-512 agree bitwise; the portable tile is within the rounding bound. Edge
// columns: two runs with a gap between them, partial vectors, fewer rows than the tile; the gap
// and the rows below stay untouched.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "regen/kernels/cpu/packed_gemm.h"

using namespace regen::cpu::packed;

namespace {

template <class T>
T value(uint64_t i, uint64_t salt) {  // deterministic, in [-1, 1), not exactly representable sums
  const uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (salt * 0xBF58476D1CE4E5B9ull);
  return static_cast<T>(static_cast<double>((h >> 11) % 2000003) / 1000001.5 - 1.0);
}

template <class T>
void check_tile(Isa isa, int nv, int64_t kc, int64_t rows, bool accumulate, bool with_bias) {
  const TileFn<T> tile = tile_kernel<T>(isa);
  if (!tile) return;  // not on this CPU or in this build
  const int64_t w = nv * kLanes<T>;
  std::vector<T> a(static_cast<size_t>(kc * kMR)), b(static_cast<size_t>(kc * w)), bias(kMR);
  for (size_t i = 0; i < a.size(); ++i) a[i] = value<T>(i, 1);
  for (size_t i = 0; i < b.size(); ++i) b[i] = value<T>(i, 2);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = value<T>(i, 3);
  // Columns [0, split) land at row offset 0, [split, w - 1) after a gap of 3; column w - 1 is
  // left out (a partial last vector). Row stride ld.
  const int64_t split = w / 2 + 3, gap = 3, ld = w + gap + 5;
  const T sentinel = T(12345);
  std::vector<T> c(static_cast<size_t>(kMR * ld + 8));
  for (size_t i = 0; i < c.size(); ++i) c[i] = accumulate ? value<T>(i, 4) : sentinel;
  const std::vector<T> before = c;
  const Run<T> runs[2] = {{0, split, c.data()}, {split, w - 1, c.data() + split + gap}};
  tile(nv, kc, a.data(), b.data(), runs, 2, rows, ld, accumulate,
       with_bias ? bias.data() : nullptr);

  std::vector<bool> written(c.size(), false);
  int bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < w - 1; ++j) {
      const size_t at = static_cast<size_t>(i * ld + j + (j >= split ? gap : 0));
      written[at] = true;
      T chain = T(0);
      double mag = 0;
      for (int64_t k = 0; k < kc; ++k) {
        chain = std::fma(a[k * kMR + i], b[k * w + j], chain);
        mag += std::fabs(static_cast<double>(a[k * kMR + i]) * b[k * w + j]);
      }
      const T want = accumulate ? before[at] + chain : with_bias ? chain + bias[i] : chain;
      const double err = std::fabs(static_cast<double>(c[at]) - want);
      worst = std::max(worst, err);
      const bool ok = isa == Isa::generic
                          ? err <= 2.0 * (kc + 2) * std::numeric_limits<T>::epsilon() * (mag + 1)
                          : c[at] == want;
      if (!ok && bad++ < 3) {
        MESSAGE(std::string(isa_name(isa)), " row ", i, " col ", j, ": got ", c[at], ", want ",
                want);
      }
    }
  }
  for (size_t at = 0; at < c.size(); ++at) {
    if (!written[at] && c[at] != before[at] && bad++ < 6)
      MESSAGE(std::string(isa_name(isa)), " wrote ", at);
  }
  INFO(std::string(isa_name(isa)), " nv=", nv, " kc=", kc, " rows=", rows,
       " accumulate=", accumulate, " bias=", with_bias, " worst error ", worst);
  CHECK(bad == 0);
}

template <class T>
void check_all() {
  for (Isa isa : {Isa::avx512, Isa::avx2, Isa::generic})
    for (int nv = 1; nv <= kMaxNV; ++nv)
      for (int64_t rows : {int64_t{8}, int64_t{3}}) {
        check_tile<T>(isa, nv, 37, rows, false, false);
        check_tile<T>(isa, nv, 37, rows, false, true);
        check_tile<T>(isa, nv, 5, rows, true, false);
      }
}

}  // namespace

TEST_CASE("packed tile: SIMD tiles are one fma chain per element, the portable one within bound") {
  check_all<float>();
  check_all<double>();
}

TEST_CASE("packed tile: the chosen tile exists on this CPU") {
  const Isa isa = tile_isa();
  const bool has_float = tile_kernel<float>(isa) != nullptr;
  const bool has_double = tile_kernel<double>(isa) != nullptr;
  CHECK(has_float);
  CHECK(has_double);
  MESSAGE("packed GEMM tile: ", std::string(isa_name(isa)));
}
