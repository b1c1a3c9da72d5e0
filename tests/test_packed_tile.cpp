// The packed GEMM's register tiles (kernels/cpu/packed_tile*.cpp), each one the CPU runs: every
// SIMD tile gives exactly the bits of one std::fma chain per element over k (then + C, or + the
// bias), so AVX2 and AVX-512 agree bitwise; the portable tile is within the rounding bound. Edge
// columns: two runs with a gap between them, partial vectors, fewer rows than the tile; the gap
// and the rows below stay untouched. The bf16 pair tile, where the CPU has it, against its
// definition (an fma chain over each word's odd then even element, subnormals flushed), down among
// the subnormals.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "regen/core/error.h"
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
        // Depths past the AVX2 tile's slice (kSubTileDepth = 128): chains paused and resumed.
        check_tile<T>(isa, nv, 256, rows, true, false);
        check_tile<T>(isa, nv, 131, rows, false, true);
      }
}

}  // namespace

TEST_CASE("packed tile: SIMD tiles are one fma chain per element, the portable one within bound") {
  check_all<float>();
  check_all<double>();
}

namespace {

float bf16_value(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
float flush(float x) {  // subnormals to a zero of their sign
  return std::fabs(x) < std::numeric_limits<float>::min() ? std::copysign(0.0f, x) : x;
}
uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// A random bf16 value: sign, 8 significant bits, binary exponent in [lo, hi].
uint16_t random_bf16(uint64_t i, uint64_t salt, int lo, int hi) {
  const uint64_t h = (i + 1) * 0x9E3779B97F4A7C15ull ^ (salt * 0xBF58476D1CE4E5B9ull);
  const float v = std::ldexp(static_cast<float>(128 + (h >> 8) % 128) / 128.0f,
                             lo + static_cast<int>((h >> 20) % (hi - lo + 1)));
  return static_cast<uint16_t>(float_bits((h & 1) ? -v : v) >> 16);
}

// The bf16 pair tile against its definition (packed_gemm.h, bf16_pair_tile): per element and
// word, C = flush(fma(flush(a_odd), flush(b_odd), flush(C))), then the same with the even pair,
// one f32 rounding each (the products of two bf16 are exact), subnormals taken as zero.
// Exponents [lo, hi] for A; B's lie in [-8, 8]: a low range puts products and sums among the
// subnormals.
void check_pair_tile(int nv, int64_t kc, int64_t rows, bool accumulate, bool with_bias, int lo,
                     int hi) {
  const TileFn<float> tile = bf16_pair_tile(Isa::avx512_bf16);
  if (!tile) return;
  const int64_t w = nv * kLanes<float>;
  std::vector<uint16_t> a16(static_cast<size_t>(2 * kc * kMR)),
      b16(static_cast<size_t>(2 * kc * w));
  for (size_t i = 0; i < a16.size(); ++i) a16[i] = random_bf16(i, 5, lo, hi);
  for (size_t i = 0; i < b16.size(); ++i) b16[i] = random_bf16(i, 6, -8, 8);
  // The panels' words: word (k, i) of A holds a16[2 (k kMR + i)] low, a16[2 (k kMR + i) + 1] high.
  std::vector<float> a(static_cast<size_t>(kc * kMR)), b(static_cast<size_t>(kc * w));
  std::memcpy(a.data(), a16.data(), a16.size() * sizeof(uint16_t));
  std::memcpy(b.data(), b16.data(), b16.size() * sizeof(uint16_t));
  std::vector<float> bias(kMR);
  for (int i = 0; i < kMR; ++i) bias[i] = value<float>(i, 7);
  const int64_t ld = w + 3;
  std::vector<float> c(static_cast<size_t>(kMR * ld));
  for (size_t i = 0; i < c.size(); ++i)
    c[i] = accumulate ? std::ldexp(value<float>(i, 8), lo - 2) : 777.0f;
  const std::vector<float> before = c;
  const Run<float> run{0, w - 1, c.data()};  // the last column left out
  tile(nv, kc, a.data(), b.data(), &run, 1, rows, ld, accumulate,
       with_bias ? bias.data() : nullptr);
  int bad = 0;
  for (int64_t i = 0; i < kMR; ++i) {
    for (int64_t j = 0; j < w; ++j) {
      const size_t at = static_cast<size_t>(i * ld + j);
      float want = before[at];
      if (i < rows && j < w - 1) {
        float chain = 0.0f;
        for (int64_t k = 0; k < kc; ++k) {
          for (int half : {1, 0}) {
            const float x = flush(bf16_value(a16[2 * (k * kMR + i) + half]));
            const float y = flush(bf16_value(b16[2 * (k * w + j) + half]));
            chain = flush(std::fma(x, y, chain));
          }
        }
        want = accumulate ? before[at] + chain : with_bias ? chain + bias[i] : chain;
      }
      if (float_bits(c[at]) != float_bits(want) && bad++ < 3) {
        MESSAGE("row ", i, " col ", j, ": got ", c[at], ", want ", want);
      }
    }
  }
  INFO("nv=", nv, " kc=", kc, " rows=", rows, " accumulate=", accumulate, " bias=", with_bias,
       " A's exponents ", lo, "..", hi);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("packed tile: the bf16 pair tile sums each pair odd element first, subnormals as zero") {
  if (!bf16_pair_tile(Isa::avx512_bf16)) {
    MESSAGE("no bf16 pair tile on this CPU or in this build: nothing to check");
    return;
  }
  for (int nv = 1; nv <= kMaxNV; ++nv) {
    for (int64_t rows : {int64_t{8}, int64_t{3}}) {
      check_pair_tile(nv, 37, rows, false, false, -6, 6);
      check_pair_tile(nv, 37, rows, false, true, -6, 6);
      check_pair_tile(nv, 5, rows, true, false, -6, 6);
      check_pair_tile(nv, 37, rows, false, false, -140, -112);  // subnormal products and sums
      check_pair_tile(nv, 5, rows, true, false, -140, -112);
    }
  }
  const bool only_avx512_bf16 = bf16_pair_tile(Isa::avx512) == nullptr;
  CHECK(only_avx512_bf16);
}

TEST_CASE("packed tile: the chosen tile exists on this CPU") {
  const Isa isa = tile_isa();
  const bool has_float = tile_kernel<float>(isa) != nullptr;
  const bool has_double = tile_kernel<double>(isa) != nullptr;
  CHECK(has_float);
  CHECK(has_double);
  MESSAGE("packed GEMM tile: ", std::string(isa_name(isa)));
}

TEST_CASE("packed tile: ScopedTileIsa chooses a tile for its scope, refuses one the CPU lacks") {
  const Isa before = tile_isa();
  for (Isa isa : {Isa::avx512_bf16, Isa::avx512, Isa::avx2, Isa::generic}) {
    const bool present = isa == Isa::avx512_bf16 ? bf16_pair_tile(isa) != nullptr
                                                 : tile_kernel<float>(isa) != nullptr;
    CAPTURE(std::string(isa_name(isa)));
    if (present) {
      ScopedTileIsa scope(isa);
      CHECK(tile_isa() == isa);
    } else {
      std::string message;
      try {
        ScopedTileIsa scope(isa);
      } catch (const regen::Error& e) {
        message = e.what();
      }
      CHECK(message.find(std::string("has no ") + isa_name(isa) + " tile") != std::string::npos);
    }
    CHECK(tile_isa() == before);
  }
}
