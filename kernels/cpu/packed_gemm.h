// A packed GEMM whose operands are packed by the caller's "sources", so convolution can feed it
// image pixels directly (implicit im2col) instead of materializing a column matrix first.
// Internal to kernels/cpu (used by conv2d.cpp); tested directly in tests/test_kernels_cpu.cpp and
// through tests/test_ops_vision.cpp.
//
// C (M, N) = A (M, K) * B (K, N) [+ C] [+ bias per row]. The loop nest is the usual one of
// GotoBLAS/BLIS: column blocks of NC, depth blocks of KC packed into panels (B as KC x NR panels,
// A as MR x KC panels), and an MR x NR register tile of FMAs. The tile is compiled once per
// instruction set and chosen at run time (packed_tile.cpp): 512-bit with AVX-512 (8 rows x 3 zmm,
// 24 of the 32 registers accumulating, which is what lets conv run near the FMA peak), 256-bit
// with AVX2+FMA, a portable scalar tile elsewhere. AVX2 has 16 ymm registers: it computes the
// same 8 x NR tile from the same panels as sub-tiles of 4 rows x 3 ymm (12 accumulators, 3
// vectors of B, a broadcast of A), each reading its rows of the A panel and its columns of the B
// panel with the panels' strides (packed_tile_simd.h). Packing is therefore the same on every
// ISA: a narrower AVX2 panel (NR = 24) was measured slower, its packing calls costing twice as
// much per column (docs/kernels.md, "The CPU packed GEMM").
//
// Determinism: every C element is summed over K in the same order (KC blocks in order, k in
// order inside) by exactly one thread; block sizes are constants. Results therefore do not depend
// on the thread count. Nor do they depend on the tile: every element is one chain of fused
// multiply-adds per KC block, plus C or the bias added alike, so the AVX2 and AVX-512 tiles agree
// bit for bit (the scalar tile, whose multiply-adds the compiler may or may not fuse, can differ).
// The bf16 pair tile (bf16_pair_tile) sums in pairs; gemm_lowp gives the other tiles its order.
// The workspace (each thread's packed A and B) depends on M, N, K and the thread count only, the
// same on every ISA. In a dry run (core/dry_run.h) gemm requests that workspace and returns.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <memory>

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

// The register tile, compiled once per instruction set (kernels/cpu/packed_tile*.cpp) and chosen
// at run time from what the CPU reports, so one build serves AVX2 and AVX-512 machines: rows [0,
// rows) of C, at the runs' columns, = [C +] a_panel (kMR per k) * b_panel (nv * kLanes per k)
// [+ bias[row]] (the bias only when not accumulating). Lanes outside the runs are never touched.
template <class T>
using TileFn = void (*)(int nv, int64_t kc, const T* a, const T* b, const Run<T>* runs, int nruns,
                        int64_t rows, int64_t ld, bool accumulate, const T* bias);

// avx512_bf16 is avx512 plus the bf16 dot product (VDPBF16PS), which only the bf16 pair tile below
// uses; its f32 and f64 tiles are avx512's.
enum class Isa { generic, avx2, avx512, avx512_bf16 };
const char* isa_name(Isa isa);
// The best tile this CPU runs, or the one named by the environment variable REGEN_CPU_ISA
// (generic, avx2, avx512, avx512bf16: for measurements and tests; one the CPU lacks is an error).
// Decided on the first call.
Isa tile_isa();
// For tests: while one lives, tile_isa() answers `isa` (which this build and CPU must have, or
// the constructor throws), so one process can compare the tiles' results. Not for concurrent use.
class ScopedTileIsa {
 public:
  explicit ScopedTileIsa(Isa isa);
  ~ScopedTileIsa();
  ScopedTileIsa(const ScopedTileIsa&) = delete;
  ScopedTileIsa& operator=(const ScopedTileIsa&) = delete;

 private:
  int previous_;
};
// The tile for `isa`, or nullptr when this build or this CPU has none.
template <class T>
TileFn<T> tile_kernel(Isa isa);

// The bf16 pair tile: a TileFn<float> whose panels hold, in each 32-bit word, two bf16 values of
// consecutive depth (the even one in the low half), and whose multiply is VDPBF16PS: per word,
// C += a_odd b_odd, then C += a_even b_even, each an f32 addition of an exact product rounded once
// (a fused multiply-add on the widened values), with subnormal inputs and results taken as zero.
// nullptr unless `isa` is avx512_bf16 and this build and CPU have it. gemm_lowp (gemm_lowp.cpp)
// uses it for bf16 x bf16 products and, elsewhere, packs the widened operands with each depth
// pair swapped, so that the f32 tiles give the same bits (kernels/cpu/widening_sources.h).
TileFn<float> bf16_pair_tile(Isa isa);

// A tile whose packed words each hold `depth_per_word` consecutive depth elements (the bf16 pair
// tile: 2). gemm's K, the sources' k0 and kc and the tile's kc then count words; the depth blocks
// hold kKC / depth_per_word words (kKC depth elements, as the f32 GEMM's), and the workspace and
// the thread count are those of the f32 GEMM of depth K * depth_per_word, so they do not depend on
// which tile runs.
template <class T>
struct WordTile {
  TileFn<T> tile;
  int depth_per_word;
};

// ---- The loop nest ------------------------------------------------------------------------------

