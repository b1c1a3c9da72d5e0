// CPU 2-D convolution (declared in kernels/kernels.h): forward, backward-data and
// backward-filter as GEMMs on the packed GEMM of kernels/cpu/packed_gemm.h.
//
// Columns are the output pixels of the whole batch, g = n*PQ + p*Q + q; rows of the unfolded
// input ("im2col") are the taps (c, r, s):
//   forward          y (K, cols)      = w (K, CRS) * col (CRS, cols)       (+ bias)
//   backward-filter  dw (K, CRS)      = dy (K, cols) * col^T (cols, CRS)
//   backward-data    dcol (CRS, cols) = w^T (CRS, K) * dy (K, cols), folded back by col2im
// The column matrix is never built for forward and backward-filter: the GEMM's B packing reads
// pixels straight from x (implicit im2col), so those two passes need no workspace beyond the
// packed panels. Backward-data of a stride-1 convolution with planes of kFlipMinPixels or more is
// computed as a forward convolution of dy with flipped weights (a 1x1 one as w^T * dy), writing
// dx directly. The others materialize dcol for a tile of whole images (or, when one image alone
// would pass kWorkspaceBudget, a band of output rows) and fold it into dx. Tile sizes depend only
// on the shape (and the packed buffers on the shape and the thread count), so the workspace
// requested is the same on every run: the memory simulator relies on it. In a dry run (kernels.h,
// kDryRunLaunchers) every pass requests that workspace, tile by tile as a real run does, and
// computes nothing: the packed GEMM returns after its request, the other loops are skipped.
//
// 3x3 stride-1 convolutions with enough channels and output tiles (conv2d_winograd.h
// applies()), f32, bf16 and f16 alike, go to Winograd instead, all three passes (backward-data as
// the flipped forward; F(4x4, 3x3) or F(2x2, 3x3) by tile_size(), backward-filter F(2x2)), unless
// REGEN_CPU_CONV=direct. The choice depends on the shape only (and the variable).
//
// Determinism: the packed GEMM sums every element in a fixed order with fixed block sizes, col2im
// sums each (image, channel) plane on one thread in a fixed order, and bias gradients are summed
// per channel in image order: results are identical run to run, for any thread count.
//
// 16-bit operands (T = bfloat16 or float16): the same passes on the f32 packed GEMM, whose panels
// are packed from the 16-bit tensors (the implicit im2col copies 16-bit pixels, then each panel is
// widened to f32 in L1), so every product and sum is f32; bf16 in depth pairs, as gemm_lowp's
// (on the bf16 pair tile where the CPU has it, kernels/cpu/gemm_lowp.h). The GEMM writes f32 into a
// workspace of whole images (output planes, dcol, or dx being folded) and each output element is
// rounded to 16 bits once, after the bias (if any) is added in f32. Backward-filter writes f32 (K,
// CRS) into a workspace and rounds it once; the bias gradient is summed in double and rounded once.
// Their Winograd passes widen as they read and round once too (conv2d_winograd.h).
// Tests: tests/test_ops_vision.cpp (against nested loops), tests/test_gradcheck_vision.cpp,
// tests/test_amp_gemm_ops.cpp (16-bit against f32).
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "regen/core/tensor.h"
#include "regen/kernels/cpu/conv2d_lowp.h"
#include "regen/kernels/cpu/conv2d_winograd.h"
#include "regen/kernels/cpu/convert.h"
#include "regen/kernels/cpu/packed_gemm.h"
#include "regen/kernels/cpu/panel_transpose.h"
#include "regen/kernels/kernels.h"

