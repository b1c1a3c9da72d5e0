// A packed GEMM whose operands are packed by the caller's "sources", so convolution can feed it
// image pixels directly (implicit im2col) instead of materializing a column matrix first.
// Internal to kernels/cpu (used by conv2d.cpp); tested directly in tests/test_kernels_cpu.cpp and
// through tests/test_ops_vision.cpp.
//
// C (M, N) = A (M, K) * B (K, N) [+ C] [+ bias per row]. The loop nest is the usual one of
// GotoBLAS/BLIS: column blocks of NC, depth blocks of KC packed into panels (B as KC x NR panels
// that stay in L1, A as MR x KC panels), and an MR x NR register tile of FMAs: 512-bit with
// AVX-512, 256-bit with AVX2+FMA, a portable scalar tile elsewhere. Eigen's tile is 3x4 vectors x
// nr=4 columns; with MR=8 rows of 3 vectors the AVX-512 tile keeps 24 of the 32 zmm registers
// accumulating, which is what lets conv run near the FMA peak on AVX-512 machines. AVX2 has 16
// ymm registers: it computes the same 8 x NR tile from the same panels as sub-tiles of 4 rows x 3
// ymm (12 accumulators, 3 vectors of B, a broadcast of A), each reading its rows of the A panel
// and its columns of the B panel with the panels' strides. Packing is therefore the same on every
// ISA: a narrower AVX2 panel (NR = 24) was measured slower, its packing calls costing twice as
// much per column (docs/kernels.md, "The CPU packed GEMM").
//
// Determinism: every C element is summed over K in the same order (KC blocks in order, k in
// order inside) by exactly one thread; block sizes are constants. Results therefore do not depend
// on the thread count. Nor do they depend on the tile: every element is one chain of fused
// multiply-adds per KC block, plus C or the bias added alike, so AVX2 and AVX-512 builds agree
// bit for bit (the scalar tile, whose multiply-adds the compiler may or may not fuse, can differ).
// The workspace (each thread's packed A and B) depends on M, N, K and the thread count only, the
// same on every ISA. In a dry run (core/dry_run.h) gemm requests that workspace and returns.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

#include "regen/core/dry_run.h"
#include "regen/core/tensor.h"

