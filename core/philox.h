// Philox4x32-10, the counter-based generator of Salmon et al. (SC'11, "Parallel random
// numbers: as easy as 1, 2, 3"). A (key, counter) pair maps to four 32-bit words with no state,
// so any element of a random stream can be produced independently: the CPU kernels and the CUDA
// kernels call the same function and get the same bits. Tests: tests/test_core.cpp checks the
// published known-answer vectors.
#pragma once

#include <cstdint>

#include "regen/core/host_device.h"

namespace regen {

struct PhiloxKey {
  uint32_t k0, k1;
};
struct PhiloxCounter {
  uint32_t c0, c1, c2, c3;
};

REGEN_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

// Ten rounds of Philox4x32. out[0..3] receive the four random words.
REGEN_HD void philox4x32_10(PhiloxCounter ctr, PhiloxKey key, uint32_t out[4]) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = ctr.c0, c1 = ctr.c1, c2 = ctr.c2, c3 = ctr.c3;
  uint32_t k0 = key.k0, k1 = key.k1;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kM0, c0, hi0, lo0);
    philox_mulhilo(kM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

// regen's stream layout. A stream is (seed, subsequence); element i of the stream is word i%4 of
// the block with counter {lo(i/4), hi(i/4), lo(subsequence), hi(subsequence)} under key
// {lo(seed), hi(seed)}. Tensor creation uses subsequence 0 and a running element offset;
// dropout uses a per-node subsequence so a replayed node sees the same bits.
REGEN_HD uint32_t philox_word(uint64_t seed, uint64_t subsequence, uint64_t element) {
  const uint64_t block = element >> 2;
  PhiloxCounter ctr{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                    static_cast<uint32_t>(subsequence), static_cast<uint32_t>(subsequence >> 32)};
  PhiloxKey key{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint32_t out[4];
  philox4x32_10(ctr, key, out);
  return out[element & 3];
}

// 24 random bits to a float in [0, 1): exact in f32, same on every device.
REGEN_HD float philox_uniform01(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}
// 53 random bits from two words to a double in [0, 1).
REGEN_HD double philox_uniform01_f64(uint32_t w0, uint32_t w1) {
  const uint64_t bits = (static_cast<uint64_t>(w0 >> 5) << 26) | (w1 >> 6);
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);
}

}  // namespace regen
