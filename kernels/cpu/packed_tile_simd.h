// The SIMD register tile of the packed GEMM (packed_gemm.h), written once over a vector type W.
// Included only by the translation units that compile it for one instruction set
// (packed_tile_avx2.cpp, packed_tile_avx512.cpp, each with its own -m flags); their W is local to
// the file, so every instantiation here is too and no code built for one ISA can be linked in
// where another is expected. For the same reason this file calls no function of the standard
// library. W provides: kWidth (lanes), V, Mask, zero, load, bcast, fma, add, store, mask,
// mask_load, mask_store. Tested by tests/test_packed_tile.cpp (bitwise against a std::fma chain).
#pragma once

#include <cstdint>

#include "regen/kernels/cpu/packed_gemm.h"

namespace regen::cpu::packed::simd {

// acc = rows [0, R) of an A panel (kMR per k) x vectors [0, SV) of a B panel (LDB per k), each
// element one chain of fused multiply-adds over k in order; with `resume`, the chains go on from
// the sums in acc (a chain paused in memory and resumed is the same chain, bit for bit). The sums
// live in a local array whose loops are unrolled before GCC splits it into registers: summed
// straight into the caller's array (indexed at run time there), with AVX2's 16 ymm registers GCC
// kept that array on the stack and stored all of it on every k.
template <class W, int R, int SV, int LDB, class T>
__attribute__((always_inline)) inline void multiply_panels(int64_t kc, const T* a, const T* b,
                                                           bool resume,
                                                           typename W::V (&acc)[R][SV]) {
  typename W::V sum[R][SV];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < SV; ++v) sum[i][v] = resume ? acc[i][v] : W::zero();
  for (int64_t k = 0; k < kc; ++k, a += kMR, b += LDB) {
    typename W::V bv[SV];
#pragma GCC unroll 3
    for (int v = 0; v < SV; ++v) {
      bv[v] = W::load(b + v * W::kWidth);
      // Keeps B's vectors in registers: without it GCC folded each load into every multiply-add
      // that reads it (AVX2 has no broadcast operand for A, so B was the memory operand), which
      // re-read B once per row: 16 loads per 12 multiply-adds, and the AVX2 tile ran at 67% of
      // the FMA peak with its panels in L1 (87% with B held; AVX-512 is unchanged, its broadcast
      // of A being the operand folded).
      asm("" : "+v"(bv[v]));
    }
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const typename W::V av = W::bcast(a + i);
#pragma GCC unroll 3
      for (int v = 0; v < SV; ++v) sum[i][v] = W::fma(av, bv[v], sum[i][v]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < SV; ++v) acc[i][v] = sum[i][v];
}

// Rows [r0, r0 + R) (those below `rows`) and the SV vectors from tile column c0 of C (row stride
// ld, columns given by runs) = [C +] acc [+ bias[row]]. Lanes outside the runs are never touched
// (masked).
template <class W, int R, int SV, class T>
void store_sub_tile(const typename W::V (&acc)[R][SV], int64_t r0, int64_t c0, const Run<T>* runs,
                    int nruns, int64_t rows, int64_t ld, bool accumulate, const T* bias) {
  constexpr int L = W::kWidth;
  for (int i = 0; i < R && r0 + i < rows; ++i) {
    for (int v = 0; v < SV; ++v) {
      typename W::V r = acc[i][v];
      if (!accumulate && bias) r = W::add(r, W::bcast(bias + r0 + i));
      const int64_t first = c0 + v * L;  // tile column of lane 0
      for (int s = 0; s < nruns; ++s) {
        const int64_t lo = runs[s].start > first ? runs[s].start : first;
        const int64_t hi = runs[s].end < first + L ? runs[s].end : first + L;
        if (lo >= hi) continue;
        // Address of lane 0 of this vector within the run's row (lanes outside it are masked).
        T* p = runs[s].p + (r0 + i) * ld + (first - runs[s].start);
        if (lo == first && hi == first + L) {
          W::store(p, accumulate ? W::add(W::load(p), r) : r);
        } else {
          const typename W::Mask m = W::mask(lo - first, hi - first);
          W::mask_store(p, m, accumulate ? W::add(W::mask_load(m, p), r) : r);
        }
      }
    }
  }
}

// Depth per pass when a tile runs as several sub-tiles (AVX2): each sub-tile reads its part of
// the panels for this many k, its sums are put aside, and the next sub-tile goes; then the next
// depth range resumes every chain. A 128-deep slice of the 8 x 48 panels (24 KB of B, 4 KB of A)
// stays in the 32 KB L1 while the four sub-tiles read it, where a whole 256-deep panel (48 KB) was
// read from L2 once per sub-tile: 0.95-0.96x the time on the Transformer's long-depth products on
// the AVX2 tile, about the same on the others (docs/kernels.md). The same fused multiply-adds in
// the same order: the same bits.
constexpr int64_t kSubTileDepth = 128;

// The tile, NV 512-bit vectors wide (the packing unit), as sub-tiles of SubRows rows by at most
// 3 of the ISA's vectors, each reading its part of the panels with their strides. With AVX-512
// (SubRows = kMR, 3 zmm) that is the whole tile at once: 24 accumulators of the 32 registers.
// With AVX2 (SubRows = 4, 3 ymm) it is four sub-tiles of 12 accumulators, 3 vectors of B and a
// broadcast of A: all 16 registers, by depth slices of kSubTileDepth.
template <class W, int SubRows, int NV, class T>
void tile(int64_t kc, const T* a, const T* b, const Run<T>* runs, int nruns, int64_t rows,
          int64_t ld, bool accumulate, const T* bias) {
  constexpr int kSubVectors = 3;
  constexpr int L = W::kWidth, LDB = NV * kLanes<T>, Y = LDB / L;  // Y vectors per row
  // Y = 4 splits 2 + 2, not 3 + 1: a sub-tile one vector wide would have 4 independent FMA
  // chains, where two FMA pipes of latency 4 need 8 to stay busy.
  constexpr int first = Y <= kSubVectors ? Y : (Y + 1) / 2, second = Y - first;
  static_assert(first <= kSubVectors && second <= kSubVectors, "tile wider than two sub-tiles");
  constexpr int kGroups = kMR / SubRows;
  static_assert(kGroups * SubRows == kMR, "sub-tile rows must divide the panel's");
  const int groups = static_cast<int>((rows + SubRows - 1) / SubRows);
  // One sub-tile: the whole depth at once, the sums never leave the registers.
  const int64_t slice = kGroups == 1 && second == 0 ? kc : kSubTileDepth;
  typename W::V acc0[kGroups][SubRows][first];
  typename W::V acc1[kGroups][SubRows][second > 0 ? second : 1];
  for (int64_t k0 = 0; k0 < kc; k0 += slice) {
    const int64_t n = kc - k0 < slice ? kc - k0 : slice;
    const T* as = a + k0 * kMR;
    const T* bs = b + k0 * LDB;
    for (int g = 0; g < groups; ++g) {
      multiply_panels<W, SubRows, first, LDB>(n, as + g * SubRows, bs, k0 > 0, acc0[g]);
      if constexpr (second > 0) {
        multiply_panels<W, SubRows, second, LDB>(n, as + g * SubRows, bs + first * L, k0 > 0,
                                                 acc1[g]);
      }
    }
  }
  for (int g = 0; g < groups; ++g) {
    store_sub_tile<W>(acc0[g], g * SubRows, 0, runs, nruns, rows, ld, accumulate, bias);
    if constexpr (second > 0) {
      store_sub_tile<W>(acc1[g], g * SubRows, first * L, runs, nruns, rows, ld, accumulate, bias);
    }
  }
}

// The TileFn of packed_gemm.h: nv selects the instantiation.
template <class W, int SubRows, class T>
void run_tile(int nv, int64_t kc, const T* a, const T* b, const Run<T>* runs, int nruns,
              int64_t rows, int64_t ld, bool accumulate, const T* bias) {
  switch (nv) {
    case 1:
      tile<W, SubRows, 1>(kc, a, b, runs, nruns, rows, ld, accumulate, bias);
      break;
    case 2:
      tile<W, SubRows, 2>(kc, a, b, runs, nruns, rows, ld, accumulate, bias);
      break;
    default:
      tile<W, SubRows, 3>(kc, a, b, runs, nruns, rows, ld, accumulate, bias);
      break;
  }
}

}  // namespace regen::cpu::packed::simd