namespace regen::cpu {
namespace {

constexpr uint64_t kWorkspaceBudget = 64ull << 20;  // bytes of dcol per backward-data tile
constexpr int64_t kParallelMin = 1 << 14;           // elements; below this col2im uses one thread
constexpr int64_t kFlipMinPixels = 100;  // output plane size from which stride-1 dx is a conv

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Valid q of kernel column `ks`: 0 <= q*stride_w - pad_w + ks < W.
void valid_q(const ConvShape& s, int64_t ks, int64_t& q_lo, int64_t& q_hi) {
  const int64_t first = s.pad_w - ks;  // q*stride_w >= first
  q_lo = first <= 0 ? 0 : ceil_div(first, s.stride_w);
  const int64_t last = s.W - 1 + s.pad_w - ks;  // q*stride_w <= last
  q_hi = last < 0 ? 0 : std::min<int64_t>(s.Q, last / s.stride_w + 1);
  q_lo = std::min(q_lo, q_hi);
}

// dst[t] = src[first + t] for t in [lo, hi), 0 for the rest of [0, len): one image row segment
// with its padding. (Measured on Zen 5: memcpy beats both plain loops and AVX-512 masked loads
// here, even for 7-pixel rows.)
template <class T>
void copy_window(T* dst, const T* src, int64_t first, int64_t len, int64_t lo, int64_t hi) {
  for (int64_t t = 0; t < lo; ++t) dst[t] = T(0);
  std::memcpy(dst + lo, src + first + lo, static_cast<size_t>(hi - lo) * sizeof(T));
  for (int64_t t = hi; t < len; ++t) dst[t] = T(0);
}

// ---- Matrix sources. block(r0, nr, c0, nc, dst, drs, ds) copies rows [r0, r0 + nr) x columns
// [c0, c0 + nc) of the source to dst[(r - r0) * drs + (c - c0) * ds]. The packing adapters below
// turn sources into GEMM operands. Index arithmetic (divisions) is done once per block, not per
// element: packing must stay cheap next to the FMAs it feeds.

// ColSource copies stride-1 rows in chunks of one vector; the buffers it writes into keep this
// many elements of slack after their end (packed_gemm.h's kSlack).
template <class T>
constexpr int64_t kCopyChunk = packed::kSlack<T>;

// The unfolded input: row (c, r, s), column g = base + col: image g / PQ, pixel (p, q).
template <class T>
struct ColSource {
  const T* x;
  ConvShape s;
  int64_t base;
  static constexpr int64_t kMaxCols = std::max<int64_t>(packed::kKC, packed::kNR<float>);
  // A run of columns within one output row.
  struct Run {
    int64_t img, ih0, q, len, t0;  // image, input row of r = 0, first q, length, first column
  };
  void block(int64_t r0, int64_t nr, int64_t c0, int64_t nc, T* dst, int64_t drs,
             int64_t ds) const {
    REGEN_ASSERT(nc <= kMaxCols);
    Run runs[kMaxCols];
    int64_t nruns = 0;
    {
      const int64_t pq = s.P * s.Q, g = base + c0;
      int64_t img = g / pq, p = g % pq / s.Q, q = g % s.Q;
      for (int64_t t = 0; t < nc;) {
        const int64_t len = std::min(s.Q - q, nc - t);
        runs[nruns++] = {img, p * s.stride_h - s.pad_h, q, len, t};
        t += len;
        q = 0;
        if (++p == s.P) p = 0, ++img;
      }
    }
    int64_t c = r0 / (s.R * s.S), r = r0 / s.S % s.R, ks = r0 % s.S;
    if (ds == 1 && s.stride_w == 1 && s.S > 1 &&
        block_by_lines(runs, nruns, c, r, ks, nr, dst, drs))
      return;
    for (int64_t row = 0; row < nr; ++row) {
      int64_t q_lo, q_hi;
      valid_q(s, ks, q_lo, q_hi);
      T* d = dst + row * drs;
      for (int64_t i = 0; i < nruns; ++i) {
        const Run& u = runs[i];
        T* o = d + u.t0 * ds;  // column q of the run lands at o[(q - u.q) * ds]
        const int64_t ih = u.ih0 + r;
        // Valid pixels of the run are [lo, hi); padding reads as zero.
        const int64_t lo = std::clamp(q_lo, u.q, u.q + u.len),
                      hi = std::clamp(q_hi, lo, u.q + u.len);
        if (ih < 0 || ih >= s.H || lo >= hi) {
          for (int64_t t = 0; t < u.len; ++t) o[t * ds] = T(0);
          continue;
        }
        const T* src = x + ((u.img * s.C + c) * s.H + ih) * s.W;  // q reads src[q*sw + shift]
        const int64_t shift = ks - s.pad_w;
        if (ds == 1 && s.stride_w == 1) {
          copy_window(o, src, u.q + shift, u.len, lo - u.q, hi - u.q);
          continue;
        }
        for (int64_t t = u.q; t < lo; ++t) o[(t - u.q) * ds] = T(0);
        if (ds == 1 && s.stride_w == 2) {  // the strided convolutions: a constant stride vectorizes
          for (int64_t t = lo; t < hi; ++t) o[t - u.q] = src[2 * t + shift];
        } else {
          for (int64_t t = lo; t < hi; ++t) o[(t - u.q) * ds] = src[t * s.stride_w + shift];
        }
        for (int64_t t = hi; t < u.q + u.len; ++t) o[(t - u.q) * ds] = T(0);
      }
      if (++ks == s.S) {
        ks = 0;
        if (++r == s.R) r = 0, ++c;
      }
    }
  }

