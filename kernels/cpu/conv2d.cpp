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
// packed panels. Backward-data materializes dcol for a tile of whole images (or, when one image
// alone would pass kWorkspaceBudget, a band of output rows) and folds it into dx; a 1x1, stride-1,
// unpadded convolution writes dx directly. Tile sizes depend only on the shape, so the workspace
// requested is the same on every run (the memory simulator relies on it).
//
// Determinism: the packed GEMM sums every element in a fixed order with fixed block sizes, col2im
// sums each channel on one thread in a fixed order, and bias gradients are summed per channel in
// image order: results are identical run to run, for any thread count.
// Tests: tests/test_ops_vision.cpp (against nested loops), tests/test_gradcheck_vision.cpp.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/tensor.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/kernels.h"

namespace regen::cpu {
namespace {

constexpr uint64_t kWorkspaceBudget = 64ull << 20;  // bytes of dcol per backward-data tile
constexpr int64_t kParallelMin = 1 << 14;           // elements; below this col2im uses one thread

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

// ---- Matrix sources: each copies `len` elements of one row, from column col0 on, to dst with
// stride ds. The packing adapters below turn them into GEMM operands.

// The unfolded input: row (c, r, s), column g = base + col: image g / PQ, pixel (p, q).
template <class T>
struct ColSource {
  const T* x;
  ConvShape s;
  int64_t base;
  void segment(int64_t row, int64_t col0, int64_t len, T* dst, int64_t ds) const {
    const int64_t c = row / (s.R * s.S), r = (row / s.S) % s.R, ks = row % s.S;
    const int64_t pq = s.P * s.Q;
    int64_t q_lo, q_hi;
    valid_q(s, ks, q_lo, q_hi);
    for (int64_t g = base + col0, end = g + len; g < end;) {
      const int64_t img = g / pq, p = g % pq / s.Q, q = g % s.Q;
      const int64_t run = std::min(s.Q - q, end - g);  // within one output row
      const int64_t ih = p * s.stride_h - s.pad_h + r;
      // Valid pixels of this run are [a, b); padding reads as zero.
      const int64_t a = std::clamp(q_lo, q, q + run), b = std::clamp(q_hi, a, q + run);
      const bool inside = ih >= 0 && ih < s.H && a < b;
      if (!inside) {
        for (int64_t t = 0; t < run; ++t) dst[t * ds] = T(0);
      } else {
        const T* src = x + ((img * s.C + c) * s.H + ih) * s.W - s.pad_w + ks;  // src[q*sw]
        for (int64_t t = q; t < a; ++t) dst[(t - q) * ds] = T(0);
        if (ds == 1 && s.stride_w == 1) {
          std::memcpy(dst + (a - q), src + a, static_cast<size_t>(b - a) * sizeof(T));
        } else {
          for (int64_t t = a; t < b; ++t) dst[(t - q) * ds] = src[t * s.stride_w];
        }
        for (int64_t t = b; t < q + run; ++t) dst[(t - q) * ds] = T(0);
      }
      dst += run * ds;
      g += run;
    }
  }
};

// dy (N, K, PQ) as a (K, N*PQ) matrix, columns from `base` on.
template <class T>
struct DySource {
  const T* dy;
  int64_t K, pq, base;
  void segment(int64_t row, int64_t col0, int64_t len, T* dst, int64_t ds) const {
    for (int64_t g = base + col0, end = g + len; g < end;) {
      const int64_t img = g / pq, off = g % pq, run = std::min(pq - off, end - g);
      const T* src = dy + (img * K + row) * pq + off;
      if (ds == 1) {
        std::memcpy(dst, src, static_cast<size_t>(run) * sizeof(T));
      } else {
        for (int64_t t = 0; t < run; ++t) dst[t * ds] = src[t];
      }
      dst += run * ds;
      g += run;
    }
  }
};

// A strided matrix: element (i, j) at p[i*rs + j*cs].
template <class T>
struct ViewSource {
  const T* p;
  int64_t rs, cs;
  void segment(int64_t row, int64_t col0, int64_t len, T* dst, int64_t ds) const {
    const T* src = p + row * rs + col0 * cs;
    for (int64_t t = 0; t < len; ++t) dst[t * ds] = src[t * cs];
  }
};

// Packing adapters (layouts in packed_gemm.h). Rows: operand(i, j) = source(i, j); Cols:
// operand(i, j) = source(j, i).
template <class T, class S>
struct ARows {
  S src;
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, T* dst) const {
    for (int64_t i = 0; i < rows; ++i) src.segment(m0 + i, k0, kc, dst + i, packed::kMR);
    for (int64_t i = rows; i < packed::kMR; ++i)
      for (int64_t k = 0; k < kc; ++k) dst[k * packed::kMR + i] = T(0);
  }
};
template <class T, class S>
struct ACols {
  S src;
  void pack(int64_t m0, int64_t rows, int64_t k0, int64_t kc, T* dst) const {
    for (int64_t k = 0; k < kc; ++k) {
      T* d = dst + k * packed::kMR;
      src.segment(k0 + k, m0, rows, d, 1);
      std::fill(d + rows, d + packed::kMR, T(0));
    }
  }
};
template <class T, class S>
struct BRows {
  S src;
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, T* dst) const {
    for (int64_t k = 0; k < kc; ++k) {
      T* d = dst + k * w;
      src.segment(k0 + k, j0, cols, d, 1);
      std::fill(d + cols, d + w, T(0));
    }
  }
};
template <class T, class S>
struct BCols {
  S src;
  void pack(int64_t k0, int64_t kc, int64_t j0, int64_t cols, int64_t w, T* dst) const {
    for (int64_t j = 0; j < cols; ++j) src.segment(j0 + j, k0, kc, dst + j, w);
    for (int64_t k = 0; k < kc; ++k) std::fill(dst + k * w + cols, dst + (k + 1) * w, T(0));
  }
};

