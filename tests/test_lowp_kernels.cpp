// The CPU low-precision foundation: the f32 <-> bf16/f16 array conversions of
// kernels/cpu/convert.h against core/half.h's scalar functions, bit for bit (every 16-bit pattern
// widened; ties, their neighbours, subnormals, overflow, infinities, NaN payloads and random bit
// patterns narrowed), at lengths and offsets that end inside each vector width, with the bytes
// past the end untouched and nothing done in a dry run; and the mixed-precision GEMM of
// kernels/cpu/gemm_lowp.h, bit for bit against the f32 packed GEMM (kernels/cpu/packed_gemm.h) on
// the widened operands, packed by plain loops here, and against a float64 product within a
// rounding-error bound, over odd shapes, transposes, padded strides, bias and accumulation; bf16 x
// bf16 (summed in depth pairs) the same bits on every SIMD tile the CPU has (the bf16 pair tile
// among them where present), through gemm_lowp_store and conv2d's three passes.
// Hidden cases (doctest::skip; run with --no-skip): every one of the 2^32 f32 patterns narrowed,
// and the throughput figures (conversion GB/s, GEMM GFLOP/s against the f32 GEMMs).
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "regen/core/allocator.h"
#include "regen/core/error.h"
#include "regen/core/half.h"
#include "regen/core/philox.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/gemm_lowp.h"
#include "regen/kernels/cpu/packed_gemm.h"
#include "regen/kernels/cpu/widening_sources.h"
#include "regen/kernels/kernels.h"
#include "tests/dry_paths.h"

using namespace regen;

namespace {

uint32_t bits(float f) {
  return half::bits_of(f);
}

template <class F>
void with_threads(int threads, F&& f) {
  const int before = omp_get_max_threads();
  omp_set_num_threads(threads);
  f();
  omp_set_num_threads(before);
}

// ---- Conversions --------------------------------------------------------------------------------

// The scalar reference of each direction (core/half.h), as raw bits.
uint16_t ref_narrow(float f, bfloat16*) {
  return half::to_bf16(f);
}
uint16_t ref_narrow(float f, float16*) {
  return half::to_fp16(f);
}
uint32_t ref_widen(uint16_t h, bfloat16*) {
  return bits(half::from_bf16(h));
}
uint32_t ref_widen(uint16_t h, float16*) {
  return bits(half::from_fp16(h));
}

template <class H>
const char* format_name() {
  return std::is_same_v<H, bfloat16> ? "bf16" : "f16";
}

// f32 inputs for narrowing: specials, every bf16 value with the low halves that make ties and
// their neighbours, every f16 value with the midpoint to the next one (a tie) and the f32 values
// either side of it, and random bit patterns (NaNs with random payloads among them).
std::vector<float> narrow_inputs() {
  std::vector<uint32_t> u;
  const uint32_t specials[] = {
      0x00000000, 0x00000001, 0x00000002, 0x003fffff, 0x00400000, 0x007fffff,  // f32 subnormals
      0x00800000, 0x3f800000, 0x3f808000, 0x3f818000, 0x3f800001, 0x3f807fff,  // bf16 ties
      0x7f7fffff, 0x7f7f8000, 0x7f7f7fff, 0x7f800000,                          // overflow, inf
      0x7f800001, 0x7f801fff, 0x7f802000, 0x7f80ffff, 0x7f810000, 0x7fa00000,  // signalling NaNs
      0x7fbfffff, 0x7fc00000, 0x7fc00001, 0x7fffffff, 0x7fe00000, 0x7fbf0000,  // quiet NaNs
      0x477fe000, 0x477fefff, 0x477ff000, 0x477fffff, 0x47800000, 0x4f000000,  // f16's 65504..
      0x33000000, 0x33000001, 0x32ffffff, 0x33800000, 0x33c00000, 0x33a00000,  // f16's 2^-24
      0x387fc000, 0x387fe000, 0x387fffff, 0x38800000, 0x38801000, 0x38803000,  // f16 normal edge
      0x7149f2ca, 0x60ad78ec, 0x1e3ce508, 0x0da24260,                          // huge and tiny
  };
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t s : specials) u.push_back(sign | s);
  for (uint32_t h = 0; h < 0x10000; ++h)
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      u.push_back(h << 16 | low);
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // positive finite f16 values; the signs below
    const float a = half::from_fp16(static_cast<uint16_t>(h));
    const float b = h == 0x7bff ? 65536.0f : half::from_fp16(static_cast<uint16_t>(h + 1));
    // Two neighbouring f16 values differ in 11 significant bits: their midpoint is an f32.
    const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);
    for (float f : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      u.push_back(bits(f));
      u.push_back(bits(f) | 0x80000000u);
    }
  }
  for (uint64_t i = 0; i < (1u << 20); ++i) u.push_back(philox_word(2026, 11, i));
  std::vector<float> f(u.size());
  std::memcpy(f.data(), u.data(), u.size() * sizeof(float));
  return f;
}