  // Stride 1, S > 1, contiguous rows: the S taps (c, r, 0..S-1) of a run read one input row at S
  // shifts. Each (c, r) row of every run is copied once, with its padding, into a zero-bordered
  // line; each tap is then a plain copy from the line at its shift, in whole vectors (no bounds
  // logic, no memcpy call per run). Writes run up to kCopyChunk - 1 elements past a run's end:
  // later runs and rows overwrite them, and the last row needs that much slack after dst.
  // Returns false (nothing written) when the lines do not fit the local buffer.
  bool block_by_lines(const Run* runs, int64_t nruns, int64_t c, int64_t r, int64_t ks, int64_t nr,
                      T* dst, int64_t drs) const {
    constexpr int64_t kLineBuf = 4 * kMaxCols + 64;
    T lines[kLineBuf + kCopyChunk<T>];
    int64_t offset[kMaxCols + 1];
    offset[0] = 0;
    for (int64_t i = 0; i < nruns; ++i) offset[i + 1] = offset[i] + runs[i].len + s.S - 1;
    if (offset[nruns] > kLineBuf) return false;
    std::fill(lines + offset[nruns], lines + offset[nruns] + kCopyChunk<T>, T(0));
    bool stale = true;  // lines hold (c, r)?
    for (int64_t row = 0; row < nr; ++row) {
      if (stale) {
        for (int64_t i = 0; i < nruns; ++i) {
          const Run& u = runs[i];
          T* line = lines + offset[i];  // line[t] is input column u.q - pad_w + t
          const int64_t n = u.len + s.S - 1, ih = u.ih0 + r, iw0 = u.q - s.pad_w;
          if (ih < 0 || ih >= s.H) {
            std::fill(line, line + n, T(0));
            continue;
          }
          const T* src = x + ((u.img * s.C + c) * s.H + ih) * s.W;
          const int64_t lo = std::clamp<int64_t>(-iw0, 0, n), hi = std::clamp(s.W - iw0, lo, n);
          std::fill(line, line + lo, T(0));
          std::copy(src + iw0 + lo, src + iw0 + hi, line + lo);
          std::fill(line + hi, line + n, T(0));
        }
        stale = false;
      }
      T* d = dst + row * drs;
      for (int64_t i = 0; i < nruns; ++i) {
        const T* from = lines + offset[i] + ks;
        T* to = d + runs[i].t0;
        for (int64_t t = 0; t < runs[i].len; t += kCopyChunk<T>) {
          std::memcpy(to + t, from + t, kCopyChunk<T> * sizeof(T));
        }
      }
      if (++ks == s.S) {
        ks = 0;
        stale = true;
        if (++r == s.R) r = 0, ++c;
      }
    }
    return true;
  }
};

// Planes (N, K, PQ) as a (K, N*PQ) matrix, columns from `base` on: dy, or the input x (N, C, HW)
// of a pointwise convolution, whose unfolded matrix is x itself. A block is one copy per row and
// image (PQ elements where the block spans the plane), where ColSource splits every row into runs
// of one output row (Q elements) and handles padding and taps it does not have.
template <class T>
struct PlaneSource {
  const T* planes;
  int64_t K, pq, base;
  void block(int64_t r0, int64_t nr, int64_t c0, int64_t nc, T* dst, int64_t drs,
             int64_t ds) const {
    for (int64_t g = base + c0, end = g + nc, t = 0; g < end;) {  // runs within one image
      const int64_t img = g / pq, off = g % pq, len = std::min(pq - off, end - g);
      for (int64_t row = 0; row < nr; ++row) {
        const T* src = planes + (img * K + r0 + row) * pq + off;
        T* o = dst + row * drs + t * ds;
        if (ds == 1) {
          std::memcpy(o, src, static_cast<size_t>(len) * sizeof(T));
        } else {
          for (int64_t i = 0; i < len; ++i) o[i * ds] = src[i];
        }
      }
      g += len;
      t += len;
    }
  }
};

// A row-major matrix with row stride ld.
template <class T>
struct ViewSource {
  const T* p;
  int64_t ld;
  void block(int64_t r0, int64_t nr, int64_t c0, int64_t nc, T* dst, int64_t drs,
             int64_t ds) const {
    if (drs == 1) {  // writes are contiguous along rows: walk columns outside
      for (int64_t j = 0; j < nc; ++j)
        for (int64_t i = 0; i < nr; ++i) dst[j * ds + i] = p[(r0 + i) * ld + c0 + j];
    } else {
      for (int64_t i = 0; i < nr; ++i)
        for (int64_t j = 0; j < nc; ++j) dst[i * drs + j * ds] = p[(r0 + i) * ld + c0 + j];
    }
  }
};

// Packing adapters (layouts in packed_gemm.h). Rows: operand(i, j) = source(i, j); Cols:
// operand(i, j) = source(j, i). Padding rows/columns of a panel are zero.
template <class T, class S>
struct ARows {
  S src;
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, T* dst) const {
    // Rows are contiguous in the source and interleaved in the panel: copy them out row by row,
    // then interleave from L1, instead of writing the panel with a stride.
    T rows_buf[packed::kMR * packed::kKC];
    src.block(m0, rows, k0, kc, rows_buf, kc, 1);
    packed::transpose_into_panel(rows_buf, kc, rows, kc, dst, packed::kMR, packed::kMR);
  }
};
template <class T, class S>
struct ACols {
  S src;
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, T* dst) const {
    src.block(k0, kc, m0, rows, dst, packed::kMR, 1);
    for (int64_t k = 0; k < kc; ++k)
      std::fill(dst + k * packed::kMR + rows, dst + (k + 1) * packed::kMR, T(0));
  }
};
template <class T, class S>
struct BRows {
  S src;
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, T* dst) const {
    src.block(k0, kc, j0, cols, dst, w, 1);
    for (int64_t k = 0; k < kc; ++k) std::fill(dst + k * w + cols, dst + (k + 1) * w, T(0));
  }
};
template <class T, class S>
struct BCols {
  S src;
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, T* dst) const {
    // As ARows: contiguous copies into an L1-sized buffer, then the transpose into the panel.
    T rows_buf[packed::kNR<T> * packed::kKC + packed::kSlack<T>];
    src.block(j0, cols, k0, kc, rows_buf, kc, 1);
    packed::transpose_into_panel(rows_buf, kc, cols, kc, dst, w, w);
  }
};