// A packs rows [m0, m0 + rows) x depth [k0, k0 + kc) as dst[k * kMR + i] (rows >= `rows` zero);
// B packs depth [k0, k0 + kc) x columns [j0, j0 + cols) as dst[k * w + j] (columns >= cols zero).
//   a.pack(m0, rows, k0, kc, dst)      b.pack(k0, kc, j0, cols, w, dst)
// C = A * B (+ bias[m] when bias is non-null), or C += A * B when accumulate. `words`, when
// given, replaces the ISA's tile (WordTile above).
//
// Threads split the larger of M and N. Splitting columns, A is packed once for all threads up
// front; splitting rows, each thread packs all of B into its own buffers. Either way the threads
// meet at most once per call: a barrier per depth block would stall for a whole scheduler tick
// whenever another process holds one of the cores. A product of fewer than parallel_flops
// (2 M N K) runs on the calling thread alone.
constexpr double kParallelFlops = 4e6;

// One thread's packing buffers, in elements, for a product of M x N over `depth` elements: its
// block of A panels (when it packs its own) and its block of B panels.
template <class T>
int64_t a_block_elems(int64_t M, int64_t depth) {
  return std::min<int64_t>(kMCPanels, (M + kMR - 1) / kMR) * kMR * std::min(depth, kKC);
}
template <class T>
int64_t b_block_elems(int64_t N, int64_t depth) {
  constexpr int L = kLanes<T>;
  return std::min<int64_t>((N + L - 1) / L * L, kNC) * std::min(depth, kKC) + kSlack<T>;
}
// What a product that runs on one thread packs into: what gemm requests as its workspace then,
// and what its `scratch` must hold.
template <class T>
int64_t serial_scratch_elems(int64_t M, int64_t N, int64_t depth) {
  return a_block_elems<T>(M, depth) + b_block_elems<T>(N, depth);
}

// With `scratch` (at least serial_scratch_elems(M, N, K * depth_per_word) elements, 64-byte
// aligned), the product runs on the calling thread alone and packs into scratch: it requests no
// workspace, so products can run on several threads at once, each with its own scratch, without
// the allocator seeing requests in an order that depends on the threads (the attention's heads,
// kernels/cpu/attention.cpp). In a dry run it then does nothing at all: the caller requested the
// scratch. The same bits either way.
template <class T, class SrcA, class SrcB>
void gemm(int64_t M, int64_t N, int64_t K, const SrcA& a, const SrcB& b, const T* bias,
          bool accumulate, const CView<T>& c, const WordTile<T>* words = nullptr,
          double parallel_flops = kParallelFlops, T* scratch = nullptr) {
  if (M <= 0 || N <= 0) return;
  if (K == 0) {  // C = bias (or unchanged when accumulating)
    if (accumulate || dry_run_active()) return;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) *c.at(m, n) = bias ? bias[m] : T(0);
    return;
  }
  constexpr int L = kLanes<T>, NR = kNR<T>;
  const int64_t per_word = words ? words->depth_per_word : 1;
  const int64_t depth = K * per_word, kc_words = kKC / per_word;
  const int64_t row_panels = (M + kMR - 1) / kMR, col_vectors = (N + L - 1) / L;
  const bool small = 2.0 * M * N * depth < parallel_flops;
  // Split the larger dimension, so the operand packed twice is the smaller one. Columns are
  // dealt in whole vectors, rows in whole panels.
  const bool split_rows = M >= N;
  const int64_t extent = split_rows ? row_panels : col_vectors;
  const int threads = small || scratch || omp_in_parallel()
                          ? 1
                          : static_cast<int>(std::min<int64_t>(omp_get_max_threads(), extent));
  // When threads split the columns, all of them need all of A: it is packed once, together,
  // before the threads part (the one barrier of the call), instead of once per thread.
  const bool shared_a = threads > 1 && !split_rows;
  // Sized for depth elements; packed words (per_word > 1) use the front of each part.
  const int64_t shared_elems = shared_a ? row_panels * kMR * depth : 0;
  const int64_t a_elems = shared_a ? 0 : a_block_elems<T>(M, depth);
  const int64_t b_elems = b_block_elems<T>(N, depth);
  std::unique_ptr<Workspace> ws;
  if (!scratch) {
    ws = std::make_unique<Workspace>(
        Device::cpu(),
        static_cast<uint64_t>(shared_elems + threads * (a_elems + b_elems)) * sizeof(T));
  }
  if (dry_run_active()) return;  // the dry path (kernels.h): the scratch, requested and unused
  // block pc, panel ip at shared + row_panels*kMR*pc + ip*kMR*kc
  T* const shared = scratch ? scratch : ws->as<T>();
  const TileFn<T> run_tile = words ? words->tile : tile_kernel<T>(tile_isa());
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    if (shared_a) {
      const int64_t blocks = (K + kc_words - 1) / kc_words;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < blocks * row_panels; ++i) {
        const int64_t pc = i / row_panels * kc_words, ip = i % row_panels, m0 = ip * kMR;
        const int64_t kc = std::min(kc_words, K - pc);
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
      for (int64_t pc = 0; pc < K; pc += kc_words) {
        const int64_t kc = std::min(kc_words, K - pc);
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
                run_tile(static_cast<int>(w / L), kc, ap, bp, at_rows, nruns, rows, c.ld, acc,
                         bias_rows);
                continue;
              }
              // More image boundaries in this panel than kMaxRuns (planes of a few pixels):
              // compute into a spill tile, then add column by column with the same arithmetic.
              T spill[kMR * kNR<T>];
              const Run<T> whole{0, w, spill};
              run_tile(static_cast<int>(w / L), kc, ap, bp, &whole, 1, kMR, w, false, nullptr);
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