// Counts results that differ in bits from half.h's, printing the first few.
template <class H>
int64_t narrow_mismatches(const float* x, const H* y, int64_t n, const std::string& what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t want = ref_narrow(x[i], static_cast<H*>(nullptr));
    if (y[i].bits != want) {
      if (bad < 5) {
        std::printf("%s: narrow to %s of 0x%08x (%.9g): got 0x%04x, half.h 0x%04x\n", what.c_str(),
                    format_name<H>(), bits(x[i]), static_cast<double>(x[i]), y[i].bits, want);
      }
      ++bad;
    }
  }
  return bad;
}
template <class H>
int64_t widen_mismatches(const H* x, const float* y, int64_t n, const std::string& what) {
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t want = ref_widen(x[i].bits, static_cast<H*>(nullptr));
    if (bits(y[i]) != want) {
      if (bad < 5) {
        std::printf("%s: widen from %s of 0x%04x: got 0x%08x, half.h 0x%08x\n", what.c_str(),
                    format_name<H>(), x[i].bits, bits(y[i]), want);
      }
      ++bad;
    }
  }
  return bad;
}

constexpr int64_t kLengths[] = {0, 1, 7, 8, 9, 15, 16, 17, 23, 31, 32, 33, 63, 1000};
constexpr int kSlackElems = 24;  // sentinel elements after each output

// Narrows x in whole (the array function: above its parallel threshold) and in pieces of each
// length at several offsets (the span function and the array function), comparing every result
// with half.h and checking the sentinels after each piece.
template <class H>
void check_narrow(const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<H> y(x.size());
  cpu::narrow(x.data(), y.data(), n);
  CHECK(narrow_mismatches(x.data(), y.data(), n, "whole array") == 0);
  with_threads(1, [&] {
    std::vector<H> y1(x.size());
    cpu::narrow(x.data(), y1.data(), n);
    CHECK(std::memcmp(y.data(), y1.data(), y.size() * sizeof(H)) == 0);
  });
  const H sentinel = H::from_bits(0xa5a5);
  for (int64_t len : kLengths) {
    for (int64_t off = 0; off + len <= n && off < 4 * 4099; off += 4099) {
      for (int api = 0; api < 2; ++api) {
        std::vector<H> out(static_cast<size_t>(len + kSlackElems), sentinel);
        if (api == 0)
          cpu::convert::narrow_span(x.data() + off, out.data(), len);
        else
          cpu::narrow(x.data() + off, out.data(), len);
        const std::string what = std::string(api ? "narrow" : "narrow_span") +
                                 " length=" + std::to_string(len) +
                                 " offset=" + std::to_string(off);
        CHECK_MESSAGE(narrow_mismatches(x.data() + off, out.data(), len, what) == 0, what);
        bool kept = true;
        for (int i = 0; i < kSlackElems; ++i) kept = kept && out[len + i].bits == sentinel.bits;
        CHECK_MESSAGE(kept, what, ": wrote past the end");
      }
    }
  }
}

// Widens every 16-bit pattern, in whole, repeated past the parallel threshold, and in pieces.
template <class H>
void check_widen() {
  std::vector<H> x(1 << 16);
  for (uint32_t h = 0; h < x.size(); ++h) x[h] = H::from_bits(static_cast<uint16_t>(h));
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size());
  cpu::widen(x.data(), y.data(), n);
  CHECK(widen_mismatches(x.data(), y.data(), n, "all patterns") == 0);
  std::vector<H> big;
  for (int r = 0; r < 5; ++r) big.insert(big.end(), x.begin(), x.end());
  std::vector<float> ybig(big.size());
  cpu::widen(big.data(), ybig.data(), static_cast<int64_t>(big.size()));  // in parallel
  CHECK(widen_mismatches(big.data(), ybig.data(), static_cast<int64_t>(big.size()), "5 x all") ==
        0);
  float sentinel;
  const uint32_t sentinel_bits = 0xdeadbeef;
  std::memcpy(&sentinel, &sentinel_bits, sizeof sentinel);
  for (int64_t len : kLengths) {
    // Offsets that put NaNs, infinities, subnormals and zeros into every lane position.
    for (int64_t off : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{0x7bf9}, int64_t{0x7c00 - 3},
                        int64_t{0xfbf9}, int64_t{0xfc00 - 7}, int64_t{0x10000 - 1000}}) {
      if (off + len > n) continue;
      for (int api = 0; api < 2; ++api) {
        std::vector<float> out(static_cast<size_t>(len + kSlackElems), sentinel);
        if (api == 0)
          cpu::convert::widen_span(x.data() + off, out.data(), len);
        else
          cpu::widen(x.data() + off, out.data(), len);
        const std::string what = std::string(api ? "widen" : "widen_span") +
                                 " length=" + std::to_string(len) +
                                 " offset=" + std::to_string(off);
        CHECK_MESSAGE(widen_mismatches(x.data() + off, out.data(), len, what) == 0, what);
        bool kept = true;
        for (int i = 0; i < kSlackElems; ++i) kept = kept && bits(out[len + i]) == sentinel_bits;
        CHECK_MESSAGE(kept, what, ": wrote past the end");
      }
    }
  }
}

}  // namespace