// dx (images, C, H, W) += the columns of output rows [p0, p1) of `images` images folded back
// (the adjoint of im2col); image i's columns start at col + i*(p1 - p0)*Q, rows ld apart. Each
// (image, channel) plane is summed by one thread in (r, ks, p, q) order: deterministic for any
// thread count.
template <class T>
void col2im(const T* col, int64_t ld, int64_t images, int64_t p0, int64_t p1, T* dx,
            const ConvShape& s) {
  const int64_t planes = images * s.C, cols = (p1 - p0) * s.Q;
#pragma omp parallel for schedule(static) if (planes * s.R * s.S * cols > kParallelMin)
  for (int64_t i = 0; i < planes; ++i) {
    const int64_t img = i / s.C, c = i % s.C;
    T* plane = dx + i * s.H * s.W;
    for (int64_t r = 0; r < s.R; ++r) {
      for (int64_t ks = 0; ks < s.S; ++ks) {
        const T* in = col + ((c * s.R + r) * s.S + ks) * ld + img * cols;
        int64_t q_lo, q_hi;
        valid_q(s, ks, q_lo, q_hi);
        const int64_t shift = ks - s.pad_w;  // q lands at row[q*sw + shift], in range for valid q
        for (int64_t p = p0; p < p1; ++p, in += s.Q) {
          const int64_t ih = p * s.stride_h - s.pad_h + r;
          if (ih < 0 || ih >= s.H) continue;
          T* row = plane + ih * s.W;
          if (s.stride_w == 1) {
            for (int64_t q = q_lo; q < q_hi; ++q) row[q + shift] += in[q];
          } else {
            for (int64_t q = q_lo; q < q_hi; ++q) row[q * s.stride_w + shift] += in[q];
          }
        }
      }
    }
  }
}

bool is_pointwise(const ConvShape& s) {
  return s.R == 1 && s.S == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0;
}

// Calls f with the source of x's unfolded matrix (C R S, N P Q), columns from `base` on: for a
// pointwise convolution the planes of x themselves (that matrix is x), else the unfolding.
template <class T, class F>
void with_unfolded(const T* x, const ConvShape& s, int64_t base, F&& f) {
  if (is_pointwise(s)) {
    f(PlaneSource<T>{x, s.C, s.P * s.Q, base});
  } else {
    f(ColSource<T>{x, s, base});
  }
}

// ---- 16-bit operands --------------------------------------------------------------------------
// Packers of f32 panels from 16-bit sources: P packs the panel in E (the layout an f32 packer
// would write, zero padding included), then it is widened in place into the f32 panel. The copy
// stays in L1; a zero widens to zero, so the panel is the f32 one of the widened operand.
template <class E, class P>
struct WidenA {
  P packer;
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, float* dst) const {
    E panel[packed::kMR * packed::kKC];
    packer.pack(m0, rows, k0, kc, panel);
    convert::widen_span(panel, dst, packed::kMR * kc);
  }
};
template <class E, class P>
struct WidenB {
  P packer;
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, float* dst) const {
    // w <= kNR<float>: the f32 GEMM's panel width; the source may write kSlack<E> past the end.
    E panel[packed::kNR<float> * packed::kKC + packed::kSlack<E>];
    packer.pack(k0, kc, j0, cols, w, panel);
    convert::widen_span(panel, dst, kc * w);
  }
};

// bf16 x bf16 in depth pairs, as gemm_lowp's (kernels/cpu/gemm_lowp.h): the GEMM's depth is the
// operand's `depth` rounded up to even, 0 past it. PairA/PairB pack the bf16 pair tile's 32-bit
// words (packed_gemm.h, bf16_pair_tile; k0 and kc count words) from P's bf16 panel; SwapA/SwapB
// pack f32 panels with each depth pair swapped, which give the f32 tiles the same sums.

// P's bf16 panel of depth [k0, k0 + kc) (A's layout: rows m0.., panel[k * kMR + i]; B's: columns
// j0.., panel[k * w + j]), its depth past `depth` zero (P packs only the depth that exists).
template <class P>
void packed_depth(const P& packer, int64_t m0, int64_t rows, int64_t k0, int64_t kc, int64_t depth,
                  bfloat16* panel) {
  const int64_t have = std::min(kc, depth - k0);
  packer.pack(m0, rows, k0, have, panel);
  std::fill(panel + have * packed::kMR, panel + kc * packed::kMR, bfloat16());
}
template <class P>
void packed_depth(const P& packer, int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w,
                  int64_t depth, bfloat16* panel) {
  const int64_t have = std::min(kc, depth - k0);
  packer.pack(k0, have, j0, cols, w, panel);
  std::fill(panel + have * w, panel + kc * w, bfloat16());
}

