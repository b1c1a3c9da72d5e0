// Philox words for a run of consecutive elements of one stream on the CPU: philox_word's bits
// (core/philox.h) for every element. The dropout kernels (elementwise.cpp, dropout_lowp.cpp) and
// the attention's dropout (attention.cpp) draw a run into a small array on the stack and apply the
// mask in a separate loop over the elements, which GCC vectorizes (drawing inside the element
// loop kept it scalar). How the words are drawn depends on the build:
// - with AVX-512DQ, kPhiloxLanes blocks at a time, one per lane of four counter arrays, so that a
//   round is the same few operations across the lanes: GCC vectorizes the products as 64-bit
//   vpmullq. Dropout of 2M f32 elements at 2 threads: 1.9 ms, against 2.9 ms one block at a time.
// - otherwise (AVX2 has no 64-bit vector multiply, and GCC then leaves the lanes scalar, their
//   arrays going through memory every round: 4.0 against 1.7 ns per word in a scratch program),
//   one block at a time, each computed once for its four words.
// Both give the same words; tests/test_kernels_cpu.cpp checks them against philox_word at every
// start within a block, across passes and past 2^32 blocks.
#pragma once

#include <algorithm>
#include <cstdint>

#include "regen/core/philox.h"

namespace regen::cpu {

// The dropout rule of kernels/kernels.h: element i is kept iff philox_word(seed, stream, i) >= this
// threshold, p * 2^32; p <= 0 keeps everything (0), p >= 1 drops everything (2^32, above any
// word). The f32 and 16-bit dropouts and the attention's dropout share it.
inline uint64_t dropout_threshold(float p) {
  if (p <= 0.0f) return 0;
  if (p >= 1.0f) return uint64_t{1} << 32;
  return static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0);
}

constexpr int64_t kPhiloxLanes = 16;  // blocks per pass of the AVX-512 form: 64 words

// words[k] = philox_word(seed, stream, first + k) for k in [0, count).
inline void philox_words(uint64_t seed, uint64_t stream, uint64_t first, int64_t count,
                         uint32_t* words) {
#if defined(__AVX512DQ__)
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  const uint32_t key0 = static_cast<uint32_t>(seed), key1 = static_cast<uint32_t>(seed >> 32);
  const uint32_t s_lo = static_cast<uint32_t>(stream), s_hi = static_cast<uint32_t>(stream >> 32);
  uint64_t block = first >> 2;
  int64_t skip = static_cast<int64_t>(first & 3);  // words of the first block before `first`
  int64_t k = 0;
  while (k < count) {
    uint32_t c0[kPhiloxLanes], c1[kPhiloxLanes], c2[kPhiloxLanes], c3[kPhiloxLanes];
    for (int64_t l = 0; l < kPhiloxLanes; ++l) {
      const uint64_t b = block + static_cast<uint64_t>(l);
      c0[l] = static_cast<uint32_t>(b);
      c1[l] = static_cast<uint32_t>(b >> 32);
      c2[l] = s_lo;
      c3[l] = s_hi;
    }
    uint32_t k0 = key0, k1 = key1;
    for (int round = 0; round < 10; ++round) {
      for (int64_t l = 0; l < kPhiloxLanes; ++l) {
        const uint64_t p0 = static_cast<uint64_t>(kM0) * c0[l];
        const uint64_t p1 = static_cast<uint64_t>(kM1) * c2[l];
        const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1[l] ^ k0;
        const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3[l] ^ k1;
        c0[l] = n0;
        c1[l] = static_cast<uint32_t>(p1);
        c2[l] = n2;
        c3[l] = static_cast<uint32_t>(p0);
      }
      k0 += kW0;
      k1 += kW1;
    }
    // Element 4 l + e of this pass is word e of lane l.
    const int64_t take = std::min<int64_t>(4 * kPhiloxLanes - skip, count - k);
    for (int64_t i = 0; i < take; ++i) {
      const int64_t w = skip + i, l = w >> 2;
      const uint32_t* c[4] = {c0, c1, c2, c3};
      words[k + i] = c[w & 3][l];
    }
    k += take;
    skip = 0;
    block += kPhiloxLanes;
  }
#else
  const PhiloxKey key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const uint32_t s_lo = static_cast<uint32_t>(stream), s_hi = static_cast<uint32_t>(stream >> 32);
  uint64_t block = first >> 2;
  int64_t e = static_cast<int64_t>(first & 3);  // the first word wanted of the first block
  int64_t k = 0;
  while (k < count) {
    uint32_t out[4];
    philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), s_lo, s_hi},
                  key, out);
    for (; e < 4 && k < count; ++e) words[k++] = out[e];
    e = 0;
    ++block;
  }
#endif
}

}  // namespace regen::cpu