TEST_CASE("convert: widening every bf16 and f16 pattern equals core/half.h bit for bit") {
  check_widen<bfloat16>();
  check_widen<float16>();
}

TEST_CASE("convert: narrowing ties, subnormals, overflow, NaNs and random f32 equals core/half.h") {
  const std::vector<float> x = narrow_inputs();
  check_narrow<bfloat16>(x);
  check_narrow<float16>(x);
}

TEST_CASE("convert: a dry run reads and writes nothing") {
  std::vector<float> x(100000, 1.0f), y(100000, 2.0f);
  std::vector<bfloat16> b(100000, bfloat16::from_bits(7));
  std::vector<float16> h(100000, float16::from_bits(9));
  {
    DryRunScope scope(Device::cpu());
    cpu::narrow(x.data(), b.data(), 100000);
    cpu::narrow(x.data(), h.data(), 100000);
    cpu::widen(b.data(), y.data(), 100000);
    cpu::widen(h.data(), y.data(), 100000);
  }
  CHECK(std::all_of(b.begin(), b.end(), [](bfloat16 v) { return v.bits == 7; }));
  CHECK(std::all_of(h.begin(), h.end(), [](float16 v) { return v.bits == 9; }));
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 2.0f; }));
}

// Every f32 bit pattern, narrowed to both formats (about 10 s on one Zen 4 core).
TEST_CASE("convert: every one of the 2^32 f32 patterns narrows as core/half.h" * doctest::skip()) {
  constexpr int64_t kBlock = 1 << 20, kBlocks = (int64_t{1} << 32) / kBlock;
  int64_t bad_bf16 = 0, bad_f16 = 0;
#pragma omp parallel reduction(+ : bad_bf16, bad_f16)
  {
    std::vector<float> xv(kBlock);
    std::vector<bfloat16> b(kBlock);
    std::vector<float16> h(kBlock);
    const float* x = xv.data();
#pragma omp for schedule(dynamic)
    for (int64_t blk = 0; blk < kBlocks; ++blk) {
      for (int64_t i = 0; i < kBlock; ++i)
        xv[i] = half::float_of(static_cast<uint32_t>(blk * kBlock + i));
      // The array functions (inside this parallel region, on this thread alone).
      cpu::narrow(x, b.data(), kBlock);
      cpu::narrow(x, h.data(), kBlock);
      for (int64_t i = 0; i < kBlock; ++i) {
        bad_bf16 += b[i].bits != half::to_bf16(x[i]);
        bad_f16 += h[i].bits != half::to_fp16(x[i]);
      }
    }
  }
  CHECK(bad_bf16 == 0);
  CHECK(bad_f16 == 0);
  std::printf("all 2^32 f32 patterns: %lld bf16 and %lld f16 results differ from core/half.h\n",
              static_cast<long long>(bad_bf16), static_cast<long long>(bad_f16));
}

// ---- The mixed-precision GEMM -------------------------------------------------------------------

namespace {

// A matrix of `rows` x `cols` elements stored row-major with rows ld = cols + 3 apart, the three
// padding elements of each row NaN (a GEMM that read them would turn C into NaN), in f32 and in
// its storage type; the f32 copy holds the widened values.
struct Stored {
  int64_t rows, cols, ld;
  DType dtype;
  std::vector<float> wide;       // f32, the widened values (padding NaN)
  std::vector<uint16_t> narrow;  // the bf16 or f16 bits (empty for f32)
  const void* data() const {
    return dtype == DType::f32 ? static_cast<const void*>(wide.data()) : narrow.data();
  }
};

Stored make_stored(int64_t rows, int64_t cols, DType dtype, uint64_t seed) {
  Stored s{rows, cols, cols + 3, dtype, {}, {}};
  const size_t size = static_cast<size_t>(rows * s.ld);
  s.wide.assign(size, std::numeric_limits<float>::quiet_NaN());
  if (dtype != DType::f32) s.narrow.assign(size, dtype == DType::bf16 ? 0x7fc1 : 0x7e01);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const size_t at = static_cast<size_t>(r * s.ld + c);
      const float v = 2.0f * philox_uniform01(philox_word(seed, 3, at)) - 1.0f;
      if (dtype == DType::bf16) {
        s.narrow[at] = half::to_bf16(v);
        s.wide[at] = half::from_bf16(s.narrow[at]);
      } else if (dtype == DType::f16) {
        s.narrow[at] = half::to_fp16(v);
        s.wide[at] = half::from_fp16(s.narrow[at]);
      } else {
        s.wide[at] = v;
      }
    }
  }
  return s;
}