inline uint32_t pair_word(bfloat16 even, bfloat16 odd) {
  return static_cast<uint32_t>(even.bits) | static_cast<uint32_t>(odd.bits) << 16;
}
template <class P>
struct PairA {
  P packer;
  int64_t depth;
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, float* dst) const {
    constexpr int64_t MR = packed::kMR;
    bfloat16 panel[MR * packed::kKC];
    packed_depth(packer, m0, rows, 2 * k0, 2 * kc, depth, panel);
    for (int64_t kk = 0; kk < kc; ++kk) {
      uint32_t words[MR];
      for (int64_t i = 0; i < MR; ++i)
        words[i] = pair_word(panel[2 * kk * MR + i], panel[(2 * kk + 1) * MR + i]);
      std::memcpy(dst + kk * MR, words, sizeof words);
    }
  }
};
template <class P>
struct PairB {
  P packer;
  int64_t depth;
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, float* dst) const {
    bfloat16 panel[packed::kNR<float> * packed::kKC + packed::kSlack<bfloat16>];
    packed_depth(packer, 2 * k0, 2 * kc, j0, cols, w, depth, panel);
    for (int64_t kk = 0; kk < kc; ++kk) {
      const bfloat16* even = panel + 2 * kk * w;
      const bfloat16* odd = even + w;
      uint32_t* d = reinterpret_cast<uint32_t*>(dst + kk * w);
      for (int64_t j = 0; j < w; ++j) d[j] = pair_word(even[j], odd[j]);
    }
  }
};
template <class P>
struct SwapA {
  P packer;
  int64_t depth;
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, float* dst) const {
    constexpr int64_t MR = packed::kMR;
    bfloat16 panel[MR * packed::kKC];
    packed_depth(packer, m0, rows, k0, kc, depth, panel);
    for (int64_t k = 0; k < kc; ++k) convert::widen_span(panel + (k ^ 1) * MR, dst + k * MR, MR);
  }
};
template <class P>
struct SwapB {
  P packer;
  int64_t depth;
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, float* dst) const {
    bfloat16 panel[packed::kNR<float> * packed::kKC + packed::kSlack<bfloat16>];
    packed_depth(packer, k0, kc, j0, cols, w, depth, panel);
    for (int64_t k = 0; k < kc; ++k) convert::widen_span(panel + (k ^ 1) * w, dst + k * w, w);
  }
};

// C (M, N) f32 = op(A) op(B) of 16-bit operands given as packers of E panels (ARows, BCols, ...):
// f16 widened panel by panel (WidenA, WidenB), bf16 in depth pairs (above).
template <class E, class PA, class PB>
void gemm_16(int64_t M, int64_t N, int64_t K, const PA& a, const PB& b,
             const packed::CView<float>& c) {
  if constexpr (std::is_same_v<E, bfloat16>) {
    const int64_t even = K + K % 2;
    if (const packed::TileFn<float> tile = packed::bf16_pair_tile(packed::tile_isa())) {
      const packed::WordTile<float> words{tile, 2};
      packed::gemm<float>(M, N, even / 2, PairA<PA>{a, K}, PairB<PB>{b, K}, nullptr, false, c,
                          &words);
    } else {
      packed::gemm<float>(M, N, even, SwapA<PA>{a, K}, SwapB<PB>{b, K}, nullptr, false, c);
    }
  } else {
    packed::gemm<float>(M, N, K, WidenA<E, PA>{a}, WidenB<E, PB>{b}, nullptr, false, c);
  }
}

// Images per tile of an f32 output workspace of `image_elems` floats per image: as many as
// kWorkspaceBudget holds, at least one. Depends on the shape only (the dry run's sizes).
int64_t f32_tile_images(int64_t image_elems, int64_t N) {
  const int64_t bytes = std::max<int64_t>(image_elems * static_cast<int64_t>(sizeof(float)), 1);
  return std::clamp<int64_t>(static_cast<int64_t>(kWorkspaceBudget) / bytes, 1, N);
}

// y (planes, plane) = acc (planes, plane) [+ bias[i % channels] per plane i], rounded once to E.
// acc is f32 workspace and is overwritten.
template <class E>
void store_planes(float* acc, E* y, int64_t planes, int64_t channels, int64_t plane,
                  const E* bias) {
#pragma omp parallel for schedule(static) if (planes * plane > kParallelMin)
  for (int64_t i = 0; i < planes; ++i) {
    float* a = acc + i * plane;
    if (bias) {
      const float b = static_cast<float>(bias[i % channels]);
      for (int64_t j = 0; j < plane; ++j) a[j] += b;
    }
    convert::narrow_span(a, y + i * plane, plane);
  }
}

template <class E>
void forward_lowp(const E* x, const E* w, const E* bias, E* y, const ConvShape& s) {
  if (winograd::applies(s)) return winograd::forward<E>(x, w, bias, y, s);
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, kpq = s.K * pq;
  const int64_t images = f32_tile_images(kpq, s.N);
  Workspace ws(Device::cpu(), static_cast<uint64_t>(images * kpq) * sizeof(float));
  float* acc = ws.as<float>();  // (images, K, PQ)
  const ARows<E, ViewSource<E>> a{{w, crs}};
  for (int64_t n0 = 0; n0 < s.N; n0 += images) {
    const int64_t ng = std::min(images, s.N - n0);
    with_unfolded(x, s, n0 * pq, [&](const auto& src) {
      const BRows<E, std::decay_t<decltype(src)>> b{src};
      gemm_16<E>(s.K, ng * pq, crs, a, b, {acc, pq, pq, kpq});
    });
    if (!dry_run_active()) store_planes(acc, y + n0 * kpq, ng * s.K, s.K, pq, bias);
  }
}