// dx (C, H, W) += the columns of output rows [p0, p1) folded back (the adjoint of im2col).
// Each channel is summed by one thread in (r, ks, p, q) order: deterministic for any thread count.
template <class T>
void col2im(const T* col, int64_t ld, int64_t p0, int64_t p1, T* dx, const ConvShape& s) {
#pragma omp parallel for schedule(static) if (s.C * s.R * s.S * (p1 - p0) * s.Q > kParallelMin)
  for (int64_t c = 0; c < s.C; ++c) {
    T* plane = dx + c * s.H * s.W;
    for (int64_t r = 0; r < s.R; ++r) {
      for (int64_t ks = 0; ks < s.S; ++ks) {
        const T* in = col + ((c * s.R + r) * s.S + ks) * ld;
        int64_t q_lo, q_hi;
        valid_q(s, ks, q_lo, q_hi);
        for (int64_t p = p0; p < p1; ++p, in += s.Q) {
          const int64_t ih = p * s.stride_h - s.pad_h + r;
          if (ih < 0 || ih >= s.H) continue;
          T* dst = plane + ih * s.W - s.pad_w + ks;
          if (s.stride_w == 1) {
            for (int64_t q = q_lo; q < q_hi; ++q) dst[q] += in[q];
          } else {
            for (int64_t q = q_lo; q < q_hi; ++q) dst[q * s.stride_w] += in[q];
          }
        }
      }
    }
  }
}

bool is_pointwise(const ConvShape& s) {
  return s.R == 1 && s.S == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0;
}

}  // namespace

template <class T>
void conv2d_forward(const T* x, const T* w, const T* bias, T* y, const ConvShape& s) {
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q;
  const ARows<T, ViewSource<T>> a{{w, crs, 1}};
  const BRows<T, ColSource<T>> b{{x, s, 0}};
  packed::gemm<T>(s.K, s.N * pq, crs, a, b, bias, false, {y, pq, pq, s.K * pq});
}

template <class T>
void conv2d_backward_data(const T* dy, const T* w, T* dx, const ConvShape& s) {
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q, chw = s.C * s.H * s.W;
  if (is_pointwise(s)) {  // dx (C, cols) = w^T * dy, no folding needed
    const ACols<T, ViewSource<T>> a{{w, s.C, 1}};
    const BRows<T, DySource<T>> b{{dy, s.K, pq, 0}};
    packed::gemm<T>(s.C, s.N * pq, s.K, a, b, nullptr, false, {dx, pq, pq, chw});
    return;
  }
  fill<T>(dx, s.N * chw, T(0));  // col2im accumulates
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
  const ACols<T, ViewSource<T>> a{{w, crs, 1}};
  const int64_t whole = std::numeric_limits<int64_t>::max();
  for (int64_t n0 = 0; n0 < s.N; n0 += images) {
    const int64_t ng = std::min(images, s.N - n0);
    for (int64_t p0 = 0; p0 < s.P; p0 += rows) {
      const int64_t p1 = std::min(s.P, p0 + rows), cols = ng * (p1 - p0) * s.Q;
      const BRows<T, DySource<T>> b{{dy, s.K, pq, n0 * pq + p0 * s.Q}};
      packed::gemm<T>(crs, cols, s.K, a, b, nullptr, false, {col, cols, whole, 0});
      for (int64_t i = 0; i < ng; ++i) {
        col2im(col + i * (p1 - p0) * s.Q, cols, p0, p1, dx + (n0 + i) * chw, s);
      }
    }
  }
}

template <class T>
void conv2d_backward_filter(const T* x, const T* dy, T* dw, T* dbias, const ConvShape& s) {
  const int64_t crs = s.C * s.R * s.S, pq = s.P * s.Q;
  if (dbias) {
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
  const ARows<T, DySource<T>> a{{dy, s.K, pq, 0}};
  const BCols<T, ColSource<T>> b{{x, s, 0}};
  packed::gemm<T>(s.K, crs, s.N * pq, a, b, nullptr, false,
                  {dw, crs, std::numeric_limits<int64_t>::max(), 0});
}

#define REGEN_INSTANTIATE(T)                                                           \
  template void conv2d_forward<T>(const T*, const T*, const T*, T*, const ConvShape&); \
  template void conv2d_backward_data<T>(const T*, const T*, T*, const ConvShape&);     \
  template void conv2d_backward_filter<T>(const T*, const T*, T*, T*, const ConvShape&);
REGEN_INSTANTIATE(float)
REGEN_INSTANTIATE(double)
#undef REGEN_INSTANTIATE

}  // namespace regen::cpu