// Plain f32 packing of op(A) and op(B), element by element, in packed_gemm.h's panel layout. With
// `pairs` (the order of a bf16 x bf16 product, kernels/cpu/widening_sources.h), the depth is
// `depth` rounded up to even, 0 past `depth`, and each pair is packed odd element first.
struct PlainA {
  const float* p;
  int64_t ld;
  bool trans;
  bool pairs;
  int64_t depth;
  float at(int64_t m, int64_t k) const { return trans ? p[k * ld + m] : p[m * ld + k]; }
  float packed_at(int64_t m, int64_t k) const {
    if (pairs) k ^= 1;
    return k < depth ? at(m, k) : 0.0f;
  }
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, float* dst) const {
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t i = 0; i < cpu::packed::kMR; ++i)
        dst[k * cpu::packed::kMR + i] = i < rows ? packed_at(m0 + i, k0 + k) : 0.0f;
  }
};
struct PlainB {
  const float* p;
  int64_t ld;
  bool trans;
  bool pairs;
  int64_t depth;
  float at(int64_t k, int64_t n) const { return trans ? p[n * ld + k] : p[k * ld + n]; }
  float packed_at(int64_t k, int64_t n) const {
    if (pairs) k ^= 1;
    return k < depth ? at(k, n) : 0.0f;
  }
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, float* dst) const {
    for (int64_t k = 0; k < kc; ++k)
      for (int64_t j = 0; j < w; ++j) dst[k * w + j] = j < cols ? packed_at(k0 + k, j0 + j) : 0.0f;
  }
};

// rounding_gamma(n, u) = n u / (1 - n u): the relative error bound of n roundings with unit
// roundoff u.
double rounding_gamma(int64_t n, double u) {
  return static_cast<double>(n) * u / (1.0 - n * u);
}

// One operand layout and dtype pair, under the three modes: C = op(A) op(B), C = op(A) op(B) +
// bias, C += op(A) op(B).
void check_gemm_lowp(int64_t M, int64_t N, int64_t K, DType ta_dtype, DType tb_dtype, bool trans_a,
                     bool trans_b) {
  const Stored A =
      trans_a ? make_stored(K, M, ta_dtype, 1 + M) : make_stored(M, K, ta_dtype, 1 + M);
  const Stored B =
      trans_b ? make_stored(N, K, tb_dtype, 2 + N) : make_stored(K, N, tb_dtype, 2 + N);
  // bf16 x bf16 multiplies depth pairs, odd element first (gemm_lowp.h).
  const bool pairs = ta_dtype == DType::bf16 && tb_dtype == DType::bf16;
  const int64_t packed_depth = pairs ? K + K % 2 : K;
  const PlainA pa{A.wide.data(), A.ld, trans_a, pairs, K};
  const PlainB pb{B.wide.data(), B.ld, trans_b, pairs, K};
  std::vector<float> bias_v(static_cast<size_t>(M));
  for (int64_t m = 0; m < M; ++m) bias_v[m] = 2.0f * philox_uniform01(philox_word(5, 0, m)) - 1.0f;
  // The float64 products, summed, and the sums of their magnitudes (see the bound below).
  std::vector<double> dot(static_cast<size_t>(M * N)), mag_dot(dot.size());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0, mag = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double t = static_cast<double>(pa.at(m, k)) * pb.at(k, n);
        s += t;
        mag += std::fabs(t);
      }
      dot[m * N + n] = s;
      mag_dot[m * N + n] = mag;
    }
  }
  const int64_t ldc = N + 5;
  for (int mode = 0; mode < 3; ++mode) {
    const bool bias = mode == 1, accumulate = mode == 2;
    const std::string what = std::string("gemm_lowp ") + dtype_name(ta_dtype) + " x " +
                             dtype_name(tb_dtype) + " M=" + std::to_string(M) +
                             " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                             (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") +
                             (bias ? " bias" : "") + (accumulate ? " accumulate" : "");
    CAPTURE(what);
    // C's start: random values under accumulation, NaN otherwise (it must be ignored); its
    // padding columns a sentinel that must survive.
    std::vector<float> c0(static_cast<size_t>(M * ldc), -7.5f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        c0[m * ldc + n] = accumulate ? 2.0f * philox_uniform01(philox_word(6, m, n)) - 1.0f
                                     : std::numeric_limits<float>::quiet_NaN();
    const float* bias_p = bias ? bias_v.data() : nullptr;

    std::vector<float> got = c0, got2 = c0, want = c0;
    cpu::gemm_lowp(trans_a, trans_b, M, N, K, ta_dtype, A.data(), A.ld, tb_dtype, B.data(), B.ld,
                   bias_p, accumulate, got.data(), ldc);
    with_threads(1, [&] {
      cpu::gemm_lowp(trans_a, trans_b, M, N, K, ta_dtype, A.data(), A.ld, tb_dtype, B.data(), B.ld,
                     bias_p, accumulate, got2.data(), ldc);
    });
    cpu::packed::gemm<float>(M, N, packed_depth, pa, pb, bias_p, accumulate,
                             {want.data(), ldc, N, 0});

    // The strongest check: the same bits as the f32 packed GEMM on the widened operands (padding
    // included; for bf16 x bf16 packed in pairs, odd first), and at every thread count. On a CPU
    // with the bf16 pair tile gemm_lowp runs it, so the f32 tiles on swapped pairs are run here
    // too (and where it has none, the pair tile is what the CPU lacks).
    CHECK_MESSAGE(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0,
                  "differs from the f32 packed GEMM on widened operands");
    CHECK_MESSAGE(std::memcmp(got.data(), got2.data(), got.size() * sizeof(float)) == 0,
                  "differs between the default thread count and one thread");
    if (pairs) {
      std::vector<float> swapped = c0;
      const auto* a16 = reinterpret_cast<const bfloat16*>(A.narrow.data());
      const auto* b16 = reinterpret_cast<const bfloat16*>(B.narrow.data());
      cpu::packed::gemm<float>(M, N, packed_depth,
                               cpu::packed::WideningA<bfloat16>{a16, A.ld, trans_a, true, K},
                               cpu::packed::WideningB<bfloat16>{b16, B.ld, trans_b, true, K},
                               bias_p, accumulate, {swapped.data(), ldc, N, 0});
      CHECK_MESSAGE(std::memcmp(swapped.data(), want.data(), got.size() * sizeof(float)) == 0,
                    "the widening sources with swapped pairs differ from plain packing");
    }

    // Against float64. Each C element is s = c + sum_k a_k b_k, c the bias, C's old value or 0.
    // The f32 GEMM computes each depth block's sum as a chain of FMAs from 0 and adds the block
    // sums to c in order; an FMA rounds a_k b_k + partial once, so every operation is one rounding
    // of an exact result, and a term (c or a product) passes through at most K + 1 of them: the
    // FMAs left in its block and one addition per block from its own, and the first block's FMAs
    // plus the number of blocks is at most K + 1 since every later block holds at least one k.
    // Hence |computed - s| <= rounding_gamma(K + 1, 2^-24) (|c| + sum_k |a_k b_k|). The float64
    // value: the widened operands have at most 24 significant bits, so each product is exact in
    // float64 (48 <= 53 bits) and its K + 1 additions are within rounding_gamma(K + 1, 2^-53) of
    // the same magnitude. The bound used is the sum of the two, plus the same again in float64 for
    // the rounding of the bound itself (the values lie in [-1, 1]: no term is near the underflow
    // threshold, where an absolute term would be needed).
    const double rel = rounding_gamma(K + 1, 0x1p-24) + 2 * rounding_gamma(K + 1, 0x1p-53);
    int64_t bad = 0;
    double worst = 0.0;
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        const double c = accumulate ? c0[m * ldc + n] : bias ? bias_v[m] : 0.0;
        const double s = c + dot[m * N + n], mag = std::fabs(c) + mag_dot[m * N + n];
        const double err = std::fabs(static_cast<double>(got[m * ldc + n]) - s);
        worst = std::max(worst, mag > 0 ? err / mag : err);
        if (!(err <= rel * mag)) {
          if (bad < 5) {
            std::printf("%s: C(%lld, %lld) = %.9g, float64 %.17g, error %.3g > bound %.3g\n",
                        what.c_str(), static_cast<long long>(m), static_cast<long long>(n),
                        static_cast<double>(got[m * ldc + n]), s, err, rel * mag);
          }
          ++bad;
        }
      }
    }
    CHECK_MESSAGE(bad == 0, bad, " elements outside the float64 bound (worst error / magnitude ",
                  worst, ")");
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = N; n < ldc; ++n) REQUIRE(got[m * ldc + n] == -7.5f);
  }
}

}  // namespace