template <class E>
void backward_data_lowp(const E* dy, const E* w, const E* bias, E* dx, const ConvShape& s) {
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, hw = s.H * s.W, chw = s.C * hw;
  const bool dry = dry_run_active();
  if (is_pointwise(s)) {  // dx (C, cols) = w^T * dy, w stored (K, C)
    const int64_t images = f32_tile_images(chw, s.N);
    Workspace ws(Device::cpu(), static_cast<uint64_t>(images * chw) * sizeof(float));
    float* acc = ws.as<float>();
    const ACols<E, ViewSource<E>> a{{w, s.C}};
    for (int64_t n0 = 0; n0 < s.N; n0 += images) {
      const int64_t ng = std::min(images, s.N - n0);
      const BRows<E, PlaneSource<E>> b{{dy, s.K, pq, n0 * pq}};
      gemm_16<E>(s.C, ng * pq, s.K, a, b, {acc, pq, pq, chw});
      if (!dry) store_planes(acc, dx + n0 * chw, ng * s.C, s.C, hw, bias);
    }
    return;
  }
  const ConvShape t = s.stride_h == 1 && s.stride_w == 1 && s.pad_h < s.R && s.pad_w < s.S
                          ? make_conv_shape(s.N, s.K, s.P, s.Q, s.C, s.R, s.S, 1, 1,
                                            s.R - 1 - s.pad_h, s.S - 1 - s.pad_w)
                          : ConvShape{};
  const bool winograd_flip = t.N > 0 && winograd::applies(t);
  if (winograd_flip) return winograd::forward<E>(dy, w, bias, dx, t, true);  // as the f32 path
  if (t.N > 0 && s.P * s.Q >= kFlipMinPixels) {
    // As the f32 path: a convolution of dy with the flipped weights (a 16-bit bit copy).
    const int64_t krs = s.K * s.R * s.S, rs = s.R * s.S;
    Workspace flip_ws(Device::cpu(), static_cast<uint64_t>(s.C * krs) * sizeof(E));
    E* flipped = flip_ws.as<E>();
    if (!dry) {
#pragma omp parallel for schedule(static) if (s.C * krs > kParallelMin)
      for (int64_t c = 0; c < s.C; ++c) {
        for (int64_t k = 0; k < s.K; ++k) {
          const E* src = w + (k * s.C + c) * rs;
          E* dst = flipped + (c * s.K + k) * rs;
          for (int64_t i = 0; i < rs; ++i) dst[i] = src[rs - 1 - i];
        }
      }
    }
    const int64_t images = f32_tile_images(chw, s.N);
    Workspace ws(Device::cpu(), static_cast<uint64_t>(images * chw) * sizeof(float));
    float* acc = ws.as<float>();
    const ARows<E, ViewSource<E>> a{{flipped, krs}};
    for (int64_t n0 = 0; n0 < s.N; n0 += images) {
      const int64_t ng = std::min(images, s.N - n0);
      const BRows<E, ColSource<E>> b{{dy, t, n0 * hw}};
      gemm_16<E>(s.C, ng * hw, krs, a, b, {acc, hw, hw, chw});
      if (!dry) store_planes(acc, dx + n0 * chw, ng * s.C, s.C, hw, bias);
    }
    return;
  }
  // dcol in f32 per tile (as the f32 path's tiles, sized for f32), folded into an f32 dx of the
  // tile's images, which is rounded once when all its rows are folded.
  const int64_t image_bytes = static_cast<int64_t>(sizeof(float)) * crs * pq;
  const int64_t budget = static_cast<int64_t>(kWorkspaceBudget);
  const int64_t images = std::clamp<int64_t>(budget / std::max<int64_t>(image_bytes, 1), 1, s.N);
  const int64_t rows =
      image_bytes <= budget
          ? s.P
          : std::clamp<int64_t>(budget / std::max<int64_t>(image_bytes / s.P, 1), 1, s.P);
  Workspace col_ws(Device::cpu(), static_cast<uint64_t>(crs * images * rows * s.Q) * sizeof(float));
  Workspace dx_ws(Device::cpu(), static_cast<uint64_t>(images * chw) * sizeof(float));
  float* col = col_ws.as<float>();
  float* acc = dx_ws.as<float>();
  const ACols<E, ViewSource<E>> a{{w, crs}};  // w^T (CRS, K), w stored (K, CRS)
  const int64_t whole = std::numeric_limits<int64_t>::max();
  for (int64_t n0 = 0; n0 < s.N; n0 += images) {
    const int64_t ng = std::min(images, s.N - n0);
    if (!dry) fill<float>(acc, ng * chw, 0.0f);  // col2im accumulates
    for (int64_t p0 = 0; p0 < s.P; p0 += rows) {
      const int64_t p1 = std::min(s.P, p0 + rows), cols = ng * (p1 - p0) * s.Q;
      const BRows<E, PlaneSource<E>> b{{dy, s.K, pq, n0 * pq + p0 * s.Q}};
      gemm_16<E>(crs, cols, s.K, a, b, {col, cols, whole, 0});
      if (!dry) col2im(col, cols, ng, p0, p1, acc, s);
    }
    if (!dry) store_planes(acc, dx + n0 * chw, ng * s.C, s.C, hw, bias);
  }
}