namespace regen::cpu::packed {

template <class T>
constexpr int kLanes = 64 / sizeof(T);  // elements of one 512-bit vector
constexpr int kMR = 8;                  // register tile rows
constexpr int kMaxNV = 3;               // register tile columns, in vectors
template <class T>
constexpr int kNR = kMaxNV* kLanes<T>;
constexpr int64_t kKC = 256;       // depth block: a KC x NR panel of B fits L1 beside A's MR x KC
constexpr int64_t kNC = 3072;      // column block (a multiple of every NR)
constexpr int64_t kMCPanels = 32;  // row panels per L2 block of A (256 rows)
// Elements of slack after each packed B buffer: a B source may copy whole vectors past the end
// of the panel it fills (later panels overwrite the excess).
template <class T>
constexpr int64_t kSlack = kLanes<T>;

// Where C(m, n) lives. Columns may run over several images: column n belongs to image
// n / cols_per_image and row m of that image starts `ld` elements after row m - 1.
template <class T>
struct CView {
  T* p;
  int64_t ld;
  int64_t cols_per_image;
  int64_t image_stride;
  T* at(int64_t m, int64_t n) const {
    return p + (n / cols_per_image) * image_stride + m * ld + n % cols_per_image;
  }
};

// ---- Register tile ------------------------------------------------------------------------------

// A run of a tile's columns that is contiguous in C: tile columns [start, end), whose row 0
// starts at p (p points at column `start`). Columns that cross an image boundary make two runs.
template <class T>
struct Run {
  int64_t start, end;
  T* p;
};
constexpr int kMaxRuns = 8;

#ifdef __AVX512F__
template <class T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int kWidth = 16;  // lanes
  using V = __m512;
  using Mask = __mmask16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static Mask mask(int64_t lo, int64_t hi) {  // lanes [lo, hi)
    return static_cast<Mask>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
  }
  static V mask_load(Mask m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  static void mask_store(float* p, Mask m, V v) { _mm512_mask_storeu_ps(p, m, v); }
};
template <>
struct Vec<double> {
  static constexpr int kWidth = 8;
  using V = __m512d;
  using Mask = __mmask8;
  static V zero() { return _mm512_setzero_pd(); }
  static V load(const double* p) { return _mm512_loadu_pd(p); }
  static V bcast(const double* p) { return _mm512_set1_pd(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  static V add(V a, V b) { return _mm512_add_pd(a, b); }
  static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
  static Mask mask(int64_t lo, int64_t hi) {  // lanes [lo, hi)
    return static_cast<Mask>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
  }
  static V mask_load(Mask m, const double* p) { return _mm512_maskz_loadu_pd(m, p); }
  static void mask_store(double* p, Mask m, V v) { _mm512_mask_storeu_pd(p, m, v); }
};
#elif defined(__AVX2__) && defined(__FMA__)
// AVX2 has no mask registers: a mask is a vector whose lanes are all ones (kept) or zeros.
// maskload reads zeros and maskstore writes nothing in the lanes left out, so edge columns
// touch no byte outside their run, as with AVX-512's masks.
template <class T>
struct Vec;
template <>
struct Vec<float> {
  static constexpr int kWidth = 8;
  using V = __m256;
  using Mask = __m256i;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static Mask mask(int64_t lo, int64_t hi) {  // lanes [lo, hi): lo <= lane < hi
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lo)), lane),
                               _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(hi)), lane));
  }
  static V mask_load(Mask m, const float* p) { return _mm256_maskload_ps(p, m); }
  static void mask_store(float* p, Mask m, V v) { _mm256_maskstore_ps(p, m, v); }
};
template <>
struct Vec<double> {
  static constexpr int kWidth = 4;
  using V = __m256d;
  using Mask = __m256i;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const double* p) { return _mm256_loadu_pd(p); }
  static V bcast(const double* p) { return _mm256_broadcast_sd(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
  static void store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static Mask mask(int64_t lo, int64_t hi) {  // lanes [lo, hi): lo <= lane < hi
    const __m256i lane = _mm256_setr_epi64x(0, 1, 2, 3);
    return _mm256_andnot_si256(_mm256_cmpgt_epi64(_mm256_set1_epi64x(lo), lane),
                               _mm256_cmpgt_epi64(_mm256_set1_epi64x(hi), lane));
  }
  static V mask_load(Mask m, const double* p) { return _mm256_maskload_pd(p, m); }
  static void mask_store(double* p, Mask m, V v) { _mm256_maskstore_pd(p, m, v); }
};
#endif

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
// Sub-tiles: kSubRows rows x at most kSubVectors of the ISA's vectors, in registers.
#ifdef __AVX512F__
constexpr int kSubRows = kMR;  // the whole tile at once: 8 x 3 zmm, 24 of the 32 registers
#else
constexpr int kSubRows = 4;  // 4 x 3 ymm: 12 accumulators, 3 vectors of B, 1 broadcast of A
#endif
constexpr int kSubVectors = 3;

// acc = rows [0, R) of an A panel (kMR per k) x vectors [0, SV) of a B panel (LDB per k), each
// element summed over k in order. The sums live in a local array whose loops are unrolled before
// GCC splits it into registers: summed straight into the caller's array (indexed at run time
// there), with AVX2's 16 ymm registers GCC kept that array on the stack and stored all of it on
// every k.
template <class T, int R, int SV, int LDB>
__attribute__((always_inline)) inline void multiply_panels(int64_t kc, const T* a, const T* b,
                                                           typename Vec<T>::V (&acc)[R][SV]) {
  using W = Vec<T>;
  typename W::V sum[R][SV];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 3
    for (int v = 0; v < SV; ++v) sum[i][v] = W::zero();
  for (int64_t k = 0; k < kc; ++k, a += kMR, b += LDB) {
    typename W::V bv[SV];
#pragma GCC unroll 3
    for (int v = 0; v < SV; ++v) bv[v] = W::load(b + v * W::kWidth);
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
// ld, columns given by runs) = [C +] a_panel * b_panel [+ bias[row]]. Lanes outside the runs are
// never touched (masked).
template <class T, int R, int SV, int LDB>
void sub_tile(int64_t kc, const T* a, const T* b, int64_t r0, int64_t c0, const Run<T>* runs,
              int nruns, int64_t rows, int64_t ld, bool accumulate, const T* bias) {
  using W = Vec<T>;
  constexpr int L = W::kWidth;
  typename W::V acc[R][SV];
  multiply_panels<T, R, SV, LDB>(kc, a + r0, b + c0, acc);
  for (int i = 0; i < R && r0 + i < rows; ++i) {
    for (int v = 0; v < SV; ++v) {
      typename W::V r = acc[i][v];
      if (!accumulate && bias) r = W::add(r, W::bcast(bias + r0 + i));
      const int64_t first = c0 + v * L;  // tile column of lane 0
      for (int s = 0; s < nruns; ++s) {
        const int64_t lo = std::max<int64_t>(runs[s].start, first);
        const int64_t hi = std::min<int64_t>(runs[s].end, first + L);
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

// Rows [0, rows) of C = [C +] a_panel * b_panel [+ bias[row]], NV 512-bit vectors wide (the
// packing unit): sub-tiles of kSubRows rows by at most kSubVectors of the ISA's vectors, each
// reading its part of the panels with their strides. With AVX-512 that is the whole tile.
template <class T, int NV>
void tile(int64_t kc, const T* a, const T* b, const Run<T>* runs, int nruns, int64_t rows,
          int64_t ld, bool accumulate, const T* bias) {
  constexpr int L = Vec<T>::kWidth, LDB = NV * kLanes<T>, Y = LDB / L;  // Y vectors per row
  // Y = 4 splits 2 + 2, not 3 + 1: a sub-tile one vector wide would have 4 independent FMA
  // chains, where two FMA pipes of latency 4 need 8 to stay busy.
  constexpr int first = Y <= kSubVectors ? Y : (Y + 1) / 2, second = Y - first;
  static_assert(first <= kSubVectors && second <= kSubVectors, "tile wider than two sub-tiles");
  for (int64_t r0 = 0; r0 < rows; r0 += kSubRows) {
    sub_tile<T, kSubRows, first, LDB>(kc, a, b, r0, 0, runs, nruns, rows, ld, accumulate, bias);
    if constexpr (second > 0) {
      sub_tile<T, kSubRows, second, LDB>(kc, a, b, r0, first * L, runs, nruns, rows, ld, accumulate,
                                         bias);
    }
  }
}
#else
// Portable tile with the same summation order (one accumulator per element, k in order).
template <class T, int NV>
void tile(int64_t kc, const T* a, const T* b, const Run<T>* runs, int nruns, int64_t rows,
          int64_t ld, bool accumulate, const T* bias) {
  constexpr int NR = NV * kLanes<T>;
  T acc[kMR][NR] = {};
  for (int64_t k = 0; k < kc; ++k, a += kMR, b += NR)
    for (int i = 0; i < kMR; ++i)
      for (int j = 0; j < NR; ++j) acc[i][j] += a[i] * b[j];
  for (int64_t i = 0; i < rows; ++i)
    for (int s = 0; s < nruns; ++s)
      for (int64_t j = runs[s].start; j < runs[s].end; ++j) {
        T* p = runs[s].p + i * ld + (j - runs[s].start);
        T r = acc[i][j];
        if (accumulate)
          r = *p + r;
        else if (bias)
          r = r + bias[i];
        *p = r;
      }
}
#endif

template <class T>
void run_tile(int nv, int64_t kc, const T* a, const T* b, const Run<T>* runs, int nruns,
              int64_t rows, int64_t ld, bool accumulate, const T* bias) {
  switch (nv) {
    case 1:
      tile<T, 1>(kc, a, b, runs, nruns, rows, ld, accumulate, bias);
      break;
    case 2:
      tile<T, 2>(kc, a, b, runs, nruns, rows, ld, accumulate, bias);
      break;
    default:
      tile<T, 3>(kc, a, b, runs, nruns, rows, ld, accumulate, bias);
      break;
  }
}

// ---- The loop nest ------------------------------------------------------------------------------

// A packs rows [m0, m0 + rows) x depth [k0, k0 + kc) as dst[k * kMR + i] (rows >= `rows` zero);
// B packs depth [k0, k0 + kc) x columns [j0, j0 + cols) as dst[k * w + j] (columns >= cols zero).
//   a.pack(m0, rows, k0, kc, dst)      b.pack(k0, kc, j0, cols, w, dst)
// C = A * B (+ bias[m] when bias is non-null), or C += A * B when accumulate.
//
// Threads split the larger of M and N. Splitting columns, A is packed once for all threads up
// front; splitting rows, each thread packs all of B into its own buffers. Either way the threads
// meet at most once per call: a barrier per depth block would stall for a whole scheduler tick
// whenever another process holds one of the cores.
template <class T, class SrcA, class SrcB>
void gemm(int64_t M, int64_t N, int64_t K, const SrcA& a, const SrcB& b, const T* bias,
          bool accumulate, const CView<T>& c) {
  if (M <= 0 || N <= 0) return;
  if (K == 0) {  // C = bias (or unchanged when accumulating)
    if (accumulate || dry_run_active()) return;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) *c.at(m, n) = bias ? bias[m] : T(0);
    return;
  }
  constexpr int L = kLanes<T>, NR = kNR<T>;
  const int64_t row_panels = (M + kMR - 1) / kMR, col_vectors = (N + L - 1) / L;
  const bool small = 2.0 * M * N * K < 4e6;
  // Split the larger dimension, so the operand packed twice is the smaller one. Columns are
  // dealt in whole vectors, rows in whole panels.
  const bool split_rows = M >= N;
  const int64_t extent = split_rows ? row_panels : col_vectors;
  const int threads = small || omp_in_parallel()
                          ? 1
                          : static_cast<int>(std::min<int64_t>(omp_get_max_threads(), extent));
  // When threads split the columns, all of them need all of A: it is packed once, together,
  // before the threads part (the one barrier of the call), instead of once per thread.
  const bool shared_a = threads > 1 && !split_rows;
  const int64_t kc_max = std::min(K, kKC);
  const int64_t shared_elems = shared_a ? row_panels * kMR * K : 0;
  const int64_t a_elems = shared_a ? 0 : std::min<int64_t>(kMCPanels, row_panels) * kMR * kc_max;
  const int64_t b_elems = std::min<int64_t>(col_vectors * L, kNC) * kc_max + kSlack<T>;
  Workspace ws(Device::cpu(),
               static_cast<uint64_t>(shared_elems + threads * (a_elems + b_elems)) * sizeof(T));
  if (dry_run_active()) return;  // the dry path (kernels.h): the scratch, requested and unused
  T* const shared = ws.as<T>();  // block pc, panel ip at shared + row_panels*kMR*pc + ip*kMR*kc
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    if (shared_a) {
      const int64_t blocks = (K + kKC - 1) / kKC;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < blocks * row_panels; ++i) {
        const int64_t pc = i / row_panels * kKC, ip = i % row_panels, m0 = ip * kMR;
        const int64_t kc = std::min(kKC, K - pc);
        a.pack(m0, std::min<int64_t>(kMR, M - m0), pc, kc,
               shared + row_panels * kMR * pc + ip * kMR * kc);
      }
    }
    T* pa = shared + shared_elems + t * (a_elems + b_elems);
    T* pb = pa + a_elems;
    const int64_t lo = extent * t / nt, hi = extent * (t + 1) / nt;
    const int64_t r_lo = split_rows ? lo : 0, r_hi = split_rows ? hi : row_panels;
    const int64_t n_lo = split_rows ? 0 : lo * L, n_hi = split_rows ? N : std::min(N, hi * L);
    for (int64_t jc = n_lo; jc < n_hi; jc += kNC) {
      const int64_t nc = std::min(kNC, n_hi - jc);
      const int64_t panels = (nc + NR - 1) / NR;
      for (int64_t pc = 0; pc < K; pc += kKC) {
        const int64_t kc = std::min(kKC, K - pc);
        const bool acc = accumulate || pc > 0;
        const T* first_bias = pc == 0 ? bias : nullptr;
        for (int64_t jp = 0; jp < panels; ++jp) {
          const int64_t j0 = jp * NR, cols = std::min<int64_t>(NR, nc - j0);
          b.pack(pc, kc, jc + j0, cols, (cols + L - 1) / L * L, pb + j0 * kc);
        }
        for (int64_t ib = r_lo; ib < r_hi; ib += kMCPanels) {
          const int64_t ie = std::min(r_hi, ib + kMCPanels);
          // This block's A panels: from the shared copy, or packed here.
          const T* a_block = shared_a ? shared + row_panels * kMR * pc + ib * kMR * kc : pa;
          for (int64_t ip = ib; ip < ie && !shared_a; ++ip) {
            const int64_t m0 = ip * kMR;
            a.pack(m0, std::min<int64_t>(kMR, M - m0), pc, kc, pa + (ip - ib) * kMR * kc);
          }
          for (int64_t jp = 0; jp < panels; ++jp) {
            const int64_t j0 = jp * NR, n0 = jc + j0, cols = std::min<int64_t>(NR, nc - j0);
            const int64_t w = (cols + L - 1) / L * L;
            const T* bp = pb + j0 * kc;
            // Runs of this panel's columns (split where an image ends); each run is one
            // division, not one per element.
            Run<T> runs[kMaxRuns];
            int nruns = 0;
            for (int64_t j = 0; j < cols && nruns < kMaxRuns;) {
              const int64_t n = n0 + j, off = n % c.cols_per_image;
              const int64_t len = std::min(cols - j, c.cols_per_image - off);
              runs[nruns++] = {j, j + len, c.p + (n / c.cols_per_image) * c.image_stride + off};
              j += len;
            }
            const bool fits = runs[nruns - 1].end == cols;
            for (int64_t ip = ib; ip < ie; ++ip) {
              const int64_t m0 = ip * kMR, rows = std::min<int64_t>(kMR, M - m0);
              const T* ap = a_block + (ip - ib) * kMR * kc;
              const T* bias_rows = first_bias ? first_bias + m0 : nullptr;
              if (fits) {
                Run<T> at_rows[kMaxRuns];
                for (int s = 0; s < nruns; ++s) {
                  at_rows[s] = {runs[s].start, runs[s].end, runs[s].p + m0 * c.ld};
                }
                run_tile<T>(static_cast<int>(w / L), kc, ap, bp, at_rows, nruns, rows, c.ld, acc,
                            bias_rows);
                continue;
              }
              // More image boundaries in this panel than kMaxRuns (planes of a few pixels):
              // compute into a spill tile, then add column by column with the same arithmetic.
              T spill[kMR * kNR<T>];
              const Run<T> whole{0, w, spill};
              run_tile<T>(static_cast<int>(w / L), kc, ap, bp, &whole, 1, kMR, w, false, nullptr);
              for (int64_t j = 0; j < cols; ++j) {
                T* col = c.at(m0, n0 + j);
                for (int64_t i = 0; i < rows; ++i) {
                  T* dst = col + i * c.ld;
                  const T v = spill[i * w + j];
                  *dst = acc ? *dst + v : (bias_rows ? v + bias_rows[i] : v);
                }
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace regen::cpu::packed