TEST_CASE("gemm_lowp: bf16 and f16 operands equal the f32 packed GEMM on widened operands") {
  const int64_t shapes[][3] = {
      {1, 1, 1},      {17, 33, 65}, {128, 257, 300},  // edge tiles; K = 300: two depth blocks
      {300, 40, 20},  {5, 3, 700},  {9, 49, 256},     // rows split; three blocks; one full block
      {3, 4000, 257}, {8, 48, 0},                     // a column block past kNC; K = 0
  };
  const DType pairs[][2] = {{DType::bf16, DType::bf16}, {DType::f16, DType::f16},
                            {DType::bf16, DType::f32},  {DType::f32, DType::f16},
                            {DType::f16, DType::bf16},  {DType::f32, DType::f32}};
  for (const auto& s : shapes)
    for (const auto& p : pairs)
      for (int t = 0; t < 4; ++t) check_gemm_lowp(s[0], s[1], s[2], p[0], p[1], t & 1, t & 2);
}

TEST_CASE(
    "gemm_lowp: a dtype other than f32, bf16 or f16 is refused, and a dry run computes nothing") {
  std::vector<double> a(4, 1.0);
  std::vector<float> b(4, 1.0f), c(4, 3.0f);
  bool threw = false;
  try {
    cpu::gemm_lowp(false, false, 2, 2, 2, DType::f64, a.data(), 2, DType::f32, b.data(), 2, nullptr,
                   false, c.data(), 2);
  } catch (const Error& e) {
    threw = std::string(e.what()).find("operand A is f64") != std::string::npos;
  }
  CHECK(threw);
  std::vector<uint16_t> h(64 * 64, 0x3c00);
  std::vector<float> out(64 * 64, 3.0f);
  {
    DryRunScope scope(Device::cpu());
    cpu::gemm_lowp(false, true, 64, 64, 64, DType::f16, h.data(), 64, DType::bf16, h.data(), 64,
                   nullptr, false, out.data(), 64);
  }
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 3.0f; }));
}