template <class E>
void backward_filter_lowp(const E* x, const E* dy, E* dw, E* dbias, const ConvShape& s) {
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q;
  if (dbias && !dry_run_active()) {
#pragma omp parallel for schedule(static) if (s.N * s.K * pq > kParallelMin)
    for (int64_t k = 0; k < s.K; ++k) {
      double acc = 0;
      for (int64_t n = 0; n < s.N; ++n) {
        const E* row = dy + (n * s.K + k) * pq;
        for (int64_t j = 0; j < pq; ++j) acc += static_cast<double>(static_cast<float>(row[j]));
      }
      dbias[k] = E(static_cast<float>(acc));
    }
  }
  if (!dw) return;  // the bias gradient alone
  if (winograd::applies(s)) return winograd::backward_filter<E>(x, dy, dw, s);
  Workspace ws(Device::cpu(), static_cast<uint64_t>(s.K * crs) * sizeof(float));
  float* acc = ws.as<float>();  // (K, CRS)
  const ARows<E, PlaneSource<E>> a{{dy, s.K, pq, 0}};
  with_unfolded(x, s, 0, [&](const auto& src) {
    const BCols<E, std::decay_t<decltype(src)>> b{src};
    gemm_16<E>(s.K, crs, s.N * pq, a, b, {acc, crs, std::numeric_limits<int64_t>::max(), 0});
  });
  if (!dry_run_active()) store_planes<E>(acc, dw, s.K, s.K, crs, nullptr);
}

template <class T>
void conv2d_forward_wide(const T* x, const T* w, const T* bias, T* y, const ConvShape& s) {
  if constexpr (std::is_same_v<T, float>) {
    if (winograd::applies(s)) return winograd::forward<T>(x, w, bias, y, s);
  }
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q;
  const ARows<T, ViewSource<T>> a{{w, crs}};
  with_unfolded(x, s, 0, [&](const auto& src) {
    const BRows<T, std::decay_t<decltype(src)>> b{src};
    packed::gemm<T>(s.K, s.N * pq, crs, a, b, bias, false, {y, pq, pq, s.K * pq});
  });
}

template <class T>
void conv2d_backward_data_wide(const T* dy, const T* w, T* dx, const ConvShape& s) {
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
  const bool dry = dry_run_active();  // the GEMMs request their scratch; nothing else runs
  if (is_pointwise(s)) {              // dx (C, cols) = w^T * dy, no folding needed
    const ACols<T, ViewSource<T>> a{{w, s.C}};
    const BRows<T, PlaneSource<T>> b{{dy, s.K, pq, 0}};
    packed::gemm<T>(s.C, s.N * pq, s.K, a, b, nullptr, false, {dx, pq, pq, chw});
    return;
  }
  const ConvShape flip = s.stride_h == 1 && s.stride_w == 1 && s.pad_h < s.R && s.pad_w < s.S
                             ? make_conv_shape(s.N, s.K, s.P, s.Q, s.C, s.R, s.S, 1, 1,
                                               s.R - 1 - s.pad_h, s.S - 1 - s.pad_w)
                             : ConvShape{};
  const bool winograd_flip = std::is_same_v<T, float> && flip.N > 0 && winograd::applies(flip);
  if (flip.N > 0 && (s.P * s.Q >= kFlipMinPixels || winograd_flip)) {
    // With stride 1, dx is itself a convolution: of dy with the weights flipped in space and
    // with K and C swapped, padded by R-1-pad. That needs no dcol and no col2im pass, only a
    // flipped copy of the weights. On small planes the dcol route is faster: its GEMM packs
    // only dy and w^T, both small there, while this one unfolds dy for every tap (unless the
    // flipped convolution goes to Winograd, conv2d_winograd.h, which unfolds nothing).
    if constexpr (std::is_same_v<T, float>) {
      // Winograd reads w flipped as it transforms the filters: no flipped copy.
      if (winograd_flip) return winograd::forward<T>(dy, w, nullptr, dx, flip, true);
    }
    const int64_t krs = s.K * s.R * s.S, rs = s.R * s.S;
    Workspace ws(Device::cpu(), static_cast<uint64_t>(s.C * krs) * sizeof(T));
    T* flipped = ws.as<T>();  // (C, K, R, S): flipped[c][k][r][s] = w[k][c][R-1-r][S-1-s]
    if (!dry) {
#pragma omp parallel for schedule(static) if (s.C * krs > kParallelMin)
      for (int64_t c = 0; c < s.C; ++c) {
        for (int64_t k = 0; k < s.K; ++k) {
          const T* src = w + (k * s.C + c) * rs;
          T* dst = flipped + (c * s.K + k) * rs;
          for (int64_t i = 0; i < rs; ++i) dst[i] = src[rs - 1 - i];
        }
      }
    }
    const ARows<T, ViewSource<T>> a{{flipped, krs}};
    const BRows<T, ColSource<T>> b{{dy, flip, 0}};
    packed::gemm<T>(s.C, s.N * s.H * s.W, krs, a, b, nullptr, false,
                    {dx, s.H * s.W, s.H * s.W, chw});
    return;
  }
  if (!dry) fill<T>(dx, s.N * chw, T(0));  // col2im accumulates
  // Tiles: as many whole images as fit the budget, else bands of output rows of one image.
  const int64_t image_bytes = static_cast<int64_t>(sizeof(T)) * crs * pq;
  const int64_t budget = static_cast<int64_t>(kWorkspaceBudget);
  const int64_t images = std::clamp<int64_t>(budget / std::max<int64_t>(image_bytes, 1), 1, s.N);
  const int64_t rows =
      image_bytes <= budget
          ? s.P
          : std::clamp<int64_t>(budget / std::max<int64_t>(image_bytes / s.P, 1), 1, s.P);
  Workspace ws(Device::cpu(), static_cast<uint64_t>(crs * images * rows * s.Q) * sizeof(T));
  T* col = ws.as<T>();
  const ACols<T, ViewSource<T>> a{{w, crs}};
  const int64_t whole = std::numeric_limits<int64_t>::max();
  for (int64_t n0 = 0; n0 < s.N; n0 += images) {
    const int64_t ng = std::min(images, s.N - n0);
    for (int64_t p0 = 0; p0 < s.P; p0 += rows) {
      const int64_t p1 = std::min(s.P, p0 + rows), cols = ng * (p1 - p0) * s.Q;
      const BRows<T, PlaneSource<T>> b{{dy, s.K, pq, n0 * pq + p0 * s.Q}};
      packed::gemm<T>(crs, cols, s.K, a, b, nullptr, false, {col, cols, whole, 0});
      if (!dry) col2im(col, cols, ng, p0, p1, dx + n0 * chw, s);
    }
  }
}