TEST_CASE("gemm_lowp_store: the f32 result rounded once per element, in strips, with bias") {
  // Bitwise against gemm_lowp's f32 C (itself bitwise the f32 packed GEMM, above) with alpha,
  // beta and the column bias applied in f32 and each element rounded once to C's dtype. Shapes
  // larger than one strip (lowp_strips) cut the product into strips of rows, or of columns when N
  // is the longer side ({300, 4000, 300}, {40, 30000, 20}), which must not change a bit; K = 300
  // spans two depth blocks.
  const int64_t shapes[][3] = {
      {5, 7, 9}, {300, 4000, 300}, {1100, 1000, 33}, {40, 30000, 20}, {8, 48, 0}};
  for (const auto& sh : shapes) {
    const int64_t M = sh[0], N = sh[1], K = sh[2];
    for (DType dt : {DType::bf16, DType::f16}) {
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        CAPTURE(M);
        CAPTURE(N);
        CAPTURE(K);
        CAPTURE(dtype_name(dt));
        CAPTURE(t);
        const Stored A = ta ? make_stored(K, M, dt, 11) : make_stored(M, K, dt, 11);
        const Stored B = tb ? make_stored(N, K, dt, 12) : make_stored(K, N, dt, 12);
        const Stored bias = make_stored(1, N, dt, 13);
        const Stored c_old = make_stored(M, N, dt, 14);  // ld = N + 3
        const int64_t ldc = c_old.ld;
        std::vector<float> acc(static_cast<size_t>(M * N));
        cpu::gemm_lowp(ta, tb, M, N, K, dt, A.data(), A.ld, dt, B.data(), B.ld, nullptr, false,
                       acc.data(), N);
        for (int mode = 0; mode < 2; ++mode) {
          // mode 0: alpha 1, beta 0 (C's NaN padding and old values ignored), no bias;
          // mode 1: alpha 0.5, beta -2, the bias.
          const float alpha = mode ? 0.5f : 1.0f, beta = mode ? -2.0f : 0.0f;
          std::vector<uint16_t> c = c_old.narrow;
          cpu::gemm_lowp_store(ta, tb, M, N, K, dt, A.data(), A.ld, dt, B.data(), B.ld, alpha, beta,
                               dt, mode ? bias.data() : nullptr, dt, c.data(), ldc);
          int64_t bad = 0;
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              float v = alpha * acc[static_cast<size_t>(m * N + n)];
              if (mode) v += beta * c_old.wide[static_cast<size_t>(m * ldc + n)];
              if (mode) v += bias.wide[static_cast<size_t>(n)];
              const uint16_t want = dt == DType::bf16 ? half::to_bf16(v) : half::to_fp16(v);
              bad += c[static_cast<size_t>(m * ldc + n)] != want;
            }
            for (int64_t n = N; n < ldc; ++n) {
              bad += c[static_cast<size_t>(m * ldc + n)] !=
                     c_old.narrow[static_cast<size_t>(m * ldc + n)];
            }
          }
          CHECK(bad == 0);
        }
      }
    }
  }
  const auto strips = [](int64_t M, int64_t N) {
    const cpu::LowpStrips s = cpu::lowp_strips(M, N);
    return std::make_pair(s.by_columns, s.extent);
  };
  CHECK(strips(100000, 4096) == std::make_pair(false, int64_t{256}));
  CHECK(strips(3, 4096) == std::make_pair(false, int64_t{3}));
  CHECK(strips(1000, 1000) == std::make_pair(false, int64_t{1000}));    // one strip
  CHECK(strips(1024, 30000) == std::make_pair(true, int64_t{1024}));    // across the longer side
  CHECK(strips(1000, 1 << 22) == std::make_pair(true, int64_t{1040}));  // 1048576 / 1000, by 16s
  CHECK(strips(4000, 4000) == std::make_pair(false, int64_t{256}));
  CHECK(strips(100, 1 << 30) == std::make_pair(true, int64_t{10480}));
}

TEST_CASE("gemm_lowp_store: a dry run requests the real call's blocks and writes nothing") {
  std::vector<uint16_t> h(600 * 600, 0x3c00), c(600 * 600, 0x1234);
  auto call = [&] {
    cpu::gemm_lowp_store(false, true, 600, 600, 300, DType::bf16, h.data(), 600, DType::bf16,
                         h.data(), 300, 1.0f, 0.0f, DType::bf16, nullptr, DType::bf16, c.data(),
                         600);
  };
  const testing::ScratchEvents real =
      testing::scratch_events(Device::cpu(), false, [&](const auto& begin) {
        begin();
        call();
      });
  std::fill(c.begin(), c.end(), uint16_t{0x1234});
  const testing::ScratchEvents dry =
      testing::scratch_events(Device::cpu(), true, [&](const auto& begin) {
        begin();
        call();
      });
  CHECK(!real.empty());
  CHECK(dry == real);
  CHECK(std::all_of(c.begin(), c.end(), [](uint16_t v) { return v == 0x1234; }));
}

// ---- Throughput (hidden: run with --no-skip)
// -----------------------------------------------------

namespace {

// The median of `reps` timings of f, in seconds, after one warm-up call.
template <class F>
double median_seconds(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto start = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

TEST_CASE("bench: conversion GB/s and gemm_lowp GFLOP/s against the f32 GEMMs" * doctest::skip()) {
#ifdef __AVX512F__
  const char* isa = "AVX-512";
#elif defined(__AVX2__)
  const char* isa = "AVX2";
#else
  const char* isa = "scalar";
#endif
  std::printf("CPU, %s build; medians; bytes moved = read + written\n", isa);
  for (int64_t n : {int64_t{1} << 14, int64_t{1} << 24}) {
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[i] = philox_uniform01(philox_word(9, 0, i)) * 100.0f;
    std::vector<bfloat16> b(static_cast<size_t>(n));
    std::vector<float16> h(static_cast<size_t>(n));
    const int reps = n < (1 << 20) ? 2001 : 15;
    // Below convert.cpp's parallel threshold (2^16 elements) the array functions run serially.
    const std::vector<int> thread_counts =
        n > (1 << 16) ? std::vector<int>{1, omp_get_num_procs()} : std::vector<int>{1};
    for (int threads : thread_counts) {
      with_threads(threads, [&] {
        const double gb = 6.0 * n / 1e9;
        const double nb = median_seconds(reps, [&] { cpu::narrow(x.data(), b.data(), n); });
        const double nh = median_seconds(reps, [&] { cpu::narrow(x.data(), h.data(), n); });
        const double wb = median_seconds(reps, [&] { cpu::widen(b.data(), y.data(), n); });
        const double wh = median_seconds(reps, [&] { cpu::widen(h.data(), y.data(), n); });
        const double cp = median_seconds(reps, [&] { std::memcpy(y.data(), x.data(), 4 * n); });
        std::printf(
            "n=%-9lld threads=%d  GB/s: narrow bf16 %6.1f  f16 %6.1f  widen bf16 %6.1f  f16 %6.1f"
            "  (memcpy of the f32 array, 1 thread: %6.1f)\n",
            static_cast<long long>(n), threads, gb / nb, gb / nh, gb / wb, gb / wh,
            8.0 * n / 1e9 / cp);
      });
    }
  }
  const int64_t S = 512;
  const double flops = 2.0 * S * S * S;
  const Stored Af = make_stored(S, S, DType::f32, 1), Bf = make_stored(S, S, DType::f32, 2);
  const Stored Ab = make_stored(S, S, DType::bf16, 1), Bb = make_stored(S, S, DType::bf16, 2);
  const Stored Ah = make_stored(S, S, DType::f16, 1), Bh = make_stored(S, S, DType::f16, 2);
  // Eigen's f32 GEMM (cpu::gemm) wants dense rows: the stored matrices' padding is skipped by ld.
  std::vector<float> C(static_cast<size_t>(S * S));
  with_threads(1, [&] {
    auto lowp = [&](const Stored& A, const Stored& B, bool tb) {
      return median_seconds(9, [&] {
        cpu::gemm_lowp(false, tb, S, S, S, A.dtype, A.data(), A.ld, B.dtype, B.data(), B.ld,
                       nullptr, false, C.data(), S);
      });
    };
    const double eigen = median_seconds(9, [&] {
      cpu::gemm<float>(false, false, S, S, S, 1.0f, Af.wide.data(), Af.ld, Bf.wide.data(), Bf.ld,
                       0.0f, C.data(), S);
    });
    const double f32 = lowp(Af, Bf, false), f32t = lowp(Af, Bf, true);
    const double bf = lowp(Ab, Bb, false), bft = lowp(Ab, Bb, true);
    const double hf = lowp(Ah, Bh, false), hft = lowp(Ah, Bh, true);
    const double bfx = lowp(Ab, Bf, false);
    std::printf("GEMM 512^3, 1 thread, GFLOP/s (ratio to the f32 packed GEMM, same layout):\n");
    std::printf("  cpu::gemm<float> (Eigen)       %6.1f\n", flops / eigen / 1e9);
    std::printf("  packed f32 (gemm_lowp f32)     %6.1f   B^T %6.1f\n", flops / f32 / 1e9,
                flops / f32t / 1e9);
    std::printf("  gemm_lowp bf16 x bf16          %6.1f (%.2f)   B^T %6.1f (%.2f)\n",
                flops / bf / 1e9, f32 / bf, flops / bft / 1e9, f32t / bft);
    std::printf("  gemm_lowp f16 x f16            %6.1f (%.2f)   B^T %6.1f (%.2f)\n",
                flops / hf / 1e9, f32 / hf, flops / hft / 1e9, f32t / hft);
    std::printf("  gemm_lowp bf16 x f32           %6.1f (%.2f)\n", flops / bfx / 1e9, f32 / bfx);
  });
}

// ---- bf16 in depth pairs: the same bits on every SIMD tile
// ----------------------------------------

namespace {

// The SIMD tiles this build and CPU have: the bf16 pair tile's ISA (where present) first.
std::vector<cpu::packed::Isa> simd_isas() {
  using cpu::packed::Isa;
  std::vector<Isa> isas;
  for (Isa isa : {Isa::avx512_bf16, Isa::avx512, Isa::avx2})
    if (cpu::packed::tile_kernel<float>(isa) != nullptr) isas.push_back(isa);
  return isas;
}

std::vector<bfloat16> random_bf16(int64_t n, uint64_t seed) {
  std::vector<bfloat16> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = bfloat16(2.0f * philox_uniform01(philox_word(seed, 9, i)) - 1.0f);
  return v;
}

// f(outputs) under every SIMD tile: each run's outputs must equal the first's, bit for bit.
void check_same_on_every_tile(const std::string& what,
                              const std::function<std::vector<bfloat16>()>& run) {
  const auto isas = simd_isas();
  std::vector<bfloat16> first;
  for (size_t i = 0; i < isas.size(); ++i) {
    cpu::packed::ScopedTileIsa scope(isas[i]);
    const std::vector<bfloat16> got = run();
    if (i == 0) {
      first = got;
      continue;
    }
    int64_t differ = 0;
    for (size_t j = 0; j < got.size(); ++j) differ += got[j].bits != first[j].bits;
    CHECK_MESSAGE(differ == 0, what, ": ", differ, " of ", got.size(), " elements under ",
                  std::string(cpu::packed::isa_name(isas[i])), " differ from ",
                  std::string(cpu::packed::isa_name(isas[0])));
  }
}

}  // namespace

TEST_CASE("bf16 pairs: gemm_lowp_store gives the same bits on every SIMD tile the CPU has") {
  MESSAGE("SIMD tiles compared: ", simd_isas().size());
  const int64_t shapes[][3] = {{17, 33, 65}, {128, 257, 300}, {300, 40, 513}, {5, 3, 1}};
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    const auto a = random_bf16(M * K, 1), b = random_bf16(K * N, 2);
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      check_same_on_every_tile(
          "gemm M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
              (ta ? " A^T" : "") + (tb ? " B^T" : ""),
          [&] {
            std::vector<bfloat16> c(static_cast<size_t>(M * N));
            cpu::gemm_lowp_store(ta, tb, M, N, K, DType::bf16, a.data(), ta ? M : K, DType::bf16,
                                 b.data(), tb ? K : N, 1.0f, 0.0f, DType::bf16, nullptr,
                                 DType::bf16, c.data(), N);
            return c;
          });
    }
  }
}