template <class T>
void conv2d_backward_filter_wide(const T* x, const T* dy, T* dw, T* dbias, const ConvShape& s) {
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q;
  if (dbias && !dry_run_active()) {
    // Per output channel, images in order, in double: deterministic and accurate.
#pragma omp parallel for schedule(static) if (s.N * s.K * pq > kParallelMin)
    for (int64_t k = 0; k < s.K; ++k) {
      double acc = 0;
      for (int64_t n = 0; n < s.N; ++n) {
        const T* row = dy + (n * s.K + k) * pq;
        for (int64_t j = 0; j < pq; ++j) acc += static_cast<double>(row[j]);
      }
      dbias[k] = static_cast<T>(acc);
    }
  }
  if constexpr (std::is_same_v<T, float>) {
    if (dw && winograd::applies(s)) return winograd::backward_filter<T>(x, dy, dw, s);
  }
  const ARows<T, PlaneSource<T>> a{{dy, s.K, pq, 0}};
  with_unfolded(x, s, 0, [&](const auto& src) {
    const BCols<T, std::decay_t<decltype(src)>> b{src};
    packed::gemm<T>(s.K, crs, s.N * pq, a, b, nullptr, false,
                    {dw, crs, std::numeric_limits<int64_t>::max(), 0});
  });
}

}  // namespace

// f32 and f64: the passes above; bf16 and f16: the 16-bit passes (f32 GEMMs, one rounding).
template <class T>
void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s) {
  if constexpr (is_half_v<T>) {
    forward_lowp(x, w, bias, y, s);
  } else {
    conv2d_forward_wide(x, w, bias, y, s);
  }
}

template <class T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s) {
  if constexpr (is_half_v<T>) {
    backward_data_lowp<T>(dy, w, nullptr, dx, s);
  } else {
    conv2d_backward_data_wide(dy, w, dx, s);
  }
}

template <class T>
void conv2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias, const ConvShape& s) {
  if constexpr (is_half_v<T>) {
    backward_filter_lowp(x, dy, dw, dbias, s);
  } else {
    conv2d_backward_filter_wide(x, dy, dw, dbias, s);
  }
}

#define REGEN_INSTANTIATE(T)                                                           \
  template void conv2d_forward<T>(const T*, const T*, const T*, T*, const ConvShape&); \
  template void conv2d_backward_data<T>(const T*, const T*, T*, const ConvShape&);     \
  template void conv2d_backward_filter<T>(const T*, const T*, T*, T*, const ConvShape&);
REGEN_INSTANTIATE(float)
REGEN_INSTANTIATE(double)
REGEN_INSTANTIATE(bfloat16)
REGEN_INSTANTIATE(float16)
#undef REGEN_INSTANTIATE

template <class T>
void conv2d_backward_data_with_bias(const T* dy, const T* w, const T* bias, T* dx,
                                    const ConvShape& s) {
  backward_data_lowp<T>(dy, w, bias, dx, s);
}
template void conv2d_backward_data_with_bias<bfloat16>(const bfloat16*, const bfloat16*,
                                                       const bfloat16*, bfloat16*,
                                                       const ConvShape&);
template void conv2d_backward_data_with_bias<float16>(const float16*, const float16*,
                                                      const float16*, float16*, const ConvShape&);

}  // namespace regen::cpu