TEST_CASE("bf16 pairs: conv2d's three passes give the same bits on every SIMD tile the CPU has") {
  // (N, C, H, W, K, R, S, stride, pad): a 1x1 (backward-data as w^T dy), a stride-1 3x3 on planes
  // of 100 pixels or more (backward-data as a convolution with flipped weights), a strided 3x3
  // (backward-data through dcol and col2im), and an odd depth (C R S = 3 * 7 * 7 = 147).
  const int64_t shapes[][9] = {{2, 24, 9, 9, 16, 1, 1, 1, 0},
                               {2, 9, 12, 12, 10, 3, 3, 1, 1},
                               {3, 8, 11, 13, 12, 3, 3, 2, 1},
                               {2, 3, 20, 20, 8, 7, 7, 2, 3}};
  for (const auto& v : shapes) {
    const ConvShape s =
        make_conv_shape(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[7], v[8], v[8]);
    const auto x = random_bf16(s.N * s.C * s.H * s.W, 3), w = random_bf16(s.K * s.C * s.R * s.S, 4);
    const auto bias = random_bf16(s.K, 5), dy = random_bf16(s.N * s.K * s.P * s.Q, 6);
    const std::string shape = "conv N=" + std::to_string(s.N) + " C=" + std::to_string(s.C) +
                              " K=" + std::to_string(s.K) + " R=" + std::to_string(s.R) +
                              " stride " + std::to_string(v[7]);
    check_same_on_every_tile(shape + " forward", [&] {
      std::vector<bfloat16> y(static_cast<size_t>(s.N * s.K * s.P * s.Q));
      cpu::conv2d_forward<bfloat16>(x.data(), w.data(), bias.data(), y.data(), s);
      return y;
    });
    check_same_on_every_tile(shape + " backward-data", [&] {
      std::vector<bfloat16> dx(x.size());
      cpu::conv2d_backward_data<bfloat16>(dy.data(), w.data(), dx.data(), s);
      return dx;
    });
    check_same_on_every_tile(shape + " backward-filter", [&] {
      std::vector<bfloat16> dw(w.size()), db(bias.size());
      cpu::conv2d_backward_filter<bfloat16>(x.data(), dy.data(), dw.data(), db.data(), s);
      dw.insert(dw.end(), db.begin(), db.end());
      return dw;
    });
  }
}
